//! A Host's access to a server is an AccessSession: one per (Host, granted server), kept by the
//! Host operator in the server's namespace (where that server's gateways watch sessions), with
//! the Host's ServiceAccount as subject and the Context's teams. The Host API hands the host a
//! token for it; every request through the gateway is decided against it, so one revocation
//! mechanism covers agents, people and hosts.
//!
//! [`plan`] is pure: from the granted servers and the Host's live sessions it says what to
//! create, what to delete and what the Host's status says. The rules:
//! - a server no longer granted (removed from the Context, retired, deleted, consent withdrawn,
//!   the Host no longer selected) loses every session of the Host: they are deleted, which cuts
//!   the host at the gateway (`session_not_found`);
//! - a revoked session is never replaced behind the operator's back: while the newest session
//!   of a server is revoked nothing new is issued (older ones are deleted), and the Host says
//!   `Ready=False` naming the Revocation until it is withdrawn. Deleting the revoked session
//!   does not withdraw it: while the Revocation the Host's status named still stands against
//!   that session (`held`), nothing is issued either;
//! - sessions expire (the apiserver clamps `expiresAt`); a successor is issued once a third of
//!   the lifetime is left, and the predecessor is deleted when it is no longer Active;
//! - a session carries its Context's teams at issuance (`teams` is immutable): when they change,
//!   a successor is issued and the old session deleted at once, so a removed team never lingers.

use std::collections::BTreeMap;

use apis::runtime::{HostSessionStatus, MCPServer};
use apis::types::{AccessSession, SessionPhase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::desired;

/// Label: the UID of the Host a session belongs to.
pub const HOST_UID_LABEL: &str = "mcp-runtime.dev/host-uid";
/// Label: the namespace of the Host a session belongs to (a session lives beside its server).
pub const HOST_NAMESPACE_LABEL: &str = "mcp-runtime.dev/host-namespace";
/// The finalizer that holds a Host until its sessions, in every namespace, are deleted.
pub const FINALIZER: &str = "mcp-runtime.dev/host-sessions";
/// The lifetime asked for; the apiserver clamps it to its `--max-session-ttl`.
pub const REQUESTED_TTL: SignedDuration = SignedDuration::from_hours(24);

/// The user a Host's sessions name: its ServiceAccount, the identity the operator gives it. A
/// Revocation with `target.subject` set to it revokes every session of the Host in that
/// namespace.
pub fn subject(host_namespace: &str, host_name: &str) -> String {
    format!(
        "system:serviceaccount:{host_namespace}:{}",
        desired::identity_name(host_name)
    )
}

/// The label selector of a Host's sessions (all namespaces).
pub fn selector(host_uid: &str) -> String {
    format!(
        "{}={},{HOST_UID_LABEL}={host_uid}",
        crate::children::MANAGED_BY_LABEL,
        crate::children::MANAGED_BY
    )
}

/// A session to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub namespace: String,
    pub server: String,
    pub server_uid: String,
}

/// A session to delete (with its uid as precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remove {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// What to do, and what the Host's status says.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub issue: Vec<Issue>,
    pub delete: Vec<Remove>,
    /// One entry per granted server, in the Context's order.
    pub status: Vec<HostSessionStatus>,
    /// When the next successor is due (the reconcile comes back then).
    pub next_roll: Option<Timestamp>,
}

impl Plan {
    /// The servers whose newest session is revoked, with the Revocation that did it.
    pub fn revoked(&self) -> Vec<&HostSessionStatus> {
        self.status
            .iter()
            .filter(|s| s.phase == SessionPhase::Revoked.as_str())
            .collect()
    }
}

