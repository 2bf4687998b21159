//! The session rules of DESIGN §2 as pure functions: who may hold a session, how expiry is
//! clamped, what an update may change, and what revocation does to a session.
//! Storage calls these inside its transactions; nothing here does I/O.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::duration::parse_go_duration;
use crate::types::{
    AccessSession, AccessSessionSpec, AccessSessionStatus, Agent, AgentSpec, CoveringRevocation,
    RevocationInfo, RevocationSpec, SessionPhase,
};
use crate::validation::{
    is_dns1123_subdomain, validate_annotations, validate_labels, validate_object_name, FieldError,
};

/// Revocation cause written when an agent is deactivated or deleted.
pub const CAUSE_AGENT_DEACTIVATED: &str = "agent_deactivated";
/// Revocation cause written when an MCPServer generation is retired (installs the fence).
pub const CAUSE_SERVER_RETIRED: &str = "server_retired";

/// Why a session may not be issued (or changed) as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionRuleError {
    #[error("{}", crate::validation::join_errors(.0))]
    Invalid(Vec<FieldError>),
    #[error("agent {0:?} not found")]
    AgentNotFound(String),
    #[error("agent {0:?} is not active")]
    AgentInactive(String),
    #[error("spec.agent.uid {given:?} does not match agent {name:?} (uid {actual:?}): the agent was re-created")]
    AgentUidMismatch {
        name: String,
        given: String,
        actual: String,
    },
    #[error("teams {0:?} are not teams of the agent")]
    ScopeEscalation(Vec<String>),
    #[error("tool {tool:?} is outside the tools agent {agent:?} may be granted (its spec.tools)")]
    ToolEscalation { agent: String, tool: String },
    #[error("agent {name:?} already holds {active} active sessions (maxActiveSessions {max})")]
    QuotaExceeded { name: String, active: u32, max: u32 },
    #[error("server uid {0:?} was retired; no session may be issued or restored for it")]
    ServerFenced(String),
    /// A Revocation stands for this session's target: nothing may be issued, enrolled,
    /// completed or restored for it until the revocation is deleted or expires.
    #[error("revocation {name:?} ({cause}) covers this session's target; no session may be issued, enrolled or restored for it until that revocation is deleted or expires")]
    RevocationStands { name: String, cause: String },
}

/// What issuance needs to know besides the requested spec.
#[derive(Debug, Clone)]
pub struct IssuanceContext<'a> {
    /// The Agent named by `spec.agent`, if the spec names one and it exists.
    pub agent: Option<&'a Agent>,
    /// Sessions of that agent that are currently active or pending.
    pub agent_active_sessions: u32,
    /// Server-wide maximum session lifetime.
    pub server_max_ttl: SignedDuration,
    /// Whether `spec.server.uid` carries a retirement fence.
    pub server_fenced: bool,
    /// A live Revocation that covers the new session's target, if any (see
    /// [`crate::locks::standing_revocation`]).
    pub standing_revocation: Option<&'a crate::types::Revocation>,
    pub now: Timestamp,
}

/// An admitted spec (agent uid bound, expiry clamped) and the warnings to return.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub spec: AccessSessionSpec,
    pub warnings: Vec<String>,
}

/// Checks the shape of a session spec, independent of any other object.
/// Longest server UID accepted (a Kubernetes UID is a 36-character UUID). Bounded so that
/// the index on it can always hold the value: PostgreSQL refuses an index row over ~2.7 kB.
pub const MAX_UID_LENGTH: usize = 128;

/// A required UID of at most [`MAX_UID_LENGTH`] bytes.
fn validate_uid(uid: &str, field: &str, errors: &mut Vec<FieldError>) {
    if uid.is_empty() {
        errors.push(FieldError::required(field, "Required value"));
    } else if uid.len() > MAX_UID_LENGTH {
        errors.push(FieldError::new(
            crate::validation::FieldErrorKind::TooLong,
            field,
            format!("Too long: may not be more than {MAX_UID_LENGTH} bytes"),
        ));
    }
}

/// Checks an MCPServer name at `spec.server.name`: required, a DNS-1123 subdomain.
pub fn validate_server_name(name: &str) -> Option<FieldError> {
    if name.is_empty() {
        Some(FieldError::required("spec.server.name", "Required value"))
    } else if !is_dns1123_subdomain(name) {
        Some(FieldError::invalid(
            "spec.server.name",
            format!("Invalid value: {name:?}: must be an MCPServer name"),
        ))
    } else {
        None
    }
}

pub fn validate_session_spec(spec: &AccessSessionSpec) -> Vec<FieldError> {
    let mut errors: Vec<FieldError> = validate_server_name(&spec.server.name)
        .into_iter()
        .collect();
    validate_uid(&spec.server.uid, "spec.server.uid", &mut errors);
    if spec.agent.is_none() && spec.subject.is_none() && spec.teams.is_empty() {
        errors.push(FieldError::required(
            "spec",
            "at least one of spec.agent, spec.subject or spec.teams is required",
        ));
    }
    if let Some(agent) = &spec.agent {
        if !is_dns1123_subdomain(&agent.name) {
            errors.push(FieldError::invalid(
                "spec.agent.name",
                format!("Invalid value: {:?}: must be an Agent name", agent.name),
            ));
        }
    }
    if let Some(subject) = &spec.subject {
        if subject.user.trim().is_empty() {
            errors.push(FieldError::required("spec.subject.user", "Required value"));
        }
    }
    errors.extend(validate_teams(&spec.teams, "spec.teams"));
    if let Some(tools) = &spec.tools {
        errors.extend(validate_tools(tools, "spec.tools"));
    }
    errors.extend(validate_calls_per_minute(
        spec.calls_per_minute,
        "spec.callsPerMinute",
    ));
    if let Some(grant) = &spec.grant {
        if grant.name.is_empty() {
            errors.push(FieldError::required("spec.grant.name", "Required value"));
        }
    }
    if spec.expires_at.is_none() {
        errors.push(FieldError::required("spec.expiresAt", "Required value"));
    }
    errors
}

/// Entries of a tool allow-list.
pub const MAX_TOOL_ENTRIES: usize = 256;
/// Characters of a tool name or pattern.
pub const MAX_TOOL_NAME_LENGTH: usize = 128;

/// The largest `callsPerMinute` of a session, an agent or a tool rule.
pub const MAX_CALLS_PER_MINUTE: u32 = 1_000_000;

/// Checks a `callsPerMinute`: absent, or 1 to [`MAX_CALLS_PER_MINUTE`].
pub fn validate_calls_per_minute(value: Option<u32>, field: &str) -> Vec<FieldError> {
    match value {
        Some(n) if n == 0 || n > MAX_CALLS_PER_MINUTE => vec![FieldError::invalid(
            field,
            format!("Invalid value: {n}: must be between 1 and {MAX_CALLS_PER_MINUTE}"),
        )],
        _ => Vec::new(),
    }
}

