//! The PostgreSQL adapter of the storage port (DESIGN §3): configuration, the pool, the write
//! gate and the background tasks. Connecting (with TLS) is in `connect`, the schema in
//! `migrate`, the epoch in `epoch`, reads in `list`, the write transaction in `tx` (queued by
//! `group`), the SQL of the facts kinds ask for in `sessions` and `revocations`, the LISTEN
//! tail that feeds the watch fan-out in `tail`, and how far the history went in `history`.
//! Its modules import one another, never this file.

mod coalesce;
pub(super) mod connect;
mod epoch;
mod error;
mod group;
mod history;
mod list;
pub(super) mod migrate;
mod params;
mod revocations;
mod sessions;
pub(super) mod tail;
mod tx;

pub use coalesce::ListMetrics;
pub use sessions::NEXT_SESSION_EXPIRY_SQL;

use std::sync::Arc;
use std::time::Duration;

use apis::strategy::{Context, ObjectKey, Read, Strategy, Withdrawal};
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use tokio::sync::Notify;

use super::error::{Result, StoreError};
use super::fanout::{Fanout, FanoutLimits, FeedMetrics, Subscription};
use super::port::{Preconditions, SessionSignals, Store, Written};
use super::query::{ListQuery, ObjectList};
use super::raw::RawList;
use super::rv::ResourceVersion;
use super::transact;
use crate::tasks::Background;
use connect::{session_setup, with_transport_limits, PgTls, SessionLimits, SslMode};
use error::{pg_err, pool_err};
use group::Writer;
use history::History;
use migrate::apply_migrations;
use tail::{LogReplay, Tail, TailLimits};

/// Store settings.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub pg: tokio_postgres::Config,
    /// The TLS connector for `sslmode` prefer/require/verify-*; `None`: unverified TLS when
    /// the server offers it (libpq's `prefer`), plain when `pg` disables TLS.
    pub tls: Option<PgTls>,
    /// Connections in the pool.
    pub pool_size: usize,
    /// How long a request waits for a pool connection (or to create or recycle one) and a
    /// writer for its turn, before it is answered 503.
    pub pool_timeout: Duration,
    /// Server-side statement, lock and idle-transaction timeouts of every store connection.
    pub session: SessionLimits,
    /// Change-log events kept for watches and continue tokens.
    pub retained_events: u64,
    /// Server-wide maximum session lifetime.
    pub max_session_ttl: SignedDuration,
    /// Events queued per live watcher before it is cut off.
    pub watcher_buffer: usize,
    /// Recent events kept in memory for watchers that start slightly behind.
    pub ring_capacity: usize,
    /// Total encoded bytes of those events.
    pub ring_bytes: usize,
    /// Encoded bytes read from the change log per page (at least one row per page).
    pub page_bytes: usize,
    /// How long the change feed may go without confirming the database head before it sends
    /// no more bookmarks and readiness fails.
    pub staleness_bound: Duration,
    /// How often the change log is trimmed.
    pub trim_interval: Duration,
    /// Rotate the epoch at start even if the database is the one it was minted on (an
    /// operator's `--rotate-epoch`, after restoring a copy nothing else can tell apart).
    pub rotate_epoch: bool,
    /// A new WAL timeline under a running replica is a failover that kept the history when
    /// the database holds everything the replica handed out (`--failover-keeps-epoch`).
    pub failover_keeps_epoch: bool,
}

impl StoreConfig {
    pub fn new(pg: tokio_postgres::Config) -> Self {
        Self {
            pg,
            tls: None,
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            session: SessionLimits::default(),
            retained_events: 100_000,
            max_session_ttl: SignedDuration::from_hours(24),
            watcher_buffer: 1024,
            ring_capacity: 8192,
            ring_bytes: 64 << 20,
            page_bytes: 8 << 20,
            staleness_bound: Duration::from_secs(5),
            trim_interval: Duration::from_secs(10),
            rotate_epoch: false,
            failover_keeps_epoch: false,
        }
    }
}

/// The PostgreSQL implementation of [`Store`]. Cheap to clone; background tasks stop when
/// the last clone is dropped.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// The queue of this process's one writer (group commit).
    writer: Writer,
    /// The watch fan-out the tail feeds.
    fanout: Arc<Fanout>,
    /// What reads need: the pool and the history their heads are checked against.
    reader: list::Reader,
    config: StoreConfig,
    /// The change feed and the log trimmer, aborted when the last clone is dropped.
    tasks: Background,
    signals: Arc<SessionSignals>,
}

