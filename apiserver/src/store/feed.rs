//! The change feed: one reader per process tails the change log after every `NOTIFY` (and on
//! a slow timer as a safety net), keeps a ring of recent events, and fans them out in memory
//! to subscribers through bounded queues.
//!
//! A subscriber that starts behind replays from the log page by page, then attaches to the
//! live fan-out once the ring covers its cursor. A subscriber whose queue fills up is cut off
//! and sees `Expired`: events are never skipped silently. An epoch rotation expires everyone.
//! The ring and every page are bounded by bytes as well as by count.
//!
//! The feed proves it is alive. A heartbeat reads the database's sequence head from a pool
//! connection at least every second; the head counts as confirmed once the reader has fanned
//! out everything up to it. The reader's own queries carry timeouts and it must complete a
//! round trip regularly. If either proof is older than the staleness bound (a stopped or
//! half-open LISTEN connection, an unreachable database), every subscriber is cut off with
//! `Expired`, no bookmark is given at a cursor that can no longer be vouched for, and new
//! subscriptions are refused (`Unavailable`) until both proofs are fresh again: a watcher
//! never mistakes a silent feed for a quiet one.
//!
//! The feed also remembers how far the history went, which is what tells a running replica
//! that the database behind it was replaced by an older copy (see `epoch.rs`): the head going
//! back in the same epoch, the event at its head changed, an epoch it already left coming
//! back, sync_state recreated, the operator's marker, or (on every reconnect) the database's
//! identity. It then rotates the epoch itself; every replica's watchers relist, told why.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, Notify};
use tokio_postgres::{AsyncMessage, Row};

use super::connect::PgTls;
use super::rv::ResourceVersion;
use super::{Result, StoreError};

/// The channel every committing transaction notifies.
pub(super) const CHANNEL: &str = "mcp_access_changes";
/// Rows read from the log per query.
const PAGE: i64 = 1000;
/// The application_name of the LISTEN connection (operators and tests find it by this).
pub const FEED_APPLICATION_NAME: &str = "mcp-access-feed";
/// The application_name of the heartbeat's connection.
const HEARTBEAT_APPLICATION_NAME: &str = "mcp-access-feed-heartbeat";

/// Watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    fn parse(s: &str) -> Result<Self> {
        match s {
            "ADDED" => Ok(Self::Added),
            "MODIFIED" => Ok(Self::Modified),
            "DELETED" => Ok(Self::Deleted),
            other => Err(StoreError::Internal(format!(
                "unknown change type {other:?}"
            ))),
        }
    }

    /// The watch wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Clone, Debug)]
pub struct Event {
    /// Its resourceVersion (also in `object.metadata.resourceVersion`).
    pub rv: ResourceVersion,
    pub event_type: EventType,
    /// Plural resource name.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The object after the change; for DELETED, its last state.
    pub object: serde_json::Value,
    /// The object before the change (none for ADDED). Watches with selectors use it to
    /// turn a MODIFIED that enters or leaves the selection into ADDED or DELETED.
    pub before: Option<serde_json::Value>,
    /// Encoded renderings of this event, made once and shared by every watcher.
    pub rendered: EventRenderings,
    /// Encoded size of `object` and `before` in bytes, what the ring and pages are bounded by.
    pub size: usize,
}

/// Lazily encoded forms of one event, keyed by rendering.
#[derive(Debug, Default)]
pub struct EventRenderings {
    pub json: std::sync::OnceLock<bytes::Bytes>,
    pub metadata: std::sync::OnceLock<bytes::Bytes>,
    pub table_row: std::sync::OnceLock<bytes::Bytes>,
}

impl Clone for EventRenderings {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Event {
    pub fn seq(&self) -> u64 {
        self.rv.seq
    }

    fn from_row(epoch: u32, row: &Row) -> Result<Self> {
        let seq: i64 = row.get("seq");
        let rv = ResourceVersion::new(epoch, seq as u64);
        let mut object: serde_json::Value = row.get("object");
        set_resource_version(&mut object, rv);
        Ok(Self {
            rv,
            event_type: EventType::parse(row.get("event"))?,
            resource: row.get("resource"),
            namespace: row.get("namespace"),
            name: row.get("name"),
            object,
            before: row.get("before"),
            rendered: EventRenderings::default(),
            size: row.get::<_, i64>("size").max(0) as usize,
        })
    }
}

/// Writes `metadata.resourceVersion` into a stored body.
pub(super) fn set_resource_version(object: &mut serde_json::Value, rv: ResourceVersion) {
    if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.insert(
            "resourceVersion".into(),
            serde_json::Value::String(rv.to_string()),
        );
    }
}

