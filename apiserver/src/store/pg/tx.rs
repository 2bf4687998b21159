//! The PostgreSQL write transaction: the sync-state row lock, facts read under it, and the
//! writes of a plan with their change-log events.

use std::collections::HashMap;

use apis::strategy::{Fact, ObjectKey, Read, Write};
use apis::{AccessSession, Kind, Revocation};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use uuid::Uuid;

use super::error::pg_err;
use super::params::{bound, Params};
use super::{revocations, sessions};
use crate::store::error::{Result, StoreError};
use crate::store::rv::{set_resource_version, ResourceVersion};

/// Sent after every run of writes: moves the sync-state sequence to the last one written
/// (the row is already locked by this transaction) and queues the commit notification for
/// the feed. Once per round trip, however many writes it carries.
const ADVANCE_SQL: &str = "WITH s AS (UPDATE sync_state SET seq = $1 WHERE id = 1 RETURNING 1) \
     SELECT pg_notify('mcp_access_changes', '') FROM s";

/// A row of `objects` as read inside a transaction.
#[derive(Clone, Debug)]
pub(super) struct StoredRow {
    pub seq: u64,
    pub body: Value,
}

pub(super) const LOAD_SQL: &str =
    "SELECT seq, uid, body FROM objects WHERE resource = $1 AND namespace = $2 AND name = $3";

/// One read as SQL: its statement text and parameters.
pub(super) struct ReadQuery {
    pub read: Read,
    pub sql: String,
    pub params: Params,
}

/// The SQL answering `read`.
pub(super) fn query_for(read: Read) -> ReadQuery {
    let (sql, params): (String, Params) = match &read {
        Read::Object(key) => (
            LOAD_SQL.into(),
            vec![
                Box::new(key.resource.to_string()),
                Box::new(key.namespace.clone()),
                Box::new(key.name.clone()),
            ],
        ),
        Read::NameReserved(key) => sessions::name_reserved(key),
        Read::Fenced {
            server_uid,
            namespace,
        } => revocations::fenced(server_uid, namespace),
        Read::Revocations {
            namespace,
            session,
            subject,
            server_uid,
        } => revocations::candidates(namespace, session, subject.as_deref(), server_uid),
        Read::Sessions(selector) => sessions::selected(selector),
        Read::ActiveSessions { agent_uids, at } => sessions::active_counts(agent_uids, *at),
        Read::DueSessions { at, limit } => sessions::due(*at, *limit),
        Read::PolicySizes { namespace, server } => (
            "SELECT name, body -> 'spec' FROM objects WHERE resource = 'toolpolicies'
               AND namespace = $1 AND body #>> '{spec,server,name}' = $2"
                .into(),
            vec![Box::new(namespace.clone()), Box::new(server.clone())],
        ),
    };
    ReadQuery { read, sql, params }
}

/// Turns the rows of a read into its fact, decoding objects at `epoch`; object rows read
/// are added to `rows` (the before-images of later writes).
pub(super) fn fact_of(
    read: &Read,
    result: Vec<tokio_postgres::Row>,
    epoch: u32,
    rows: &mut HashMap<ObjectKey, StoredRow>,
) -> Result<Fact> {
    Ok(match read {
        Read::Object(key) => match result.first() {
            Some(row) => {
                let stored = StoredRow {
                    seq: row.get::<_, i64>(0) as u64,
                    body: row.get(2),
                };
                let mut body = stored.body.clone();
                set_resource_version(&mut body, ResourceVersion::new(epoch, stored.seq));
                rows.insert(key.clone(), stored);
                Fact::Object(Some(body))
            }
            None => Fact::Object(None),
        },
        Read::NameReserved(_) | Read::Fenced { .. } => {
            Fact::Flag(result.first().is_some_and(|r| r.get::<_, bool>(0)))
        }
        Read::Revocations { .. } => Fact::Revocations(revocations::decode(&result)?),
        Read::Sessions(selector) => Fact::Sessions(decode_sessions(
            result,
            epoch,
            rows,
            // The SQL only narrows; the typed selector decides.
            |ns, name, session| selector.matches(ns, name, &session.spec),
        )?),
        Read::DueSessions { at, .. } => {
            Fact::Sessions(decode_sessions(result, epoch, rows, |_, _, session| {
                apis::rules::due_for_expiry(session, *at)
            })?)
        }
        // Measured as gateways measure it: the typed spec, encoded.
        Read::PolicySizes { .. } => Fact::Counts(
            result
                .iter()
                .map(|r| {
                    let spec: apis::ToolPolicySpec =
                        serde_json::from_value(r.get(1)).map_err(|e| {
                            StoreError::Internal(format!("stored ToolPolicy is unreadable: {e}"))
                        })?;
                    let bytes = serde_json::to_vec(&spec).map_or(u32::MAX, |b| b.len() as u32);
                    Ok((r.get::<_, String>(0), bytes))
                })
                .collect::<Result<_>>()?,
        ),
        Read::ActiveSessions { .. } => Fact::Counts(
            result
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u32))
                .collect(),
        ),
    })
}

