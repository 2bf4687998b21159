//! The API objects of `access.mcp-runtime.dev/v1alpha1` (DESIGN §2).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every MCP Access resource.
pub const GROUP: &str = "access.mcp-runtime.dev";
/// The served version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every MCP Access object.
pub const API_VERSION: &str = "access.mcp-runtime.dev/v1alpha1";

/// Static facts about a served kind, shared by storage and the HTTP layer.
pub trait Kind: Clone + Serialize + for<'de> Deserialize<'de> + Send + Sync + 'static {
    /// `kind` as it appears in objects.
    const KIND: &'static str;
    /// The plural resource name used in URLs and as the storage key.
    const PLURAL: &'static str;
    /// Whether objects live in a namespace.
    const NAMESPACED: bool;
    /// Field selectors this kind supports, mapped to the JSON path they read.
    const FIELDS: &'static [(&'static str, &'static [&'static str])];

    /// Object metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Mutable object metadata.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// Sets `apiVersion` and `kind`.
    fn set_type_meta(&mut self);
}

/// The `Kind` methods every object type implements the same way.
macro_rules! object_accessors {
    () => {
        fn meta(&self) -> &ObjectMeta {
            &self.metadata
        }
        fn meta_mut(&mut self) -> &mut ObjectMeta {
            &mut self.metadata
        }
        fn set_type_meta(&mut self) {
            self.api_version = API_VERSION.to_string();
            self.kind = Self::KIND.to_string();
        }
    };
}

/// Field selector paths shared by every kind.
const META_FIELDS: [(&str, &[&str]); 2] = [
    ("metadata.name", &["metadata", "name"]),
    ("metadata.namespace", &["metadata", "namespace"]),
];

/// A grant of access to one MCP server for an agent, a human or a team.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessSession {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default)]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default)]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the session grants, to whom, and until when.
    pub spec: AccessSessionSpec,
    /// Observed state: phase, revocation and pending enrollment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AccessSessionStatus>,
}

// What an access session grants.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessSessionSpec {
    /// The MCPServer generation this session is for.
    pub server: ServerRef,
    /// The agent acting under this session; its uid is filled in by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRef>,
    /// The human on whose behalf the session acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// Authority teams.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<String>,
    /// Grant linkage, opaque to MCP Access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantRef>,
    /// When the session stops being valid; clamped by the server.
    pub expires_at: Option<Time>,
}

/// A reference to one generation of an MCPServer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServerRef {
    /// Name of the MCPServer.
    #[serde(default)]
    pub name: String,
    /// UID of the MCPServer generation.
    #[serde(default)]
    pub uid: String,
}

/// A reference to an Agent directory entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRef {
    /// Name of the Agent.
    #[serde(default)]
    pub name: String,
    /// UID of the Agent, bound by the server at issuance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A human subject.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Subject {
    /// The user name, as the cluster authenticates it.
    #[serde(default)]
    pub user: String,
}

/// A grant reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantRef {
    /// Name of the grant.
    #[serde(default)]
    pub name: String,
}

/// Lifecycle phase of a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SessionPhase {
    #[default]
    Active,
    PendingEnrollment,
    Revoked,
    Expired,
}

impl SessionPhase {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "Active",
            Self::PendingEnrollment => "PendingEnrollment",
            Self::Revoked => "Revoked",
            Self::Expired => "Expired",
        }
    }
}

// Observed state of a session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessSessionStatus {
    /// Active, PendingEnrollment, Revoked or Expired.
    #[serde(default)]
    pub phase: SessionPhase,
    /// Set when the session was revoked; written only by revocation paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation: Option<RevocationInfo>,
    /// Present while an enrollment is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment: Option<EnrollmentInfo>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Why and when a session was revoked. Written only by revocation paths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationInfo {
    /// When the session was revoked.
    pub revoked_at: Time,
    /// Why: manual, compromised, agent_deactivated, server_retired, ...
    pub cause: String,
    /// The Revocation object that revoked it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_name: Option<String>,
    /// Every revocation that covers the session now, the first one included. The session
    /// stays revoked while any is left; entries without a name (an agent deactivation) are
    /// permanent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covered_by: Vec<CoveringRevocation>,
}

/// One revocation that covers a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoveringRevocation {
    /// Why: manual, compromised, agent_deactivated, server_retired, ...
    pub cause: String,
    /// The Revocation object, in the session's namespace; none for an agent deactivation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_name: Option<String>,
}

/// Pending enrollment metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentInfo {
    /// Enrollment state (Pending).
    pub state: String,
    /// The user who created the enrollment.
    pub owner: String,
    /// The uid of that user, when the authenticator reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<String>,
    /// When the enrollment was requested.
    pub requested_at: Time,
}

/// An entry of the agent directory (cluster-scoped).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default)]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default)]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Who the agent is and what it may hold.
    pub spec: AgentSpec,
    /// Observed state of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AgentStatus>,
}

fn default_true() -> bool {
    true
}