/// One page of the log after `$1`: at most `$2` rows and, past the first row, at most `$3`
/// bytes. Always carries the current epoch (one row with NULL columns when the page is empty).
const PAGE_SQL: &str = "SELECT s.epoch, s.seq AS db_seq, s.epoch_seq, s.rotate_requested,
       s.tableoid AS table_oid, s.epoch_table, c.*
  FROM sync_state s LEFT JOIN LATERAL (
    SELECT seq, resource, namespace, name, event, object, before, size FROM (
        SELECT l.*, sum(l.size) OVER (ORDER BY l.seq) AS running,
               row_number() OVER (ORDER BY l.seq) AS n
          FROM (SELECT seq, resource, namespace, name, event, object, before,
                       octet_length(object::text)::bigint
                         + coalesce(octet_length(before::text), 0)::bigint AS size
                  FROM change_log WHERE seq > $1 ORDER BY seq LIMIT $2) l
    ) w WHERE w.running <= $3::bigint OR w.n = 1 ORDER BY seq
) c ON true WHERE s.id = 1";

/// Sizes and the liveness bound of the feed.
#[derive(Clone, Copy, Debug)]
pub(super) struct FeedLimits {
    /// Queue length of each live subscriber.
    pub buffer: usize,
    /// Events kept in memory for subscribers that attach slightly behind.
    pub ring_capacity: usize,
    /// Total encoded bytes the ring may hold (it always holds the newest event).
    pub ring_bytes: usize,
    /// Encoded bytes per page read from the log (a page always holds at least one row).
    pub page_bytes: usize,
    /// How long the feed may go without proving it is current before every subscriber is
    /// cut off.
    pub staleness_bound: Duration,
}

