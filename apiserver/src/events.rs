//! Events (events.k8s.io/v1) on sessions, DESIGN §6: `TTLClamped`, `Revoked` (with its
//! cause), `Expired` and `EnrollmentCompleted`, reported by the replica that committed the
//! write (never from the change feed, which every replica follows: each would report every
//! change again).
//!
//! The store hands each committed session transition to [`SessionSignals`]; the emitter
//! installed here only queues it (bounded, never blocking the write). One task drains the
//! queue through kube-runtime's [`Recorder`]. When the queue is full or kube-apiserver
//! refuses or cannot be reached, the event is dropped and counted: Events are a courtesy to
//! operators, never a condition of an API write. Only behind kube-apiserver (delegated
//! mode): a standalone server has no cluster to report to.

use apis::rules::SessionTransition;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::store::{SessionEvent, SessionSignals};

/// The reporting controller of every Event this server records.
pub const REPORTING_CONTROLLER: &str = "mcp-access-apiserver";

/// Events waiting to be published, at most; more are dropped and counted.
pub const DEFAULT_QUEUE: usize = 1024;

/// Why an event was not published.
const DROP_QUEUE_FULL: &str = "queue_full";
const DROP_PUBLISH_FAILED: &str = "publish_failed";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// Counters of the recorder.
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    published: Counter,
    dropped: Family<DropLabels, Counter>,
}

impl EventMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for reason in [DROP_QUEUE_FULL, DROP_PUBLISH_FAILED] {
            let _ = metrics.dropped.get_or_create(&DropLabels { reason });
        }
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver_session_events");
        sub.register(
            "published",
            "Session Events published to kube-apiserver",
            metrics.published.clone(),
        );
        sub.register(
            "dropped",
            "Session Events dropped, by reason (queue_full, publish_failed)",
            metrics.dropped.clone(),
        );
        metrics
    }

    /// Events published so far.
    pub fn published(&self) -> u64 {
        self.published.get()
    }

    /// Events dropped so far for `reason`.
    pub fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&DropLabels { reason }).get()
    }
}

/// The Event a session transition is worth.
pub fn event_of(transition: &SessionTransition) -> Event {
    Event {
        type_: if transition.is_warning() {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: transition.reason().into(),
        note: Some(transition.note()),
        action: transition.action().into(),
        secondary: None,
    }
}

/// What an Event on a session is about: the AccessSession itself, so
/// `kubectl events --for accesssession/NAME` and `kubectl describe` find it.
pub fn regarding(event: &SessionEvent) -> ObjectReference {
    ObjectReference {
        api_version: Some(apis::API_VERSION.into()),
        kind: Some("AccessSession".into()),
        namespace: Some(event.namespace.clone()),
        name: Some(event.name.clone()),
        uid: (!event.uid.is_empty()).then(|| event.uid.clone()),
        ..Default::default()
    }
}

/// This replica's name as Events report it: the pod name, else the host name.
pub fn instance_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| REPORTING_CONTROLLER.to_string())
}

/// Installs the emitter on `signals` (a bounded queue of `queue` events) and returns the
/// task that publishes them with `client`, to run until the process ends.
pub fn start(
    client: kube::Client,
    signals: &SessionSignals,
    instance: String,
    queue: usize,
    metrics: EventMetrics,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, mut rx) = mpsc::channel::<SessionEvent>(queue.max(1));
    let full = metrics
        .dropped
        .get_or_create(&DropLabels {
            reason: DROP_QUEUE_FULL,
        })
        .clone();
    signals.set_emitter(move |event| {
        if tx.try_send(event).is_err() {
            full.inc();
        }
    });
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(instance),
        },
    );
    async move {
        let failed = metrics
            .dropped
            .get_or_create(&DropLabels {
                reason: DROP_PUBLISH_FAILED,
            })
            .clone();
        while let Some(event) = rx.recv().await {
            match recorder
                .publish(&event_of(&event.transition), &regarding(&event))
                .await
            {
                Ok(()) => {
                    metrics.published.inc();
                }
                Err(e) => {
                    failed.inc();
                    tracing::debug!(
                        ns = %event.namespace,
                        name = %event.name,
                        reason = event.transition.reason(),
                        error = %e,
                        "session Event dropped"
                    );
                }
            }
        }
    }
}

/// A pinned tool a gateway saw its server list with another definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolDrift {
    pub namespace: String,
    pub server_name: String,
    pub server_uid: String,
    pub policy: String,
    pub tool: String,
    pub pinned: String,
    pub observed: String,
}

/// Where the sync listener hands drift reports; never blocks (a full queue drops one).
#[derive(Clone)]
pub struct DriftEvents(mpsc::Sender<ToolDrift>);

