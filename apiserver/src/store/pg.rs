//! The PostgreSQL store (DESIGN §3).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use apis::locks::{self, RevokerAuthority, SessionSelector, Withdrawal};
use apis::rules::{
    self, admit_session, admit_session_update, validate_agent_spec, validate_metadata,
    IssuanceContext, RevokeEffect, CAUSE_AGENT_DEACTIVATED, CAUSE_SERVER_RETIRED,
};
use apis::selector::FieldRequirement;
use apis::validation::FieldError;
use apis::{
    AccessSession, AccessSessionSpec, AccessSessionStatus, Agent, AgentStatus, Enrollment,
    EnrollmentInfo, EnrollmentPhase, EnrollmentStatus, Kind, Revocation, RevocationStatus,
    ServerRef, SessionPhase,
};
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rand::Rng;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::connect::{with_session_limits, with_transport_limits, PgTls, SessionLimits, SslMode};
use super::feed::{set_resource_version, Feed, FeedLimits, FeedMetrics, CHANNEL};
use super::rv::{ContinueToken, ResourceVersion, EPOCH_LIMIT};
use super::{
    apply_migrations, ForbiddenReason, ListAt, ListQuery, ObjectList, Preconditions, Requester,
    Result, RevocationOutcome, Store, StoreError, Subscription, Written,
};

const SESSIONS: &str = AccessSession::PLURAL;
const AGENTS: &str = Agent::PLURAL;
const ENROLLMENTS: &str = Enrollment::PLURAL;
const REVOCATIONS: &str = Revocation::PLURAL;
/// Rows fetched per query while assembling a list page.
const LIST_CHUNK: usize = 1000;

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
    /// How long the change feed may go without confirming the database head before every
    /// watch is ended with 410 and readiness fails.
    pub staleness_bound: Duration,
    /// How often the change log is trimmed.
    pub trim_interval: Duration,
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
    write_gate: tokio::sync::Mutex<()>,
    feed: Arc<Feed>,
    config: StoreConfig,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn pg_err(e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    match e.as_db_error() {
        // A statement, lock or idle-transaction timeout, a cancel, or a server going away:
        // the request may succeed when retried, so 503 with Retry-After, never 500.
        Some(db)
            if [
                SqlState::QUERY_CANCELED,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::TOO_MANY_CONNECTIONS,
                // Only ever the echo of an earlier failure in the same transaction: a
                // statement pipelined after the sync-state lock request (which timed out)
                // can report first. The lock's own error is the cause.
                SqlState::IN_FAILED_SQL_TRANSACTION,
            ]
            .contains(db.code()) =>
        {
            StoreError::Unavailable(format!("{}: {}", db.code().code(), db.message()))
        }
        Some(db) => StoreError::Internal(format!("{}: {}", db.code().code(), db.message())),
        // tokio-postgres names only the step ("error performing TLS handshake"); the cause
        // (e.g. the certificate is not valid for the host name) is its source. Neither
        // carries the DSN or a password.
        None => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            StoreError::Unavailable(message)
        }
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        // Timeouts (wait, create, recycle) and a closed pool: retry later.
        e => StoreError::Unavailable(e.to_string()),
    }
}

fn now() -> Timestamp {
    // Kubernetes times have second precision.
    let t = Timestamp::now();
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

impl PgStore {
    /// Applies migrations, rotates the epoch (expiring every resourceVersion handed out
    /// before), and starts the change feed and the log trimmer.
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
        let (epoch, head) = rotate_epoch(&client).await?;
        drop(client);
        driver.abort();
        tracing::info!(
            epoch,
            head,
            sslmode = tls.mode().as_str(),
            "storage ready; epoch rotated"
        );

        let mut session = with_session_limits(&config.pg, &config.session);
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
            .build()
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let feed = Feed::new(
            pool.clone(),
            epoch,
            head,
            FeedLimits {
                buffer: config.watcher_buffer,
                ring_capacity: config.ring_capacity,
                ring_bytes: config.ring_bytes,
                page_bytes: config.page_bytes.max(1),
                staleness_bound: config.staleness_bound,
            },
        );
        let mut tasks = vec![tokio::spawn(feed.clone().run(session, tls))];
        let trimmer = Trimmer {
            pool: pool.clone(),
            retained: config.retained_events,
        };
        let interval = config.trim_interval;
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if let Err(e) = trimmer.trim().await {
                    tracing::warn!(error = %e, "change log trim failed");
                }
            }
        }));
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                write_gate: tokio::sync::Mutex::new(()),
                feed,
                config,
                tasks,
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

    /// Number of live change-feed subscribers.
    pub fn live_subscribers(&self) -> usize {
        self.inner.feed.subscriber_count()
    }

    /// Whether the change feed currently vouches for delivering every committed change
    /// within its staleness bound (part of readiness).
    pub fn change_feed_live(&self) -> bool {
        self.inner.feed.is_live()
    }

    /// The change feed's metrics (head, lag, cut-offs), to register before serving.
    pub fn change_feed_metrics(&self) -> FeedMetrics {
        self.inner.feed.metrics()
    }

    /// Events and encoded bytes held in the change feed's in-memory ring.
    pub fn change_feed_ring(&self) -> (usize, usize) {
        self.inner.feed.ring_usage()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    /// A connection for a write transaction, and this process's turn to write. Writers are
    /// serialized by the sync-state row lock anyway; queueing them here first keeps that
    /// lock uncontended (cheap to take) and leaves pool connections to readers.
    async fn writer(&self) -> Result<(tokio::sync::MutexGuard<'_, ()>, deadpool_postgres::Object)> {
        // Bounded like a pool wait: a writer stuck behind the sync-state lock must not queue
        // every later writer of this process indefinitely.
        let wait = self.inner.config.pool_timeout;
        let gate = tokio::time::timeout(wait, self.inner.write_gate.lock())
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!("no turn to write within {wait:?}; retry"))
            })?;
        Ok((gate, self.client().await?))
    }
}