impl FeedLimits {
    /// The reader looks at the log at least this often, notified or not.
    fn poll_interval(&self) -> Duration {
        (self.staleness_bound / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
    /// The heartbeat confirms the database head at least this often.
    fn heartbeat_interval(&self) -> Duration {
        self.poll_interval()
    }
    /// The reader's own queries and reconnects. Longer than the bound on purpose: a stalled
    /// reader is reported as stale (everyone cut off) before it quietly heals, never after.
    fn reader_timeout(&self) -> Duration {
        self.staleness_bound * 2
    }
    fn check_interval(&self) -> Duration {
        (self.staleness_bound / 20).clamp(Duration::from_millis(20), Duration::from_millis(250))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutoffLabels {
    reason: &'static str,
}

/// Why the feed cut subscribers off (the `reason` label).
const CUT_SLOW_CONSUMER: &str = "slow_consumer";
const CUT_STALLED: &str = "stalled";
const CUT_EPOCH_ROTATED: &str = "epoch_rotated";
const CUT_BEHIND_RETENTION: &str = "behind_retention";

/// What the feed reports about itself: where it is, how far behind the database it may be,
/// and whom it had to cut off. Refreshed by the liveness check (a few times a second).
#[derive(Clone, Debug, Default)]
pub struct FeedMetrics {
    head: Gauge,
    lag_events: Gauge,
    lag_seconds: Gauge<f64, AtomicU64>,
    live: Gauge,
    subscribers: Gauge,
    cutoffs: Family<CutoffLabels, Counter>,
}

impl FeedMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for reason in [
            CUT_SLOW_CONSUMER,
            CUT_STALLED,
            CUT_EPOCH_ROTATED,
            CUT_BEHIND_RETENTION,
        ] {
            let _ = self.cutoffs.get_or_create(&CutoffLabels { reason });
        }
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver_change_feed");
        sub.register(
            "head",
            "Sequence number of the last change fanned out to watchers",
            self.head.clone(),
        );
        sub.register(
            "lag_events",
            "Changes the heartbeat saw committed that the feed has not fanned out yet",
            self.lag_events.clone(),
        );
        sub.register_with_unit(
            "lag",
            "Time since the feed last proved it had fanned out everything committed",
            prometheus_client::registry::Unit::Seconds,
            self.lag_seconds.clone(),
        );
        sub.register(
            "live",
            "1 while the feed can vouch for being current (readiness), else 0",
            self.live.clone(),
        );
        sub.register(
            "subscribers",
            "Live subscriptions (watches) attached to the feed",
            self.subscribers.clone(),
        );
        sub.register(
            "cutoffs",
            "Subscribers the feed ended with Expired, by reason",
            self.cutoffs.clone(),
        );
    }

    fn cut(&self, reason: &'static str, subscribers: usize) {
        if subscribers > 0 {
            self.cutoffs
                .get_or_create(&CutoffLabels { reason })
                .inc_by(subscribers as u64);
        }
    }

    fn observe(&self, state: &State, now: Instant, bound: Duration) {
        self.head.set(i64::try_from(state.head).unwrap_or(i64::MAX));
        let db_head = state
            .liveness
            .pending
            .iter()
            .filter(|(epoch, _, _)| *epoch == state.epoch)
            .map(|(_, seq, _)| *seq)
            .max()
            .unwrap_or(state.head);
        self.lag_events
            .set(i64::try_from(db_head.saturating_sub(state.head)).unwrap_or(i64::MAX));
        self.lag_seconds.set(
            now.saturating_duration_since(state.liveness.confirmed_at)
                .as_secs_f64(),
        );
        self.live.set(i64::from(state.is_live(now, bound)));
        self.subscribers
            .set(i64::try_from(state.subscribers.len()).unwrap_or(i64::MAX));
    }
}

/// Shared state of the feed.
pub(super) struct Feed {
    state: Mutex<State>,
    pool: deadpool_postgres::Pool,
    limits: FeedLimits,
    /// Woken by the LISTEN connection.
    wake: Notify,
    /// The epoch the reader follows, for subscriptions waiting for it to switch.
    epochs: tokio::sync::watch::Sender<u32>,
    metrics: FeedMetrics,
}

struct State {
    epoch: u32,
    /// Last sequence fanned out.
    head: u64,
    ring: VecDeque<Arc<Event>>,
    /// Sum of `size` over the ring.
    ring_bytes: usize,
    subscribers: Vec<Slot>,
    liveness: Liveness,
    /// Epochs this reader has left: a subscription at one of them is expired at once.
    retired: Vec<u32>,
    /// The last event fanned out in this epoch: on reconnect the log must still hold it.
    last: Option<Arc<Event>>,
    /// The furthest point of the history this process has handed out to clients, by any
    /// path (writes acknowledged, lists read, events fanned out): `(epoch, seq)`. A database
    /// behind it in the same epoch is an older copy, even when this reader never saw that
    /// far (it was disconnected while the others went on).
    seen: Option<(u32, u64)>,
    /// A history reset noticed outside the reader (by a write or a list): rotate this epoch.
    reset_requested: Option<(u32, String)>,
}

/// A point of the history taken before a database read: [`Feed::went_back`] compares what
/// the read found with it. Taken before, so that a change committed while the read ran (and
/// observed meanwhile) never looks like one the database lost.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark(u32, u64);

/// What the feed can vouch for.
struct Liveness {
    /// Set while a proof is older than the bound; cleared once both are fresh again.
    stale: bool,
    /// How many times the feed went stale: a subscription made before a cut is expired.
    cuts: u64,
    /// When the reader last sent a query that completed.
    reader_ok_at: Instant,
    /// The latest moment up to which everything committed is known to be fanned out.
    confirmed_at: Instant,
    /// Heads read by the heartbeat that the reader has not reached yet: (epoch, seq, when).
    pending: VecDeque<(u32, u64, Instant)>,
}

struct Slot {
    tx: mpsc::Sender<Arc<Event>>,
    after: u64,
    cut_off: Arc<AtomicU8>,
}

/// Why a live subscriber was cut off (`Slot::cut_off`; 0 while it is not).
const LIVE: u8 = 0;
const CUT_SLOW: u8 = 1;
const CUT_RESET: u8 = 2;
const CUT_RETENTION: u8 = 3;
const CUT_STALL: u8 = 4;

/// What the reader concluded from one page.
enum Page {
    /// Events fanned out; `more` when the log holds more than the page did as of its read
    /// (read the next page at once; an epoch switch asks for it too). Otherwise the reader
    /// waits for the next commit's notification.
    Published { more: bool },
    /// The history in the database is not the one this reader followed: rotate `epoch`.
    Reset { epoch: u32, reason: String },
}

impl Feed {
    pub(super) fn new(
        pool: deadpool_postgres::Pool,
        epoch: u32,
        head: u64,
        limits: FeedLimits,
    ) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            state: Mutex::new(State {
                epoch,
                head,
                ring: VecDeque::with_capacity(limits.ring_capacity.min(4096)),
                ring_bytes: 0,
                subscribers: Vec::new(),
                liveness: Liveness {
                    stale: false,
                    cuts: 0,
                    reader_ok_at: now,
                    confirmed_at: now,
                    pending: VecDeque::new(),
                },
                retired: Vec::new(),
                last: None,
                seen: None,
                reset_requested: None,
            }),
            pool,
            limits: FeedLimits {
                buffer: limits.buffer.max(1),
                ..limits
            },
            wake: Notify::new(),
            epochs: tokio::sync::watch::Sender::new(epoch),
            metrics: FeedMetrics::default(),
        })
    }

    /// Records that `(epoch, seq)` was handed out to a client (acknowledged or listed).
    pub(crate) fn observe(&self, epoch: u32, seq: u64) {
        let mut state = self.state();
        match &mut state.seen {
            Some((e, s)) if *e == epoch => *s = (*s).max(seq),
            seen => *seen = Some((epoch, seq)),
        }
    }

    /// The furthest point handed out so far; take it before reading the database's head.
    pub(crate) fn mark(&self) -> Mark {
        let state = self.state();
        match state.seen {
            Some((e, s)) if e == state.epoch => Mark(e, s.max(state.head)),
            // Written or listed in an epoch the reader has not switched to yet.
            Some((e, s)) => Mark(e, s),
            None => Mark(state.epoch, state.head),
        }
    }

    /// Why the database's `(epoch, seq)`, read after `mark` was taken, shows an older copy
    /// put back: it is behind what this process had handed out by then in that epoch.
    fn behind(mark: Mark, epoch: u32, seq: u64) -> Option<String> {
        let Mark(e, at) = mark;
        (e == epoch && seq < at).then(|| {
            format!(
                "the change history went back from {at} to {seq} in epoch {epoch}: an older \
                 copy of the database was restored"
            )
        })
    }

    /// For a write or a list: whether the database's `(epoch, seq)`, read after `mark`, is
    /// behind it ([`Feed::behind`]). If so, asks the reader to rotate the epoch (every watcher
    /// relists) and returns why.
    pub(crate) fn went_back(&self, mark: Mark, epoch: u32, seq: u64) -> Option<String> {
        let reason = Self::behind(mark, epoch, seq)?;
        self.state().reset_requested = Some((epoch, reason.clone()));
        self.wake.notify_one();
        Some(reason)
    }

    /// The feed's metrics, to register before serving.
    pub(super) fn metrics(&self) -> FeedMetrics {
        self.metrics.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is one step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of live subscribers (for metrics and tests).
    pub(super) fn subscriber_count(&self) -> usize {
        self.state().subscribers.len()
    }

    /// Events and bytes in the ring.
    pub(super) fn ring_usage(&self) -> (usize, usize) {
        let state = self.state();
        (state.ring.len(), state.ring_bytes)
    }

    /// Whether the feed can currently vouch that it delivers every committed change within
    /// the staleness bound (readiness).
    pub(super) fn is_live(&self) -> bool {
        self.state()
            .is_live(Instant::now(), self.limits.staleness_bound)
    }

    /// Runs the reader, the heartbeat and the liveness check until the process ends.
    pub(super) async fn run(self: Arc<Self>, pg: tokio_postgres::Config, tls: PgTls) {
        let mut pg = pg;
        pg.application_name(FEED_APPLICATION_NAME);
        let reader = async {
            loop {
                if let Err(e) = self.listen_and_tail(&pg, &tls).await {
                    tracing::warn!(error = %e, "change feed connection lost; reconnecting");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::join!(reader, self.heartbeat(&pg, &tls), self.check_liveness());
    }

    async fn listen_and_tail(&self, pg: &tokio_postgres::Config, tls: &PgTls) -> Result<()> {
        let limit = self.limits.reader_timeout();
        let (client, mut connection) = timed(limit, async {
            pg.connect(tls.clone()).await.map_err(unavailable)
        })
        .await?;
        let (closed_tx, mut closed_rx) = tokio::sync::oneshot::channel::<String>();
        let driver = async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => self.wake.notify_one(),
                    Ok(_) => {}
                    Err(e) => return e.to_string(),
                }
            }
            "connection closed".to_string()
        };
        let tail = async {
            timed(limit, async {
                client
                    .batch_execute(&format!("LISTEN {CHANNEL}"))
                    .await
                    .map_err(unavailable)
            })
            .await?;
            let statement = timed(limit, async {
                client.prepare(PAGE_SQL).await.map_err(unavailable)
            })
            .await?;
            // A new connection may lead to another database than the last one did.
            let verdict = timed(limit, self.recheck(&client)).await?;
            if let Some((epoch, reason)) = verdict {
                self.reset(&client, epoch, &reason).await?;
            }
            loop {
                let started = Instant::now();
                let mark = self.mark();
                let head = self.state().head as i64;
                let page_bytes = self.limits.page_bytes as i64;
                let rows = timed(limit, async {
                    client
                        .query(&statement, &[&head, &PAGE, &page_bytes])
                        .await
                        .map_err(unavailable)
                })
                .await?;
                match self.publish(&rows, started, mark)? {
                    Page::Published { more: true } => continue,
                    Page::Published { more: false } => {}
                    Page::Reset { epoch, reason } => {
                        self.reset(&client, epoch, &reason).await?;
                        continue;
                    }
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.limits.poll_interval()) => {}
                    reason = &mut closed_rx => {
                        return Err(StoreError::Unavailable(reason.unwrap_or_default()));
                    }
                }
            }
        };
        // The connection is driven here, not in a detached task: when the reader gives up,
        // dropping both closes the socket.
        let driven = async {
            let reason = driver.await;
            let _ = closed_tx.send(reason);
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = tail => result,
            _ = driven => Ok(()),
        }
    }

    /// On (re)connect: whether the database is still the history this reader followed. Its
    /// identity must match what the epoch was minted on, and in the same epoch its head must
    /// not be behind this reader's and the event at this reader's head must be the one it
    /// fanned out. Returns the epoch to rotate and why.
    async fn recheck(&self, client: &tokio_postgres::Client) -> Result<Option<(u32, String)>> {
        let mark = self.mark();
        let snapshot = super::epoch::read(client).await?;
        if let Some(reason) = snapshot.reset_reason(super::epoch::Unknown::Ignored) {
            return Ok(Some((snapshot.epoch, reason)));
        }
        let (epoch, head, last, retired) = {
            let state = self.state();
            (
                state.epoch,
                state.head,
                state.last.clone(),
                state.retired.contains(&snapshot.epoch),
            )
        };
        if retired {
            return Ok(Some((
                snapshot.epoch,
                format!(
                    "the database returned to epoch {}, which this replica left: an older copy \
                     was restored",
                    snapshot.epoch
                ),
            )));
        }
        if snapshot.epoch != epoch {
            // Rotated meanwhile by someone else: the reader switches on its next page.
            return Ok(None);
        }
        if let Some(reason) = Self::behind(mark, epoch, snapshot.seq) {
            return Ok(Some((epoch, reason)));
        }
        if snapshot.seq < head {
            return Ok(Some((
                epoch,
                format!(
                    "the change history went back from {head} to {} in epoch {epoch}: an older \
                     copy of the database was restored",
                    snapshot.seq
                ),
            )));
        }
        let Some(last) = last else {
            return Ok(None);
        };
        let row = client
            .query_opt(
                "SELECT resource, namespace, name, event, object FROM change_log WHERE seq = $1",
                &[&(last.seq() as i64)],
            )
            .await
            .map_err(unavailable)?;
        // A missing row was trimmed (the reader fell behind retention, handled as such).
        let Some(row) = row else {
            return Ok(None);
        };
        let mut object: serde_json::Value = row.get("object");
        set_resource_version(&mut object, last.rv);
        let same = row.get::<_, &str>("resource") == last.resource
            && row.get::<_, &str>("namespace") == last.namespace
            && row.get::<_, &str>("name") == last.name
            && row.get::<_, &str>("event") == last.event_type.as_str()
            && object == last.object;
        if same {
            return Ok(None);
        }
        Ok(Some((
            epoch,
            format!(
                "the change at {} is not the one this replica fanned out: the history was \
                 replaced by an older copy that went on differently",
                last.rv
            ),
        )))
    }

    /// Rotates `epoch` because the history was reset; the next page switches every watcher of
    /// every replica to the new epoch (they relist).
    async fn reset(&self, client: &tokio_postgres::Client, epoch: u32, reason: &str) -> Result<()> {
        let rotated = timed(self.limits.reader_timeout(), async {
            super::epoch::rotate(client, epoch).await
        })
        .await?;
        match rotated {
            Some((new, seq)) => tracing::warn!(
                old = epoch,
                new,
                seq,
                %reason,
                "the change history was reset: rotated the epoch; every watch relists"
            ),
            None => tracing::info!(
                old = epoch,
                %reason,
                "the change history was reset; another replica rotated the epoch first"
            ),
        }
        Ok(())
    }

    /// Confirms the database's sequence head, forever, over a connection of its own: a pool
    /// drained by slow requests must not make a healthy feed look stalled. The connection
    /// is replaced whenever a round trip fails or misses its deadline.
    async fn heartbeat(&self, pg: &tokio_postgres::Config, tls: &PgTls) {
        let mut pg = pg.clone();
        pg.application_name(HEARTBEAT_APPLICATION_NAME);
        let mut ticks = tokio::time::interval(self.limits.heartbeat_interval());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let limit = self.limits.staleness_bound / 2;
        let mut connection: Option<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> = None;
        loop {
            ticks.tick().await;
            // Read after `asked`: everything committed before `asked` is at or below the head.
            let asked = Instant::now();
            let head = timed(limit, async {
                if connection.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                    let (client, conn) = pg.connect(tls.clone()).await.map_err(unavailable)?;
                    let driver = tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    if let Some((_, old)) = connection.replace((client, driver)) {
                        old.abort();
                    }
                }
                let Some((client, _)) = &connection else {
                    return Err(unavailable("no heartbeat connection"));
                };
                let row = client
                    .query_one("SELECT epoch, seq FROM sync_state WHERE id = 1", &[])
                    .await
                    .map_err(unavailable)?;
                Ok((row.get::<_, i32>(0) as u32, row.get::<_, i64>(1) as u64))
            })
            .await;
            match head {
                Ok((epoch, seq)) => {
                    let mut state = self.state();
                    let pending = &mut state.liveness.pending;
                    // A long stall must not grow this without bound; newer heads confirm
                    // later moments anyway.
                    if pending.len() >= 256 {
                        pending.pop_front();
                    }
                    pending.push_back((epoch, seq, asked));
                    state.settle();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "change feed heartbeat failed");
                    if let Some((_, driver)) = connection.take() {
                        driver.abort();
                    }
                }
            }
        }
    }

    /// Cuts everyone off when a proof is older than the bound, and reports recovery.
    async fn check_liveness(&self) {
        let bound = self.limits.staleness_bound;
        loop {
            tokio::time::sleep(self.limits.check_interval()).await;
            let now = Instant::now();
            let mut state = self.state();
            self.metrics.observe(&state, now, bound);
            let fresh = state.fresh(now, bound);
            if state.liveness.stale && fresh {
                state.liveness.stale = false;
                tracing::info!("change feed recovered: the database head is confirmed again");
            } else if !state.liveness.stale && !fresh {
                state.liveness.stale = true;
                state.liveness.cuts += 1;
                let subscribers = state.subscribers.len();
                self.metrics.cut(CUT_STALLED, subscribers);
                for slot in state.subscribers.drain(..) {
                    slot.cut_off.store(CUT_STALL, Ordering::Release);
                }
                tracing::warn!(
                    bound_ms = bound.as_millis() as u64,
                    subscribers,
                    reader_silent_ms = now.duration_since(state.liveness.reader_ok_at).as_millis() as u64,
                    unconfirmed_ms = now.duration_since(state.liveness.confirmed_at).as_millis() as u64,
                    "change feed stalled: ending every watch and refusing new ones until it recovers"
                );
            }
        }
    }

    /// Fans out one page read at `started`, unless it shows that the history was reset.
    fn publish(&self, rows: &[Row], started: Instant, mark: Mark) -> Result<Page> {
        let Some(first) = rows.first() else {
            return Err(StoreError::Internal("sync_state row is missing".into()));
        };
        let epoch = first.get::<_, i32>("epoch") as u32;
        let db_seq = first.get::<_, i64>("db_seq") as u64;
        if let Some(reason) = Self::behind(mark, epoch, db_seq) {
            return Ok(Page::Reset { epoch, reason });
        }
        let mut state = self.state();
        if let Some((epoch, reason)) = state.reset_requested.take() {
            return Ok(Page::Reset { epoch, reason });
        }
        if first.get::<_, bool>("rotate_requested") {
            return Ok(Page::Reset {
                epoch,
                reason: "sync_state.rotate_requested is set (the database was marked restored)"
                    .into(),
            });
        }
        if let Some(minted) = first.get::<_, Option<u32>>("epoch_table") {
            let table = first.get::<_, u32>("table_oid");
            if minted != table {
                return Ok(Page::Reset {
                    epoch,
                    reason: format!(
                        "sync_state was recreated (table OID {minted} -> {table}): a dump \
                         restored in place"
                    ),
                });
            }
        }
        if epoch == state.epoch && db_seq < state.head {
            return Ok(Page::Reset {
                epoch,
                reason: format!(
                    "the change history went back from {} to {db_seq} in epoch {epoch}: an \
                     older copy of the database was restored",
                    state.head
                ),
            });
        }
        if epoch != state.epoch && state.retired.contains(&epoch) {
            return Ok(Page::Reset {
                epoch,
                reason: format!(
                    "the database returned to epoch {epoch}, which this replica left: an older \
                     copy was restored"
                ),
            });
        }
        if epoch != state.epoch {
            tracing::warn!(
                old = state.epoch,
                new = epoch,
                "the epoch changed (rotated by a replica or an operator): ending every watch"
            );
            self.metrics.cut(CUT_EPOCH_ROTATED, state.subscribers.len());
            state.expire_all(CUT_RESET);
            let old = std::mem::replace(&mut state.epoch, epoch);
            if state.retired.len() >= 16 {
                state.retired.remove(0);
            }
            state.retired.push(old);
            // The new epoch starts where it was minted (0: by a version that did not record
            // it, which never moved the sequence back).
            let minted_at = first.get::<_, i64>("epoch_seq") as u64;
            if minted_at > 0 {
                state.head = minted_at;
            }
            self.epochs.send_replace(epoch);
            // Read on from the new epoch's start at once.
            return Ok(Page::Published { more: true });
        }
        for row in rows {
            let Some(seq) = row.get::<_, Option<i64>>("seq") else {
                continue;
            };
            let seq = seq as u64;
            if seq != state.head + 1 {
                // The log was trimmed past this reader: nobody can be served consistently.
                tracing::warn!(
                    head = state.head,
                    next = seq,
                    "change feed fell behind retention"
                );
                self.metrics
                    .cut(CUT_BEHIND_RETENTION, state.subscribers.len());
                state.expire_all(CUT_RETENTION);
            }
            let event = Arc::new(Event::from_row(epoch, row)?);
            state.head = seq;
            state.remember(event.clone(), &self.limits);
            state.last = Some(event.clone());
            state.subscribers.retain(|slot| {
                if seq <= slot.after {
                    return !slot.tx.is_closed();
                }
                match slot.tx.try_send(event.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        slot.cut_off.store(CUT_SLOW, Ordering::Release);
                        self.metrics.cut(CUT_SLOW_CONSUMER, 1);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
        }
        // A page shorter than asked ends at the head as of `started`; a full one does not,
        // but the reader reads again at once and the next page settles it.
        state.liveness.reader_ok_at = state.liveness.reader_ok_at.max(started);
        state.settle();
        Ok(Page::Published {
            more: state.head < db_seq,
        })
    }

    /// A subscription starting just after `from`, which the caller has validated. Refused
    /// while the feed cannot vouch for being current.
    pub(super) fn subscription(self: &Arc<Self>, from: ResourceVersion) -> Result<Subscription> {
        let state = self.state();
        if !state.is_live(Instant::now(), self.limits.staleness_bound) {
            return Err(stalled());
        }
        Ok(Subscription {
            feed: self.clone(),
            epoch: from.epoch,
            cursor: from.seq,
            cuts: state.liveness.cuts,
            backlog: VecDeque::new(),
            live: None,
        })
    }

    async fn read_log(&self, after: u64, epoch: u32) -> Result<Vec<Arc<Event>>> {
        let rows = timed(self.limits.staleness_bound, async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let statement = client.prepare_cached(PAGE_SQL).await.map_err(unavailable)?;
            client
                .query(
                    &statement,
                    &[&(after as i64), &PAGE, &(self.limits.page_bytes as i64)],
                )
                .await
                .map_err(unavailable)
        })
        .await?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.get::<_, i32>("epoch") as u32 != epoch {
                return Err(expired_epoch());
            }
            if row.get::<_, Option<i64>>("seq").is_some() {
                events.push(Arc::new(Event::from_row(epoch, row)?));
            }
        }
        Ok(events)
    }
}

