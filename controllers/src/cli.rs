//! Flags (each with an environment fallback), the wiring of the process and its lifecycle.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use prometheus_client::registry::Registry;

use crate::{mcpserver, retire};

/// The MCP Access controllers.
#[derive(Debug, Parser)]
#[command(name = "mcp-access-controllers", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub mcpserver: mcpserver::Args,
    #[command(flatten)]
    pub retire: retire::Args,
    /// Kubeconfig for reaching kube-apiserver. Without it: the in-cluster service account.
    #[arg(long, env = "MCP_ACCESS_CONTROLLERS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(cli))
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?
        }
        None => kube::Config::incluster().context("not in a cluster and no --kubeconfig given")?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Runs every controller until a signal, or until one of them ends (an error naming it).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = kube_client(cli.kubeconfig.as_deref()).await?;
    let mut registry = Registry::default();
    let workloads = mcpserver::controller(client.clone(), cli.mcpserver, &mut registry)?;
    let retirement = retire::controller(client, cli.retire, &mut registry)?;
    supervise(workloads, retirement).await
}

async fn supervise(
    workloads: impl Future<Output = anyhow::Result<()>>,
    retirement: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        ended = workloads => ended.context("the MCPServer workload controller ended"),
        ended = retirement => ended.context("the retirement controller ended"),
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminate.recv() => Ok(()),
    }
}
