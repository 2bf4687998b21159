//! The API objects of `access.mcp-runtime.dev/v1alpha1` (DESIGN §2).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta, Time};
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
    ///
    /// Fixed at issuance: updates may only bring `expiresAt` forward.
    pub spec: AccessSessionSpec,
    /// Observed state: phase, revocation and pending enrollment.
    ///
    /// Written by the server only; a `status` sent on create or update is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AccessSessionStatus>,
}

// What an access session grants.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessSessionSpec {
    /// The MCPServer generation this session is for.
    ///
    /// Required and immutable. A server uid retired by a `server_retired` Revocation is fenced: no
    /// session may be issued or restored for it.
    pub server: ServerRef,
    /// The agent acting under this session; its uid is filled in by the server.
    ///
    /// Optional and immutable. The Agent must exist and be active when the session is issued; then
    /// `teams` must be a subset of the agent's teams, `expiresAt` is clamped to its
    /// `maxSessionTTL`, and its `maxActiveSessions` applies. At least one of `agent`, `subject` or
    /// `teams` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRef>,
    /// The human on whose behalf the session acts.
    ///
    /// Optional and immutable. At least one of `agent`, `subject` or `teams` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// Authority teams.
    ///
    /// The teams whose authority the session carries. Optional and immutable; entries must be
    /// non-empty and unique. With an `agent`, every team must be one of the agent's teams (403
    /// ScopeEscalation otherwise). At least one of `agent`, `subject` or `teams` is required.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<String>,
    /// The tools this session may call.
    ///
    /// Optional: absent means every tool the server offers. Each entry is a tool name
    /// (`search_issues`) or a prefix pattern ending in `*` (`issues_*`; `*` alone is every tool);
    /// at most 256 unique entries of 1 to 128 characters, a pattern's `*` only at its end. The
    /// gateway refuses a `tools/call` of any other tool with the JSON-RPC error
    /// `tool_not_granted`, before it reaches the server. Updates may only narrow it (drop
    /// entries, or replace a pattern by the names or longer patterns it covers); a narrowing
    /// reaches every gateway as a revocation does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The most `tools/call` requests per minute this session may make at each gateway.
    ///
    /// Optional; 1 to 1000000. A token bucket of this size, refilled at this rate per minute:
    /// past it the gateway answers 429 with `Retry-After`. With an agent that has
    /// `callsPerMinute`, it is clamped to the agent's (with a Warning) and set to it when
    /// absent. Updates may only lower it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
    /// Grant linkage, opaque to MCP Access.
    ///
    /// Optional and immutable; stored and returned as given, never interpreted by MCP Access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantRef>,
    /// When the session stops being valid; clamped by the server.
    ///
    /// Required: an RFC 3339 time (e.g. `2026-12-01T00:00:00Z`), in the future at issuance. The
    /// server clamps it to now plus the smaller of its maximum session lifetime
    /// (`--max-session-ttl`, 24h unless configured) and the agent's `maxSessionTTL`, and says so in
    /// a Warning. Updates may bring it forward; a later value is kept at the current one, with a
    /// Warning.
    pub expires_at: Option<Time>,
}

/// A reference to one generation of an MCPServer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServerRef {
    /// Name of the MCPServer.
    ///
    /// Required; in a session, a DNS-1123 subdomain (lowercase alphanumerics, `-` and `.`).
    #[serde(default)]
    pub name: String,
    /// UID of the MCPServer generation.
    ///
    /// Required. Revocations with a server target and retirement fences match sessions by this uid,
    /// so a re-created MCPServer of the same name is a new generation.
    #[serde(default)]
    pub uid: String,
}

/// A reference to an Agent directory entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRef {
    /// Name of the Agent.
    ///
    /// Required: a DNS-1123 subdomain naming a cluster-scoped Agent, which must exist and be active
    /// when the session is issued.
    #[serde(default)]
    pub name: String,
    /// UID of the Agent, bound by the server at issuance.
    ///
    /// Optional on create: when given, it must be the Agent's current uid (a re-created Agent of
    /// the same name is refused). The server fills it in and it never changes: the session stays
    /// bound to that Agent even if one of the same name is created later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The Agent's `callsPerMinute` when the session was issued, set by the server.
    ///
    /// Gateways hold every session of the agent together to it (one token bucket per agent at
    /// each gateway). A value sent on create is replaced by the Agent's; it never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
}

/// A human subject.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Subject {
    /// The user name, as the cluster authenticates it.
    ///
    /// Required when `subject` is set (not blank), e.g. `alice@example.com`. A Revocation with a
    /// `subject` target revokes the sessions whose user is exactly this name.
    #[serde(default)]
    pub user: String,
}