/// Runs a database step with a deadline; a missed deadline is `Unavailable`.
async fn timed<T>(
    limit: Duration,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(format!(
            "no answer within {limit:?}"
        )))
    })
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl State {
    fn expire_all(&mut self, why: u8) {
        for slot in self.subscribers.drain(..) {
            slot.cut_off.store(why, Ordering::Release);
        }
        self.last = None;
        self.ring.clear();
        self.ring_bytes = 0;
    }

    /// Keeps `event` in the ring, evicting the oldest events beyond the count or byte bound
    /// (the newest event stays even if it alone is over the byte bound).
    fn remember(&mut self, event: Arc<Event>, limits: &FeedLimits) {
        if limits.ring_capacity == 0 {
            return;
        }
        self.ring_bytes += event.size;
        self.ring.push_back(event);
        while self.ring.len() > 1
            && (self.ring.len() > limits.ring_capacity || self.ring_bytes > limits.ring_bytes)
        {
            if let Some(old) = self.ring.pop_front() {
                self.ring_bytes -= old.size;
            }
        }
    }

    /// Confirms every heartbeat head the reader has reached.
    fn settle(&mut self) {
        let (epoch, head) = (self.epoch, self.head);
        let liveness = &mut self.liveness;
        // The newest reached observation confirms everything asked before it.
        let reached = liveness
            .pending
            .iter()
            .rposition(|&(e, seq, _)| e == epoch && seq <= head);
        if let Some(i) = reached {
            let (_, _, asked) = liveness.pending[i];
            liveness.confirmed_at = liveness.confirmed_at.max(asked);
            liveness.pending.drain(..=i);
        }
    }

    /// Both proofs are younger than the bound.
    fn fresh(&self, now: Instant, bound: Duration) -> bool {
        now.saturating_duration_since(self.liveness.confirmed_at) <= bound
            && now.saturating_duration_since(self.liveness.reader_ok_at) <= bound
    }

    fn is_live(&self, now: Instant, bound: Duration) -> bool {
        !self.liveness.stale && self.fresh(now, bound)
    }
}

