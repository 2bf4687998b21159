//! The process's long-lived tasks: named, each in its own span, and none ends unnoticed.
//!
//! Every task `run` starts is meant to run until shutdown. One that returns, fails or
//! panics before then ends the process with an error naming it: a server whose API
//! listener, certificate watcher or ConfigMap follower has quietly stopped must not keep
//! answering as if nothing happened.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tracing::Instrument;

/// How a task that should have run until shutdown ended.
#[derive(Debug, thiserror::Error)]
pub enum TaskEnded {
    #[error("{task} ended: {error:#}")]
    Failed {
        task: &'static str,
        error: anyhow::Error,
    },
    #[error("{task} ended unexpectedly")]
    Returned { task: &'static str },
    #[error("{task} panicked: {message}")]
    Panicked { task: &'static str, message: String },
}

impl TaskEnded {
    pub fn task(&self) -> &'static str {
        match self {
            Self::Failed { task, .. } | Self::Returned { task } | Self::Panicked { task, .. } => {
                task
            }
        }
    }
}

/// Tasks owned by `run`. Dropping it aborts every task still running.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, &'static str>,
}

impl Tasks {
    /// Starts `task` in a span named after it.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let span = tracing::info_span!("task", task = name);
        let handle = self.set.spawn(task.instrument(span));
        self.names.insert(handle.id(), name);
    }

    /// Starts a task that has no result: its returning at all is the failure.
    pub fn spawn_forever<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, async move {
            task.await;
            Ok(())
        });
    }

    /// Waits for the first task to end, however it ends (pending forever with no tasks).
    pub async fn first_end(&mut self) -> TaskEnded {
        match self.set.join_next_with_id().await {
            Some(joined) => self.ended(joined),
            None => std::future::pending().await,
        }
    }

    /// After shutdown has been signalled: waits up to `limit` for the tasks named `names` to
    /// finish draining. Other tasks are left to be aborted.
    pub async fn drain(&mut self, names: &[&'static str], limit: Duration) {
        let mut waiting: Vec<&'static str> = names
            .iter()
            .copied()
            .filter(|n| self.names.values().any(|v| v == n))
            .collect();
        let wait = async {
            while !waiting.is_empty() {
                let Some(joined) = self.set.join_next_with_id().await else {
                    return;
                };
                let ended = self.ended(joined);
                waiting.retain(|n| *n != ended.task());
                match ended {
                    TaskEnded::Returned { task } => tracing::debug!(task, "drained"),
                    other => tracing::warn!(error = %other, "task ended while draining"),
                }
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    fn ended(&mut self, joined: Result<(Id, anyhow::Result<()>), JoinError>) -> TaskEnded {
        let (id, outcome) = match joined {
            Ok((id, result)) => (id, Ok(result)),
            Err(e) => (e.id(), Err(e)),
        };
        let task = self.names.remove(&id).unwrap_or("a task");
        match outcome {
            Ok(Ok(())) => TaskEnded::Returned { task },
            Ok(Err(error)) => TaskEnded::Failed { task, error },
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                TaskEnded::Panicked { task, message }
            }
            Err(_) => TaskEnded::Returned { task },
        }
    }
}

/// Background tasks a component (the store) owns, that `run` can watch without owning
/// them: the first to end or panic is reported through [`Background::ended`]. Dropping
/// the owner aborts them all (an aborted task is not reported).
pub struct Background {
    aborts: Vec<tokio::task::AbortHandle>,
    ended_tx: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            aborts: Vec::new(),
            ended_tx: tokio::sync::watch::Sender::new(None),
        }
    }
}

impl Background {
    /// Starts `task`, meant to run until its owner is dropped, in a span named after it.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(task.instrument(tracing::info_span!("task", task = name)));
        self.aborts.push(handle.abort_handle());
        let ended = self.ended_tx.clone();
        // The monitor holds the join handle: it learns of a return or a panic at once.
        tokio::spawn(async move {
            let report = match handle.await {
                Ok(()) => format!("{name} ended unexpectedly"),
                Err(e) if e.is_cancelled() => return,
                Err(e) => {
                    let message = match e.try_into_panic() {
                        Ok(payload) => payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(no message)".into()),
                        Err(e) => e.to_string(),
                    };
                    format!("{name} panicked: {message}")
                }
            };
            tracing::error!(task = name, error = %report, "background task ended");
            ended.send_if_modified(|first| {
                let unset = first.is_none();
                if unset {
                    *first = Some(report);
                }
                unset
            });
        });
    }

    /// Resolves with the report of the first task that ended or panicked.
    pub fn ended(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.ended_tx.subscribe();
        async move {
            let report = rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|report| report.clone());
            match report {
                Some(report) => report,
                // The owner is gone: its tasks were aborted, which is not a failure.
                None => std::future::pending().await,
            }
        }
    }

    /// Whether every task is still running (for readiness).
    pub fn all_running(&self) -> bool {
        self.ended_tx.borrow().is_none()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for abort in &self.aborts {
            abort.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_background_panic_is_reported_to_the_watcher() {
        let mut background = Background::default();
        background.spawn("change log trimmer", std::future::pending());
        let ended = background.ended();
        assert!(background.all_running());
        background.spawn("change feed", async { panic!("reader lost its mind") });
        let report = tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("the panic is reported");
        assert_eq!(report, "change feed panicked: reader lost its mind");
        assert!(!background.all_running());
    }

    #[tokio::test]
    async fn dropping_the_owner_aborts_without_a_report() {
        let mut background = Background::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        background.spawn("holder", async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        let ended = background.ended();
        drop(background);
        // The task was aborted: its end of the channel is dropped.
        assert!(tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("the task is aborted")
            .is_err());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), ended)
                .await
                .is_err(),
            "an abort is not a failure"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported_by_name() {
        let mut tasks = Tasks::default();
        tasks.spawn_forever("steady", std::future::pending());
        tasks.spawn_forever("feed", async { panic!("boom") });
        let ended = tasks.first_end().await;
        assert_eq!(ended.task(), "feed");
        assert_eq!(ended.to_string(), "feed panicked: boom");
    }

    #[tokio::test]
    async fn a_task_that_returns_or_fails_is_reported_by_name() {
        let mut tasks = Tasks::default();
        tasks.spawn_forever("cert watcher", async {});
        assert_eq!(
            tasks.first_end().await.to_string(),
            "cert watcher ended unexpectedly"
        );
        tasks.spawn("API listener", async {
            Err(anyhow::anyhow!("socket closed"))
        });
        assert_eq!(
            tasks.first_end().await.to_string(),
            "API listener ended: socket closed"
        );
    }

    #[tokio::test]
    async fn drain_waits_for_the_named_tasks_only() {
        let mut tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("listener", async move {
            let _ = rx.await;
            Ok(())
        });
        tasks.spawn_forever("follower", std::future::pending());
        let _ = tx.send(());
        tokio::time::timeout(
            Duration::from_secs(5),
            tasks.drain(&["listener"], Duration::from_secs(60)),
        )
        .await
        .expect("drain returns once the listener has ended");
    }
}