async fn rotate_epoch(client: &tokio_postgres::Client) -> Result<(u32, u64)> {
    loop {
        let epoch = rand::rng().random_range(1..EPOCH_LIMIT) as i32;
        let rows = client
            .query(
                "UPDATE sync_state SET epoch = $1 WHERE id = 1 AND epoch <> $1 RETURNING seq",
                &[&epoch],
            )
            .await
            .map_err(pg_err)?;
        if let Some(row) = rows.first() {
            client
                .batch_execute(&format!("NOTIFY {CHANNEL}"))
                .await
                .map_err(pg_err)?;
            return Ok((epoch as u32, row.get::<_, i64>(0) as u64));
        }
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

/// A row of `objects` as read inside a transaction.
struct StoredRow {
    seq: u64,
    uid: Uuid,
    body: Value,
}

fn decode<K: Kind>(mut body: Value, rv: ResourceVersion) -> Result<K> {
    set_resource_version(&mut body, rv);
    serde_json::from_value(body)
        .map_err(|e| StoreError::Internal(format!("stored {} is unreadable: {e}", K::KIND)))
}

fn encode<K: Kind>(object: &K) -> Result<Value> {
    let mut body = serde_json::to_value(object).map_err(|e| StoreError::Internal(e.to_string()))?;
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    Ok(body)
}

fn namespace_of<K: Kind>(meta: &ObjectMeta) -> Result<String> {
    match (&meta.namespace, K::NAMESPACED) {
        (Some(ns), true) if !ns.is_empty() => Ok(ns.clone()),
        (_, true) => Err(StoreError::Invalid(vec![FieldError::required(
            "metadata.namespace",
            "Required value",
        )])),
        (_, false) => Ok(String::new()),
    }
}

fn scoped_ns<K: Kind>(namespace: &str) -> &str {
    if K::NAMESPACED {
        namespace
    } else {
        ""
    }
}

fn display_name(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

fn not_found<K: Kind>(name: &str) -> StoreError {
    StoreError::NotFound {
        resource: K::PLURAL,
        name: name.to_string(),
    }
}

fn modified_conflict<K: Kind>(name: &str) -> StoreError {
    StoreError::Conflict(format!(
        "Operation cannot be fulfilled on {}.{} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
        K::PLURAL,
        apis::GROUP
    ))
}

/// Fills the server-owned metadata of a new object.
fn init_metadata(meta: &mut ObjectMeta, namespace: &str, now: Timestamp) {
    if meta.name.as_deref().unwrap_or("").is_empty() {
        if let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty()) {
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let mut rng = rand::rng();
            let suffix: String = (0..5)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect();
            meta.name = Some(format!("{prefix}{suffix}"));
        }
    }
    meta.namespace = (!namespace.is_empty()).then(|| namespace.to_string());
    meta.uid = Some(Uuid::new_v4().to_string());
    meta.resource_version = None;
    meta.creation_timestamp = Some(Time(now));
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = Some(1);
    meta.managed_fields = None;
}

/// Fills the server-owned metadata of a new object and validates it with its spec.
/// Returns its namespace ("" for cluster-scoped kinds) and name.
fn prepare_new<K: Kind>(
    object: &mut K,
    now: Timestamp,
    validate_spec: impl FnOnce(&K) -> Vec<FieldError>,
) -> Result<(String, String)> {
    let ns = namespace_of::<K>(object.meta())?;
    init_metadata(object.meta_mut(), &ns, now);
    let mut errors = validate_metadata(object.meta());
    errors.extend(validate_spec(object));
    if !errors.is_empty() {
        return Err(StoreError::Invalid(errors));
    }
    Ok((ns, object.meta().name.clone().unwrap_or_default()))
}

/// Takes the user-owned metadata of an update; the rest stays as stored.
fn merge_metadata(stored: &ObjectMeta, update: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        labels: update.labels.clone(),
        annotations: update.annotations.clone(),
        owner_references: update.owner_references.clone(),
        finalizers: update.finalizers.clone(),
        ..stored.clone()
    }
}

/// Checks the uid and resourceVersion an update or delete names against the stored object.
fn check_preconditions<K: Kind>(
    name: &str,
    stored: &StoredRow,
    epoch: u32,
    uid: Option<&str>,
    resource_version: Option<&str>,
) -> Result<()> {
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        if uid != stored.uid.to_string() {
            return Err(StoreError::Conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                stored.uid
            )));
        }
    }
    if let Some(rv) = resource_version.filter(|r| !r.is_empty()) {
        if rv != ResourceVersion::new(epoch, stored.seq).to_string() {
            return Err(modified_conflict::<K>(name));
        }
    }
    Ok(())
}

/// The tail of every write statement: moves the sync-state sequence to `$seq` (the row is
/// already locked by this transaction) and queues the commit notification for the feed.
macro_rules! advance_sync_state {
    ($seq:literal) => {
        concat!(
            "s AS (UPDATE sync_state SET seq = ",
            $seq,
            " WHERE id = 1 RETURNING 1) SELECT pg_notify('mcp_access_changes', '') FROM s"
        )
    };
}

/// The bodies of the Revocations of namespace `$1` whose target could select a session `$2`
/// of subject `$3` on server uid `$4`: a prefilter, [`locks::standing_revocation`] decides.
/// Cluster-wide reach exists only for fences, which `server_fences` carries.
const CANDIDATE_REVOCATIONS: &str =
    "ARRAY(SELECT body FROM objects WHERE resource = 'revocations' AND namespace = $1
    AND (body #>> '{spec,target,session}' = $2
         OR body #>> '{spec,target,subject}' = $3
         OR body #>> '{spec,target,server,uid}' = $4))";

/// Decodes the bodies [`CANDIDATE_REVOCATIONS`] returns.
fn revocations_of(bodies: Vec<Value>) -> Result<Vec<Revocation>> {
    bodies
        .into_iter()
        .map(|body| {
            serde_json::from_value(body)
                .map_err(|e| StoreError::Internal(format!("stored Revocation is unreadable: {e}")))
        })
        .collect()
}

const LOAD_SQL: &str =
    "SELECT seq, uid, body FROM objects WHERE resource = $1 AND namespace = $2 AND name = $3";

fn stored_row(r: &tokio_postgres::Row) -> StoredRow {
    StoredRow {
        seq: r.get::<_, i64>(0) as u64,
        uid: r.get(1),
        body: r.get(2),
    }
}

/// One write transaction: holds the sync-state row lock from `begin` to `commit`.
struct WriteTx<'a> {
    tx: deadpool_postgres::Transaction<'a>,
    epoch: u32,
    start: u64,
    seq: u64,
}

impl<'a> WriteTx<'a> {
    /// Starts the transaction. The sync-state lock is taken by the first `lock_*` call,
    /// pipelined with the transaction's first read.
    async fn begin(client: &'a mut deadpool_postgres::Object) -> Result<Self> {
        let tx = client.transaction().await.map_err(pg_err)?;
        Ok(Self {
            tx,
            epoch: 0,
            start: 0,
            seq: 0,
        })
    }

    /// Takes the sync-state row lock, then runs `sql` in the same round trip. The query is
    /// sent after the lock request on the same connection, so it runs once the lock is held
    /// and (READ COMMITTED) sees every transaction that committed before.
    async fn lock_with(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        // Prepare first: the two executions below must leave in this order.
        let lock = self
            .tx
            .prepare_cached("SELECT epoch, seq FROM sync_state WHERE id = 1 FOR UPDATE")
            .await
            .map_err(pg_err)?;
        let stmt = self.tx.prepare_cached(sql).await.map_err(pg_err)?;
        // Both run to completion and the lock's own error wins: after a lock timeout the
        // second statement only reports the aborted transaction (25P02).
        let (row, rows) = tokio::join!(self.tx.query_one(&lock, &[]), self.tx.query(&stmt, params));
        let row = row.map_err(pg_err)?;
        let rows = rows.map_err(pg_err)?;
        self.epoch = row.get::<_, i32>(0) as u32;
        self.start = row.get::<_, i64>(1) as u64;
        self.seq = self.start;
        Ok(rows)
    }

    /// Takes the lock and loads one object.
    async fn lock_and_load(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
    ) -> Result<Option<StoredRow>> {
        let rows = self.lock_with(LOAD_SQL, &[&resource, &ns, &name]).await?;
        Ok(rows.first().map(stored_row))
    }

    /// Takes the lock and loads one object of a kind.
    async fn lock_and_load_typed<K: Kind>(
        &mut self,
        ns: &str,
        name: &str,
    ) -> Result<Option<(K, StoredRow)>> {
        let row = self
            .lock_and_load(K::PLURAL, scoped_ns::<K>(ns), name)
            .await?;
        self.typed(row)
    }