/// Checks a tool allow-list: unique entries of 1 to 128 characters, none blank or holding
/// control characters, a `*` only as the last character (a prefix pattern).
pub fn validate_tools(tools: &[String], field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if tools.len() > MAX_TOOL_ENTRIES {
        errors.push(FieldError::new(
            crate::validation::FieldErrorKind::TooMany,
            field,
            format!(
                "Too many: {}: must have at most {MAX_TOOL_ENTRIES} items",
                tools.len()
            ),
        ));
        return errors;
    }
    let mut seen = BTreeSet::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if let Some(error) = validate_tool_entry(tool, &at) {
            errors.push(error);
        } else if !seen.insert(tool.as_str()) {
            errors.push(FieldError::new(
                crate::validation::FieldErrorKind::Duplicate,
                &at,
                format!("Duplicate value: {tool:?}"),
            ));
        }
    }
    errors
}

/// Checks one tool name or `prefix*` pattern at `at`: 1 to 128 characters, none blank,
/// whitespace or control, a `*` only as the last character.
pub fn validate_tool_entry(tool: &str, at: &str) -> Option<FieldError> {
    let stem = tool.strip_suffix('*').unwrap_or(tool);
    if tool.trim().is_empty() {
        Some(FieldError::required(at, "Required value"))
    } else if tool.chars().count() > MAX_TOOL_NAME_LENGTH {
        Some(FieldError::new(
            crate::validation::FieldErrorKind::TooLong,
            at,
            format!("Too long: may not be more than {MAX_TOOL_NAME_LENGTH} characters"),
        ))
    } else if stem.contains('*') || tool.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Some(FieldError::invalid(
            at,
            format!("Invalid value: {tool:?}: a tool name, or a prefix ending in a single '*'"),
        ))
    } else {
        None
    }
}

/// Whether a tool allow-list lets `tool` be called (absent: every tool).
pub fn tool_granted(tools: Option<&[String]>, tool: &str) -> bool {
    match tools {
        None => true,
        Some(entries) => entries.iter().any(|e| entry_covers(e, tool)),
    }
}

/// A tool allow-list indexed for many lookups (filtering a `tools/list` answer of hundreds
/// of tools): exact names hashed, patterns scanned. For one or two lookups [`tool_granted`]
/// is cheaper than building it.
pub struct ToolGrant {
    all: bool,
    exact: std::collections::HashSet<String>,
    prefixes: Vec<String>,
}

impl ToolGrant {
    pub fn new(tools: Option<&[String]>) -> Self {
        let mut grant = Self {
            all: tools.is_none(),
            exact: Default::default(),
            prefixes: Vec::new(),
        };
        for entry in tools.unwrap_or_default() {
            match entry.strip_suffix('*') {
                Some(prefix) => grant.prefixes.push(prefix.to_string()),
                None => {
                    grant.exact.insert(entry.clone());
                }
            }
        }
        grant
    }

    /// Whether `tool` is granted (as [`tool_granted`] answers).
    pub fn allows(&self, tool: &str) -> bool {
        self.all || self.exact.contains(tool) || self.prefixes.iter().any(|p| tool.starts_with(p))
    }
}

/// Whether the entry `wide` admits everything the entry `narrow` admits (a name or pattern).
fn entry_covers(wide: &str, narrow: &str) -> bool {
    match wide.strip_suffix('*') {
        Some(prefix) => narrow.starts_with(prefix),
        None => wide == narrow,
    }
}

/// The first entry of `new` that `old` does not cover: what makes `new` wider than `old`
/// (`Some("")` stands for "every tool", when `old` is a list and `new` is absent).
pub fn tools_widened<'a>(old: Option<&[String]>, new: Option<&'a [String]>) -> Option<&'a str> {
    match (old, new) {
        (None, _) => None,
        (Some(_), None) => Some(""),
        (Some(old), Some(new)) => new
            .iter()
            .find(|n| !old.iter().any(|o| entry_covers(o, n)))
            .map(String::as_str),
    }
}

pub(crate) fn validate_teams(teams: &[String], field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, team) in teams.iter().enumerate() {
        if team.trim().is_empty() {
            errors.push(FieldError::required(
                format!("{field}[{i}]"),
                "Required value",
            ));
        } else if !seen.insert(team) {
            errors.push(FieldError::invalid(
                format!("{field}[{i}]"),
                format!("Duplicate value: {team:?}"),
            ));
        }
    }
    errors
}