/// A grant reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantRef {
    /// Name of the grant.
    ///
    /// Required when `grant` is set.
    #[serde(default)]
    pub name: String,
}

/// Lifecycle phase of a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SessionPhase {
    /// Usable until `spec.expiresAt`: issued, enrollment completed, or revocation withdrawn.
    #[default]
    Active,
    /// Created by an Enrollment; becomes `Active` when that enrollment is completed.
    PendingEnrollment,
    /// Covered by a revocation or an agent deactivation; `status.revocation` says which.
    Revoked,
    /// Reached `spec.expiresAt`: the server writes it within a second of that instant.
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
    ///
    /// Set by the server: `Active` at issuance, `PendingEnrollment` for a session an Enrollment
    /// created until that enrollment is completed, `Revoked` while any revocation covers it.
    /// `Expired` once `spec.expiresAt` is reached (a revoked session stays `Revoked`).
    #[serde(default)]
    pub phase: SessionPhase,
    /// Set when the session was revoked; written only by revocation paths.
    ///
    /// Removed when the last revocation covering the session is withdrawn and the session is
    /// restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation: Option<RevocationInfo>,
    /// Present while an enrollment is pending.
    ///
    /// Written by the server when an Enrollment creates the session; removed when the enrollment is
    /// completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment: Option<EnrollmentInfo>,
    /// Standard conditions.
    ///
    /// `Expired` (reason `ExpiresAtReached`) when the session expires.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Why and when a session was revoked. Written only by revocation paths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationInfo {
    /// When the session was revoked.
    ///
    /// The time of the first revocation (RFC 3339, whole seconds); revocations that cover the
    /// session later do not change it.
    pub revoked_at: Time,
    /// Why: manual, compromised, agent_deactivated, server_retired, ...
    ///
    /// The cause of the first revocation: that Revocation's `spec.cause`, or `agent_deactivated`
    /// when the session's Agent was deactivated or deleted.
    pub cause: String,
    /// The Revocation object that revoked it, if any.
    ///
    /// The first revocation; absent when an agent deactivation revoked the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_name: Option<String>,
    /// Every revocation that covers the session now, the first one included. The session stays
    /// revoked while any is left; entries without a name (an agent deactivation) are permanent.
    ///
    /// Deleting a Revocation removes its entry. An unnamed entry is also left when the last
    /// revocation is withdrawn but the session cannot be restored (its agent gone or inactive, its
    /// server fenced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covered_by: Vec<CoveringRevocation>,
}

/// One revocation that covers a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoveringRevocation {
    /// Why: manual, compromised, agent_deactivated, server_retired, ...
    ///
    /// The covering Revocation's `spec.cause`, or the reason of an unnamed entry.
    pub cause: String,
    /// The Revocation object, in the session's namespace; none for an agent deactivation.
    ///
    /// A cluster-wide `server_retired` fence may live in another namespace. Absent for an unnamed,
    /// permanent entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_name: Option<String>,
}

/// Pending enrollment metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentInfo {
    /// Enrollment state (Pending).
    ///
    /// Always `Pending`: the whole record is removed when the enrollment is completed.
    pub state: String,
    /// The user who created the enrollment.
    ///
    /// As the cluster authenticated them; only they may withdraw the enrollment while it is
    /// pending.
    pub owner: String,
    /// The uid of that user, when the authenticator reported one.
    ///
    /// Withdrawal compares it too: a user re-created under the same name is not the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<String>,
    /// When the enrollment was requested.
    ///
    /// The Enrollment's creation time (RFC 3339).
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
    ///
    /// Limits apply to sessions issued afterwards; setting `active` to false revokes the agent's
    /// sessions at once.
    pub spec: AgentSpec,
    /// Observed state of the agent.
    ///
    /// Written by the server only; a `status` sent on create or update is ignored.
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
    ///
    /// Optional and free-form; never used for matching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Users responsible for the agent.
    ///
    /// Optional; entries must not be blank. Informational: being an owner grants no permission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
    /// Teams the agent may act for; a session's teams must be a subset.
    ///
    /// Optional; entries must be non-empty and unique. Issuing a session of this agent for another
    /// team is refused (403 ScopeEscalation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<String>,
    /// Whether the agent may hold sessions; false revokes all of them.
    ///
    /// Defaults to true. Setting it to false (or deleting the Agent) revokes every session of the
    /// agent, with cause `agent_deactivated`, in the same transaction, and no session may be issued
    /// for it while it is inactive. Sessions revoked so stay revoked when it is set back to true.
    #[serde(default = "default_true")]
    pub active: bool,
    /// Longest session this agent may hold, as a Go duration (`8h`, `90m`).
    ///
    /// Optional; greater than zero. A new session's `expiresAt` is clamped to now plus the smaller
    /// of this and the server's maximum, with a Warning. Without it only the server's maximum
    /// applies.
    #[serde(
        rename = "maxSessionTTL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_session_ttl: Option<String>,
    /// Most sessions this agent may hold at once.
    ///
    /// Optional; without it there is no limit. Sessions that are Active or PendingEnrollment and
    /// not expired count; issuing one more is refused (403 QuotaExceeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_sessions: Option<u32>,
    /// The most tools a session of this agent may be granted (tool names and `prefix*`
    /// patterns, as a session's `spec.tools`).
    ///
    /// Optional; without it any tool may be granted. A new session of this agent that names a
    /// tool outside it is refused (403 ScopeEscalation, naming the tool); one that names no tools
    /// is granted exactly this list, with a Warning. Changing it applies to sessions issued
    /// afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The most `tools/call` requests per minute the sessions of this agent may make at each
    /// gateway, together and each.
    ///
    /// Optional; 1 to 1000000. Recorded on each new session of the agent (`spec.agent`), whose
    /// gateways hold all of them together to it; and a session's own `callsPerMinute` is at
    /// most this (clamped, or set when it names none, with a Warning). Changing it applies to
    /// sessions issued afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
}

