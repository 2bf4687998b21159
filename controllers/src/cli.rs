//! Flags (each with an environment fallback), the wiring of the process and its lifecycle.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;

use crate::metrics::Health;
use crate::metrics::ReconcileMetrics;
use crate::{host, hostapi, leader, mcpserver, metrics, netpol, retire};

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

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    process::init_tracing(cli.log_format);
    process::block_on(run(cli))
}

/// Serves metrics and probes, campaigns for the leader Lease and, while holding it, runs
/// every controller until a signal, or until one of them ends (an error naming it).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // The NetworkPolicy settings are checked before any I/O: one that would widen a policy
    // stops startup naming the value, whether or not the cluster is reachable.
    cli.netpol.settings(cli.mcpserver.gateway_port)?;
    cli.egress.resolver()?;
    let host_api = hostapi::check(&cli.host_api)?;
    let (netpol_settings, orphan_caps) = cli.netpol.settings(cli.mcpserver.gateway_port)?;
    let client = process::kube_client(cli.kubeconfig.as_deref()).await?;
    let mut registry = Registry::default();
    let health = Health::register(&mut registry);
    let reconcile = ReconcileMetrics::register(&mut registry);
    // Built now (flags checked before campaigning), polled only by the leader.
    let gateway_port = cli.mcpserver.gateway_port;
    let image_policy = cli.mcpserver.image_policy();
    let workloads = mcpserver::controller(client.clone(), cli.mcpserver, reconcile.clone())?;
    let retirement = retire::controller(client.clone(), cli.retire, &mut registry)?;
    let (policies, synced) = netpol::controller(
        client.clone(),
        cli.netpol,
        cli.egress,
        gateway_port,
        netpol::lease_reference(&cli.leader.lease_namespace, &cli.leader.lease_name),
        reconcile.clone(),
        &mut registry,
    )?;
    let hosts = host::controller(
        client.clone(),
        cli.host,
        netpol_settings,
        image_policy,
        orphan_caps,
        reconcile.clone(),
        &mut registry,
    )?;
    let host_api = hostapi::server(client.clone(), host_api, gateway_port, &mut registry).await?;
    let health = health.requiring(synced);
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], cli.metrics_port));
    let listener = process::bind_announced(crate::BINARY, "metrics", addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--metrics-port)"))?;
    let serving = metrics::serve(listener, registry, health.clone());
    let leading = leader::run_as_leader(
        client,
        &cli.leader,
        health,
        supervise(workloads, retirement, policies, hosts),
        process::shutdown_signal(),
    );
    let host_api = async move {
        match host_api {
            Some(serving) => serving.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        ended = serving => ended.context("the metrics listener ended"),
        ended = host_api => ended.context("the Host API listener ended"),
        ended = leading => ended,
    }
}

async fn supervise(
    workloads: impl Future<Output = anyhow::Result<()>>,
    retirement: impl Future<Output = anyhow::Result<()>>,
    policies: impl Future<Output = anyhow::Result<()>>,
    hosts: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    tokio::select! {
        ended = hosts => ended.context("the Host operator ended"),
        ended = workloads => ended.context("the MCPServer workload controller ended"),
        ended = retirement => ended.context("the retirement controller ended"),
        ended = policies => ended.context("the NetworkPolicy controller ended"),
    }
}

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
