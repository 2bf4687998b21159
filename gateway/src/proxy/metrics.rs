//! The proxy's metrics: requests by status and HTTP method, denials by reason, request
//! duration (to the response head), stream cuts and open streams.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::credential::Reason;

/// Buckets of request durations, in seconds.
const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 60.0,
];
/// Buckets of the time from a session becoming unusable to its stream ending, in seconds.
const CUT_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: u16,
    /// The HTTP method, one of a fixed set (`OTHER` for the rest).
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenyLabels {
    pub reason: &'static str,
}

/// The proxy's metrics; [`ProxyMetrics::default`] records into nothing registered.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub denials: Family<DenyLabels, Counter>,
    /// `tools/call`s refused before the upstream, by reason (`tool_not_granted`, ...).
    pub calls_refused: Family<DenyLabels, Counter>,
    /// `tools/call`s a `monitor` ToolPolicy would have refused (forwarded), by reason.
    pub calls_monitored: Family<DenyLabels, Counter>,
    pub duration: Histogram,
    pub stream_cut: Histogram,
    pub open_streams: Gauge,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            denials: Family::default(),
            calls_refused: Family::default(),
            calls_monitored: Family::default(),
            duration: Histogram::new(DURATION_BUCKETS),
            stream_cut: Histogram::new(CUT_BUCKETS),
            open_streams: Gauge::default(),
        }
    }
}

impl ProxyMetrics {
    /// Registers the metrics in `registry` (every deny reason starts at 0).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        for reason in Reason::ALL {
            let _ = m.denials.get_or_create(&DenyLabels {
                reason: reason.as_str(),
            });
        }
        registry.register(
            "mcp_gateway_requests",
            "Requests answered, by status code and HTTP method",
            m.requests.clone(),
        );
        registry.register(
            "mcp_gateway_denials",
            "Requests refused with 401, by reason",
            m.denials.clone(),
        );
        for reason in super::mcp::CALL_REASONS {
            let _ = m.calls_refused.get_or_create(&DenyLabels { reason });
        }
        for reason in super::mcp::MONITORED_REASONS {
            let _ = m.calls_monitored.get_or_create(&DenyLabels { reason });
        }
        registry.register(
            "mcp_gateway_calls_refused",
            "tools/call requests answered with an error instead of being forwarded, by reason (never by session or tool)",
            m.calls_refused.clone(),
        );
        registry.register(
            "mcp_gateway_calls_monitored",
            "tools/call requests a monitor-mode ToolPolicy would have refused, forwarded, by reason",
            m.calls_monitored.clone(),
        );
        registry.register(
            "mcp_gateway_request_duration_seconds",
            "Time from a request's arrival to its response head",
            m.duration.clone(),
        );
        registry.register(
            "mcp_gateway_stream_cut_seconds",
            "Time from a session becoming unusable in the cache (revoked, expired, deleted, cache stale) to the end of a response stream of that session",
            m.stream_cut.clone(),
        );
        registry.register(
            "mcp_gateway_open_streams",
            "Admitted responses still streaming",
            m.open_streams.clone(),
        );
        m
    }

    /// Counts the refused and the monitored calls of a body.
    pub fn count_calls(&self, calls: &[super::mcp::CallDecision]) {
        for call in calls {
            if let Some(refused) = &call.outcome.refused {
                self.calls_refused
                    .get_or_create(&DenyLabels {
                        reason: refused.reason,
                    })
                    .inc();
            }
            for finding in &call.outcome.monitored {
                self.calls_monitored
                    .get_or_create(&DenyLabels {
                        reason: finding.reason.as_str(),
                    })
                    .inc();
            }
        }
    }

    /// The label of an HTTP method.
    pub fn method_label(method: &http::Method) -> &'static str {
        match *method {
            http::Method::GET => "GET",
            http::Method::POST => "POST",
            http::Method::DELETE => "DELETE",
            http::Method::HEAD => "HEAD",
            http::Method::OPTIONS => "OPTIONS",
            http::Method::PUT => "PUT",
            _ => "OTHER",
        }
    }
}
