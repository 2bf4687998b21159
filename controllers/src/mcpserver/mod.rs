//! Filled in by the mcpserver work of the controllers issue.

use prometheus_client::registry::Registry;

/// Flags of this controller.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// The controller, ready to run.
pub fn controller(
    _client: kube::Client,
    _args: Args,
    _registry: &mut Registry,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    Ok(std::future::pending())
}
