//! What the HTTP layer tells operators: request, watch and cut-off metrics, the span of
//! every request, and one log line per request (verb, resource, namespace, name, user, code,
//! latency). Nothing from the request's headers or body is logged: never a token.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use apis::resources::RESOURCES;
use axum::extract::Request;
use axum::response::Response;
use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::limits::RequestKind;
use super::route::Target;
use crate::auth::{AuthenticationError, Authenticator, ConnectionInfo, UserInfo};

/// The `verb` label: one of a fixed set, whatever the request said.
pub(crate) fn verb_label(verb: &str, method: &Method) -> &'static str {
    const VERBS: &[&str] = &[
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    if let Some(v) = VERBS.iter().find(|v| **v == verb) {
        return v;
    }
    if !verb.is_empty() {
        return "other";
    }
    // Before the request was understood (unauthenticated, unparsable): by method only.
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// The `resource` label: a served resource's plural, or `""` for none.
pub(crate) fn resource_label(resource: &str) -> &'static str {
    if resource.is_empty() {
        return "";
    }
    RESOURCES
        .iter()
        .find(|r| r.plural == resource)
        .map_or("other", |r| r.plural)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    verb: String,
    resource: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RejectedLabels {
    /// `readOnly`, `mutating` or `watch`, as kube-apiserver's `request_kind`.
    request_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CutoffLabels {
    resource: &'static str,
    /// The Status reason the watch ended with (`Expired`, `ServiceUnavailable`, …).
    reason: &'static str,
}

/// Upper bounds of the request latency buckets, in seconds (kube-apiserver's).
pub(crate) const LATENCY_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

pub(crate) fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Metrics of the HTTP layer. Every label comes from a fixed set.
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    /// Until the response head: for a watch, until its stream starts.
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    watches: Gauge,
    watchers: Family<ResourceLabels, Gauge>,
    cutoffs: Family<CutoffLabels, Counter>,
    rejected: Family<RejectedLabels, Counter>,
    inflight: Family<RejectedLabels, Gauge>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            watches: Gauge::default(),
            watchers: Family::default(),
            cutoffs: Family::default(),
            rejected: Family::default(),
            inflight: Family::default(),
        }
    }
}

impl HttpMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self::default();
        // The cut-offs the feed causes exist from the start, at zero.
        for info in RESOURCES.iter() {
            for reason in ["Expired", "ServiceUnavailable"] {
                let _ = metrics.cutoffs.get_or_create(&CutoffLabels {
                    resource: info.plural,
                    reason,
                });
            }
        }
        for kind in [
            RequestKind::ReadOnly,
            RequestKind::Mutating,
            RequestKind::LongRunning,
        ] {
            let _ = metrics.rejected.get_or_create(&RejectedLabels {
                request_kind: kind.label(),
            });
        }
        for kind in [RequestKind::ReadOnly, RequestKind::Mutating] {
            let _ = metrics.inflight.get_or_create(&RejectedLabels {
                request_kind: kind.label(),
            });
        }
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver");
        sub.register(
            "requests",
            "API requests by verb, resource and code",
            metrics.requests.clone(),
        );
        sub.register_with_unit(
            "request_duration",
            "Time to the response head of API requests by verb, resource and code (for a watch: until its stream starts)",
            prometheus_client::registry::Unit::Seconds,
            metrics.latency.clone(),
        );
        sub.register(
            "open_watches",
            "Watches currently streaming",
            metrics.watches.clone(),
        );
        sub.register(
            "watchers",
            "Watches currently streaming, by resource",
            metrics.watchers.clone(),
        );
        sub.register(
            "watch_cutoffs",
            "Watches the server ended with an error event (feed stalled or rotated, consumer too slow, store unavailable), by resource and reason",
            metrics.cutoffs.clone(),
        );
        sub.register(
            "rejected_requests",
            "Requests answered 429 because their in-flight pool (readOnly, mutating) or the caller's watch quota (watch) was full",
            metrics.rejected.clone(),
        );
        sub.register(
            "current_inflight_requests",
            "Requests holding a place in their in-flight pool (readOnly, mutating) now, as kube-apiserver's apiserver_current_inflight_requests; a streamed list holds its place until its body ends",
            metrics.inflight.clone(),
        );
        Arc::new(metrics)
    }

    /// A request of `kind` took a place in its in-flight pool; the guard gives it back.
    pub(crate) fn inflight_started(&self, kind: RequestKind) -> InflightGauge {
        let gauge = self
            .inflight
            .get_or_create(&RejectedLabels {
                request_kind: kind.label(),
            })
            .clone();
        gauge.inc();
        InflightGauge(gauge)
    }

    /// A request of `kind` was refused with 429 by its in-flight pool or watch quota.
    pub(crate) fn rejected(&self, kind: RequestKind) {
        self.rejected
            .get_or_create(&RejectedLabels {
                request_kind: kind.label(),
            })
            .inc();
    }

    /// A watch on `resource` started streaming; the returned guard ends it.
    pub(crate) fn watch_started(self: &Arc<Self>, resource: &str) -> WatchGauge {
        let resource = resource_label(resource);
        self.watches.inc();
        self.watchers
            .get_or_create(&ResourceLabels { resource })
            .inc();
        WatchGauge {
            metrics: self.clone(),
            resource,
        }
    }

    /// The server ended a watch on `resource` with an error event of `reason`.
    pub(crate) fn watch_cut_off(&self, resource: &str, reason: &'static str) {
        self.cutoffs
            .get_or_create(&CutoffLabels {
                resource: resource_label(resource),
                reason,
            })
            .inc();
    }
}

