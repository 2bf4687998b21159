//! Metrics of the retirement controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The label of an error counter: why a reconcile failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Every reason a retirement reconcile fails with (`Error::reason`, `Unconfirmed::reason` and
/// the finalizer's own): each counter exists at zero from the start.
pub const REASONS: &[&str] = &[
    "APIUnavailable",
    "FenceRefused",
    "NamespaceTerminating",
    "NotFenceable",
    "FenceNameTaken",
    "FenceNotApplied",
    "FenceNotClusterWide",
    "AddFinalizer",
    "RemoveFinalizer",
    "Finalizer",
];

/// Counters of the retirement controller, under the `retire` prefix.
#[derive(Clone, Default)]
pub struct Metrics {
    /// Reconciles that failed, by reason (`APIUnavailable`, `FenceRefused`, ...).
    pub reconcile_errors: Family<ReasonLabel, Counter>,
    /// `server_retired` Revocations this controller created (not those it found existing).
    pub fences_created: Counter,
    /// MCPServers whose fence was confirmed and whose finalizer was released.
    pub retired: Counter,
}

impl Metrics {
    /// Registers the counters in a `retire` sub-registry of `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for reason in REASONS {
            let _ = metrics.reconcile_errors.get_or_create(&ReasonLabel {
                reason: (*reason).to_string(),
            });
        }
        let sub = registry.sub_registry_with_prefix("retire");
        sub.register(
            "reconcile_errors",
            "Retirement reconciles that failed, by reason",
            metrics.reconcile_errors.clone(),
        );
        sub.register(
            "fences_created",
            "server_retired Revocations created through the aggregated API",
            metrics.fences_created.clone(),
        );
        sub.register(
            "servers_retired",
            "MCPServers fenced and released for deletion",
            metrics.retired.clone(),
        );
        metrics
    }

    pub fn error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_exists_at_zero_before_the_first_failure() {
        let mut registry = Registry::default();
        let _metrics = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for reason in REASONS {
            assert!(
                text.contains(&format!(
                    "retire_reconcile_errors_total{{reason=\"{reason}\"}} 0\n"
                )),
                "{reason}: {text}"
            );
        }
    }

    #[test]
    fn counters_are_exported_by_reason() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.error("APIUnavailable");
        metrics.error("APIUnavailable");
        metrics.fences_created.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("retire_reconcile_errors_total{reason=\"APIUnavailable\"} 2"),
            "{text}"
        );
        assert!(text.contains("retire_fences_created_total 1"), "{text}");
        assert!(text.contains("retire_servers_retired_total 0"), "{text}");
    }
}