impl Default for AgentSpec {
    fn default() -> Self {
        Self {
            display_name: None,
            owners: Vec::new(),
            teams: Vec::new(),
            tools: None,
            calls_per_minute: None,
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
    ///
    /// Computed when the Agent is read (get, list), not stored, so watch events do not carry it:
    /// sessions bound to this agent's uid that are Active or PendingEnrollment and not expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_sessions: Option<u32>,
    /// When the agent was deactivated.
    ///
    /// Set by the server when `spec.active` becomes false (at creation too); cleared when it is set
    /// back to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deactivated_at: Option<Time>,
    /// Standard conditions.
    ///
    /// The server writes none in this version.
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
    ///
    /// Checked and admitted at creation as an AccessSession's spec (the agent's uid bound,
    /// `expiresAt` clamped), then fixed: updates may change only metadata.
    pub spec: AccessSessionSpec,
    /// Owner and progress of the enrollment.
    ///
    /// Written by the server. Completing the enrollment (setting `phase` to `Completed` through the
    /// status subresource) is the only change a client may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EnrollmentStatus>,
}

/// Progress of an enrollment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EnrollmentPhase {
    /// The session waits in `PendingEnrollment`; the owner may withdraw it by deleting the record.
    #[default]
    Pending,
    /// The session was activated; the record is garbage-collected after the retention period.
    Completed,
}

// Observed state of an enrollment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentStatus {
    /// Pending until completed through the status subresource.
    ///
    /// Completion (a PATCH or PUT of `enrollments/status` setting `Completed`) activates the
    /// session after checking its uid, expiry, agent and revocations (409 with the reason); any
    /// other change in the request is refused (422). Completed records are deleted after the
    /// retention period (`--enrollment-retention`, 24h unless configured).
    #[serde(default)]
    pub phase: EnrollmentPhase,
    /// The user who created the enrollment; only they may withdraw it while pending.
    ///
    /// Set by the server from the authenticated creator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The uid of that user (as CertificateSigningRequests record it): a re-created user or
    /// ServiceAccount of the same name is not the owner.
    ///
    /// Set by the server; absent when the authenticator reported no uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<String>,
    /// When the enrollment was requested.
    ///
    /// Set by the server at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Time>,
    /// When the enrollment was completed.
    ///
    /// Set by the server on completion.
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
    ///
    /// Fixed at creation: updates may change only metadata.
    pub spec: RevocationSpec,
    /// What the revocation did.
    ///
    /// Written by the server when the revocation is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RevocationStatus>,
}

// What to revoke and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationSpec {
    /// Exactly one of session, server or subject.
    ///
    /// The sessions to revoke, in the revocation's namespace (a cluster-wide `server_retired` fence
    /// reaches every namespace). While the revocation stands, no session it would select may be
    /// issued, enrolled, completed or restored.
    #[serde(default)]
    pub target: RevocationTarget,
    /// Why: manual, compromised, server_retired (installs a permanent fence), ...
    ///
    /// Required: lowercase letters, digits and `_`, at most 63 characters. `server_retired` needs a
    /// `server` target and fences that server uid for good: the revocation cannot expire or be
    /// deleted. The fence reaches every namespace when its creator may create revocations in every
    /// namespace, else only this one.
    #[serde(default)]
    pub cause: String,
    /// Free-form explanation for the audit trail.
    ///
    /// Optional; not interpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the revocation stops refusing new sessions for its target. Sessions it revoked stay
    /// revoked until it is deleted. Without it, it stands until deleted.
    ///
    /// Optional: an RFC 3339 time in the future at creation; not allowed with `server_retired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