/// Decodes session rows (namespace, name, seq, body) at `epoch`, keeping those `keep`
/// accepts; their rows are added to `rows` (the before-images of later writes).
fn decode_sessions(
    result: Vec<tokio_postgres::Row>,
    epoch: u32,
    rows: &mut HashMap<ObjectKey, StoredRow>,
    keep: impl Fn(&str, &str, &AccessSession) -> bool,
) -> Result<Vec<AccessSession>> {
    let mut selected = Vec::with_capacity(result.len());
    for row in result {
        let (ns, name): (String, String) = (row.get(0), row.get(1));
        let stored = StoredRow {
            seq: row.get::<_, i64>(2) as u64,
            body: row.get(3),
        };
        let mut body = stored.body.clone();
        set_resource_version(&mut body, ResourceVersion::new(epoch, stored.seq));
        let session: AccessSession = serde_json::from_value(body).map_err(|e| {
            StoreError::Internal(format!("stored AccessSession is unreadable: {e}"))
        })?;
        if keep(&ns, &name, &session) {
            rows.insert(ObjectKey::of::<AccessSession>(&ns, &name), stored);
            selected.push(session);
        }
    }
    Ok(selected)
}

/// Runs reads on `client` (pipelined: every statement is sent before the first answer is
/// awaited), after `lock` when given.
pub(super) async fn run_reads(
    client: &impl GenericClient,
    lock: Option<&str>,
    reads: Vec<Read>,
) -> Result<(
    Option<tokio_postgres::Row>,
    Vec<(Read, Vec<tokio_postgres::Row>)>,
)> {
    // Prepare first: the executions below must leave in order, the lock first.
    let lock = match lock {
        Some(sql) => Some(client.prepare_cached(sql).await.map_err(pg_err)?),
        None => None,
    };
    let mut queries = Vec::with_capacity(reads.len());
    for read in reads {
        let q = query_for(read);
        let stmt = client.prepare_cached(&q.sql).await.map_err(pg_err)?;
        queries.push((q, stmt));
    }
    let lock_fut = async {
        match &lock {
            Some(stmt) => client.query_one(stmt, &[]).await.map(Some),
            None => Ok(None),
        }
    };
    let reads_fut = futures::future::join_all(queries.iter().map(|(q, stmt)| {
        let params = bound(&q.params);
        async move { client.query(stmt, &params).await }
    }));
    // Both run to completion and the lock's own error wins: after a lock timeout the
    // pipelined statements only report the aborted transaction (25P02).
    let (lock_row, results) = tokio::join!(lock_fut, reads_fut);
    let lock_row = lock_row.map_err(pg_err)?;
    let mut answers = Vec::with_capacity(queries.len());
    for ((q, _), result) in queries.into_iter().zip(results) {
        answers.push((q.read, result.map_err(pg_err)?));
    }
    Ok((lock_row, answers))
}

/// The savepoint of the current mutation (nested: rolling back to it undoes only the latest).
const SAVEPOINT: &str = "SAVEPOINT mutation";

