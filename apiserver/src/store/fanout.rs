//! The watch fan-out: a ring of recent events and the live subscribers, each behind a bounded
//! queue. It knows no database: a source publishes committed events into it (PostgreSQL's
//! LISTEN tail, `pg/tail.rs`, or the memory store's own commits), and a subscription that
//! starts behind the ring replays what it missed through [`Replay`].
//!
//! A subscriber that starts behind replays page by page, then attaches to the live fan-out once
//! the ring covers its cursor. A subscriber whose queue fills up is cut off and sees `Expired`:
//! events are never skipped silently. An epoch switch expires everyone. The ring is bounded by
//! bytes as well as by count.
//!
//! A source that cannot commit without the fan-out seeing it (the memory store) is always
//! current. One that follows a database from afar (the tail) must prove it, through
//! [`Liveness`]: while a proof is older than the staleness bound the feed is *stalled*, and
//! no bookmark is given (a watcher never mistakes a silent feed for a quiet one). A stall is
//! not an epoch change: nobody is cut off and new subscriptions are taken, since the log
//! still holds every change after each cursor; once the source catches up, every
//! subscriber continues where it stopped, and bookmarks resume. Every bookmark carries the
//! head the source knows of, so a watcher behind it can tell by how much.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use super::error::{Result, StoreError};
use super::rv::ResourceVersion;

/// Watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// Reads the wire spelling back (as the change log stores it).
    pub(crate) fn parse(s: &str) -> Result<Self> {
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
    /// When this replica's change feed read it (or, for the memory store, committed it): for
    /// every subscriber of the live fan-out, the same instant.
    pub seen_at: k8s_openapi::jiff::Timestamp,
}

/// Lazily encoded forms of one event, keyed by rendering.
#[derive(Debug, Default)]
pub struct EventRenderings {
    pub json: OnceLock<bytes::Bytes>,
    pub metadata: OnceLock<bytes::Bytes>,
    pub table_row: OnceLock<bytes::Bytes>,
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
}

/// Why the fan-out cut a subscriber off. Every one ends the watch with `Expired` (410): the
/// client relists. A stall is not among them (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CutOff {
    /// Its queue was full: it fell behind the live events.
    SlowConsumer,
    /// The epoch changed: the history the subscriber followed is gone.
    EpochRotated,
    /// The log was trimmed past the source: the next events cannot be read.
    BehindRetention,
}

impl CutOff {
    const ALL: [CutOff; 3] = [
        CutOff::SlowConsumer,
        CutOff::EpochRotated,
        CutOff::BehindRetention,
    ];

    /// The metric's `reason` label.
    fn label(self) -> &'static str {
        match self {
            CutOff::SlowConsumer => "slow_consumer",
            CutOff::EpochRotated => "epoch_rotated",
            CutOff::BehindRetention => "behind_retention",
        }
    }
}

/// Where a subscription that starts behind the ring reads what it missed: the change log the
/// fan-out is fed from. The fan-out knows nothing else about its source.
#[async_trait]
pub(crate) trait Replay: Send + Sync + 'static {
    /// The events of `epoch` after `after`, in order, one bounded page; empty when the source
    /// has none after it (anymore). `Expired` when the source is at another epoch.
    async fn read_after(&self, epoch: u32, after: u64) -> Result<Vec<Arc<Event>>>;

    /// Asks the source to look for news now: a subscription waits for an epoch the fan-out
    /// has not switched to yet.
    fn nudge(&self);
}

/// Sizes of the fan-out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FanoutLimits {
    /// Queue length of each live subscriber.
    pub buffer: usize,
    /// Events kept in memory for subscribers that attach slightly behind.
    pub ring_capacity: usize,
    /// Total encoded bytes the ring may hold (it always holds the newest event).
    pub ring_bytes: usize,
    /// How long a subscription at an epoch the fan-out has not reached yet waits for it.
    pub epoch_wait: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutoffLabels {
    reason: &'static str,
}

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
        for reason in CutOff::ALL {
            let _ = self.cutoffs.get_or_create(&CutoffLabels {
                reason: reason.label(),
            });
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

    fn cut(&self, reason: CutOff, subscribers: usize) {
        if subscribers > 0 {
            self.cutoffs
                .get_or_create(&CutoffLabels {
                    reason: reason.label(),
                })
                .inc_by(subscribers as u64);
        }
    }

    fn observe(&self, state: &State, now: Instant) {
        self.head.set(i64::try_from(state.head).unwrap_or(i64::MAX));
        let db_head = state.known_head(state.epoch);
        let confirmed_at = state.liveness.as_ref().map_or(now, |l| l.confirmed_at);
        self.lag_events
            .set(i64::try_from(db_head.saturating_sub(state.head)).unwrap_or(i64::MAX));
        self.lag_seconds
            .set(now.saturating_duration_since(confirmed_at).as_secs_f64());
        self.live.set(i64::from(state.is_live(now)));
        self.subscribers
            .set(i64::try_from(state.subscribers.len()).unwrap_or(i64::MAX));
    }
}

