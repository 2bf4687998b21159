//! The cache's state as a plain value: the snapshot of sessions, whether it carries authority,
//! and how fresh it is. The sync loop drives it; `authorize` and `subscribe` read it. No I/O,
//! and time is passed in, so every rule below is unit-tested with a paused clock.
//!
//! Authority rules (DESIGN §5, docs/gateways.md "Lag bound"):
//! - no authority before the first complete list (`sync_not_ready`);
//! - each proof that the stream is alive (a complete list, any watch event or bookmark)
//!   renews freshness; past the stale window without one, `sync_stale` (last-known-good);
//! - a bookmark carries the change log's head (`apis::feed::HEAD_ANNOTATION`): from the moment
//!   the cache learns it has applied less than the head (or, after a 410 that is not an epoch
//!   change, that it missed an unknown amount) it keeps answering for at most the lag bound,
//!   then `sync_lagging`, until it applied the head or relisted;
//! - [`State::invalidate`] (401/403, a new epoch) drops the snapshot itself, not just a flag,
//!   so no later code path can serve it while the relist fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apis::feed::ResourceVersion;
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
    /// How long the cache may answer once it knows it is behind.
    max_lag: Duration,
    /// Since when, and behind which head, the cache knows it is behind.
    behind: Option<Behind>,
}

/// The cache knows it has not applied everything committed.
#[derive(Clone, Copy, Debug)]
struct Behind {
    /// The head to reach; `None` after a 410 (unknown: only a relist catches up).
    head: Option<ResourceVersion>,
    since: Instant,
}

