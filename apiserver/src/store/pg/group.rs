//! Group commit: the writer of a [`super::PgStore`] gathers the mutations queued behind the
//! one in progress into one transaction, so one commit (one fsync) serves many.
//!
//! Every mutation still runs its kind's hooks on its own facts, in queue order, and gets its
//! own sequence numbers; only its commit is shared. Its writes are held until it commits and
//! leave with the group's `COMMIT` (or with a later mutation's read that has to reach
//! PostgreSQL): a mutation refused by its rules is never sent (its sequence numbers handed
//! out again) and does not fail its neighbours. A group of session creates answered from its
//! prefetched facts is two round trips: `BEGIN` with the lock and every read, then every
//! write with the `COMMIT`.
//!
//! The lock makes the facts read under it authoritative, so a write decided on them fails
//! only when the database refuses it (a trigger, a limit no rule knew). Then nothing of the
//! group stands, and it runs again in a new transaction with each mutation's writes sent when
//! it commits, in its own savepoint: the refused one fails alone. In a group of several, a
//! mutation whose read reaches PostgreSQL takes a savepoint first, so a failed read is rolled
//! back to it alone. Nobody hears of a mutation's success (its answer, its session Events,
//! the expiry scheduler's wake-up) before the group's `COMMIT` returned; if that fails, every
//! mutation that wrote gets its error.

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apis::strategy::{Fact, ObjectKey, Read, Write};
use async_trait::async_trait;
use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use super::error::pool_err;
use super::history::History;
use super::tx::WriteTx;
use crate::store::error::{Result, StoreError};
use crate::store::port::{SessionChanges, SessionSignals};
use crate::store::rv::ResourceVersion;
use crate::store::transact::{Backend, OnCommit};

/// Mutations in one group at most. Each that writes takes a subtransaction id; PostgreSQL
/// caches 64 per transaction before other sessions' snapshots get slower.
const MAX_GROUP: usize = 32;

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// The queue in front of the store's one writer task.
pub(super) struct Writer {
    queue: mpsc::UnboundedSender<Job>,
    /// How long a mutation may wait in the queue before it is answered 503.
    wait: Duration,
    tally: Arc<Tally>,
}

/// Groups committed (or rolled back) and the mutations they ran.
#[derive(Default)]
struct Tally {
    groups: AtomicU64,
    mutations: AtomicU64,
    /// Groups run a second time, each mutation in its own savepoint, after the database
    /// refused one of their held writes.
    reruns: AtomicU64,
}

/// The writer task: runs queued mutations in groups until every [`Writer`] is dropped.
async fn run(
    mut queue: mpsc::UnboundedReceiver<Job>,
    pool: Pool,
    history: Arc<History>,
    tally: Arc<Tally>,
) {
    let mut received = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut received, MAX_GROUP).await > 0 {
        // A mutation whose caller gave up waiting is never run: it was answered 503.
        let group: Vec<Job> = received.drain(..).filter(Job::take).collect();
        if group.is_empty() {
            continue;
        }
        tally.groups.fetch_add(1, Ordering::Relaxed);
        tally
            .mutations
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        // A panicking hook must not take the writer down: the group's transaction is
        // dropped (its connection closed, so rolled back) and its callers are told.
        if AssertUnwindSafe(run_group(&pool, &history, group, &tally))
            .catch_unwind()
            .await
            .is_err()
        {
            tracing::error!("a write group panicked; its transaction was rolled back");
        }
    }
}

