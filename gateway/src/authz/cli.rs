//! Flags (each with an environment fallback), the wiring and the lifecycle of the sidecar.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser};
use prometheus_client::registry::Registry;

use super::http::{admin_router, check_router, AuthzMetrics, AuthzState, CheckMode};
use crate::config::{parse_positive_duration, parse_stale_window, CacheConfig, STALE_WINDOW_ENV};
use crate::credential::{JwksSource, Verifier};
use crate::proxy::http::parse_public_url;
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
    #[arg(long, env = "GATEWAY_WATCH_TIMEOUT", default_value = "290s", value_parser = parse_positive_duration)]
    pub watch_timeout: Duration,
}

impl SyncArgs {
    /// The session cache's configuration these flags make.
    pub fn cache_config(&self) -> CacheConfig {
        let mut config = CacheConfig::new(
            self.sync_url.clone(),
            self.ca_file.clone(),
            self.token_file.clone(),
        );
        config.stale_window = self.stale_window;
        config.watch_timeout = self.watch_timeout;
        config
    }
}

/// The sidecar's own listeners and how a check names its session.
#[derive(Debug, Args)]
pub struct ServingArgs {
    /// Address of the check (plain HTTP: keep it on loopback inside the Pod, or admit only the
    /// proxy with a NetworkPolicy). Every path and method on it is a check.
    #[arg(
        long,
        env = "MCP_ACCESS_AUTHZ_LISTEN",
        default_value = "127.0.0.1:8086"
    )]
    pub listen: SocketAddr,
    /// Address of `/readyz`, `/metrics`, the `/v1/` long-poll and the RFC 9728 document: apart
    /// from the check, so a path-forwarding proxy can never reach them as a check.
    #[arg(
        long,
        env = "MCP_ACCESS_AUTHZ_ADMIN_LISTEN",
        default_value = "127.0.0.1:9091"
    )]
    pub admin_listen: SocketAddr,
    /// The resource URI of the MCP server behind the proxy: session tokens must name it in
    /// `aud` (the apiserver's default audience is `http://<server>.<namespace>.svc:8086`).
    /// Required, unless --trust-session-header.
    #[arg(long, env = "MCP_ACCESS_AUTHZ_PUBLIC_URL", value_parser = parse_public_url,
          required_unless_present = "trust_session_header")]
    pub public_url: Option<String>,
    /// Name the session by a request header instead of a session token. The header is a name,
    /// not a credential: only for deployments whose own authentication layer sets it and
    /// strips any value a client sent. Off by default; logged as a warning at startup.
    #[arg(
        long,
        env = "MCP_ACCESS_AUTHZ_TRUST_SESSION_HEADER",
        conflicts_with = "public_url"
    )]
    pub trust_session_header: bool,
    /// With --trust-session-header: the header naming the session as `<namespace>/<name>`
    /// (default `X-MCP-Session`).
    #[arg(long, env = "MCP_ACCESS_AUTHZ_SESSION_HEADER", value_parser = parse_header_name)]
    pub session_header: Option<http::HeaderName>,
}

/// The session header of --trust-session-header when none is named.
pub const DEFAULT_SESSION_HEADER: &str = "x-mcp-session";

fn parse_header_name(raw: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(raw.as_bytes()).map_err(|e| format!("{raw:?}: {e}"))
}

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-authz";

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    process::init_tracing(cli.log_format);
    process::block_on(run(cli))
}

/// Starts the cache (and, in token mode, the key source) and serves both listeners until a
/// signal, or until a background task or listener dies, which ends the process with an error
/// so the orchestrator restarts it.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // A header name given without the mode would look configured and be ignored.
    anyhow::ensure!(
        cli.serving.session_header.is_none() || cli.serving.trust_session_header,
        "--session-header is only read with --trust-session-header"
    );
    // Port 0 asks for any free port: two of them never collide.
    anyhow::ensure!(
        cli.serving.listen != cli.serving.admin_listen || cli.serving.listen.port() == 0,
        "--listen and --admin-listen must differ: every path of the check listener is a check"
    );
    let mut registry = Registry::default();
    let cache_metrics = CacheMetrics::register(&mut registry);
    let authz_metrics = AuthzMetrics::register(&mut registry);
    let config = cli.sync.cache_config();
    let (mode, key_task) = match (&cli.serving.public_url, cli.serving.trust_session_header) {
        (Some(public_url), false) => {
            let keys = Arc::new(
                JwksSource::new(&config)
                    .context("invalid --sync-url, --ca-file or --token-file")?,
            );
            let task = tokio::spawn(keys.clone().run());
            let verifier = Verifier::new(keys, public_url.clone());
            (
                CheckMode::Token {
                    verifier,
                    public_url: public_url.clone(),
                },
                Some(task),
            )
        }
        (None, true) => {
            let header = cli
                .serving
                .session_header
                .clone()
                .unwrap_or_else(|| http::HeaderName::from_static(DEFAULT_SESSION_HEADER));
            tracing::warn!(
                session_header = %header,
                "--trust-session-header is on: a request is allowed by NAMING a session in \
                 this header, with no credential. Safe only if the proxy's own authentication \
                 sets it and removes any value a client sent; otherwise anyone who can reach \
                 the proxy can use any session of this server"
            );
            (CheckMode::TrustedHeader { header }, None)
        }
        // clap refuses both together and requires one of them.
        _ => anyhow::bail!("exactly one of --public-url and --trust-session-header is required"),
    };
    let (cache, sync) = SessionCache::start_with_metrics(config, cache_metrics)
        .context("invalid session sync configuration")?;
    let listener = process::bind_announced(BINARY, "check", cli.serving.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", cli.serving.listen))?;
    let admin_listener = process::bind_announced(BINARY, "admin", cli.serving.admin_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--admin-listen)",
                cli.serving.admin_listen
            )
        })?;
    tracing::info!(
        listen = ?listener.local_addr().ok(),
        admin_listen = ?admin_listener.local_addr().ok(),
        sync_url = %cli.sync.sync_url,
        stale_window = ?cli.sync.stale_window,
        mode = match &mode {
            CheckMode::Token { .. } => "session-token",
            CheckMode::TrustedHeader { .. } => "trusted-session-header",
        },
        public_url = cli.serving.public_url.as_deref().unwrap_or(""),
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
