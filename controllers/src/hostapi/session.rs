//! Which of a Host's AccessSessions for one server the Host API hands out. Pure: the sessions
//! come from the cache, the clock is passed in.
//!
//! The controllers keep one session per (Host, granted server) in the server's namespace; a
//! replaced one may linger a while, so the newest decides:
//! - the newest is `Revoked`: the host is refused (409) until someone lifts the revocation or
//!   the controllers issue a new one;
//! - else the newest usable one (`Active`, `spec.expiresAt` in the future) is handed out;
//! - else (none yet, only expired or pending ones) the host waits for the controllers (503).

use std::cmp::Ordering;

use apis::types::{AccessSession, SessionPhase};
use k8s_openapi::jiff::Timestamp;

/// What the sessions of one (Host, server) say.
#[derive(Debug, PartialEq)]
pub enum Choice<'a> {
    /// The session to mint a token of.
    Usable(&'a AccessSession),
    /// The newest session is revoked.
    Revoked(&'a AccessSession),
    /// Nothing usable yet; the newest session, if any.
    Pending(Option<&'a AccessSession>),
}

/// The phase `session` is in at `now`: `Active` past its `expiresAt` is `Expired`.
pub fn effective_phase(session: &AccessSession, now: Timestamp) -> SessionPhase {
    let phase = session.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let expired = session.spec.expires_at.as_ref().is_none_or(|t| t.0 <= now);
    match phase {
        SessionPhase::Active if expired => SessionPhase::Expired,
        other => other,
    }
}

/// Newest first: by creation time, then by name (names are never reused).
fn newest_first(a: &AccessSession, b: &AccessSession) -> Ordering {
    let created = |s: &AccessSession| s.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(b)
        .cmp(&created(a))
        .then_with(|| b.metadata.name.cmp(&a.metadata.name))
}

/// The choice among `sessions` (any sessions: only those of `server_uid` count).
pub fn choose<'a>(
    sessions: impl IntoIterator<Item = &'a AccessSession>,
    server_uid: &str,
    now: Timestamp,
) -> Choice<'a> {
    let mut mine: Vec<&AccessSession> = sessions
        .into_iter()
        .filter(|s| s.spec.server.uid == server_uid && !server_uid.is_empty())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    mine.sort_by(|a, b| newest_first(a, b));
    let Some(newest) = mine.first().copied() else {
        return Choice::Pending(None);
    };
    if effective_phase(newest, now) == SessionPhase::Revoked {
        return Choice::Revoked(newest);
    }
    mine.into_iter()
        .find(|s| effective_phase(s, now) == SessionPhase::Active)
        .map_or(Choice::Pending(Some(newest)), Choice::Usable)
}

/// The name of the Revocation that revoked `session`, if it says.
pub fn revocation_name(session: &AccessSession) -> Option<&str> {
    session
        .status
        .as_ref()
        .and_then(|s| s.revocation.as_ref())
        .and_then(|r| r.revocation_name.as_deref())
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use apis::types::{AccessSessionSpec, AccessSessionStatus, RevocationInfo, ServerRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    pub const T0: i64 = 1_800_000_000;

    pub fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    /// A session `name` of server `server_uid` created at `T0 + created`, expiring at
    /// `T0 + expires`, in `phase`.
    pub fn mk_session(
        name: &str,
        server_uid: &str,
        created: i64,
        expires: i64,
        phase: SessionPhase,
    ) -> AccessSession {
        let mut s = AccessSession {
            spec: AccessSessionSpec {
                server: ServerRef {
                    name: "github".into(),
                    uid: server_uid.into(),
                },
                expires_at: Some(Time(at(T0 + expires))),
                ..Default::default()
            },
            status: Some(AccessSessionStatus {
                phase,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.metadata.name = Some(name.into());
        s.metadata.creation_timestamp = Some(Time(at(T0 + created)));
        if phase == SessionPhase::Revoked {
            s.status.as_mut().unwrap().revocation = Some(RevocationInfo {
                revoked_at: Time(at(T0 + created + 1)),
                cause: "manual".into(),
                revocation_name: Some(format!("revoke-{name}")),
                covered_by: vec![],
            });
        }
        s
    }

    #[test]
    fn the_newest_usable_session_is_handed_out() {
        use SessionPhase::*;
        let now = at(T0 + 100);
        let old = mk_session("old", "srv", 0, 1000, Active);
        let new = mk_session("new", "srv", 50, 1000, Active);
        let other_server = mk_session("other", "srv-2", 90, 1000, Active);
        assert_eq!(
            choose([&old, &new, &other_server], "srv", now),
            Choice::Usable(&new)
        );
        // A newer expired (or pending) one does not hide an older usable one.
        let expired = mk_session("expired", "srv", 80, 99, Active);
        let pending = mk_session("pending", "srv", 85, 1000, PendingEnrollment);
        assert_eq!(
            choose([&old, &expired, &pending], "srv", now),
            Choice::Usable(&old)
        );
        assert_eq!(effective_phase(&expired, now), Expired);
        // Expiry is exact: at expiresAt the session is no longer usable.
        let edge = mk_session("edge", "srv", 0, 100, Active);
        assert_eq!(choose([&edge], "srv", now), Choice::Pending(Some(&edge)));
    }

    #[test]
    fn a_revoked_newest_session_refuses_and_none_is_pending() {
        use SessionPhase::*;
        let now = at(T0 + 100);
        let old = mk_session("old", "srv", 0, 1000, Active);
        let revoked = mk_session("revoked", "srv", 50, 1000, Revoked);
        assert_eq!(
            choose([&old, &revoked], "srv", now),
            Choice::Revoked(&revoked)
        );
        assert_eq!(revocation_name(&revoked), Some("revoke-revoked"));
        assert_eq!(revocation_name(&old), None);
        // An older revoked one is history once a newer usable one exists.
        let newer = mk_session("newer", "srv", 60, 1000, Active);
        assert_eq!(
            choose([&old, &revoked, &newer], "srv", now),
            Choice::Usable(&newer)
        );
        assert_eq!(choose([], "srv", now), Choice::Pending(None));
        assert_eq!(choose([&old], "srv-2", now), Choice::Pending(None));
        // A session without a server uid never matches an empty one.
        let blank = mk_session("blank", "", 0, 1000, Active);
        assert_eq!(choose([&blank], "", now), Choice::Pending(None));
        let gone = mk_session("gone", "srv", 10, 20, Expired);
        assert_eq!(choose([&gone], "srv", now), Choice::Pending(Some(&gone)));
        // Same second: the name decides, so the answer does not depend on cache order.
        let a = mk_session("a", "srv", 5, 1000, Active);
        let b = mk_session("b", "srv", 5, 1000, Active);
        assert_eq!(choose([&a, &b], "srv", now), Choice::Usable(&b));
        assert_eq!(choose([&b, &a], "srv", now), Choice::Usable(&b));
    }
}
