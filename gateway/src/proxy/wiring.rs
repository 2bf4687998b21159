//! The wiring and the lifecycle of `mcp-access-gateway`: flags (`cli.rs`) are validated into
//! a [`Config`] (`config.rs`), then the cache, the key source and the listeners are built from
//! it and served until a signal.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;

use super::cli::Cli;
use super::config::Config;
use super::http::Gateway;
use super::metrics::ProxyMetrics;
use super::serve::serve;
use super::session::Bindings;
use super::upstream::Upstream;
use crate::credential::{JwksSource, Verifier};
use crate::policies::{PolicyCache, PolicyMetrics};
use crate::{CacheMetrics, SessionCache};

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-gateway";

/// Entry point of the binary: one worker thread unless `--worker-threads` says otherwise.
pub fn main() -> anyhow::Result<()> {
    process::main::<Cli, _>(run)
}

/// Starts the cache and the key source and serves until a signal (or until the sync task
/// dies, which ends the process with an error so the orchestrator restarts it).
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let cache_metrics = CacheMetrics::register(&mut registry);
    let metrics = ProxyMetrics::register(&mut registry);
    let policy_metrics = PolicyMetrics::register(&mut registry);
    let (sync_url, stale_window) = (config.cache.sync_url.clone(), config.cache.stale_window);
    let keys = Arc::new(
        JwksSource::new(&config.cache).context("invalid --sync-url, --ca-file or --token-file")?,
    );
    let (policies, policy_task) = PolicyCache::start(&config.cache, policy_metrics)
        .context("invalid --sync-url, --ca-file or --token-file")?;
    let (cache, sync) = SessionCache::start_with_metrics(config.cache, cache_metrics)
        .context("invalid --sync-url, --ca-file, --token-file or stale window")?;
    let key_task = tokio::spawn(keys.clone().run());
    let limits = config.limits;
    // An audit trail asked for and not writable stops startup: it is never silently missing.
    let audit = match &config.audit_log {
        Some(target) => Some(Arc::new(
            super::audit::Audit::open(target)
                .with_context(|| format!("cannot open --audit-log {target:?}"))?,
        )),
        None => None,
    };
    let gateway = Arc::new(Gateway {
        audit,
        cache,
        policies,
        rates: Default::default(),
        verifier: Verifier::new(keys, config.public_url.clone()),
        upstream: Upstream::new(
            config.upstream.clone(),
            config.upstream_connect_timeout,
            config.upstream_timeout,
        ),
        bindings: Bindings::new(65_536, Duration::from_secs(24 * 3600)),
        legacy_streams: Default::default(),
        metrics,
        registry,
        public_url: config.public_url.clone(),
        authorization_servers: config.authorization_servers,
        max_body_bytes: config.max_body_bytes,
        body_timeout: limits.idle_timeout,
        admin_elsewhere: config.admin_listen.is_some(),
    });
    let listener = process::bind_announced(BINARY, "proxy", config.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", config.listen))?;
    let bound = listener
        .local_addr()
        .context("the listener has no address")?;
    let admin = match config.admin_listen {
        Some(addr) => Some(
            process::bind_announced(BINARY, "admin", addr)
                .await
                .with_context(|| format!("cannot listen on --admin-listen {addr}"))?,
        ),
        None => None,
    };
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let main_server = {
        let gateway = gateway.clone();
        tokio::spawn(serve(listener, limits, stop.clone(), move |req, abort| {
            let gateway = gateway.clone();
            async move { gateway.handle(req, abort).await }
        }))
    };
    let admin_server = admin.map(|listener| {
        let gateway = gateway.clone();
        let addr = listener.local_addr().ok();
        tracing::info!(admin_listen = ?addr, "admin endpoints served apart");
        tokio::spawn(serve(listener, limits, stop.clone(), move |req, _abort| {
            let gateway = gateway.clone();
            async move {
                gateway
                    .admin(req.uri().path())
                    .unwrap_or_else(|| super::http::status_only(http::StatusCode::NOT_FOUND))
            }
        }))
    });
    tracing::info!(
        listen = %bound,
        upstream = %config.upstream,
        public_url = %config.public_url,
        sync_url = %sync_url,
        stale_window = ?stale_window,
        "mcp-access-gateway serving"
    );
    tokio::select! {
        ended = sync => anyhow::bail!("the session sync task ended: {ended:?}"),
        ended = key_task => anyhow::bail!("the session token key task ended: {ended:?}"),
        ended = policy_task => anyhow::bail!("the tool policy task ended: {ended:?}"),
        _ = process::shutdown_signal() => {}
    }
    let _ = stopping.send(true);
    let _ = main_server.await;
    if let Some(admin) = admin_server {
        let _ = admin.await;
    }
    Ok(())
}