/// Validates object metadata common to all kinds.
pub fn validate_metadata(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<FieldError> {
    let mut errors = validate_object_name(meta.name.as_deref().unwrap_or(""), "metadata.name");
    if let Some(labels) = &meta.labels {
        errors.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = &meta.annotations {
        errors.extend(validate_annotations(annotations, "metadata.annotations"));
    }
    if let Some(finalizers) = &meta.finalizers {
        errors.extend(crate::validation::validate_finalizers(
            finalizers,
            "metadata.finalizers",
        ));
    }
    if let Some(owners) = &meta.owner_references {
        let owners: Vec<crate::validation::OwnerRef<'_>> = owners
            .iter()
            .map(|o| crate::validation::OwnerRef {
                api_version: &o.api_version,
                kind: &o.kind,
                name: &o.name,
                uid: &o.uid,
                controller: o.controller == Some(true),
            })
            .collect();
        errors.extend(crate::validation::validate_owner_references(
            &owners,
            "metadata.ownerReferences",
        ));
    }
    errors
}

/// The agent's own session lifetime limit, if it sets one.
pub fn agent_max_ttl(spec: &AgentSpec) -> Option<SignedDuration> {
    spec.max_session_ttl
        .as_deref()
        .and_then(|d| parse_go_duration(d).ok())
}

/// Validates an Agent spec.
pub fn validate_agent_spec(spec: &AgentSpec) -> Vec<FieldError> {
    let mut errors = validate_teams(&spec.teams, "spec.teams");
    if let Some(tools) = &spec.tools {
        errors.extend(validate_tools(tools, "spec.tools"));
    }
    errors.extend(validate_calls_per_minute(
        spec.calls_per_minute,
        "spec.callsPerMinute",
    ));
    for (i, owner) in spec.owners.iter().enumerate() {
        if owner.trim().is_empty() {
            errors.push(FieldError::required(
                format!("spec.owners[{i}]"),
                "Required value",
            ));
        }
    }
    if let Some(ttl) = &spec.max_session_ttl {
        match parse_go_duration(ttl) {
            Ok(d) if d > SignedDuration::ZERO => {}
            Ok(_) => errors.push(FieldError::invalid(
                "spec.maxSessionTTL",
                "must be greater than 0",
            )),
            Err(e) => errors.push(FieldError::invalid("spec.maxSessionTTL", e)),
        }
    }
    errors
}

/// Decides whether a new session may be issued, and in what form.
///
/// Human-only and team-only sessions skip every directory check; an agent session requires
/// the agent to exist and be active, binds its uid, keeps `teams` within the agent's teams,
/// and counts against `maxActiveSessions`. Expiry is clamped to the smaller of the agent's
/// and the server's maximum lifetime.
pub fn admit_session(
    spec: &AccessSessionSpec,
    ctx: &IssuanceContext<'_>,
) -> Result<Admission, SessionRuleError> {
    let errors = validate_session_spec(spec);
    if !errors.is_empty() {
        return Err(SessionRuleError::Invalid(errors));
    }
    if ctx.server_fenced {
        return Err(SessionRuleError::ServerFenced(spec.server.uid.clone()));
    }
    if let Some(revocation) = ctx.standing_revocation {
        return Err(SessionRuleError::RevocationStands {
            name: revocation.metadata.name.clone().unwrap_or_default(),
            cause: revocation.spec.cause.clone(),
        });
    }
    let requested = spec.expires_at.as_ref().map(|t| t.0).unwrap_or(ctx.now);
    if requested <= ctx.now {
        return Err(SessionRuleError::Invalid(vec![FieldError::invalid(
            "spec.expiresAt",
            "must be in the future",
        )]));
    }

    let mut admitted = spec.clone();
    let mut ceiling_warning = None;
    let mut rate_warning = None;
    let mut limit = ctx.server_max_ttl;
    let mut limit_source = "the server maximum";
    if let Some(agent_ref) = &spec.agent {
        let agent = ctx
            .agent
            .ok_or_else(|| SessionRuleError::AgentNotFound(agent_ref.name.clone()))?;
        if !agent.spec.active {
            return Err(SessionRuleError::AgentInactive(agent_ref.name.clone()));
        }
        let actual_uid = agent.metadata.uid.clone().unwrap_or_default();
        if let Some(given) = agent_ref.uid.as_ref().filter(|u| !u.is_empty()) {
            if *given != actual_uid {
                return Err(SessionRuleError::AgentUidMismatch {
                    name: agent_ref.name.clone(),
                    given: given.clone(),
                    actual: actual_uid,
                });
            }
        }
        let outside: Vec<String> = spec
            .teams
            .iter()
            .filter(|t| !agent.spec.teams.contains(t))
            .cloned()
            .collect();
        if !outside.is_empty() {
            return Err(SessionRuleError::ScopeEscalation(outside));
        }
        if let Some(ceiling) = &agent.spec.tools {
            match tools_widened(Some(ceiling), spec.tools.as_deref()) {
                None => {}
                // No list asked for: the ceiling is the grant.
                Some("") => {
                    admitted.tools = Some(ceiling.clone());
                    ceiling_warning = Some(format!(
                        "spec.tools set to the tools agent {:?} may be granted",
                        agent_ref.name
                    ));
                }
                Some(tool) => {
                    return Err(SessionRuleError::ToolEscalation {
                        agent: agent_ref.name.clone(),
                        tool: tool.to_string(),
                    })
                }
            }
        }
        if let Some(ceiling) = agent.spec.calls_per_minute {
            match spec.calls_per_minute {
                Some(asked) if asked <= ceiling => {}
                asked => {
                    admitted.calls_per_minute = Some(ceiling);
                    rate_warning = Some(match asked {
                        Some(asked) => format!(
                            "spec.callsPerMinute clamped from {asked} to {ceiling} by agent {:?}",
                            agent_ref.name
                        ),
                        None => format!(
                            "spec.callsPerMinute set to {ceiling}, the most agent {:?} may make",
                            agent_ref.name
                        ),
                    });
                }
            }
        }
        if let Some(max) = agent.spec.max_active_sessions {
            if ctx.agent_active_sessions >= max {
                return Err(SessionRuleError::QuotaExceeded {
                    name: agent_ref.name.clone(),
                    active: ctx.agent_active_sessions,
                    max,
                });
            }
        }
        if let Some(agent_ttl) = agent_max_ttl(&agent.spec) {
            if agent_ttl < limit {
                limit = agent_ttl;
                limit_source = "the agent's maxSessionTTL";
            }
        }
        if let Some(a) = admitted.agent.as_mut() {
            a.uid = Some(actual_uid);
            a.calls_per_minute = agent.spec.calls_per_minute;
        }
    }

    let mut warnings: Vec<String> = ceiling_warning.into_iter().chain(rate_warning).collect();
    let latest = ctx.now.checked_add(limit).unwrap_or(requested);
    if requested > latest {
        // Kubernetes times have second precision; round down so the clamp is never exceeded.
        let clamped = Timestamp::from_second(latest.as_second()).unwrap_or(latest);
        warnings.push(format!(
            "spec.expiresAt clamped from {} to {} by {limit_source} ({})",
            Time(requested).0.strftime("%Y-%m-%dT%H:%M:%SZ"),
            clamped.strftime("%Y-%m-%dT%H:%M:%SZ"),
            format_duration(limit),
        ));
        admitted.expires_at = Some(Time(clamped));
    }
    Ok(Admission {
        spec: admitted,
        warnings,
    })
}

fn format_duration(d: SignedDuration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m, s) {
        (h, 0, 0) => format!("{h}h"),
        (0, m, 0) => format!("{m}m"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// Checks an update of a session through the main resource and returns the spec to store.
///
/// Everything that carries authority is immutable: server, agent, subject, teams and grant;
/// `tools` may only be narrowed and `callsPerMinute` only lowered (or set).
/// `expiresAt` may be brought forward; a later value is kept at the current expiry with a
/// warning (as issuance clamps), so re-applying a manifest whose expiry was clamped works.
pub fn admit_session_update(
    old: &AccessSessionSpec,
    new: &AccessSessionSpec,
) -> Result<Admission, SessionRuleError> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let immutable = |field: &str| FieldError::invalid(field, "field is immutable");
    if new.server != old.server {
        errors.push(immutable("spec.server"));
    }
    let mut merged = new.clone();
    match (&old.agent, &new.agent) {
        (None, None) => {}
        (Some(o), Some(n)) if o.name == n.name && (n.uid.is_none() || n.uid == o.uid) => {
            merged.agent = Some(o.clone());
        }
        _ => errors.push(immutable("spec.agent")),
    }
    if new.subject != old.subject {
        errors.push(immutable("spec.subject"));
    }
    if new.teams != old.teams {
        errors.push(immutable("spec.teams"));
    }
    if new.grant != old.grant {
        errors.push(immutable("spec.grant"));
    }
    match tools_widened(old.tools.as_deref(), new.tools.as_deref()) {
        None => {}
        Some("") => errors.push(FieldError::invalid(
            "spec.tools",
            "may only be narrowed: removing it would grant every tool",
        )),
        Some(tool) => errors.push(FieldError::invalid(
            "spec.tools",
            format!("may only be narrowed: {tool:?} is not covered by the current list"),
        )),
    }
    match (old.calls_per_minute, new.calls_per_minute) {
        (Some(_), None) => errors.push(FieldError::invalid(
            "spec.callsPerMinute",
            "may only be lowered: removing it would lift the limit",
        )),
        (Some(o), Some(n)) if n > o => errors.push(FieldError::invalid(
            "spec.callsPerMinute",
            format!("may only be lowered: {n} is above the current {o}"),
        )),
        _ => {}
    }
    match (&old.expires_at, &new.expires_at) {
        (Some(o), Some(n)) if n.0 > o.0 => {
            warnings.push(format!(
                "spec.expiresAt cannot be extended: kept at {}",
                o.0.strftime("%Y-%m-%dT%H:%M:%SZ")
            ));
            merged.expires_at = Some(o.clone());
        }
        (_, None) => errors.push(FieldError::required("spec.expiresAt", "Required value")),
        _ => {}
    }
    if errors.is_empty() {
        Ok(Admission {
            spec: merged,
            warnings,
        })
    } else {
        Err(SessionRuleError::Invalid(errors))
    }
}

/// Whether a session still counts against its agent's `maxActiveSessions`.
pub fn counts_as_active(session: &AccessSession, now: Timestamp) -> bool {
    matches!(
        session.phase(),
        SessionPhase::Active | SessionPhase::PendingEnrollment
    ) && session.spec.expires_at.as_ref().is_some_and(|t| t.0 > now)
}

/// The condition type the server sets when a session turns `Expired`.
pub const CONDITION_EXPIRED: &str = "Expired";
/// Its reason: the clock reached `spec.expiresAt`.
pub const REASON_EXPIRES_AT_REACHED: &str = "ExpiresAtReached";

/// Whether a session must turn `Expired` at `now`: it is still usable or pending and its
/// `spec.expiresAt` has come. A revoked session stays `Revoked` (revocation says more than
/// expiry); a session without an expiry (never admitted) has no instant to expire at.
pub fn due_for_expiry(session: &AccessSession, now: Timestamp) -> bool {
    expiry_instant(session).is_some_and(|at| at <= now)
}

/// The instant a session will expire at, if it still can (usable or pending, with an
/// expiry): what the expiry scheduler sleeps until.
pub fn expiry_instant(session: &AccessSession) -> Option<Timestamp> {
    match session.phase() {
        SessionPhase::Active | SessionPhase::PendingEnrollment => {
            session.spec.expires_at.as_ref().map(|t| t.0)
        }
        SessionPhase::Revoked | SessionPhase::Expired => None,
    }
}

/// Turns a due session `Expired` at `now` (phase and an `Expired` condition, as Kubernetes
/// records a transition); pending enrollment metadata stays, so the record says what it was.
/// Returns whether the session changed: one not [`due_for_expiry`] is left alone.
pub fn expire_session(session: &mut AccessSession, now: Timestamp) -> bool {
    if !due_for_expiry(session, now) {
        return false;
    }
    let expires_at = session
        .spec
        .expires_at
        .as_ref()
        .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    let status = session
        .status
        .get_or_insert_with(AccessSessionStatus::default);
    status.phase = SessionPhase::Expired;
    status.conditions.retain(|c| c.type_ != CONDITION_EXPIRED);
    status.conditions.push(Condition {
        type_: CONDITION_EXPIRED.into(),
        status: "True".into(),
        reason: REASON_EXPIRES_AT_REACHED.into(),
        message: format!("spec.expiresAt {expires_at} was reached"),
        last_transition_time: Time(Timestamp::from_second(now.as_second()).unwrap_or(now)),
        observed_generation: session.metadata.generation,
    });
    true
}

/// A change of a session worth an Event (DESIGN §6 "Events"), derived from what a write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionTransition {
    /// Issuance clamped the requested `spec.expiresAt`.
    TtlClamped {
        requested: Timestamp,
        admitted: Timestamp,
    },
    /// The session became `Revoked` (its first revocation).
    Revoked {
        cause: String,
        revocation: Option<String>,
    },
    /// The session reached `spec.expiresAt`.
    Expired { expires_at: Timestamp },
    /// Its enrollment was completed: `PendingEnrollment` became `Active`.
    EnrollmentCompleted,
}

impl SessionTransition {
    /// The Event reason (CamelCase, as Kubernetes spells reasons).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TtlClamped { .. } => "TTLClamped",
            Self::Revoked { .. } => "Revoked",
            Self::Expired { .. } => "Expired",
            Self::EnrollmentCompleted => "EnrollmentCompleted",
        }
    }

    /// The action the Event reports (events.k8s.io `action`).
    pub fn action(&self) -> &'static str {
        match self {
            Self::TtlClamped { .. } => "Issue",
            Self::Revoked { .. } => "Revoke",
            Self::Expired { .. } => "Expire",
            Self::EnrollmentCompleted => "CompleteEnrollment",
        }
    }

    /// Whether the Event is a `Warning` (else `Normal`).
    pub fn is_warning(&self) -> bool {
        matches!(self, Self::TtlClamped { .. } | Self::Revoked { .. })
    }

    /// The human-readable note.
    pub fn note(&self) -> String {
        let fmt = |t: &Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        match self {
            Self::TtlClamped {
                requested,
                admitted,
            } => format!(
                "spec.expiresAt clamped from {} to {}",
                fmt(requested),
                fmt(admitted)
            ),
            Self::Revoked {
                cause,
                revocation: Some(name),
            } => format!("revoked ({cause}) by revocation {name}"),
            Self::Revoked {
                cause,
                revocation: None,
            } => format!("revoked ({cause})"),
            Self::Expired { expires_at } => {
                format!("spec.expiresAt {} was reached", fmt(expires_at))
            }
            Self::EnrollmentCompleted => "enrollment completed; the session is Active".into(),
        }
    }
}

