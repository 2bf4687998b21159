//! Flags of `mcp-access-gateway`, each with an environment fallback: what `config.rs`
//! validates and `wiring.rs` builds the process from.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

use super::http::parse_public_url;
use super::upstream::parse_upstream;
use crate::authz::cli::SyncArgs;
use crate::config::parse_positive_duration;

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
    /// Writes one JSON line per tools/call decision to this file (appended to; created if
    /// missing) or, with `-`, to standard output. Off when not given.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_AUDIT_LOG", value_parser = super::audit::AuditTarget::parse)]
    pub audit_log: Option<super::audit::AuditTarget>,
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
