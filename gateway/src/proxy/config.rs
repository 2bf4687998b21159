//! The validated configuration of `mcp-access-gateway`: every rule on its flags, checked
//! without I/O (the sync CA and token files are read while wiring).

use std::net::SocketAddr;
use std::time::Duration;

use super::cli::{Cli, LogFormat};
use super::serve::Limits;
use crate::config::CacheConfig;

/// A flag value the gateway refuses to start with. The text names the flag.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--max-body-bytes must be positive")]
    MaxBodyBytes,
    #[error("--max-connections must be positive")]
    MaxConnections,
}

/// What the wiring builds the gateway from.
#[derive(Debug)]
pub struct Config {
    /// The session cache: the sync URL, its CA, the projected token and the stale window.
    pub cache: CacheConfig,
    /// Address of the proxy.
    pub listen: SocketAddr,
    /// Address of the admin endpoints when they are served apart from the proxy.
    pub admin_listen: Option<SocketAddr>,
    /// The MCP server (plain HTTP on loopback).
    pub upstream: http::Uri,
    /// The resource URI tokens must name in `aud`.
    pub public_url: String,
    /// `authorization_servers` of the RFC 9728 document (empty: the token issuer).
    pub authorization_servers: Vec<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Connection limits and timeouts of both listeners; the idle timeout also bounds how
    /// long a request body may take.
    pub limits: Limits,
    /// Time the upstream has to send a response head.
    pub upstream_timeout: Duration,
    /// Time to connect to the upstream.
    pub upstream_connect_timeout: Duration,
    /// `--audit-log`: where tools/call decisions are written, one JSON line each.
    pub audit_log: Option<super::audit::AuditTarget>,
}

impl process::Flags for Cli {
    type Config = Config;
    type Error = ConfigError;

    fn log_format(&self) -> LogFormat {
        self.log_format
    }

    /// 1 unless `--worker-threads` says otherwise: see the flag.
    fn worker_threads(&self) -> usize {
        self.worker_threads
    }

    fn config(self) -> Result<Config, ConfigError> {
        Config::try_from(self)
    }
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        if cli.max_body_bytes == 0 {
            return Err(ConfigError::MaxBodyBytes);
        }
        if cli.max_connections == 0 {
            return Err(ConfigError::MaxConnections);
        }
        Ok(Self {
            cache: cli.sync.cache_config(),
            listen: cli.listen,
            admin_listen: cli.admin_listen,
            upstream: cli.upstream,
            public_url: cli.public_url,
            authorization_servers: cli.authorization_servers,
            max_body_bytes: cli.max_body_bytes,
            limits: Limits {
                max_connections: cli.max_connections,
                header_timeout: cli.header_timeout,
                idle_timeout: cli.idle_timeout,
                drain: Duration::from_secs(10),
            },
            upstream_timeout: cli.upstream_timeout,
            upstream_connect_timeout: cli.upstream_connect_timeout,
            audit_log: cli.audit_log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The flags of a command line with the required ones.
    fn cli(args: &[&str]) -> Cli {
        let mut argv = vec![
            "mcp-access-gateway",
            "--sync-url",
            "https://127.0.0.1:8085",
            "--ca-file",
            "/ca.pem",
            "--token-file",
            "/token",
            "--upstream",
            "http://127.0.0.1:3000",
            "--public-url",
            "https://mcp.example.com",
        ];
        argv.extend(args);
        Cli::try_parse_from(argv).expect("flags parse")
    }

    #[test]
    fn one_worker_thread_by_default() {
        use process::Flags as _;
        assert_eq!(cli(&[]).worker_threads(), 1);
        assert_eq!(cli(&["--worker-threads", "0"]).worker_threads(), 0);
    }

    #[test]
    fn zero_limits_are_refused_naming_the_flag() {
        let err = Config::try_from(cli(&["--max-body-bytes", "0"])).unwrap_err();
        assert!(err.to_string().starts_with("--max-body-bytes"), "{err}");
        let err = Config::try_from(cli(&["--max-connections", "0"])).unwrap_err();
        assert!(err.to_string().starts_with("--max-connections"), "{err}");
        let ok = Config::try_from(cli(&["--listen", "127.0.0.1:0"])).expect("valid");
        assert_eq!(ok.listen.port(), 0);
        assert_eq!(ok.limits.max_connections, 1024);
    }
}
