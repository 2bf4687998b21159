//! [`SessionCache`]: a live, server-scoped snapshot of AccessSessions kept by list+watch, and
//! the decisions and subscriptions a gateway takes from it.
//!
//! The sync loop owns every write to the state. Its contract:
//! - a complete list replaces the snapshot and grants authority; the watch then resumes from
//!   the list's resourceVersion, asking for bookmarks, and each event or bookmark renews
//!   freshness;
//! - each bookmark carries the change log's head: behind it, the cache answers for at most
//!   the lag bound (`max_lag`) unless it catches up (`state.rs`);
//! - a watch that brings nothing, not even a bookmark, for three bookmark intervals (the
//!   server states its interval on each bookmark) is dropped and resumed: a half-open
//!   connection is noticed in seconds, not at the read timeout;
//! - a 401 or 403 on any request (list, watch, get-on-miss) drops the snapshot at once and
//!   relists without delay (the token file is read again);
//! - a 410 Expired whose cause is a new epoch (a restored database: the history itself is
//!   gone) drops the snapshot too; any other 410 (this watcher fell behind, the log was trimmed
//!   past it) keeps it under the lag bound. Either way the relist waits a random part of half
//!   the lag bound, so that a fleet cut off at once does not relist at once;
//! - any other failure (a stalled feed among them: it sends no 410) keeps the snapshot, which
//!   then ages out through the stale window (last-known-good).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use apis::validation::{is_dns1123_label, is_dns1123_subdomain};
use apis::AccessSession;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use crate::client;
use crate::config::{CacheConfig, Clock};
use crate::decision::{evaluate, expires_at, Decision, DenyReason};
use crate::metrics::{CacheMetrics, SyncAgeSource};
use crate::state::{Key, Lookup, State};

/// A session cache. Cheap to clone; every clone shares one snapshot.
#[derive(Clone)]
pub struct SessionCache {
    shared: Arc<Shared>,
}

/// The sync loop of a [`SessionCache`]. Its owner watches it (it only ends by panicking) and
/// dropping it stops syncing, after which the cache goes stale and denies: fail closed.
#[must_use = "dropping the sync task stops the cache from syncing"]
pub struct SyncTask(JoinHandle<()>);

impl Future for SyncTask {
    type Output = Result<(), JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl Drop for SyncTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A snapshot of the cache's sync state, for readiness checks, logs and tests.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncStatus {
    /// A complete list is held and fresh: decisions are taken from the snapshot.
    pub ready: bool,
    /// Sessions in the snapshot.
    pub sessions: usize,
    /// Where the watch resumes; its epoch changes when the apiserver restarts.
    pub resource_version: Option<String>,
    /// Seconds since the last proof of being caught up; -1 without authority.
    pub sync_age_seconds: f64,
}

struct Shared {
    state: RwLock<State>,
    /// The state's generation after each change every subscriber must see: a new snapshot,
    /// authority dropped or regained.
    changes: watch::Sender<u64>,
    /// Per session, the generation after each change of that session alone (a watch event):
    /// only its own subscribers wake, so one revocation of many sessions costs each open
    /// stream one wake-up, not one per revoked session. Entries live while subscribed.
    session_changes: Mutex<HashMap<Key, watch::Sender<u64>>>,
    /// Bumped when a request outside the sync loop (get-on-miss) dropped authority, so the
    /// loop abandons its watch and relists.
    invalidated: watch::Sender<u64>,
    /// Replaced when a watch went quiet: its idle pooled connections may be as dead as the
    /// watch's, and a new request must not wait on one of them.
    client: RwLock<kube::Client>,
    /// What the client is built from.
    config: CacheConfig,
    window: Duration,
    /// The bookmark interval the server last stated, in milliseconds.
    bookmark_interval_ms: AtomicU64,
    watch_timeout: Duration,
    retry_max: Duration,
    misses: Semaphore,
    clock: Clock,
    metrics: CacheMetrics,
}

/// What the sync loop does after a failed request.
#[derive(Debug, PartialEq, Eq)]
enum After {
    /// Authority was dropped for the credentials: relist (the first time without waiting).
    Relist,
    /// A 410: relist after a random pause (a fleet cut off at once must not relist at once).
    RelistSpread,
    /// Transient: keep the snapshot, wait, try again.
    Retry,
}

/// The bookmark interval assumed until the server states one (the apiserver's default).
const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);
/// Bookmark intervals without a word after which a watch is dropped and resumed.
const QUIET_INTERVALS: u32 = 3;