fn created(s: &AccessSession) -> Timestamp {
    s.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn expires(s: &AccessSession) -> Option<Timestamp> {
    s.spec.expires_at.as_ref().map(|t| t.0)
}

/// Active and not past its expiry.
fn usable(s: &AccessSession, now: Timestamp) -> bool {
    s.phase() == SessionPhase::Active && expires(s).is_some_and(|e| e > now)
}

/// When a successor of `s` is due: a third of its lifetime before it expires.
fn roll_at(s: &AccessSession) -> Option<Timestamp> {
    let expires = expires(s)?;
    let lifetime = expires.duration_since(created(s));
    expires.checked_sub(lifetime / 3).ok()
}

fn remove(s: &AccessSession) -> Remove {
    Remove {
        namespace: s.namespace().unwrap_or_default(),
        name: s.name_any(),
        uid: s.metadata.uid.clone(),
    }
}

fn same_teams(s: &AccessSession, teams: &[String]) -> bool {
    let mut have = s.spec.teams.clone();
    let mut want = teams.to_vec();
    have.sort();
    want.sort();
    have == want
}

/// The plan for one Host. `granted` are the servers its Context grants now (after every check),
/// `teams` the Context's teams, `live` every session carrying the Host's uid label, `held` the
/// entries of the Host's status that showed a session revoked by a Revocation that still
/// stands against that session (whether or not the session still exists).
pub fn plan(
    granted: &[&MCPServer],
    teams: &[String],
    live: &[AccessSession],
    held: &[HostSessionStatus],
    now: Timestamp,
) -> Plan {
    let mut out = Plan::default();
    let mut by_server: BTreeMap<(String, String), Vec<&AccessSession>> = BTreeMap::new();
    for s in live {
        // One being deleted is gone as far as the gateways will soon know: not counted.
        if s.metadata.deletion_timestamp.is_some() {
            continue;
        }
        by_server
            .entry((s.namespace().unwrap_or_default(), s.spec.server.uid.clone()))
            .or_default()
            .push(s);
    }
    for server in granted {
        let namespace = server.namespace().unwrap_or_default();
        let uid = server.metadata.uid.clone().unwrap_or_default();
        let mut mine = by_server
            .remove(&(namespace.clone(), uid.clone()))
            .unwrap_or_default();
        mine.sort_by_key(|s| (created(s), s.name_any()));
        let newest = mine.last().copied();
        let mut entry = HostSessionStatus {
            server: server.name_any(),
            namespace: namespace.clone(),
            session: None,
            phase: "Pending".into(),
            revocation: None,
        };
        let issue = Issue {
            namespace: namespace.clone(),
            server: server.name_any(),
            server_uid: uid.clone(),
        };
        match newest {
            // Revoked: held as it is, and nothing older stays usable beside it.
            Some(n) if n.phase() == SessionPhase::Revoked => {
                entry.session = Some(n.name_any());
                entry.phase = SessionPhase::Revoked.as_str().into();
                entry.revocation = n
                    .status
                    .as_ref()
                    .and_then(|s| s.revocation.as_ref())
                    .map(|r| {
                        r.revocation_name
                            .clone()
                            .unwrap_or_else(|| format!("({})", r.cause))
                    });
                out.delete
                    .extend(mine[..mine.len() - 1].iter().map(|s| remove(s)));
            }
            Some(n) if usable(n, now) && same_teams(n, teams) => {
                entry.session = Some(n.name_any());
                entry.phase = SessionPhase::Active.as_str().into();
                let due = roll_at(n);
                if due.is_some_and(|d| d <= now) {
                    out.issue.push(issue);
                } else if let Some(due) = due {
                    out.next_roll = Some(out.next_roll.map_or(due, |t| t.min(due)));
                }
                // Predecessors go once they are no longer Active (expired, or the apiserver
                // marked them so); an Active one still serves tokens minted for it.
                out.delete.extend(
                    mine[..mine.len() - 1]
                        .iter()
                        .filter(|s| !usable(s, now))
                        .map(|s| remove(s)),
                );
            }
            Some(n) if usable(n, now) => {
                // The teams changed: a successor with the new teams, and every older session
                // goes now.
                out.issue.push(issue);
                out.delete.extend(mine.iter().map(|s| remove(s)));
                let _ = n;
            }
            // None yet, or the newest expired (or pending, which the operator never makes).
            _ => {
                out.delete.extend(mine.iter().map(|s| remove(s)));
                // The revoked session was deleted while its Revocation stands: a successor
                // would restore what the Revocation took away. Held, and said so.
                match held
                    .iter()
                    .find(|h| h.namespace == namespace && h.server == entry.server)
                {
                    Some(h) => entry = h.clone(),
                    None => out.issue.push(issue),
                }
            }
        }
        out.status.push(entry);
    }
    // Sessions of servers no longer granted: deleted, which cuts the host.
    for (_, sessions) in by_server {
        out.delete.extend(sessions.into_iter().map(remove));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::MCPServerSpec;
    use apis::types::{AccessSessionSpec, AccessSessionStatus, RevocationInfo, ServerRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn server(ns: &str, name: &str, uid: &str) -> MCPServer {
        let mut s = MCPServer::new(
            name,
            serde_json::from_value::<MCPServerSpec>(serde_json::json!({"image": "i", "port": 1}))
                .unwrap(),
        );
        s.metadata.namespace = Some(ns.into());
        s.metadata.uid = Some(uid.into());
        s
    }

    fn at(hours: i64) -> Timestamp {
        Timestamp::UNIX_EPOCH + SignedDuration::from_hours(1000 + hours)
    }

    fn session(
        ns: &str,
        name: &str,
        server_uid: &str,
        created: i64,
        expires: i64,
        phase: SessionPhase,
        teams: &[&str],
    ) -> AccessSession {
        let mut s = AccessSession {
            spec: AccessSessionSpec {
                server: ServerRef {
                    name: "srv".into(),
                    uid: server_uid.into(),
                },
                teams: teams.iter().map(|t| t.to_string()).collect(),
                expires_at: Some(Time(at(expires))),
                ..Default::default()
            },
            status: Some(AccessSessionStatus {
                phase,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.creation_timestamp = Some(Time(at(created)));
        if phase == SessionPhase::Revoked {
            s.status.as_mut().unwrap().revocation = Some(RevocationInfo {
                revoked_at: Time(at(created)),
                cause: "compromised".into(),
                revocation_name: Some("cut-host".into()),
                covered_by: vec![],
            });
        }
        s
    }

    fn names(removes: &[Remove]) -> Vec<&str> {
        removes.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn a_granted_server_without_a_session_gets_one() {
        let github = server("tools", "github", "g1");
        let p = plan(&[&github], &[], &[], &[], at(0));
        assert_eq!(
            p.issue,
            [Issue {
                namespace: "tools".into(),
                server: "github".into(),
                server_uid: "g1".into()
            }]
        );
        assert!(p.delete.is_empty());
        assert_eq!(p.status[0].phase, "Pending");
    }

    #[test]
    fn a_current_session_is_kept_and_rolled_before_it_expires() {
        let github = server("tools", "github", "g1");
        let live = [session(
            "tools",
            "a",
            "g1",
            0,
            24,
            SessionPhase::Active,
            &[],
        )];
        let p = plan(&[&github], &[], &live, &[], at(1));
        assert!(p.issue.is_empty() && p.delete.is_empty(), "{p:?}");
        assert_eq!(p.status[0].session.as_deref(), Some("a"));
        assert_eq!(p.status[0].phase, "Active");
        assert_eq!(p.next_roll, Some(at(16)), "a third of 24h before expiry");
        // Past the roll time: a successor; the current one stays while Active.
        let p = plan(&[&github], &[], &live, &[], at(17));
        assert_eq!(p.issue.len(), 1);
        assert!(p.delete.is_empty());
        // The successor exists: the predecessor goes once it is no longer Active.
        let live = [
            session("tools", "a", "g1", 0, 24, SessionPhase::Active, &[]),
            session("tools", "b", "g1", 17, 41, SessionPhase::Active, &[]),
        ];
        let p = plan(&[&github], &[], &live, &[], at(18));
        assert!(p.issue.is_empty() && p.delete.is_empty());
        assert_eq!(p.status[0].session.as_deref(), Some("b"));
        let p = plan(&[&github], &[], &live, &[], at(25));
        assert_eq!(names(&p.delete), ["a"]);
    }

    #[test]
    fn an_expired_session_is_replaced() {
        let github = server("tools", "github", "g1");
        let live = [session(
            "tools",
            "a",
            "g1",
            0,
            24,
            SessionPhase::Expired,
            &[],
        )];
        let p = plan(&[&github], &[], &live, &[], at(25));
        assert_eq!(p.issue.len(), 1);
        assert_eq!(names(&p.delete), ["a"]);
    }

    #[test]
    fn a_revoked_session_is_never_replaced() {
        let github = server("tools", "github", "g1");
        let live = [
            session("tools", "a", "g1", 0, 24, SessionPhase::Active, &[]),
            session("tools", "b", "g1", 17, 41, SessionPhase::Revoked, &[]),
        ];
        let p = plan(&[&github], &[], &live, &[], at(18));
        assert!(p.issue.is_empty(), "{p:?}");
        assert_eq!(
            names(&p.delete),
            ["a"],
            "nothing older stays usable beside it"
        );
        assert_eq!(p.status[0].phase, "Revoked");
        assert_eq!(p.status[0].revocation.as_deref(), Some("cut-host"));
        assert_eq!(p.revoked().len(), 1);
        // Still revoked long after it would have expired: still held.
        let live = [session(
            "tools",
            "b",
            "g1",
            17,
            41,
            SessionPhase::Revoked,
            &[],
        )];
        assert!(plan(&[&github], &[], &live, &[], at(100)).issue.is_empty());
    }

    #[test]
    fn a_deleted_revoked_session_is_not_replaced_while_its_revocation_stands() {
        let github = server("tools", "github", "g1");
        let jira = server("tools", "jira", "j1");
        let shown = p_status("github", Some("b"), "Revoked", Some("cut-host"));
        // The revoked session is gone (deleted by someone who may), the Revocation stands: no
        // successor, the entry stays as the status showed it; an expired leftover still goes.
        let live = [session(
            "tools",
            "a",
            "g1",
            0,
            24,
            SessionPhase::Active,
            &[],
        )];
        let p = plan(
            &[&github, &jira],
            &[],
            &live,
            std::slice::from_ref(&shown),
            at(30),
        );
        assert_eq!(
            p.issue
                .iter()
                .map(|i| i.server.as_str())
                .collect::<Vec<_>>(),
            ["jira"],
            "only the server nothing holds"
        );
        assert_eq!(names(&p.delete), ["a"]);
        assert_eq!(p.status[0], shown);
        assert_eq!(p.revoked().len(), 1);
        // Nothing held (the Revocation withdrawn): a successor is issued.
        let p = plan(&[&github], &[], &[], &[], at(30));
        assert_eq!(p.issue.len(), 1);
        assert_eq!(p.status[0].phase, "Pending");
        // Held applies only to its own server and namespace.
        let other = HostSessionStatus {
            namespace: "elsewhere".into(),
            ..shown
        };
        assert_eq!(plan(&[&github], &[], &[], &[other], at(30)).issue.len(), 1);
    }

    fn p_status(
        server: &str,
        session: Option<&str>,
        phase: &str,
        revocation: Option<&str>,
    ) -> HostSessionStatus {
        HostSessionStatus {
            server: server.into(),
            namespace: "tools".into(),
            session: session.map(Into::into),
            phase: phase.into(),
            revocation: revocation.map(Into::into),
        }
    }

    #[test]
    fn sessions_of_servers_no_longer_granted_are_deleted() {
        let github = server("tools", "github", "g1");
        let live = [
            session("tools", "a", "g1", 0, 24, SessionPhase::Active, &[]),
            session("tools", "j", "j1", 0, 24, SessionPhase::Active, &[]),
            // Same server name re-created: another uid, another server.
            session("tools", "old", "g0", 0, 24, SessionPhase::Active, &[]),
            // A revoked one of an ungranted server goes too.
            session("other", "r", "g1", 0, 24, SessionPhase::Revoked, &[]),
        ];
        let p = plan(&[&github], &[], &live, &[], at(1));
        let mut gone = names(&p.delete);
        gone.sort();
        assert_eq!(gone, ["j", "old", "r"]);
        assert!(p.issue.is_empty());
        let p = plan(&[], &[], &live, &[], at(1));
        assert_eq!(p.delete.len(), 4);
        assert!(p.status.is_empty());
    }

    #[test]
    fn changed_teams_replace_the_session_at_once() {
        let github = server("tools", "github", "g1");
        let live = [session(
            "tools",
            "a",
            "g1",
            0,
            24,
            SessionPhase::Active,
            &["payments", "ops"],
        )];
        let same = ["ops".to_string(), "payments".to_string()];
        assert!(plan(&[&github], &same, &live, &[], at(1)).issue.is_empty());
        let fewer = ["ops".to_string()];
        let p = plan(&[&github], &fewer, &live, &[], at(1));
        assert_eq!(p.issue.len(), 1);
        assert_eq!(names(&p.delete), ["a"]);
    }

    #[test]
    fn the_subject_is_the_hosts_service_account() {
        assert_eq!(
            subject("team-a", "dev"),
            "system:serviceaccount:team-a:dev-host"
        );
    }
}
