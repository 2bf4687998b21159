//! The decisions of retirement, pure: which fence a deleted MCPServer gets, whether a fence read
//! back from the API stands for it, which failures mean "the API is not there", and the
//! `Retiring` condition. No I/O here; `super` does the calls.

use apis::rules::CAUSE_SERVER_RETIRED;
use apis::runtime::MCPServer;
use apis::types::{Revocation, RevocationSpec, RevocationTarget, ServerRef, API_VERSION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition type this controller owns on MCPServer status.
pub const RETIRING: &str = "Retiring";

/// Why an MCPServer cannot be fenced at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFenceable {
    #[error("the MCPServer has no name")]
    NoName,
    #[error("the MCPServer has no namespace")]
    NoNamespace,
    #[error("the MCPServer has no uid")]
    NoUid,
}

/// The name of the fence of server `uid`: derived from the uid alone, so a retry (or another
/// replica) finds the fence it or a predecessor created, and a namesake (same name, new uid)
/// gets a fence of its own. Kubernetes uids are lowercase UUIDs, a valid object name.
pub fn fence_name(uid: &str) -> String {
    format!("server-retired-{}", uid.to_ascii_lowercase())
}

/// The `server_retired` Revocation that fences `server`'s uid for good, in its namespace.
pub fn desired_fence(server: &MCPServer) -> Result<Revocation, NotFenceable> {
    let meta = &server.metadata;
    let name = meta.name.as_deref().ok_or(NotFenceable::NoName)?;
    let namespace = meta.namespace.as_deref().ok_or(NotFenceable::NoNamespace)?;
    let uid = meta
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(NotFenceable::NoUid)?;
    Ok(Revocation {
        api_version: API_VERSION.to_string(),
        kind: "Revocation".to_string(),
        metadata: ObjectMeta {
            name: Some(fence_name(uid)),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [
                    (
                        "mcp-runtime.dev/managed-by".to_string(),
                        "mcp-access-controllers".to_string(),
                    ),
                    ("mcp-runtime.dev/mcpserver".to_string(), name.to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: RevocationSpec {
            target: RevocationTarget {
                server: Some(ServerRef {
                    name: name.to_string(),
                    uid: uid.to_string(),
                }),
                ..RevocationTarget::default()
            },
            cause: CAUSE_SERVER_RETIRED.to_string(),
            message: Some(format!(
                "MCPServer {namespace}/{name} (uid {uid}) was deleted: every session of that uid is revoked and no new one may be issued"
            )),
            expires_at: None,
        },
        status: None,
    })
}

/// Why a Revocation read back does not (yet) stand as the fence of a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unconfirmed {
    /// The object under the fence's name is not a `server_retired` revocation.
    #[error("revocation {name} has cause {cause:?}, not server_retired")]
    NotAFence { name: String, cause: String },
    /// The object under the fence's name fences another uid (or none).
    #[error("revocation {name} targets server uid {found:?}, not {want:?}")]
    OtherTarget {
        name: String,
        want: String,
        found: Option<String>,
    },
    /// The server has not recorded completing it.
    #[error("revocation {name} has no status.completedAt: the server has not applied it")]
    NotApplied { name: String },
    /// It applies in its namespace only: sessions of that uid in other namespaces would stay
    /// usable. The controllers' identity must be bound to the revoker role cluster-wide.
    #[error("revocation {name} is not cluster-wide (status.clusterWide is false): the controllers may not create revocations in every namespace")]
    NotClusterWide { name: String },
}

impl Unconfirmed {
    /// The condition and metric reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unconfirmed::NotAFence { .. } | Unconfirmed::OtherTarget { .. } => "FenceNameTaken",
            Unconfirmed::NotApplied { .. } => "FenceNotApplied",
            Unconfirmed::NotClusterWide { .. } => "FenceNotClusterWide",
        }
    }
}

/// Whether `revocation`, read back from the API, is the applied, cluster-wide fence of server
/// `uid`. Only then may the finalizer go.
pub fn confirm(revocation: &Revocation, uid: &str) -> Result<(), Unconfirmed> {
    let name = revocation.metadata.name.clone().unwrap_or_default();
    if revocation.spec.cause != CAUSE_SERVER_RETIRED {
        return Err(Unconfirmed::NotAFence {
            name,
            cause: revocation.spec.cause.clone(),
        });
    }
    let found = revocation
        .spec
        .target
        .server
        .as_ref()
        .map(|s| s.uid.clone());
    if found.as_deref() != Some(uid) {
        return Err(Unconfirmed::OtherTarget {
            name,
            want: uid.to_string(),
            found,
        });
    }
    let Some(status) = revocation
        .status
        .as_ref()
        .filter(|s| s.completed_at.is_some())
    else {
        return Err(Unconfirmed::NotApplied { name });
    };
    if !status.cluster_wide {
        return Err(Unconfirmed::NotClusterWide { name });
    }
    Ok(())
}

