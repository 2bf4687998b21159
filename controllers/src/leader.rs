//! Leader election through a `coordination.k8s.io` Lease (kube-lease-manager): every replica
//! campaigns, only the holder runs the controllers. A replica that loses the Lease exits
//! (its Deployment restarts it as a standby) rather than racing the new leader; one killed
//! with SIGKILL stops renewing and a standby takes over once the Lease expires.

use std::future::Future;

use anyhow::Context;
use kube_lease_manager::LeaseManagerBuilder;

use crate::metrics::Health;

/// Flags of the election.
#[derive(Debug, clap::Args)]
#[group(id = "leader")]
pub struct Args {
    /// Name of the Lease.
    #[arg(
        long,
        env = "MCP_ACCESS_LEASE_NAME",
        default_value = "mcp-access-controllers"
    )]
    pub lease_name: String,
    /// Namespace of the Lease (the controllers' own).
    #[arg(long, env = "MCP_ACCESS_LEASE_NAMESPACE", default_value = "mcp-access")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease. Default: `$POD_NAME`, else host name and pid.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a held Lease stays valid without renewal: the takeover bound after a crash.
    #[arg(long, env = "MCP_ACCESS_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// How long before expiry the holder renews.
    #[arg(long, env = "MCP_ACCESS_LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub lease_grace_seconds: u64,
}

impl Args {
    /// The identity written into the Lease.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "unknown".into());
            format!("{host}-{}", std::process::id())
        })
    }
}

/// Campaigns for the Lease; once held, runs `work` until it ends, the Lease is lost
/// (an error: the process exits and restarts as a standby) or `shutdown` resolves (then
/// the Lease is released so a standby takes over at once).
pub async fn run_as_leader(
    client: kube::Client,
    args: &Args,
    health: Health,
    work: impl Future<Output = anyhow::Result<()>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.lease_grace_seconds < args.lease_duration_seconds,
        "--lease-grace-seconds must be below --lease-duration-seconds"
    );
    let identity = args.identity();
    let manager = LeaseManagerBuilder::new(client, &args.lease_name)
        .with_namespace(&args.lease_namespace)
        .with_identity(&identity)
        .with_duration(args.lease_duration_seconds)
        .with_grace(args.lease_grace_seconds)
        .build()
        .await
        .with_context(|| {
            format!(
                "cannot use Lease {}/{}",
                args.lease_namespace, args.lease_name
            )
        })?;
    let (mut leader, mut campaign) = manager.watch().await;
    health.set_ready(true);
    tracing::info!(%identity, lease = %args.lease_name, "campaigning for the leader Lease");
    tokio::pin!(work);
    tokio::pin!(shutdown);

    // Standby until the Lease is ours.
    while !*leader.borrow_and_update() {
        tokio::select! {
            changed = leader.changed() => changed.context("the lease manager stopped")?,
            ended = &mut campaign => anyhow::bail!("the lease manager ended: {ended:?}"),
            () = &mut shutdown => return release(leader, campaign).await,
        }
    }
    tracing::info!(%identity, "holding the leader Lease: running the controllers");
    health.leader.set(1);

    let outcome = loop {
        tokio::select! {
            ended = &mut work => break ended,
            changed = leader.changed() => {
                changed.context("the lease manager stopped")?;
                if !*leader.borrow_and_update() {
                    health.leader.set(0);
                    anyhow::bail!("lost the leader Lease");
                }
            }
            ended = &mut campaign => {
                health.leader.set(0);
                anyhow::bail!("the lease manager ended: {ended:?}");
            }
            () = &mut shutdown => break Ok(()),
        }
    };
    health.leader.set(0);
    health.set_ready(false);
    release(leader, campaign).await?;
    outcome
}

/// Closing the channel makes the manager release the Lease and end.
async fn release(
    leader: tokio::sync::watch::Receiver<bool>,
    campaign: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
) -> anyhow::Result<()> {
    drop(leader);
    match tokio::time::timeout(std::time::Duration::from_secs(5), campaign).await {
        Ok(Ok(Ok(_))) => Ok(()),
        Ok(Ok(Err(e))) => Err(anyhow::anyhow!("cannot release the Lease: {e}")),
        Ok(Err(e)) => Err(anyhow::anyhow!("the lease manager failed: {e}")),
        Err(_) => Err(anyhow::anyhow!("releasing the Lease timed out")),
    }
}
