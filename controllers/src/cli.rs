//! Flags of `mcp-access-controllers`, each with an environment fallback: what `config.rs`
//! validates and `wiring.rs` builds the process from.

use std::path::PathBuf;

use clap::Parser;

use crate::{host, hostapi, leader, mcpserver, netpol, retire};

/// The MCP Access controllers.
#[derive(Debug, Parser)]
#[command(name = "mcp-access-controllers", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub mcpserver: mcpserver::Args,
    #[command(flatten)]
    pub retire: retire::Args,
    #[command(flatten)]
    pub netpol: netpol::settings::Args,
    #[command(flatten)]
    pub egress: netpol::egress::EgressArgs,
    #[command(flatten)]
    pub host: host::Args,
    #[command(flatten)]
    pub host_api: hostapi::Args,
    #[command(flatten)]
    pub leader: leader::Args,
    /// Port of `/metrics`, `/livez` and `/readyz` (all addresses).
    #[arg(
        long,
        env = "MCP_ACCESS_CONTROLLERS_METRICS_PORT",
        default_value_t = 8080
    )]
    pub metrics_port: u16,
    /// Kubeconfig for reaching kube-apiserver. Without it: the in-cluster service account.
    #[arg(long, env = "MCP_ACCESS_CONTROLLERS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub use process::LogFormat;

#[cfg(test)]
mod tests {
    use super::*;

    /// Flattened flag groups must not collide (clap checks this only when parsing).
    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
