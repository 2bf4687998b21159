//! TEMP STUB
use super::desired::EgressAllow;
use apis::runtime::{EgressBinding, ResolvedEgress};
use std::time::Duration;
pub trait Resolve: Send + Sync {}
#[derive(Debug, Clone, Default)]
pub struct EgressProof {
    pub allows: Vec<EgressAllow>,
    pub resolved: Vec<ResolvedEgress>,
    pub failures: Vec<BindingFailure>,
}
#[derive(Debug, Clone)]
pub struct BindingFailure {
    pub binding: String,
    pub error: String,
}
pub async fn prove(
    _b: &[EgressBinding],
    _r: &dyn Resolve,
    _d: Duration,
    _now: k8s_openapi::jiff::Timestamp,
) -> EgressProof {
    EgressProof::default()
}
#[derive(Debug, Clone, clap::Args)]
#[group(id = "egress")]
pub struct EgressArgs {
    #[arg(long, default_value_t = 2)]
    pub egress_dns_timeout_secs: u64,
}
struct R;
impl Resolve for R {}
impl EgressArgs {
    pub fn resolver(&self) -> anyhow::Result<Box<dyn Resolve>> {
        Ok(Box::new(R))
    }
    pub fn dns_timeout(&self) -> Duration {
        Duration::from_secs(2)
    }
    pub fn refresh_interval(&self) -> Duration {
        Duration::from_secs(300)
    }
}
