//! One strategy per kind: the pure hooks a generic write transaction runs (the shape of
//! kube-apiserver's REST strategies). Storage reads what a hook asks for under its write lock,
//! calls the hook again with the answers, and executes the typed [`Plan`] it finally returns.
//!
//! A hook never does I/O. When it needs a fact it has not been given (an agent, whether a
//! server uid is fenced, the sessions a revocation selects), [`Facts`] answers
//! [`Stop::Need`] and the transaction loads it and asks again, so a hook is written as if
//! every fact were at hand: `let agent = facts.object::<Agent>("", name)?;`.

use std::collections::HashMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::locks::{Fence, RevokerAuthority, SessionSelector};
use crate::resources::ResourceInfo;
use crate::rules::{self, SessionRuleError};
use crate::table::TableRow;
use crate::types::{AccessSession, Kind, Revocation};
use crate::validation::FieldError;

/// Where an object is stored: its resource (plural), namespace ("" when cluster-scoped)
/// and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub resource: &'static str,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    /// The key of an object of kind `K` (the namespace is dropped for cluster-scoped kinds).
    pub fn of<K: Kind>(namespace: &str, name: &str) -> Self {
        Self {
            resource: K::PLURAL,
            namespace: if K::NAMESPACED {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    /// The key of a stored object.
    pub fn for_object<K: Kind>(object: &K) -> Self {
        let meta = object.meta();
        Self::of::<K>(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

/// A fact a hook may ask storage for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Read {
    /// One object (absent: `None`).
    Object(ObjectKey),
    /// Whether the key belonged to a deleted object whose name is reserved forever.
    NameReserved(ObjectKey),
    /// Whether a retirement fence covers the server uid in the namespace (one installed
    /// there, or a cluster-wide one).
    Fenced {
        server_uid: String,
        namespace: String,
    },
    /// The Revocations of `namespace` whose target could select a session named `session`
    /// of `subject` on `server_uid`: candidates, [`crate::locks::standing_revocation`]
    /// decides which stands.
    Revocations {
        namespace: String,
        session: String,
        subject: Option<String>,
        server_uid: String,
    },
    /// The sessions a selector selects, in key order.
    Sessions(SessionSelector),
    /// Up to `limit` sessions [`rules::due_for_expiry`] at `at`, in key order.
    DueSessions { at: Timestamp, limit: u32 },
    /// How many sessions bound to each agent uid count as active at `at`
    /// ([`rules::counts_as_active`]).
    ActiveSessions {
        agent_uids: Vec<String>,
        at: Timestamp,
    },
    /// What each ToolPolicy of `server` in `namespace` takes against the server's cap
    /// ([`crate::tool_policy::policy_bytes`]), by name.
    PolicySizes { namespace: String, server: String },
}

/// The answer to a [`Read`].
#[derive(Clone, Debug, PartialEq)]
pub enum Fact {
    /// A stored body, `metadata.resourceVersion` set.
    Object(Option<Value>),
    Flag(bool),
    Revocations(Vec<Revocation>),
    Sessions(Vec<AccessSession>),
    Counts(HashMap<String, u32>),
}

/// The facts a transaction has loaded so far.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    known: HashMap<Read, Fact>,
}

impl Facts {
    pub fn insert(&mut self, read: Read, fact: Fact) {
        self.known.insert(read, fact);
    }

    pub fn contains(&self, read: &Read) -> bool {
        self.known.contains_key(read)
    }

    fn get(&self, read: Read) -> Result<&Fact, Stop> {
        match self.known.get(&read) {
            Some(fact) => Ok(fact),
            None => Err(Stop::Need(vec![read])),
        }
    }

    /// The answer to `read`.
    pub fn answer(&self, read: &Read) -> Result<&Fact, Stop> {
        self.get(read.clone())
    }

    /// The stored object at `namespace`/`name`, if any.
    pub fn object<K: Kind>(&self, namespace: &str, name: &str) -> Result<Option<K>, Stop> {
        match self.get(Read::Object(ObjectKey::of::<K>(namespace, name)))? {
            Fact::Object(Some(body)) => {
                serde_json::from_value(body.clone()).map(Some).map_err(|e| {
                    Rejection::Unreadable(format!("stored {} is unreadable: {e}", K::KIND)).into()
                })
            }
            Fact::Object(None) => Ok(None),
            other => Err(mismatch(other)),
        }
    }

    /// Whether the name of `key` is reserved by a deleted object.
    pub fn name_reserved(&self, key: &ObjectKey) -> Result<bool, Stop> {
        self.flag(Read::NameReserved(key.clone()))
    }

    /// Whether a fence covers `server_uid` in `namespace`.
    pub fn fenced(&self, server_uid: &str, namespace: &str) -> Result<bool, Stop> {
        self.flag(Read::Fenced {
            server_uid: server_uid.to_string(),
            namespace: namespace.to_string(),
        })
    }

    /// The candidate Revocations for a session `name` with `spec` in `namespace`.
    pub fn revocations_for(
        &self,
        namespace: &str,
        name: &str,
        spec: &crate::types::AccessSessionSpec,
    ) -> Result<&[Revocation], Stop> {
        match self.get(revocations_read(namespace, name, spec))? {
            Fact::Revocations(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }

    /// The sessions `selector` selects.
    pub fn sessions(&self, selector: &SessionSelector) -> Result<&[AccessSession], Stop> {
        match self.get(Read::Sessions(selector.clone()))? {
            Fact::Sessions(s) => Ok(s),
            other => Err(mismatch(other)),
        }
    }

    /// The sessions due to expire at `at` (at most `limit`).
    pub fn due_sessions(&self, at: Timestamp, limit: u32) -> Result<&[AccessSession], Stop> {
        match self.get(Read::DueSessions { at, limit })? {
            Fact::Sessions(s) => Ok(s),
            other => Err(mismatch(other)),
        }
    }

    /// The stored session at `key` as this transaction read it (by itself or among the
    /// sessions of a selector), if it read it: the before-image of a write.
    pub fn stored_session(&self, key: &ObjectKey) -> Option<AccessSession> {
        if let Some(Fact::Object(Some(body))) = self.known.get(&Read::Object(key.clone())) {
            return serde_json::from_value(body.clone()).ok();
        }
        self.known.values().find_map(|fact| match fact {
            Fact::Sessions(sessions) => sessions
                .iter()
                .find(|s| ObjectKey::for_object(*s) == *key)
                .cloned(),
            _ => None,
        })
    }

    /// Active sessions bound to `agent_uid` at `at`.
    pub fn active_sessions(&self, agent_uid: &str, at: Timestamp) -> Result<u32, Stop> {
        match self.get(Read::ActiveSessions {
            agent_uids: vec![agent_uid.to_string()],
            at,
        })? {
            Fact::Counts(c) => Ok(c.get(agent_uid).copied().unwrap_or(0)),
            other => Err(mismatch(other)),
        }
    }

    /// What each policy of `server` in `namespace` takes against the cap, by name.
    pub fn policy_sizes(
        &self,
        namespace: &str,
        server: &str,
    ) -> Result<&HashMap<String, u32>, Stop> {
        match self.get(Read::PolicySizes {
            namespace: namespace.to_string(),
            server: server.to_string(),
        })? {
            Fact::Counts(c) => Ok(c),
            other => Err(mismatch(other)),
        }
    }

    fn flag(&self, read: Read) -> Result<bool, Stop> {
        match self.get(read)? {
            Fact::Flag(b) => Ok(*b),
            other => Err(mismatch(other)),
        }
    }
}

fn mismatch(fact: &Fact) -> Stop {
    Stop::Rejected(Rejection::Unreadable(format!(
        "storage answered a read with the wrong fact: {fact:?}"
    )))
}

/// The [`Read::Revocations`] for a session `name` with `spec` in `namespace`.
pub fn revocations_read(
    namespace: &str,
    name: &str,
    spec: &crate::types::AccessSessionSpec,
) -> Read {
    Read::Revocations {
        namespace: namespace.to_string(),
        session: name.to_string(),
        subject: spec.subject.as_ref().map(|s| s.user.clone()),
        server_uid: spec.server.uid.clone(),
    }
}

/// One write of a plan, executed in order in the plan's transaction.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Stores a new object (ADDED).
    Create {
        key: ObjectKey,
        uid: String,
        body: Value,
    },
    /// Replaces an object this transaction read (MODIFIED, with its before-image).
    Replace { key: ObjectKey, body: Value },
    /// Deletes an object this transaction read (DELETED, carrying its last state).
    Remove { key: ObjectKey },
    /// Reserves a deleted object's name forever.
    ReserveName { key: ObjectKey, uid: String },
    /// Installs a retirement fence (permanent).
    Fence { fence: Fence, revocation: String },
}

impl Write {
    /// A write of `object` (created when `create`, else replaced).
    pub fn put<K: Kind>(object: &K, create: bool) -> Result<Self, Rejection> {
        let key = ObjectKey::for_object(object);
        let body = encode(object)?;
        Ok(if create {
            Write::Create {
                key,
                uid: object.meta().uid.clone().unwrap_or_default(),
                body,
            }
        } else {
            Write::Replace { key, body }
        })
    }

    /// The object this write touches, if it touches one.
    pub fn key(&self) -> Option<&ObjectKey> {
        match self {
            Self::Create { key, .. } | Self::Replace { key, .. } | Self::Remove { key } => {
                Some(key)
            }
            Self::ReserveName { .. } | Self::Fence { .. } => None,
        }
    }
}

/// The stored form of an object: `resourceVersion` is not stored (it is the row's sequence).
pub fn encode<K: Kind>(object: &K) -> Result<Value, Rejection> {
    let mut body = serde_json::to_value(object)
        .map_err(|e| Rejection::Unreadable(format!("cannot encode {}: {e}", K::KIND)))?;
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    Ok(body)
}

/// What a write does: its writes, in order, and the object (with warnings) to answer with.
/// Storage sets the object's `resourceVersion` to that of the last write touching its key.
#[derive(Clone, Debug)]
pub struct Plan<K> {
    pub object: K,
    pub writes: Vec<Write>,
    pub warnings: Vec<String>,
}

impl<K> Plan<K> {
    /// Answers with `object` and writes nothing.
    pub fn unchanged(object: K) -> Self {
        Self {
            object,
            writes: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// Why a hook stopped without a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// It needs these facts first.
    Need(Vec<Read>),
    /// The write is refused.
    Rejected(Rejection),
}

impl From<Rejection> for Stop {
    fn from(e: Rejection) -> Self {
        Stop::Rejected(e)
    }
}

impl From<Refusal> for Stop {
    fn from(e: Refusal) -> Self {
        Stop::Rejected(e.into())
    }
}

impl From<SessionRuleError> for Stop {
    fn from(e: SessionRuleError) -> Self {
        Stop::Rejected(e.into())
    }
}

/// A refused write, structurally: the HTTP layer writes the Status text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Rejection {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    /// The name was used by a deleted object and is never reused.
    #[error("already exists: the name was used before and is reserved")]
    NameReserved,
    /// The uid a request names is not the stored object's.
    #[error("Precondition failed: UID in precondition: {given}, UID in object meta: {actual}")]
    UidPrecondition { given: String, actual: String },
    /// The resourceVersion a request names is not the stored object's.
    #[error("the object has been modified; please apply your changes to the latest version and try again")]
    Modified,
    #[error("{}", crate::validation::join_errors(.0))]
    Invalid(Vec<FieldError>),
    /// The kind does not serve this write.
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Refused(Refusal),
    /// A stored object cannot be decoded (a bug or a corrupted row, never the client's fault).
    #[error("{0}")]
    Unreadable(String),
}

impl From<Refusal> for Rejection {
    fn from(r: Refusal) -> Self {
        Rejection::Refused(r)
    }
}

impl From<SessionRuleError> for Rejection {
    fn from(e: SessionRuleError) -> Self {
        match e {
            SessionRuleError::Invalid(errors) => Rejection::Invalid(errors),
            // A missing agent is a field error of the request.
            SessionRuleError::AgentNotFound(_) => Rejection::Invalid(vec![FieldError::new(
                crate::validation::FieldErrorKind::Invalid,
                "spec.agent.name",
                e.to_string(),
            )]),
            e => Rejection::Refused(Refusal::Session(e)),
        }
    }
}

/// A domain rule refused the write.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// An issuance, restore or update rule of DESIGN §2.
    #[error("{0}")]
    Session(SessionRuleError),
    #[error("cannot complete enrollment {enrollment:?}: {why}")]
    Completion { enrollment: String, why: String },
    #[error("cannot withdraw revocation {revocation:?}: {why}")]
    Withdrawal { revocation: String, why: String },
    #[error("revocation {0:?} fences a retired server generation; fences are permanent")]
    FencePermanent(String),
    /// Only the owner of a pending enrollment may withdraw it.
    #[error(
        "only the owner {0:?} (the same user, by name and uid) may withdraw a pending enrollment"
    )]
    NotOwner(String),
}

/// The authenticated user a write is made for, as storage records and compares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requester {
    pub name: String,
    /// Empty when the authenticator reported none.
    pub uid: String,
}

/// Who deletes an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// A user, by request: their authority and ownership count.
    ByCaller(Requester),
    /// The namespace controller tearing a terminating namespace down: everything goes, and
    /// nothing is restored on the way (the namespace's sessions go too).
    NamespaceTeardown,
    /// The server removing completed records past their retention.
    Retention,
}

