//! Revocations as standing locks (DESIGN, "Authority boundaries"), as pure functions.
//!
//! A Revocation revokes every session its target selects when it is created, and keeps
//! refusing new ones — issued, enrolled, completed or restored — for that target until it is
//! deleted or its `spec.expiresAt` passes. A session stays revoked while any revocation
//! covers it: withdrawing one restores only what no other revocation covers.
//!
//! A `server_retired` revocation also fences the server generation. The fence reaches no
//! further than its creator's authority: the revocation's namespace, or every namespace when
//! the creator may create revocations cluster-wide.

use k8s_openapi::jiff::Timestamp;

use crate::rules::{covering, CAUSE_SERVER_RETIRED};
use crate::types::{AccessSession, AccessSessionSpec, Revocation, RevocationSpec};
use crate::validation::FieldError;

/// The sessions a revocation (or an agent deactivation) applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SessionSelector {
    /// One session, by namespace and name.
    One { namespace: String, name: String },
    /// Every session of a server generation: in one namespace, or in all (`None`).
    Server {
        namespace: Option<String>,
        uid: String,
    },
    /// Every session of a human subject in one namespace.
    Subject { namespace: String, user: String },
    /// Every session bound to an agent uid, in every namespace.
    Agent { uid: String },
}

impl SessionSelector {
    /// Whether a session (its namespace, name and spec) is selected.
    pub fn matches(&self, namespace: &str, name: &str, spec: &AccessSessionSpec) -> bool {
        match self {
            Self::One {
                namespace: ns,
                name: n,
            } => ns == namespace && n == name,
            Self::Server { namespace: ns, uid } => {
                ns.as_deref().is_none_or(|ns| ns == namespace) && spec.server.uid == *uid
            }
            Self::Subject {
                namespace: ns,
                user,
            } => ns == namespace && spec.subject.as_ref().is_some_and(|s| s.user == *user),
            Self::Agent { uid } => spec
                .agent
                .as_ref()
                .is_some_and(|a| a.uid.as_deref() == Some(uid.as_str())),
        }
    }
}

/// How far a revoker's authority reaches, as RBAC decided it for the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokerAuthority {
    /// May create revocations in the revocation's namespace only.
    Namespace,
    /// May create revocations in every namespace (a ClusterRoleBinding).
    Cluster,
}

/// A retirement fence: no session may be issued or restored for the server uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub server_uid: String,
    pub server_name: String,
    /// The revocation's namespace; the fence applies only there unless `cluster_wide`.
    pub namespace: String,
    pub cluster_wide: bool,
}

/// What creating a revocation does, executed by storage in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationPlan {
    /// The sessions revoked now (and refused later, while the revocation stands).
    pub sessions: SessionSelector,
    pub fence: Option<Fence>,
}

/// The selector of a revocation in `namespace`. A cluster-wide fence selects the server's
/// sessions in every namespace; every other target stays in the revocation's namespace.
pub fn revocation_selector(
    namespace: &str,
    spec: &RevocationSpec,
    cluster_wide: bool,
) -> Option<SessionSelector> {
    let t = &spec.target;
    if let Some(name) = &t.session {
        return Some(SessionSelector::One {
            namespace: namespace.to_string(),
            name: name.clone(),
        });
    }
    if let Some(server) = &t.server {
        let everywhere = cluster_wide && spec.cause == CAUSE_SERVER_RETIRED;
        return Some(SessionSelector::Server {
            namespace: (!everywhere).then(|| namespace.to_string()),
            uid: server.uid.clone(),
        });
    }
    t.subject.as_ref().map(|user| SessionSelector::Subject {
        namespace: namespace.to_string(),
        user: user.clone(),
    })
}

