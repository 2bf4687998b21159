//! Storage: the port the HTTP layer uses ([`Store`]) and its PostgreSQL implementation.
//!
//! All SQL of the apiserver lives under this module.

pub mod connect;
mod feed;
mod memory;
mod migrate;
mod pg;
pub mod rv;
mod transact;

use apis::selector::{FieldSelector, LabelSelector};
use apis::strategy::{Rejection, Strategy};
use apis::validation::{join_errors, FieldError};
use async_trait::async_trait;
use serde_json::Value;

pub use connect::{parse_dsn, ConnectError, PgTls, SessionLimits, SslMode};
pub use feed::{
    Event, EventRenderings, EventType, FeedMetrics, Subscription, FEED_APPLICATION_NAME,
};
pub use memory::MemoryStore;
pub use migrate::apply_migrations;
pub use pg::{PgStore, StoreConfig};
pub use rv::{ContinueToken, ResourceVersion};
pub use transact::{collect_completed_enrollments, transact};

pub use apis::locks::RevokerAuthority;
pub use apis::strategy::{Context, Refusal, Requester, Withdrawal};

/// A storage failure, structurally; the HTTP layer writes the Status text (`http/error.rs`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    /// The name was used by a deleted object and is never reused.
    #[error("already exists: the name was used before and is reserved")]
    NameReserved,
    #[error("Precondition failed: UID in precondition: {given}, UID in object meta: {actual}")]
    UidPrecondition { given: String, actual: String },
    /// The resourceVersion named is not the stored one.
    #[error("the object has been modified")]
    Modified,
    #[error("{}", join_errors(.0))]
    Invalid(Vec<FieldError>),
    /// The kind does not serve this write.
    #[error("{0}")]
    Unsupported(String),
    /// A domain rule refused the write.
    #[error("{0}")]
    Refused(Refusal),
    /// The resourceVersion or continue token is no longer (or not yet) served; relist.
    #[error("{0}")]
    Expired(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("internal storage error: {0}")]
    Internal(String),
}

impl From<Rejection> for StoreError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::NotFound => Self::NotFound,
            Rejection::AlreadyExists => Self::AlreadyExists,
            Rejection::NameReserved => Self::NameReserved,
            Rejection::UidPrecondition { given, actual } => Self::UidPrecondition { given, actual },
            Rejection::Modified => Self::Modified,
            Rejection::Invalid(errors) => Self::Invalid(errors),
            Rejection::Unsupported(message) => Self::Unsupported(message),
            Rejection::Refused(refusal) => Self::Refused(refusal),
            Rejection::Unreadable(message) => Self::Internal(message),
        }
    }
}

/// The current time as Kubernetes records it (second precision).
pub fn now() -> k8s_openapi::jiff::Timestamp {
    let t = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Result alias for storage calls.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which snapshot a list reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListAt {
    /// The current state, read consistently.
    Latest,
    /// The state at an exact resourceVersion, starting after `after` (namespace, name).
    Exact {
        rv: ResourceVersion,
        after: Option<(String, String)>,
    },
}

/// What to list.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Restricts to one namespace; `None` lists all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Page size; `None` returns everything.
    pub limit: Option<usize>,
    pub at: ListAt,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self {
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
            limit: None,
            at: ListAt::Latest,
        }
    }
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ObjectList<K> {
    pub items: Vec<K>,
    /// The snapshot the page was read at (the same on every page of one list).
    pub resource_version: ResourceVersion,
    /// Set when more items follow.
    pub continue_token: Option<String>,
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

/// The storage port: what production calls. The HTTP layer is generic over it; [`PgStore`]
/// implements it on PostgreSQL and [`MemoryStore`] in memory (for handler tests). Every
/// write runs a kind's [`Strategy`] hooks in one transaction (see [`transact`]).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one object.
    async fn get<K: Strategy>(&self, namespace: &str, name: &str) -> Result<K>;
    /// Lists objects at a consistent snapshot.
    async fn list<K: Strategy>(&self, query: &ListQuery) -> Result<ObjectList<K>>;
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

    /// The current resourceVersion.
    async fn current_version(&self) -> Result<ResourceVersion>;
    /// Follows the change log from just after `from`.
    async fn subscribe(&self, from: ResourceVersion) -> Result<Subscription>;
}