/// A write held until the transaction next talks to PostgreSQL: with the next read that
/// cannot be answered from what was read with the lock, or with `COMMIT`.
struct Held {
    sql: &'static str,
    params: Params,
}

impl Held {
    fn savepoint() -> Self {
        Self {
            sql: SAVEPOINT,
            params: Vec::new(),
        }
    }
}

/// Sends `statements`, then `then`, in one round trip (each is polled before the next, so
/// they leave in that order). The first failed statement is returned beside `then`'s own
/// result: after it the transaction is aborted and every later statement only echoes that
/// (a `COMMIT` then rolls back, and still reports success).
async fn pipeline<T>(
    client: &deadpool_postgres::Object,
    statements: &[Held],
    then: impl std::future::Future<Output = Result<T>>,
) -> (std::result::Result<(), tokio_postgres::Error>, Result<T>) {
    let mut prepared = Vec::with_capacity(statements.len());
    for statement in statements {
        match client.prepare_cached(statement.sql).await {
            Ok(stmt) => prepared.push(stmt),
            Err(e) => {
                let unsent = StoreError::Unavailable(format!("not sent: {e}"));
                return (Err(e), Err(unsent));
            }
        }
    }
    let sent = futures::future::join_all(prepared.iter().zip(statements).map(|(stmt, held)| {
        let params = bound(&held.params);
        async move { client.execute(stmt, &params).await }
    }));
    let (sent, done) = tokio::join!(sent, then);
    (sent.into_iter().try_for_each(|r| r.map(drop)), done)
}

const LOCK_SQL: &str = "SELECT epoch, seq FROM sync_state WHERE id = 1 FOR UPDATE";

/// One write transaction, shared by the mutations of a group commit (`super::group`): it
/// takes the sync-state row lock when it begins and holds it to `commit`. It owns its
/// connection; one dropped while its transaction is open is closed, never returned to the
/// pool mid-transaction.
///
/// Writes are held, not sent: a mutation's writes are kept when it commits and dropped when
/// it does not (nothing to roll back), and every kept write leaves with the next statement
/// that must reach PostgreSQL — a read the prefetched facts cannot answer, or `COMMIT`. The
/// lock makes the facts read under it authoritative, so a write decided on them fails only
/// when the database does; that fails the whole group.
pub(super) struct WriteTx {
    client: Option<deadpool_postgres::Object>,
    /// A transaction is open on `client` (begun and neither committed nor rolled back).
    open: bool,
    epoch: u32,
    seq: u64,
    /// Every object row the current mutation read, by key: the before-images of its
    /// replacements and removals.
    rows: HashMap<ObjectKey, StoredRow>,
    /// The current mutation asked to commit (its plan's writes are in).
    committed: bool,
    /// Each mutation runs in its own savepoint (the group has several).
    savepoints: bool,
    /// The current mutation's savepoint is taken.
    in_savepoint: bool,
    /// A statement of the current mutation failed: not committing it means rolling back to
    /// its savepoint.
    dirty: bool,
    /// The current mutation's writes, until it commits.
    current: Vec<Held>,
    /// Writes of committed mutations not sent yet.
    held: Vec<Held>,
    /// The last sequence number of a committed mutation.
    held_seq: u64,
    /// A held write (or a savepoint sent with them) failed: the transaction is aborted and
    /// nothing of it stands.
    poisoned: Option<StoreError>,
    /// ... and PostgreSQL said so (it refused the statement): the `COMMIT` sent after it
    /// surely rolled back, and the group may be run again.
    refused: bool,
    /// Each mutation's writes are sent when it commits, in its own savepoint (a group run
    /// again after a refusal), instead of being held for the `COMMIT`.
    send_at_commit: bool,
    /// Facts read when the transaction began, for the mutations queued in its group: each
    /// answers a mutation's read without a round trip unless a write of the group since
    /// could have changed it ([`Touched::could_change`]).
    prefetched: HashMap<Read, Prefetched>,
    /// What the group's writes touched so far.
    touched: Touched,
}

