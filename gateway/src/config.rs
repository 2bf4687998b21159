//! What a session cache needs: where the feed is, whom to trust, which token to present, and
//! how long last-known-good may be served.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::error::CacheError;

/// The default and the longest stale window (DESIGN §5: configurable shorter, never longer).
pub const MAX_STALE_WINDOW: Duration = Duration::from_secs(600);
/// The default lag bound.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(2);
/// Environment variable that shortens the stale window.
pub const STALE_WINDOW_ENV: &str = "SESSION_SYNC_STALE_WINDOW";

/// The wall clock sessions expire by. Tests pass their own.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Settings of one [`crate::SessionCache`].
#[derive(Clone)]
pub struct CacheConfig {
    /// `https://host:port` of the sync listener (8085) or any server with the same paths.
    pub sync_url: String,
    /// PEM bundle trusted for the sync URL's certificate (and nothing else).
    pub ca_file: PathBuf,
    /// The projected token, re-read on every request.
    pub token_file: PathBuf,
    /// How long last-known-good is served after the last proof of being caught up.
    pub stale_window: Duration,
    /// How long the cache keeps answering once it knows it is behind the change log's head
    /// (docs/gateways.md, "Lag bound"); then `sync_lagging` until it caught up.
    pub max_lag: Duration,
    /// `timeoutSeconds` of each watch: the server ends it then and the cache resumes from its
    /// resourceVersion, which also re-presents the (possibly rotated) token.
    pub watch_timeout: Duration,
    /// Longest pause between reconnection attempts.
    pub retry_max: Duration,
    /// Concurrent get-on-miss requests; beyond that a miss is `session_not_found` without a
    /// request, so a flood of unknown names cannot be amplified onto the server.
    pub miss_concurrency: usize,
    /// The wall clock for expiry timers in [`crate::SessionCache::subscribe`].
    pub clock: Clock,
}

impl std::fmt::Debug for CacheConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheConfig")
            .field("sync_url", &self.sync_url)
            .field("ca_file", &self.ca_file)
            .field("token_file", &self.token_file)
            .field("stale_window", &self.stale_window)
            .field("max_lag", &self.max_lag)
            .field("watch_timeout", &self.watch_timeout)
            .field("retry_max", &self.retry_max)
            .field("miss_concurrency", &self.miss_concurrency)
            .finish_non_exhaustive()
    }
}

impl CacheConfig {
    /// Defaults: a 10 minute stale window, a 2 s lag bound, 290 s watches, reconnection
    /// backoff up to 5 s.
    pub fn new(
        sync_url: impl Into<String>,
        ca_file: impl Into<PathBuf>,
        token_file: impl Into<PathBuf>,
    ) -> Self {
        Self {
            sync_url: sync_url.into(),
            ca_file: ca_file.into(),
            token_file: token_file.into(),
            stale_window: MAX_STALE_WINDOW,
            max_lag: DEFAULT_MAX_LAG,
            watch_timeout: Duration::from_secs(290),
            retry_max: Duration::from_secs(5),
            miss_concurrency: 8,
            clock: Arc::new(Timestamp::now),
        }
    }

    /// Applies `SESSION_SYNC_STALE_WINDOW` when set (see [`parse_stale_window`]).
    pub fn with_env(mut self) -> Result<Self, CacheError> {
        if let Ok(raw) = std::env::var(STALE_WINDOW_ENV) {
            self.stale_window = parse_stale_window(&raw).map_err(CacheError::StaleWindow)?;
        }
        Ok(self)
    }
}

/// Parses a stale window: a Go duration (`30s`, `2m`, `1m30s`) or a whole number of seconds
/// (`45`). Zero and anything above [`MAX_STALE_WINDOW`] are refused: the window may only be
/// shortened, and a zero window would deny everything.
pub fn parse_stale_window(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let window = if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(
            raw.parse()
                .map_err(|_| format!("{raw:?} is not a number of seconds"))?,
        )
    } else {
        apis::duration::parse_go_duration(raw)?.unsigned_abs()
    };
    if window.is_zero() {
        return Err(format!("{raw:?}: the stale window must be positive"));
    }
    if window > MAX_STALE_WINDOW {
        return Err(format!(
            "{raw:?}: the stale window may only be shortened (at most 10m)"
        ));
    }
    Ok(window)
}

/// Parses a positive Go duration (`10s`, `1m30s`): the timeouts of the gateway binaries.
pub fn parse_positive_duration(raw: &str) -> Result<Duration, String> {
    let d = apis::duration::parse_go_duration(raw)?.unsigned_abs();
    if d.is_zero() {
        return Err("must be positive".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_window_forms() {
        assert_eq!(parse_stale_window("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_stale_window("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_stale_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_stale_window("10m"), Ok(MAX_STALE_WINDOW));
        assert!(parse_stale_window("0").is_err());
        assert!(parse_stale_window("0s").is_err());
        assert!(parse_stale_window("11m").is_err());
        assert!(parse_stale_window("601").is_err());
        assert!(parse_stale_window("-5s").is_err());
        assert!(parse_stale_window("soon").is_err());
        assert!(parse_stale_window("").is_err());
    }
}
