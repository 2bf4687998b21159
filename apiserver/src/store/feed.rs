//! The change feed: one reader per process tails the change log after every `NOTIFY` (and on
//! a slow timer as a safety net), keeps a ring of recent events, and fans them out in memory
//! to subscribers through bounded queues.
//!
//! A subscriber that starts behind replays from the log page by page, then attaches to the
//! live fan-out once the ring covers its cursor. A subscriber whose queue fills up is cut off
//! and sees `Expired`: events are never skipped silently. An epoch rotation expires everyone.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio_postgres::{AsyncMessage, Row};

use super::rv::ResourceVersion;
use super::{Result, StoreError};

/// The channel every committing transaction notifies.
pub(super) const CHANNEL: &str = "mcp_access_changes";
/// Rows read from the log per query.
const PAGE: i64 = 1000;
/// How often the reader looks at the log without a notification.
const SAFETY_POLL: Duration = Duration::from_secs(1);

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

const LOG_COLUMNS: &str = "seq, resource, namespace, name, event, object, before";

/// Shared state of the feed.
pub(super) struct Feed {
    state: Mutex<State>,
    pool: deadpool_postgres::Pool,
    /// Queue length of each live subscriber.
    buffer: usize,
    /// Events kept in memory for subscribers that attach slightly behind.
    ring_capacity: usize,
    /// Woken by the LISTEN connection.
    wake: Notify,
}

struct State {
    epoch: u32,
    /// Last sequence fanned out.
    head: u64,
    ring: VecDeque<Arc<Event>>,
    subscribers: Vec<Slot>,
}

struct Slot {
    tx: mpsc::Sender<Arc<Event>>,
    after: u64,
    cut_off: Arc<AtomicBool>,
}

impl Feed {
    pub(super) fn new(
        pool: deadpool_postgres::Pool,
        epoch: u32,
        head: u64,
        buffer: usize,
        ring_capacity: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                epoch,
                head,
                ring: VecDeque::with_capacity(ring_capacity.min(4096)),
                subscribers: Vec::new(),
            }),
            pool,
            buffer: buffer.max(1),
            ring_capacity,
            wake: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is one step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of live subscribers (for metrics and tests).
    pub(super) fn subscriber_count(&self) -> usize {
        self.state().subscribers.len()
    }

    /// Runs the reader until the process ends: keeps a LISTEN connection, reconnecting
    /// after failures, and tails the log.
    pub(super) async fn run(self: Arc<Self>, pg: tokio_postgres::Config) {
        loop {
            if let Err(e) = self.clone().listen_and_tail(&pg).await {
                tracing::warn!(error = %e, "change feed connection lost; reconnecting");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn listen_and_tail(self: Arc<Self>, pg: &tokio_postgres::Config) -> Result<()> {
        let unavailable = |e: tokio_postgres::Error| StoreError::Unavailable(e.to_string());
        let (client, mut connection) = pg
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(unavailable)?;
        let me = self.clone();
        let (closed_tx, mut closed_rx) = tokio::sync::oneshot::channel::<String>();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => me.wake.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        let _ = closed_tx.send(e.to_string());
                        return;
                    }
                }
            }
            let _ = closed_tx.send("connection closed".into());
        });
        let result = async {
            client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .map_err(unavailable)?;
            let statement = client
                .prepare(&format!(
                    "SELECT s.epoch, c.* FROM sync_state s LEFT JOIN LATERAL (
                         SELECT {LOG_COLUMNS} FROM change_log WHERE seq > $1 ORDER BY seq LIMIT $2
                     ) c ON true"
                ))
                .await
                .map_err(unavailable)?;
            loop {
                let head = self.state().head as i64;
                let rows = client
                    .query(&statement, &[&head, &PAGE])
                    .await
                    .map_err(unavailable)?;
                let full = rows.len() as i64 == PAGE;
                self.publish(&rows)?;
                if full {
                    continue;
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(SAFETY_POLL) => {}
                    reason = &mut closed_rx => {
                        return Err(StoreError::Unavailable(reason.unwrap_or_default()));
                    }
                }
            }
        }
        .await;
        driver.abort();
        result
    }

    fn publish(&self, rows: &[Row]) -> Result<()> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let epoch = first.get::<_, i32>("epoch") as u32;
        let mut state = self.state();
        if epoch != state.epoch {
            tracing::info!(
                old = state.epoch,
                new = epoch,
                "epoch rotated; ending every watch"
            );
            state.expire_all();
            state.epoch = epoch;
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
                state.expire_all();
            }
            let event = Arc::new(Event::from_row(epoch, row)?);
            state.head = seq;
            if state.ring.len() >= self.ring_capacity {
                state.ring.pop_front();
            }
            if self.ring_capacity > 0 {
                state.ring.push_back(event.clone());
            }
            state.subscribers.retain(|slot| {
                if seq <= slot.after {
                    return !slot.tx.is_closed();
                }
                match slot.tx.try_send(event.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        slot.cut_off.store(true, Ordering::Release);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
        }
        Ok(())
    }

    /// A subscription starting just after `from`, which the caller has validated.
    pub(super) fn subscription(self: &Arc<Self>, from: ResourceVersion) -> Subscription {
        Subscription {
            feed: self.clone(),
            epoch: from.epoch,
            cursor: from.seq,
            backlog: VecDeque::new(),
            live: None,
        }
    }

    async fn read_log(&self, after: u64, epoch: u32) -> Result<Vec<Arc<Event>>> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT s.epoch, c.* FROM sync_state s LEFT JOIN LATERAL (
                     SELECT {LOG_COLUMNS} FROM change_log WHERE seq > $1 ORDER BY seq LIMIT $2
                 ) c ON true"
            ))
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let rows = client
            .query(&statement, &[&(after as i64), &PAGE])
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
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