    /// Takes the lock and loads an object that must exist, checking the uid and
    /// resourceVersion preconditions a delete or update names.
    async fn lock_existing<K: Kind>(
        &mut self,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<(K, StoredRow)> {
        let Some((object, row)) = self.lock_and_load_typed::<K>(ns, name).await? else {
            return Err(not_found::<K>(name));
        };
        check_preconditions::<K>(name, &row, self.epoch, uid, resource_version)?;
        Ok((object, row))
    }

    fn typed<K: Kind>(&self, row: Option<StoredRow>) -> Result<Option<(K, StoredRow)>> {
        match row {
            Some(row) => Ok(Some((decode(row.body.clone(), self.rv(row.seq))?, row))),
            None => Ok(None),
        }
    }

    fn rv(&self, seq: u64) -> ResourceVersion {
        ResourceVersion::new(self.epoch, seq)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(pg_err)?;
        self.tx.query(&stmt, params).await.map_err(pg_err)
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(pg_err)?;
        self.tx.execute(&stmt, params).await.map_err(pg_err)
    }

    async fn load(&self, resource: &str, ns: &str, name: &str) -> Result<Option<StoredRow>> {
        let rows = self.query(LOAD_SQL, &[&resource, &ns, &name]).await?;
        Ok(rows.first().map(stored_row))
    }

    async fn load_typed<K: Kind>(&self, ns: &str, name: &str) -> Result<Option<(K, StoredRow)>> {
        let rows = self
            .query(LOAD_SQL, &[&K::PLURAL, &scoped_ns::<K>(ns), &name])
            .await?;
        self.typed(rows.first().map(stored_row))
    }

    /// Takes the lock and checks that a new session may use its name (unused, never used).
    /// Returns whether its server uid is fenced and the Revocations that may stand for it,
    /// read in the same round trip.
    async fn lock_and_check_new_session(
        &mut self,
        ns: &str,
        name: &str,
        spec: &AccessSessionSpec,
    ) -> Result<(bool, Vec<Revocation>)> {
        let subject = spec.subject.as_ref().map(|s| s.user.as_str());
        let rows = self
            .lock_with(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM objects WHERE resource = 'accesssessions' AND namespace = $1 AND name = $2),
                            EXISTS (SELECT 1 FROM name_reservations WHERE resource = 'accesssessions' AND namespace = $1 AND name = $2),
                            EXISTS (SELECT 1 FROM server_fences WHERE server_uid = $4 AND (cluster_wide OR namespace = $1)),
                            {CANDIDATE_REVOCATIONS}"
                ),
                &[&ns, &name, &subject, &spec.server.uid],
            )
            .await?;
        let row = &rows[0];
        let name = display_name(ns, name);
        if row.get::<_, bool>(0) {
            return Err(StoreError::AlreadyExists {
                resource: SESSIONS,
                name,
            });
        }
        if row.get::<_, bool>(1) {
            return Err(StoreError::NameReserved {
                resource: SESSIONS,
                name,
            });
        }
        Ok((row.get(2), revocations_of(row.get(3))?))
    }

    /// Applies the issuance rules to a new session's spec, with its agent (locked by this
    /// transaction's sync-state lock) and the agent's current session count.
    async fn admit(
        &self,
        (ns, name): (&str, &str),
        spec: &AccessSessionSpec,
        server_fenced: bool,
        revocations: &[Revocation],
        server_max_ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<rules::Admission> {
        let standing = locks::standing_revocation(revocations, ns, name, spec, now);
        let agent = match &spec.agent {
            Some(agent_ref) => self.load_typed::<Agent>("", &agent_ref.name).await?,
            None => None,
        };
        let agent_active_sessions = match &agent {
            Some((a, row)) if a.spec.max_active_sessions.is_some() => {
                self.active_sessions_of_agent(&row.uid.to_string(), now)
                    .await?
            }
            _ => 0,
        };
        Ok(admit_session(
            spec,
            &IssuanceContext {
                agent: agent.as_ref().map(|(a, _)| a),
                agent_active_sessions,
                server_max_ttl,
                server_fenced,
                standing_revocation: standing,
                now,
            },
        )?)
    }

    /// Whether the session's agent, if it has one, still exists under the uid the session
    /// bound and is active; the inner error says why not.
    async fn check_session_agent(&self, session: &AccessSession) -> Result<Result<(), String>> {
        let Some(agent_ref) = &session.spec.agent else {
            return Ok(Ok(()));
        };
        let agent = self.load_typed::<Agent>("", &agent_ref.name).await?;
        let usable = agent.as_ref().is_some_and(|(a, _)| {
            a.spec.active && a.metadata.uid.is_some() && a.metadata.uid == agent_ref.uid
        });
        Ok(if usable {
            Ok(())
        } else {
            Err(format!(
                "agent {:?} is no longer active (deactivated, deleted or re-created)",
                agent_ref.name
            ))
        })
    }

    /// Whether a fence covers the server uid in `ns`: one installed there, or a cluster-wide one.
    async fn is_fenced(&self, server_uid: &str, ns: &str) -> Result<bool> {
        let rows = self
            .query(
                "SELECT 1 FROM server_fences WHERE server_uid = $1 AND (cluster_wide OR namespace = $2)",
                &[&server_uid, &ns],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// The Revocations that may stand for a session `name` with `spec` in `ns`
    /// ([`CANDIDATE_REVOCATIONS`]).
    async fn revocations_for(
        &self,
        ns: &str,
        name: &str,
        spec: &AccessSessionSpec,
    ) -> Result<Vec<Revocation>> {
        let subject = spec.subject.as_ref().map(|s| s.user.as_str());
        let rows = self
            .query(
                &format!("SELECT {CANDIDATE_REVOCATIONS}"),
                &[&ns, &name, &subject, &spec.server.uid],
            )
            .await?;
        revocations_of(rows[0].get(0))
    }

    /// The sessions a selector selects, with their stored rows, in key order. The SQL is
    /// generated from the typed selector (to use an index) and the pure rule re-checks
    /// every row, so the two can never disagree on what is revoked.
    async fn sessions_selected(
        &self,
        selector: &SessionSelector,
    ) -> Result<Vec<(String, String, AccessSession, StoredRow)>> {
        const COLUMNS: &str =
            "SELECT namespace, name, seq, uid, body FROM objects WHERE resource = 'accesssessions'";
        let rows = match selector {
            SessionSelector::One { namespace, name } => {
                self.query(
                    &format!("{COLUMNS} AND namespace = $1 AND name = $2"),
                    &[namespace, name],
                )
                .await?
            }
            SessionSelector::Server {
                namespace: Some(ns),
                uid,
            } => {
                self.query(
                    &format!("{COLUMNS} AND namespace = $1 AND body #>> '{{spec,server,uid}}' = $2 ORDER BY namespace, name"),
                    &[ns, uid],
                )
                .await?
            }
            SessionSelector::Server {
                namespace: None,
                uid,
            } => {
                self.query(
                    &format!("{COLUMNS} AND body #>> '{{spec,server,uid}}' = $1 ORDER BY namespace, name"),
                    &[uid],
                )
                .await?
            }
            SessionSelector::Subject { namespace, user } => {
                self.query(
                    &format!("{COLUMNS} AND namespace = $1 AND body #>> '{{spec,subject,user}}' = $2 ORDER BY namespace, name"),
                    &[namespace, user],
                )
                .await?
            }
            SessionSelector::Agent { uid } => {
                self.query(
                    &format!("{COLUMNS} AND body #>> '{{spec,agent,uid}}' = $1 ORDER BY namespace, name"),
                    &[uid],
                )
                .await?
            }
        };
        let mut selected = Vec::with_capacity(rows.len());
        for row in rows {
            let (ns, name): (String, String) = (row.get(0), row.get(1));
            let stored = StoredRow {
                seq: row.get::<_, i64>(2) as u64,
                uid: row.get(3),
                body: row.get(4),
            };
            let session: AccessSession = decode(stored.body.clone(), self.rv(stored.seq))?;
            if selector.matches(&ns, &name, &session.spec) {
                selected.push((ns, name, session, stored));
            }
        }
        Ok(selected)
    }

    async fn active_sessions_of_agent(&self, agent_uid: &str, now: Timestamp) -> Result<u32> {
        let now = Time(now);
        let now = serde_json::to_value(&now).map_err(|e| StoreError::Internal(e.to_string()))?;
        let now = now.as_str().unwrap_or_default().to_string();
        let rows = self
            .query(
                "SELECT count(*) FROM objects
                  WHERE resource = 'accesssessions' AND body #>> '{spec,agent,uid}' = $1
                    AND body #>> '{status,phase}' IN ('Active', 'PendingEnrollment')
                    AND body #>> '{spec,expiresAt}' > $2",
                &[&agent_uid, &now],
            )
            .await?;
        Ok(rows[0].get::<_, i64>(0) as u32)
    }

    fn next_seq(&mut self) -> i64 {
        self.seq += 1;
        self.seq as i64
    }

    /// Stores a new object and its ADDED event.
    async fn insert(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        uid: Uuid,
        body: &Value,
    ) -> Result<u64> {
        let seq = self.next_seq();
        self.execute(
            concat!(
            "WITH o AS (
                 INSERT INTO objects (resource, namespace, name, uid, seq, body) VALUES ($1, $2, $3, $4, $5, $6)
             ), c AS (
                 INSERT INTO change_log (seq, resource, namespace, name, event, object) VALUES ($5, $1, $2, $3, 'ADDED', $6)
             ),
             ",
            advance_sync_state!("$5")
        ),
            &[&resource, &ns, &name, &uid, &seq, body],
        )
        .await?;
        Ok(seq as u64)
    }

    /// Replaces an object and records the MODIFIED event with its before-image.
    async fn replace(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        body: &Value,
        before: &StoredRow,
    ) -> Result<u64> {
        let seq = self.next_seq();
        let prev = before.seq as i64;
        self.execute(
            concat!(
            "WITH o AS (
                 UPDATE objects SET seq = $4, body = $5 WHERE resource = $1 AND namespace = $2 AND name = $3
             ), c AS (
                 INSERT INTO change_log (seq, resource, namespace, name, event, object, before, prev_seq)
                 VALUES ($4, $1, $2, $3, 'MODIFIED', $5, $6, $7)
             ),
             ",
            advance_sync_state!("$4")
        ),
            &[&resource, &ns, &name, &seq, body, &before.body, &prev],
        )
        .await?;
        Ok(seq as u64)
    }

    /// Replaces many objects of one resource in one statement (bulk revocation).
    async fn replace_many(
        &mut self,
        resource: &str,
        rows: Vec<(String, String, Value, StoredRow)>,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut namespaces = Vec::with_capacity(rows.len());
        let mut names = Vec::with_capacity(rows.len());
        let mut seqs = Vec::with_capacity(rows.len());
        let mut bodies = Vec::with_capacity(rows.len());
        let mut befores = Vec::with_capacity(rows.len());
        let mut prevs = Vec::with_capacity(rows.len());
        for (ns, name, body, before) in rows {
            seqs.push(self.next_seq());
            namespaces.push(ns);
            names.push(name);
            bodies.push(body);
            prevs.push(before.seq as i64);
            befores.push(before.body);
        }
        let last = self.seq as i64;
        self.execute(
            concat!(
            "WITH d AS (
                 SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::jsonb[], $6::jsonb[], $7::bigint[])
                     AS d(namespace, name, seq, body, before, prev_seq)
             ), o AS (
                 UPDATE objects SET seq = d.seq, body = d.body FROM d
                  WHERE objects.resource = $1 AND objects.namespace = d.namespace AND objects.name = d.name
             ), c AS (
                 INSERT INTO change_log (seq, resource, namespace, name, event, object, before, prev_seq)
                 SELECT d.seq, $1, d.namespace, d.name, 'MODIFIED', d.body, d.before, d.prev_seq FROM d
             ),
             ",
            advance_sync_state!("$8")
        ),
            &[&resource, &namespaces, &names, &seqs, &bodies, &befores, &prevs, &last],
        )
        .await?;
        Ok(())
    }

    /// Deletes an object and records the DELETED event carrying its last state.
    async fn remove(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        last: &StoredRow,
    ) -> Result<u64> {
        let seq = self.next_seq();
        let prev = last.seq as i64;
        self.execute(
            concat!(
            "WITH o AS (
                 DELETE FROM objects WHERE resource = $1 AND namespace = $2 AND name = $3
             ), c AS (
                 INSERT INTO change_log (seq, resource, namespace, name, event, object, before, prev_seq)
                 VALUES ($4, $1, $2, $3, 'DELETED', $5, $5, $6)
             ),
             ",
            advance_sync_state!("$4")
        ),
            &[&resource, &ns, &name, &seq, &last.body, &prev],
        )
        .await?;
        Ok(seq as u64)
    }

    /// Records a revocation on every selected session: usable ones are revoked, revoked ones
    /// are covered by it too (so withdrawing another revocation cannot lift them).
    async fn revoke_sessions(
        &mut self,
        selector: &SessionSelector,
        cause: &str,
        revocation_name: Option<&str>,
        now: Timestamp,
    ) -> Result<RevocationOutcome> {
        let mut changes = Vec::new();
        let mut outcome = RevocationOutcome::default();
        for (ns, name, mut session, stored) in self.sessions_selected(selector).await? {
            let effect = rules::revoke_session(&mut session, cause, revocation_name, now);
            match effect {
                RevokeEffect::Revoked => outcome.revoked.push(display_name(&ns, &name)),
                RevokeEffect::AlsoCovered | RevokeEffect::Unchanged => {
                    outcome.already_revoked.push(display_name(&ns, &name))
                }
            }
            if effect.changed() {
                changes.push((ns, name, encode(&session)?, stored));
            }
        }
        self.replace_many(SESSIONS, changes).await?;
        Ok(outcome)
    }

    async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(pg_err)
    }
}

