//! Retirement through the API (DESIGN §6): a finalizer on every MCPServer. When one is deleted,
//! the controller creates a `server_retired` Revocation through the aggregated API — the
//! permanent fence on the server's uid, revoking every session of that uid in every namespace —
//! reads it back, confirms it stands for this uid, and only then releases the finalizer. While
//! the access API is not there (APIService unavailable, a timeout) or refuses, the deletion
//! waits: condition `Retiring=False` with the reason, a Warning Event, a retry with backoff.
//! The fence is never skipped.
//!
//! The decisions are pure in [`fence`]; this module does the calls.

pub mod fence;
mod metrics;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apis::runtime::MCPServer;
use apis::types::Revocation;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, finalizer, Event as Finalized};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use tracing::{info, warn, Instrument};

use self::fence::{Failure, NotFenceable, Unconfirmed};
pub use self::metrics::Metrics;

/// The finalizer that holds a deleted MCPServer until its fence is confirmed.
pub const FINALIZER: &str = "mcp-runtime.dev/retire";
/// The field manager of the `Retiring` condition (the workload controller owns the others).
pub const FIELD_MANAGER: &str = "mcp-access-controllers-retire";
/// The reporting controller of the Events.
const REPORTER: &str = "mcp-access-controllers";
/// How long one call to the access API may take before it counts as unavailable.
const ACCESS_API_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of this controller.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Longest wait, in seconds, between two attempts to fence a deleted MCPServer while the
    /// access API is unavailable (the wait doubles from 1 s up to this).
    #[arg(
        long = "retire-max-backoff-seconds",
        env = "MCP_ACCESS_RETIRE_MAX_BACKOFF_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub max_backoff_seconds: u64,
    /// Namespace that holds the fence of an MCPServer whose own namespace is being deleted
    /// (no object can be created there any more): the controllers' own namespace. Without it,
    /// such a deletion waits (reason `NamespaceTerminating`), and so does the namespace's.
    #[arg(
        long = "retire-fence-namespace",
        env = "MCP_ACCESS_RETIRE_FENCE_NAMESPACE"
    )]
    pub fence_namespace: Option<String>,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            max_backoff_seconds: 30,
            fence_namespace: None,
        }
    }
}

/// Why retiring one MCPServer did not complete (yet).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The access API is not there: the deletion waits and is retried.
    #[error("the access API is unavailable: {0}")]
    Unavailable(String),
    /// The access API answered and refused to create or read the fence.
    #[error("the access API refused the fence: {0}")]
    Refused(#[source] kube::Error),
    /// The server's namespace is being deleted and no other home for the fence is configured.
    #[error(
        "namespace {0} is being deleted and no --retire-fence-namespace is set to hold the fence"
    )]
    NamespaceTerminating(String),
    /// The fence exists but does not (yet) stand for this server.
    #[error(transparent)]
    Unconfirmed(#[from] Unconfirmed),
    /// The object cannot be fenced (it has no uid).
    #[error(transparent)]
    NotFenceable(#[from] NotFenceable),
}

impl Error {
    /// The `Retiring` condition reason and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Unavailable(_) => "APIUnavailable",
            Error::Refused(_) => "FenceRefused",
            Error::NamespaceTerminating(_) => "NamespaceTerminating",
            Error::Unconfirmed(u) => u.reason(),
            Error::NotFenceable(_) => "NotFenceable",
        }
    }

    fn from_kube(error: kube::Error) -> Self {
        match fence::classify(&error) {
            Failure::Unavailable => Error::Unavailable(error.to_string()),
            Failure::Refused => Error::Refused(error),
        }
    }
}

/// The wait before attempt `attempt + 1` (attempt counts from 1): 1 s, doubling, at most `max`.
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(16);
    Duration::from_secs(1u64 << exp).min(max)
}

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    metrics: Metrics,
    max_backoff: Duration,
    fence_namespace: Option<String>,
    /// Failed attempts per MCPServer uid, for the backoff; cleared when it is retired.
    attempts: Mutex<HashMap<String, u32>>,
}

