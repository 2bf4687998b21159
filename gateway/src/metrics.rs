//! `mcp_gateway_session_sync_age_seconds` and the cache's counters.

use std::sync::{Arc, Mutex, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::cache::Shared;

/// The cache's metrics. [`CacheMetrics::default`] records into nothing (a library user who
/// does not export metrics, or one of many caches in a load test).
#[derive(Clone, Debug, Default)]
pub struct CacheMetrics {
    pub(crate) sync_age: SyncAge,
    /// Complete lists taken (the first one, and every relist after a reset or failure).
    pub(crate) relists: Counter,
    /// Times cached authority was dropped (401/403 from the server, 410 Expired).
    pub(crate) invalidations: Counter,
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
            "Times cached session authority was dropped (401/403 from the server, 410 Expired)",
            metrics.invalidations.clone(),
        );
        metrics
    }
}

/// Computed at scrape time from the cache's state, so it grows while nothing arrives.
#[derive(Clone, Debug, Default)]
pub(crate) struct SyncAge(Arc<Mutex<Weak<Shared>>>);

impl SyncAge {
    pub(crate) fn attach(&self, shared: &Arc<Shared>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Arc::downgrade(shared);
        }
    }

    fn seconds(&self) -> f64 {
        let shared = self.0.lock().ok().and_then(|w| w.upgrade());
        shared.map_or(-1.0, |s| s.sync_age_seconds())
    }
}

impl Collector for SyncAge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = ConstGauge::new(self.seconds());
        let metric = encoder.encode_descriptor(
            "mcp_gateway_session_sync_age_seconds",
            "Seconds since the session cache last proved it was caught up; -1 before the first sync and while authority is dropped",
            None,
            MetricType::Gauge,
        )?;
        gauge.encode(metric)
    }
}