// Who an agent is and what it may hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Users responsible for the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
    /// Teams the agent may act for; a session's teams must be a subset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<String>,
    /// Whether the agent may hold sessions; false revokes all of them.
    #[serde(default = "default_true")]
    pub active: bool,
    /// Longest session this agent may hold, as a Go duration (`8h`, `90m`).
    #[serde(
        rename = "maxSessionTTL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_session_ttl: Option<String>,
    /// Most sessions this agent may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_sessions: Option<u32>,
}

impl Default for AgentSpec {
    fn default() -> Self {
        Self {
            display_name: None,
            owners: Vec::new(),
            teams: Vec::new(),
            active: true,
            max_session_ttl: None,
            max_active_sessions: None,
        }
    }
}

// Observed state of an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Sessions of this agent that are active or pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_sessions: Option<u32>,
    /// When the agent was deactivated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deactivated_at: Option<Time>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl Kind for AccessSession {
    const KIND: &'static str = "AccessSession";
    const PLURAL: &'static str = "accesssessions";
    const NAMESPACED: bool = true;
    const FIELDS: &'static [(&'static str, &'static [&'static str])] = &[
        META_FIELDS[0],
        META_FIELDS[1],
        ("spec.server.name", &["spec", "server", "name"]),
        ("spec.server.uid", &["spec", "server", "uid"]),
        ("spec.agent.name", &["spec", "agent", "name"]),
        ("spec.subject.user", &["spec", "subject", "user"]),
        ("status.phase", &["status", "phase"]),
    ];

    object_accessors!();
}

impl Kind for Agent {
    const KIND: &'static str = "Agent";
    const PLURAL: &'static str = "agents";
    const NAMESPACED: bool = false;
    const FIELDS: &'static [(&'static str, &'static [&'static str])] = &[META_FIELDS[0]];

    object_accessors!();
}

impl AccessSession {
    /// The phase, `Active` when no status was written yet.
    pub fn phase(&self) -> SessionPhase {
        self.status.as_ref().map(|s| s.phase).unwrap_or_default()
    }
}

/// A request to enroll an adapter's session, modelled on CertificateSigningRequest: creating it
/// creates the AccessSession (same namespace, name and uid) in `PendingEnrollment`; patching its
/// status to `Completed` activates the session; deleting it while pending withdraws the session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Enrollment {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default)]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default)]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec of the session to enroll.
    pub spec: AccessSessionSpec,
    /// Owner and progress of the enrollment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EnrollmentStatus>,
}

/// Progress of an enrollment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EnrollmentPhase {
    #[default]
    Pending,
    Completed,
}

// Observed state of an enrollment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentStatus {
    /// Pending until completed through the status subresource.
    #[serde(default)]
    pub phase: EnrollmentPhase,
    /// The user who created the enrollment; only they may withdraw it while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The uid of that user (as CertificateSigningRequests record it): a re-created user or
    /// ServiceAccount of the same name is not the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<String>,
    /// When the enrollment was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Time>,
    /// When the enrollment was completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// An RBAC-governed revocation: creating it revokes its targets in the same transaction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revocation {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default)]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default)]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What to revoke and why.
    pub spec: RevocationSpec,
    /// What the revocation did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RevocationStatus>,
}

// What to revoke and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationSpec {
    /// Exactly one of session, server or subject.
    #[serde(default)]
    pub target: RevocationTarget,
    /// Why: manual, compromised, server_retired (installs a permanent fence), ...
    #[serde(default)]
    pub cause: String,
    /// Free-form explanation for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the revocation stops refusing new sessions for its target. Sessions it revoked
    /// stay revoked until it is deleted. Without it, it stands until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

// The sessions a revocation applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationTarget {
    /// One session in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Every session of that MCPServer generation in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerRef>,
    /// Every session of that human subject in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

// What a revocation did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationStatus {
    /// How many sessions this revocation covers: those it revoked and those already revoked
    /// by another revocation when it was created.
    #[serde(default)]
    pub revoked_sessions: u32,
    /// Whether a `server_retired` fence applies in every namespace (its creator may create
    /// revocations cluster-wide) rather than only in the revocation's namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_wide: bool,
    /// When it took effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

impl Kind for Enrollment {
    const KIND: &'static str = "Enrollment";
    const PLURAL: &'static str = "enrollments";
    const NAMESPACED: bool = true;
    const FIELDS: &'static [(&'static str, &'static [&'static str])] = &[
        META_FIELDS[0],
        META_FIELDS[1],
        ("spec.server.name", &["spec", "server", "name"]),
        ("status.phase", &["status", "phase"]),
        ("status.owner", &["status", "owner"]),
    ];

    object_accessors!();
}

impl Kind for Revocation {
    const KIND: &'static str = "Revocation";
    const PLURAL: &'static str = "revocations";
    const NAMESPACED: bool = true;
    const FIELDS: &'static [(&'static str, &'static [&'static str])] = &[
        META_FIELDS[0],
        META_FIELDS[1],
        ("spec.cause", &["spec", "cause"]),
        ("spec.target.session", &["spec", "target", "session"]),
    ];

    object_accessors!();
}

impl Enrollment {
    /// The phase, `Pending` when no status was written yet.
    pub fn phase(&self) -> EnrollmentPhase {
        self.status.as_ref().map(|s| s.phase).unwrap_or_default()
    }
}