/// Whether a 410's Status says the epoch changed (`apis::feed::EPOCH_CHANGED_CAUSE`).
fn epoch_changed(status: &kube::core::Status) -> bool {
    status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == apis::feed::EPOCH_CHANGED_CAUSE)
    })
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-written in a way that
        // grants more than before (every method finishes its writes before returning), so a
        // poisoned lock is still read.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `f`; wakes subscribers (and [`SessionCache::ready`]) when the snapshot changed
    /// or when it regained authority: a bookmark after an outage changes no session, yet a
    /// stale cache is fresh again.
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let now = Instant::now();
        let mut st = self.write();
        let before = st.generation();
        let had_authority = st.authority(now, self.window).is_ok();
        let result = f(&mut st);
        let after = st.generation();
        let regained = !had_authority && st.authority(now, self.window).is_ok();
        drop(st);
        if after != before || regained {
            self.changes.send_replace(after);
        }
        result
    }

    /// [`Shared::update`] for a change of the session `key` alone: wakes that session's
    /// subscribers, and everyone only when authority was regained.
    fn update_session<R>(&self, key: Key, f: impl FnOnce(&mut State) -> R) -> R {
        let now = Instant::now();
        let mut st = self.write();
        let before = st.generation();
        let had_authority = st.authority(now, self.window).is_ok();
        let result = f(&mut st);
        let after = st.generation();
        let regained = !had_authority && st.authority(now, self.window).is_ok();
        drop(st);
        if regained {
            self.changes.send_replace(after);
        } else if after != before {
            let mut subscribed = self.session_changes();
            if let Some(sender) = subscribed.get(&key) {
                if sender.receiver_count() == 0 {
                    subscribed.remove(&key);
                } else {
                    sender.send_replace(after);
                }
            }
        }
        result
    }

    fn session_changes(&self) -> std::sync::MutexGuard<'_, HashMap<Key, watch::Sender<u64>>> {
        self.session_changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver of `key`'s own changes (see [`Shared::session_changes`]).
    fn subscribe_session(&self, key: Key) -> watch::Receiver<u64> {
        let mut subscribed = self.session_changes();
        // Entries of sessions nobody watches any more go as the map doubles (amortized O(1)).
        if subscribed.len() >= 64 && subscribed.len().is_power_of_two() {
            subscribed.retain(|_, sender| sender.receiver_count() > 0);
        }
        subscribed
            .entry(key)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn invalidate(&self, why: &str) {
        tracing::warn!(reason = why, "session authority dropped; relisting");
        self.metrics.invalidations.inc();
        self.update(State::invalidate);
    }

    /// Classifies a failed request, dropping authority on 401/403/410.
    fn on_error(&self, what: &str, err: &kube::Error) -> After {
        match err {
            kube::Error::Api(status) if matches!(status.code, 401 | 403) => {
                self.invalidate(if status.code == 401 {
                    "401 Unauthorized"
                } else {
                    "403 Forbidden"
                });
                After::Relist
            }
            kube::Error::Api(status) if status.code == 410 && epoch_changed(status) => {
                self.invalidate("410 Expired: a new epoch (the change history was reset)");
                After::RelistSpread
            }
            kube::Error::Api(status) if status.code == 410 => {
                tracing::warn!(
                    max_lag = ?self.config.max_lag,
                    message = %status.message,
                    "410 Expired: changes were missed; relisting, answering meanwhile for at most the lag bound"
                );
                self.metrics.missed.inc();
                self.update(|st| st.missed_changes(Instant::now()));
                After::RelistSpread
            }
            other => {
                tracing::warn!(request = what, error = %other, "session feed request failed");
                After::Retry
            }
        }
    }

    fn client(&self) -> kube::Client {
        self.client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn api(&self) -> Api<AccessSession> {
        Api::all(self.client())
    }

    /// A watch brought nothing for three bookmark intervals: the connection is taken for dead,
    /// and with it every idle connection of the pool (a lost flow at a NAT or a middlebox
    /// takes them all), so the next request opens a new one.
    fn quiet_watch(&self, quiet: Duration, what: &str) {
        tracing::warn!(quiet = ?quiet, "{what}; resuming on a new connection");
        self.metrics.quiet_watches.inc();
        match client::build(&self.config) {
            Ok(fresh) => *self.client.write().unwrap_or_else(|e| e.into_inner()) = fresh,
            Err(e) => {
                tracing::warn!(error = %e, "cannot rebuild the feed client; keeping the old one")
            }
        }
    }

    /// The pause before a relist after a 410 is a random part of this: half the lag bound,
    /// so that a snapshot kept under it is replaced in time.
    fn relist_spread(&self) -> Duration {
        self.config.max_lag / 2
    }

    /// How long a watch may bring nothing before it is dropped and resumed.
    fn quiet_limit(&self) -> Duration {
        Duration::from_millis(self.bookmark_interval_ms.load(Ordering::Relaxed)) * QUIET_INTERVALS
    }

    /// Records the interval a bookmark states (bounded: a server cannot make the watchdog
    /// fire constantly or never).
    fn learn_bookmark_interval(&self, stated: Option<&str>) {
        let Some(ms) = stated.and_then(|v| v.parse::<u64>().ok()) else {
            return;
        };
        self.bookmark_interval_ms
            .store(ms.clamp(100, 300_000), Ordering::Relaxed);
    }
}

impl SyncAgeSource for Shared {
    fn sync_age_seconds(&self) -> f64 {
        self.read().sync_age_seconds(Instant::now())
    }

    fn lag(&self) -> crate::state::Lag {
        self.read().lag(Instant::now())
    }
}

impl SessionCache {
    /// Validates the configuration (fail closed) and starts syncing. Decisions are
    /// `sync_not_ready` until the first complete list.
    pub fn start(config: CacheConfig) -> Result<(Self, SyncTask), crate::CacheError> {
        Self::start_with_metrics(config, CacheMetrics::default())
    }

    /// [`SessionCache::start`], recording into `metrics`.
    ///
    /// `SESSION_SYNC_STALE_WINDOW`, when set, is honoured here too (an operator's way to
    /// shorten the window of any gateway): the shorter of it and the configured window wins,
    /// and a malformed value refuses to start.
    pub fn start_with_metrics(
        mut config: CacheConfig,
        metrics: CacheMetrics,
    ) -> Result<(Self, SyncTask), crate::CacheError> {
        if let Ok(raw) = std::env::var(crate::config::STALE_WINDOW_ENV) {
            let from_env =
                crate::config::parse_stale_window(&raw).map_err(crate::CacheError::StaleWindow)?;
            config.stale_window = config.stale_window.min(from_env);
        }
        if config.stale_window.is_zero() || config.stale_window > crate::config::MAX_STALE_WINDOW {
            return Err(crate::CacheError::StaleWindow(format!(
                "{:?} is outside (0, 10m]",
                config.stale_window
            )));
        }
        if config.max_lag.is_zero() || config.max_lag > config.stale_window {
            return Err(crate::CacheError::MaxLag(format!(
                "{:?} is outside (0, the stale window {:?}]",
                config.max_lag, config.stale_window
            )));
        }
        let client = client::build(&config)?;
        let shared = Arc::new(Shared {
            state: RwLock::new(State::new(config.max_lag)),
            changes: watch::channel(0).0,
            session_changes: Mutex::new(HashMap::new()),
            invalidated: watch::channel(0).0,
            client: RwLock::new(client),
            config: config.clone(),
            window: config.stale_window,
            bookmark_interval_ms: AtomicU64::new(DEFAULT_BOOKMARK_INTERVAL.as_millis() as u64),
            watch_timeout: config.watch_timeout.max(Duration::from_secs(1)),
            retry_max: config.retry_max.max(Duration::from_millis(100)),
            misses: Semaphore::new(config.miss_concurrency),
            clock: config.clock,
            metrics,
        });
        shared.metrics.sync_age.attach(shared.clone());
        let span = tracing::info_span!("session_sync", sync_url = %config.sync_url);
        let task = tokio::spawn(tracing::Instrument::instrument(
            sync_loop(shared.clone()),
            span,
        ));
        Ok((Self { shared }, SyncTask(task)))
    }

    /// The decision for `ns/name` at `now`, taken from the snapshot on every call.
    pub async fn authorize(&self, ns: &str, name: &str, now: Timestamp) -> Decision {
        self.decide(ns, name, now).await.0
    }

    /// The decision for `ns/name` at `now` and the session object it was taken from (absent
    /// when the cache has no authority or no such session), for callers that must check the
    /// session's UIDs against a credential ([`crate::credential::admit`]).
    pub async fn authorize_session(
        &self,
        ns: &str,
        name: &str,
        now: Timestamp,
    ) -> (Decision, Option<Arc<AccessSession>>) {
        self.decide(ns, name, now).await
    }

    /// The decision and the session object it was taken from.
    async fn decide(
        &self,
        ns: &str,
        name: &str,
        now: Timestamp,
    ) -> (Decision, Option<Arc<AccessSession>>) {
        let lookup = self
            .shared
            .read()
            .lookup(ns, name, Instant::now(), self.shared.window);
        match lookup {
            Lookup::Denied(reason) => (Decision::Deny(reason), None),
            Lookup::Found(s) => (evaluate(&s, now), Some(s)),
            // Without a known server UID a fetched object could not be checked: not trusted.
            Lookup::Missing { server_uid: None } => {
                (Decision::Deny(DenyReason::SessionNotFound), None)
            }
            Lookup::Missing {
                server_uid: Some(uid),
            } => self.get_on_miss(ns, name, &uid, now).await,
        }
    }

    /// A session created after the last event may not have reached the watch yet: fetch it by
    /// name. The answer is used for this decision only; it neither enters the snapshot nor
    /// renews freshness (a get says nothing about the other sessions).
    async fn get_on_miss(
        &self,
        ns: &str,
        name: &str,
        server_uid: &str,
        now: Timestamp,
    ) -> (Decision, Option<Arc<AccessSession>>) {
        let not_found = (Decision::Deny(DenyReason::SessionNotFound), None);
        // Names go into the URL path: only what Kubernetes accepts as names is sent.
        if !is_dns1123_label(ns) || !is_dns1123_subdomain(name) {
            return not_found;
        }
        let Ok(_permit) = self.shared.misses.try_acquire() else {
            return not_found;
        };
        let api: Api<AccessSession> = Api::namespaced(self.shared.client(), ns);
        let fetched = match api.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => return not_found,
            Err(e) => {
                if self.shared.on_error("get", &e) == After::Relist {
                    self.shared.invalidated.send_modify(|n| *n += 1);
                    return (Decision::Deny(DenyReason::SyncNotReady), None);
                }
                return not_found;
            }
        };
        // The snapshot may have moved while the request was out: it wins if it can answer.
        match self
            .shared
            .read()
            .lookup(ns, name, Instant::now(), self.shared.window)
        {
            Lookup::Denied(reason) => return (Decision::Deny(reason), None),
            Lookup::Found(s) => return (evaluate(&s, now), Some(s)),
            Lookup::Missing { .. } => {}
        }
        let same_object = fetched.metadata.namespace.as_deref() == Some(ns)
            && fetched.metadata.name.as_deref() == Some(name)
            && fetched.spec.server.uid == server_uid;
        if !same_object {
            return not_found;
        }
        let fetched = Arc::new(fetched);
        (evaluate(&fetched, now), Some(fetched))
    }

    /// Resolves with the reason the moment `ns/name` stops being usable: revoked, deleted,
    /// expired, or the cache lost authority (invalidated or stale). Resolves at once if it is
    /// not usable now. Cancel-safe: drop it to stop watching.
    pub fn subscribe(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = DenyReason> + Send + 'static {
        let cache = self.clone();
        let (ns, name) = (ns.to_string(), name.to_string());
        let mut changes = self.shared.changes.subscribe();
        let mut own_changes = self.shared.subscribe_session((ns.clone(), name.clone()));
        async move {
            loop {
                changes.borrow_and_update();
                own_changes.borrow_and_update();
                let now = (cache.shared.clock)();
                let (decision, session) = cache.decide(&ns, &name, now).await;
                if let Decision::Deny(reason) = decision {
                    return reason;
                }
                let stale_at = cache.shared.read().stale_at(cache.shared.window);
                // Wake at expiry by the wall clock (re-checked on waking: the clock rules).
                let until_expiry = session
                    .as_deref()
                    .and_then(expires_at)
                    .map(|at| {
                        let left = at.duration_since(now);
                        Duration::try_from(left).unwrap_or(Duration::ZERO)
                    })
                    .unwrap_or(Duration::ZERO)
                    .min(Duration::from_secs(3600));
                let stale = async {
                    match stale_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return DenyReason::SyncNotReady;
                        }
                    }
                    changed = own_changes.changed() => {
                        if changed.is_err() {
                            return DenyReason::SyncNotReady;
                        }
                    }
                    _ = stale => {}
                    _ = tokio::time::sleep(until_expiry + Duration::from_millis(1)) => {}
                }
            }
        }
    }

    /// Whether decisions are being taken from a fresh snapshot.
    pub fn is_ready(&self) -> bool {
        self.shared
            .read()
            .authority(Instant::now(), self.shared.window)
            .is_ok()
    }

    /// Waits until the cache holds a complete, fresh list.
    pub async fn ready(&self) {
        let mut changes = self.shared.changes.subscribe();
        while !self.is_ready() {
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Where the sync stands now.
    pub fn status(&self) -> SyncStatus {
        let st = self.shared.read();
        let now = Instant::now();
        SyncStatus {
            ready: st.authority(now, self.shared.window).is_ok(),
            sessions: st.len(),
            resource_version: st.resource_version().map(str::to_string),
            sync_age_seconds: st.sync_age_seconds(now),
        }
    }

    /// The stale window in force.
    pub fn stale_window(&self) -> Duration {
        self.shared.window
    }
}

/// Exponential backoff between reconnections, with jitter so that many gateways cut off by one
/// apiserver restart do not come back in lockstep.
struct Backoff {
    next: Duration,
    max: Duration,
    /// The next wait is skipped (after authority was dropped: the token may have rotated).
    immediate: bool,
    /// The skip was used since the last success: a persistent failure backs off.
    skipped: bool,
    /// The next wait is a random part of this instead (a relist after a 410).
    spread: Option<Duration>,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);

    fn new(max: Duration) -> Self {
        Self {
            next: Self::MIN,
            max,
            immediate: false,
            skipped: false,
            spread: None,
        }
    }

    fn reset(&mut self) {
        self.next = Self::MIN;
        self.immediate = false;
        self.skipped = false;
        self.spread = None;
    }

    /// The next attempt goes out after a random part of `over`.
    fn spread_over(&mut self, over: Duration) {
        self.immediate = false;
        self.spread = Some(over);
    }

    /// Sets up the wait before the relist `after` asks for (a 410's spread over `spread`);
    /// false when it asks for none.
    fn relist_after(&mut self, after: &After, spread: Duration) -> bool {
        match after {
            After::Relist => self.retry_now(),
            After::RelistSpread => self.spread_over(spread),
            After::Retry => return false,
        }
        true
    }

    /// The next attempt goes out at once, unless that was already tried since the last success.
    fn retry_now(&mut self) {
        if !self.skipped {
            self.immediate = true;
            self.skipped = true;
        }
    }

    async fn wait(&mut self) {
        if let Some(over) = self.spread.take() {
            tokio::time::sleep(over.mul_f64(rand::random_range(0.0..1.0))).await;
            return;
        }
        if std::mem::take(&mut self.immediate) {
            return;
        }
        let jitter = rand::random_range(0.5..1.0);
        tokio::time::sleep(self.next.mul_f64(jitter)).await;
        self.next = (self.next * 2).min(self.max);
    }
}

