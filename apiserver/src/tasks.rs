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

#[cfg(test)]
mod tests {
    use super::*;

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