/// A fact read when the transaction began, with the object rows it holds (the
/// before-images a mutation using it records).
struct Prefetched {
    fact: Fact,
    rows: Vec<(ObjectKey, StoredRow)>,
}

/// What the writes of a transaction touched, to tell which prefetched facts still hold.
/// Deliberately coarse: a fact is read again whenever a write could have changed it, and
/// a mutation rolled back to its savepoint still counts as having written.
#[derive(Default)]
struct Touched {
    keys: std::collections::HashSet<ObjectKey>,
    resources: std::collections::HashSet<&'static str>,
    fences: bool,
}

impl Touched {
    fn record(&mut self, write: &Write) {
        match write {
            Write::Create { key, .. }
            | Write::Replace { key, .. }
            | Write::Remove { key }
            | Write::ReserveName { key, .. } => {
                self.keys.insert(key.clone());
                self.resources.insert(key.resource);
            }
            Write::Fence { .. } => self.fences = true,
        }
    }

    /// Whether a write recorded could have changed the answer to `read`.
    fn could_change(&self, read: &Read) -> bool {
        match read {
            Read::Object(key) | Read::NameReserved(key) => self.keys.contains(key),
            Read::Fenced { .. } => self.fences,
            Read::Revocations { .. } => self.resources.contains(Revocation::PLURAL),
            Read::Sessions(_) | Read::ActiveSessions { .. } | Read::DueSessions { .. } => {
                self.resources.contains(AccessSession::PLURAL)
            }
            Read::PolicySizes { .. } => self.resources.contains(apis::ToolPolicy::PLURAL),
        }
    }
}

impl WriteTx {
    /// Begins a transaction on `client`, takes the sync-state row lock and reads `prefetch`
    /// under it: one round trip (`BEGIN`, the lock and the reads are pipelined; READ
    /// COMMITTED, each read sees every transaction committed before the lock was granted).
    pub async fn begin(client: deadpool_postgres::Object, prefetch: Vec<Read>) -> Result<Self> {
        let mut tx = Self {
            client: Some(client),
            open: true,
            epoch: 0,
            seq: 0,
            rows: HashMap::new(),
            committed: false,
            savepoints: false,
            in_savepoint: false,
            dirty: false,
            current: Vec::new(),
            held: Vec::new(),
            held_seq: 0,
            poisoned: None,
            refused: false,
            send_at_commit: false,
            prefetched: HashMap::new(),
            touched: Touched::default(),
        };
        let client = tx.client();
        let (begun, read) = tokio::join!(
            client.batch_execute("BEGIN"),
            run_reads(client, Some(LOCK_SQL), prefetch)
        );
        begun.map_err(pg_err)?;
        let (locked, answers) = read?;
        let row = locked.ok_or_else(|| StoreError::Internal("the lock returned no row".into()))?;
        tx.epoch = row.get::<_, i32>(0) as u32;
        tx.seq = row.get::<_, i64>(1) as u64;
        for (read, result) in answers {
            let mut rows = HashMap::new();
            let fact = fact_of(&read, result, tx.epoch, &mut rows)?;
            let rows = rows.into_iter().collect();
            tx.prefetched.insert(read, Prefetched { fact, rows });
        }
        Ok(tx)
    }

    fn client(&self) -> &deadpool_postgres::Object {
        self.client
            .as_ref()
            .expect("the connection is only taken on drop")
    }

    /// The last sequence number handed out.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The epoch the transaction writes in.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Runs each mutation from now on in its own savepoint, taken in the same round trip
    /// as its first read that reaches PostgreSQL (its writes are only held, so a mutation
    /// answered from the prefetched facts needs none).
    pub fn use_savepoints(&mut self) {
        self.savepoints = true;
    }

    /// Starts the next mutation: nothing read, nothing committed yet.
    pub fn start_mutation(&mut self) {
        self.rows.clear();
        self.committed = false;
        self.in_savepoint = false;
        self.dirty = false;
        self.current.clear();
    }

