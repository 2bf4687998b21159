//! A fixed-window rate limit per key (the Host API's: a Host UID and an action, so inventory
//! and credential requests have windows of their own). A window starts at a key's first
//! request after the previous one ended. Finished windows are dropped as time passes, so memory holds only
//! the hosts seen in about the last two windows (and only authenticated hosts are counted).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimiter<K> {
    limit: u32,
    window: Duration,
    state: Mutex<State<K>>,
}

struct State<K> {
    /// Key → (window start, requests in it).
    windows: HashMap<K, (Instant, u32)>,
    next_sweep: Option<Instant>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    pub fn new(limit: u32, window: Duration) -> Self {
        Self {
            limit,
            window,
            state: Mutex::new(State {
                windows: HashMap::new(),
                next_sweep: None,
            }),
        }
    }

    /// Counts a request of `key` at `now`: `Ok` within the limit, or `Err` with the time left
    /// until the window ends.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let window = self.window;
        if state.next_sweep.is_none_or(|at| now >= at) {
            state
                .windows
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < window);
            state.next_sweep = Some(now + window);
        }
        let entry = state.windows.entry(key.clone()).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= window {
            *entry = (now, 0);
        }
        if entry.1 >= self.limit {
            return Err(window.saturating_sub(now.saturating_duration_since(entry.0)));
        }
        entry.1 += 1;
        Ok(())
    }

    /// Keys currently tracked.
    pub fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .windows
            .len()
    }
}

/// The `Retry-After` value: whole seconds, rounded up, at least 1.
pub fn retry_after_seconds(left: Duration) -> u64 {
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_per_key() {
        let limiter = RateLimiter::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(limiter.check(&"a", t0 + Duration::from_secs(i)).is_ok());
        }
        assert_eq!(
            limiter.check(&"a", t0 + Duration::from_millis(3500)),
            Err(Duration::from_millis(6500))
        );
        // Another host has its own window.
        assert!(limiter.check(&"b", t0 + Duration::from_secs(4)).is_ok());
        // Refused requests do not extend the window; it ends 10 s after it began.
        assert!(limiter
            .check(&"a", t0 + Duration::from_millis(9999))
            .is_err());
        assert!(limiter.check(&"a", t0 + Duration::from_secs(10)).is_ok());
        assert!(limiter.check(&"a", t0 + Duration::from_secs(11)).is_ok());
        assert_eq!(retry_after_seconds(Duration::from_millis(6500)), 7);
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(3)), 3);
    }

    #[test]
    fn finished_windows_are_dropped() {
        let limiter = RateLimiter::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..1000 {
            let _ = limiter.check(&format!("host-{i}"), t0);
        }
        assert_eq!(limiter.tracked(), 1000);
        // Two windows later, one request sweeps every finished window.
        let _ = limiter.check(&"late".to_string(), t0 + Duration::from_secs(2));
        assert_eq!(limiter.tracked(), 1);
    }
}
