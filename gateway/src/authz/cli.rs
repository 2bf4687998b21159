//! Flags (each with an environment fallback), the wiring and the lifecycle of the sidecar.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser};
use prometheus_client::registry::Registry;

use super::http::{router, AuthzMetrics, AuthzState};
use crate::config::{parse_stale_window, CacheConfig, STALE_WINDOW_ENV};
use crate::{CacheMetrics, SessionCache};

/// Forward-auth sidecar: answers a proxy's auth check from a live cache of this MCP server's
/// AccessSessions.
#[derive(Debug, Parser)]
#[command(name = "mcp-access-authz", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub sync: SyncArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_AUTHZ_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub use process::LogFormat;

/// Where the session feed is and how to authenticate to it.
#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The apiserver's gateway sync listener, `https://host:port` (plain HTTP is refused).
    #[arg(long, env = "GATEWAY_SYNC_URL")]
    pub sync_url: String,
    /// PEM CA bundle that signed the sync listener's certificate.
    #[arg(long, env = "GATEWAY_SYNC_CA")]
    pub ca_file: PathBuf,
    /// The Pod-bound projected token (audience `mcp-runtime-gateway`); re-read on every
    /// request, so a rotation on disk needs no restart. Never logged.
    #[arg(long, env = "GATEWAY_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// How long last-known-good sessions are served without proof of being in sync, then
    /// every check is denied with `sync_stale`: a Go duration (`30s`, `2m`) or seconds; at
    /// most (and by default) 10m.
    #[arg(long, env = STALE_WINDOW_ENV, default_value = "10m", value_parser = parse_stale_window)]
    pub stale_window: Duration,
    /// `timeoutSeconds` of each watch (Go duration); the watch then resumes where it ended.
    #[arg(long, env = "GATEWAY_WATCH_TIMEOUT", default_value = "290s", value_parser = parse_positive)]
    pub watch_timeout: Duration,
}

/// The sidecar's own listener.
#[derive(Debug, Args)]
pub struct ServingArgs {
    /// Address of the check, `/readyz`, `/metrics` and `/v1/` endpoints (plain HTTP: keep it
    /// on loopback inside the Pod).
    #[arg(
        long,
        env = "MCP_ACCESS_AUTHZ_LISTEN",
        default_value = "127.0.0.1:8086"
    )]
    pub listen: SocketAddr,
    /// Request header naming the session as `<namespace>/<name>`.
    #[arg(long, env = "MCP_ACCESS_AUTHZ_SESSION_HEADER", default_value = "X-MCP-Session", value_parser = parse_header_name)]
    pub session_header: http::HeaderName,
}

fn parse_positive(raw: &str) -> Result<Duration, String> {
    let d = apis::duration::parse_go_duration(raw)?.unsigned_abs();
    if d.is_zero() {
        return Err("must be positive".into());
    }
    Ok(d)
}

fn parse_header_name(raw: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(raw.as_bytes()).map_err(|e| format!("{raw:?}: {e}"))
}

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    process::init_tracing(cli.log_format);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(cli))
}

/// Starts the cache and serves until a signal (or until the sync task dies, which ends the
/// process with an error so the orchestrator restarts it).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let cache_metrics = CacheMetrics::register(&mut registry);
    let authz_metrics = AuthzMetrics::register(&mut registry);
    let mut config = CacheConfig::new(
        cli.sync.sync_url.clone(),
        cli.sync.ca_file.clone(),
        cli.sync.token_file.clone(),
    );
    config.stale_window = cli.sync.stale_window;
    config.watch_timeout = cli.sync.watch_timeout;
    let (cache, sync) = SessionCache::start_with_metrics(config, cache_metrics)
        .context("invalid session sync configuration")?;
    let listener = tokio::net::TcpListener::bind(cli.serving.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cli.serving.listen))?;
    tracing::info!(
        listen = %cli.serving.listen,
        sync_url = %cli.sync.sync_url,
        stale_window = ?cli.sync.stale_window,
        session_header = %cli.serving.session_header,
        "mcp-access-authz serving"
    );
    // Long-polls end (503) when shutdown starts, so draining is not held up by them.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let app = router(AuthzState {
        cache,
        session_header: cli.serving.session_header,
        registry: Arc::new(registry),
        metrics: authz_metrics,
        shutdown: stop,
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        let _ = stopping.send(true);
    });
    tokio::select! {
        ended = sync => anyhow::bail!("the session sync task ended: {ended:?}"),
        served = server => served.context("the HTTP listener failed"),
    }
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down");
}
