//! The wiring and the lifecycle of `mcp-access-authz`: flags (`cli.rs`) are validated into a
//! [`Config`] (`config.rs`), then the cache, the key source and both listeners are built from
//! it and served until a signal.

use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;

use super::cli::Cli;
use super::config::{Check, Config};
use super::http::{admin_router, check_router, AuthzMetrics, AuthzState, CheckMode};
use crate::credential::{JwksSource, Verifier};
use crate::{CacheMetrics, SessionCache};

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-authz";

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    process::main::<Cli, _>(run)
}

/// Starts the cache (and, in token mode, the key source) and serves both listeners until a
/// signal, or until a background task or listener dies, which ends the process with an error
/// so the orchestrator restarts it.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let cache_metrics = CacheMetrics::register(&mut registry);
    let authz_metrics = AuthzMetrics::register(&mut registry);
    let (sync_url, stale_window) = (config.cache.sync_url.clone(), config.cache.stale_window);
    let (mode, key_task) = match config.check {
        Check::Token { public_url } => {
            let keys = Arc::new(
                JwksSource::new(&config.cache)
                    .context("invalid --sync-url, --ca-file or --token-file")?,
            );
            let task = tokio::spawn(keys.clone().run());
            let verifier = Verifier::new(keys, public_url.clone());
            (
                CheckMode::Token {
                    verifier,
                    public_url,
                },
                Some(task),
            )
        }
        Check::TrustedHeader { header } => {
            tracing::warn!(
                session_header = %header,
                "--trust-session-header is on: a request is allowed by NAMING a session in \
                 this header, with no credential. Safe only if the proxy's own authentication \
                 sets it and removes any value a client sent; otherwise anyone who can reach \
                 the proxy can use any session of this server"
            );
            (CheckMode::TrustedHeader { header }, None)
        }
    };
    let (cache, sync) = SessionCache::start_with_metrics(config.cache, cache_metrics)
        .context("invalid session sync configuration")?;
    let listener = process::bind_announced(BINARY, "check", config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", config.listen))?;
    let admin_listener = process::bind_announced(BINARY, "admin", config.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--admin-listen)", config.admin_listen))?;
    tracing::info!(
        listen = ?listener.local_addr().ok(),
        admin_listen = ?admin_listener.local_addr().ok(),
        sync_url = %sync_url,
        stale_window = ?stale_window,
        mode = match &mode {
            CheckMode::Token { .. } => "session-token",
            CheckMode::TrustedHeader { .. } => "trusted-session-header",
        },
        public_url = match &mode {
            CheckMode::Token { public_url, .. } => public_url.as_str(),
            CheckMode::TrustedHeader { .. } => "",
        },
        "mcp-access-authz serving"
    );
    // Long-polls end (503) when shutdown starts, so draining is not held up by them.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let state = AuthzState {
        cache,
        mode: Arc::new(mode),
        registry: Arc::new(registry),
        metrics: authz_metrics,
        shutdown: stop,
    };
    let mut stopped = stopping.subscribe();
    let server =
        axum::serve(listener, check_router(state.clone())).with_graceful_shutdown(async move {
            process::shutdown_signal().await;
            let _ = stopping.send(true);
        });
    let admin =
        axum::serve(admin_listener, admin_router(state)).with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|stopping| *stopping).await;
        });
    let keys = async move {
        match key_task {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        ended = sync => anyhow::bail!("the session sync task ended: {ended:?}"),
        ended = keys => anyhow::bail!("the session token key task ended: {ended:?}"),
        served = async { tokio::try_join!(server, admin) } => {
            served.context("an HTTP listener failed").map(|_| ())
        }
    }
}