    /// Whether the current mutation committed (its writes are to be kept).
    pub fn mutation_committed(&self) -> bool {
        self.committed
    }

    /// Sends each mutation's writes when it commits, each in its own savepoint when
    /// [`Self::use_savepoints`] was asked for.
    pub fn send_at_commit(&mut self) {
        self.send_at_commit = true;
    }

    /// Whether PostgreSQL refused a held write: nothing of the transaction stands.
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// A held write failed when sent.
    fn poison(&mut self, e: tokio_postgres::Error) -> StoreError {
        self.refused = e.as_db_error().is_some();
        let e = pg_err(e);
        self.poisoned = Some(e.clone());
        e
    }

    /// Keeps the current mutation's writes for the commit, or sends them now (in its
    /// savepoint) when [`Self::send_at_commit`] was asked for; an error then fails this
    /// mutation alone, rolled back to its savepoint.
    pub async fn commit_mutation(&mut self) -> Result<()> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        if !self.send_at_commit {
            self.committed = true;
            self.held.append(&mut self.current);
            self.held_seq = self.seq;
            return Ok(());
        }
        let writes = self.current.len();
        let mut statements = Vec::with_capacity(writes + 2);
        if self.savepoint_due() {
            statements.push(Held::savepoint());
        }
        statements.append(&mut self.current);
        if writes > 0 {
            statements.push(Held {
                sql: ADVANCE_SQL,
                params: vec![Box::new(self.seq as i64)],
            });
        }
        let (sent, _) = pipeline(self.client(), &statements, async { Ok(()) }).await;
        if let Err(e) = sent {
            self.dirty = true;
            return Err(pg_err(e));
        }
        self.committed = true;
        Ok(())
    }

    /// The held writes, to send now, followed by the sync-state advance when there are any.
    fn take_held(&mut self) -> Vec<Held> {
        let mut held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            held.push(Held {
                sql: ADVANCE_SQL,
                params: vec![Box::new(self.held_seq as i64)],
            });
        }
        held
    }

    /// Undoes the current mutation unless it committed: its held writes are dropped and its
    /// sequence numbers, from `seq` on, handed out again; after a failed statement, back to
    /// its savepoint. Without savepoints a failed statement leaves the caller to roll the
    /// whole transaction back. An error means the transaction can no longer be trusted.
    pub async fn undo_uncommitted(&mut self, seq: u64) -> Result<()> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        if self.committed {
            return Ok(());
        }
        self.current.clear();
        self.seq = seq;
        if self.dirty && self.in_savepoint {
            self.client()
                .batch_execute("ROLLBACK TO SAVEPOINT mutation")
                .await
                .map_err(pg_err)?;
        }
        Ok(())
    }

    /// The savepoint statement to send before the current mutation's first statement, if
    /// it needs one.
    fn savepoint_due(&mut self) -> bool {
        let due = self.savepoints && !self.in_savepoint;
        self.in_savepoint |= due;
        due
    }

    /// Commits the whole transaction, its held writes sent in the same round trip as the
    /// `COMMIT`, or rolls it back. On an error the connection is closed (dropped while open).
    pub async fn finish(&mut self, commit: bool) -> Result<()> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let held = match commit {
            true => self.take_held(),
            false => Vec::new(),
        };
        let sql = if commit { "COMMIT" } else { "ROLLBACK" };
        let client = self.client();
        let (written, done) = pipeline(client, &held, async {
            client.batch_execute(sql).await.map_err(pg_err)
        })
        .await;
        // After a failed write the COMMIT rolled back: the write's error is the answer.
        if let Err(e) = written {
            return Err(self.poison(e));
        }
        done?;
        self.open = false;
        Ok(())
    }

    fn next_seq(&mut self) -> i64 {
        self.seq += 1;
        self.seq as i64
    }

    fn before(&self, key: &ObjectKey) -> Result<StoredRow> {
        self.rows.get(key).cloned().ok_or_else(|| {
            StoreError::Internal(format!("a plan writes {key:?}, which it never read"))
        })
    }

    /// Holds a write of the current mutation.
    fn hold(&mut self, sql: &'static str, params: Params) {
        self.current.push(Held { sql, params });
    }

    /// Stores a new object and its ADDED event.
    fn insert(&mut self, key: ObjectKey, uid: &str, body: Value) -> Result<u64> {
        let uid = Uuid::parse_str(uid).map_err(|e| StoreError::Internal(e.to_string()))?;
        let seq = self.next_seq();
        self.rows.insert(
            key.clone(),
            StoredRow {
                seq: seq as u64,
                body: body.clone(),
            },
        );
        self.hold(
            "WITH o AS (
                 INSERT INTO objects (resource, namespace, name, uid, seq, body) VALUES ($1, $2, $3, $4, $5, $6)
             )
             INSERT INTO change_log (seq, resource, namespace, name, event, object) VALUES ($5, $1, $2, $3, 'ADDED', $6)",
            vec![
                Box::new(key.resource),
                Box::new(key.namespace),
                Box::new(key.name),
                Box::new(uid),
                Box::new(seq),
                Box::new(body),
            ],
        );
        Ok(seq as u64)
    }

    /// Replaces objects of one resource in one statement, each with its MODIFIED event and
    /// before-image.
    fn replace_many(&mut self, writes: Vec<(ObjectKey, Value)>) -> Result<Vec<u64>> {
        let Some(resource) = writes.first().map(|(k, _)| k.resource) else {
            return Ok(Vec::new());
        };
        let mut namespaces = Vec::with_capacity(writes.len());
        let mut names = Vec::with_capacity(writes.len());
        let mut seqs = Vec::with_capacity(writes.len());
        let mut bodies = Vec::with_capacity(writes.len());
        let mut befores = Vec::with_capacity(writes.len());
        let mut prevs = Vec::with_capacity(writes.len());
        for (key, body) in writes {
            let before = self.before(&key)?;
            let seq = self.next_seq();
            seqs.push(seq);
            namespaces.push(key.namespace.clone());
            names.push(key.name.clone());
            prevs.push(before.seq as i64);
            befores.push(before.body);
            self.rows.insert(
                key,
                StoredRow {
                    seq: seq as u64,
                    body: body.clone(),
                },
            );
            bodies.push(body);
        }
        let written = seqs.iter().map(|s| *s as u64).collect();
        self.hold(
            "WITH d AS (
                 SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::jsonb[], $6::jsonb[], $7::bigint[])
                     AS d(namespace, name, seq, body, before, prev_seq)
             ), o AS (
                 UPDATE objects SET seq = d.seq, body = d.body FROM d
                  WHERE objects.resource = $1 AND objects.namespace = d.namespace AND objects.name = d.name
             )
             INSERT INTO change_log (seq, resource, namespace, name, event, object, before, prev_seq)
             SELECT d.seq, $1, d.namespace, d.name, 'MODIFIED', d.body, d.before, d.prev_seq FROM d",
            vec![
                Box::new(resource),
                Box::new(namespaces),
                Box::new(names),
                Box::new(seqs),
                Box::new(bodies),
                Box::new(befores),
                Box::new(prevs),
            ],
        );
        Ok(written)
    }

    /// Deletes an object and records the DELETED event carrying its last state.
    fn remove(&mut self, key: ObjectKey) -> Result<u64> {
        let last = self.before(&key)?;
        let seq = self.next_seq();
        let prev = last.seq as i64;
        self.rows.remove(&key);
        self.hold(
            "WITH o AS (
                 DELETE FROM objects WHERE resource = $1 AND namespace = $2 AND name = $3
             )
             INSERT INTO change_log (seq, resource, namespace, name, event, object, before, prev_seq)
             VALUES ($4, $1, $2, $3, 'DELETED', $5, $5, $6)",
            vec![
                Box::new(key.resource),
                Box::new(key.namespace),
                Box::new(key.name),
                Box::new(seq),
                Box::new(last.body),
                Box::new(prev),
            ],
        );
        Ok(seq as u64)
    }

    fn reserve_name(&mut self, key: ObjectKey, uid: &str) -> Result<()> {
        let uid = Uuid::parse_str(uid).map_err(|e| StoreError::Internal(e.to_string()))?;
        self.hold(
            "INSERT INTO name_reservations (resource, namespace, name, uid) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
            vec![
                Box::new(key.resource),
                Box::new(key.namespace),
                Box::new(key.name),
                Box::new(uid),
            ],
        );
        Ok(())
    }
}

