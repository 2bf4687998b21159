//! The conditions of a Host: a pure function of what the reconcile observed.

use apis::runtime::HostStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::mcpserver::status::ImageCheck;
pub use crate::mcpserver::status::{IMAGE_ALLOWED, NAME_CONFLICT};

pub const READY: &str = "Ready";
pub const SECRET_RESOLVED: &str = "SecretResolved";
pub const CONTEXT_RESOLVED: &str = "ContextResolved";
/// `Ready=False` reason: kube-apiserver refused a child (invalid, forbidden).
pub const APPLY_REFUSED: &str = "ApplyRefused";
pub const SESSIONS_READY: &str = "SessionsReady";
pub const RUNTIME_TOKEN_READY: &str = "RuntimeTokenReady";

/// The Host's runtime token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeToken {
    /// The operator has no signing key.
    NotConfigured,
    /// A token in place, valid until then.
    Current(k8s_openapi::jiff::Timestamp),
    /// Minting failed (said in the condition; the Host is not Ready).
    Failed(String),
}
/// `Ready=False` reason (and Warning Event): a session of the Host is revoked.
pub const SESSION_REVOKED: &str = "SessionRevoked";
pub const OWNED: [&str; 6] = [
    READY,
    SECRET_RESOLVED,
    IMAGE_ALLOWED,
    CONTEXT_RESOLVED,
    SESSIONS_READY,
    RUNTIME_TOKEN_READY,
];

/// What keeping the Host's sessions found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionsObserved {
    /// Servers with a usable session.
    pub issued: usize,
    /// Revoked sessions, each described (`session ... revoked by Revocation ...`).
    pub revoked: Vec<String>,
    /// Issuances the aggregated API refused (`namespace/server: message`).
    pub refused: Vec<String>,
}

/// What a reconcile observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `spec.secretRef`: `None` when not set, else the name and whether it exists.
    pub secret: Option<(String, bool)>,
    /// The image against the allow-list (the one MCPServers have).
    pub image: ImageCheck,
    /// Children (`Kind name`) whose names are held by objects that are not this Host's.
    pub conflicts: Vec<String>,
    /// Children kube-apiserver refused (`Kind name: its message`).
    pub refused: Vec<String>,
    /// The Context's name and whether it exists.
    pub context: (String, bool),
    /// Whether the Context's `hostSelector` admits the Host (true when there is no Context).
    pub selected: bool,
    /// The runtime token.
    pub runtime_token: RuntimeToken,
    /// Servers the Context grants that exist and are enabled (routes opened).
    pub servers: usize,
    /// The Deployment exists and its controller observed its current generation.
    pub workload_observed: bool,
    /// The Host's AccessSessions.
    pub sessions: SessionsObserved,
}

impl Observed {
    pub fn secret_resolved(&self) -> bool {
        self.secret.as_ref().is_none_or(|(_, found)| *found)
    }
    pub fn context_resolved(&self) -> bool {
        self.context.1
    }
}

/// The wanted conditions; a condition whose status is unchanged keeps its transition time.
pub fn conditions(
    previous: Option<&HostStatus>,
    generation: Option<i64>,
    observed: &Observed,
    now: Time,
) -> Vec<Condition> {
    let secret = match &observed.secret {
        None => (
            true,
            "NoSecretReferenced",
            "spec.secretRef is not set".to_string(),
        ),
        Some((name, true)) => (true, "SecretFound", format!("Secret {name} exists")),
        Some((name, false)) => (
            false,
            "SecretNotFound",
            format!("Secret {name} not found: the workload is not deployed"),
        ),
    };
    let image = observed.image.condition();
    let (ctx_name, ctx_found) = &observed.context;
    let context = if *ctx_found && !observed.selected {
        (
            false,
            "HostNotSelected",
            format!(
                "Context {ctx_name}'s hostSelector does not select this Host's labels: no \
                 server is reachable"
            ),
        )
    } else if *ctx_found {
        (
            true,
            "ContextFound",
            format!(
                "Context {ctx_name} grants {} existing server(s)",
                observed.servers
            ),
        )
    } else {
        (
            false,
            "ContextNotFound",
            format!("Context {ctx_name} not found: no server is reachable"),
        )
    };
    let sessions = &observed.sessions;
    let sessions_cond = if !sessions.revoked.is_empty() {
        (false, SESSION_REVOKED, revoked_message(&sessions.revoked))
    } else if !sessions.refused.is_empty() {
        (
            false,
            "SessionRefused",
            format!(
                "the aggregated API refused to issue: {}; retried every 30s",
                sessions.refused.join("; ")
            ),
        )
    } else {
        (
            true,
            "SessionsIssued",
            format!("{} server(s) with a usable session", sessions.issued),
        )
    };
    let token = match &observed.runtime_token {
        RuntimeToken::NotConfigured => (
            false,
            "SigningKeyNotConfigured",
            "the operator has no --host-runtime-token-key-file: the host gets no runtime token"
                .to_string(),
        ),
        RuntimeToken::Current(expires) => (
            true,
            "TokenCurrent",
            format!("the runtime-token Secret holds a token valid until {expires}"),
        ),
        RuntimeToken::Failed(why) => (false, "TokenNotMinted", why.clone()),
    };
    let ready = if !observed.conflicts.is_empty() {
        (
            false,
            NAME_CONFLICT,
            crate::children::conflict_message("Host", &observed.conflicts),
        )
    } else if !observed.refused.is_empty() {
        (false, APPLY_REFUSED, refused_message(&observed.refused))
    } else if !secret.0 {
        (false, "SecretNotFound", secret.2.clone())
    } else if !observed.image.deployable() {
        (false, "ImageNotAllowed", image.2.clone())
    } else if !context.0 {
        (false, context.1, context.2.clone())
    } else if !sessions_cond.0 {
        (false, sessions_cond.1, sessions_cond.2.clone())
    } else if matches!(observed.runtime_token, RuntimeToken::Failed(_)) {
        (false, token.1, token.2.clone())
    } else if !observed.workload_observed {
        (
            false,
            "Progressing",
            "the Deployment is not observed yet".to_string(),
        )
    } else {
        (true, "Deployed", "the host runtime is applied".to_string())
    };
    [
        (READY, ready),
        (SECRET_RESOLVED, secret),
        (IMAGE_ALLOWED, image),
        (CONTEXT_RESOLVED, context),
        (SESSIONS_READY, sessions_cond),
        (RUNTIME_TOKEN_READY, token),
    ]
    .into_iter()
    .map(|(type_, (ok, reason, message))| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    })
    .collect()
}