fn expired_epoch() -> StoreError {
    StoreError::Expired(
        "too old resource version: the change history was reset (the epoch changed: a \
         restored database or an operator's --rotate-epoch); relist"
            .into(),
    )
}

fn stalled() -> StoreError {
    StoreError::Unavailable(
        "the change feed cannot confirm it is current (database unreachable or stalled); retry"
            .into(),
    )
}

/// A position in the change feed that yields every later event exactly once, in order.
pub struct Subscription {
    feed: Arc<Feed>,
    epoch: u32,
    cursor: u64,
    /// The feed's stall count when this subscription started.
    cuts: u64,
    backlog: VecDeque<Arc<Event>>,
    live: Option<(mpsc::Receiver<Arc<Event>>, Arc<AtomicU8>)>,
}

impl Subscription {
    /// The resourceVersion of the last event returned (or the starting point).
    pub fn cursor(&self) -> ResourceVersion {
        ResourceVersion::new(self.epoch, self.cursor)
    }

    /// `Expired` once the feed stalled after this subscription started, or while it cannot
    /// vouch for being current: what was delivered may no longer be the latest.
    fn ensure_current(&self, state: &State) -> Result<()> {
        if state.liveness.cuts != self.cuts
            || !state.is_live(Instant::now(), self.feed.limits.staleness_bound)
        {
            return Err(StoreError::Expired(format!(
                "too old resource version: {}: the change feed stalled and cannot vouch for \
                 later changes; relist",
                self.cursor()
            )));
        }
        Ok(())
    }