impl WriteTx {
    /// Loads facts under the sync-state lock (taken when the transaction began): READ
    /// COMMITTED, so they see every transaction committed before and the writes of the
    /// mutations before this one in the same group (the held ones leave first, in the same
    /// round trip).
    pub async fn read(&mut self, reads: Vec<Read>) -> Result<Vec<(Read, Fact)>> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let mut facts = Vec::with_capacity(reads.len());
        let mut wanted = Vec::new();
        for read in reads {
            match self.prefetched.get(&read) {
                Some(p) if !self.touched.could_change(&read) => {
                    self.rows.extend(p.rows.iter().cloned());
                    facts.push((read, p.fact.clone()));
                }
                _ => wanted.push(read),
            }
        }
        if wanted.is_empty() {
            return Ok(facts);
        }
        let mut statements = self.take_held();
        if self.savepoint_due() {
            statements.push(Held::savepoint());
        }
        let client = self.client();
        let (written, answers) =
            pipeline(client, &statements, run_reads(client, None, wanted)).await;
        if let Err(e) = written {
            return Err(self.poison(e));
        }
        let answers = match answers {
            Ok((_, answers)) => answers,
            Err(e) => {
                self.dirty = true;
                return Err(e);
            }
        };
        for (read, result) in answers {
            let fact = fact_of(&read, result, self.epoch, &mut self.rows)?;
            facts.push((read, fact));
        }
        Ok(facts)
    }

    /// Holds the current mutation's writes, in order, until it commits; returns the
    /// resourceVersion each object write gets.
    pub async fn write(&mut self, writes: Vec<Write>) -> Result<Vec<(ObjectKey, ResourceVersion)>> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        for write in &writes {
            self.touched.record(write);
        }
        let mut versions = Vec::new();
        let mut writes = writes.into_iter().peekable();
        while let Some(write) = writes.next() {
            match write {
                Write::Create { key, uid, body } => {
                    let seq = self.insert(key.clone(), &uid, body)?;
                    versions.push((key, ResourceVersion::new(self.epoch, seq)));
                }
                Write::Replace { key, body } => {
                    // A run of replacements of one resource is one statement.
                    let mut batch = vec![(key, body)];
                    while let Some(Write::Replace { key, .. }) = writes.peek() {
                        if key.resource != batch[0].0.resource {
                            break;
                        }
                        if let Some(Write::Replace { key, body }) = writes.next() {
                            batch.push((key, body));
                        }
                    }
                    let keys: Vec<ObjectKey> = batch.iter().map(|(k, _)| k.clone()).collect();
                    let seqs = self.replace_many(batch)?;
                    for (key, seq) in keys.into_iter().zip(seqs) {
                        versions.push((key, ResourceVersion::new(self.epoch, seq)));
                    }
                }
                Write::Remove { key } => {
                    let seq = self.remove(key.clone())?;
                    versions.push((key, ResourceVersion::new(self.epoch, seq)));
                }
                Write::ReserveName { key, uid } => self.reserve_name(key, &uid)?,
                Write::Fence { fence, revocation } => {
                    let (sql, params) = revocations::install_fence(&fence, &revocation);
                    self.hold(sql, params);
                }
            }
        }
        Ok(versions)
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.open {
            // Mid-transaction (a failed COMMIT, a panic, a dropped future): the connection
            // must never serve another request. Detached from the pool and dropped, it
            // closes, and PostgreSQL rolls the transaction back.
            if let Some(client) = self.client.take() {
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}
