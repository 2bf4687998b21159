//! Lists of the current state that arrive together share one snapshot read.
//!
//! After a mass cut (a stall, a restart) thousands of gateways relist the same few scopes
//! at once. Each list of the current state asks for a snapshot that includes every write
//! acknowledged before the list arrived; a read that *starts* after a request arrived gives
//! it exactly that. So the reads of one query (same resource, namespace, selectors, page
//! size) take turns: while one runs, the requests that arrive gather behind it, and the next
//! read, started once the running one ended, answers all of them. Nobody joins a read that
//! has already started, so no answer is older than its request: a list here is as fresh as
//! one read of its own. A read nobody waits for any more is dropped with its waiters.
//!
//! What the gathered requests share is the first page read ([`Snapshot`]): items as bytes,
//! behind one `Arc`. The rest of a long unpaged list is then streamed by each request on its
//! own, at the snapshot's resourceVersion, as a lone list is.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::store::error::{Result, StoreError};

/// One read, shared by the requests gathered for it.
type Read<T> = Shared<BoxFuture<'static, Result<T, StoreError>>>;
/// A read not started yet, held weakly: it lives only while somebody waits for it.
type Gathering<T> = WeakShared<BoxFuture<'static, Result<T, StoreError>>>;

/// Reads of one query: whose turn it is, and the read that gathers newcomers.
struct Query<T> {
    /// Held by the running read: the next one starts when it is released.
    turn: tokio::sync::Mutex<()>,
    /// The read that has not started yet (with its number), which a newcomer joins while
    /// anyone still waits for it.
    gathering: Mutex<Option<(u64, Gathering<T>)>>,
}

impl<T> Default for Query<T> {
    fn default() -> Self {
        Self {
            turn: tokio::sync::Mutex::new(()),
            gathering: Mutex::new(None),
        }
    }
}

/// Gathers concurrent reads of the same query (see the module documentation).
pub(super) struct Coalescer<T> {
    queries: Mutex<HashMap<String, Arc<Query<T>>>>,
    next: AtomicU64,
    metrics: ListMetrics,
}

/// How many lists were asked of the current state and how many snapshot reads served them.
#[derive(Clone, Default)]
pub struct ListMetrics {
    lists: Counter,
    reads: Counter,
}

impl ListMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver_list");
        sub.register(
            "latest",
            "Lists of the current state asked of storage (gateway relists among them)",
            self.lists.clone(),
        );
        sub.register(
            "snapshot_reads",
            "Snapshot reads that served lists of the current state (lists arriving together share one)",
            self.reads.clone(),
        );
    }

    /// `(lists, reads)` so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.lists.get(), self.reads.get())
    }
}

fn locked<G>(m: &Mutex<G>) -> MutexGuard<'_, G> {
    // Every update under these locks is one step: a panic leaves consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forgets a query once no read of it runs or gathers (dropped with the read that held it,
/// whether it completed or was abandoned).
struct Forget<T: Send + Sync + 'static> {
    coalescer: Arc<Coalescer<T>>,
    key: String,
    query: Option<Arc<Query<T>>>,
}

