//! `Mcp-Session-Id` → AccessSession binding. An MCP session id is bound to the AccessSession
//! (by uid) of the first admitted request that carries it or of the response that assigns it;
//! afterwards a request under another AccessSession gets 404 (as an unknown id), and an id whose
//! stream was cut because its session stopped being usable is refused with that reason even
//! if a later token would pass (a `cache_stale` cut is not recorded: it heals by itself).
//!
//! Bounded: at most `capacity` ids, each forgotten `ttl` after its last use; when full, the
//! least recently used id is forgotten.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::credential::Reason;

#[derive(Debug)]
struct Binding {
    session_uid: String,
    cut: Option<Reason>,
    last_used: Instant,
}

/// What the binding says about a request's `Mcp-Session-Id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Unknown or bound to this session: go on.
    Pass,
    /// Bound to another AccessSession: 404.
    OtherSession,
    /// Its session was cut: 401 with the reason.
    Cut(Reason),
}

/// The bindings of one gateway.
#[derive(Debug)]
pub struct Bindings {
    map: Mutex<HashMap<String, Binding>>,
    capacity: usize,
    ttl: Duration,
}

impl Bindings {
    /// At most `capacity` ids, each kept `ttl` after its last use.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Binding>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks `id` for a request of `session_uid` at `now`, binding it when unknown.
    pub fn check(&self, id: &str, session_uid: &str, now: Instant) -> Check {
        let mut map = self.lock();
        if let Some(b) = map.get_mut(id) {
            if now.saturating_duration_since(b.last_used) < self.ttl {
                if b.session_uid != session_uid {
                    return Check::OtherSession;
                }
                if let Some(reason) = b.cut {
                    return Check::Cut(reason);
                }
                b.last_used = now;
                return Check::Pass;
            }
        }
        self.insert(&mut map, id, session_uid, now);
        Check::Pass
    }

    /// The upstream assigned `id` to a session of `session_uid` (an initialize response). An
    /// id already bound to another live session is left alone.
    pub fn bind(&self, id: &str, session_uid: &str, now: Instant) {
        let mut map = self.lock();
        let held = map.get(id).is_some_and(|b| {
            b.session_uid != session_uid && now.saturating_duration_since(b.last_used) < self.ttl
        });
        if !held {
            self.insert(&mut map, id, session_uid, now);
        }
    }

    fn insert(
        &self,
        map: &mut HashMap<String, Binding>,
        id: &str,
        session_uid: &str,
        now: Instant,
    ) {
        if map.len() >= self.capacity && !map.contains_key(id) {
            map.retain(|_, b| now.saturating_duration_since(b.last_used) < self.ttl);
            if map.len() >= self.capacity {
                if let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, b)| b.last_used)
                    .map(|(k, _)| k.clone())
                {
                    map.remove(&oldest);
                }
            }
        }
        map.insert(
            id.to_string(),
            Binding {
                session_uid: session_uid.to_string(),
                cut: None,
                last_used: now,
            },
        );
    }

    /// Every id of `session_uid` is refused with `reason` from now on (unless the reason is
    /// `cache_stale`, which says nothing about the session).
    pub fn cut(&self, session_uid: &str, reason: Reason) {
        if reason == Reason::CacheStale {
            return;
        }
        for b in self
            .lock()
            .values_mut()
            .filter(|b| b.session_uid == session_uid)
        {
            b.cut.get_or_insert(reason);
        }
    }

    /// The MCP session was deleted (a DELETE the upstream accepted).
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No id held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_id_belongs_to_one_session() {
        let b = Bindings::new(10, TTL);
        let now = Instant::now();
        b.bind("m1", "u1", now);
        assert_eq!(b.check("m1", "u1", now), Check::Pass);
        assert_eq!(b.check("m1", "u2", now), Check::OtherSession);
        b.bind("m1", "u2", now);
        assert_eq!(
            b.check("m1", "u2", now),
            Check::OtherSession,
            "not rebound while live"
        );
        // First sight binds (a gateway restart lost the table).
        assert_eq!(b.check("m2", "u2", now), Check::Pass);
        assert_eq!(b.check("m2", "u1", now), Check::OtherSession);
        // Forgotten after the TTL, then bound anew.
        let later = now + TTL;
        assert_eq!(b.check("m1", "u2", later), Check::Pass);
        b.forget("m1");
        assert_eq!(b.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_session_stays_refused() {
        let b = Bindings::new(10, TTL);
        let now = Instant::now();
        b.bind("m1", "u1", now);
        b.bind("m2", "u1", now);
        b.bind("m3", "u2", now);
        b.cut("u1", Reason::CacheStale);
        assert_eq!(b.check("m1", "u1", now), Check::Pass, "a stale cache heals");
        b.cut("u1", Reason::SessionRevoked);
        b.cut("u1", Reason::SessionExpired);
        assert_eq!(b.check("m1", "u1", now), Check::Cut(Reason::SessionRevoked));
        assert_eq!(b.check("m2", "u1", now), Check::Cut(Reason::SessionRevoked));
        assert_eq!(b.check("m3", "u2", now), Check::Pass);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_by_capacity() {
        let b = Bindings::new(2, TTL);
        let t = Instant::now();
        b.bind("a", "u", t);
        b.bind("b", "u", t + Duration::from_secs(1));
        b.bind("c", "u", t + Duration::from_secs(2));
        assert_eq!(b.len(), 2);
        // "a" (least recently used) went: it binds anew to whoever comes.
        assert_eq!(
            b.check("a", "other", t + Duration::from_secs(3)),
            Check::Pass
        );
        assert_eq!(b.len(), 2);
    }
}
