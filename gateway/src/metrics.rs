//! `mcp_gateway_session_sync_age_seconds`, the revoke-to-deny histogram and the cache's
//! counters.

use std::sync::{Arc, Mutex, Weak};

use k8s_openapi::jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Upper bounds of the revoke-to-deny buckets, in seconds.
pub const REVOKE_TO_DENY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The cache's metrics. [`CacheMetrics::default`] records into nothing (a library user who
/// does not export metrics, or one of many caches in a load test).
#[derive(Clone, Debug)]
pub struct CacheMetrics {
    pub(crate) sync_age: SyncAge,
    /// Complete lists taken (the first one, and every relist after a reset or failure).
    pub(crate) relists: Counter,
    /// Times cached authority was dropped (401/403 from the server, a new epoch).
    pub(crate) invalidations: Counter,
    /// 410s that were not a new epoch: changes missed, the snapshot kept under the lag bound.
    pub(crate) missed: Counter,
    /// Watches dropped and resumed because nothing, not even a bookmark, arrived.
    pub(crate) quiet_watches: Counter,
    /// From a session's `status.revocation.revokedAt` to the moment this cache applied it.
    pub(crate) revoke_to_deny: Histogram,
}

impl Default for CacheMetrics {
    fn default() -> Self {
        Self {
            sync_age: SyncAge::default(),
            relists: Counter::default(),
            invalidations: Counter::default(),
            missed: Counter::default(),
            quiet_watches: Counter::default(),
            revoke_to_deny: Histogram::new(REVOKE_TO_DENY_BUCKETS),
        }
    }
}

impl CacheMetrics {
    /// Registers the cache's metrics in `registry`; pass the result to
    /// [`crate::SessionCache::start_with_metrics`].
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register_collector(Box::new(metrics.sync_age.clone()));
        registry.register(
            "mcp_gateway_session_relists",
            "Complete lists of the session feed",
            metrics.relists.clone(),
        );
        registry.register(
            "mcp_gateway_session_invalidations",
            "Times cached session authority was dropped (401/403 from the server, 410 Expired for a new epoch)",
            metrics.invalidations.clone(),
        );
        registry.register(
            "mcp_gateway_session_missed_changes",
            "410 Expired answers that were not a new epoch: the snapshot was kept under the lag bound while the cache relisted",
            metrics.missed.clone(),
        );
        registry.register(
            "mcp_gateway_session_quiet_watches",
            "Session watches dropped and resumed because nothing, not even a bookmark, arrived for three bookmark intervals",
            metrics.quiet_watches.clone(),
        );
        registry.register(
            "mcp_gateway_revoke_to_deny_seconds",
            "Time from a session's status.revocation.revokedAt to the moment this cache applied the revocation (from then on it denies); revokedAt has whole-second precision, so an observation is late by up to 1 s, and clock skew between the apiserver and this node adds to it",
            metrics.revoke_to_deny.clone(),
        );
        metrics
    }

    /// The cache applied a revocation the server recorded at `revoked_at`; `now` by the wall
    /// clock. A negative gap (clock skew) counts as 0.
    pub(crate) fn revocation_applied(&self, revoked_at: Timestamp, now: Timestamp) {
        let seconds = now.duration_since(revoked_at).as_secs_f64().max(0.0);
        self.revoke_to_deny.observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    #[test]
    fn revoke_to_deny_is_exported_as_a_histogram_in_seconds() {
        let mut registry = Registry::default();
        let metrics = CacheMetrics::register(&mut registry);
        let revoked_at = Timestamp::from_second(1_800_000_000).unwrap();
        metrics.revocation_applied(revoked_at, revoked_at + SignedDuration::from_millis(40));
        // Skew: the gateway's clock behind the apiserver's.
        metrics.revocation_applied(revoked_at, revoked_at - SignedDuration::from_millis(300));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE mcp_gateway_revoke_to_deny_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("mcp_gateway_revoke_to_deny_seconds_count 2\n"),
            "{text}"
        );
        assert!(
            text.contains("mcp_gateway_revoke_to_deny_seconds_bucket{le=\"0.005\"} 1\n"),
            "the skewed one counts as 0: {text}"
        );
        assert!(
            text.contains("mcp_gateway_revoke_to_deny_seconds_bucket{le=\"0.05\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("mcp_gateway_revoke_to_deny_seconds_sum 0.04"),
            "{text}"
        );
    }
}

/// What the sync-age gauge reads at scrape time (the cache's state; kept apart so this module
/// does not depend on the cache).
pub(crate) trait SyncAgeSource: Send + Sync {
    /// Seconds since the last proof of being caught up; -1 without authority.
    fn sync_age_seconds(&self) -> f64;
    /// How far behind the change log the cache knows it is.
    fn lag(&self) -> crate::state::Lag;
}

/// Computed at scrape time from the cache's state, so it grows while nothing arrives.
#[derive(Clone, Default)]
pub(crate) struct SyncAge(Arc<Mutex<Option<Weak<dyn SyncAgeSource>>>>);

impl std::fmt::Debug for SyncAge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SyncAge").field(&self.seconds()).finish()
    }
}

impl SyncAge {
    pub(crate) fn attach(&self, source: Arc<dyn SyncAgeSource>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(Arc::downgrade(&source));
        }
    }

    fn source(&self) -> Option<Arc<dyn SyncAgeSource>> {
        self.0
            .lock()
            .ok()
            .and_then(|w| w.as_ref().and_then(Weak::upgrade))
    }

    fn seconds(&self) -> f64 {
        self.source().map_or(-1.0, |s| s.sync_age_seconds())
    }
}

impl Collector for SyncAge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let source = self.source();
        let gauge = ConstGauge::new(source.as_ref().map_or(-1.0, |s| s.sync_age_seconds()));
        let metric = encoder.encode_descriptor(
            "mcp_gateway_session_sync_age_seconds",
            "Seconds since the session cache last proved it was caught up; -1 before the first sync and while authority is dropped",
            None,
            MetricType::Gauge,
        )?;
        gauge.encode(metric)?;
        let lag = source.map(|s| s.lag()).unwrap_or_default();
        let metric = encoder.encode_descriptor(
            "mcp_gateway_session_sync_lag_seconds",
            "Seconds since the session cache learned it is behind the change log's head (a bookmark's head ahead of what it applied, or a 410); 0 when caught up. Past the lag bound it denies with cache_stale",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(lag.seconds).encode(metric)?;
        let metric = encoder.encode_descriptor(
            "mcp_gateway_session_sync_lag_changes",
            "Changes between what the session cache applied and the head the last bookmark named; 0 when caught up or unknown",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(lag.changes as i64).encode(metric)
    }
}