// The sessions a revocation applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationTarget {
    /// One session in this namespace.
    ///
    /// The AccessSession's name. Deleting such a revocation restores the session when nothing else
    /// covers it and its agent and server are still usable (409 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Every session of that MCPServer generation in this namespace.
    ///
    /// `name` and `uid` are both required; sessions are matched by uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerRef>,
    /// Every session of that human subject in this namespace.
    ///
    /// A user name, matched exactly against `spec.subject.user`; not blank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

// What a revocation did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationStatus {
    /// How many sessions this revocation covers: those it revoked and those already revoked by
    /// another revocation when it was created.
    ///
    /// Set by the server at creation; a Warning says how many were already revoked.
    #[serde(default)]
    pub revoked_sessions: u32,
    /// Whether a `server_retired` fence applies in every namespace (its creator may create
    /// revocations cluster-wide) rather than only in the revocation's namespace.
    ///
    /// Set by the server, which asks the authorizer at creation; omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_wide: bool,
    /// When it took effect.
    ///
    /// Set by the server: the time of the transaction that revoked the targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Where the revocation has reached: the gateway watches of each server whose sessions it
    /// changed, and how many of them it was written to (docs/revocation.md, "Revocation
    /// receipts").
    ///
    /// Set by the server: the servers at creation, the counts as the apiserver replicas that
    /// serve those watches report them (about once a second while any is pending, for at most
    /// the tracking window). Omitted when the revocation changed no session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<RevocationDelivery>,
}

/// The receipts of one revocation, summed over the apiserver replicas that report them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationDelivery {
    /// Gateway watches connected for the tracked servers, over every reporting replica.
    #[serde(default)]
    pub gateways: u32,
    /// Of those, how many the revocation's changes were written to.
    #[serde(default)]
    pub delivered: u32,
    /// When the change feed of the first reporting replica saw the revocation committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<MicroTime>,
    /// When the last of the delivered watches received it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_at: Option<MicroTime>,
    /// The resourceVersion a watch must have been written past to count as delivered: the
    /// revocation's own, at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The servers whose sessions it changed, by uid (at most 16, in uid order), with their
    /// counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerDelivery>,
    /// Servers whose sessions it changed beyond the 16 tracked.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub untracked_servers: u32,
    /// Each replica's share, as it last reported it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaDelivery>,
}

/// The receipts of one server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerDelivery {
    /// The MCPServer's uid, as the sessions name it.
    pub uid: String,
    /// Gateway watches connected for this server.
    #[serde(default)]
    pub gateways: u32,
    /// Of those, how many the revocation's changes were written to.
    #[serde(default)]
    pub delivered: u32,
    /// When the last of them received it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_at: Option<MicroTime>,
}

/// One apiserver replica's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaDelivery {
    /// The replica (its pod name, or host name and process id).
    pub name: String,
    /// When it reported. A report that is not final and older than the staleness bound is
    /// from a replica that went away; it no longer counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<MicroTime>,
    /// Every watch this replica served for the tracked servers had received the revocation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub r#final: bool,
    /// When its change feed saw the revocation committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<MicroTime>,
    /// Its counts, per tracked server with any watch on this replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerDelivery>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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

/// How an MCP server's tools may be called: each tool's side effect, who may call the
/// destructive ones, and the values some arguments may take (namespaced, one or more per
/// MCPServer).
///
/// The server's gateways watch the policies of their MCPServer and check every `tools/call`
/// against all of them, after the session's own tool grant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolPolicy {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default)]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default)]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The server it governs, its mode and its tool rules.
    ///
    /// Validated as a whole on every write: a policy with any invalid field is refused (422)
    /// and the stored one stays in force, never part of it.
    pub spec: ToolPolicySpec,
    /// Observed state: the Ready condition.
    ///
    /// Written by the server only; a `status` sent on create or update is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ToolPolicyStatus>,
}