/// What a write of an existing session did, worth an Event: `before` as stored, `after` as
/// written.
pub fn session_transition(
    before: &AccessSession,
    after: &AccessSession,
) -> Option<SessionTransition> {
    let (was, is) = (before.phase(), after.phase());
    if was == is {
        return None;
    }
    match is {
        SessionPhase::Revoked => {
            let info = after.status.as_ref().and_then(|s| s.revocation.as_ref())?;
            Some(SessionTransition::Revoked {
                cause: info.cause.clone(),
                revocation: info.revocation_name.clone(),
            })
        }
        SessionPhase::Expired => Some(SessionTransition::Expired {
            expires_at: after.spec.expires_at.as_ref()?.0,
        }),
        SessionPhase::Active if was == SessionPhase::PendingEnrollment => {
            Some(SessionTransition::EnrollmentCompleted)
        }
        _ => None,
    }
}

/// Whether issuance clamped the requested expiry: `requested` as asked, `admitted` as
/// stored.
pub fn ttl_clamped(
    requested: &AccessSessionSpec,
    admitted: &AccessSessionSpec,
) -> Option<SessionTransition> {
    match (&requested.expires_at, &admitted.expires_at) {
        (Some(r), Some(a)) if a.0 < r.0 => Some(SessionTransition::TtlClamped {
            requested: r.0,
            admitted: a.0,
        }),
        _ => None,
    }
}

/// What recording a revocation did to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeEffect {
    /// The session was usable and is now revoked (the one revocation event of its life).
    Revoked,
    /// The session already was revoked; this revocation now covers it too.
    AlsoCovered,
    /// This revocation already covered the session.
    Unchanged,
}

impl RevokeEffect {
    /// Whether the session must be written.
    pub fn changed(self) -> bool {
        self != Self::Unchanged
    }
}

/// The revocations covering a revoked session. Records written before coverage was tracked
/// carry only the first revocation: that one covers the session.
pub fn covering(info: &RevocationInfo) -> Vec<CoveringRevocation> {
    if info.covered_by.is_empty() {
        vec![CoveringRevocation {
            cause: info.cause.clone(),
            revocation_name: info.revocation_name.clone(),
        }]
    } else {
        info.covered_by.clone()
    }
}