/// What every hook knows about the request besides the object.
#[derive(Clone, Debug)]
pub struct Context {
    pub now: Timestamp,
    pub requester: Requester,
    /// How far the requester's authority to create this kind reaches (asked only for kinds
    /// with [`Strategy::ASKS_CLUSTER_AUTHORITY`]).
    pub authority: RevokerAuthority,
    /// Server-wide maximum session lifetime.
    pub max_session_ttl: SignedDuration,
}

impl Context {
    /// A context at `now` for `requester` with namespace authority and a 24 h ceiling.
    pub fn new(now: Timestamp, requester: Requester) -> Self {
        Self {
            now,
            requester,
            authority: RevokerAuthority::Namespace,
            max_session_ttl: SignedDuration::from_hours(24),
        }
    }
}

/// A served kind: everything kind-specific about reading and writing it. The generic
/// transaction has already filled and validated server-owned metadata of a new object,
/// taken the write lock, checked preconditions and loaded the object itself where there is
/// one; hooks decide the rest.
pub trait Strategy: Kind + TableRow {
    /// Discovery, routing and RBAC description of the resource.
    const INFO: ResourceInfo;
    /// Whether a create needs to know if the caller may create this kind cluster-wide.
    const ASKS_CLUSTER_AUTHORITY: bool = false;