impl Writer {
    /// The queue and the task that drains it.
    /// The history hears of every sequence acknowledged, and of a database found behind them.
    pub fn new(
        pool: Pool,
        history: Arc<History>,
        wait: Duration,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, receiver) = mpsc::unbounded_channel();
        let tally = Arc::<Tally>::default();
        let task = run(receiver, pool, history, tally.clone());
        (Self { queue, wait, tally }, task)
    }

    /// Groups run so far and the mutations they held.
    pub fn groups(&self) -> (u64, u64) {
        (
            self.tally.groups.load(Ordering::Relaxed),
            self.tally.mutations.load(Ordering::Relaxed),
        )
    }

    /// Groups run again, each mutation in its own savepoint, after the database refused
    /// one of their writes.
    pub fn reruns(&self) -> u64 {
        self.tally.reruns.load(Ordering::Relaxed)
    }

    /// Runs `mutation` in the next group and returns its result once the group committed.
    /// A group whose held writes the database refused runs `mutation` again, each in its own
    /// savepoint (so it must be repeatable: it decides on the facts it reads).
    /// `mutation` writes through the [`Backend`] it is given and reports what it did to
    /// sessions to the [`OnCommit`] it is given; `signals` hears of that after the commit.
    /// `prefetch` is what its first round of reads will ask for: the group reads it with its
    /// lock, in the same round trip.
    pub async fn submit<T, F, Fut>(
        &self,
        signals: Arc<SessionSignals>,
        prefetch: Vec<Read>,
        mutation: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(GroupTx, Arc<Deferred>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (answer, mut answered) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let job = Job {
            state: state.clone(),
            prefetch,
            mutation: Box::new(Pending {
                run: mutation,
                answer,
                signals,
                last: None,
            }),
        };
        self.queue
            .send(job)
            .map_err(|_| StoreError::Unavailable("the store's writer has stopped".into()))?;
        // A caller that goes away (its client disconnected, its request timed out) before
        // the mutation was taken withdraws it too.
        let _withdraw = Withdraw(&state);
        let wait = self.wait;
        let outcome = match tokio::time::timeout(wait, &mut answered).await {
            Ok(outcome) => outcome,
            // Still queued: withdrawn, so it never runs after its caller was told to retry.
            Err(_)
                if state
                    .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok() =>
            {
                return Err(StoreError::Unavailable(format!(
                    "no turn to write within {wait:?}; retry"
                )));
            }
            // Already running: its transaction is bounded by the session's timeouts.
            Err(_) => answered.await,
        };
        outcome.unwrap_or_else(|_| {
            Err(StoreError::Internal(
                "the write ended without an answer; its outcome is unknown".into(),
            ))
        })
    }
}

/// Withdraws a mutation still queued when dropped (a no-op once it was taken or answered).
struct Withdraw<'a>(&'a AtomicU8);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A queued mutation.
pub(super) struct Job {
    state: Arc<AtomicU8>,
    /// The reads its first round will ask for.
    prefetch: Vec<Read>,
    mutation: Box<dyn Mutation>,
}

impl Job {
    /// Claims the job for a group, unless its caller gave up on it.
    fn take(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// What a group does with a mutation, whatever its result type.
trait Mutation: Send {
    /// Runs it, keeping its result for [`Mutation::answer`]. A group whose transaction was
    /// rolled back runs it again, in a new one: only the last run's result is answered.
    fn run(&mut self, tx: GroupTx) -> BoxFuture<'_, ()>;
    /// Answers its caller with its last run's result once the group's outcome is known:
    /// `commit` is `None` when it wrote nothing (its answer stands whatever the commit does).
    fn answer(self: Box<Self>, commit: Option<Result<()>>);
    /// Answers its caller with `error` instead.
    fn fail(self: Box<Self>, error: StoreError);
}

struct Pending<T, F> {
    run: F,
    answer: oneshot::Sender<Result<T>>,
    signals: Arc<SessionSignals>,
    /// The last run's result and what it did to sessions.
    last: Option<(Result<T>, Arc<Deferred>)>,
}

impl<T, F, Fut> Mutation for Pending<T, F>
where
    T: Send + 'static,
    F: Fn(GroupTx, Arc<Deferred>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    fn run(&mut self, tx: GroupTx) -> BoxFuture<'_, ()> {
        let deferred = Arc::new(Deferred::default());
        let running = (self.run)(tx, deferred.clone());
        async move {
            self.last = Some((running.await, deferred));
        }
        .boxed()
    }

    fn answer(self: Box<Self>, commit: Option<Result<()>>) {
        let Some((result, deferred)) = self.last else {
            return self.fail(StoreError::Internal("a write was answered unrun".into()));
        };
        let result = match (result, commit) {
            (Ok(value), Some(Ok(()))) => {
                for changes in deferred.take() {
                    self.signals.committed(changes);
                }
                Ok(value)
            }
            (Ok(_), Some(Err(e))) => Err(e),
            (result, _) => result,
        };
        // The caller may be gone (its client disconnected): the write stands.
        let _ = self.answer.send(result);
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.answer.send(Err(error));
    }
}

/// What a mutation did to sessions, held until its group committed.
#[derive(Default)]
pub(super) struct Deferred(Mutex<Vec<SessionChanges>>);

impl Deferred {
    fn take(&self) -> Vec<SessionChanges> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl OnCommit for Deferred {
    fn committed(&self, changes: SessionChanges) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(changes);
    }
}

/// A mutation's view of its group's transaction. Its `commit` keeps the mutation's writes
/// for the group's commit; dropping it without committing undoes them.
pub(super) struct GroupTx {
    tx: Arc<tokio::sync::Mutex<WriteTx>>,
}

#[async_trait]
impl Backend for GroupTx {
    async fn read(&mut self, reads: Vec<Read>) -> Result<Vec<(Read, Fact)>> {
        self.tx.lock().await.read(reads).await
    }