/// Plans a new revocation in `namespace`, created by someone with `authority`, at `now`.
/// The spec's shape is checked by [`crate::rules::validate_revocation_spec`]; this checks
/// what depends on time and authority.
pub fn plan_revocation(
    namespace: &str,
    spec: &RevocationSpec,
    authority: RevokerAuthority,
    now: Timestamp,
) -> Result<RevocationPlan, Vec<FieldError>> {
    let mut errors = Vec::new();
    let fence = spec.cause == CAUSE_SERVER_RETIRED;
    if let Some(expires) = &spec.expires_at {
        if fence {
            errors.push(FieldError::forbidden(
                "spec.expiresAt",
                "a server_retired revocation fences the server generation permanently",
            ));
        } else if expires.0 <= now {
            errors.push(FieldError::invalid(
                "spec.expiresAt",
                "must be in the future",
            ));
        }
    }
    let cluster_wide = authority == RevokerAuthority::Cluster;
    let Some(sessions) = revocation_selector(namespace, spec, cluster_wide) else {
        errors.push(FieldError::required(
            "spec.target",
            "exactly one of session, server or subject is required",
        ));
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let fence = match (&spec.target.server, fence) {
        (Some(server), true) => Some(Fence {
            server_uid: server.uid.clone(),
            server_name: server.name.clone(),
            namespace: namespace.to_string(),
            cluster_wide,
        }),
        _ => None,
    };
    Ok(RevocationPlan { sessions, fence })
}

/// Whether a revocation still refuses new sessions at `now`.
pub fn stands(revocation: &Revocation, now: Timestamp) -> bool {
    revocation
        .spec
        .expires_at
        .as_ref()
        .is_none_or(|t| t.0 > now)
}

/// The first revocation among `revocations` (live objects of the session's namespace) that
/// refuses a session `name` with `spec` in `namespace` at `now`: issuing it, enrolling it,
/// completing its enrollment or restoring it is a conflict naming that revocation.
pub fn standing_revocation<'a>(
    revocations: &'a [Revocation],
    namespace: &str,
    name: &str,
    spec: &AccessSessionSpec,
    now: Timestamp,
) -> Option<&'a Revocation> {
    revocations.iter().find(|r| {
        let rev_ns = r.metadata.namespace.as_deref().unwrap_or_default();
        let cluster_wide = r.status.as_ref().is_some_and(|s| s.cluster_wide);
        stands(r, now)
            && (rev_ns == namespace || cluster_wide)
            && revocation_selector(rev_ns, &r.spec, cluster_wide)
                .is_some_and(|sel| sel.matches(namespace, name, spec))
    })
}

/// What withdrawing a revocation means for one session it may cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncovered {
    /// The revocation does not cover the session: nothing changes.
    NotCovered,
    /// Other revocations still cover the session: it stays revoked, the record shrinks.
    StillRevoked,
    /// Nothing covers the session any more: restore it if its agent and server allow.
    Restore,
}

/// Removes revocation `name` from a session's coverage and says what follows. The session
/// is changed only in its `coveredBy` list; restoring is [`restore`].
pub fn uncover(session: &mut AccessSession, name: &str) -> Uncovered {
    let Some(info) = session.status.as_mut().and_then(|s| s.revocation.as_mut()) else {
        return Uncovered::NotCovered;
    };
    let mut covered_by = covering(info);
    let before = covered_by.len();
    covered_by.retain(|c| c.revocation_name.as_deref() != Some(name));
    if covered_by.len() == before {
        return Uncovered::NotCovered;
    }
    let restore = covered_by.is_empty();
    info.covered_by = covered_by;
    if restore {
        Uncovered::Restore
    } else {
        Uncovered::StillRevoked
    }
}

/// Restores a session that [`uncover`] left uncovered; the caller has checked that its agent
/// and server are still usable.
pub fn restore(session: &mut AccessSession) {
    if let Some(status) = session.status.as_mut() {
        if status
            .revocation
            .as_ref()
            .is_some_and(|r| r.covered_by.is_empty())
        {
            crate::rules::reinstate(status);
        }
    }
}

