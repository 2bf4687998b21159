//! The tail: one reader per process follows the change log after every `NOTIFY` (and on a
//! slow timer as a safety net) and publishes what it reads into the fan-out
//! (`store/fanout.rs`), which serves the watchers. Subscriptions that start behind the fan-out's
//! ring replay from the log through [`LogReplay`], page by page. Every page is bounded by
//! bytes as well as by count.
//!
//! The reader is a state machine ([`Step`]): connect and LISTEN, check the database is still
//! the history followed, read pages until caught up, wait for a notification; a failure in any
//! state drops the connection and reconnects.
//!
//! The tail proves it is alive. A heartbeat reads the database's sequence head from a
//! connection of its own at least every second; the head counts as confirmed once the reader
//! has fanned out everything up to it. The reader's own queries carry timeouts and it must
//! complete a round trip regularly. If either proof is older than the staleness bound (a
//! stopped or half-open LISTEN connection, an unreachable database), the fan-out stops sending
//! bookmarks until both proofs are fresh again; nobody is cut off, since the log still holds
//! every change after each watcher's cursor.
//!
//! The tail also rotates the epoch when the history went back (`history.rs`): the head going
//! back in the same epoch, the event at its head changed, an epoch it already left coming
//! back, sync_state recreated, the operator's marker, or (on every reconnect) the database's
//! identity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::{oneshot, Notify};
use tokio_postgres::{AsyncMessage, Row, Statement};

use super::connect::PgTls;
use super::epoch::{self, CHANNEL};
use super::error::{timed, unavailable};
use super::history::{History, Mark};
use crate::store::error::{Result, StoreError};
use crate::store::fanout::{
    expired_epoch, Event, EventRenderings, EventType, Fanout, LivenessChange, Replay,
};
use crate::store::rv::{set_resource_version, ResourceVersion};

/// Rows read from the log per query.
const PAGE: i64 = 1000;
/// The application_name of the LISTEN connection (operators and tests find it by this).
pub const FEED_APPLICATION_NAME: &str = "mcp-access-feed";
/// The application_name of the heartbeat's connection.
const HEARTBEAT_APPLICATION_NAME: &str = "mcp-access-feed-heartbeat";
/// The pause before reconnecting after the reader's connection failed.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

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

/// Reads one change-log row of `epoch` as an event.
fn event_from_row(epoch: u32, row: &Row) -> Result<Event> {
    let seq: i64 = row.get("seq");
    let rv = ResourceVersion::new(epoch, seq as u64);
    let mut object: serde_json::Value = row.get("object");
    set_resource_version(&mut object, rv);
    Ok(Event {
        rv,
        event_type: EventType::parse(row.get("event"))?,
        resource: row.get("resource"),
        namespace: row.get("namespace"),
        name: row.get("name"),
        object,
        before: row.get("before"),
        rendered: EventRenderings::default(),
        size: row.get::<_, i64>("size").max(0) as usize,
        seen_at: k8s_openapi::jiff::Timestamp::now(),
    })
}

/// Page size and the liveness bound of the tail.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TailLimits {
    /// Encoded bytes per page read from the log (a page always holds at least one row).
    pub page_bytes: usize,
    /// How long the tail may go without proving it is current before it stops vouching
    /// (no bookmarks, readiness fails).
    pub staleness_bound: Duration,
    /// A new WAL timeline whose history goes on is a failover, not a reset (see `recheck`).
    pub failover_keeps_epoch: bool,
}

