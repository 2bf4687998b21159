//! The storage port: the [`Store`] trait the HTTP layer is generic over, its error and the
//! plain types it speaks. Nothing here knows PostgreSQL.

use apis::strategy::{Context, Strategy, Withdrawal};
use async_trait::async_trait;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::error::Result;
use super::fanout::Subscription;
use super::query::{ListQuery, ObjectList};
use super::raw::{self, RawList};
use super::rv::ResourceVersion;

/// The current time as Kubernetes records it (second precision).
pub fn now() -> k8s_openapi::jiff::Timestamp {
    let t = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// DeleteOptions preconditions.
#[derive(Clone, Debug, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// A written object and the warnings to return with it.
#[derive(Clone, Debug)]
pub struct Written<K> {
    pub object: K,
    pub warnings: Vec<String>,
}

/// A change of one session worth an Event, reported by the replica that committed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionEvent {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub transition: apis::rules::SessionTransition,
}

impl SessionEvent {
    /// The event `transition` of `session`.
    pub fn of(session: &apis::AccessSession, transition: apis::rules::SessionTransition) -> Self {
        let meta = &session.metadata;
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            transition,
        }
    }
}

/// What one committed write did to sessions.
#[derive(Clone, Debug, Default)]
pub struct SessionChanges {
    /// The Events it is worth, in write order.
    pub events: Vec<SessionEvent>,
    /// The earliest `spec.expiresAt` of the sessions it wrote, if any has one: it may now
    /// be the next expiry due.
    pub earliest_expiry: Option<Timestamp>,
}

/// Folds `at` into the earliest time known so far.
pub(crate) fn fold_earliest(known: &mut Option<Timestamp>, at: Timestamp) {
    *known = Some(known.map_or(at, |k| k.min(at)));
}

/// Where a store reports what its committed writes did to sessions: the expiry scheduler
/// waits on [`SessionSignals::written`]; the Event recorder installs an emitter. Reporting
/// never blocks nor fails a write.
#[derive(Default)]
pub struct SessionSignals {
    written: tokio::sync::Notify,
    /// The earliest expiry written since the waiter last looked.
    earliest: std::sync::Mutex<Option<Timestamp>>,
    emitter: std::sync::OnceLock<Box<dyn Fn(SessionEvent) + Send + Sync>>,
}

impl SessionSignals {
    /// Installs the Event emitter (once; later calls are ignored and return false). It must
    /// not block: it runs on the write path, after the commit.
    pub fn set_emitter(&self, emit: impl Fn(SessionEvent) + Send + Sync + 'static) -> bool {
        self.emitter.set(Box::new(emit)).is_ok()
    }

    /// Resolves after a committed write wrote a session with an expiry, with the earliest
    /// expiry written since the last call (at most one wake-up is kept while nobody waits,
    /// so a burst of writes wakes the waiter once, with the earliest of them).
    pub async fn written(&self) -> Option<Timestamp> {
        self.written.notified().await;
        self.earliest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    pub(crate) fn committed(&self, changes: SessionChanges) {
        if let Some(at) = changes.earliest_expiry {
            let mut earliest = self.earliest.lock().unwrap_or_else(|e| e.into_inner());
            fold_earliest(&mut earliest, at);
            drop(earliest);
            self.written.notify_one();
        }
        if let Some(emit) = self.emitter.get() {
            for event in changes.events {
                emit(event);
            }
        }
    }
}

/// The storage port: what production calls. The HTTP layer is generic over it; [`PgStore`](super::PgStore)
/// implements it on PostgreSQL and [`MemoryStore`](super::MemoryStore) in memory (for handler tests). Every
/// write runs a kind's [`Strategy`] hooks in one transaction (see [`transact`](super::transact)).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one object.
    async fn get<K: Strategy>(&self, namespace: &str, name: &str) -> Result<K>;
    /// Lists objects at a consistent snapshot.
    async fn list<K: Strategy>(&self, query: &ListQuery) -> Result<ObjectList<K>>;
    /// Lists objects as [`list`](Store::list) does, as served JSON (`apiVersion`, `kind`
    /// and `metadata.resourceVersion` set) streamed in list order. Errors before any item
    /// are returned here; an error in the stream means the list cannot be completed. By
    /// default the typed page, encoded.
    async fn list_raw<K: Strategy>(&self, query: &ListQuery) -> Result<RawList> {
        raw::from_typed(self.list::<K>(query).await?)
    }
    /// Creates an object as its strategy admits it.
    async fn create<K: Strategy>(
        &self,
        object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>>;
    /// Updates an object through the main resource; its `metadata.uid` and
    /// `resourceVersion`, when set, are preconditions.
    async fn update<K: Strategy>(
        &self,
        object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>>;
    /// Deletes an object for `by`, returning its last state.
    async fn delete<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        by: &Withdrawal,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K>;
    /// Writes through the `status` subresource: `requested` is the whole object the client
    /// asks for, already checked by [`Strategy::check_status`].
    async fn write_status<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        requested: &Value,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K>;

    /// Turns the sessions due at `now` ([`apis::rules::due_for_expiry`]) `Expired`, each an
    /// ordinary write with its change-log event, in one write transaction (at most a batch;
    /// call again while it returns a full one). Safe with several replicas: whoever comes
    /// second finds nothing due. Returns the sessions expired.
    async fn expire_sessions(
        &self,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Result<Vec<apis::AccessSession>>;
    /// The earliest `spec.expiresAt` of a session that can still expire, if any.
    async fn next_session_expiry(&self) -> Result<Option<k8s_openapi::jiff::Timestamp>>;
    /// Where this store reports what its writes did to sessions.
    fn session_signals(&self) -> std::sync::Arc<SessionSignals>;

    /// Whether a retirement fence covers `server_uid` in `namespace` (one installed there, or
    /// a cluster-wide one): what refuses a session token for a retired server generation.
    async fn server_fenced(&self, server_uid: &str, namespace: &str) -> Result<bool>;

    /// The current resourceVersion.
    async fn current_version(&self) -> Result<ResourceVersion>;
    /// Follows the change log from just after `from`.
    async fn subscribe(&self, from: ResourceVersion) -> Result<Subscription>;
}
