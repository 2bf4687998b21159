//! The controllers' metrics (one `prometheus-client` registry, sub-registry `mcp_controllers`)
//! and the HTTP listener serving `/metrics`, `/livez` and `/readyz`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub controller: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub condition: String,
    pub status: String,
}

/// Every value [`kube_reason`] returns.
pub const KUBE_REASONS: [&str; 4] = ["conflict", "forbidden", "api_error", "transport"];

/// The `reason` label of a failed Kubernetes API call (one of [`KUBE_REASONS`]).
pub fn kube_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(s) if s.code == 409 => "conflict",
        kube::Error::Api(s) if s.code == 403 => "forbidden",
        kube::Error::Api(_) => "api_error",
        _ => "transport",
    }
}

/// Reconcile metrics shared by the controllers, labelled by controller.
#[derive(Clone)]
pub struct ReconcileMetrics {
    pub duration: Family<ControllerLabel, Histogram>,
    pub errors: Family<ErrorLabels, Counter>,
    /// API writes (applies, Events) made by reconciles: 0 on a no-op resync.
    pub writes: Family<WriteLabels, Counter>,
    /// MCPServers by condition and status, as last reconciled.
    pub servers: Family<ConditionLabels, Gauge>,
}

impl ReconcileMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            errors: Family::default(),
            writes: Family::default(),
            servers: Family::default(),
        };
        let sub = registry.sub_registry_with_prefix("mcp_controllers");
        sub.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            metrics.duration.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and reason",
            metrics.errors.clone(),
        );
        sub.register(
            "writes",
            "API writes made by reconciles (applies and Events), by controller and kind",
            metrics.writes.clone(),
        );
        sub.register(
            "mcpservers",
            "MCPServers by condition and status, as last reconciled by this process",
            metrics.servers.clone(),
        );
        metrics
    }

    /// Creates `controller`'s error counters for each of `reasons` at zero, and its duration
    /// histogram: the series exist from the start, so `rate()` and alerts on them see a 0
    /// rather than nothing until the first failure.
    pub fn declare(&self, controller: &str, reasons: &[&str]) {
        for reason in reasons {
            let _ = self.errors.get_or_create(&ErrorLabels {
                controller: controller.into(),
                reason: (*reason).into(),
            });
        }
        let _ = self.duration.get_or_create(&ControllerLabel {
            controller: controller.into(),
        });
    }

    pub fn write(&self, controller: &str, kind: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                controller: controller.into(),
                kind: kind.into(),
            })
            .inc();
    }

    pub fn error(&self, controller: &str, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller: controller.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn observe(&self, controller: &str, seconds: f64) {
        self.duration
            .get_or_create(&ControllerLabel {
                controller: controller.into(),
            })
            .observe(seconds);
    }
}

/// Whether this process holds the lease, and whether it is ready (serving its role).
#[derive(Clone, Default)]
pub struct Health {
    pub leader: Gauge,
    ready: Arc<AtomicBool>,
    /// Raised by the NetworkPolicy controller after its first complete pass: a leader is
    /// ready only then (obsolete allows removed before it says so).
    leader_synced: Option<Arc<AtomicBool>>,
}

impl Health {
    pub fn register(registry: &mut Registry) -> Self {
        let health = Self::default();
        registry
            .sub_registry_with_prefix("mcp_controllers")
            .register(
                "leader",
                "1 while this replica holds the leader Lease and runs the controllers",
                health.leader.clone(),
            );
        health
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Readiness that, while this replica leads, also waits for `synced`.
    pub fn requiring(mut self, synced: Arc<AtomicBool>) -> Self {
        self.leader_synced = Some(synced);
        self
    }

    /// Ready: taking part in the election, and as the leader, past the first complete pass.
    pub fn ready(&self) -> bool {
        let leading = self.leader.get() == 1;
        self.ready.load(Ordering::Relaxed)
            && (!leading
                || self
                    .leader_synced
                    .as_ref()
                    .is_none_or(|s| s.load(Ordering::Relaxed)))
    }
}

/// Serves `/metrics`, `/livez` and `/readyz` on `listener` until the future is dropped.
/// `/readyz` is 200 once the process has a Kubernetes client and takes part in the election
/// (standbys are ready: they are healthy and waiting), 503 before and while draining.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Registry,
    health: Health,
) -> anyhow::Result<()> {
    use axum::{http::StatusCode, routing::get, Router};
    let registry = Arc::new(registry);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) => (
                            StatusCode::OK,
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        ),
                        Err(_) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(axum::http::header::CONTENT_TYPE, "text/plain")],
                            String::new(),
                        ),
                    }
                }
            }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let health = health.clone();
                async move {
                    if health.ready() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        );
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_controllers_export_zero_errors_and_an_empty_histogram() {
        let mut registry = Registry::default();
        let metrics = ReconcileMetrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("mcp_controllers_reconcile_errors"), "{text}");
        metrics.declare("netpol", &KUBE_REASONS);
        metrics.error("netpol", "conflict");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for (reason, count) in [
            ("conflict", 1),
            ("forbidden", 0),
            ("api_error", 0),
            ("transport", 0),
        ] {
            assert!(
                text.contains(&format!(
                    "mcp_controllers_reconcile_errors_total{{controller=\"netpol\",reason=\"{reason}\"}} {count}\n"
                )),
                "{reason}: {text}"
            );
        }
        assert!(
            text.contains(
                "mcp_controllers_reconcile_duration_seconds_count{controller=\"netpol\"} 0\n"
            ),
            "{text}"
        );
    }
}