/// A session that nothing covers any more but that cannot be restored (its agent is gone or
/// inactive, its server fenced) stays revoked, covered by that reason instead.
pub fn keep_revoked(session: &mut AccessSession, cause: &str) {
    if let Some(info) = session.status.as_mut().and_then(|s| s.revocation.as_mut()) {
        info.covered_by = vec![crate::types::CoveringRevocation {
            cause: cause.to_string(),
            revocation_name: None,
        }];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{revoke_session, RevokeEffect};
    use crate::types::{
        AgentRef, RevocationStatus, RevocationTarget, ServerRef, SessionPhase, Subject,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::SignedDuration;

    fn now() -> Timestamp {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn mk_spec(user: Option<&str>, server_uid: &str) -> AccessSessionSpec {
        AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: server_uid.into(),
            },
            subject: user.map(|u| Subject { user: u.into() }),
            agent: Some(AgentRef {
                name: "bot".into(),
                uid: Some("agent-1".into()),
                calls_per_minute: None,
            }),
            expires_at: Some(Time(now() + SignedDuration::from_hours(1))),
            ..Default::default()
        }
    }

    fn mk_session(user: &str) -> AccessSession {
        AccessSession {
            spec: mk_spec(Some(user), "srv-1"),
            ..Default::default()
        }
    }

    fn mk_revocation(ns: &str, name: &str, target: RevocationTarget, cause: &str) -> Revocation {
        let mut r = Revocation::default();
        r.metadata.namespace = Some(ns.into());
        r.metadata.name = Some(name.into());
        r.spec.target = target;
        r.spec.cause = cause.into();
        r
    }

    fn subject(user: &str) -> RevocationTarget {
        RevocationTarget {
            subject: Some(user.into()),
            ..Default::default()
        }
    }

    fn server(uid: &str) -> RevocationTarget {
        RevocationTarget {
            server: Some(ServerRef {
                name: "github".into(),
                uid: uid.into(),
            }),
            ..Default::default()
        }
    }

    fn session(name: &str) -> RevocationTarget {
        RevocationTarget {
            session: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn selectors_match_their_target_only() {
        let spec = mk_spec(Some("alice"), "srv-1");
        let one = SessionSelector::One {
            namespace: "a".into(),
            name: "s1".into(),
        };
        assert!(one.matches("a", "s1", &spec));
        assert!(!one.matches("b", "s1", &spec));
        let subject = SessionSelector::Subject {
            namespace: "a".into(),
            user: "alice".into(),
        };
        assert!(subject.matches("a", "any", &spec));
        assert!(!subject.matches("b", "any", &spec));
        assert!(!subject.matches("a", "any", &mk_spec(Some("bob"), "srv-1")));
        assert!(!subject.matches("a", "any", &mk_spec(None, "srv-1")));
        let here = SessionSelector::Server {
            namespace: Some("a".into()),
            uid: "srv-1".into(),
        };
        let everywhere = SessionSelector::Server {
            namespace: None,
            uid: "srv-1".into(),
        };
        assert!(here.matches("a", "x", &spec) && !here.matches("b", "x", &spec));
        assert!(everywhere.matches("b", "x", &spec));
        assert!(!everywhere.matches("b", "x", &mk_spec(None, "srv-2")));
        let agent = SessionSelector::Agent {
            uid: "agent-1".into(),
        };
        assert!(agent.matches("z", "x", &spec));
    }

    #[test]
    fn fences_reach_no_further_than_the_revokers_authority() {
        let mut spec = RevocationSpec {
            target: server("srv-1"),
            cause: CAUSE_SERVER_RETIRED.into(),
            ..Default::default()
        };
        let ns = plan_revocation("a", &spec, RevokerAuthority::Namespace, now()).unwrap();
        assert_eq!(
            ns.sessions,
            SessionSelector::Server {
                namespace: Some("a".into()),
                uid: "srv-1".into()
            }
        );
        assert!(!ns.fence.unwrap().cluster_wide);
        let cluster = plan_revocation("a", &spec, RevokerAuthority::Cluster, now()).unwrap();
        assert_eq!(
            cluster.sessions,
            SessionSelector::Server {
                namespace: None,
                uid: "srv-1".into()
            }
        );
        assert!(cluster.fence.unwrap().cluster_wide);
        // A manual server revocation never leaves its namespace, whoever creates it.
        spec.cause = "manual".into();
        let manual = plan_revocation("a", &spec, RevokerAuthority::Cluster, now()).unwrap();
        assert!(manual.fence.is_none());
        assert!(matches!(
            manual.sessions,
            SessionSelector::Server {
                namespace: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn expiry_must_be_future_and_fences_never_expire() {
        let mut spec = RevocationSpec {
            target: subject("alice"),
            cause: "compromised".into(),
            expires_at: Some(Time(now() - SignedDuration::from_secs(1))),
            ..Default::default()
        };
        assert!(plan_revocation("a", &spec, RevokerAuthority::Namespace, now()).is_err());
        spec.expires_at = Some(Time(now() + SignedDuration::from_hours(1)));
        assert!(plan_revocation("a", &spec, RevokerAuthority::Namespace, now()).is_ok());
        spec.target = server("srv-1");
        spec.cause = CAUSE_SERVER_RETIRED.into();
        assert!(plan_revocation("a", &spec, RevokerAuthority::Namespace, now()).is_err());
    }

    #[test]
    fn a_revocation_stands_for_later_sessions_until_it_expires() {
        let mut r = mk_revocation("a", "r1", subject("alice"), "compromised");
        let revs = [r.clone()];
        let alice = mk_spec(Some("alice"), "srv-1");
        let bob = mk_spec(Some("bob"), "srv-1");
        assert!(standing_revocation(&revs, "a", "new", &alice, now()).is_some());
        assert!(standing_revocation(&revs, "a", "new", &bob, now()).is_none());
        assert!(standing_revocation(&revs, "b", "new", &alice, now()).is_none());
        r.spec.expires_at = Some(Time(now() + SignedDuration::from_secs(60)));
        let revs = [r];
        assert!(standing_revocation(&revs, "a", "new", &alice, now()).is_some());
        let later = now() + SignedDuration::from_secs(61);
        assert!(standing_revocation(&revs, "a", "new", &alice, later).is_none());

        let one = [mk_revocation("a", "r2", session("s1"), "manual")];
        assert!(standing_revocation(&one, "a", "s1", &bob, now()).is_some());
        assert!(standing_revocation(&one, "a", "s2", &bob, now()).is_none());

        let mut fence = mk_revocation("a", "f", server("srv-1"), CAUSE_SERVER_RETIRED);
        assert!(standing_revocation(&[fence.clone()], "b", "x", &bob, now()).is_none());
        fence.status = Some(RevocationStatus {
            cluster_wide: true,
            ..Default::default()
        });
        assert!(standing_revocation(&[fence], "b", "x", &bob, now()).is_some());
    }

    #[test]
    fn withdrawing_one_revocation_never_lifts_another() {
        let mut s = mk_session("alice");
        assert_eq!(
            revoke_session(&mut s, "manual", Some("r1"), now()),
            RevokeEffect::Revoked
        );
        assert_eq!(
            revoke_session(&mut s, "compromised", Some("r2"), now()),
            RevokeEffect::AlsoCovered
        );
        assert_eq!(
            revoke_session(&mut s, "compromised", Some("r2"), now()),
            RevokeEffect::Unchanged
        );
        // The record keeps the first revocation and lists both.
        let info = s.status.as_ref().unwrap().revocation.clone().unwrap();
        assert_eq!(info.revocation_name.as_deref(), Some("r1"));
        assert_eq!(info.covered_by.len(), 2);
        // Nothing restores it while a Revocation object covers it.
        let mut held = s.clone();
        restore(&mut held);
        assert_eq!(held.phase(), SessionPhase::Revoked);

        assert_eq!(uncover(&mut s, "r1"), Uncovered::StillRevoked);
        assert_eq!(s.phase(), SessionPhase::Revoked);
        assert_eq!(uncover(&mut s, "r1"), Uncovered::NotCovered);
        assert_eq!(uncover(&mut s, "r2"), Uncovered::Restore);
        restore(&mut s);
        assert_eq!(s.phase(), SessionPhase::Active);
    }

    #[test]
    fn an_agent_deactivation_covers_for_good() {
        let mut s = mk_session("alice");
        revoke_session(&mut s, "manual", Some("r1"), now());
        revoke_session(&mut s, crate::rules::CAUSE_AGENT_DEACTIVATED, None, now());
        assert_eq!(uncover(&mut s, "r1"), Uncovered::StillRevoked);
        assert_eq!(s.phase(), SessionPhase::Revoked);
    }

    #[test]
    fn records_from_before_coverage_count_their_first_revocation() {
        let mut s = mk_session("alice");
        revoke_session(&mut s, "manual", Some("r1"), now());
        s.status
            .as_mut()
            .unwrap()
            .revocation
            .as_mut()
            .unwrap()
            .covered_by
            .clear();
        assert_eq!(uncover(&mut s, "r1"), Uncovered::Restore);
    }

    #[test]
    fn unrestorable_sessions_stay_revoked_for_their_reason() {
        let mut s = mk_session("alice");
        revoke_session(&mut s, "manual", Some("r1"), now());
        assert_eq!(uncover(&mut s, "r1"), Uncovered::Restore);
        keep_revoked(&mut s, crate::rules::CAUSE_AGENT_DEACTIVATED);
        assert_eq!(s.phase(), SessionPhase::Revoked);
        assert_eq!(uncover(&mut s, "r1"), Uncovered::NotCovered);
    }
}