/// The controller, ready to run.
pub fn controller(
    client: kube::Client,
    args: Args,
    registry: &mut Registry,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    let metrics = Metrics::register(registry);
    let reporter = Reporter {
        controller: REPORTER.to_string(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        metrics,
        max_backoff: Duration::from_secs(args.max_backoff_seconds),
        fence_namespace: args.fence_namespace,
        attempts: Mutex::default(),
    });
    let servers: Api<MCPServer> = Api::all(client);
    Ok(async move {
        Controller::new(servers, watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    warn!(error = %e, "retirement reconcile failed");
                }
            })
            .instrument(tracing::info_span!("retire_controller"))
            .await;
        anyhow::bail!("the MCPServer watch of the retirement controller ended")
    })
}

async fn reconcile(
    server: Arc<MCPServer>,
    ctx: Arc<Ctx>,
) -> Result<Action, finalizer::Error<Error>> {
    let ns = server.namespace().unwrap_or_default();
    let span = tracing::info_span!("retire", ns = %ns, name = %server.name_any(), uid = server.uid().unwrap_or_default());
    let api: Api<MCPServer> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = server.uid().unwrap_or_default();
    let done = finalizer(&api, FINALIZER, server, |event| async {
        match event {
            // Nothing to do while the server lives: the finalizer is all it needs.
            Finalized::Apply(_) => Ok(Action::await_change()),
            Finalized::Cleanup(server) => ctx.retire(&api, &server).await,
        }
    })
    .instrument(span)
    .await?;
    // The backoff starts over after any success.
    ctx.attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&uid);
    Ok(done)
}

fn error_policy(server: Arc<MCPServer>, error: &finalizer::Error<Error>, ctx: Arc<Ctx>) -> Action {
    let reason = match error {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.reason(),
        finalizer::Error::AddFinalizer(_) => "AddFinalizer",
        finalizer::Error::RemoveFinalizer(_) => "RemoveFinalizer",
        finalizer::Error::UnnamedObject | finalizer::Error::InvalidFinalizer => "Finalizer",
    };
    ctx.metrics.error(reason);
    let uid = server.uid().unwrap_or_default();
    let attempt = {
        let mut attempts = ctx.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = attempts.entry(uid).or_default();
        *n = n.saturating_add(1);
        *n
    };
    Action::requeue(backoff(attempt, ctx.max_backoff))
}

impl Ctx {
    /// Fences `server` and reports the outcome on it; `Ok` releases the finalizer.
    async fn retire(&self, servers: &Api<MCPServer>, server: &MCPServer) -> Result<Action, Error> {
        match self.fence(server).await {
            Ok(revocation) => {
                let name = revocation.metadata.name.clone().unwrap_or_default();
                let ns = revocation.metadata.namespace.clone().unwrap_or_default();
                let revoked = revocation.status.as_ref().map_or(0, |s| s.revoked_sessions);
                let note = format!(
                    "Fenced by Revocation {ns}/{name} (server_retired, cluster-wide): {revoked} session(s) of uid {} revoked; no new session may be issued for it",
                    server.uid().unwrap_or_default()
                );
                self.set_condition(servers, server, true, "Fenced", &note)
                    .await;
                self.publish(server, EventType::Normal, "Retired", &note)
                    .await;
                self.metrics.retired.inc();
                info!(revocation = %name, revoked, "fenced; releasing the finalizer");
                Ok(Action::await_change())
            }
            Err(error) => {
                let message = format!("deletion waits for the fence: {error}");
                warn!(reason = error.reason(), %error, "retirement blocked");
                self.set_condition(servers, server, false, error.reason(), &message)
                    .await;
                self.publish(server, EventType::Warning, "RetirementBlocked", &message)
                    .await;
                Err(error)
            }
        }
    }

    /// Creates the fence (or finds the one a previous attempt created), reads it back and
    /// confirms it stands for this uid.
    async fn fence(&self, server: &MCPServer) -> Result<Revocation, Error> {
        let desired = fence::desired_fence(server)?;
        let uid = server.uid().unwrap_or_default();
        let stored = match self.create_or_read(&desired).await {
            Err(Error::Refused(kube::Error::Api(status)))
                if fence::namespace_terminating(status.code, &status.message) =>
            {
                let ns = desired.metadata.namespace.clone().unwrap_or_default();
                // A fence created there before the teardown began still stands: reading is
                // allowed in a terminating namespace.
                match self.read(&desired).await {
                    Ok(found) => found,
                    Err(Error::Unavailable(_)) | Err(Error::Refused(_))
                        if self.fence_namespace.is_some() =>
                    {
                        let home = self.fence_namespace.clone().unwrap_or_default();
                        info!(namespace = %home, "the server's namespace is being deleted; the fence goes to the fence namespace");
                        self.create_or_read(&fence::rehomed(desired, &home)).await?
                    }
                    Err(_) => return Err(Error::NamespaceTerminating(ns)),
                }
            }
            other => other?,
        };
        fence::confirm(&stored, &uid)?;
        Ok(stored)
    }