    /// The next event. `Expired` when this subscriber was cut off (too slow, log trimmed
    /// past it, epoch rotated, or the feed stalled): the client must relist.
    pub async fn next(&mut self) -> Result<Arc<Event>> {
        loop {
            if let Some(event) = self.backlog.pop_front() {
                if event.seq() <= self.cursor {
                    continue;
                }
                self.cursor = event.seq();
                return Ok(event);
            }
            if let Some((rx, cut_off)) = &mut self.live {
                match rx.recv().await {
                    Some(event) => self.backlog.push_back(event),
                    None if cut_off.load(Ordering::Acquire) != LIVE => {
                        let why = cut_off.load(Ordering::Acquire);
                        if why == CUT_RESET {
                            return Err(expired_epoch());
                        }
                        self.ensure_current(&self.feed.state())?;
                        let cause = match why {
                            CUT_RETENTION => "the change feed fell behind the retained log",
                            CUT_STALL => "the change feed stalled",
                            _ => "the watcher fell behind",
                        };
                        return Err(StoreError::Expired(format!(
                            "too old resource version: {}: {cause} and must relist",
                            self.cursor()
                        )));
                    }
                    None => return Err(StoreError::Unavailable("change feed stopped".into())),
                }
                continue;
            }
            match self.try_attach()? {
                Attach::Attached => continue,
                Attach::NotCovered => {}
                Attach::EpochAhead => {
                    let mut epochs = self.feed.epochs.subscribe();
                    self.feed.wake.notify_one();
                    let epoch = self.epoch;
                    let switched = tokio::time::timeout(
                        self.feed.limits.staleness_bound,
                        epochs.wait_for(|e| *e == epoch),
                    )
                    .await;
                    if !matches!(switched, Ok(Ok(_))) {
                        return Err(expired_epoch());
                    }
                    continue;
                }
            }
            let page = self.feed.read_log(self.cursor, self.epoch).await?;
            self.ensure_current(&self.feed.state())?;
            match page.first() {
                Some(first) if first.seq() == self.cursor + 1 => self.backlog.extend(page),
                // The next change after the cursor is gone from the log.
                Some(_) => {
                    return Err(StoreError::Expired(format!(
                        "too old resource version: {}",
                        self.cursor()
                    )))
                }
                // The reader has fanned out changes after the cursor that the log no longer
                // holds: they were trimmed.
                None => {
                    return Err(StoreError::Expired(format!(
                        "too old resource version: {}",
                        self.cursor()
                    )))
                }
            }
        }
    }