/// How far behind the change log the cache knows it is (the lag metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Lag {
    /// Seconds since the cache learned it is behind; 0 when caught up.
    pub seconds: f64,
    /// Changes between what it applied and the head it knows of; 0 when unknown.
    pub changes: u64,
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
    pub(crate) fn new(max_lag: Duration) -> Self {
        Self {
            sessions: HashMap::new(),
            ready: false,
            fresh_at: None,
            server_uid: ServerUid::Unknown,
            resource_version: None,
            generation: 0,
            max_lag,
            behind: None,
        }
    }

    /// Whether the snapshot may be used at `now`.
    pub(crate) fn authority(&self, now: Instant, window: Duration) -> Result<(), DenyReason> {
        if !self.ready {
            return Err(DenyReason::SyncNotReady);
        }
        match self.fresh_at {
            Some(at) if now.saturating_duration_since(at) < window => {}
            _ => return Err(DenyReason::SyncStale),
        }
        match self.behind {
            Some(b) if now.saturating_duration_since(b.since) >= self.max_lag => {
                Err(DenyReason::SyncLagging)
            }
            _ => Ok(()),
        }
    }

    /// What was applied last, when the server's resourceVersion has the feed's form.
    fn applied(&self) -> Option<ResourceVersion> {
        self.resource_version
            .as_deref()
            .and_then(|rv| ResourceVersion::parse(rv).ok())
    }

    /// After the position moved: caught up once the head known is applied.
    fn settle_lag(&mut self) {
        let (Some(b), Some(applied)) = (self.behind, self.applied()) else {
            return;
        };
        if b.head.and_then(|head| applied.behind(head)) == Some(0) {
            self.behind = None;
        }
    }

    /// The cache is behind from `now` (unless it already knew), towards `head`.
    fn fall_behind(&mut self, head: Option<ResourceVersion>, now: Instant) {
        let since = self.behind.map_or(now, |b| b.since);
        // An unknown head (a 410) is only cleared by a relist; a known one may move on.
        let head = match self.behind {
            Some(Behind { head: None, .. }) => None,
            _ => head,
        };
        self.behind = Some(Behind { head, since });
    }

    /// A 410 that is not an epoch change: the snapshot is a valid past state but misses an
    /// unknown number of changes. It answers for at most the lag bound while the cache
    /// relists.
    pub(crate) fn missed_changes(&mut self, now: Instant) {
        if self.ready {
            self.fall_behind(None, now);
        }
    }

    /// How far behind the cache knows it is at `now`.
    pub(crate) fn lag(&self, now: Instant) -> Lag {
        let Some(b) = self.behind else {
            return Lag::default();
        };
        Lag {
            seconds: now.saturating_duration_since(b.since).as_secs_f64(),
            changes: b
                .head
                .zip(self.applied())
                .and_then(|(head, applied)| applied.behind(head))
                .unwrap_or(0),
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
        // A complete list is everything committed when it was read.
        self.behind = None;
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
        self.settle_lag();
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
        self.settle_lag();
        self.generation += 1;
    }

    /// A bookmark: everything up to `resource_version` was delivered; `head`, when the server
    /// says it, is the newest change committed. Ahead of what was applied, the cache is behind
    /// from now on until it applies the head (or relists); at it, the cache is caught up.
    pub(crate) fn bookmark(
        &mut self,
        resource_version: Option<String>,
        head: Option<&str>,
        now: Instant,
    ) {
        if resource_version.is_some() {
            self.resource_version = resource_version;
        }
        self.fresh_at = Some(now);
        if !self.ready {
            return;
        }
        let Some(head) = head.and_then(|h| ResourceVersion::parse(h).ok()) else {
            return;
        };
        match self.applied().and_then(|applied| applied.behind(head)) {
            Some(0) if self.behind.is_some_and(|b| b.head.is_some()) => self.behind = None,
            Some(0) => {}
            // Behind it, or at another epoch (the head's history is not the one applied).
            Some(_) | None => self.fall_behind(Some(head), now),
        }
    }

    /// Drops cached authority at once: the snapshot is emptied, not merely flagged.
    pub(crate) fn invalidate(&mut self) {
        self.sessions.clear();
        self.ready = false;
        self.fresh_at = None;
        self.server_uid = ServerUid::Unknown;
        self.resource_version = None;
        self.behind = None;
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

    /// When the snapshot stops answering unless renewed (stale) or caught up (lagging).
    pub(crate) fn stale_at(&self, window: Duration) -> Option<Instant> {
        let stale = self.fresh_at.filter(|_| self.ready).map(|at| at + window)?;
        Some(match self.behind {
            Some(b) => stale.min(b.since + self.max_lag),
            None => stale,
        })
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
    const MAX_LAG: Duration = Duration::from_secs(2);

    fn found(l: Lookup) -> Arc<AccessSession> {
        match l {
            Lookup::Found(s) => s,
            other => panic!("expected Found, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_authority_before_the_first_list() {
        let st = State::new(MAX_LAG);
        let now = Instant::now();
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncNotReady)
        ));
        assert_eq!(st.sync_age_seconds(now), -1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_after_the_window_renewed_by_bookmarks() {
        let mut st = State::new(MAX_LAG);
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
        st.bookmark(Some("2".into()), None, start + WINDOW);
        found(st.lookup("ns", "a", start + WINDOW, WINDOW));
        assert_eq!(st.resource_version(), Some("2"));
        assert_eq!(
            st.sync_age_seconds(start + WINDOW + Duration::from_secs(3)),
            3.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_drops_the_snapshot_itself() {
        let mut st = State::new(MAX_LAG);
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
        st.bookmark(Some("9".into()), None, now);
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncNotReady)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn server_uid_is_learned_and_mixed_uids_trust_no_miss() {
        let mut st = State::new(MAX_LAG);
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
        let mut st = State::new(MAX_LAG);
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
        let mut st = State::new(MAX_LAG);
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

    fn rv(seq: u64) -> String {
        ResourceVersion::new(7, seq).to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_ahead_of_what_was_applied_bounds_the_answers_to_the_lag() {
        let mut st = State::new(MAX_LAG);
        let start = Instant::now();
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some(rv(10)),
            start,
        );
        // At the head: caught up, no lag.
        st.bookmark(Some(rv(10)), Some(&rv(10)), start);
        assert_eq!(st.lag(start), Lag::default());
        // The head moved on to 12 while this cache is at 10: it still answers within the
        // bound, and bookmarks (the stream is alive) do not restart the clock.
        st.bookmark(Some(rv(10)), Some(&rv(12)), start);
        let later = start + MAX_LAG - Duration::from_millis(1);
        st.bookmark(Some(rv(10)), Some(&rv(12)), later);
        found(st.lookup("ns", "a", later, WINDOW));
        assert_eq!(
            st.lag(later),
            Lag {
                seconds: later.duration_since(start).as_secs_f64(),
                changes: 2
            }
        );
        assert_eq!(st.stale_at(WINDOW), Some(start + MAX_LAG));
        assert!(matches!(
            st.lookup("ns", "a", start + MAX_LAG, WINDOW),
            Lookup::Denied(DenyReason::SyncLagging)
        ));
        // Applying 11 is not enough; 12 is.
        let now = start + MAX_LAG;
        let mut s11 = mk_session("ns", "b", "u1", SessionPhase::Active);
        s11.metadata.resource_version = Some(rv(11));
        st.upsert(s11, now);
        assert!(matches!(
            st.lookup("ns", "a", now, WINDOW),
            Lookup::Denied(DenyReason::SyncLagging)
        ));
        let mut s12 = mk_session("ns", "a", "u1", SessionPhase::Revoked);
        s12.metadata.resource_version = Some(rv(12));
        st.upsert(s12, now);
        assert_eq!(
            found(st.lookup("ns", "a", now, WINDOW)).phase(),
            SessionPhase::Revoked
        );
        assert_eq!(st.lag(now), Lag::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_of_another_epoch_counts_as_behind() {
        let mut st = State::new(MAX_LAG);
        let start = Instant::now();
        st.replace(vec![], Some(rv(10)), start);
        st.bookmark(
            Some(rv(10)),
            Some(&ResourceVersion::new(8, 1).to_string()),
            start,
        );
        assert!(matches!(
            st.lookup("ns", "a", start + MAX_LAG, WINDOW),
            Lookup::Denied(DenyReason::SyncLagging)
        ));
        // A relist catches up whatever the head was.
        st.replace(
            vec![],
            Some(ResourceVersion::new(8, 1).to_string()),
            start + MAX_LAG,
        );
        assert!(matches!(
            st.lookup("ns", "a", start + MAX_LAG, WINDOW),
            Lookup::Missing { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn missed_changes_answer_until_the_lag_bound_and_only_a_relist_clears_them() {
        let mut st = State::new(MAX_LAG);
        let start = Instant::now();
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some(rv(10)),
            start,
        );
        st.missed_changes(start);
        // A bookmark at its own head says nothing about what the 410 said was missed.
        st.bookmark(Some(rv(10)), Some(&rv(10)), start);
        found(st.lookup(
            "ns",
            "a",
            start + MAX_LAG - Duration::from_millis(1),
            WINDOW,
        ));
        assert!(matches!(
            st.lookup("ns", "a", start + MAX_LAG, WINDOW),
            Lookup::Denied(DenyReason::SyncLagging)
        ));
        assert_eq!(st.lag(start + MAX_LAG).changes, 0, "unknown");
        st.replace(
            vec![mk_session("ns", "a", "u1", SessionPhase::Active)],
            Some(rv(20)),
            start + MAX_LAG,
        );
        found(st.lookup("ns", "a", start + MAX_LAG, WINDOW));
        // Before the first list there is nothing to fall behind with.
        let mut empty = State::new(MAX_LAG);
        empty.missed_changes(start);
        assert_eq!(empty.lag(start + MAX_LAG), Lag::default());
    }
}