/// Records a revocation on a session. The first revocation is the one on record
/// (`revokedAt`, `cause`, `revocationName`); every revocation that covers the session is
/// listed in `coveredBy`, so withdrawing one never lifts another.
pub fn revoke_session(
    session: &mut AccessSession,
    cause: &str,
    revocation_name: Option<&str>,
    now: Timestamp,
) -> RevokeEffect {
    let entry = CoveringRevocation {
        cause: cause.to_string(),
        revocation_name: revocation_name.map(str::to_string),
    };
    let status = session
        .status
        .get_or_insert_with(AccessSessionStatus::default);
    if let Some(info) = status.revocation.as_mut() {
        let mut covered_by = covering(info);
        if covered_by.contains(&entry) {
            info.covered_by = covered_by;
            return RevokeEffect::Unchanged;
        }
        covered_by.push(entry);
        info.covered_by = covered_by;
        return RevokeEffect::AlsoCovered;
    }
    status.phase = SessionPhase::Revoked;
    status.revocation = Some(RevocationInfo {
        revoked_at: Time(Timestamp::from_second(now.as_second()).unwrap_or(now)),
        cause: cause.to_string(),
        revocation_name: revocation_name.map(str::to_string),
        covered_by: vec![entry],
    });
    RevokeEffect::Revoked
}

/// Clears a revocation: the session returns to the phase it had (pending while its
/// enrollment is). Callers have decided that nothing covers it any more.
pub(crate) fn reinstate(status: &mut AccessSessionStatus) {
    status.revocation = None;
    status.phase = if status.enrollment.is_some() {
        SessionPhase::PendingEnrollment
    } else {
        SessionPhase::Active
    };
}

/// Checks a Revocation: exactly one target, a cause, and a server target for a retirement.
pub fn validate_revocation_spec(spec: &RevocationSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let t = &spec.target;
    let targets = [t.session.is_some(), t.server.is_some(), t.subject.is_some()];
    match targets.iter().filter(|x| **x).count() {
        0 => errors.push(FieldError::required(
            "spec.target",
            "exactly one of session, server or subject is required",
        )),
        1 => {}
        _ => errors.push(FieldError::forbidden(
            "spec.target",
            "exactly one of session, server or subject may be set",
        )),
    }
    if let Some(session) = &t.session {
        if !is_dns1123_subdomain(session) {
            errors.push(FieldError::invalid(
                "spec.target.session",
                format!("Invalid value: {session:?}: must be a session name"),
            ));
        }
    }
    if let Some(server) = &t.server {
        validate_uid(&server.uid, "spec.target.server.uid", &mut errors);
        if server.name.is_empty() {
            errors.push(FieldError::required(
                "spec.target.server.name",
                "Required value",
            ));
        }
    }
    if let Some(subject) = &t.subject {
        if subject.trim().is_empty() {
            errors.push(FieldError::required(
                "spec.target.subject",
                "Required value",
            ));
        }
    }
    let cause_ok = !spec.cause.is_empty()
        && spec.cause.len() <= 63
        && spec
            .cause
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if spec.cause.is_empty() {
        errors.push(FieldError::required("spec.cause", "Required value"));
    } else if !cause_ok {
        errors.push(FieldError::invalid(
            "spec.cause",
            format!(
                "Invalid value: {:?}: lowercase letters, digits and '_' (e.g. manual, compromised)",
                spec.cause
            ),
        ));
    }
    if spec.cause == CAUSE_SERVER_RETIRED && t.server.is_none() {
        errors.push(FieldError::invalid(
            "spec.cause",
            "server_retired applies to a server target (it fences that server generation)",
        ));
    }
    errors
}

/// Whether `caller` owns a pending enrollment recorded with `owner` and `owner_uid`. As for
/// CertificateSigningRequests the uid counts: a user or ServiceAccount re-created under the
/// same name is someone else. A record without a uid (its creator had none) compares names.
pub fn is_enrollment_owner(
    owner: &str,
    owner_uid: Option<&str>,
    caller: &str,
    caller_uid: &str,
) -> bool {
    owner == caller && owner_uid.is_none_or(|uid| uid == caller_uid)
}

/// Whether the session's agent, if it has one, still exists (`agent`, read by the name the
/// session bound) under the uid the session bound and is active; the error says why not.
pub fn check_session_agent(session: &AccessSession, agent: Option<&Agent>) -> Result<(), String> {
    let Some(agent_ref) = &session.spec.agent else {
        return Ok(());
    };
    let usable = agent.is_some_and(|a| {
        a.spec.active && a.metadata.uid.is_some() && a.metadata.uid == agent_ref.uid
    });
    if usable {
        Ok(())
    } else {
        Err(format!(
            "agent {:?} is no longer active (deactivated, deleted or re-created)",
            agent_ref.name
        ))
    }
}