impl PgStore {
    /// Applies migrations, adopts the epoch (rotating it only when the database may have been
    /// restored, or when asked: `epoch.rs`), and starts the change feed and the log trimmer.
    pub async fn start(config: StoreConfig) -> Result<Self> {
        let tls = match &config.tls {
            Some(tls) => tls.clone(),
            None => PgTls::new(SslMode::Prefer, None)
                .map_err(|e| StoreError::Internal(e.to_string()))?,
        };
        // Migrations may legitimately run long: no statement timeout, but keepalives and a
        // connect timeout so a dead database fails startup instead of hanging it.
        let setup = with_transport_limits(&config.pg, &config.session);
        let (mut client, connection) = setup.connect(tls.clone()).await.map_err(pg_err)?;
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "setup connection ended");
            }
        });
        apply_migrations(&mut client).await?;
        let (epoch, head, rotated) = epoch::adopt(&client, config.rotate_epoch).await?;
        drop(client);
        driver.abort();
        match rotated {
            Some(reason) => tracing::warn!(
                epoch,
                head,
                sslmode = tls.mode().as_str(),
                %reason,
                "storage ready; epoch rotated: every watch and continue token relists"
            ),
            None => tracing::info!(
                epoch,
                head,
                sslmode = tls.mode().as_str(),
                "storage ready; epoch kept"
            ),
        }

        let mut session = with_transport_limits(&config.pg, &config.session);
        let setup: Arc<str> = session_setup(&config.session).into();
        if session.get_application_name().is_none() {
            session.application_name("mcp-access");
        }
        let manager = Manager::from_config(
            session.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(config.pool_timeout))
            .create_timeout(Some(config.pool_timeout))
            .recycle_timeout(Some(config.pool_timeout))
            .post_create(deadpool_postgres::Hook::async_fn({
                let setup = setup.clone();
                move |client, _| {
                    let setup = setup.clone();
                    Box::pin(async move {
                        client
                            .batch_execute(&setup)
                            .await
                            .map_err(deadpool_postgres::HookError::Backend)
                    })
                }
            }))
            .build()
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let limits = TailLimits {
            page_bytes: config.page_bytes.max(1),
            staleness_bound: config.staleness_bound,
            failover_keeps_epoch: config.failover_keeps_epoch,
        };
        let wake = Arc::new(Notify::new());
        let replay = LogReplay {
            pool: pool.clone(),
            limits,
            wake: wake.clone(),
        };
        let fanout = Fanout::new(
            epoch,
            head,
            FanoutLimits {
                buffer: config.watcher_buffer,
                ring_capacity: config.ring_capacity,
                ring_bytes: config.ring_bytes,
                epoch_wait: config.staleness_bound,
            },
            Some(config.staleness_bound),
            Arc::new(replay),
        );
        let history = History::new(fanout.clone(), wake.clone());
        let tail = Arc::new(Tail {
            fanout: fanout.clone(),
            history: history.clone(),
            limits,
            wake,
            setup,
        });
        let mut tasks = Background::default();
        tasks.spawn("change feed", tail.run(session, tls));
        let (writer, writing) = Writer::new(pool.clone(), history.clone(), config.pool_timeout);
        tasks.spawn("writer", writing);
        let trimmer = Trimmer {
            pool: pool.clone(),
            retained: config.retained_events,
        };
        let interval = config.trim_interval;
        tasks.spawn("change log trimmer", async move {
            loop {
                tokio::time::sleep(interval).await;
                if let Err(e) = trimmer.trim().await {
                    tracing::warn!(error = %e, "change log trim failed");
                }
            }
        });
        Ok(Self {
            inner: Arc::new(Inner {
                reader: list::Reader {
                    pool: pool.clone(),
                    history,
                    lists: coalesce::Coalescer::new(),
                },
                pool,
                writer,
                fanout,
                config,
                tasks,
                signals: Arc::default(),
            }),
        })
    }

    /// Deletes change-log entries beyond the retention, in small batches, outside the
    /// sync-state lock. Returns how many were deleted.
    pub async fn trim_log(&self) -> Result<u64> {
        Trimmer {
            pool: self.inner.pool.clone(),
            retained: self.inner.config.retained_events,
        }
        .trim()
        .await
    }

    /// Write groups run so far and the mutations they held (group commit: the mean group
    /// size is how many mutations one commit served).
    pub fn write_groups(&self) -> (u64, u64) {
        self.inner.writer.groups()
    }

    /// Write groups run a second time, each mutation in its own savepoint, because the
    /// database refused one of their writes.
    pub fn write_group_reruns(&self) -> u64 {
        self.inner.writer.reruns()
    }

    /// Number of live change-feed subscribers.
    pub fn live_subscribers(&self) -> usize {
        self.inner.fanout.subscriber_count()
    }

    /// Whether the change feed currently vouches for delivering every committed change
    /// within its staleness bound (part of readiness).
    pub fn change_feed_live(&self) -> bool {
        self.inner.tasks.all_running() && self.inner.fanout.is_live()
    }

    /// Resolves with a report when the change feed or the log trimmer ends or panics (they
    /// run until the store is dropped): the process must not serve on without them.
    pub fn task_ended(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        self.inner.tasks.ended()
    }

    /// The change feed's metrics (head, lag, cut-offs), to register before serving.
    pub fn change_feed_metrics(&self) -> FeedMetrics {
        self.inner.fanout.metrics()
    }

    /// How many lists of the current state were asked and how many snapshot reads served
    /// them (to register before serving; `counts` for tests).
    pub fn list_metrics(&self) -> ListMetrics {
        self.inner.reader.lists.metrics()
    }

    /// Events and encoded bytes held in the change feed's in-memory ring.
    pub fn change_feed_ring(&self) -> (usize, usize) {
        self.inner.fanout.ring_usage()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    /// Runs a mutation through the group-commit writer (see [`group`]). Writers are
    /// serialized by the sync-state row lock anyway; queueing them here first keeps that lock
    /// uncontended, leaves pool connections to readers, and lets one commit serve the
    /// mutations that queued meanwhile. A mutation waits for its turn at most as long as for
    /// a pool connection, then is answered 503 and never runs.
    /// `prefetch`: the reads the mutation's first round asks for (read with the lock).
    /// `mutation` may run twice (a group the database refused a write of runs again).
    async fn mutate<T, F, Fut>(&self, prefetch: Vec<Read>, mutation: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(group::GroupTx, Arc<group::Deferred>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        self.inner
            .writer
            .submit(self.inner.signals.clone(), prefetch, mutation)
            .await
    }
}

struct Trimmer {
    pool: Pool,
    retained: u64,
}

impl Trimmer {
    async fn trim(&self) -> Result<u64> {
        const BATCH: i64 = 5000;
        let client = self.pool.get().await.map_err(pool_err)?;
        let mut total = 0;
        loop {
            let n = client
                .execute(
                    "DELETE FROM change_log WHERE seq IN (
                         SELECT seq FROM change_log
                          WHERE seq <= (SELECT seq FROM sync_state WHERE id = 1) - $1
                          ORDER BY seq LIMIT $2)",
                    &[&(self.retained as i64), &BATCH],
                )
                .await
                .map_err(pg_err)?;
            total += n;
            if n < BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

impl PgStore {
    /// The request's context under this server's configured limits.
    fn with_limits(&self, ctx: &Context) -> Context {
        Context {
            max_session_ttl: self.inner.config.max_session_ttl,
            ..ctx.clone()
        }
    }
}

#[async_trait]
impl Store for PgStore {
    async fn get<K: Strategy>(&self, namespace: &str, name: &str) -> Result<K> {
        list::get(&self.inner.reader, namespace, name).await
    }

    async fn list<K: Strategy>(&self, query: &ListQuery) -> Result<ObjectList<K>> {
        list::list(&self.inner.reader, query).await
    }

    async fn list_raw<K: Strategy>(&self, query: &ListQuery) -> Result<RawList> {
        list::list_raw::<K>(&self.inner.reader, query).await
    }

    async fn create<K: Strategy>(
        &self,
        mut object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>> {
        transact::prepare_new(&mut object, ctx.now)?;
        let ctx = self.with_limits(ctx);
        let prefetch = transact::create_reads(&object, &ctx);
        let asked = Arc::new((object, ctx));
        self.mutate(prefetch, move |tx, done| {
            let asked = asked.clone();
            async move {
                let (object, ctx) = &*asked;
                transact::create(tx, object.clone(), ctx, dry_run, &*done).await
            }
        })
        .await
    }

    async fn update<K: Strategy>(
        &self,
        object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>> {
        transact::check_update(&object)?;
        let ctx = self.with_limits(ctx);
        let prefetch = vec![Read::Object(ObjectKey::for_object(&object))];
        let asked = Arc::new((object, ctx));
        self.mutate(prefetch, move |tx, done| {
            let asked = asked.clone();
            async move {
                let (object, ctx) = &*asked;
                transact::update(tx, object.clone(), ctx, dry_run, &*done).await
            }
        })
        .await
    }

    async fn delete<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        by: &Withdrawal,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        let (by, pre) = (by.clone(), preconditions.clone());
        let ctx = self.with_limits(ctx);
        let prefetch = vec![Read::Object(ObjectKey::of::<K>(&namespace, &name))];
        let asked = Arc::new((namespace, name, by, pre, ctx));
        self.mutate(prefetch, move |tx, done| {
            let asked = asked.clone();
            async move {
                let (namespace, name, by, pre, ctx) = &*asked;
                transact::delete(tx, namespace, name, by, ctx, pre, dry_run, &*done).await
            }
        })
        .await
    }

    async fn write_status<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        requested: &Value,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        let (requested, pre) = (requested.clone(), preconditions.clone());
        let ctx = self.with_limits(ctx);
        let prefetch = vec![Read::Object(ObjectKey::of::<K>(&namespace, &name))];
        let asked = Arc::new((namespace, name, requested, pre, ctx));
        self.mutate(prefetch, move |tx, done| {
            let asked = asked.clone();
            async move {
                let (namespace, name, requested, pre, ctx) = &*asked;
                transact::write_status(tx, namespace, name, requested, ctx, pre, dry_run, &*done)
                    .await
            }
        })
        .await
    }

    async fn expire_sessions(&self, now: Timestamp) -> Result<Vec<apis::AccessSession>> {
        self.mutate(Vec::new(), move |tx, done| async move {
            transact::expire_sessions(tx, now, &*done).await
        })
        .await
    }

    async fn next_session_expiry(&self) -> Result<Option<Timestamp>> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sessions::NEXT_SESSION_EXPIRY_SQL)
            .await
            .map_err(pg_err)?;
        let row = client.query_opt(&stmt, &[]).await.map_err(pg_err)?;
        match row.map(|r| r.get::<_, String>(0)) {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|e| {
                StoreError::Internal(format!("stored spec.expiresAt {text:?} is unreadable: {e}"))
            }),
        }
    }

    fn session_signals(&self) -> Arc<SessionSignals> {
        self.inner.signals.clone()
    }

    async fn server_fenced(&self, server_uid: &str, namespace: &str) -> Result<bool> {
        let client = self.client().await?;
        let (sql, params) = revocations::fenced(server_uid, namespace);
        let row = client
            .query_one(&sql, &params::bound(&params))
            .await
            .map_err(pg_err)?;
        Ok(row.get::<_, bool>(0))
    }

    async fn current_version(&self) -> Result<ResourceVersion> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT epoch, seq FROM sync_state WHERE id = 1", &[])
            .await
            .map_err(pg_err)?;
        Ok(ResourceVersion::new(
            row.get::<_, i32>(0) as u32,
            row.get::<_, i64>(1) as u64,
        ))
    }

    async fn subscribe(&self, from: ResourceVersion) -> Result<Subscription> {
        let client = self.client().await?;
        let list::Head {
            epoch,
            seq: head,
            horizon,
        } = list::head(&client).await?;
        if from.epoch != epoch {
            return Err(StoreError::EpochChanged(format!(
                "too old resource version: {from}: the change history was reset (the epoch \
                 changed: a restored database or an operator's --rotate-epoch); relist"
            )));
        }
        if from.seq > head {
            return Err(StoreError::Expired(format!(
                "too old resource version: {from} is ahead of the current state ({}); relist",
                ResourceVersion::new(epoch, head)
            )));
        }
        if from.seq < horizon {
            return Err(StoreError::Expired(format!(
                "too old resource version: {from} ({})",
                ResourceVersion::new(epoch, horizon)
            )));
        }
        self.inner.fanout.subscription(from)
    }
}