/// The message of `SessionRevoked`: each revoked session and how to restore it.
pub fn revoked_message(revoked: &[String]) -> String {
    format!(
        "{}: not replaced while revoked; withdraw the Revocation (kubectl delete revocation) to \
         restore",
        revoked.join("; ")
    )
}

/// The message of `Ready=False ApplyRefused`.
pub fn refused_message(refused: &[String]) -> String {
    format!(
        "kube-apiserver refused {}; retried every 30s",
        refused.join("; ")
    )
}

/// Whether `previous` already holds `wanted` for `generation` (then no status write).
pub fn current(
    previous: Option<&HostStatus>,
    generation: Option<i64>,
    wanted: &[Condition],
) -> bool {
    previous.is_some_and(|p| {
        p.observed_generation == generation
            && wanted.iter().all(|w| p.conditions.iter().any(|c| c == w))
    })
}

/// The reason of `Ready` in `previous`, if any.
pub fn ready_reason(previous: Option<&HostStatus>) -> Option<&str> {
    crate::mcpserver::status::reason_of(&previous?.conditions, READY)
}

/// The status of `type_` in `previous`, if any.
pub fn condition_status<'a>(previous: Option<&'a HostStatus>, type_: &str) -> Option<&'a str> {
    crate::mcpserver::status::status_of(&previous?.conditions, type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn observed(secret: Option<bool>, context: bool, deployed: bool) -> Observed {
        Observed {
            secret: secret.map(|f| ("env".to_string(), f)),
            image: ImageCheck::NoAllowList,
            conflicts: Vec::new(),
            refused: Vec::new(),
            context: ("dev".into(), context),
            selected: true,
            runtime_token: RuntimeToken::Current(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            servers: 2,
            workload_observed: deployed,
            sessions: SessionsObserved {
                issued: 2,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_revoked_session_keeps_the_host_not_ready_naming_the_revocation() {
        let mut o = observed(Some(true), true, true);
        o.sessions.revoked = vec![
            "session tools/dev-github-1a2b for server github revoked by Revocation cut".into(),
        ];
        let c = conditions(None, Some(1), &o, t(10));
        let ready = get(&c, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", SESSION_REVOKED)
        );
        assert!(
            ready.message.contains("Revocation cut"),
            "{}",
            ready.message
        );
        assert_eq!(get(&c, SESSIONS_READY).status, "False");
        o.sessions.revoked.clear();
        o.sessions.refused = vec!["tools/github: server uid is fenced".into()];
        let c = conditions(None, Some(1), &o, t(10));
        assert_eq!(get(&c, READY).reason, "SessionRefused");
    }

    #[test]
    fn a_host_its_context_does_not_select_is_not_ready() {
        let mut o = observed(Some(true), true, true);
        o.selected = false;
        let c = conditions(None, Some(1), &o, t(10));
        assert_eq!(get(&c, CONTEXT_RESOLVED).reason, "HostNotSelected");
        assert_eq!(get(&c, READY).reason, "HostNotSelected");
    }

    fn get<'a>(c: &'a [Condition], type_: &str) -> &'a Condition {
        c.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn missing_secret_or_context_is_not_ready() {
        let c = conditions(None, Some(3), &observed(Some(false), true, false), t(10));
        assert_eq!(get(&c, SECRET_RESOLVED).status, "False");
        assert_eq!(get(&c, SECRET_RESOLVED).reason, "SecretNotFound");
        assert_eq!(get(&c, READY).status, "False");
        assert_eq!(get(&c, READY).observed_generation, Some(3));
        let c = conditions(None, Some(3), &observed(None, false, true), t(10));
        assert_eq!(get(&c, SECRET_RESOLVED).status, "True");
        assert_eq!(get(&c, CONTEXT_RESOLVED).reason, "ContextNotFound");
        assert_eq!(get(&c, READY).status, "False");
        let c = conditions(None, Some(3), &observed(Some(true), true, true), t(10));
        assert!(c.iter().all(|c| c.status == "True"), "{c:?}");
    }

    #[test]
    fn a_refused_image_is_not_ready_and_an_audited_one_is() {
        use crate::mcpserver::status::{ImagePolicy, ImagePolicyMode};
        let policy = |mode| ImagePolicy {
            prefixes: vec!["ghcr.io/acme".into()],
            mode,
        };
        let mut o = observed(Some(true), true, true);
        o.image = policy(ImagePolicyMode::Enforce).check("evil.example/agent:1");
        let c = conditions(None, Some(2), &o, t(10));
        assert_eq!(get(&c, IMAGE_ALLOWED).status, "False");
        assert_eq!(get(&c, IMAGE_ALLOWED).reason, "ImageNotAllowed");
        assert_eq!(get(&c, READY).status, "False");
        assert_eq!(get(&c, READY).reason, "ImageNotAllowed");
        o.image = policy(ImagePolicyMode::Audit).check("evil.example/agent:1");
        let c = conditions(None, Some(2), &o, t(10));
        assert_eq!(get(&c, IMAGE_ALLOWED).status, "False");
        assert_eq!(get(&c, READY).status, "True", "audit mode deploys: {c:?}");
        o.image = policy(ImagePolicyMode::Enforce).check("ghcr.io/acme/agent:1");
        let c = conditions(None, Some(2), &o, t(10));
        assert_eq!(get(&c, IMAGE_ALLOWED).reason, "ImageAllowed");
        assert!(c.iter().all(|c| c.status == "True"), "{c:?}");
    }

    #[test]
    fn a_name_held_by_another_object_is_not_ready_first() {
        let mut o = observed(Some(false), true, false);
        o.conflicts = vec!["Service agent".into(), "Role agent-host".into()];
        let c = conditions(None, Some(1), &o, t(10));
        let ready = get(&c, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", NAME_CONFLICT)
        );
        assert!(
            ready.message.contains("Service agent, Role agent-host"),
            "{}",
            ready.message
        );
        let previous = HostStatus {
            sessions: vec![],
            observed_generation: Some(1),
            conditions: c,
        };
        assert_eq!(ready_reason(Some(&previous)), Some(NAME_CONFLICT));
        assert_eq!(ready_reason(None), None);
    }

    #[test]
    fn a_refused_child_is_not_ready_and_named() {
        let mut o = observed(Some(true), true, true);
        o.refused =
            vec!["PersistentVolumeClaim agent-workspace: only dynamically provisioned pvc can be resized".into()];
        let c = conditions(None, Some(1), &o, t(10));
        let ready = get(&c, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", APPLY_REFUSED)
        );
        assert!(
            ready
                .message
                .starts_with("kube-apiserver refused PersistentVolumeClaim agent-workspace: only"),
            "{}",
            ready.message
        );
        // A name conflict is said first: it is the one to fix before anything applies.
        o.conflicts = vec!["Service agent".into()];
        let c = conditions(None, Some(1), &o, t(10));
        assert_eq!(get(&c, READY).reason, NAME_CONFLICT);
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let first = conditions(None, Some(1), &observed(Some(false), true, false), t(10));
        let previous = HostStatus {
            sessions: vec![],
            observed_generation: Some(1),
            conditions: first.clone(),
        };
        let again = conditions(
            Some(&previous),
            Some(1),
            &observed(Some(false), true, false),
            t(20),
        );
        assert_eq!(again, first);
        assert!(current(Some(&previous), Some(1), &again));
        let fixed = conditions(
            Some(&previous),
            Some(1),
            &observed(Some(true), true, true),
            t(30),
        );
        assert_eq!(get(&fixed, SECRET_RESOLVED).last_transition_time, t(30));
        assert_eq!(get(&fixed, CONTEXT_RESOLVED).last_transition_time, t(10));
        assert!(!current(Some(&previous), Some(1), &fixed));
        assert!(
            !current(Some(&previous), Some(2), &again),
            "a new generation is written"
        );
    }
}