/// Whether a session may be activated by completing its enrollment now.
pub fn check_completion(session: &AccessSession, now: Timestamp) -> Result<(), String> {
    if let Some(r) = session.status.as_ref().and_then(|s| s.revocation.as_ref()) {
        let by = covering(r)
            .iter()
            .map(|c| match &c.revocation_name {
                Some(name) => format!("{} by revocation {name:?}", c.cause),
                None => c.cause.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!(
            "the session was revoked ({by}) and cannot be activated"
        ));
    }
    match session.spec.expires_at.as_ref() {
        Some(t) if t.0 > now => Ok(()),
        Some(t) => Err(format!(
            "the session expired at {} and cannot be activated",
            t.0.strftime("%Y-%m-%dT%H:%M:%SZ")
        )),
        None => Err("the session has no expiry".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AgentRef, ServerRef, Subject};

    fn now() -> Timestamp {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn mk_spec(agent: Option<&str>, teams: &[&str], expires_in_h: i64) -> AccessSessionSpec {
        AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: "srv-1".into(),
            },
            agent: agent.map(|a| AgentRef {
                name: a.into(),
                uid: None,
                calls_per_minute: None,
            }),
            subject: None,
            teams: teams.iter().map(|t| t.to_string()).collect(),
            tools: None,
            calls_per_minute: None,
            grant: None,
            expires_at: Some(Time(now() + SignedDuration::from_hours(expires_in_h))),
        }
    }

    fn mk_agent(active: bool, teams: &[&str], ttl: Option<&str>, max: Option<u32>) -> Agent {
        let mut a = Agent::default();
        a.metadata.name = Some("billing-bot".into());
        a.metadata.uid = Some("agent-uid".into());
        a.spec.active = active;
        a.spec.teams = teams.iter().map(|t| t.to_string()).collect();
        a.spec.max_session_ttl = ttl.map(str::to_string);
        a.spec.max_active_sessions = max;
        a
    }

    fn ctx(agent: Option<&Agent>, active: u32) -> IssuanceContext<'_> {
        IssuanceContext {
            agent,
            agent_active_sessions: active,
            server_max_ttl: SignedDuration::from_hours(24),
            server_fenced: false,
            standing_revocation: None,
            now: now(),
        }
    }

    #[test]
    fn human_and_team_sessions_skip_the_directory() {
        let mut human = mk_spec(None, &[], 1);
        human.subject = Some(Subject {
            user: "alice@example.com".into(),
        });
        assert!(admit_session(&human, &ctx(None, 0)).is_ok());
        let team = mk_spec(None, &["payments", "anything"], 1);
        assert!(admit_session(&team, &ctx(None, 0)).is_ok());
        let nobody = mk_spec(None, &[], 1);
        assert!(matches!(
            admit_session(&nobody, &ctx(None, 0)),
            Err(SessionRuleError::Invalid(_))
        ));
    }

    #[test]
    fn agent_must_exist_be_active_and_bound() {
        let spec = mk_spec(Some("billing-bot"), &[], 1);
        assert!(matches!(
            admit_session(&spec, &ctx(None, 0)),
            Err(SessionRuleError::AgentNotFound(_))
        ));
        let inactive = mk_agent(false, &[], None, None);
        assert!(matches!(
            admit_session(&spec, &ctx(Some(&inactive), 0)),
            Err(SessionRuleError::AgentInactive(_))
        ));
        let agent = mk_agent(true, &[], None, None);
        let admitted = admit_session(&spec, &ctx(Some(&agent), 0)).unwrap();
        assert_eq!(
            admitted.spec.agent.unwrap().uid.as_deref(),
            Some("agent-uid")
        );
        let mut stale = spec.clone();
        stale.agent.as_mut().unwrap().uid = Some("old-uid".into());
        assert!(matches!(
            admit_session(&stale, &ctx(Some(&agent), 0)),
            Err(SessionRuleError::AgentUidMismatch { .. })
        ));
    }

    #[test]
    fn teams_must_be_a_subset_of_the_agents() {
        let agent = mk_agent(true, &["payments", "billing"], None, None);
        let ok = mk_spec(Some("billing-bot"), &["payments"], 1);
        assert!(admit_session(&ok, &ctx(Some(&agent), 0)).is_ok());
        let bad = mk_spec(Some("billing-bot"), &["payments", "admin"], 1);
        assert_eq!(
            admit_session(&bad, &ctx(Some(&agent), 0)),
            Err(SessionRuleError::ScopeEscalation(vec!["admin".into()]))
        );
    }

    #[test]
    fn expiry_is_clamped_to_agent_and_server_maxima() {
        let agent = mk_agent(true, &[], Some("8h"), None);
        let spec = mk_spec(Some("billing-bot"), &[], 48);
        let a = admit_session(&spec, &ctx(Some(&agent), 0)).unwrap();
        assert_eq!(
            a.spec.expires_at.unwrap().0,
            now() + SignedDuration::from_hours(8)
        );
        assert!(a.warnings[0].contains("maxSessionTTL"), "{:?}", a.warnings);
        let loose = mk_agent(true, &[], Some("100h"), None);
        let a = admit_session(&spec, &ctx(Some(&loose), 0)).unwrap();
        assert_eq!(
            a.spec.expires_at.unwrap().0,
            now() + SignedDuration::from_hours(24)
        );
        assert!(a.warnings[0].contains("server maximum"));
        let short = mk_spec(Some("billing-bot"), &[], 1);
        assert!(admit_session(&short, &ctx(Some(&agent), 0))
            .unwrap()
            .warnings
            .is_empty());
        let past = mk_spec(None, &["t"], -1);
        assert!(matches!(
            admit_session(&past, &ctx(None, 0)),
            Err(SessionRuleError::Invalid(_))
        ));
    }

    #[test]
    fn quota_and_fence() {
        let agent = mk_agent(true, &[], None, Some(2));
        let spec = mk_spec(Some("billing-bot"), &[], 1);
        assert!(admit_session(&spec, &ctx(Some(&agent), 1)).is_ok());
        assert!(matches!(
            admit_session(&spec, &ctx(Some(&agent), 2)),
            Err(SessionRuleError::QuotaExceeded {
                active: 2,
                max: 2,
                ..
            })
        ));
        let mut fenced = ctx(Some(&agent), 0);
        fenced.server_fenced = true;
        assert!(matches!(
            admit_session(&spec, &fenced),
            Err(SessionRuleError::ServerFenced(_))
        ));
    }

    #[test]
    fn updates_keep_authority_fields() {
        let old = admit_session(
            &mk_spec(Some("billing-bot"), &[], 2),
            &ctx(Some(&mk_agent(true, &[], None, None)), 0),
        )
        .unwrap()
        .spec;
        let mut shorter = old.clone();
        shorter.agent.as_mut().unwrap().uid = None;
        shorter.expires_at = Some(Time(now() + SignedDuration::from_hours(1)));
        let merged = admit_session_update(&old, &shorter).unwrap();
        assert_eq!(merged.spec.agent, old.agent);
        assert!(merged.warnings.is_empty());
        let mut longer = old.clone();
        longer.expires_at = Some(Time(now() + SignedDuration::from_hours(3)));
        let kept = admit_session_update(&old, &longer).unwrap();
        assert_eq!(kept.spec.expires_at, old.expires_at);
        assert_eq!(kept.warnings.len(), 1);
        let mut other_server = old.clone();
        other_server.server.uid = "srv-2".into();
        assert!(admit_session_update(&old, &other_server).is_err());
        let mut more_teams = old.clone();
        more_teams.teams.push("admin".into());
        assert!(admit_session_update(&old, &more_teams).is_err());
    }

    #[test]
    fn revocation_specs() {
        use crate::types::RevocationTarget;
        let spec = |target: RevocationTarget, cause: &str| RevocationSpec {
            target,
            cause: cause.into(),
            ..Default::default()
        };
        let session = RevocationTarget {
            session: Some("s".into()),
            ..Default::default()
        };
        let server = RevocationTarget {
            server: Some(ServerRef {
                name: "g".into(),
                uid: "u".into(),
            }),
            ..Default::default()
        };
        assert!(validate_revocation_spec(&spec(session.clone(), "manual")).is_empty());
        assert!(validate_revocation_spec(&spec(server.clone(), CAUSE_SERVER_RETIRED)).is_empty());
        assert!(!validate_revocation_spec(&spec(session.clone(), CAUSE_SERVER_RETIRED)).is_empty());
        assert!(!validate_revocation_spec(&spec(RevocationTarget::default(), "manual")).is_empty());
        let both = RevocationTarget {
            subject: Some("a".into()),
            ..session.clone()
        };
        assert!(!validate_revocation_spec(&spec(both, "manual")).is_empty());
        assert!(!validate_revocation_spec(&spec(session, "Bad Cause")).is_empty());
    }

    #[test]
    fn enrollment_owners_are_compared_by_name_and_uid() {
        assert!(is_enrollment_owner("sa", Some("u1"), "sa", "u1"));
        assert!(!is_enrollment_owner("sa", Some("u1"), "sa", "u2"));
        assert!(!is_enrollment_owner("sa", Some("u1"), "sa", ""));
        assert!(!is_enrollment_owner("sa", Some("u1"), "other", "u1"));
        assert!(is_enrollment_owner("sa", None, "sa", "anything"));
    }

    #[test]
    fn completion_needs_a_live_unrevoked_session() {
        let mut s = AccessSession {
            spec: mk_spec(None, &["t"], 1),
            ..Default::default()
        };
        assert!(check_completion(&s, now()).is_ok());
        assert!(check_completion(&s, now() + SignedDuration::from_hours(2))
            .unwrap_err()
            .contains("expired"));
        revoke_session(&mut s, "compromised", None, now());
        assert!(check_completion(&s, now())
            .unwrap_err()
            .contains("compromised"));
    }

    #[test]
    fn revocation_is_recorded_once_and_fenced_servers_stay_revoked() {
        let mut s = AccessSession {
            spec: mk_spec(None, &["t"], 1),
            ..Default::default()
        };
        assert_eq!(
            revoke_session(&mut s, "manual", Some("r1"), now()),
            RevokeEffect::Revoked
        );
        assert_eq!(
            revoke_session(&mut s, CAUSE_AGENT_DEACTIVATED, None, now()),
            RevokeEffect::AlsoCovered
        );
        assert_eq!(
            s.status
                .as_ref()
                .unwrap()
                .revocation
                .as_ref()
                .unwrap()
                .cause,
            "manual"
        );
        assert_eq!(s.phase(), SessionPhase::Revoked);
        assert!(!counts_as_active(&s, now()));
        // Withdrawing r1 leaves the deactivation's cover: restoring changes nothing.
        assert_eq!(
            crate::locks::uncover(&mut s, "r1"),
            crate::locks::Uncovered::StillRevoked
        );
        crate::locks::restore(&mut s);
        assert_eq!(s.phase(), SessionPhase::Revoked);
        assert!(!counts_as_active(&s, now()));
    }

    fn mk_session(phase: SessionPhase, expires_in_s: i64) -> AccessSession {
        let mut s = AccessSession {
            spec: mk_spec(None, &["payments"], 0),
            ..Default::default()
        };
        s.spec.expires_at = Some(Time(now() + SignedDuration::from_secs(expires_in_s)));
        s.metadata.generation = Some(1);
        s.status = Some(AccessSessionStatus {
            phase,
            ..Default::default()
        });
        s
    }

    #[test]
    fn expiry_is_due_at_expires_at_not_before() {
        let s = mk_session(SessionPhase::Active, 3);
        assert!(!due_for_expiry(&s, now()));
        assert!(!due_for_expiry(
            &s,
            now() + SignedDuration::from_millis(2999)
        ));
        assert!(due_for_expiry(&s, now() + SignedDuration::from_secs(3)));
        assert!(due_for_expiry(&s, now() + SignedDuration::from_secs(60)));
    }

    #[test]
    fn active_and_pending_sessions_expire_revoked_and_expired_ones_do_not() {
        let later = now() + SignedDuration::from_secs(10);
        for phase in [SessionPhase::Active, SessionPhase::PendingEnrollment] {
            let mut s = mk_session(phase, 3);
            assert!(expire_session(&mut s, later), "{phase:?}");
            let status = s.status.as_ref().unwrap();
            assert_eq!(status.phase, SessionPhase::Expired);
            let c = &status.conditions[0];
            assert_eq!(
                (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
                ("Expired", "True", "ExpiresAtReached")
            );
            assert_eq!(c.last_transition_time.0, later);
            // Expiring twice changes nothing (a second replica finds nothing to do).
            let once = s.clone();
            assert!(!expire_session(&mut s, later));
            assert_eq!(s, once);
        }
        let mut revoked = mk_session(SessionPhase::Active, 3);
        revoke_session(&mut revoked, "manual", Some("r1"), now());
        let before = revoked.clone();
        assert!(!expire_session(&mut revoked, later));
        assert_eq!(revoked, before, "a revoked session stays Revoked");
        let mut no_expiry = mk_session(SessionPhase::Active, 3);
        no_expiry.spec.expires_at = None;
        assert!(!expire_session(&mut no_expiry, later));
    }

    #[test]
    fn transitions_are_derived_from_before_and_after() {
        let later = now() + SignedDuration::from_secs(10);
        let active = mk_session(SessionPhase::Active, 3);
        let mut expired = active.clone();
        expire_session(&mut expired, later);
        assert_eq!(
            session_transition(&active, &expired),
            Some(SessionTransition::Expired {
                expires_at: now() + SignedDuration::from_secs(3)
            })
        );
        let mut revoked = active.clone();
        revoke_session(&mut revoked, "compromised", Some("r1"), now());
        let t = session_transition(&active, &revoked).unwrap();
        assert_eq!(
            t,
            SessionTransition::Revoked {
                cause: "compromised".into(),
                revocation: Some("r1".into())
            }
        );
        assert_eq!(t.reason(), "Revoked");
        assert!(t.note().contains("compromised"), "{}", t.note());
        // A second revocation covering it is no new transition.
        let mut again = revoked.clone();
        revoke_session(&mut again, "manual", Some("r2"), now());
        assert_eq!(session_transition(&revoked, &again), None);
        let pending = mk_session(SessionPhase::PendingEnrollment, 3);
        assert_eq!(
            session_transition(&pending, &active),
            Some(SessionTransition::EnrollmentCompleted)
        );
        assert_eq!(session_transition(&active, &active), None);
    }

    #[test]
    fn ttl_clamp_is_reported_only_when_clamped() {
        let requested = mk_spec(None, &["payments"], 48);
        let ctx = ctx(None, 0);
        let admitted = admit_session(&requested, &ctx).unwrap();
        let t = ttl_clamped(&requested, &admitted.spec).unwrap();
        assert_eq!(t.reason(), "TTLClamped");
        assert!(t.is_warning());
        let short = mk_spec(None, &["payments"], 1);
        let admitted = admit_session(&short, &ctx).unwrap();
        assert_eq!(ttl_clamped(&short, &admitted.spec), None);
    }

    use crate::validation::FieldErrorKind;

    fn tools(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|t| t.to_string()).collect())
    }

    #[test]
    fn tool_lists_are_validated() {
        let mut spec = mk_spec(None, &["payments"], 1);
        spec.tools = tools(&["search", "issues_*", "*"]);
        assert!(validate_session_spec(&spec).is_empty());
        for (bad, kind) in [
            ("", FieldErrorKind::Required),
            ("a*b", FieldErrorKind::Invalid),
            ("**", FieldErrorKind::Invalid),
            ("has space", FieldErrorKind::Invalid),
            ("tab\t", FieldErrorKind::Invalid),
        ] {
            spec.tools = tools(&["ok", bad]);
            let errors = validate_session_spec(&spec);
            assert_eq!(errors.len(), 1, "{bad:?}: {errors:?}");
            assert_eq!(errors[0].kind, kind, "{bad:?}");
            assert_eq!(errors[0].field, "spec.tools[1]");
        }
        spec.tools = tools(&["x", "x"]);
        assert_eq!(
            validate_session_spec(&spec)[0].kind,
            FieldErrorKind::Duplicate
        );
        spec.tools = Some(vec!["t".repeat(129)]);
        assert_eq!(
            validate_session_spec(&spec)[0].kind,
            FieldErrorKind::TooLong
        );
        spec.tools = Some((0..257).map(|i| format!("t{i}")).collect());
        assert_eq!(
            validate_session_spec(&spec)[0].kind,
            FieldErrorKind::TooMany
        );
        // An empty list is valid: no tool at all.
        spec.tools = Some(vec![]);
        assert!(validate_session_spec(&spec).is_empty());
    }

    #[test]
    fn tools_are_granted_by_name_or_prefix() {
        let list = tools(&["search", "issues_*"]).unwrap();
        let indexed = ToolGrant::new(Some(&list));
        for t in ["search", "issues_close", "issues_", "search2", "issue", ""] {
            assert_eq!(indexed.allows(t), tool_granted(Some(&list), t), "{t}");
        }
        assert!(ToolGrant::new(None).allows("anything"));
        assert!(!ToolGrant::new(Some(&[])).allows("search"));
        assert!(tool_granted(None, "anything"));
        assert!(tool_granted(Some(&list), "search"));
        assert!(tool_granted(Some(&list), "issues_close"));
        assert!(tool_granted(Some(&list), "issues_"));
        assert!(!tool_granted(Some(&list), "search2"));
        assert!(!tool_granted(Some(&list), "issue"));
        assert!(!tool_granted(Some(&[]), "search"));
        assert!(tool_granted(Some(&["*".to_string()]), "x"));
    }

    #[test]
    fn tools_may_only_be_narrowed() {
        let old = mk_spec(None, &["payments"], 1);
        let with = |list: Option<Vec<String>>| {
            let mut s = old.clone();
            s.tools = list;
            s
        };
        let ok = |from: Option<Vec<String>>, to: Option<Vec<String>>| {
            admit_session_update(&with(from), &with(to)).is_ok()
        };
        // Narrowing: a list where there was none, fewer entries, names a pattern covered.
        assert!(ok(None, tools(&["search"])));
        assert!(ok(tools(&["a", "b"]), tools(&["a"])));
        assert!(ok(
            tools(&["issues_*"]),
            tools(&["issues_close", "issues_open_*"])
        ));
        assert!(ok(tools(&["*"]), tools(&["x"])));
        assert!(ok(tools(&["a"]), tools(&[])));
        assert!(ok(tools(&["a"]), tools(&["a"])));
        // Widening, each refused with the entry that widens it named.
        for (from, to, named) in [
            (tools(&["a"]), None, "removing it would grant every tool"),
            (tools(&["a"]), tools(&["a", "b"]), "\"b\" is not covered"),
            (
                tools(&["issues_close"]),
                tools(&["issues_*"]),
                "\"issues_*\" is not covered",
            ),
            (tools(&[]), tools(&["a"]), "\"a\" is not covered"),
        ] {
            let Err(SessionRuleError::Invalid(errors)) =
                admit_session_update(&with(from), &with(to))
            else {
                panic!("a widening was admitted");
            };
            assert_eq!(errors[0].field, "spec.tools");
            assert!(errors[0].message.contains(named), "{}", errors[0].message);
        }
    }

    #[test]
    fn an_agents_tool_ceiling_bounds_issuance() {
        let mut agent = crate::Agent::default();
        agent.metadata.name = Some("bot".into());
        agent.metadata.uid = Some("agent-uid".into());
        agent.spec.teams = vec!["payments".into()];
        agent.spec.tools = tools(&["search", "issues_*"]);
        let ctx = IssuanceContext {
            agent: Some(&agent),
            agent_active_sessions: 0,
            server_max_ttl: SignedDuration::from_hours(24),
            server_fenced: false,
            standing_revocation: None,
            now: now(),
        };
        let mut spec = mk_spec(Some("bot"), &["payments"], 1);
        // No list: the ceiling is granted, with a warning.
        let admitted = admit_session(&spec, &ctx).unwrap();
        assert_eq!(admitted.spec.tools, tools(&["search", "issues_*"]));
        assert!(admitted.warnings.iter().any(|w| w.contains("spec.tools")));
        // Inside it: as asked.
        spec.tools = tools(&["issues_close"]);
        assert_eq!(
            admit_session(&spec, &ctx).unwrap().spec.tools,
            tools(&["issues_close"])
        );
        // Outside it: refused, naming the tool.
        spec.tools = tools(&["search", "delete_repo"]);
        let err = admit_session(&spec, &ctx).unwrap_err();
        assert_eq!(
            err,
            SessionRuleError::ToolEscalation {
                agent: "bot".into(),
                tool: "delete_repo".into()
            }
        );
        assert!(err.to_string().contains("\"delete_repo\""));
    }

    #[test]
    fn calls_per_minute_is_bounded_by_the_agent_and_only_lowered() {
        let agent = {
            let mut a = mk_agent(true, &["payments"], None, None);
            a.spec.calls_per_minute = Some(60);
            a
        };
        let ctx = ctx(Some(&agent), 0);
        let mut spec = mk_spec(Some("billing-bot"), &["payments"], 1);
        spec.agent.as_mut().unwrap().calls_per_minute = Some(1_000);
        let admitted = admit_session(&spec, &ctx).unwrap();
        assert_eq!(admitted.spec.calls_per_minute, Some(60));
        assert_eq!(
            admitted.spec.agent.as_ref().unwrap().calls_per_minute,
            Some(60),
            "the agent's limit is recorded by the server, whatever was sent"
        );
        assert!(admitted.warnings.iter().any(|w| w.contains("set to 60")));
        spec.calls_per_minute = Some(600);
        let admitted = admit_session(&spec, &ctx).unwrap();
        assert_eq!(admitted.spec.calls_per_minute, Some(60));
        assert!(admitted
            .warnings
            .iter()
            .any(|w| w.contains("clamped from 600 to 60")));
        spec.calls_per_minute = Some(10);
        let admitted = admit_session(&spec, &ctx).unwrap();
        assert_eq!(admitted.spec.calls_per_minute, Some(10));
        assert!(admitted.warnings.is_empty(), "{:?}", admitted.warnings);
        spec.calls_per_minute = Some(0);
        assert!(matches!(
            admit_session(&spec, &ctx),
            Err(SessionRuleError::Invalid(e)) if e[0].field == "spec.callsPerMinute"
        ));

        let old = AccessSessionSpec {
            calls_per_minute: Some(10),
            ..mk_spec(None, &["payments"], 1)
        };
        let lowered = AccessSessionSpec {
            calls_per_minute: Some(5),
            ..old.clone()
        };
        assert!(admit_session_update(&old, &lowered).is_ok());
        for raised in [Some(11), None] {
            let new = AccessSessionSpec {
                calls_per_minute: raised,
                ..old.clone()
            };
            assert!(admit_session_update(&old, &new).is_err(), "{raised:?}");
        }
        // A session without a limit may be given one.
        let unlimited = AccessSessionSpec {
            calls_per_minute: None,
            ..old.clone()
        };
        assert!(admit_session_update(&unlimited, &old).is_ok());
    }
}
