//! Session expiry (DESIGN §6): at `spec.expiresAt` a session's phase becomes `Expired`, an
//! ordinary write with its change-log event, so watches and gateways see it.
//!
//! Every replica runs this scheduler. It sleeps until the earliest expiry the store knows
//! (at most [`ExpiryConfig::max_sleep`]), sweeps, and starts over; a committed write of a
//! session on this replica wakes it early (a new session may expire first). A session
//! created on another replica is swept by that replica at its instant, and by this one at
//! its next wake-up at the latest. Sweeps from several replicas are safe: each runs under
//! the store's write lock and the second finds nothing due.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::store::{Store, EXPIRY_BATCH};

/// Scheduler settings.
#[derive(Clone, Debug)]
pub struct ExpiryConfig {
    /// The longest sleep between sweeps: bounds how late a session created on another
    /// replica (which did not wake this one) is expired if that replica is gone.
    pub max_sleep: Duration,
    /// Wait before retrying after a failed sweep.
    pub retry: Duration,
}

impl Default for ExpiryConfig {
    fn default() -> Self {
        Self {
            max_sleep: Duration::from_secs(5),
            retry: Duration::from_secs(1),
        }
    }
}

/// Counters of the scheduler.
#[derive(Clone, Debug, Default)]
pub struct ExpiryMetrics {
    expired: Counter,
    failures: Counter,
}

impl ExpiryMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver_session_expiry");
        sub.register(
            "expired_sessions",
            "Sessions this replica turned Expired",
            metrics.expired.clone(),
        );
        sub.register(
            "sweep_failures",
            "Expiry sweeps that failed (retried)",
            metrics.failures.clone(),
        );
        metrics
    }
}

/// Sweeps due sessions at `now`, batch after batch. Returns how many it expired.
pub async fn sweep<S: Store>(store: &S, now: Timestamp) -> crate::store::Result<usize> {
    let mut total = 0;
    loop {
        let expired = store.expire_sessions(now).await?;
        total += expired.len();
        for session in &expired {
            tracing::info!(
                ns = session.metadata.namespace.as_deref().unwrap_or_default(),
                name = session.metadata.name.as_deref().unwrap_or_default(),
                uid = session.metadata.uid.as_deref().unwrap_or_default(),
                "session expired"
            );
        }
        if expired.len() < EXPIRY_BATCH as usize {
            return Ok(total);
        }
    }
}

/// How long to sleep at `now` until `next` (the earliest expiry), capped at `max`.
pub fn sleep_until(now: Timestamp, next: Option<Timestamp>, max: Duration) -> Duration {
    match next {
        None => max,
        Some(at) => Duration::try_from(at.duration_since(now))
            .unwrap_or(Duration::ZERO)
            .min(max),
    }
}

/// Runs the scheduler until the process ends. Only a due expiry takes the write lock, and
/// the next expiry is read from the store only after a sleep or a sweep: a committed write
/// of a session on this replica hands over its expiry, so a burst of session writes costs
/// neither write transactions nor reads.
pub async fn run<S: Store>(store: S, config: ExpiryConfig, metrics: ExpiryMetrics) {
    let signals = store.session_signals();
    // The earliest expiry known without reading again: what the last read found, made
    // earlier by the writes since. `None` until read.
    let mut known: Option<Option<Timestamp>> = None;
    loop {
        let next = match known {
            Some(next) => Ok(next),
            None => store.next_session_expiry().await,
        };
        let pause = match next {
            Ok(Some(next)) if next <= Timestamp::now() => {
                known = None;
                match sweep(&store, Timestamp::now()).await {
                    // Due by the next-expiry read yet nothing to expire (another replica was
                    // first, a session revoked or deleted since, or a stored time the sweep
                    // cannot match): look again after a pause rather than spin on the lock.
                    Ok(0) => config.retry,
                    Ok(n) => {
                        metrics.expired.inc_by(n as u64);
                        continue;
                    }
                    Err(e) => {
                        metrics.failures.inc();
                        tracing::warn!(error = %e, "session expiry sweep failed");
                        config.retry
                    }
                }
            }
            Ok(next) => {
                known = Some(next);
                sleep_until(Timestamp::now(), next, config.max_sleep)
            }
            Err(e) => {
                known = None;
                metrics.failures.inc();
                tracing::warn!(error = %e, "reading the next session expiry failed");
                config.retry
            }
        };
        tokio::select! {
            // Read again after every sleep: writes on other replicas (and deletions here)
            // are seen only by reading.
            () = tokio::time::sleep(pause) => known = None,
            written = signals.written() => {
                if let (Some(next), Some(at)) = (known.as_mut(), written) {
                    crate::store::fold_earliest(next, at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn t0() -> Timestamp {
        "2026-12-01T07:00:00Z".parse().unwrap()
    }

    #[test]
    fn sleeps_until_the_next_expiry_capped() {
        let max = Duration::from_secs(5);
        assert_eq!(sleep_until(t0(), None, max), max);
        let soon = t0() + SignedDuration::from_millis(1500);
        assert_eq!(
            sleep_until(t0(), Some(soon), max),
            Duration::from_millis(1500)
        );
        let late = t0() + SignedDuration::from_secs(3600);
        assert_eq!(sleep_until(t0(), Some(late), max), max);
        let past = t0() - SignedDuration::from_secs(3);
        assert_eq!(sleep_until(t0(), Some(past), max), Duration::ZERO);
    }
}