    /// Validates a new object's spec (metadata is validated generically).
    fn validate_create(&self) -> Vec<FieldError>;

    /// Validates an update's requested object before anything is read.
    fn validate_update(&self) -> Vec<FieldError> {
        Vec::new()
    }

    /// Facts worth loading with the write lock for a create, saving round trips. Whatever a
    /// hook needs beyond these is loaded on demand.
    fn create_reads(&self, _ctx: &Context) -> Vec<Read> {
        Vec::new()
    }

    /// Admits a new object (metadata filled and valid, spec valid).
    fn admit_create(object: Self, ctx: &Context, facts: &Facts) -> Result<Plan<Self>, Stop>;

    /// Admits an update through the main resource of `current` to `requested` (whose
    /// preconditions held). By default only metadata may change: the spec is fixed at
    /// creation and status is the server's.
    fn admit_update(
        current: Self,
        requested: Self,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        update_metadata_only(current, requested)
    }

    /// Admits a delete of `current` by `by`. By default the object goes.
    fn admit_delete(
        current: Self,
        _by: &Withdrawal,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        Ok(remove(current))
    }

    /// Checks a write through the `status` subresource before the requested object is
    /// decoded (`current` as stored, `requested` after the client's patch), so a value the
    /// kind does not support is reported as its validation reports it.
    fn check_status(_current: &Value, _requested: &Value) -> Result<(), Rejection> {
        Err(Rejection::Unsupported(format!(
            "{} has no status subresource",
            Self::INFO.plural
        )))
    }