/// How a failed call to the access API is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The API is not there (APIService unavailable or removed, overloaded, a timeout, no
    /// connection): retry with backoff, the deletion waits.
    Unavailable,
    /// The API answered and refused (forbidden, invalid, a conflict other than AlreadyExists):
    /// also blocks, but retrying alone will not fix it.
    Refused,
}

/// Classifies an HTTP status code from the access API. Kube-apiserver answers 503 for an
/// APIService that is registered but unavailable and 404 for a group it does not serve (the
/// APIService is gone); both mean "not there", never "no fence needed".
pub fn classify_code(code: u16) -> Failure {
    match code {
        404 | 408 | 429 | 500..=599 => Failure::Unavailable,
        _ => Failure::Refused,
    }
}

/// Classifies any client error: a `Status` by its code, everything else (connection, TLS,
/// a body that is not a Revocation, ...) as unavailable.
pub fn classify(error: &kube::Error) -> Failure {
    match error {
        kube::Error::Api(status) => classify_code(status.code),
        _ => Failure::Unavailable,
    }
}

/// Whether a refusal says the namespace is being torn down: kube-apiserver's NamespaceLifecycle
/// and MCP Access's own check both answer 403 with this message (MCP Access sets no cause), and
/// no object may be created there any more.
pub fn namespace_terminating(code: u16, message: &str) -> bool {
    code == 403 && message.contains("because it is being terminated")
}

/// `fence` moved to `namespace`: the home of the fence of a server whose own namespace is being
/// torn down. A cluster-wide fence applies everywhere whatever namespace holds it.
pub fn rehomed(mut fence: Revocation, namespace: &str) -> Revocation {
    fence.metadata.namespace = Some(namespace.to_string());
    fence
}