// What a tool policy governs and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolPolicySpec {
    /// The MCPServer whose tools this policy governs, in the policy's namespace.
    ///
    /// Required and immutable; by name, so the policy holds for every generation of the server.
    pub server: ServerName,
    /// `enforce` refuses what the policy does not allow; `monitor` forwards it and counts it.
    ///
    /// Optional; defaults to `enforce`. In `monitor` mode the gateway forwards every call this
    /// policy would refuse and records the refusal it would have made (metric and audit line).
    #[serde(default)]
    pub mode: PolicyMode,
    /// Who may call the tools this policy marks `destructive`.
    ///
    /// Optional; without it no session may call them. A session may call a destructive tool
    /// when one of its `teams` is listed here or its agent is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_callers: Option<Callers>,
    /// Rules for tools, by name or `prefix*` pattern.
    ///
    /// Required, 1 to 4096 rules with unique names. A call matches every rule whose name is the
    /// tool's or whose pattern covers it; every matching rule applies. Tools no rule matches are
    /// governed by the session's grant alone.
    pub tools: Vec<ToolRule>,
}

/// A reference to an MCPServer by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServerName {
    /// Name of the MCPServer.
    ///
    /// Required: a DNS-1123 subdomain.
    #[serde(default)]
    pub name: String,
}

/// Whether a tool policy refuses or only records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Calls the policy does not allow are refused before they reach the server.
    #[default]
    Enforce,
    /// Calls the policy does not allow are forwarded, counted and audited as `monitored`.
    Monitor,
}

impl PolicyMode {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Monitor => "monitor",
        }
    }
}

/// Sessions named by their teams or their agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Callers {
    /// Teams: a session carrying any of them qualifies.
    ///
    /// Optional; entries non-empty and unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<String>,
    /// Agents by name: a session bound to any of them qualifies.
    ///
    /// Optional; entries are DNS-1123 subdomains, unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
}

/// What a tool does to the world it reaches.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SideEffect {
    /// Reads only.
    #[default]
    Read,
    /// Changes state that can be changed back.
    Write,
    /// Deletes or changes what cannot be restored: only `destructiveCallers` may call it.
    Destructive,
}

impl SideEffect {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Destructive => "destructive",
        }
    }
}

/// The rule of one tool, or of the tools a pattern covers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolRule {
    /// A tool name (`delete_repo`) or a prefix pattern ending in `*` (`admin_*`).
    ///
    /// Required: 1 to 128 characters, no whitespace, a `*` only at the end; unique within the
    /// policy.
    #[serde(default)]
    pub name: String,
    /// `read`, `write` or `destructive`.
    ///
    /// Required. A `destructive` tool may be called only by the policy's `destructiveCallers`
    /// (refused otherwise with `destructive_not_allowed`).
    pub side_effect: SideEffect,
    /// Allowed values of named arguments.
    ///
    /// Optional, at most 32 with unique names. A call must carry each named argument with one
    /// of its values (refused otherwise with `argument_not_allowed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<ArgumentRule>,
    /// The most calls per minute each session may make of the tools this rule covers.
    ///
    /// Optional; 1 to 1000000. A token bucket per session and rule at each gateway: past it the
    /// call is answered 429 with `Retry-After` (in `monitor` mode, forwarded and counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
    /// The tool's definition as pinned: `sha256:` and the hex SHA-256 of its `name`,
    /// `description` and `inputSchema` as `tools/list` returns them (JSON, keys sorted, no
    /// whitespace).
    ///
    /// Optional; only on a rule naming one tool (no pattern). When the server lists the tool
    /// with another definition (a "rug pull"), the gateway hides it from `tools/list` and
    /// refuses its calls with `tool_changed` (in `monitor` mode, forwards and counts them)
    /// until the pin is updated, and reports an Event on the MCPServer. The gateway's
    /// `/config/status` and the Event show the digest it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// The values one argument of a tool call may take.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArgumentRule {
    /// The argument's name, a top-level key of the call's `arguments`.
    ///
    /// Required: 1 to 128 characters.
    #[serde(default)]
    pub name: String,
    /// The values it may take.
    ///
    /// Required, 1 to 256 unique entries. A string argument must equal an entry; a number or
    /// boolean argument must equal an entry as JSON text (`3`, `true`). An argument that is
    /// absent, null, an object or an array is refused.
    #[serde(default)]
    pub values: Vec<String>,
}

// Observed state of a tool policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolPolicyStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions.
    ///
    /// `Ready` is True (reason `Accepted`) once the generation is stored: gateways enforce it
    /// from the next event of their watch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl Kind for ToolPolicy {
    const KIND: &'static str = "ToolPolicy";
    const PLURAL: &'static str = "toolpolicies";
    const NAMESPACED: bool = true;
    const FIELDS: &'static [(&'static str, &'static [&'static str])] = &[
        META_FIELDS[0],
        META_FIELDS[1],
        ("spec.server.name", &["spec", "server", "name"]),
        ("spec.mode", &["spec", "mode"]),
    ];

    object_accessors!();
}
