//! The cache's state as a plain value: the snapshot of sessions, whether it carries authority,
//! and how fresh it is. The sync loop drives it; `authorize` and `subscribe` read it. No I/O,
//! and time is passed in, so every rule below is unit-tested with a paused clock.
//!
//! Authority rules (DESIGN §5):
//! - no authority before the first complete list (`sync_not_ready`);
//! - each proof that the cache is caught up (a complete list, any watch event or bookmark)
//!   renews freshness; past the stale window without one, `sync_stale`;
//! - [`State::invalidate`] (401/403, 410) drops the snapshot itself, not just a flag, so no
//!   later code path can serve it while the relist fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apis::{AccessSession, SessionPhase};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use crate::decision::DenyReason;

/// `(namespace, name)`.
pub(crate) type Key = (String, String);

/// What the snapshot says about the MCPServer generation the caller serves. A get-on-miss
/// result is trusted only when it names that exact UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ServerUid {
    /// No session seen yet.
    Unknown,
    /// Every session seen so far names this UID.
    Known(String),
    /// Sessions of several UIDs were seen (a scope the server did not narrow): trust no miss.
    Mixed,
}

impl ServerUid {
    fn observe(&mut self, uid: &str) {
        match self {
            Self::Unknown => *self = Self::Known(uid.to_string()),
            Self::Known(known) if known != uid => *self = Self::Mixed,
            _ => {}
        }
    }

    pub(crate) fn known(&self) -> Option<&str> {
        match self {
            Self::Known(uid) => Some(uid),
            _ => None,
        }
    }
}

/// The answer to "what does the snapshot say about this session".
#[derive(Clone, Debug)]
pub(crate) enum Lookup {
    /// No authority to answer at all.
    Denied(DenyReason),
    Found(Arc<AccessSession>),
    /// Not in the snapshot; a get-on-miss may be tried, trusted only for this server UID.
    Missing {
        server_uid: Option<String>,
    },
}

#[derive(Debug)]
pub(crate) struct State {
    sessions: HashMap<Key, Arc<AccessSession>>,
    /// A complete list arrived since start or since the last invalidation.
    ready: bool,
    /// The last proof of being caught up.
    fresh_at: Option<Instant>,
    server_uid: ServerUid,
    /// Where the next watch starts.
    resource_version: Option<String>,
    /// Bumped on every change subscribers must look at (not on bookmarks).
    generation: u64,
}

/// `revokedAt` of `next` when it revokes a session the snapshot held unrevoked: the moment
/// this cache applies a revocation, from which on it denies (the revoke-to-deny histogram).
/// A session first seen already revoked was never allowed here and is not counted.
fn newly_revoked(held: Option<&Arc<AccessSession>>, next: &AccessSession) -> Option<Timestamp> {
    let held = held?;
    if held.phase() == SessionPhase::Revoked || next.phase() != SessionPhase::Revoked {
        return None;
    }
    next.status
        .as_ref()?
        .revocation
        .as_ref()
        .map(|r| r.revoked_at.0)
}

