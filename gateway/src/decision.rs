//! What a gateway does with a request under a session: allow, or deny with a reason a proxy can
//! pass on. Pure: the session and the time in, the decision out.

use std::fmt;

use apis::rules::counts_as_active;
use apis::{AccessSession, SessionPhase};
use k8s_openapi::jiff::Timestamp;

/// Why a request is refused. The wire spelling ([`DenyReason::as_str`]) is the contract with
/// proxies and dashboards (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// No such session for this server (never existed, deleted, or another server's).
    SessionNotFound,
    /// The session is revoked (any covering revocation, an agent deactivation, a retirement).
    SessionRevoked,
    /// The session is past `spec.expiresAt` (or carries none).
    SessionExpired,
    /// The session waits for its enrollment to be completed; not usable yet.
    SessionPendingEnrollment,
    /// The last proof that the cache is in sync is older than the stale window.
    SyncStale,
    /// The cache has known for longer than the lag bound that it is behind the change log's
    /// head (a bookmark's head ahead of what it applied, or a 410 it is relisting after).
    SyncLagging,
    /// No complete list since start, or cached authority was dropped (401/403, 410).
    SyncNotReady,
}

impl DenyReason {
    /// The wire spelling, e.g. `session_revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionNotFound => "session_not_found",
            Self::SessionRevoked => "session_revoked",
            Self::SessionExpired => "session_expired",
            Self::SessionPendingEnrollment => "session_pending_enrollment",
            Self::SyncStale => "sync_stale",
            Self::SyncLagging => "sync_lagging",
            Self::SyncNotReady => "sync_not_ready",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer for one request. Never cached: computed from the snapshot on every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The session may be used now.
    Allow,
    /// Refused, and why.
    Deny(DenyReason),
}

impl Decision {
    /// Whether this is [`Decision::Allow`].
    pub fn is_allow(self) -> bool {
        matches!(self, Self::Allow)
    }

    /// The deny reason, `None` for an allow.
    pub fn reason(self) -> Option<DenyReason> {
        match self {
            Self::Allow => None,
            Self::Deny(r) => Some(r),
        }
    }
}

/// Whether `session` may be used at `now`.
///
/// Revocation wins over expiry (a revoked session says so even after it expires, which is what
/// an operator looking at a cut stream wants to read). A session being deleted is treated as
/// gone. The activity test is the apiserver's own rule ([`counts_as_active`]), so the gateway
/// and the quota never disagree about what "active and unexpired" means.
pub fn evaluate(session: &AccessSession, now: Timestamp) -> Decision {
    if session.metadata.deletion_timestamp.is_some() {
        return Decision::Deny(DenyReason::SessionNotFound);
    }
    match session.phase() {
        SessionPhase::Revoked => Decision::Deny(DenyReason::SessionRevoked),
        SessionPhase::Expired => Decision::Deny(DenyReason::SessionExpired),
        _ if !counts_as_active(session, now) => Decision::Deny(DenyReason::SessionExpired),
        SessionPhase::PendingEnrollment => Decision::Deny(DenyReason::SessionPendingEnrollment),
        SessionPhase::Active => Decision::Allow,
    }
}

/// When `session` stops being usable by the clock alone (its `expiresAt`), if it is usable now.
pub fn expires_at(session: &AccessSession) -> Option<Timestamp> {
    session.spec.expires_at.as_ref().map(|t| t.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use apis::{AccessSessionSpec, AccessSessionStatus, RevocationInfo, ServerRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::SignedDuration;

    pub(crate) fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    pub(crate) fn mk_session(
        ns: &str,
        name: &str,
        server_uid: &str,
        phase: SessionPhase,
    ) -> AccessSession {
        AccessSession {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: AccessSessionSpec {
                server: ServerRef {
                    name: "github".into(),
                    uid: server_uid.into(),
                },
                teams: vec!["payments".into()],
                expires_at: Some(Time(t0() + SignedDuration::from_secs(3600))),
                ..Default::default()
            },
            status: Some(AccessSessionStatus {
                phase,
                revocation: (phase == SessionPhase::Revoked).then(|| RevocationInfo {
                    revoked_at: Time(t0()),
                    cause: "manual".into(),
                    revocation_name: Some("r".into()),
                    covered_by: vec![],
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn active_until_expiry() {
        let s = mk_session("ns", "a", "u1", SessionPhase::Active);
        assert_eq!(evaluate(&s, t0()), Decision::Allow);
        let at = t0() + SignedDuration::from_secs(3600);
        assert_eq!(
            evaluate(&s, at),
            Decision::Deny(DenyReason::SessionExpired),
            "expiresAt itself is already expired"
        );
    }

    #[test]
    fn revoked_wins_over_expired() {
        let s = mk_session("ns", "a", "u1", SessionPhase::Revoked);
        assert_eq!(
            evaluate(&s, t0()),
            Decision::Deny(DenyReason::SessionRevoked)
        );
        let later = t0() + SignedDuration::from_secs(7200);
        assert_eq!(
            evaluate(&s, later),
            Decision::Deny(DenyReason::SessionRevoked)
        );
    }

    #[test]
    fn pending_and_missing_expiry_and_deleting_are_refused() {
        let s = mk_session("ns", "a", "u1", SessionPhase::PendingEnrollment);
        assert_eq!(
            evaluate(&s, t0()),
            Decision::Deny(DenyReason::SessionPendingEnrollment)
        );
        let mut s = mk_session("ns", "a", "u1", SessionPhase::Active);
        s.spec.expires_at = None;
        assert_eq!(
            evaluate(&s, t0()),
            Decision::Deny(DenyReason::SessionExpired)
        );
        let mut s = mk_session("ns", "a", "u1", SessionPhase::Active);
        s.metadata.deletion_timestamp = Some(Time(t0()));
        assert_eq!(
            evaluate(&s, t0()),
            Decision::Deny(DenyReason::SessionNotFound)
        );
        let s = mk_session("ns", "a", "u1", SessionPhase::Expired);
        assert_eq!(
            evaluate(&s, t0()),
            Decision::Deny(DenyReason::SessionExpired)
        );
    }
}
