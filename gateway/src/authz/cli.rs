//! Flags of `mcp-access-authz`, each with an environment fallback: what `config.rs` validates
//! and `wiring.rs` builds the sidecar from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

use crate::config::{parse_positive_duration, parse_stale_window, STALE_WINDOW_ENV};
use crate::proxy::http::parse_public_url;

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
    /// How long sessions are still answered once the cache knows it is behind the change
    /// log's head (a bookmark's head ahead of what it applied, or a 410 it is relisting
    /// after); then every check is denied with `cache_stale` until it caught up. At most the
    /// stale window.
    #[arg(long, env = "GATEWAY_MAX_LAG", default_value = "2s", value_parser = parse_positive_duration)]
    pub max_lag: Duration,
    /// `timeoutSeconds` of each watch (Go duration); the watch then resumes where it ended.
    #[arg(long, env = "GATEWAY_WATCH_TIMEOUT", default_value = "290s", value_parser = parse_positive_duration)]
    pub watch_timeout: Duration,
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

fn parse_header_name(raw: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(raw.as_bytes()).map_err(|e| format!("{raw:?}: {e}"))
}
