//! Group commit: the writer of a [`super::PgStore`] gathers the mutations queued behind the
//! one in progress into one transaction, so one commit (one fsync) serves many.
//!
//! Every mutation still runs its kind's hooks on its own facts, in queue order, and gets its
//! own sequence numbers; only its commit is shared. In a group of several, each runs inside a
//! savepoint: one refused or failing mutation is rolled back to it (its sequence numbers
//! handed out again) without failing its neighbours. Nobody hears of a mutation's success
//! (its answer, its session Events, the expiry scheduler's wake-up) before the group's
//! `COMMIT` returned; if that fails, every mutation that wrote gets its error.

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

use super::pool_err;
use super::tx::WriteTx;
use crate::store::feed::Feed;
use crate::store::rv::ResourceVersion;
use crate::store::transact::{Backend, OnCommit};
use crate::store::{Result, SessionChanges, SessionSignals, StoreError};

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
}

/// The writer task: runs queued mutations in groups until every [`Writer`] is dropped.
async fn run(
    mut queue: mpsc::UnboundedReceiver<Job>,
    pool: Pool,
    feed: Arc<Feed>,
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
        if AssertUnwindSafe(run_group(&pool, &feed, group))
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
    /// The feed hears of every sequence acknowledged, and of a database found behind them.
    pub fn new(
        pool: Pool,
        feed: Arc<Feed>,
        wait: Duration,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, receiver) = mpsc::unbounded_channel();
        let tally = Arc::<Tally>::default();
        let task = run(receiver, pool, feed, tally.clone());
        (Self { queue, wait, tally }, task)
    }

    /// Groups run so far and the mutations they held.
    pub fn groups(&self) -> (u64, u64) {
        (
            self.tally.groups.load(Ordering::Relaxed),
            self.tally.mutations.load(Ordering::Relaxed),
        )
    }

    /// Runs `mutation` in the next group and returns its result once the group committed.
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
        F: FnOnce(GroupTx, Arc<Deferred>) -> Fut + Send + 'static,
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
    /// Runs it; the returned closure answers its caller once the group's outcome is known:
    /// `None` when it wrote nothing (its answer stands whatever the commit does).
    fn run(self: Box<Self>, tx: GroupTx) -> BoxFuture<'static, Deliver>;
    /// Answers its caller with `error` without running it.
    fn fail(self: Box<Self>, error: StoreError);
}

type Deliver = Box<dyn FnOnce(Option<Result<()>>) + Send>;

struct Pending<T, F> {
    run: F,
    answer: oneshot::Sender<Result<T>>,
    signals: Arc<SessionSignals>,
}

impl<T, F, Fut> Mutation for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(GroupTx, Arc<Deferred>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    fn run(self: Box<Self>, tx: GroupTx) -> BoxFuture<'static, Deliver> {
        let Pending {
            run,
            answer,
            signals,
        } = *self;
        async move {
            let deferred = Arc::new(Deferred::default());
            let result = run(tx, deferred.clone()).await;
            Box::new(move |commit: Option<Result<()>>| {
                let result = match (result, commit) {
                    (Ok(value), Some(Ok(()))) => {
                        for changes in deferred.take() {
                            signals.committed(changes);
                        }
                        Ok(value)
                    }
                    (Ok(_), Some(Err(e))) => Err(e),
                    (result, _) => result,
                };
                // The caller may be gone (its client disconnected): the write stands.
                let _ = answer.send(result);
            }) as Deliver
        }
        .boxed()
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
        self.tx.lock().await.commit_mutation();
        Ok(())
    }
}

async fn run_group(pool: &Pool, feed: &Feed, mut group: Vec<Job>) {
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
    let mark = feed.mark();
    let begun = match pool.get().await.map_err(pool_err) {
        Ok(client) => WriteTx::begin(client, prefetch).await,
        Err(e) => Err(e),
    };
    // Sequence numbers this process acknowledged before must never be handed out again: the
    // database is an older copy (the feed rotates the epoch; the writes are retried there).
    let begun = begun.and_then(|tx| match feed.went_back(mark, tx.epoch(), tx.seq()) {
        Some(reason) => Err(StoreError::Unavailable(reason)),
        None => Ok(tx),
    });
    let tx = match begun {
        Ok(tx) => Arc::new(tokio::sync::Mutex::new(tx)),
        Err(e) => {
            for job in group {
                job.mutation.fail(e.clone());
            }
            return;
        }
    };
    if group.len() > 1 {
        tx.lock().await.use_savepoints();
    }
    let mut delivers: Vec<(Deliver, bool)> = Vec::with_capacity(group.len());
    let mut broken: Option<StoreError> = None;
    let mut jobs = group.into_iter();
    for job in jobs.by_ref() {
        let seq = {
            let mut tx = tx.lock().await;
            tx.start_mutation();
            tx.seq()
        };
        let deliver = job.mutation.run(GroupTx { tx: tx.clone() }).await;
        let mut tx = tx.lock().await;
        let kept = tx.mutation_committed();
        // Refused, failed or dry: undone, its sequence numbers handed out again.
        if let Err(e) = tx.undo_uncommitted(seq).await {
            delivers.push((deliver, false));
            broken = Some(e);
            break;
        }
        delivers.push((deliver, kept));
    }
    // The transaction can no longer be trusted: the mutations not run yet are told why.
    if let Some(e) = &broken {
        for job in jobs {
            job.mutation.fail(e.clone());
        }
    }
    let wrote = delivers.iter().any(|(_, kept)| *kept);
    let outcome = match &broken {
        Some(e) => Err(e.clone()),
        None => {
            let mut tx = tx.lock().await;
            let outcome = tx.finish(wrote).await;
            if wrote && outcome.is_ok() {
                feed.observe(tx.epoch(), tx.seq());
            }
            outcome
        }
    };
    // With nothing written a failed ROLLBACK changes no answer (the connection is closed).
    for (deliver, kept) in delivers {
        deliver(kept.then(|| outcome.clone()));
    }
}