impl State {
    fn expire_all(&mut self) {
        for slot in self.subscribers.drain(..) {
            slot.cut_off.store(true, Ordering::Release);
        }
        self.ring.clear();
    }
}

fn expired_epoch() -> StoreError {
    StoreError::Expired(
        "too old resource version: the change log was reset (apiserver restart)".into(),
    )
}

/// A position in the change feed that yields every later event exactly once, in order.
pub struct Subscription {
    feed: Arc<Feed>,
    epoch: u32,
    cursor: u64,
    backlog: VecDeque<Arc<Event>>,
    live: Option<(mpsc::Receiver<Arc<Event>>, Arc<AtomicBool>)>,
}

impl Subscription {
    /// The resourceVersion of the last event returned (or the starting point).
    pub fn cursor(&self) -> ResourceVersion {
        ResourceVersion::new(self.epoch, self.cursor)
    }

    /// The next event. `Expired` when this subscriber was cut off (too slow, log trimmed
    /// past it, or epoch rotated): the client must relist.
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
                    None if cut_off.load(Ordering::Acquire) => {
                        return Err(StoreError::Expired(format!(
                            "too old resource version: {}: the watcher fell behind and must relist",
                            self.cursor()
                        )))
                    }
                    None => return Err(StoreError::Unavailable("change feed stopped".into())),
                }
                continue;
            }
            if self.try_attach()? {
                continue;
            }
            let page = self.feed.read_log(self.cursor, self.epoch).await?;
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
    /// even if none of those events were for this watcher.
    pub fn advance_if_idle(&mut self) {
        let Some((rx, cut_off)) = &self.live else {
            return;
        };
        // A subscriber that was cut off has missed events: its queue may be drained, but a
        // bookmark past them would tell the client it saw everything up to the head.
        if !self.backlog.is_empty() || cut_off.load(Ordering::Acquire) {
            return;
        }
        // The reader sends and moves its head under this lock, so an empty queue seen under
        // it means nothing up to the head is still in flight.
        let state = self.feed.state();
        if state.epoch == self.epoch && rx.is_empty() && state.head > self.cursor {
            self.cursor = state.head;
        }
    }

    /// Joins the live fan-out if the ring (or the reader's head) covers the cursor.
    fn try_attach(&mut self) -> Result<bool> {
        let feed = self.feed.clone();
        let mut state = feed.state();
        if state.epoch != self.epoch {
            return Err(expired_epoch());
        }
        let covered = self.cursor >= state.head
            || state
                .ring
                .front()
                .is_some_and(|first| first.seq() <= self.cursor + 1);
        if !covered {
            return Ok(false);
        }
        let cursor = self.cursor;
        self.backlog
            .extend(state.ring.iter().filter(|e| e.seq() > cursor).cloned());
        let after = cursor.max(state.head);
        self.register(&mut state, after);
        Ok(true)
    }

    fn register(&mut self, state: &mut State, after: u64) {
        let (tx, rx) = mpsc::channel(self.feed.buffer);
        let cut_off = Arc::new(AtomicBool::new(false));
        state.subscribers.push(Slot {
            tx,
            after,
            cut_off: cut_off.clone(),
        });
        self.live = Some((rx, cut_off));
    }
}