/// Sets `status.activeSessions` of agent bodies: the sessions bound to each agent's uid that
/// are active or pending and not expired, counted when the agent is read.
async fn fill_active_sessions(
    client: &impl deadpool_postgres::GenericClient,
    agents: &mut [&mut Value],
) -> Result<()> {
    let uids: Vec<String> = agents
        .iter()
        .filter_map(|a| {
            a.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    if uids.is_empty() {
        return Ok(());
    }
    let now = serde_json::to_value(Time(now())).map_err(|e| StoreError::Internal(e.to_string()))?;
    let now = now.as_str().unwrap_or_default().to_string();
    let rows = client
        .query(
            "SELECT body #>> '{spec,agent,uid}', count(*) FROM objects
              WHERE resource = 'accesssessions' AND body #>> '{spec,agent,uid}' = ANY($1)
                AND body #>> '{status,phase}' IN ('Active', 'PendingEnrollment')
                AND body #>> '{spec,expiresAt}' > $2
              GROUP BY 1",
            &[&uids, &now],
        )
        .await
        .map_err(pg_err)?;
    let counts: std::collections::HashMap<String, i64> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for agent in agents.iter_mut() {
        let uid = agent
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let count = counts.get(&uid).copied().unwrap_or(0);
        if let Some(obj) = agent.as_object_mut() {
            let status = obj.entry("status").or_insert_with(|| serde_json::json!({}));
            if let Some(status) = status.as_object_mut() {
                status.insert("activeSessions".into(), serde_json::json!(count));
            }
        }
    }
    Ok(())
}

/// The SQL condition for one field requirement. Paths come from `Kind::FIELDS` (static,
/// trusted), values are bound parameters.
fn field_condition(column: &str, req: &FieldRequirement, param: usize) -> String {
    let path = format!("{column} #>> '{{{}}}'", req.path.join(","));
    if req.value.is_empty() || req.negated {
        let op = if req.negated { "<>" } else { "=" };
        format!("COALESCE({path}, '') {op} ${param}")
    } else {
        format!("{path} = ${param}")
    }
}

#[async_trait]
impl Store for PgStore {
    async fn get<K: Kind>(&self, namespace: &str, name: &str) -> Result<K> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "SELECT s.epoch, o.seq, o.body FROM sync_state s
                   LEFT JOIN objects o ON o.resource = $1 AND o.namespace = $2 AND o.name = $3",
            )
            .await
            .map_err(pg_err)?;
        let row = client
            .query_one(&stmt, &[&K::PLURAL, &scoped_ns::<K>(namespace), &name])
            .await
            .map_err(pg_err)?;
        let epoch = row.get::<_, i32>(0) as u32;
        let Some(seq) = row.get::<_, Option<i64>>(1) else {
            return Err(not_found::<K>(name));
        };
        let mut body: Value = row.get(2);
        if K::PLURAL == AGENTS {
            fill_active_sessions(&client, &mut [&mut body]).await?;
        }
        decode(body, ResourceVersion::new(epoch, seq as u64))
    }

    async fn list<K: Kind>(&self, query: &ListQuery) -> Result<ObjectList<K>> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg_err)?;
        let head_stmt = tx
            .prepare_cached(
                "SELECT epoch, seq, (SELECT min(seq) FROM change_log) FROM sync_state WHERE id = 1",
            )
            .await
            .map_err(pg_err)?;
        let head = tx.query_one(&head_stmt, &[]).await.map_err(pg_err)?;
        let epoch = head.get::<_, i32>(0) as u32;
        let head_seq = head.get::<_, i64>(1) as u64;
        // Every change after `horizon` is still in the log.
        let horizon = head
            .get::<_, Option<i64>>(2)
            .map(|min| min as u64 - 1)
            .unwrap_or(head_seq);
        let (at, mut after) = match &query.at {
            ListAt::Latest => (head_seq, (String::new(), String::new())),
            ListAt::Exact { rv, after } => {
                if rv.epoch != epoch || rv.seq > head_seq || rv.seq < horizon {
                    return Err(StoreError::Expired(format!(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter (resourceVersion {rv} is no longer served)"
                    )));
                }
                (rv.seq, after.clone().unwrap_or_default())
            }
        };
        let rv = ResourceVersion::new(epoch, at);

        let mut sql = String::from(
            "SELECT namespace, name, seq, body FROM (
                 SELECT namespace, name, seq, body FROM objects
                  WHERE resource = $1 AND seq <= $2 AND (resource, namespace, name) > ($1, $3, $4)",
        );
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![
            Box::new(K::PLURAL),
            Box::new(at as i64),
            Box::new(String::new()),
            Box::new(String::new()),
        ];
        let mut conditions = String::new();
        if let Some(ns) = query.namespace.as_ref().filter(|_| K::NAMESPACED) {
            params.push(Box::new(ns.clone()));
            let _ = write!(conditions, " AND namespace = ${}", params.len());
        }
        let mut body_conditions = Vec::new();
        for req in &query.fields.0 {
            params.push(Box::new(req.value.clone()));
            body_conditions.push((req, params.len()));
        }
        sql.push_str(&conditions);
        for (req, i) in &body_conditions {
            let _ = write!(sql, " AND {}", field_condition("body", req, *i));
        }
        sql.push_str(
            " UNION ALL
                 SELECT namespace, name, prev_seq, before FROM (
                     SELECT DISTINCT ON (namespace, name) namespace, name, prev_seq, before FROM change_log
                      WHERE resource = $1 AND seq > $2 AND (resource, namespace, name) > ($1, $3, $4)",
        );
        sql.push_str(&conditions);
        sql.push_str(" ORDER BY namespace, name, seq) h WHERE before IS NOT NULL");
        for (req, i) in &body_conditions {
            let _ = write!(sql, " AND {}", field_condition("before", req, *i));
        }
        params.push(Box::new(0i64));
        let limit_param = params.len();
        let _ = write!(sql, ") s ORDER BY namespace, name LIMIT ${limit_param}");

        let stmt = tx.prepare_cached(&sql).await.map_err(pg_err)?;
        let want = query.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut more = false;
        loop {
            let chunk = want
                .map_or(LIST_CHUNK, |w| (w + 1 - items.len()).max(64))
                .min(LIST_CHUNK * 5);
            params[2] = Box::new(after.0.clone());
            params[3] = Box::new(after.1.clone());
            params[limit_param - 1] = Box::new(chunk as i64);
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            let rows = tx.query(&stmt, &refs).await.map_err(pg_err)?;
            let exhausted = rows.len() < chunk;
            for row in rows {
                let (ns, name): (String, String) = (row.get(0), row.get(1));
                let body: Value = row.get(3);
                after = (ns, name);
                let labels = body
                    .pointer("/metadata/labels")
                    .and_then(|l| serde_json::from_value(l.clone()).ok());
                if !query.labels.matches(labels.as_ref()) {
                    continue;
                }
                if want.is_some_and(|w| items.len() == w) {
                    more = true;
                    break;
                }
                let seq = row.get::<_, i64>(2) as u64;
                items.push((body, ResourceVersion::new(epoch, seq), after.clone()));
            }
            if more || exhausted {
                break;
            }
        }
        if K::PLURAL == AGENTS {
            let mut bodies: Vec<&mut Value> = items.iter_mut().map(|(body, _, _)| body).collect();
            fill_active_sessions(&tx, &mut bodies).await?;
        }
        tx.commit().await.map_err(pg_err)?;
        let continue_token = more.then(|| {
            let (ns, name) = items
                .last()
                .map(|(_, _, key)| key.clone())
                .unwrap_or_default();
            ContinueToken {
                rv: rv.to_string(),
                ns,
                name,
            }
            .encode()
        });
        Ok(ObjectList {
            items: items
                .into_iter()
                .map(|(body, item_rv, _)| decode::<K>(body, item_rv))
                .collect::<Result<_>>()?,
            resource_version: rv,
            continue_token,
        })
    }

    async fn delete<K: Kind>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        let ns = scoped_ns::<K>(namespace);
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (object, stored) = tx
            .lock_existing::<K>(
                ns,
                name,
                preconditions.uid.as_deref(),
                preconditions.resource_version.as_deref(),
            )
            .await?;
        if dry_run {
            return Ok(object);
        }
        if K::PLURAL == AGENTS {
            tx.revoke_sessions(
                &SessionSelector::Agent {
                    uid: stored.uid.to_string(),
                },
                CAUSE_AGENT_DEACTIVATED,
                None,
                now(),
            )
            .await?;
        }
        let seq = tx.remove(K::PLURAL, ns, name, &stored).await?;
        if K::PLURAL == SESSIONS {
            tx.execute(
                "INSERT INTO name_reservations (resource, namespace, name, uid) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
                &[&K::PLURAL, &ns, &name, &stored.uid],
            )
            .await?;
        }
        let rv = tx.rv(seq);
        tx.commit().await?;
        decode(stored.body, rv)
    }

    async fn create_session(
        &self,
        mut session: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>> {
        let now = now();
        let (ns, name) = prepare_new(&mut session, now, |o| rules::validate_session_spec(&o.spec))?;

        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (server_fenced, revocations) = tx
            .lock_and_check_new_session(&ns, &name, &session.spec)
            .await?;
        let admission = tx
            .admit(
                (&ns, &name),
                &session.spec,
                server_fenced,
                &revocations,
                self.inner.config.max_session_ttl,
                now,
            )
            .await?;
        session.spec = admission.spec;
        session.status = Some(AccessSessionStatus {
            phase: SessionPhase::Active,
            ..Default::default()
        });
        session.set_type_meta();
        if !dry_run {
            let uid = Uuid::parse_str(session.metadata.uid.as_deref().unwrap_or_default())
                .map_err(|e| StoreError::Internal(e.to_string()))?;
            let seq = tx
                .insert(SESSIONS, &ns, &name, uid, &encode(&session)?)
                .await?;
            session.metadata.resource_version = Some(tx.rv(seq).to_string());
            tx.commit().await?;
        }
        Ok(Written {
            object: session,
            warnings: admission.warnings,
        })
    }

    async fn update_session(
        &self,
        session: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>> {
        let ns = namespace_of::<AccessSession>(&session.metadata)?;
        let name = session.metadata.name.clone().unwrap_or_default();
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (current, stored) = tx
            .lock_existing::<AccessSession>(
                &ns,
                &name,
                session.metadata.uid.as_deref(),
                session.metadata.resource_version.as_deref(),
            )
            .await?;
        let admission = admit_session_update(&current.spec, &session.spec)?;
        let (spec, warnings) = (admission.spec, admission.warnings);
        let mut updated = current.clone();
        updated.metadata = merge_metadata(&current.metadata, &session.metadata);
        let errors = validate_metadata(&updated.metadata);
        if !errors.is_empty() {
            return Err(StoreError::Invalid(errors));
        }
        if spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        updated.spec = spec;
        if updated == current || dry_run {
            return Ok(Written {
                object: updated,
                warnings,
            });
        }
        let seq = tx
            .replace(SESSIONS, &ns, &name, &encode(&updated)?, &stored)
            .await?;
        updated.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        Ok(Written {
            object: updated,
            warnings,
        })
    }

    async fn revoke_session(
        &self,
        namespace: &str,
        name: &str,
        cause: &str,
        revocation_name: Option<&str>,
    ) -> Result<AccessSession> {
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let Some((mut session, stored)) = tx
            .lock_and_load_typed::<AccessSession>(namespace, name)
            .await?
        else {
            return Err(not_found::<AccessSession>(name));
        };
        if !rules::revoke_session(&mut session, cause, revocation_name, now()).changed() {
            return Ok(session);
        }
        let seq = tx
            .replace(SESSIONS, namespace, name, &encode(&session)?, &stored)
            .await?;
        session.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        Ok(session)
    }

    async fn unrevoke_session(&self, namespace: &str, name: &str) -> Result<AccessSession> {
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let Some((mut session, stored)) = tx
            .lock_and_load_typed::<AccessSession>(namespace, name)
            .await?
        else {
            return Err(not_found::<AccessSession>(name));
        };
        let fenced = tx.is_fenced(&session.spec.server.uid, namespace).await?;
        if let Err(why) = tx.check_session_agent(&session).await? {
            return Err(StoreError::Conflict(format!(
                "cannot restore session {name:?}: {why}"
            )));
        }
        let revocations = tx.revocations_for(namespace, name, &session.spec).await?;
        if let Some(r) =
            locks::standing_revocation(&revocations, namespace, name, &session.spec, now())
        {
            return Err(rules::SessionRuleError::RevocationStands {
                name: r.metadata.name.clone().unwrap_or_default(),
                cause: r.spec.cause.clone(),
            }
            .into());
        }
        if !rules::unrevoke_session(&mut session, fenced)? {
            return Ok(session);
        }
        let seq = tx
            .replace(SESSIONS, namespace, name, &encode(&session)?, &stored)
            .await?;
        session.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        Ok(session)
    }

    async fn retire_server(
        &self,
        namespace: &str,
        server: &ServerRef,
        revocation_name: Option<&str>,
    ) -> Result<RevocationOutcome> {
        if server.uid.is_empty() {
            return Err(StoreError::Invalid(vec![FieldError::required(
                "spec.target.server.uid",
                "Required value",
            )]));
        }
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        tx.lock_with(
            "INSERT INTO server_fences (server_uid, server_name, namespace, revocation_name, cluster_wide)
             VALUES ($1, $2, $3, $4, true)
             ON CONFLICT (server_uid, namespace) DO UPDATE SET cluster_wide = true",
            &[&server.uid, &server.name, &namespace, &revocation_name],
        )
        .await?;
        let outcome = tx
            .revoke_sessions(
                &SessionSelector::Server {
                    namespace: None,
                    uid: server.uid.clone(),
                },
                CAUSE_SERVER_RETIRED,
                revocation_name,
                now(),
            )
            .await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn create_agent(&self, mut agent: Agent, dry_run: bool) -> Result<Written<Agent>> {
        let now = now();
        let (_, name) = prepare_new(&mut agent, now, |o| validate_agent_spec(&o.spec))?;
        agent.status = Some(AgentStatus {
            deactivated_at: (!agent.spec.active).then_some(Time(now)),
            ..Default::default()
        });
        agent.set_type_meta();
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        if tx.lock_and_load(AGENTS, "", &name).await?.is_some() {
            return Err(StoreError::AlreadyExists {
                resource: AGENTS,
                name,
            });
        }
        if !dry_run {
            let uid = Uuid::parse_str(agent.metadata.uid.as_deref().unwrap_or_default())
                .map_err(|e| StoreError::Internal(e.to_string()))?;
            let seq = tx.insert(AGENTS, "", &name, uid, &encode(&agent)?).await?;
            agent.metadata.resource_version = Some(tx.rv(seq).to_string());
            tx.commit().await?;
        }
        Ok(Written {
            object: agent,
            warnings: Vec::new(),
        })
    }

    async fn update_agent(&self, agent: Agent, dry_run: bool) -> Result<Written<Agent>> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        let errors = validate_agent_spec(&agent.spec);
        if !errors.is_empty() {
            return Err(StoreError::Invalid(errors));
        }
        let now = now();
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (current, stored) = tx
            .lock_existing::<Agent>(
                "",
                &name,
                agent.metadata.uid.as_deref(),
                agent.metadata.resource_version.as_deref(),
            )
            .await?;
        let mut updated = current.clone();
        updated.metadata = merge_metadata(&current.metadata, &agent.metadata);
        let errors = validate_metadata(&updated.metadata);
        if !errors.is_empty() {
            return Err(StoreError::Invalid(errors));
        }
        updated.spec = agent.spec;
        if updated.spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        let deactivating = current.spec.active && !updated.spec.active;
        let status = updated.status.get_or_insert_with(AgentStatus::default);
        if deactivating {
            status.deactivated_at = Some(Time(now));
        } else if updated.spec.active {
            status.deactivated_at = None;
        }
        if updated == current || dry_run {
            return Ok(Written {
                object: updated,
                warnings: Vec::new(),
            });
        }
        if deactivating {
            tx.revoke_sessions(
                &SessionSelector::Agent {
                    uid: stored.uid.to_string(),
                },
                CAUSE_AGENT_DEACTIVATED,
                None,
                now,
            )
            .await?;
        }
        let seq = tx
            .replace(AGENTS, "", &name, &encode(&updated)?, &stored)
            .await?;
        updated.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        Ok(Written {
            object: updated,
            warnings: Vec::new(),
        })
    }

    async fn update_metadata<K: Kind>(&self, object: K, dry_run: bool) -> Result<Written<K>> {
        let ns = namespace_of::<K>(object.meta())?;
        let name = object.meta().name.clone().unwrap_or_default();
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (current, stored) = tx
            .lock_existing::<K>(
                &ns,
                &name,
                object.meta().uid.as_deref(),
                object.meta().resource_version.as_deref(),
            )
            .await?;
        let requested = encode(&object)?;
        let mut updated = encode(&current)?;
        if requested.get("spec") != updated.get("spec") {
            return Err(StoreError::Invalid(vec![FieldError::invalid(
                "spec",
                "field is immutable",
            )]));
        }
        let meta = merge_metadata(current.meta(), object.meta());
        let errors = validate_metadata(&meta);
        if !errors.is_empty() {
            return Err(StoreError::Invalid(errors));
        }
        updated["metadata"] =
            serde_json::to_value(&meta).map_err(|e| StoreError::Internal(e.to_string()))?;
        if let Some(m) = updated.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        if updated == stored.body || dry_run {
            return Ok(Written {
                object: current,
                warnings: Vec::new(),
            });
        }
        let seq = tx.replace(K::PLURAL, &ns, &name, &updated, &stored).await?;
        let rv = tx.rv(seq);
        tx.commit().await?;
        Ok(Written {
            object: decode(updated, rv)?,
            warnings: Vec::new(),
        })
    }

    async fn create_enrollment(
        &self,
        mut enrollment: Enrollment,
        owner: &Requester,
        dry_run: bool,
    ) -> Result<Written<Enrollment>> {
        let now = now();
        let (ns, name) = prepare_new(&mut enrollment, now, |o| {
            rules::validate_session_spec(&o.spec)
        })?;
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (server_fenced, revocations) = tx
            .lock_and_check_new_session(&ns, &name, &enrollment.spec)
            .await?;
        if tx.load_typed::<Enrollment>(&ns, &name).await?.is_some() {
            return Err(StoreError::AlreadyExists {
                resource: ENROLLMENTS,
                name: display_name(&ns, &name),
            });
        }
        let admission = tx
            .admit(
                (&ns, &name),
                &enrollment.spec,
                server_fenced,
                &revocations,
                self.inner.config.max_session_ttl,
                now,
            )
            .await?;
        enrollment.spec = admission.spec;
        enrollment.status = Some(EnrollmentStatus {
            phase: EnrollmentPhase::Pending,
            owner: Some(owner.name.clone()),
            owner_uid: (!owner.uid.is_empty()).then(|| owner.uid.clone()),
            requested_at: Some(Time(now)),
            completed_at: None,
        });
        enrollment.set_type_meta();
        // The session: same namespace, name and uid, pending.
        let mut session = AccessSession {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                uid: enrollment.metadata.uid.clone(),
                creation_timestamp: Some(Time(now)),
                generation: Some(1),
                labels: enrollment.metadata.labels.clone(),
                ..Default::default()
            },
            spec: enrollment.spec.clone(),
            status: Some(AccessSessionStatus {
                phase: SessionPhase::PendingEnrollment,
                enrollment: Some(EnrollmentInfo {
                    state: "Pending".into(),
                    owner: owner.name.clone(),
                    owner_uid: (!owner.uid.is_empty()).then(|| owner.uid.clone()),
                    requested_at: Time(now),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        session.set_type_meta();
        if !dry_run {
            let uid = Uuid::parse_str(enrollment.metadata.uid.as_deref().unwrap_or_default())
                .map_err(|e| StoreError::Internal(e.to_string()))?;
            tx.insert(SESSIONS, &ns, &name, uid, &encode(&session)?)
                .await?;
            let seq = tx
                .insert(ENROLLMENTS, &ns, &name, uid, &encode(&enrollment)?)
                .await?;
            enrollment.metadata.resource_version = Some(tx.rv(seq).to_string());
            tx.commit().await?;
        }
        Ok(Written {
            object: enrollment,
            warnings: admission.warnings,
        })
    }

    async fn complete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        dry_run: bool,
    ) -> Result<Enrollment> {
        let now = now();
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let Some((mut enrollment, enrollment_row)) = tx
            .lock_and_load_typed::<Enrollment>(namespace, name)
            .await?
        else {
            return Err(not_found::<Enrollment>(name));
        };
        check_preconditions::<Enrollment>(name, &enrollment_row, tx.epoch, uid, None)?;
        if enrollment.phase() == EnrollmentPhase::Completed {
            return Ok(enrollment);
        }
        let refuse = |why: String| {
            StoreError::Conflict(format!("cannot complete enrollment {name:?}: {why}"))
        };
        let Some((mut session, session_row)) =
            tx.load_typed::<AccessSession>(namespace, name).await?
        else {
            return Err(refuse("its session was deleted".into()));
        };
        if session_row.uid != enrollment_row.uid {
            return Err(refuse("its session was replaced".into()));
        }
        rules::check_completion(&session, now).map_err(refuse)?;
        if tx.is_fenced(&session.spec.server.uid, namespace).await? {
            return Err(refuse(format!(
                "server uid {:?} was retired",
                session.spec.server.uid
            )));
        }
        if let Err(why) = tx.check_session_agent(&session).await? {
            return Err(refuse(why));
        }
        // Only the pending metadata goes: authorization fields stay exactly as issued.
        if let Some(status) = session.status.as_mut() {
            status.enrollment = None;
            status.phase = SessionPhase::Active;
        }
        let status = enrollment
            .status
            .get_or_insert_with(EnrollmentStatus::default);
        status.phase = EnrollmentPhase::Completed;
        status.completed_at = Some(Time(now));
        if dry_run {
            return Ok(enrollment);
        }
        tx.replace(SESSIONS, namespace, name, &encode(&session)?, &session_row)
            .await?;
        let seq = tx
            .replace(
                ENROLLMENTS,
                namespace,
                name,
                &encode(&enrollment)?,
                &enrollment_row,
            )
            .await?;
        enrollment.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        Ok(enrollment)
    }

    async fn delete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        caller: Option<&Requester>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Enrollment> {
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (enrollment, enrollment_row) = tx
            .lock_existing::<Enrollment>(
                namespace,
                name,
                preconditions.uid.as_deref(),
                preconditions.resource_version.as_deref(),
            )
            .await?;
        let pending = enrollment.phase() == EnrollmentPhase::Pending;
        if pending {
            let status = enrollment.status.clone().unwrap_or_default();
            let owner = status.owner.unwrap_or_default();
            if caller.is_some_and(|c| {
                !rules::is_enrollment_owner(&owner, status.owner_uid.as_deref(), &c.name, &c.uid)
            }) {
                return Err(StoreError::Forbidden {
                    reason: ForbiddenReason::NotOwner,
                    message: format!("only the owner {owner:?} (the same user, by name and uid) may withdraw a pending enrollment"),
                });
            }
        }
        if dry_run {
            return Ok(enrollment);
        }
        if pending {
            // Withdrawing deletes the pending session: tombstone and name reservation.
            if let Some(session_row) = tx.load(SESSIONS, namespace, name).await? {
                if session_row.uid == enrollment_row.uid {
                    tx.remove(SESSIONS, namespace, name, &session_row).await?;
                    tx.execute(
                        "INSERT INTO name_reservations (resource, namespace, name, uid) VALUES ($1, $2, $3, $4)
                         ON CONFLICT DO NOTHING",
                        &[&SESSIONS, &namespace, &name, &session_row.uid],
                    )
                    .await?;
                }
            }
        }
        let seq = tx
            .remove(ENROLLMENTS, namespace, name, &enrollment_row)
            .await?;
        let rv = tx.rv(seq);
        tx.commit().await?;
        decode(enrollment_row.body, rv)
    }

    async fn collect_completed_enrollments(&self, retention: Duration) -> Result<usize> {
        // Due once `retention` has passed since completion. Times have second precision, so
        // a record completed in the current second is due under a zero retention.
        let cutoff = now()
            - SignedDuration::try_from(retention)
                .map_err(|e| StoreError::Internal(e.to_string()))?;
        let cutoff =
            serde_json::to_value(Time(cutoff)).map_err(|e| StoreError::Internal(e.to_string()))?;
        let cutoff = cutoff.as_str().unwrap_or_default().to_string();
        let due: Vec<(String, String)> = {
            let client = self.client().await?;
            client
                .query(
                    "SELECT namespace, name FROM objects WHERE resource = 'enrollments'
                       AND body #>> '{status,phase}' = 'Completed' AND body #>> '{status,completedAt}' <= $1
                     ORDER BY namespace, name LIMIT 1000",
                    &[&cutoff],
                )
                .await
                .map_err(pg_err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        };
        let mut collected = 0;
        for (ns, name) in due {
            // Completed records are removed whoever owns them.
            let (_gate, mut client) = self.writer().await?;
            let mut tx = WriteTx::begin(&mut client).await?;
            if let Some((enrollment, row)) =
                tx.lock_and_load_typed::<Enrollment>(&ns, &name).await?
            {
                if enrollment.phase() == EnrollmentPhase::Completed {
                    tx.remove(ENROLLMENTS, &ns, &name, &row).await?;
                    tx.commit().await?;
                    collected += 1;
                }
            }
        }
        Ok(collected)
    }

    async fn create_revocation(
        &self,
        mut revocation: Revocation,
        authority: RevokerAuthority,
        dry_run: bool,
    ) -> Result<Written<Revocation>> {
        let now = now();
        let (ns, name) = prepare_new(&mut revocation, now, |o| {
            rules::validate_revocation_spec(&o.spec)
        })?;
        let plan = locks::plan_revocation(&ns, &revocation.spec, authority, now)
            .map_err(StoreError::Invalid)?;
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        if tx.lock_and_load(REVOCATIONS, &ns, &name).await?.is_some() {
            return Err(StoreError::AlreadyExists {
                resource: REVOCATIONS,
                name: display_name(&ns, &name),
            });
        }
        if let Some(session) = &revocation.spec.target.session {
            if tx.load(SESSIONS, &ns, session).await?.is_none() {
                return Err(StoreError::Invalid(vec![FieldError::invalid(
                    "spec.target.session",
                    format!("session {session:?} not found in namespace {ns:?}"),
                )]));
            }
        }
        if let Some(fence) = &plan.fence {
            tx.execute(
                "INSERT INTO server_fences (server_uid, server_name, namespace, revocation_name, cluster_wide)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (server_uid, namespace) DO UPDATE
                   SET cluster_wide = server_fences.cluster_wide OR EXCLUDED.cluster_wide",
                &[&fence.server_uid, &fence.server_name, &fence.namespace, &name, &fence.cluster_wide],
            )
            .await?;
        }
        let outcome = tx
            .revoke_sessions(&plan.sessions, &revocation.spec.cause, Some(&name), now)
            .await?;
        revocation.status = Some(RevocationStatus {
            revoked_sessions: (outcome.revoked.len() + outcome.already_revoked.len()) as u32,
            cluster_wide: plan.fence.as_ref().is_some_and(|f| f.cluster_wide),
            completed_at: Some(Time(now)),
        });
        revocation.set_type_meta();
        if dry_run {
            return Ok(Written {
                object: revocation,
                warnings: Vec::new(),
            });
        }
        let uid = Uuid::parse_str(revocation.metadata.uid.as_deref().unwrap_or_default())
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let seq = tx
            .insert(REVOCATIONS, &ns, &name, uid, &encode(&revocation)?)
            .await?;
        revocation.metadata.resource_version = Some(tx.rv(seq).to_string());
        tx.commit().await?;
        let mut warnings = Vec::new();
        if !outcome.already_revoked.is_empty() {
            warnings.push(format!(
                "{} of the sessions it covers were already revoked; they now stay revoked until every revocation covering them is deleted",
                outcome.already_revoked.len()
            ));
        }
        Ok(Written {
            object: revocation,
            warnings,
        })
    }

    async fn delete_revocation(
        &self,
        namespace: &str,
        name: &str,
        restore: bool,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Revocation> {
        let (_gate, mut client) = self.writer().await?;
        let mut tx = WriteTx::begin(&mut client).await?;
        let (revocation, row) = tx
            .lock_existing::<Revocation>(
                namespace,
                name,
                preconditions.uid.as_deref(),
                preconditions.resource_version.as_deref(),
            )
            .await?;
        if revocation.spec.cause == CAUSE_SERVER_RETIRED {
            return Err(StoreError::Conflict(format!(
                "revocation {name:?} fences a retired server generation; fences are permanent"
            )));
        }
        let refuse = |why: String| {
            StoreError::Conflict(format!("cannot withdraw revocation {name:?}: {why}"))
        };
        let single = revocation.spec.target.session.is_some();
        let selector = locks::revocation_selector(namespace, &revocation.spec, false);
        let mut changes = Vec::new();
        if let (true, Some(selector)) = (restore, selector) {
            for (ns, session_name, mut session, stored) in tx.sessions_selected(&selector).await? {
                match locks::withdraw(&mut session, name) {
                    Withdrawal::NotCovered => continue,
                    Withdrawal::StillRevoked => {}
                    Withdrawal::Restore => {
                        let fenced = tx.is_fenced(&session.spec.server.uid, &ns).await?;
                        let agent = tx.check_session_agent(&session).await?;
                        match (fenced, agent) {
                            (false, Ok(())) => locks::restore(&mut session),
                            // A single-session withdrawal says why it cannot restore.
                            (true, _) if single => {
                                return Err(refuse(format!(
                                    "server uid {:?} was retired",
                                    session.spec.server.uid
                                )))
                            }
                            (_, Err(why)) if single => return Err(refuse(why)),
                            // Among many, the unusable ones stay revoked for their reason.
                            (true, _) => locks::keep_revoked(&mut session, CAUSE_SERVER_RETIRED),
                            (_, Err(_)) => {
                                locks::keep_revoked(&mut session, CAUSE_AGENT_DEACTIVATED)
                            }
                        }
                    }
                }
                changes.push((ns, session_name, encode(&session)?, stored));
            }
        }
        if dry_run {
            return Ok(revocation);
        }
        tx.replace_many(SESSIONS, changes).await?;
        let seq = tx.remove(REVOCATIONS, namespace, name, &row).await?;
        let rv = tx.rv(seq);
        tx.commit().await?;
        decode(row.body, rv)
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
        let row = client
            .query_one(
                "SELECT epoch, seq, (SELECT min(seq) FROM change_log) FROM sync_state WHERE id = 1",
                &[],
            )
            .await
            .map_err(pg_err)?;
        let epoch = row.get::<_, i32>(0) as u32;
        let head = row.get::<_, i64>(1) as u64;
        let horizon = row
            .get::<_, Option<i64>>(2)
            .map(|m| m as u64 - 1)
            .unwrap_or(head);
        if from.epoch != epoch {
            return Err(StoreError::Expired(format!(
                "too old resource version: {from}: the change log was reset (apiserver restart)"
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
        self.inner.feed.subscription(from)
    }
}