/// Lists, then watches from the list's resourceVersion, forever.
async fn sync_loop(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(shared.retry_max);
    let mut invalidated = shared.invalidated.subscribe();
    loop {
        invalidated.borrow_and_update();
        let list = match shared.api().list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                backoff.relist_after(&shared.on_error("list", &e), shared.relist_spread());
                backoff.wait().await;
                continue;
            }
        };
        shared.metrics.relists.inc();
        let rv = list.metadata.resource_version.clone();
        let count = list.items.len();
        let revoked = shared.update(|st| st.replace(list.items, rv, Instant::now()));
        let applied_at = (shared.clock)();
        for revoked_at in revoked {
            shared.metrics.revocation_applied(revoked_at, applied_at);
        }
        tracing::info!(sessions = count, "session snapshot listed");
        backoff.reset();

        // Watch until authority is dropped (then relist).
        'watch: loop {
            let Some(rv) = shared.read().resource_version().map(str::to_string) else {
                break 'watch;
            };
            let timeout = u32::try_from(shared.watch_timeout.as_secs()).unwrap_or(290);
            let mut params = WatchParams::default().timeout(timeout);
            params.bookmarks = true;
            // Bounded like the stream itself: a server that accepts the connection and then
            // says nothing would otherwise hold the cache here until the read timeout.
            let quiet = shared.quiet_limit();
            let api = shared.api();
            let stream = tokio::select! {
                stream = api.watch(&params, &rv) => stream,
                _ = invalidated.changed() => {
                    backoff.retry_now();
                    break 'watch;
                }
                _ = tokio::time::sleep(quiet) => {
                    shared.quiet_watch(quiet, "session watch not answered");
                    backoff.wait().await;
                    continue 'watch;
                }
            };
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    if backoff.relist_after(&shared.on_error("watch", &e), shared.relist_spread()) {
                        break 'watch;
                    }
                    backoff.wait().await;
                    continue 'watch;
                }
            };
            let mut stream = std::pin::pin!(stream);
            let mut delivered = false;
            loop {
                let quiet = shared.quiet_limit();
                let item = tokio::select! {
                    item = stream.next() => item,
                    _ = invalidated.changed() => {
                        backoff.retry_now();
                        break 'watch;
                    }
                    // Not even a bookmark: a half-open connection, or a feed that cannot vouch
                    // for being current. Resume from where the cache stands (the snapshot is
                    // kept; last-known-good ages it out if this goes on).
                    _ = tokio::time::sleep(quiet) => {
                        shared.quiet_watch(quiet, "session watch brought nothing, not even a bookmark");
                        continue 'watch;
                    }
                };
                match item {
                    // The server ended the watch (timeoutSeconds): resume where it stopped. A
                    // watch that ends with nothing in it is not allowed to spin.
                    None => {
                        if !delivered {
                            backoff.wait().await;
                        }
                        continue 'watch;
                    }
                    Some(Ok(event)) => {
                        delivered = true;
                        if backoff.relist_after(&apply(&shared, event), shared.relist_spread()) {
                            break 'watch;
                        }
                        backoff.reset();
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "session watch broke; resuming");
                        backoff.wait().await;
                        continue 'watch;
                    }
                }
            }
        }
        backoff.wait().await;
    }
}