/// What a source that follows a database from afar can vouch for: two proofs, each younger
/// than `bound` while the fan-out is current. The reader's own round trips prove it is not
/// stuck; heads the heartbeat read, once reached, prove nothing committed is missing.
struct Liveness {
    bound: Duration,
    /// Set while a proof is older than the bound; cleared once both are fresh again.
    stale: bool,
    /// When the reader last sent a query that completed.
    reader_ok_at: Instant,
    /// The latest moment up to which everything committed is known to be fanned out.
    confirmed_at: Instant,
    /// Heads read by the heartbeat that the reader has not reached yet: (epoch, seq, when).
    pending: VecDeque<(u32, u64, Instant)>,
}

/// What one liveness check changed.
pub(crate) enum LivenessChange {
    /// Both proofs are fresh again.
    Recovered,
    /// A proof grew older than the bound: bookmarks stop until it recovers.
    Stalled {
        subscribers: usize,
        reader_silent: Duration,
        unconfirmed: Duration,
    },
}

/// The fan-out: shared by the source that publishes and every subscription.
pub(crate) struct Fanout {
    state: Mutex<State>,
    limits: FanoutLimits,
    replay: Arc<dyn Replay>,
    /// The epoch the fan-out follows, for subscriptions waiting for it to switch.
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
    /// `None`: the source is current by construction (it publishes as it commits).
    liveness: Option<Liveness>,
    /// Epochs the fan-out has left: a subscription at one of them is expired at once.
    retired: Vec<u32>,
    /// The last event fanned out in this epoch: on reconnect the log must still hold it.
    last: Option<Arc<Event>>,
}

/// Where the fan-out records why it cut a subscriber off: set once, read by the subscriber
/// when its queue ends.
type CutOffCell = Arc<OnceLock<CutOff>>;

struct Slot {
    tx: mpsc::Sender<Arc<Event>>,
    after: u64,
    /// Set once, when the fan-out drops this slot for a reason the subscriber must hear.
    cut_off: CutOffCell,
}

impl Fanout {
    /// A fan-out at `(epoch, head)`. `staleness_bound`: the source must prove it is current
    /// within it (see [`Liveness`]); `None` for a source that publishes as it commits.
    pub(crate) fn new(
        epoch: u32,
        head: u64,
        limits: FanoutLimits,
        staleness_bound: Option<Duration>,
        replay: Arc<dyn Replay>,
    ) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            state: Mutex::new(State {
                epoch,
                head,
                ring: VecDeque::with_capacity(limits.ring_capacity.min(4096)),
                ring_bytes: 0,
                subscribers: Vec::new(),
                liveness: staleness_bound.map(|bound| Liveness {
                    bound,
                    stale: false,
                    reader_ok_at: now,
                    confirmed_at: now,
                    pending: VecDeque::new(),
                }),
                retired: Vec::new(),
                last: None,
            }),
            limits: FanoutLimits {
                buffer: limits.buffer.max(1),
                ..limits
            },
            replay,
            epochs: tokio::sync::watch::Sender::new(epoch),
            metrics: FeedMetrics::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is one step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fan-out's metrics, to register before serving.
    pub(crate) fn metrics(&self) -> FeedMetrics {
        self.metrics.clone()
    }

    /// The epoch followed and the last sequence fanned out in it.
    pub(crate) fn position(&self) -> (u32, u64) {
        let state = self.state();
        (state.epoch, state.head)
    }

