//! Flags and wiring of `mcp-access-stdio-bridge`. Three modes:
//! - `--listen ADDR -- COMMAND ARGS...`: serve the stdio MCP server COMMAND as Streamable HTTP;
//! - `--listen ADDR --remote URL`: the egress proxy of a `remote` MCPServer ([`super::remote`]);
//! - `--install PATH`: copy this executable to PATH (mode 0755) and exit: the init container
//!   of a `transport: stdio` MCPServer delivers the bridge into an emptyDir that the MCP
//!   container mounts, as Tekton delivers its entrypoint (the gateway image has no shell, no
//!   `cp`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;

use super::remote::RemoteConfig;
use super::BridgeConfig;

/// `mcp-access-stdio-bridge`: an MCP server on stdio, served as Streamable HTTP.
#[derive(Debug, clap::Parser)]
#[command(name = "mcp-access-stdio-bridge", version)]
pub struct Cli {
    /// Copy this executable to PATH and exit.
    #[arg(long, env = "MCP_ACCESS_BRIDGE_INSTALL", value_name = "PATH", conflicts_with_all = ["listen", "command", "remote"])]
    pub install: Option<PathBuf>,
    /// Where to serve Streamable HTTP (loopback: the gateway in the same Pod is the client).
    #[arg(
        long,
        env = "MCP_ACCESS_BRIDGE_LISTEN",
        required_unless_present = "install"
    )]
    pub listen: Option<SocketAddr>,
    /// Proxy every request to this remote MCP endpoint instead of running a command.
    #[arg(long, env = "MCP_ACCESS_BRIDGE_REMOTE", value_parser = super::remote::parse_remote, conflicts_with = "command")]
    pub remote: Option<reqwest::Url>,
    /// Time to connect to `--remote`.
    #[arg(
        long,
        env = "MCP_ACCESS_BRIDGE_REMOTE_CONNECT_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub remote_connect_timeout_seconds: u64,
    /// Live sessions (one child process each) at most.
    #[arg(long, env = "MCP_ACCESS_BRIDGE_MAX_SESSIONS", default_value_t = 64)]
    pub max_sessions: usize,
    /// Largest request body, in bytes.
    #[arg(long, env = "MCP_ACCESS_BRIDGE_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_LOG_FORMAT", value_enum, default_value_t = process::LogFormat::Text)]
    pub log_format: process::LogFormat,
    /// The MCP server's command and arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What the flags ask for.
#[derive(Debug)]
pub enum Mode {
    Install(PathBuf),
    Serve(SocketAddr, BridgeConfig),
    Remote(SocketAddr, RemoteConfig),
}

impl process::Flags for Cli {
    type Config = Mode;
    type Error = anyhow::Error;

    fn log_format(&self) -> process::LogFormat {
        self.log_format
    }

    fn worker_threads(&self) -> usize {
        // A per-pod helper, as the gateway: one thread.
        1
    }

    fn config(self) -> anyhow::Result<Mode> {
        if let Some(path) = self.install {
            return Ok(Mode::Install(path));
        }
        let listen = self.listen.context("--listen is required")?;
        if let Some(url) = self.remote {
            return Ok(Mode::Remote(
                listen,
                RemoteConfig {
                    url,
                    connect_timeout: std::time::Duration::from_secs(
                        self.remote_connect_timeout_seconds,
                    ),
                },
            ));
        }
        anyhow::ensure!(
            !self.command.is_empty(),
            "the MCP server's command goes after `--`"
        );
        anyhow::ensure!(self.max_sessions > 0, "--max-sessions must not be 0");
        let mut config = BridgeConfig::new(self.command);
        config.max_sessions = self.max_sessions;
        config.max_body_bytes = self.max_body_bytes;
        Ok(Mode::Serve(listen, config))
    }
}

/// The binary's `main`.
pub fn main() -> anyhow::Result<()> {
    process::main::<Cli, _>(run)
}

async fn run(mode: Mode) -> anyhow::Result<()> {
    match mode {
        Mode::Install(path) => install(&path),
        Mode::Serve(listen, config) => {
            let listener =
                process::bind_announced("mcp-access-stdio-bridge", "streamable-http", listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
            super::serve(listener, config, process::shutdown_signal()).await?;
            Ok(())
        }
        Mode::Remote(listen, config) => {
            let listener =
                process::bind_announced("mcp-access-stdio-bridge", "remote proxy", listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
            super::remote::serve_remote(listener, config, process::shutdown_signal()).await?;
            Ok(())
        }
    }
}

fn install(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let me = std::env::current_exe().context("cannot find this executable")?;
    std::fs::copy(&me, path)
        .with_context(|| format!("cannot copy {} to {}", me.display(), path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))?;
    eprintln!("mcp-access-stdio-bridge installed at {}", path.display());
    Ok(())
}