/// Applies one watch event; `Relist` when it dropped authority.
fn apply(shared: &Shared, event: WatchEvent<AccessSession>) -> After {
    let now = Instant::now();
    match event {
        WatchEvent::Added(s) | WatchEvent::Modified(s) => {
            let key = crate::state::key_of(&s);
            if let Some(revoked_at) = shared.update_session(key, |st| st.upsert(s, now)) {
                shared
                    .metrics
                    .revocation_applied(revoked_at, (shared.clock)());
            }
        }
        WatchEvent::Deleted(s) => {
            shared.update_session(crate::state::key_of(&s), |st| st.remove(&s, now))
        }
        WatchEvent::Bookmark(b) => {
            let annotations = &b.metadata.annotations;
            shared.learn_bookmark_interval(
                annotations
                    .get(apis::feed::BOOKMARK_INTERVAL_ANNOTATION)
                    .map(String::as_str),
            );
            let head = annotations
                .get(apis::feed::HEAD_ANNOTATION)
                .map(String::as_str);
            shared.update(|st| st.bookmark(Some(b.metadata.resource_version), head, now));
        }
        WatchEvent::Error(status) => {
            let err = kube::Error::Api(status);
            // Any ERROR that drops nothing ends this watch all the same; resuming from the
            // last position is safe.
            return shared.on_error("watch event", &err);
        }
    }
    After::Retry
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 410 an epoch change ends a watch with, as the apiserver writes it, and the one of a
    /// watcher that fell behind.
    #[test]
    fn a_410_names_an_epoch_change_only_by_its_cause() {
        let epoch: kube::core::Status = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Status","code":410,"reason":"Expired","status":"Failure",
                "message":"too old resource version: the change history was reset",
                "details":{"causes":[{"message":"the change history was reset (a new epoch)",
                                      "reason":"EpochChanged"}]},"metadata":{}}"#,
        )
        .unwrap();
        assert!(epoch_changed(&epoch));
        let behind: kube::core::Status = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Status","code":410,"reason":"Expired","status":"Failure",
                "message":"too old resource version: 7: the watcher fell behind and must relist",
                "metadata":{}}"#,
        )
        .unwrap();
        assert!(!epoch_changed(&behind));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spread_relist_waits_a_random_part_of_the_spread_once() {
        let mut backoff = Backoff::new(Duration::from_secs(5));
        backoff.spread_over(Duration::from_secs(1));
        let started = Instant::now();
        backoff.wait().await;
        assert!(started.elapsed() < Duration::from_secs(1));
        // The next wait is the ordinary backoff again.
        let started = Instant::now();
        backoff.wait().await;
        assert!(started.elapsed() >= Backoff::MIN / 2);
    }
}