impl DriftEvents {
    /// A handle and the queue it feeds, `queue` deep.
    pub fn channel(queue: usize) -> (Self, mpsc::Receiver<ToolDrift>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        (Self(tx), rx)
    }

    pub fn send(&self, drift: ToolDrift) {
        if self.0.try_send(drift).is_err() {
            tracing::warn!("tool drift Event queue full; dropped");
        }
    }
}

/// The Event of a drift: a Warning `ToolDefinitionChanged` regarding the MCPServer.
pub fn drift_event(drift: &ToolDrift) -> (Event, ObjectReference) {
    let event = Event {
        type_: EventType::Warning,
        reason: "ToolDefinitionChanged".into(),
        note: Some(format!(
            "tool {:?} is listed with definition {} but ToolPolicy {:?} pins {}: its calls are \
             refused (or, in monitor mode, flagged) until the pin is updated",
            drift.tool, drift.observed, drift.policy, drift.pinned
        )),
        action: "ComparePin".into(),
        secondary: Some(ObjectReference {
            api_version: Some(apis::API_VERSION.into()),
            kind: Some("ToolPolicy".into()),
            namespace: Some(drift.namespace.clone()),
            name: Some(drift.policy.clone()),
            ..Default::default()
        }),
    };
    let regarding = ObjectReference {
        api_version: Some("mcp-runtime.dev/v1alpha1".into()),
        kind: Some("MCPServer".into()),
        namespace: Some(drift.namespace.clone()),
        name: Some(drift.server_name.clone()),
        uid: Some(drift.server_uid.clone()),
        ..Default::default()
    };
    (event, regarding)
}

/// Publishes drift Events through kube-apiserver; returns the handle the sync listener sends
/// to and the task to run.
pub fn start_drift(
    client: kube::Client,
    instance: String,
) -> (
    DriftEvents,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (events, mut rx) = DriftEvents::channel(DEFAULT_QUEUE);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(instance),
        },
    );
    let task = async move {
        while let Some(drift) = rx.recv().await {
            let (event, regarding) = drift_event(&drift);
            if let Err(e) = recorder.publish(&event, &regarding).await {
                tracing::warn!(
                    server = %drift.server_name, tool = %drift.tool, error = %e,
                    "tool drift Event dropped"
                );
            }
        }
    };
    (events, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_regard_the_session_and_carry_the_cause() {
        let event = SessionEvent {
            namespace: "team-a".into(),
            name: "s1".into(),
            uid: "u-1".into(),
            transition: SessionTransition::Revoked {
                cause: "compromised".into(),
                revocation: Some("r1".into()),
            },
        };
        let r = regarding(&event);
        assert_eq!(
            r.api_version.as_deref(),
            Some("access.mcp-runtime.dev/v1alpha1")
        );
        assert_eq!(r.kind.as_deref(), Some("AccessSession"));
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("team-a"), Some("s1"), Some("u-1"))
        );
        let e = event_of(&event.transition);
        assert_eq!(e.reason, "Revoked");
        assert!(matches!(e.type_, EventType::Warning));
        assert!(e.note.unwrap().contains("compromised"));
    }

    fn revoked(name: &str) -> SessionEvent {
        SessionEvent {
            namespace: "team-a".into(),
            name: name.into(),
            uid: String::new(),
            transition: SessionTransition::Revoked {
                cause: "server_retired".into(),
                revocation: Some("retire".into()),
            },
        }
    }

    /// With kube-apiserver unreachable, writes never wait: what the queue cannot hold is
    /// dropped at once, what it holds fails to publish, and both are counted.
    #[tokio::test]
    async fn unreachable_kube_apiserver_drops_and_counts_without_blocking_writes() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        config.connect_timeout = Some(std::time::Duration::from_millis(200));
        let client = kube::Client::try_from(config).unwrap();
        let signals = SessionSignals::default();
        let metrics = EventMetrics::default();
        let publish = start(client, &signals, "test".into(), 2, metrics.clone());
        // A fence revoking five sessions: one commit, five Events, a queue of two.
        signals.committed(crate::store::SessionChanges {
            events: (0..5).map(|i| revoked(&format!("s{i}"))).collect(),
            earliest_expiry: None,
        });
        assert_eq!(metrics.dropped(DROP_QUEUE_FULL), 3);
        let task = tokio::spawn(publish);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while metrics.dropped(DROP_PUBLISH_FAILED) < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "publishing did not fail"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(metrics.published(), 0);
        assert!(!task.is_finished(), "the recorder keeps running");
        task.abort();
    }
}
