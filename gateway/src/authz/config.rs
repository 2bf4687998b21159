//! The validated configuration of `mcp-access-authz`: every rule on its flags, checked
//! without I/O (the sync CA and token files are read while wiring).

use std::net::SocketAddr;

use super::cli::{Cli, LogFormat, SyncArgs};
use crate::config::CacheConfig;

/// The session header of --trust-session-header when none is named.
pub const DEFAULT_SESSION_HEADER: &str = "x-mcp-session";

/// A flag combination the sidecar refuses to start with. The text names the flags.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A header name given without the mode would look configured and be ignored.
    #[error("--session-header is only read with --trust-session-header")]
    SessionHeaderWithoutTrust,
    #[error(
        "--listen and --admin-listen must differ: every path of the check listener is a check"
    )]
    SameListeners,
    #[error("exactly one of --public-url and --trust-session-header is required")]
    NoCheckMode,
}

/// How a check names its session.
#[derive(Debug, Clone)]
pub enum Check {
    /// A session token for the resource `public_url`.
    Token { public_url: String },
    /// A request header set by the deployment's own authentication layer.
    TrustedHeader { header: http::HeaderName },
}

/// What the wiring builds the sidecar from.
#[derive(Debug)]
pub struct Config {
    /// The session cache: the sync URL, its CA, the projected token and the stale window.
    pub cache: CacheConfig,
    /// Address of the check.
    pub listen: SocketAddr,
    /// Address of `/readyz`, `/metrics`, the long-poll and the RFC 9728 document.
    pub admin_listen: SocketAddr,
    pub check: Check,
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
        config.max_lag = self.max_lag;
        config.watch_timeout = self.watch_timeout;
        config
    }
}

impl process::Flags for Cli {
    type Config = Config;
    type Error = ConfigError;

    fn log_format(&self) -> LogFormat {
        self.log_format
    }

    fn config(self) -> Result<Config, ConfigError> {
        Config::try_from(self)
    }
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let serving = cli.serving;
        if serving.session_header.is_some() && !serving.trust_session_header {
            return Err(ConfigError::SessionHeaderWithoutTrust);
        }
        // Port 0 asks for any free port: two of them never collide.
        if serving.listen == serving.admin_listen && serving.listen.port() != 0 {
            return Err(ConfigError::SameListeners);
        }
        let check = match (serving.public_url, serving.trust_session_header) {
            (Some(public_url), false) => Check::Token { public_url },
            (None, true) => Check::TrustedHeader {
                header: serving
                    .session_header
                    .unwrap_or_else(|| http::HeaderName::from_static(DEFAULT_SESSION_HEADER)),
            },
            // clap refuses both together and requires one of them.
            _ => return Err(ConfigError::NoCheckMode),
        };
        Ok(Self {
            cache: cli.sync.cache_config(),
            listen: serving.listen,
            admin_listen: serving.admin_listen,
            check,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec![
            "mcp-access-authz",
            "--sync-url",
            "https://127.0.0.1:8085",
            "--ca-file",
            "/ca.pem",
            "--token-file",
            "/token",
        ];
        argv.extend(args);
        Config::try_from(Cli::try_parse_from(argv).expect("flags parse"))
    }

    #[test]
    fn the_check_mode_and_its_header() {
        let token = config(&["--public-url", "https://mcp.example.com"]).expect("valid");
        assert!(
            matches!(token.check, Check::Token { public_url } if public_url == "https://mcp.example.com")
        );
        let header = config(&["--trust-session-header"]).expect("valid");
        assert!(
            matches!(header.check, Check::TrustedHeader { header } if header == DEFAULT_SESSION_HEADER)
        );
        let err = config(&[
            "--public-url",
            "https://m.example",
            "--session-header",
            "x-s",
        ]);
        assert!(matches!(err, Err(ConfigError::SessionHeaderWithoutTrust)));
    }

    #[test]
    fn listeners_must_differ_unless_both_ask_for_any_port() {
        let same = ["--trust-session-header", "--listen", "127.0.0.1:9000"];
        let err = config(&[&same[..], &["--admin-listen", "127.0.0.1:9000"]].concat());
        assert!(matches!(err, Err(ConfigError::SameListeners)));
        let any = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
        assert!(config(&[&["--trust-session-header"][..], &any[..]].concat()).is_ok());
    }
}