    /// When every event up to the reader's head has reached this subscriber, moves the
    /// cursor to that head: a bookmark can then say how far the stream is known complete,
    /// even if none of those events were for this watcher. Does nothing while the feed
    /// cannot vouch for its head.
    pub fn advance_if_idle(&mut self) {
        let feed = self.feed.clone();
        let state = feed.state();
        if self.ensure_current(&state).is_err() {
            return;
        }
        let Some((rx, cut_off)) = &self.live else {
            return;
        };
        // A subscriber that was cut off has missed events: its queue may be drained, but a
        // bookmark past them would tell the client it saw everything up to the head.
        if !self.backlog.is_empty() || cut_off.load(Ordering::Acquire) != LIVE {
            return;
        }
        // The reader sends and moves its head under this lock, so an empty queue seen under
        // it means nothing up to the head is still in flight.
        if state.epoch == self.epoch && rx.is_empty() && state.head > self.cursor {
            self.cursor = state.head;
        }
    }

    /// The position a bookmark may carry now: `advance_if_idle`, then the cursor. `Expired`
    /// while the feed cannot vouch for being current, so a stalled feed never sends a
    /// bookmark (which clients read as "nothing changed up to here").
    pub fn bookmark(&mut self) -> Result<ResourceVersion> {
        self.ensure_current(&self.feed.state())?;
        self.advance_if_idle();
        Ok(self.cursor())
    }