/// The `Retiring` condition to write, or `None` when `current` already says the same (a
/// reconcile that changes nothing writes nothing). `lastTransitionTime` moves only when the
/// status flips.
pub fn retiring_condition(
    current: Option<&Condition>,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Condition> {
    let status = if status { "True" } else { "False" };
    if let Some(c) = current {
        if c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == generation
        {
            return None;
        }
    }
    let last_transition_time = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    Some(Condition {
        type_: RETIRING.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time,
    })
}

/// The current `Retiring` condition of `server`, if any.
pub fn current_retiring(server: &MCPServer) -> Option<&Condition> {
    server
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == RETIRING)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::MCPServerSpec;
    use apis::types::RevocationStatus;

    const UID: &str = "6f1c2b0e-8a4d-4e3b-9c51-0d2f7a9e1b34";

    fn mk_server(uid: Option<&str>) -> MCPServer {
        let mut s = MCPServer::new(
            "github",
            serde_json::from_value::<MCPServerSpec>(
                serde_json::json!({"image": "ghcr.io/x/y:1", "port": 8080}),
            )
            .unwrap(),
        );
        s.metadata.namespace = Some("team-a".into());
        s.metadata.uid = uid.map(str::to_string);
        s
    }

    fn mk_applied(uid: &str, cluster_wide: bool) -> Revocation {
        let mut r = desired_fence(&mk_server(Some(uid))).unwrap();
        r.status = Some(RevocationStatus {
            revoked_sessions: 2,
            cluster_wide,
            completed_at: Some(Time(Timestamp::UNIX_EPOCH)),
            ..RevocationStatus::default()
        });
        r
    }

    #[test]
    fn the_fence_targets_the_uid_under_a_name_from_the_uid() {
        let r = desired_fence(&mk_server(Some(UID))).unwrap();
        assert_eq!(
            r.metadata.name.as_deref(),
            Some(&*format!("server-retired-{UID}"))
        );
        assert_eq!(r.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(r.spec.cause, "server_retired");
        let server = r.spec.target.server.as_ref().unwrap();
        assert_eq!((server.name.as_str(), server.uid.as_str()), ("github", UID));
        assert!(r.spec.target.session.is_none() && r.spec.target.subject.is_none());
        // A fence never expires: the API refuses one that does.
        assert!(r.spec.expires_at.is_none());
        assert!(apis::rules::validate_revocation_spec(&r.spec).is_empty());
        assert!(apis::validation::is_dns1123_subdomain(
            r.metadata.name.as_deref().unwrap()
        ));
    }

    #[test]
    fn a_namesake_gets_another_fence() {
        let other = "0b7e1f4c-2d3a-4b5c-8d9e-1f2a3b4c5d6e";
        assert_ne!(fence_name(UID), fence_name(other));
        assert_eq!(fence_name(&UID.to_uppercase()), fence_name(UID));
    }

    #[test]
    fn a_server_without_uid_cannot_be_fenced() {
        assert_eq!(desired_fence(&mk_server(None)), Err(NotFenceable::NoUid));
        assert_eq!(
            desired_fence(&mk_server(Some(""))),
            Err(NotFenceable::NoUid)
        );
    }

    #[test]
    fn only_an_applied_cluster_wide_fence_of_this_uid_is_confirmed() {
        assert_eq!(confirm(&mk_applied(UID, true), UID), Ok(()));

        let not_applied = desired_fence(&mk_server(Some(UID))).unwrap();
        assert_eq!(
            confirm(&not_applied, UID).unwrap_err().reason(),
            "FenceNotApplied"
        );
        let mut no_completion = mk_applied(UID, true);
        no_completion.status.as_mut().unwrap().completed_at = None;
        assert_eq!(
            confirm(&no_completion, UID).unwrap_err().reason(),
            "FenceNotApplied"
        );

        assert_eq!(
            confirm(&mk_applied(UID, false), UID).unwrap_err().reason(),
            "FenceNotClusterWide"
        );

        let other = "0b7e1f4c-2d3a-4b5c-8d9e-1f2a3b4c5d6e";
        assert!(matches!(
            confirm(&mk_applied(other, true), UID),
            Err(Unconfirmed::OtherTarget { .. })
        ));

        let mut manual = mk_applied(UID, true);
        manual.spec.cause = "manual".into();
        assert!(matches!(
            confirm(&manual, UID),
            Err(Unconfirmed::NotAFence { .. })
        ));

        let mut session_target = mk_applied(UID, true);
        session_target.spec.target = RevocationTarget {
            session: Some("s".into()),
            ..RevocationTarget::default()
        };
        assert!(matches!(
            confirm(&session_target, UID),
            Err(Unconfirmed::OtherTarget { found: None, .. })
        ));
    }

    #[test]
    fn a_missing_api_is_unavailable_and_a_refusal_is_not() {
        for code in [404, 408, 429, 500, 502, 503, 504] {
            assert_eq!(classify_code(code), Failure::Unavailable, "{code}");
        }
        for code in [400, 401, 403, 409, 422] {
            assert_eq!(classify_code(code), Failure::Refused, "{code}");
        }
        let status =
            kube::core::Status::failure("service unavailable", "ServiceUnavailable").with_code(503);
        assert_eq!(
            classify(&kube::Error::Api(Box::new(status))),
            Failure::Unavailable
        );
    }

    #[test]
    fn a_terminating_namespace_is_told_from_other_refusals() {
        let msg = "unable to create new content in namespace team-a because it is being terminated";
        assert!(namespace_terminating(403, msg));
        assert!(!namespace_terminating(
            403,
            "revocations is forbidden: User cannot create"
        ));
        assert!(!namespace_terminating(409, msg));
        let moved = rehomed(desired_fence(&mk_server(Some(UID))).unwrap(), "mcp-access");
        assert_eq!(moved.metadata.namespace.as_deref(), Some("mcp-access"));
        assert_eq!(moved.metadata.name, Some(fence_name(UID)));
        assert_eq!(moved.spec.target.server.unwrap().uid, UID);
    }

    #[test]
    fn the_condition_is_written_only_when_it_changes() {
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = Timestamp::from_second(60).unwrap();
        let blocked =
            retiring_condition(None, false, "APIUnavailable", "down", Some(2), t0).unwrap();
        assert_eq!(blocked.type_, RETIRING);
        assert_eq!(blocked.status, "False");
        assert_eq!(blocked.last_transition_time, Time(t0));
        // The same again: no write.
        assert_eq!(
            retiring_condition(Some(&blocked), false, "APIUnavailable", "down", Some(2), t1),
            None
        );
        // Another reason, same status: written, the transition time kept.
        let refused =
            retiring_condition(Some(&blocked), false, "FenceRefused", "403", Some(2), t1).unwrap();
        assert_eq!(refused.last_transition_time, Time(t0));
        // Fenced: the status flips and the transition time moves.
        let fenced = retiring_condition(Some(&refused), true, "Fenced", "ok", Some(2), t1).unwrap();
        assert_eq!(fenced.status, "True");
        assert_eq!(fenced.last_transition_time, Time(t1));
    }
}