    /// Creates `fence`, or finds it under its name, and reads it back.
    async fn create_or_read(&self, fence: &Revocation) -> Result<Revocation, Error> {
        let ns = fence.metadata.namespace.clone().unwrap_or_default();
        let name = fence.metadata.name.clone().unwrap_or_default();
        let api: Api<Revocation> = Api::namespaced(self.client.clone(), &ns);
        match with_timeout(api.create(&PostParams::default(), fence)).await? {
            Ok(_) => {
                self.metrics.fences_created.inc();
                info!(namespace = %ns, revocation = %name, "fence created");
            }
            // A previous attempt (or replica) created it: confirm that one.
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(Error::from_kube(e)),
        }
        self.read(fence).await
    }

    async fn read(&self, fence: &Revocation) -> Result<Revocation, Error> {
        let ns = fence.metadata.namespace.clone().unwrap_or_default();
        let name = fence.metadata.name.clone().unwrap_or_default();
        let api: Api<Revocation> = Api::namespaced(self.client.clone(), &ns);
        with_timeout(api.get(&name))
            .await?
            .map_err(Error::from_kube)
    }

    /// Applies the `Retiring` condition under this controller's field manager, when it
    /// changes. A failure is logged: the fence, not the condition, decides the deletion.
    async fn set_condition(
        &self,
        servers: &Api<MCPServer>,
        server: &MCPServer,
        status: bool,
        reason: &str,
        message: &str,
    ) {
        let Some(condition) = fence::retiring_condition(
            fence::current_retiring(server),
            status,
            reason,
            message,
            server.metadata.generation,
            Timestamp::now(),
        ) else {
            return;
        };
        let patch = serde_json::json!({
            "apiVersion": MCPServer::api_version(&()),
            "kind": MCPServer::kind(&()),
            "status": {"conditions": [condition]},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(e) = servers
            .patch_status(&server.name_any(), &params, &Patch::Apply(&patch))
            .await
        {
            warn!(error = %e, "cannot write the Retiring condition");
        }
    }

    async fn publish(&self, server: &MCPServer, type_: EventType, reason: &str, note: &str) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: "Retire".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &server.object_ref(&())).await {
            warn!(error = %e, reason, "cannot publish the Event");
        }
    }
}

async fn with_timeout<T>(call: impl std::future::Future<Output = T>) -> Result<T, Error> {
    tokio::time::timeout(ACCESS_API_TIMEOUT, call)
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "no answer within {}s",
                ACCESS_API_TIMEOUT.as_secs()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let max = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=7).map(|a| backoff(a, max).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(u32::MAX, max), max);
        assert_eq!(backoff(0, max), Duration::from_secs(1));
    }

    #[test]
    fn every_blocking_error_has_a_reason() {
        assert_eq!(Error::Unavailable("503".into()).reason(), "APIUnavailable");
        assert_eq!(Error::from(NotFenceable::NoUid).reason(), "NotFenceable");
        let forbidden = kube::core::Status::failure("no", "Forbidden").with_code(403);
        assert_eq!(
            Error::from_kube(kube::Error::Api(Box::new(forbidden))).reason(),
            "FenceRefused"
        );
        let unavailable = kube::core::Status::failure("down", "ServiceUnavailable").with_code(503);
        assert_eq!(
            Error::from_kube(kube::Error::Api(Box::new(unavailable))).reason(),
            "APIUnavailable"
        );
    }

    #[test]
    fn the_flag_has_a_default_and_a_range() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            retire: Args,
        }
        assert_eq!(
            Cli::try_parse_from(["x"])
                .unwrap()
                .retire
                .max_backoff_seconds,
            30
        );
        assert!(Cli::try_parse_from(["x", "--retire-max-backoff-seconds=0"]).is_err());
    }
}