    /// Admits a write through the `status` subresource, after [`Strategy::check_status`].
    fn admit_status(
        _current: Self,
        _requested: &Value,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        Err(
            Rejection::Unsupported(format!("{} has no status subresource", Self::INFO.plural))
                .into(),
        )
    }

    /// Whether [`Strategy::complete_reads`] adds to objects as read. Lists of a kind that
    /// does are rendered through its type; the others are served from the stored JSON.
    const COMPLETES_READS: bool = false;

    /// Facts that complete objects as read (fields computed when read, not stored).
    fn read_facts(_objects: &[Self], _now: Timestamp) -> Vec<Read> {
        Vec::new()
    }

    /// Completes objects as read from the facts [`Strategy::read_facts`] asked for.
    fn complete_reads(_objects: &mut [Self], _now: Timestamp, _facts: &Facts) -> Result<(), Stop> {
        Ok(())
    }
}

/// Removes `object` (the default delete).
pub fn remove<K: Kind>(object: K) -> Plan<K> {
    let key = ObjectKey::for_object(&object);
    Plan {
        object,
        writes: vec![Write::Remove { key }],
        warnings: Vec::new(),
    }
}

/// Takes the user-owned metadata of an update; the rest stays as stored.
pub fn merge_metadata(
    stored: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    update: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        labels: update.labels.clone(),
        annotations: update.annotations.clone(),
        owner_references: update.owner_references.clone(),
        finalizers: update.finalizers.clone(),
        // Computed by the API layer from the stored entries and the request.
        managed_fields: update.managed_fields.clone(),
        ..stored.clone()
    }
}

/// The metadata an update stores: the user-owned fields of `requested` over `stored`,
/// validated.
pub fn updated_metadata(
    stored: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    requested: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, Stop> {
    let meta = merge_metadata(stored, requested);
    let errors = rules::validate_metadata(&meta);
    if !errors.is_empty() {
        return Err(Rejection::Invalid(errors).into());
    }
    Ok(meta)
}

/// An update of a kind whose spec is fixed at creation: metadata only; a changed spec is
/// refused, status is kept.
pub fn update_metadata_only<K: Kind>(current: K, requested: K) -> Result<Plan<K>, Stop> {
    let requested_body = encode(&requested)?;
    let current_body = encode(&current)?;
    if requested_body.get("spec") != current_body.get("spec") {
        return Err(
            Rejection::Invalid(vec![FieldError::invalid("spec", "field is immutable")]).into(),
        );
    }
    let mut updated = current.clone();
    *updated.meta_mut() = updated_metadata(current.meta(), requested.meta())?;
    if encode(&updated)? == current_body {
        return Ok(Plan::unchanged(current));
    }
    Ok(Plan {
        writes: vec![Write::put(&updated, false)?],
        object: updated,
        warnings: Vec::new(),
    })
}
