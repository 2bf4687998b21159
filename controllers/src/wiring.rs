//! The wiring of `mcp-access-controllers` and its lifecycle: flags (`cli.rs`) are validated
//! into a [`Config`] (`config.rs`), then every controller is built from it and run.

use std::future::Future;

use anyhow::Context;
use prometheus_client::registry::Registry;

use crate::cli::Cli;
use crate::config::Config;
use crate::metrics::{Health, ReconcileMetrics};
use crate::{context, host, hostapi, leader, mcpserver, metrics, netpol, retire};

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    process::main::<Cli, _>(run)
}

/// Serves metrics and probes, campaigns for the leader Lease and, while holding it, runs
/// every controller until a signal, or until one of them ends (an error naming it).
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = process::kube_client(config.kubeconfig.as_deref()).await?;
    let mut registry = Registry::default();
    let health = Health::register(&mut registry);
    let reconcile = ReconcileMetrics::register(&mut registry);
    // Built now (flags checked before campaigning), polled only by the leader.
    let gateway_port = config.mcpserver.gateway_port;
    let image_policy = config.mcpserver.image_policy();
    let workloads = mcpserver::controller(
        client.clone(),
        config.mcpserver,
        config.isolation,
        reconcile.clone(),
    )?;
    let retirement = retire::controller(client.clone(), config.retire, &mut registry)?;
    let (policies, synced) = netpol::controller(
        client.clone(),
        config.netpol,
        config.egress,
        gateway_port,
        netpol::lease_reference(&config.leader.lease_namespace, &config.leader.lease_name),
        reconcile.clone(),
        &mut registry,
    )?;
    // The runtime tokens carry the claims the Host API of this process checks.
    let claims = host::TokenClaims {
        issuer: config.host_api.as_ref().map(|a| a.issuer.clone()),
        audience: config
            .host_api
            .as_ref()
            .map(|a| a.audience.iter().cloned().collect())
            .unwrap_or_default(),
        api_max_ttl: config.host_api.as_ref().map(|a| a.max_ttl),
    };
    let hosts = host::controller(
        client.clone(),
        config.host,
        host::Shared {
            netpol: config.netpol_settings,
            policy: image_policy,
            orphan_caps: config.orphan_caps,
            claims,
        },
        reconcile.clone(),
        &mut registry,
    )?;
    let contexts = context::controller(client.clone(), reconcile.clone());
    let host_api =
        hostapi::server(client.clone(), config.host_api, gateway_port, &mut registry).await?;
    let health = health.requiring(synced);
    let addr = config.metrics;
    let listener = process::bind_announced(crate::BINARY, "metrics", addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--metrics-port)"))?;
    let serving = metrics::serve(listener, registry, health.clone());
    let leading = leader::run_as_leader(
        client,
        &config.leader,
        health,
        supervise(workloads, retirement, policies, hosts, contexts),
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
    contexts: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    tokio::select! {
        ended = hosts => ended.context("the Host operator ended"),
        ended = workloads => ended.context("the MCPServer workload controller ended"),
        ended = retirement => ended.context("the retirement controller ended"),
        ended = policies => ended.context("the NetworkPolicy controller ended"),
        ended = contexts => ended.context("the Context status controller ended"),
    }
}