    /// The sequence after which every event of the current epoch is still in the ring (the
    /// head when the ring is empty): a subscription from before it must replay.
    pub(crate) fn horizon(&self) -> u64 {
        let state = self.state();
        state
            .ring
            .front()
            .map_or(state.head, |first| first.seq().saturating_sub(1))
    }

    /// The last event fanned out in the current epoch, if it is known.
    pub(crate) fn last(&self) -> Option<Arc<Event>> {
        self.state().last.clone()
    }

    /// Whether the fan-out followed `epoch` once and left it.
    pub(crate) fn has_retired(&self, epoch: u32) -> bool {
        self.state().retired.contains(&epoch)
    }

    /// Number of live subscribers (for metrics and tests).
    pub(crate) fn subscriber_count(&self) -> usize {
        self.state().subscribers.len()
    }

    /// Events and bytes in the ring.
    pub(crate) fn ring_usage(&self) -> (usize, usize) {
        let state = self.state();
        (state.ring.len(), state.ring_bytes)
    }

    /// Whether the fan-out can currently vouch that it delivers every committed change within
    /// the staleness bound (readiness).
    pub(crate) fn is_live(&self) -> bool {
        self.state().is_live(Instant::now())
    }

    /// Switches to `epoch`: every subscriber is cut off (they relist), the old epoch is
    /// retired. `minted_at`: the sequence the new epoch starts after (0: unknown, the head
    /// stays, as a version that did not record it never moved the sequence back).
    pub(crate) fn switch_epoch(&self, epoch: u32, minted_at: u64) {
        let mut state = self.state();
        tracing::warn!(
            old = state.epoch,
            new = epoch,
            "the epoch changed (rotated by a replica or an operator): ending every watch"
        );
        self.metrics
            .cut(CutOff::EpochRotated, state.subscribers.len());
        state.expire_all(CutOff::EpochRotated);
        let old = std::mem::replace(&mut state.epoch, epoch);
        if state.retired.len() >= 16 {
            state.retired.remove(0);
        }
        state.retired.push(old);
        if minted_at > 0 {
            state.head = minted_at;
        }
        self.epochs.send_replace(epoch);
    }

    /// Fans out one page of events the source read at `started` (in order, after the head),
    /// and counts the read as the reader's proof of life.
    pub(crate) fn publish_page(&self, events: Vec<Arc<Event>>, started: Instant) {
        let mut state = self.state();
        for event in events {
            self.fan_out(&mut state, event);
        }
        // A page shorter than asked ends at the head as of `started`; a full one does not,
        // but the reader reads again at once and the next page settles it.
        if let Some(liveness) = &mut state.liveness {
            liveness.reader_ok_at = liveness.reader_ok_at.max(started);
        }
        state.settle();
    }

    /// Fans out one event committed just now, after the head.
    pub(crate) fn publish(&self, event: Arc<Event>) {
        let mut state = self.state();
        self.fan_out(&mut state, event);
    }