    /// Joins the live fan-out if the ring (or the reader's head) covers the cursor.
    fn try_attach(&mut self) -> Result<Attach> {
        let feed = self.feed.clone();
        let mut state = feed.state();
        if state.epoch != self.epoch {
            if state.retired.contains(&self.epoch) {
                return Err(expired_epoch());
            }
            // An epoch this reader has not seen yet (another replica just started and
            // rotated it): the reader is about to switch, not the subscriber behind.
            return Ok(Attach::EpochAhead);
        }
        self.ensure_current(&state)?;
        let covered = self.cursor >= state.head
            || state
                .ring
                .front()
                .is_some_and(|first| first.seq() <= self.cursor + 1);
        if !covered {
            return Ok(Attach::NotCovered);
        }
        let cursor = self.cursor;
        self.backlog
            .extend(state.ring.iter().filter(|e| e.seq() > cursor).cloned());
        let after = cursor.max(state.head);
        let (tx, rx) = mpsc::channel(feed.limits.buffer);
        let cut_off = Arc::new(AtomicU8::new(LIVE));
        state.subscribers.push(Slot {
            tx,
            after,
            cut_off: cut_off.clone(),
        });
        self.live = Some((rx, cut_off));
        Ok(Attach::Attached)
    }
}

/// What `try_attach` found.
enum Attach {
    Attached,
    /// The ring does not reach back to the cursor: replay from the log first.
    NotCovered,
    /// The subscription is at an epoch the reader has not switched to yet.
    EpochAhead,
}