impl TailLimits {
    /// The reader looks at the log at least this often, notified or not.
    fn poll_interval(&self) -> Duration {
        (self.staleness_bound / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
    /// The heartbeat confirms the database head at least this often.
    fn heartbeat_interval(&self) -> Duration {
        self.poll_interval()
    }
    /// The reader's own queries and reconnects. Longer than the bound on purpose: a stalled
    /// reader is reported as stale (bookmarks stop) before it quietly heals, never after.
    fn reader_timeout(&self) -> Duration {
        self.staleness_bound * 2
    }
    fn check_interval(&self) -> Duration {
        (self.staleness_bound / 20).clamp(Duration::from_millis(20), Duration::from_millis(250))
    }
}

/// The change log as the fan-out's [`Replay`]: pages read from a pool connection.
pub(crate) struct LogReplay {
    pub pool: deadpool_postgres::Pool,
    pub limits: TailLimits,
    /// Wakes the tail's reader.
    pub wake: Arc<Notify>,
}

#[async_trait]
impl Replay for LogReplay {
    async fn read_after(&self, epoch: u32, after: u64) -> Result<Vec<Arc<Event>>> {
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
                events.push(Arc::new(event_from_row(epoch, row)?));
            }
        }
        Ok(events)
    }

    fn nudge(&self) {
        self.wake.notify_one();
    }
}

/// The reader's connection: LISTENing, with the page statement prepared. Dropping it ends the
/// task that drives the connection, which closes the socket.
struct Listener {
    client: tokio_postgres::Client,
    page: Statement,
    /// Resolves with the reason once the connection ended.
    closed: oneshot::Receiver<String>,
    _driver: Driver,
}

/// The task that drives a connection, ended when dropped: a connection given up on is closed,
/// never left open in a detached task.
struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A history reset to act on: rotate `epoch`, because of `reason`.
struct Reset {
    epoch: u32,
    reason: String,
}

/// What the database says about the history this replica followed.
enum Continuity {
    /// It holds everything handed out, and the last change fanned out is unchanged.
    Kept,
    /// Another epoch already: someone else rotated; the reader switches.
    Elsewhere,
    /// Nothing contradicts it, and nothing proves it (no change fanned out in this epoch, or
    /// the last one trimmed).
    Unproven,
    /// The history went back or went on differently: rotate.
    Broken(Reset),
}

/// The reader's states. Each step does one thing and names the next; an error in any of them
/// is a transition to `Connect` (after a pause).
enum Step {
    /// Not connected: connect and LISTEN (after [`RECONNECT_PAUSE`] when the last connection
    /// failed).
    Connect { pause: bool },
    /// Just connected: a new connection may lead to another database than the last one did,
    /// so check it is still the history followed.
    Recheck(Listener),
    /// The history was reset: rotate the epoch, then read on.
    Reset(Listener, Reset),
    /// Read the next page after the head and fan it out.
    Read(Listener),
    /// Caught up: wait for a notification, the poll interval, or the connection's end.
    Wait(Listener),
}

/// What one page says.
enum Verdict {
    /// Events to fan out; `more` when the log holds more than the page did as of its read
    /// (read the next page at once). Otherwise the reader waits for the next notification.
    Publish { events: Vec<Arc<Event>>, more: bool },
    /// The database is at an epoch the fan-out has not followed yet: switch, then read on.
    Switch { epoch: u32, minted_at: u64 },
    /// The history in the database is not the one the fan-out followed: rotate.
    Reset(Reset),
}

/// The reader, the heartbeat and the liveness check of one process.
pub(crate) struct Tail {
    pub fanout: Arc<Fanout>,
    pub history: Arc<History>,
    pub limits: TailLimits,
    /// Woken by the LISTEN connection, by a write or list that found the history went back,
    /// and by a subscription waiting for an epoch switch.
    pub wake: Arc<Notify>,
    /// Sets a session's limits (`connect::session_setup`), run on each connection first.
    pub setup: Arc<str>,
}