impl<T: Send + Sync + 'static> Drop for Forget<T> {
    fn drop(&mut self) {
        let mut queries = locked(&self.coalescer.queries);
        let query = self.query.take();
        // Held by the map and by this read only: nobody else reads or gathers.
        if query.is_some_and(|q| Arc::strong_count(&q) == 2) {
            queries.remove(&self.key);
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Coalescer<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            queries: Mutex::default(),
            next: AtomicU64::new(0),
            metrics: ListMetrics::default(),
        })
    }

    pub(super) fn metrics(&self) -> ListMetrics {
        self.metrics.clone()
    }

    /// Queries with a read running or gathering (for tests: none once all are answered).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        locked(&self.queries).len()
    }

    /// The answer of a read of `key` that starts after this call, shared with the other
    /// requests for `key` that arrive before it starts. `read` is called only when this
    /// request starts a new gathering.
    pub(super) async fn read<F>(
        self: &Arc<Self>,
        key: String,
        read: impl FnOnce() -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.metrics.lists.inc();
        let shared = {
            let mut queries = locked(&self.queries);
            let query = queries.entry(key.clone()).or_default().clone();
            let mut gathering = locked(&query.gathering);
            match gathering.as_ref().and_then(|(_, weak)| weak.upgrade()) {
                Some(shared) => shared,
                None => {
                    let id = self.next.fetch_add(1, Ordering::Relaxed);
                    let forget = Forget {
                        coalescer: self.clone(),
                        key,
                        query: Some(query.clone()),
                    };
                    let reads = self.metrics.reads.clone();
                    let read = read();
                    let shared: Read<T> = async move {
                        let forget = forget;
                        let query = forget.query.clone().expect("held until dropped");
                        let turn = query.turn.lock().await;
                        // Started: whoever arrives from now on gathers for the next read.
                        {
                            let mut gathering = locked(&query.gathering);
                            if gathering.as_ref().is_some_and(|(i, _)| *i == id) {
                                *gathering = None;
                            }
                        }
                        reads.inc();
                        let answer = read.await;
                        drop(turn);
                        drop(query);
                        answer
                    }
                    .boxed()
                    .shared();
                    *gathering = shared.downgrade().map(|weak| (id, weak));
                    shared
                }
            }
        };
        shared.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::{oneshot, Semaphore};

    #[tokio::test]
    async fn requests_gather_behind_a_running_read_and_share_the_next() {
        let coalescer = Coalescer::<u32>::new();
        // The first read holds its turn until released.
        let (release, held) = oneshot::channel::<()>();
        let first = tokio::spawn({
            let c = coalescer.clone();
            async move {
                c.read("q".into(), || async move {
                    let _ = held.await;
                    Ok(1)
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Ten arrive while it runs: one of them starts the gathering read, the rest join it.
        let started = Arc::new(Semaphore::new(0));
        let mut later = Vec::new();
        for _ in 0..10 {
            let c = coalescer.clone();
            let started = started.clone();
            later.push(tokio::spawn(async move {
                c.read("q".into(), move || async move {
                    started.add_permits(1);
                    Ok(2)
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            started.available_permits(),
            0,
            "no read starts before the running one ends"
        );
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        for l in later {
            assert_eq!(
                l.await.unwrap().unwrap(),
                2,
                "newcomers get the later read, never the running one"
            );
        }
        assert_eq!(started.available_permits(), 1, "one read served the ten");
        assert_eq!(coalescer.metrics().counts(), (11, 2));
        assert_eq!(coalescer.tracked(), 0, "answered queries are forgotten");
    }

    #[tokio::test]
    async fn different_queries_do_not_wait_for_each_other() {
        let coalescer = Coalescer::<u32>::new();
        let (_keep, held) = oneshot::channel::<()>();
        let c = coalescer.clone();
        let _blocked = tokio::spawn(async move {
            c.read("a".into(), || async move {
                let _ = held.await;
                Ok(1)
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            coalescer.read("b".into(), || async { Ok(7) }),
        )
        .await
        .expect("another query reads at once");
        assert_eq!(other.unwrap(), 7);
    }

    #[tokio::test]
    async fn an_abandoned_read_is_dropped_and_forgotten() {
        let coalescer = Coalescer::<u32>::new();
        let (_keep, held) = oneshot::channel::<()>();
        let c = coalescer.clone();
        let waiter = tokio::spawn(async move {
            c.read("q".into(), || async move {
                let _ = held.await;
                Ok(1)
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(coalescer.tracked(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(
            coalescer.tracked(),
            0,
            "nobody waits: the read and its query are gone"
        );
        // A newcomer starts a read of its own instead of joining the abandoned one.
        assert_eq!(
            coalescer
                .read("q".into(), || async { Ok(3) })
                .await
                .unwrap(),
            3
        );
    }

    #[tokio::test]
    async fn errors_are_shared_like_answers() {
        let coalescer = Coalescer::<u32>::new();
        let err = coalescer
            .read("q".into(), || async {
                Err(StoreError::Unavailable("down".into()))
            })
            .await;
        assert_eq!(err, Err(StoreError::Unavailable("down".into())));
        assert_eq!(coalescer.tracked(), 0);
    }
}
