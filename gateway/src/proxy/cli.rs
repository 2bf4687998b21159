//! Flags (each with an environment fallback), the wiring and the lifecycle of
//! `mcp-access-gateway`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;

use super::http::{parse_public_url, Gateway};
use super::metrics::ProxyMetrics;
use super::serve::{serve, Limits};
use super::session::Bindings;
use super::upstream::{parse_upstream, Upstream};
use crate::authz::cli::SyncArgs;
use crate::config::parse_positive_duration;
use crate::credential::{JwksSource, Verifier};
use crate::{CacheMetrics, SessionCache};

pub use process::LogFormat;

/// Enforcing MCP reverse proxy: every request needs a session token whose session the live
/// cache of this server's AccessSessions holds usable; streams end when it stops being usable.
#[derive(Debug, Parser)]
#[command(name = "mcp-access-gateway", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub sync: SyncArgs,
    /// Address of the proxy (the pod's one exposed port).
    #[arg(
        long,
        env = "MCP_ACCESS_GATEWAY_LISTEN",
        default_value = "0.0.0.0:8086"
    )]
    pub listen: SocketAddr,
    /// The MCP server, `http://127.0.0.1:PORT[/base]` (plain HTTP on loopback; https is refused).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_UPSTREAM", value_parser = parse_upstream)]
    pub upstream: http::Uri,
    /// The resource URI this gateway advertises (RFC 9728 `resource`); tokens must name it in
    /// `aud`.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: String,
    /// `authorization_servers` of the RFC 9728 document (repeatable); default: the token issuer.
    #[arg(long = "authorization-server", env = "MCP_ACCESS_GATEWAY_AUTHORIZATION_SERVERS", value_delimiter = ',', value_parser = parse_public_url)]
    pub authorization_servers: Vec<String>,
    /// Largest request body; larger is 413.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Open client connections at most; more wait to be accepted.
    #[arg(
        long,
        env = "MCP_ACCESS_GATEWAY_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Time a client has to send a request head (Go duration).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub header_timeout: Duration,
    /// A connection with no request in flight this long is closed; also bounds how long a
    /// request body may take to arrive.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_IDLE_TIMEOUT", default_value = "300s", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,
    /// Time the upstream has to send a response head (504 after it).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_UPSTREAM_TIMEOUT", default_value = "60s", value_parser = parse_positive_duration)]
    pub upstream_timeout: Duration,
    /// Time to connect to the upstream (502 after it).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_UPSTREAM_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration)]
    pub upstream_connect_timeout: Duration,
    /// Serve `/readyz`, `/metrics` and `/config/status` here instead of on `--listen`.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Threads serving requests: 1 (the default) runs everything on one thread, which is
    /// fastest for a proxy in front of one server (no wake-up crosses threads); 0 one per core.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,
}

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-gateway";

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    process::init_tracing(cli.log_format);
    process::block_on_threads(cli.worker_threads, run(cli))
}

/// Starts the cache and the key source and serves until a signal (or until the sync task
/// dies, which ends the process with an error so the orchestrator restarts it).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    anyhow::ensure!(cli.max_body_bytes > 0, "--max-body-bytes must be positive");
    anyhow::ensure!(
        cli.max_connections > 0,
        "--max-connections must be positive"
    );
    let mut registry = Registry::default();
    let cache_metrics = CacheMetrics::register(&mut registry);
    let metrics = ProxyMetrics::register(&mut registry);
    let config = cli.sync.cache_config();
    let keys = Arc::new(
        JwksSource::new(&config).context("invalid --sync-url, --ca-file or --token-file")?,
    );
    let (cache, sync) = SessionCache::start_with_metrics(config, cache_metrics)
        .context("invalid --sync-url, --ca-file, --token-file or stale window")?;
    let key_task = tokio::spawn(keys.clone().run());
    let gateway = Arc::new(Gateway {
        cache,
        verifier: Verifier::new(keys, cli.public_url.clone()),
        upstream: Upstream::new(
            cli.upstream.clone(),
            cli.upstream_connect_timeout,
            cli.upstream_timeout,
        ),
        bindings: Bindings::new(65_536, Duration::from_secs(24 * 3600)),
        legacy_streams: Default::default(),
        metrics,
        registry,
        public_url: cli.public_url.clone(),
        authorization_servers: cli.authorization_servers.clone(),
        max_body_bytes: cli.max_body_bytes,
        body_timeout: cli.idle_timeout,
        admin_elsewhere: cli.admin_listen.is_some(),
    });
    let limits = Limits {
        max_connections: cli.max_connections,
        header_timeout: cli.header_timeout,
        idle_timeout: cli.idle_timeout,
        drain: Duration::from_secs(10),
    };
    let listener = process::bind_announced(BINARY, "proxy", cli.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", cli.listen))?;
    let bound = listener
        .local_addr()
        .context("the listener has no address")?;
    let admin = match cli.admin_listen {
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
        upstream = %cli.upstream,
        public_url = %cli.public_url,
        sync_url = %cli.sync.sync_url,
        stale_window = ?cli.sync.stale_window,
        "mcp-access-gateway serving"
    );
    tokio::select! {
        ended = sync => anyhow::bail!("the session sync task ended: {ended:?}"),
        ended = key_task => anyhow::bail!("the session token key task ended: {ended:?}"),
        _ = process::shutdown_signal() => {}
    }
    let _ = stopping.send(true);
    let _ = main_server.await;
    if let Some(admin) = admin_server {
        let _ = admin.await;
    }
    Ok(())
}