/// Counts one streaming watch until dropped, however the watch ends.
/// One request counted in the in-flight gauge; dropping it uncounts it.
pub(crate) struct InflightGauge(Gauge);

impl Drop for InflightGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub(crate) struct WatchGauge {
    metrics: Arc<HttpMetrics>,
    resource: &'static str,
}

impl Drop for WatchGauge {
    fn drop(&mut self) {
        self.metrics.watches.dec();
        self.metrics
            .watchers
            .get_or_create(&ResourceLabels {
                resource: self.resource,
            })
            .dec();
    }
}

/// Records the authenticated user on the request's span and in its log line: the user is
/// known only once the authenticator has answered, inside routing.
pub(crate) struct RecordUser {
    pub(crate) inner: Arc<dyn Authenticator>,
    pub(crate) log: RequestLog,
}

#[async_trait::async_trait]
impl Authenticator for RecordUser {
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError> {
        let user = self.inner.authenticate(request, connection).await;
        if let Ok(Some(user)) = &user {
            self.log.set_user(&user.name);
        }
        user
    }
}

/// The target of the request log lines: `RUST_LOG=info,mcp_access::request=off` silences them
/// and nothing else.
pub const REQUEST_LOG_TARGET: &str = "mcp_access::request";

/// What the request's log line says, learned as the request goes: what it addresses from its
/// path at once, the user once authenticated. Cheap to clone (one allocation per request).
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestLog(Arc<LogFields>);

#[derive(Debug, Default)]
struct LogFields {
    namespace: String,
    name: String,
    user: OnceLock<String>,
    /// Verb, resource, code and latency (ms), once the response head is known.
    outcome: OnceLock<(&'static str, &'static str, u16, f64)>,
}

impl RequestLog {
    /// The authenticated user (the first one set wins; a request has one).
    pub(crate) fn set_user(&self, user: &str) {
        if self.0.user.set(user.to_string()).is_ok() {
            tracing::Span::current().record("user", user);
        }
    }

    /// The response head is known: what the line will say.
    fn finish(&self, verb: &'static str, resource: &'static str, code: u16, started: Instant) {
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        let _ = self.0.outcome.set((verb, resource, code, latency_ms));
    }

    /// Writes the request's line, outside the request's span (the line carries every field
    /// itself): at info for answers up to 499, at warn for the server's failures. Only these
    /// fields: never a header, a query or a body, so never a token.
    pub(crate) fn emit(&self) {
        let Some(&(verb, resource, code, latency_ms)) = self.0.outcome.get() else {
            return;
        };
        let user = self.0.user.get().map_or("", String::as_str);
        let (namespace, name) = (self.0.namespace.as_str(), self.0.name.as_str());
        if code >= 500 {
            tracing::warn!(
                target: REQUEST_LOG_TARGET,
                verb, resource, namespace, name, user, code, latency_ms,
                "request"
            );
        } else {
            tracing::info!(
                target: REQUEST_LOG_TARGET,
                verb, resource, namespace, name, user, code, latency_ms,
                "request"
            );
        }
    }
}

/// The span of one request and its log line: what it addresses from its path, the rest
/// recorded as it is learned (user on authentication, verb, resource and code at the end).
pub(crate) fn request_span(request: &Request) -> (tracing::Span, RequestLog) {
    let path = request.uri().path();
    let segments = super::route::segments(path);
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (namespace, name) = match Target::parse(&segs) {
        Target::Resource {
            namespace, name, ..
        } => (namespace.unwrap_or_default(), name.unwrap_or_default()),
        _ => (String::new(), String::new()),
    };
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path,
        verb = tracing::field::Empty,
        resource = tracing::field::Empty,
        namespace = namespace.as_str(),
        name = name.as_str(),
        user = tracing::field::Empty,
        code = tracing::field::Empty,
    );
    let log = RequestLog(Arc::new(LogFields {
        namespace,
        name,
        ..Default::default()
    }));
    (span, log)
}

impl HttpMetrics {
    /// Counts a request, times it, completes its span and its log line. Every label
    /// comes from a fixed set: a label taken from the request would let any client grow
    /// `/metrics` without bound.
    pub(crate) fn count(
        &self,
        (verb, method): (&str, &Method),
        resource: &str,
        response: &Response,
        started: Instant,
        log: &RequestLog,
    ) {
        let (verb, resource) = (verb_label(verb, method), resource_label(resource));
        let code = response.status().as_u16();
        let span = tracing::Span::current();
        span.record("verb", verb);
        span.record("resource", resource);
        span.record("code", code);
        let labels = RequestLabels {
            verb: verb.to_string(),
            resource: resource.to_string(),
            code,
        };
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        log.finish(verb, resource, code, started);
    }
}