    async fn write(&mut self, writes: Vec<Write>) -> Result<Vec<(ObjectKey, ResourceVersion)>> {
        self.tx.lock().await.write(writes).await
    }

    async fn commit(self) -> Result<()> {
        self.tx.lock().await.commit_mutation().await
    }
}

async fn run_group(pool: &Pool, history: &History, mut group: Vec<Job>, tally: &Tally) {
    // Every mutation's first reads, each once, read with the lock.
    let mut prefetch = Vec::new();
    let mut seen = HashSet::new();
    for job in &mut group {
        for read in std::mem::take(&mut job.prefetch) {
            if seen.insert(read.clone()) {
                prefetch.push(read);
            }
        }
    }
    let mut mutations: Vec<Box<dyn Mutation>> = group.into_iter().map(|j| j.mutation).collect();
    let mut ran = attempt(pool, history, &mut mutations, &prefetch, false).await;
    // The database refused a held write: nothing of the group stands. Run it again, each
    // mutation's writes sent when it commits, in its own savepoint: the one refused fails
    // alone. (A group of one has its answer: the refusal.)
    if ran.refused && mutations.len() > 1 {
        tally.reruns.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            mutations = mutations.len(),
            "the database refused a write of a group; running each mutation again in its own savepoint"
        );
        ran = attempt(pool, history, &mut mutations, &prefetch, true).await;
    }
    let Attempt { kept, outcome, .. } = ran;
    for (i, mutation) in mutations.into_iter().enumerate() {
        match (kept.get(i), &outcome) {
            (Some(kept), _) => mutation.answer(kept.then(|| outcome.clone())),
            // Never run: the transaction broke before its turn.
            (None, Err(e)) => mutation.fail(e.clone()),
            (None, Ok(())) => mutation.fail(StoreError::Internal("a write was never run".into())),
        }
    }
}

/// How one transaction of a group ended.
struct Attempt {
    /// Whether each mutation run wrote (it committed); the ones after a break are missing.
    kept: Vec<bool>,
    /// The commit's outcome, or why the transaction broke.
    outcome: Result<()>,
    /// The database refused a held write: the transaction rolled back, nothing stands.
    refused: bool,
}

impl Attempt {
    fn failed(kept: Vec<bool>, e: StoreError) -> Self {
        Self {
            kept,
            outcome: Err(e),
            refused: false,
        }
    }
}

/// Runs `mutations` in one transaction; `careful` sends each one's writes when it commits,
/// in its own savepoint, instead of holding them for the `COMMIT`.
async fn attempt(
    pool: &Pool,
    history: &History,
    mutations: &mut [Box<dyn Mutation>],
    prefetch: &[Read],
    careful: bool,
) -> Attempt {
    let mark = history.mark();
    let begun = match pool.get().await.map_err(pool_err) {
        Ok(client) => WriteTx::begin(client, prefetch.to_vec()).await,
        Err(e) => Err(e),
    };
    // Sequence numbers this process acknowledged before must never be handed out again: the
    // database is an older copy (the tail rotates the epoch; the writes are retried there).
    let begun = begun.and_then(|tx| match history.went_back(mark, tx.epoch(), tx.seq()) {
        Some(reason) => Err(StoreError::Unavailable(reason)),
        None => Ok(tx),
    });
    let tx = match begun {
        Ok(tx) => Arc::new(tokio::sync::Mutex::new(tx)),
        Err(e) => return Attempt::failed(Vec::new(), e),
    };
    {
        let mut tx = tx.lock().await;
        if mutations.len() > 1 {
            tx.use_savepoints();
        }
        if careful {
            tx.send_at_commit();
        }
    }
    let mut kept = Vec::with_capacity(mutations.len());
    for mutation in mutations.iter_mut() {
        let seq = {
            let mut tx = tx.lock().await;
            tx.start_mutation();
            tx.seq()
        };
        mutation.run(GroupTx { tx: tx.clone() }).await;
        let mut tx = tx.lock().await;
        kept.push(tx.mutation_committed());
        // Refused, failed or dry: undone, its sequence numbers handed out again.
        if let Err(e) = tx.undo_uncommitted(seq).await {
            let refused = tx.refused();
            return Attempt {
                refused,
                ..Attempt::failed(kept, e)
            };
        }
    }
    let wrote = kept.iter().any(|k| *k);
    let mut tx = tx.lock().await;
    let outcome = tx.finish(wrote).await;
    if wrote && outcome.is_ok() {
        history.observe(tx.epoch(), tx.seq());
    }
    // With nothing written a failed ROLLBACK changes no answer (the connection is closed).
    Attempt {
        kept,
        outcome,
        refused: tx.refused(),
    }
}