pub(crate) fn key_of(s: &AccessSession) -> Key {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

impl State {
    pub(crate) fn new() -> Self {
        Self {
            sessions: HashMap::new(),
            ready: false,
            fresh_at: None,
            server_uid: ServerUid::Unknown,
            resource_version: None,
            generation: 0,
        }
    }

    /// Whether the snapshot may be used at `now`.
    pub(crate) fn authority(&self, now: Instant, window: Duration) -> Result<(), DenyReason> {
        if !self.ready {
            return Err(DenyReason::SyncNotReady);
        }
        match self.fresh_at {
            Some(at) if now.saturating_duration_since(at) < window => Ok(()),
            _ => Err(DenyReason::SyncStale),
        }
    }

    pub(crate) fn lookup(&self, ns: &str, name: &str, now: Instant, window: Duration) -> Lookup {
        if let Err(reason) = self.authority(now, window) {
            return Lookup::Denied(reason);
        }
        match self.sessions.get(&(ns.to_string(), name.to_string())) {
            Some(s) => Lookup::Found(s.clone()),
            None => Lookup::Missing {
                server_uid: self.server_uid.known().map(str::to_string),
            },
        }
    }

    /// A complete list: the snapshot becomes exactly `items`. Returns the `revokedAt` of each
    /// session the previous snapshot held unrevoked that the list shows revoked.
    pub(crate) fn replace(
        &mut self,
        items: Vec<AccessSession>,
        resource_version: Option<String>,
        now: Instant,
    ) -> Vec<Timestamp> {
        self.server_uid = ServerUid::Unknown;
        let mut revoked = Vec::new();
        let previous = std::mem::take(&mut self.sessions);
        self.sessions = items
            .into_iter()
            .map(|s| {
                self.server_uid.observe(&s.spec.server.uid);
                let key = key_of(&s);
                revoked.extend(newly_revoked(previous.get(&key), &s));
                (key, Arc::new(s))
            })
            .collect();
        self.ready = true;
        self.fresh_at = Some(now);
        self.resource_version = resource_version;
        self.generation += 1;
        revoked
    }

    /// ADDED or MODIFIED. Returns `revokedAt` when it revokes a session held unrevoked.
    pub(crate) fn upsert(&mut self, session: AccessSession, now: Instant) -> Option<Timestamp> {
        // Events of a watch that outlived an invalidation must not rebuild a partial snapshot.
        if !self.ready {
            return None;
        }
        self.server_uid.observe(&session.spec.server.uid);
        self.resource_version = session.metadata.resource_version.clone();
        let key = key_of(&session);
        let revoked = newly_revoked(self.sessions.get(&key), &session);
        self.sessions.insert(key, Arc::new(session));
        self.fresh_at = Some(now);
        self.generation += 1;
        revoked
    }

    /// DELETED.
    pub(crate) fn remove(&mut self, session: &AccessSession, now: Instant) {
        if !self.ready {
            return;
        }
        self.resource_version = session.metadata.resource_version.clone();
        self.sessions.remove(&key_of(session));
        self.fresh_at = Some(now);
        self.generation += 1;
    }

    /// A bookmark: caught up to `resource_version`, nothing changed.
    pub(crate) fn bookmark(&mut self, resource_version: Option<String>, now: Instant) {
        if resource_version.is_some() {
            self.resource_version = resource_version;
        }
        self.fresh_at = Some(now);
    }

    /// Drops cached authority at once: the snapshot is emptied, not merely flagged.
    pub(crate) fn invalidate(&mut self) {
        self.sessions.clear();
        self.ready = false;
        self.fresh_at = None;
        self.server_uid = ServerUid::Unknown;
        self.resource_version = None;
        self.generation += 1;
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// When the snapshot goes stale unless renewed.
    pub(crate) fn stale_at(&self, window: Duration) -> Option<Instant> {
        self.fresh_at.filter(|_| self.ready).map(|at| at + window)
    }

    /// Seconds since the last proof of being caught up; -1 without authority.
    pub(crate) fn sync_age_seconds(&self, now: Instant) -> f64 {
        match self.fresh_at.filter(|_| self.ready) {
            Some(at) => now.saturating_duration_since(at).as_secs_f64(),
            None => -1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::tests::mk_session;
    use apis::SessionPhase;

    const WINDOW: Duration = Duration::from_secs(600);

    fn found(l: Lookup) -> Arc<AccessSession> {
        match l {
            Lookup::Found(s) => s,
            other => panic!("expected Found, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_authority_before_the_first_list() {
        let st = State::new();
        let now = Instant::now();
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncNotReady)
        ));
        assert_eq!(st.sync_age_seconds(now), -1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_after_the_window_renewed_by_bookmarks() {
        let mut st = State::new();
        let start = Instant::now();
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some("1".into()),
            start,
        );
        found(st.lookup("ns", "a", start + WINDOW - Duration::from_millis(1), WINDOW));
        assert!(matches!(
            st.lookup("ns", "a", start + WINDOW, WINDOW),
            Lookup::Denied(DenyReason::SyncStale)
        ));
        st.bookmark(Some("2".into()), start + WINDOW);
        found(st.lookup("ns", "a", start + WINDOW, WINDOW));
        assert_eq!(st.resource_version(), Some("2"));
        assert_eq!(
            st.sync_age_seconds(start + WINDOW + Duration::from_secs(3)),
            3.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_drops_the_snapshot_itself() {
        let mut st = State::new();
        let now = Instant::now();
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some("1".into()),
            now,
        );
        let before = st.generation();
        st.invalidate();
        assert!(st.generation() > before, "subscribers are woken");
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncNotReady)
        ));
        assert_eq!(st.len(), 0);
        assert_eq!(st.resource_version(), None, "the next watch cannot resume");
        assert_eq!(st.sync_age_seconds(now), -1.0);
        // A bookmark alone (a stray event after invalidation) does not restore authority.
        st.bookmark(Some("9".into()), now);
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncNotReady)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn server_uid_is_learned_and_mixed_uids_trust_no_miss() {
        let mut st = State::new();
        let now = Instant::now();
        st.replace(vec![], Some("1".into()), now);
        assert!(matches!(
            st.lookup("ns", "x", now, WINDOW),
            Lookup::Missing { server_uid: None }
        ));
        st.upsert(mk_session("ns", "a", "u1", SessionPhase::Active), now);
        assert!(matches!(
            st.lookup("ns", "x", now, WINDOW),
            Lookup::Missing { server_uid: Some(ref u) } if u == "u1"
        ));
        st.upsert(mk_session("ns", "b", "u2", SessionPhase::Active), now);
        assert!(matches!(
            st.lookup("ns", "x", now, WINDOW),
            Lookup::Missing { server_uid: None }
        ));
        // A relist recomputes from what is listed.
        st.replace(
            vec![mk_session("ns", "b", "u2", SessionPhase::Active)],
            Some("5".into()),
            now,
        );
        assert!(matches!(
            st.lookup("ns", "x", now, WINDOW),
            Lookup::Missing { server_uid: Some(ref u) } if u == "u2"
        ));
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Missing { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_revocation_is_reported_once_when_it_revokes_a_held_session() {
        let mut st = State::new();
        let now = Instant::now();
        let revoked = mk_session("ns", "a", "u1", SessionPhase::Revoked);
        let revoked_at = revoked
            .status
            .as_ref()
            .unwrap()
            .revocation
            .as_ref()
            .unwrap()
            .revoked_at
            .0;
        // Before the first list nothing is held, so nothing is applied.
        assert_eq!(st.upsert(revoked.clone(), now), None);
        st.replace(
            vec![
                mk_session("ns", "a", "u1", SessionPhase::Active),
                mk_session("ns", "b", "u1", SessionPhase::Active),
            ],
            Some("1".into()),
            now,
        );
        assert_eq!(st.upsert(revoked.clone(), now), Some(revoked_at));
        // Another event for the same revoked session (a label change) is not a second one.
        assert_eq!(st.upsert(revoked, now), None);
        // First seen revoked: never allowed here, not counted.
        assert_eq!(
            st.upsert(mk_session("ns", "c", "u1", SessionPhase::Revoked), now),
            None
        );
        // A relist that shows a held session revoked (the event was missed) reports it.
        let applied = st.replace(
            vec![
                mk_session("ns", "a", "u1", SessionPhase::Revoked),
                mk_session("ns", "b", "u1", SessionPhase::Revoked),
            ],
            Some("2".into()),
            now,
        );
        assert_eq!(applied, vec![revoked_at]);
    }

    #[tokio::test(start_paused = true)]
    async fn events_update_the_snapshot() {
        let mut st = State::new();
        let now = Instant::now();
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some("1".into()),
            now,
        );
        st.upsert(mk_session("ns", "a", "u1", SessionPhase::Revoked), now);
        assert_eq!(
            found(st.lookup("ns", "a", now, WINDOW)).phase(),
            SessionPhase::Revoked
        );
        st.remove(&mk_session("ns", "a", "u1", SessionPhase::Revoked), now);
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Missing { .. }
        ));
    }
}
