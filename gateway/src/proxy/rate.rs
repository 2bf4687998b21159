//! Rate limits on `tools/call`: token buckets per session (`spec.callsPerMinute`, at most the
//! agent's), per agent (all its sessions together: the agent's `callsPerMinute` recorded on
//! each session) and per session and ToolPolicy rule (`callsPerMinute` of a rule). A bucket holds a
//! minute's worth of calls and refills at that rate; a body whose calls would overdraw any of
//! its buckets takes nothing from them and is answered 429 with `Retry-After`.
//!
//! Buckets live in this gateway's memory only (each replica limits what passes through it).
//! One that has refilled is the same as none, so the map is pruned of full buckets whenever it
//! grows past its bound: its size follows the sessions calling now, not every session seen.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// What a bucket limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BucketKey {
    /// Every call of a session (by uid).
    Session(String),
    /// Every call of every session of an agent (by uid).
    Agent(String),
    /// The calls of a session of the tools one policy rule covers.
    Rule {
        session: String,
        policy: String,
        rule: String,
    },
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    per_minute: u32,
}

impl Bucket {
    fn full(per_minute: u32, now: Instant) -> Self {
        Self {
            tokens: per_minute as f64,
            at: now,
            per_minute,
        }
    }

    /// Tokens now (refilled since `at`); a changed limit starts the bucket over within it.
    fn level(&self, per_minute: u32, now: Instant) -> f64 {
        let capacity = per_minute as f64;
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * capacity / 60.0;
        (self.tokens.min(capacity) + refill).min(capacity)
    }
}

/// The gateway's buckets.
pub struct RateLimiter {
    buckets: Mutex<HashMap<BucketKey, Bucket>>,
    /// Past this many buckets, full ones are dropped.
    prune_at: usize,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(65_536)
    }
}

impl RateLimiter {
    pub fn new(prune_at: usize) -> Self {
        Self {
            buckets: Mutex::new(HashMap::new()),
            prune_at,
        }
    }

    /// Takes `n` tokens from each bucket of `wants` (a key, its calls per minute, and how many
    /// calls of the body draw on it), all or none. `Err` carries how long until every one of
    /// them would have enough.
    pub fn take(&self, wants: &[(BucketKey, u32, u32)], now: Instant) -> Result<(), Duration> {
        if wants.is_empty() {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = 0.0f64;
        for (key, per_minute, n) in wants {
            let level = buckets
                .get(key)
                .map_or(*per_minute as f64, |b| b.level(*per_minute, now));
            let short = *n as f64 - level;
            if short > 0.0 {
                // A body asking more than the bucket can ever hold waits a full minute and
                // is refused again: it cannot pass.
                wait = wait.max(short * 60.0 / *per_minute as f64);
            }
        }
        if wait > 0.0 {
            return Err(Duration::from_secs_f64(wait.min(60.0)));
        }
        for (key, per_minute, n) in wants {
            let bucket = buckets
                .entry(key.clone())
                .or_insert_with(|| Bucket::full(*per_minute, now));
            let level = bucket.level(*per_minute, now);
            *bucket = Bucket {
                tokens: level - *n as f64,
                at: now,
                per_minute: *per_minute,
            };
        }
        if buckets.len() > self.prune_at {
            buckets.retain(|_, b| b.level(b.per_minute, now) < b.per_minute as f64);
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `Retry-After` in whole seconds, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(uid: &str) -> BucketKey {
        BucketKey::Session(uid.into())
    }

    #[test]
    fn a_bucket_holds_a_minute_and_refills_at_its_rate() {
        let limiter = RateLimiter::default();
        let t0 = Instant::now();
        let want = [(session("a"), 6, 1)];
        for _ in 0..6 {
            limiter.take(&want, t0).unwrap();
        }
        let wait = limiter.take(&want, t0).unwrap_err();
        assert_eq!(retry_after_secs(wait), 10, "6 a minute: one every 10 s");
        assert!(limiter.take(&want, t0 + Duration::from_secs(9)).is_err());
        limiter.take(&want, t0 + Duration::from_secs(10)).unwrap();
        // Another session has its own bucket.
        limiter.take(&[(session("b"), 6, 1)], t0).unwrap();
    }

    #[test]
    fn a_body_takes_from_all_its_buckets_or_from_none() {
        let limiter = RateLimiter::default();
        let t0 = Instant::now();
        let rule = BucketKey::Rule {
            session: "a".into(),
            policy: "p".into(),
            rule: "search".into(),
        };
        limiter.take(&[(rule.clone(), 1, 1)], t0).unwrap();
        // The rule's bucket is empty: the session's is left untouched.
        assert!(limiter
            .take(&[(session("a"), 2, 1), (rule.clone(), 1, 1)], t0)
            .is_err());
        limiter.take(&[(session("a"), 2, 2)], t0).unwrap();
        // A batch larger than a bucket can hold never passes.
        let wait = limiter.take(&[(session("c"), 2, 3)], t0).unwrap_err();
        assert!(wait <= Duration::from_secs(60));
    }

    #[test]
    fn full_buckets_are_pruned_past_the_bound() {
        let limiter = RateLimiter::new(4);
        let t0 = Instant::now();
        for i in 0..10 {
            limiter
                .take(&[(session(&i.to_string()), 60, 1)], t0)
                .unwrap();
        }
        assert_eq!(limiter.len(), 10, "buckets drawn on are kept");
        let later = t0 + Duration::from_secs(2);
        limiter.take(&[(session("new"), 60, 1)], later).unwrap();
        assert_eq!(
            limiter.len(),
            1,
            "refilled buckets are dropped: {}",
            limiter.len()
        );
    }

    #[test]
    fn a_lowered_limit_applies_at_once() {
        let limiter = RateLimiter::default();
        let t0 = Instant::now();
        limiter.take(&[(session("a"), 100, 1)], t0).unwrap();
        limiter.take(&[(session("a"), 2, 2)], t0).unwrap();
        assert!(limiter.take(&[(session("a"), 2, 1)], t0).is_err());
    }
}