    fn fan_out(&self, state: &mut State, event: Arc<Event>) {
        let seq = event.seq();
        if seq != state.head + 1 {
            // The log was trimmed past the source: nobody can be served consistently.
            tracing::warn!(
                head = state.head,
                next = seq,
                "change feed fell behind retention"
            );
            self.metrics
                .cut(CutOff::BehindRetention, state.subscribers.len());
            state.expire_all(CutOff::BehindRetention);
        }
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
                    let _ = slot.cut_off.set(CutOff::SlowConsumer);
                    self.metrics.cut(CutOff::SlowConsumer, 1);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Records a head the heartbeat read at `asked` (everything committed before `asked` is
    /// at or below it); it confirms that moment once the fan-out reaches it.
    pub(crate) fn confirm_head(&self, epoch: u32, seq: u64, asked: Instant) {
        let mut state = self.state();
        let Some(liveness) = &mut state.liveness else {
            return;
        };
        // A long stall must not grow this without bound; newer heads confirm later moments
        // anyway.
        if liveness.pending.len() >= 256 {
            liveness.pending.pop_front();
        }
        liveness.pending.push_back((epoch, seq, asked));
        state.settle();
    }

    /// One liveness check at `now` (a few times a second): refreshes the metrics, marks the
    /// feed stalled when a proof is older than the bound, and reports what changed.
    pub(crate) fn check_liveness(&self, now: Instant) -> Option<LivenessChange> {
        let mut state = self.state();
        self.metrics.observe(&state, now);
        let fresh = state.fresh(now);
        let subscribers = state.subscribers.len();
        let liveness = state.liveness.as_mut()?;
        if liveness.stale && fresh {
            liveness.stale = false;
            return Some(LivenessChange::Recovered);
        }
        if liveness.stale || fresh {
            return None;
        }
        liveness.stale = true;
        let reader_silent = now.duration_since(liveness.reader_ok_at);
        let unconfirmed = now.duration_since(liveness.confirmed_at);
        Some(LivenessChange::Stalled {
            subscribers,
            reader_silent,
            unconfirmed,
        })
    }

    /// A subscription starting just after `from`, which the caller has validated. Taken
    /// while the feed is stalled too: it is served once the source catches up.
    pub(crate) fn subscription(self: &Arc<Self>, from: ResourceVersion) -> Result<Subscription> {
        Ok(Subscription {
            fanout: self.clone(),
            epoch: from.epoch,
            cursor: from.seq,
            backlog: VecDeque::new(),
            live: None,
            replaying: None,
        })
    }
}

impl State {
    fn expire_all(&mut self, why: CutOff) {
        for slot in self.subscribers.drain(..) {
            let _ = slot.cut_off.set(why);
        }
        self.last = None;
        self.ring.clear();
        self.ring_bytes = 0;
    }

    /// Keeps `event` in the ring, evicting the oldest events beyond the count or byte bound
    /// (the newest event stays even if it alone is over the byte bound).
    fn remember(&mut self, event: Arc<Event>, limits: &FanoutLimits) {
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

    /// Confirms every heartbeat head the fan-out has reached.
    fn settle(&mut self) {
        let (epoch, head) = (self.epoch, self.head);
        let Some(liveness) = &mut self.liveness else {
            return;
        };
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
    fn fresh(&self, now: Instant) -> bool {
        self.liveness.as_ref().is_none_or(|l| {
            now.saturating_duration_since(l.confirmed_at) <= l.bound
                && now.saturating_duration_since(l.reader_ok_at) <= l.bound
        })
    }

    fn is_live(&self, now: Instant) -> bool {
        !self.liveness.as_ref().is_some_and(|l| l.stale) && self.fresh(now)
    }

    /// The newest head of `epoch` known: the last event fanned out, or a later head the
    /// heartbeat read that the reader has not reached yet.
    fn known_head(&self, epoch: u32) -> u64 {
        let pending = self.liveness.as_ref().and_then(|l| {
            l.pending
                .iter()
                .filter(|(e, _, _)| *e == epoch)
                .map(|(_, seq, _)| *seq)
                .max()
        });
        pending.unwrap_or(0).max(self.head)
    }
}

/// The history a cursor was in is gone: relist.
pub(crate) fn expired_epoch() -> StoreError {
    StoreError::EpochChanged(
        "too old resource version: the change history was reset (the epoch changed: a \
         restored database or an operator's --rotate-epoch); relist"
            .into(),
    )
}

/// Where a watch's bookmark may stand, and the head it is measured against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bookmark {
    /// Every event up to here reached the watcher (the resourceVersion it carries).
    pub at: ResourceVersion,
    /// The newest committed change the feed knows of, in the same epoch.
    pub head: ResourceVersion,
}

/// A read of the log that a cancelled `next` left in flight, resumed by the next call.
type PendingPage = futures::future::BoxFuture<'static, Result<Vec<Arc<Event>>>>;

/// A position in the change feed that yields every later event exactly once, in order.
pub struct Subscription {
    fanout: Arc<Fanout>,
    epoch: u32,
    cursor: u64,
    backlog: VecDeque<Arc<Event>>,
    live: Option<(mpsc::Receiver<Arc<Event>>, CutOffCell)>,
    /// The replay read in flight, kept across cancellations of `next`.
    replaying: Option<PendingPage>,
}

impl Subscription {
    /// The resourceVersion of the last event returned (or the starting point).
    pub fn cursor(&self) -> ResourceVersion {
        ResourceVersion::new(self.epoch, self.cursor)
    }

    /// The next event. `Expired` when this subscriber was cut off (too slow, log trimmed
    /// past it), `EpochChanged` when its history is gone: the client must relist. While the
    /// feed is stalled it waits.
    ///
    /// Cancel-safe: a call dropped while it reads a page of the log leaves the read in flight,
    /// and the next call takes it up (a watch that also sends bookmarks drops this future
    /// every interval; restarting the read each time could starve it forever).
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
                    None => match cut_off.get().copied() {
                        Some(CutOff::EpochRotated) => return Err(expired_epoch()),
                        Some(why) => {
                            let cause = match why {
                                CutOff::BehindRetention => {
                                    "the change feed fell behind the retained log"
                                }
                                CutOff::SlowConsumer | CutOff::EpochRotated => {
                                    "the watcher fell behind"
                                }
                            };
                            return Err(StoreError::Expired(format!(
                                "too old resource version: {}: {cause} and must relist",
                                self.cursor()
                            )));
                        }
                        None => return Err(StoreError::Unavailable("change feed stopped".into())),
                    },
                }
                continue;
            }
            match self.try_attach()? {
                Attach::Attached => continue,
                Attach::NotCovered => {}
                Attach::EpochAhead => {
                    let mut epochs = self.fanout.epochs.subscribe();
                    self.fanout.replay.nudge();
                    let epoch = self.epoch;
                    let switched = tokio::time::timeout(
                        self.fanout.limits.epoch_wait,
                        epochs.wait_for(|e| *e == epoch),
                    )
                    .await;
                    if !matches!(switched, Ok(Ok(_))) {
                        return Err(expired_epoch());
                    }
                    continue;
                }
            }
            let (replay, epoch, cursor) = (self.fanout.replay.clone(), self.epoch, self.cursor);
            let read = self.replaying.get_or_insert_with(|| {
                Box::pin(async move { replay.read_after(epoch, cursor).await })
            });
            let page = read.await;
            self.replaying = None;
            let page = page?;
            match page.first() {
                Some(first) if first.seq() == self.cursor + 1 => self.backlog.extend(page),
                // The next change after the cursor is gone from the log (`Some`), or the
                // fan-out has published changes after the cursor that the log no longer
                // holds (`None`): they were trimmed.
                Some(_) | None => {
                    return Err(StoreError::Expired(format!(
                        "too old resource version: {}",
                        self.cursor()
                    )))
                }
            }
        }
    }

    /// When every event up to the fan-out's head has reached this subscriber, moves the
    /// cursor to that head: a bookmark can then say how far the stream is known complete,
    /// even if none of those events were for this watcher.
    fn advance_if_idle(&mut self, state: &State) {
        let Some((rx, cut_off)) = &self.live else {
            return;
        };
        // A subscriber that was cut off has missed events: its queue may be drained, but a
        // bookmark past them would tell the client it saw everything up to the head.
        if !self.backlog.is_empty() || cut_off.get().is_some() {
            return;
        }
        // The source publishes and moves the head under this lock, so an empty queue seen
        // under it means nothing up to the head is still in flight.
        if state.epoch == self.epoch && rx.is_empty() && state.head > self.cursor {
            self.cursor = state.head;
        }
    }

    /// The bookmark this watch may send now: its cursor (moved to the head when nothing is
    /// in flight to it) and the head it is measured against. `None` while the feed cannot
    /// vouch for being current or follows another epoch: a stalled feed sends no bookmark,
    /// which clients would read as "nothing changed up to here".
    pub fn bookmark(&mut self) -> Option<Bookmark> {
        let fanout = self.fanout.clone();
        let state = fanout.state();
        if !state.is_live(Instant::now()) || state.epoch != self.epoch {
            return None;
        }
        self.advance_if_idle(&state);
        let head = state.known_head(self.epoch).max(self.cursor);
        Some(Bookmark {
            at: self.cursor(),
            head: ResourceVersion::new(self.epoch, head),
        })
    }

    /// Joins the live fan-out if the ring (or the head) covers the cursor.
    fn try_attach(&mut self) -> Result<Attach> {
        let fanout = self.fanout.clone();
        let mut state = fanout.state();
        if state.epoch != self.epoch {
            if state.retired.contains(&self.epoch) {
                return Err(expired_epoch());
            }
            // An epoch the fan-out has not seen yet (another replica just started and
            // rotated it): the source is about to switch, not the subscriber behind.
            return Ok(Attach::EpochAhead);
        }
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
        let (tx, rx) = mpsc::channel(fanout.limits.buffer);
        let cut_off = Arc::new(OnceLock::new());
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
    /// The subscription is at an epoch the fan-out has not switched to yet.
    EpochAhead,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source with no log behind the ring.
    struct NoLog;

    #[async_trait]
    impl Replay for NoLog {
        async fn read_after(&self, _epoch: u32, _after: u64) -> Result<Vec<Arc<Event>>> {
            Ok(Vec::new())
        }
        fn nudge(&self) {}
    }

    fn mk_fanout(buffer: usize, ring: usize, bound: Option<Duration>) -> Arc<Fanout> {
        let limits = FanoutLimits {
            buffer,
            ring_capacity: ring,
            ring_bytes: 1000,
            epoch_wait: Duration::from_millis(10),
        };
        Fanout::new(1, 0, limits, bound, Arc::new(NoLog))
    }

    fn mk_event(seq: u64, size: usize) -> Arc<Event> {
        Arc::new(Event {
            rv: ResourceVersion::new(1, seq),
            event_type: EventType::Added,
            resource: "accesssessions".into(),
            namespace: "team-a".into(),
            name: format!("s{seq}"),
            object: serde_json::json!({"metadata": {"name": format!("s{seq}")}}),
            before: None,
            rendered: EventRenderings::default(),
            size,
            seen_at: k8s_openapi::jiff::Timestamp::now(),
        })
    }

    /// A subscription from the start, attached to the live queue by its first event.
    async fn attached(fanout: &Arc<Fanout>) -> Subscription {
        let mut sub = fanout
            .subscription(ResourceVersion::new(1, 0))
            .expect("subscribes");
        fanout.publish(mk_event(1, 10));
        assert_eq!(sub.next().await.expect("first event").seq(), 1);
        assert_eq!(fanout.subscriber_count(), 1);
        sub
    }

    fn expired(result: Result<Arc<Event>>) -> String {
        match result {
            Err(StoreError::Expired(message)) => message,
            other => panic!("expected Expired, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_ring_keeps_the_newest_events_within_its_count_and_bytes() {
        let fanout = mk_fanout(8, 3, None);
        for seq in 1..=5 {
            fanout.publish(mk_event(seq, 100));
        }
        assert_eq!(fanout.ring_usage(), (3, 300));
        assert_eq!(fanout.horizon(), 2);
        // One event over the byte bound alone still stays: the newest is always kept.
        fanout.publish(mk_event(6, 5000));
        assert_eq!(fanout.ring_usage(), (1, 5000));
        assert_eq!(fanout.horizon(), 5);
    }

    #[tokio::test]
    async fn a_gap_in_the_sequence_cuts_everyone_off_as_behind_retention() {
        let fanout = mk_fanout(8, 8, None);
        let mut sub = attached(&fanout).await;
        fanout.publish(mk_event(5, 10));
        assert_eq!(fanout.subscriber_count(), 0);
        let message = expired(sub.next().await);
        assert!(
            message.contains("fell behind the retained log"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_epoch_switch_expires_every_subscriber_and_the_old_epoch() {
        let fanout = mk_fanout(8, 8, None);
        let mut sub = attached(&fanout).await;
        fanout.switch_epoch(2, 40);
        assert_eq!(fanout.position(), (2, 40));
        assert!(fanout.has_retired(1));
        let epoch_changed = |result: Result<Arc<Event>>| match result {
            Err(StoreError::EpochChanged(message)) => message,
            other => panic!("expected EpochChanged, got {other:?}"),
        };
        assert!(epoch_changed(sub.next().await).contains("the epoch changed"));
        let mut late = fanout
            .subscription(ResourceVersion::new(1, 1))
            .expect("subscribes");
        assert!(epoch_changed(late.next().await).contains("the epoch changed"));
    }

    #[tokio::test]
    async fn a_stall_sends_no_bookmark_cuts_nobody_and_the_watch_goes_on_after_it() {
        let bound = Duration::from_millis(100);
        let fanout = mk_fanout(8, 8, Some(bound));
        let mut sub = attached(&fanout).await;
        // Fresh proofs: nothing changes.
        assert!(fanout.check_liveness(Instant::now()).is_none());
        assert!(fanout.is_live());
        assert!(sub.bookmark().is_some());

        let later = Instant::now() + bound * 3;
        match fanout.check_liveness(later) {
            Some(LivenessChange::Stalled { subscribers, .. }) => assert_eq!(subscribers, 1),
            _ => panic!("expected the feed to stall"),
        }
        assert!(!fanout.is_live());
        assert_eq!(fanout.subscriber_count(), 1, "a stall cuts nobody off");
        assert_eq!(sub.bookmark(), None, "a stalled feed vouches for nothing");
        let mut during = fanout
            .subscription(ResourceVersion::new(1, 1))
            .expect("a new watch is taken during a stall");

        // The source catches up: what it read is delivered in order to both, and
        // bookmarks resume.
        let now = Instant::now();
        fanout.publish_page(vec![mk_event(2, 10)], now);
        fanout.confirm_head(1, 2, now);
        assert!(matches!(
            fanout.check_liveness(now),
            Some(LivenessChange::Recovered)
        ));
        assert_eq!(sub.next().await.expect("event 2").seq(), 2);
        assert_eq!(during.next().await.expect("event 2").seq(), 2);
        let mark = sub.bookmark().expect("bookmarks resume");
        assert_eq!((mark.at.seq, mark.head.seq), (2, 2));
    }

    #[tokio::test]
    async fn a_bookmark_carries_the_head_the_heartbeat_saw_ahead_of_the_reader() {
        let fanout = mk_fanout(8, 8, Some(Duration::from_secs(60)));
        let mut sub = attached(&fanout).await;
        // The heartbeat read head 5; the reader has fanned out only 1.
        fanout.confirm_head(1, 5, Instant::now());
        let mark = sub.bookmark().expect("the feed is live");
        assert_eq!((mark.at.seq, mark.head.seq), (1, 5));
    }

    /// A log whose reads take `delay`, counting the reads started.
    struct SlowLog {
        delay: Duration,
        started: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Replay for SlowLog {
        async fn read_after(&self, _epoch: u32, after: u64) -> Result<Vec<Arc<Event>>> {
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            Ok((after + 1..=after + 3)
                .map(|seq| mk_event(seq, 10))
                .collect())
        }
        fn nudge(&self) {}
    }

    /// The watch loop drops `next()` at every bookmark tick. A replay read that takes longer
    /// than the interval must still complete: the dropped read is taken up, not restarted.
    #[tokio::test(start_paused = true)]
    async fn a_replay_read_survives_next_being_dropped_by_every_bookmark_tick() {
        let log = Arc::new(SlowLog {
            delay: Duration::from_millis(250),
            started: Default::default(),
        });
        let limits = FanoutLimits {
            buffer: 8,
            ring_capacity: 8,
            ring_bytes: 1000,
            epoch_wait: Duration::from_millis(10),
        };
        // The fan-out is at 10 with an empty ring: a subscription from 0 must replay.
        let fanout = Fanout::new(1, 10, limits, None, log.clone());
        let mut sub = fanout
            .subscription(ResourceVersion::new(1, 0))
            .expect("subscribes");
        let mut delivered = Vec::new();
        for _tick in 0..10 {
            if let Ok(event) = tokio::time::timeout(Duration::from_millis(100), sub.next()).await {
                delivered.push(event.expect("replayed").seq());
                if delivered.len() == 3 {
                    break;
                }
            }
        }
        assert_eq!(delivered, vec![1, 2, 3], "the replay was starved");
        assert_eq!(
            log.started.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the read dropped by each tick was taken up, not started again"
        );
    }

    #[tokio::test]
    async fn a_bookmark_moves_to_the_head_only_once_everything_up_to_it_arrived() {
        let fanout = mk_fanout(8, 8, None);
        let mut sub = attached(&fanout).await;
        fanout.publish(mk_event(2, 10));
        // Event 2 is queued, not yet read: the bookmark stays at what was delivered.
        let mark = sub.bookmark().expect("bookmark");
        assert_eq!((mark.at.seq, mark.head.seq), (1, 2));
        assert_eq!(sub.next().await.expect("event 2").seq(), 2);
        fanout.publish(mk_event(3, 10));
        assert_eq!(sub.next().await.expect("event 3").seq(), 3);
        assert_eq!(sub.bookmark().expect("bookmark").at.seq, 3);
    }
}