impl Tail {
    /// Runs the reader, the heartbeat and the liveness check until the process ends.
    pub(crate) async fn run(self: Arc<Self>, pg: tokio_postgres::Config, tls: PgTls) {
        let mut pg = pg;
        pg.application_name(FEED_APPLICATION_NAME);
        let reader = async {
            let mut step = Step::Connect { pause: false };
            loop {
                step = match self.step(step, &pg, &tls).await {
                    Ok(next) => next,
                    Err(e) => {
                        tracing::warn!(error = %e, "change feed connection lost; reconnecting");
                        Step::Connect { pause: true }
                    }
                };
            }
        };
        tokio::join!(reader, self.heartbeat(&pg, &tls), self.check_liveness());
    }

    /// One transition of the reader.
    async fn step(&self, step: Step, pg: &tokio_postgres::Config, tls: &PgTls) -> Result<Step> {
        let limit = self.limits.reader_timeout();
        match step {
            Step::Connect { pause } => {
                if pause {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
                Ok(Step::Recheck(self.connect(pg, tls).await?))
            }
            Step::Recheck(listener) => match timed(limit, self.recheck(&listener.client)).await? {
                Some(reset) => Ok(Step::Reset(listener, reset)),
                None => Ok(Step::Read(listener)),
            },
            Step::Reset(listener, reset) => {
                self.reset(&listener.client, reset).await?;
                Ok(Step::Read(listener))
            }
            Step::Read(listener) => {
                let started = Instant::now();
                let mark = self.history.mark();
                let (_, head) = self.fanout.position();
                let page_bytes = self.limits.page_bytes as i64;
                let rows = timed(limit, async {
                    listener
                        .client
                        .query(&listener.page, &[&(head as i64), &PAGE, &page_bytes])
                        .await
                        .map_err(unavailable)
                })
                .await?;
                match self.judge(&rows, mark)? {
                    Verdict::Publish { events, more } => {
                        self.fanout.publish_page(events, started);
                        Ok(if more {
                            Step::Read(listener)
                        } else {
                            Step::Wait(listener)
                        })
                    }
                    Verdict::Switch { epoch, minted_at } => {
                        self.fanout.switch_epoch(epoch, minted_at);
                        // Read on from the new epoch's start at once.
                        Ok(Step::Read(listener))
                    }
                    Verdict::Reset(reset) => Ok(Step::Reset(listener, reset)),
                }
            }
            Step::Wait(mut listener) => {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.limits.poll_interval()) => {}
                    reason = &mut listener.closed => {
                        return Err(StoreError::Unavailable(reason.unwrap_or_default()));
                    }
                }
                Ok(Step::Read(listener))
            }
        }
    }

    /// Connects, LISTENs and prepares the page statement, each step under the reader's
    /// deadline. The connection is driven by a task the [`Listener`] owns.
    async fn connect(&self, pg: &tokio_postgres::Config, tls: &PgTls) -> Result<Listener> {
        let limit = self.limits.reader_timeout();
        let (client, mut connection) = timed(limit, async {
            pg.connect(tls.clone()).await.map_err(unavailable)
        })
        .await?;
        let (closed_tx, closed) = oneshot::channel::<String>();
        let wake = self.wake.clone();
        // From here on, dropping the guard (on any error) ends the driver.
        let driver = Driver(tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            let reason = loop {
                match messages.next().await {
                    Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break e.to_string(),
                    None => break "connection closed".to_string(),
                }
            };
            let _ = closed_tx.send(reason);
        }));
        timed(limit, async {
            client
                .batch_execute(&format!("{}; LISTEN {CHANNEL}", self.setup))
                .await
                .map_err(unavailable)
        })
        .await?;
        let page = timed(limit, async {
            client.prepare(PAGE_SQL).await.map_err(unavailable)
        })
        .await?;
        Ok(Listener {
            client,
            page,
            closed,
            _driver: driver,
        })
    }

    /// What one page read after `mark` was taken says: fan out, switch epochs, or rotate.
    fn judge(&self, rows: &[Row], mark: Mark) -> Result<Verdict> {
        let Some(first) = rows.first() else {
            return Err(StoreError::Internal("sync_state row is missing".into()));
        };
        let epoch = first.get::<_, i32>("epoch") as u32;
        let db_seq = first.get::<_, i64>("db_seq") as u64;
        let reset = |reason| Ok(Verdict::Reset(Reset { epoch, reason }));
        if let Some(reason) = History::behind(mark, epoch, db_seq) {
            return reset(reason);
        }
        if let Some((epoch, reason)) = self.history.take_reset_request() {
            return Ok(Verdict::Reset(Reset { epoch, reason }));
        }
        if first.get::<_, bool>("rotate_requested") {
            return reset(
                "sync_state.rotate_requested is set (the database was marked restored)".into(),
            );
        }
        if let Some(minted) = first.get::<_, Option<u32>>("epoch_table") {
            let table = first.get::<_, u32>("table_oid");
            if minted != table {
                return reset(format!(
                    "sync_state was recreated (table OID {minted} -> {table}): a dump restored \
                     in place"
                ));
            }
        }
        let (followed, head) = self.fanout.position();
        if epoch == followed && db_seq < head {
            return reset(format!(
                "the change history went back from {head} to {db_seq} in epoch {epoch}: an \
                 older copy of the database was restored"
            ));
        }
        if epoch != followed {
            if self.fanout.has_retired(epoch) {
                return reset(format!(
                    "the database returned to epoch {epoch}, which this replica left: an older \
                     copy was restored"
                ));
            }
            // The new epoch starts where it was minted (0: by a version that did not record
            // it, which never moved the sequence back).
            let minted_at = first.get::<_, i64>("epoch_seq") as u64;
            return Ok(Verdict::Switch { epoch, minted_at });
        }
        let mut events = Vec::with_capacity(rows.len());
        let mut last = head;
        for row in rows {
            if let Some(seq) = row.get::<_, Option<i64>>("seq") {
                last = seq as u64;
                events.push(Arc::new(event_from_row(epoch, row)?));
            }
        }
        Ok(Verdict::Publish {
            events,
            more: last < db_seq,
        })
    }

    /// On (re)connect: whether the database is still the history this reader followed. Its
    /// identity must match what the epoch was minted on, and in the same epoch its head must
    /// not be behind this reader's and the event at this reader's head must be the one it
    /// fanned out. Returns the epoch to rotate and why.
    ///
    /// A new WAL timeline alone (a promoted standby) is a failover that kept the history when
    /// `failover_keeps_epoch` is set and the checks below prove it: the database is at least
    /// as far as everything this replica handed out, and the last change it fanned out is the
    /// one stored there. The timeline is then recorded as the epoch's own; anything less
    /// rotates, as any other identity change does.
    async fn recheck(&self, client: &tokio_postgres::Client) -> Result<Option<Reset>> {
        let mark = self.history.mark();
        let snapshot = epoch::read(client).await?;
        let promoted = self.limits.failover_keeps_epoch && snapshot.promoted();
        // Any change of identity rotates, but a promotion that the history checks below
        // prove to be a failover.
        let changed = snapshot.reset_reason(epoch::Unknown::Ignored);
        if let Some(reason) = changed.clone().filter(|_| !promoted) {
            return Ok(Some(Reset {
                epoch: snapshot.epoch,
                reason,
            }));
        }
        Ok(
            match (changed, self.continuity(client, mark, &snapshot).await?) {
                (_, Continuity::Broken(reset)) => Some(reset),
                (None, _) | (Some(_), Continuity::Elsewhere) => None,
                (Some(reason), Continuity::Kept) => {
                    epoch::adopt_timeline(client, snapshot.epoch).await?;
                    tracing::warn!(
                        epoch = snapshot.epoch,
                        %reason,
                        "a failover kept the change history (every change handed out is there): the epoch stays, no watcher relists"
                    );
                    None
                }
                (Some(reason), Continuity::Unproven) => Some(Reset {
                    epoch: snapshot.epoch,
                    reason: format!(
                        "{reason}; nothing this replica fanned out proves the history went on"
                    ),
                }),
            },
        )
    }

    /// Whether the database goes on with the history this replica followed (its identity
    /// aside).
    async fn continuity(
        &self,
        client: &tokio_postgres::Client,
        mark: Mark,
        snapshot: &epoch::Snapshot,
    ) -> Result<Continuity> {
        let (followed, head) = self.fanout.position();
        if self.fanout.has_retired(snapshot.epoch) {
            return Ok(Continuity::Broken(Reset {
                epoch: snapshot.epoch,
                reason: format!(
                    "the database returned to epoch {}, which this replica left: an older copy \
                     was restored",
                    snapshot.epoch
                ),
            }));
        }
        if snapshot.epoch != followed {
            // Rotated meanwhile by someone else: the reader switches on its next page.
            return Ok(Continuity::Elsewhere);
        }
        let epoch = followed;
        if let Some(reason) = History::behind(mark, epoch, snapshot.seq) {
            return Ok(Continuity::Broken(Reset { epoch, reason }));
        }
        if snapshot.seq < head {
            return Ok(Continuity::Broken(Reset {
                epoch,
                reason: format!(
                    "the change history went back from {head} to {} in epoch {epoch}: an older \
                     copy of the database was restored",
                    snapshot.seq
                ),
            }));
        }
        let Some(last) = self.fanout.last() else {
            return Ok(Continuity::Unproven);
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
            return Ok(Continuity::Unproven);
        };
        let mut object: serde_json::Value = row.get("object");
        set_resource_version(&mut object, last.rv);
        let same = row.get::<_, &str>("resource") == last.resource
            && row.get::<_, &str>("namespace") == last.namespace
            && row.get::<_, &str>("name") == last.name
            && row.get::<_, &str>("event") == last.event_type.as_str()
            && object == last.object;
        if same {
            return Ok(Continuity::Kept);
        }
        Ok(Continuity::Broken(Reset {
            epoch,
            reason: format!(
                "the change at {} is not the one this replica fanned out: the history was \
                 replaced by an older copy that went on differently",
                last.rv
            ),
        }))
    }

    /// Rotates the epoch because the history was reset; the next page switches every watcher
    /// of every replica to the new epoch (they relist).
    async fn reset(&self, client: &tokio_postgres::Client, reset: Reset) -> Result<()> {
        let Reset { epoch, reason } = reset;
        let rotated = timed(self.limits.reader_timeout(), async {
            epoch::rotate(client, epoch).await
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
                    if let Err(e) = client.batch_execute(&self.setup).await {
                        driver.abort();
                        return Err(unavailable(e));
                    }
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
                Ok((epoch, seq)) => self.fanout.confirm_head(epoch, seq, asked),
                Err(e) => {
                    tracing::debug!(error = %e, "change feed heartbeat failed");
                    if let Some((_, driver)) = connection.take() {
                        driver.abort();
                    }
                }
            }
        }
    }

    /// Has the fan-out mark itself stalled when a proof is older than the bound, and reports
    /// recovery.
    async fn check_liveness(&self) {
        loop {
            tokio::time::sleep(self.limits.check_interval()).await;
            match self.fanout.check_liveness(Instant::now()) {
                Some(LivenessChange::Recovered) => {
                    tracing::info!("change feed recovered: the database head is confirmed again")
                }
                Some(LivenessChange::Stalled {
                    subscribers,
                    reader_silent,
                    unconfirmed,
                }) => tracing::warn!(
                    bound_ms = self.limits.staleness_bound.as_millis() as u64,
                    subscribers,
                    reader_silent_ms = reader_silent.as_millis() as u64,
                    unconfirmed_ms = unconfirmed.as_millis() as u64,
                    "change feed stalled: watches get no bookmarks until it recovers, then go on where they stopped"
                ),
                None => {}
            }
        }
    }
}
