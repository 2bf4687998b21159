//! Storage: the port the HTTP layer uses ([`Store`]) and its PostgreSQL implementation.
//!
//! All SQL of the apiserver lives under this module.

pub mod connect;
mod feed;
mod migrate;
mod pg;
pub mod rv;

use apis::rules::SessionRuleError;
use apis::selector::{FieldSelector, LabelSelector};
use apis::validation::{join_errors, FieldError};
use apis::{AccessSession, Agent, Enrollment, Kind, Revocation, ServerRef};
use async_trait::async_trait;

pub use connect::{parse_dsn, ConnectError, PgTls, SessionLimits, SslMode};
pub use feed::{
    Event, EventRenderings, EventType, FeedMetrics, Subscription, FEED_APPLICATION_NAME,
};
pub use migrate::apply_migrations;
pub use pg::{PgStore, StoreConfig};
pub use rv::{ContinueToken, ResourceVersion};

/// A storage failure, in the terms the API reports it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{resource} {name:?} not found")]
    NotFound {
        resource: &'static str,
        name: String,
    },
    #[error("{resource} {name:?} already exists")]
    AlreadyExists {
        resource: &'static str,
        name: String,
    },
    #[error("{resource} {name:?} already exists: the name was used before and is reserved")]
    NameReserved {
        resource: &'static str,
        name: String,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("{}", join_errors(.0))]
    Invalid(Vec<FieldError>),
    #[error("{message}")]
    Forbidden {
        reason: ForbiddenReason,
        message: String,
    },
    /// The resourceVersion or continue token is no longer (or not yet) served; relist.
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("internal storage error: {0}")]
    Internal(String),
}

/// The `reason` of a 403 raised by a domain rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForbiddenReason {
    ScopeEscalation,
    QuotaExceeded,
    AgentInactive,
    /// Only the owner of a pending enrollment may withdraw it.
    NotOwner,
}

impl ForbiddenReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScopeEscalation => "ScopeEscalation",
            Self::QuotaExceeded => "QuotaExceeded",
            Self::AgentInactive | Self::NotOwner => "Forbidden",
        }
    }
}

impl From<SessionRuleError> for StoreError {
    fn from(e: SessionRuleError) -> Self {
        let message = e.to_string();
        match e {
            SessionRuleError::Invalid(errors) => Self::Invalid(errors),
            SessionRuleError::AgentNotFound(_) => Self::Invalid(vec![FieldError::new(
                apis::validation::FieldErrorKind::Invalid,
                "spec.agent.name",
                message,
            )]),
            SessionRuleError::AgentInactive(_) => Self::Forbidden {
                reason: ForbiddenReason::AgentInactive,
                message,
            },
            SessionRuleError::ScopeEscalation(_) => Self::Forbidden {
                reason: ForbiddenReason::ScopeEscalation,
                message,
            },
            SessionRuleError::QuotaExceeded { .. } => Self::Forbidden {
                reason: ForbiddenReason::QuotaExceeded,
                message,
            },
            SessionRuleError::AgentUidMismatch { .. }
            | SessionRuleError::ServerFenced(_)
            | SessionRuleError::RevocationStands { .. } => Self::Conflict(message),
        }
    }
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

/// What a bulk revocation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevocationOutcome {
    /// `namespace/name` of every session this call revoked.
    pub revoked: Vec<String>,
    /// `namespace/name` of every selected session that was already revoked (and is now
    /// covered by this revocation too).
    pub already_revoked: Vec<String>,
}

/// The authenticated user a write is made for, as storage records and compares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requester {
    pub name: String,
    /// Empty when the authenticator reported none.
    pub uid: String,
}

pub use apis::locks::RevokerAuthority;

/// The storage port. The HTTP layer is generic over it; [`PgStore`] implements it.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one object.
    async fn get<K: Kind>(&self, namespace: &str, name: &str) -> Result<K>;
    /// Lists objects at a consistent snapshot.
    async fn list<K: Kind>(&self, query: &ListQuery) -> Result<ObjectList<K>>;
    /// Deletes an object, returning its last state. Deleting an Agent revokes its sessions
    /// in the same transaction; a deleted session's name is reserved forever.
    async fn delete<K: Kind>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K>;

    /// Issues a session under the rules of DESIGN §2.
    async fn create_session(
        &self,
        session: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>>;
    /// Updates a session through the main resource (status and authority fields are kept).
    async fn update_session(
        &self,
        session: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>>;
    /// Revokes one session; a no-op if it already is revoked.
    async fn revoke_session(
        &self,
        namespace: &str,
        name: &str,
        cause: &str,
        revocation_name: Option<&str>,
    ) -> Result<AccessSession>;
    /// Lifts a session's revocation: refused (409) for a fenced server or an inactive agent.
    async fn unrevoke_session(&self, namespace: &str, name: &str) -> Result<AccessSession>;
    /// Revokes every session of a server generation and installs its permanent UID fence.
    async fn retire_server(
        &self,
        namespace: &str,
        server: &ServerRef,
        revocation_name: Option<&str>,
    ) -> Result<RevocationOutcome>;

    /// Adds an agent to the directory.
    async fn create_agent(&self, agent: Agent, dry_run: bool) -> Result<Written<Agent>>;
    /// Updates an agent; `spec.active: false` revokes its sessions in the same transaction.
    async fn update_agent(&self, agent: Agent, dry_run: bool) -> Result<Written<Agent>>;

    /// Updates only the metadata (labels, annotations, owner references, finalizers) of an
    /// object whose spec is fixed at creation; a changed spec is refused, status is kept.
    async fn update_metadata<K: Kind>(&self, object: K, dry_run: bool) -> Result<Written<K>>;
    /// Creates an Enrollment and its AccessSession in `PendingEnrollment`, owned by `owner`
    /// (name and uid recorded).
    async fn create_enrollment(
        &self,
        enrollment: Enrollment,
        owner: &Requester,
        dry_run: bool,
    ) -> Result<Written<Enrollment>>;
    /// Completes an enrollment: under the session lock checks the uid (when given), expiry,
    /// agent and revocation, then activates the session.
    async fn complete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        dry_run: bool,
    ) -> Result<Enrollment>;
    /// Withdraws a pending enrollment (its owner only, by name and uid: the session is
    /// deleted and its name reserved) or removes a completed enrollment's record. `caller` is
    /// `None` when the namespace is being torn down: the namespace controller withdraws
    /// everything.
    async fn delete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        caller: Option<&Requester>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Enrollment>;
    /// Garbage-collects completed enrollments older than `retention`. Returns how many.
    async fn collect_completed_enrollments(&self, retention: std::time::Duration) -> Result<usize>;
    /// Creates a Revocation and revokes its targets in one transaction; from then on it
    /// refuses new sessions for its target until deleted or expired. A `server_retired`
    /// fence applies in every namespace only for a creator with cluster-wide `authority`.
    async fn create_revocation(
        &self,
        revocation: Revocation,
        authority: RevokerAuthority,
        dry_run: bool,
    ) -> Result<Written<Revocation>>;
    /// Withdraws a revocation: every session it covers loses that cover, and those no other
    /// revocation covers are restored when their agent and server are still usable. With
    /// `restore` false (the namespace is being torn down) no session is touched. Fences stay
    /// (409).
    async fn delete_revocation(
        &self,
        namespace: &str,
        name: &str,
        restore: bool,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Revocation>;

    /// The current resourceVersion.
    async fn current_version(&self) -> Result<ResourceVersion>;
    /// Follows the change log from just after `from`.
    async fn subscribe(&self, from: ResourceVersion) -> Result<Subscription>;
}
