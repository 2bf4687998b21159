//! [`PolicyCache`]: the ToolPolicies of the gateway's MCPServer, kept by list+watch of the
//! sync listener (which serves each gateway only its own server's policies) and compiled into
//! one [`PolicyIndex`] that every `tools/call` is checked against.
//!
//! Each policy is taken whole or not at all. A version the gateway cannot take (invalid, as
//! from an apiserver that validates less, or one that would carry the server's policies past
//! [`MAX_POLICY_BYTES`]) is left out and the version of that policy already in force stays, so
//! an index is never built from part of a document. Before the first complete list there is
//! no index: calls are refused (`policy_not_ready`), never let through unchecked. A broken
//! watch keeps the last index (policies only narrow what sessions grant) while kube-rs's
//! watcher reconnects with backoff.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use apis::tool_policy::{policy_bytes, validate_tool_policy_spec, PolicyIndex, MAX_POLICY_BYTES};
use apis::ToolPolicy;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

use crate::config::CacheConfig;
use crate::pins::{Drift, Observed};

/// The policy cache's metrics.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    /// Policy versions left out because the server's policies would pass the size cap.
    pub oversize: Counter,
    /// Policy versions left out because they are invalid.
    pub invalid: Counter,
    /// Policies in force.
    pub in_force: Gauge,
    /// 1 once a complete list was taken.
    pub ready: Gauge,
}

impl PolicyMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "mcp_runtime_gateway_policy_oversize",
            "ToolPolicy versions left out because the server's policies would pass the 700 KiB cap (the version already in force stays)",
            m.oversize.clone(),
        );
        registry.register(
            "mcp_gateway_tool_policies_invalid",
            "ToolPolicy versions left out because they are invalid (the version already in force stays)",
            m.invalid.clone(),
        );
        registry.register(
            "mcp_gateway_tool_policies",
            "ToolPolicies in force at this gateway",
            m.in_force.clone(),
        );
        registry.register(
            "mcp_gateway_tool_policy_sync_ready",
            "1 once the gateway holds a complete list of its server's ToolPolicies",
            m.ready.clone(),
        );
        m
    }
}

/// Why a policy version was left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftOut {
    Invalid,
    Oversize,
}

/// The policies in force, by name, and what they take against the cap. Pure: the watch
/// loop feeds it, tests drive it directly.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    policies: BTreeMap<String, (ToolPolicy, usize)>,
    cap: usize,
}

impl Accepted {
    pub fn new(cap: usize) -> Self {
        Self {
            policies: BTreeMap::new(),
            cap,
        }
    }

    fn total_without(&self, name: &str) -> usize {
        self.policies
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, (_, bytes))| bytes)
            .sum()
    }

    /// Takes `policy` in place of its current version, or leaves it out and says why.
    pub fn apply(&mut self, policy: ToolPolicy) -> Result<(), LeftOut> {
        let name = policy.metadata.name.clone().unwrap_or_default();
        if !validate_tool_policy_spec(&policy.spec).is_empty() {
            return Err(LeftOut::Invalid);
        }
        let bytes = policy_bytes(&policy);
        if self.total_without(&name).saturating_add(bytes) > self.cap {
            return Err(LeftOut::Oversize);
        }
        self.policies.insert(name, (policy, bytes));
        Ok(())
    }

    pub fn remove(&mut self, name: &str) {
        self.policies.remove(name);
    }

    /// A complete list: each listed policy in its version here if it can be taken, else in
    /// the version already in force (if any); policies not listed are gone. Returns what
    /// was left out.
    pub fn replace(&mut self, listed: Vec<ToolPolicy>) -> Vec<(String, LeftOut)> {
        let previous = std::mem::take(&mut self.policies);
        let mut left_out = Vec::new();
        // Policies whose listed version is the one in force first, so a changed one is
        // measured against the rest as they stand.
        let (same, changed): (Vec<_>, Vec<_>) = listed.into_iter().partition(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            previous.get(name).is_some_and(|(old, _)| {
                old.metadata.resource_version == p.metadata.resource_version
            })
        });
        for policy in same.into_iter().chain(changed) {
            let name = policy.metadata.name.clone().unwrap_or_default();
            if let Err(why) = self.apply(policy) {
                if let Some((old, _)) = previous.get(&name) {
                    let _ = self.apply(old.clone());
                }
                left_out.push((name, why));
            }
        }
        left_out
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn index(&self) -> PolicyIndex {
        PolicyIndex::new(self.policies.values().map(|(p, _)| p))
    }
}

/// The compiled policies of the gateway's server, and the definitions seen of pinned tools.
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct PolicyCache {
    index: Arc<RwLock<Option<Arc<PolicyIndex>>>>,
    observed: Arc<Observed>,
}

impl PolicyCache {
    /// The index in force; `None` before the first complete list (refuse every call then).
    pub fn index(&self) -> Option<Arc<PolicyIndex>> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The definitions seen of pinned tools.
    pub fn observed(&self) -> Arc<Observed> {
        self.observed.clone()
    }

    fn publish(&self, accepted: &Accepted, metrics: &PolicyMetrics) {
        let index = Arc::new(accepted.index());
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Some(index);
        metrics.in_force.set(accepted.len() as i64);
        metrics.ready.set(1);
    }

    /// Starts watching the sync listener of `config` for the server's policies.
    pub fn start(
        config: &CacheConfig,
        metrics: PolicyMetrics,
    ) -> Result<(Self, JoinHandle<()>), crate::CacheError> {
        let client = crate::client::build(config)?;
        let (reports, drifts) = tokio::sync::mpsc::channel(64);
        let cache = Self {
            index: Default::default(),
            observed: Arc::new(Observed::reporting_to(reports)),
        };
        tokio::spawn(report_drift(client.clone(), drifts));
        let task = tokio::spawn(cache.clone().run(Api::all(client), metrics));
        Ok((cache, task))
    }

    async fn run(self, api: Api<ToolPolicy>, metrics: PolicyMetrics) {
        let mut accepted = Accepted::new(MAX_POLICY_BYTES);
        let mut listing: Vec<ToolPolicy> = Vec::new();
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "tool policy watch failed; the policies in force stay");
                    continue;
                }
            };
            let count = |name: &str, why: LeftOut| {
                match why {
                    LeftOut::Invalid => metrics.invalid.inc(),
                    LeftOut::Oversize => metrics.oversize.inc(),
                };
                tracing::warn!(
                    policy = %name,
                    reason = ?why,
                    "tool policy version left out; the version in force (if any) stays"
                );
            };
            match event {
                Event::Init => listing.clear(),
                Event::InitApply(policy) => listing.push(policy),
                Event::InitDone => {
                    for (name, why) in accepted.replace(std::mem::take(&mut listing)) {
                        count(&name, why);
                    }
                    self.publish(&accepted, &metrics);
                }
                Event::Apply(policy) => {
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    if let Err(why) = accepted.apply(policy) {
                        count(&name, why);
                        continue;
                    }
                    self.publish(&accepted, &metrics);
                }
                Event::Delete(policy) => {
                    accepted.remove(policy.metadata.name.as_deref().unwrap_or_default());
                    self.publish(&accepted, &metrics);
                }
            }
        }
    }
}

/// Sends each drift to the sync listener (`POST .../toolpolicies/NAME/drift`), which records it
/// as an Event on the MCPServer. A report that fails is logged: the refusal at this gateway
/// does not depend on it.
async fn report_drift(client: kube::Client, mut drifts: tokio::sync::mpsc::Receiver<Drift>) {
    while let Some(drift) = drifts.recv().await {
        let path = format!(
            "/apis/{}/namespaces/{}/toolpolicies/{}/drift",
            apis::API_VERSION,
            drift.namespace,
            drift.policy
        );
        let body = serde_json::json!({
            "tool": drift.tool,
            "pinned": drift.pinned,
            "observed": drift.observed,
        });
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes());
        let sent = match request {
            Ok(request) => client.request_text(request).await.map(|_| ()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot build a tool drift report");
                continue;
            }
        };
        match sent {
            Ok(()) => tracing::info!(
                policy = %drift.policy, tool = %drift.tool, observed = %drift.observed,
                "tool definition changed from its pin; reported"
            ),
            Err(e) => tracing::warn!(
                policy = %drift.policy, tool = %drift.tool, error = %e,
                "tool definition changed from its pin; the report failed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::{ServerName, SideEffect, ToolPolicySpec, ToolRule};

    fn policy(name: &str, rv: &str, rules: usize, tool_name_len: usize) -> ToolPolicy {
        let mut p = ToolPolicy {
            spec: ToolPolicySpec {
                server: ServerName {
                    name: "github".into(),
                },
                tools: (0..rules)
                    .map(|i| ToolRule {
                        name: format!("{i:0>width$}", width = tool_name_len),
                        side_effect: SideEffect::Destructive,
                        arguments: vec![],
                        calls_per_minute: None,
                        digest: None,
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    #[test]
    fn an_oversize_version_leaves_the_one_in_force() {
        let small = policy("a", "1", 2, 10);
        let cap = policy_bytes(&small) * 2;
        let mut accepted = Accepted::new(cap);
        accepted.apply(small.clone()).unwrap();
        let grown = policy("a", "2", 20, 10);
        assert_eq!(accepted.apply(grown), Err(LeftOut::Oversize));
        assert_eq!(accepted.policies["a"].0, small);
        // A second policy that fits is taken; one more that does not is left out.
        accepted.apply(policy("b", "3", 2, 10)).unwrap();
        assert_eq!(
            accepted.apply(policy("c", "4", 1, 10)),
            Err(LeftOut::Oversize)
        );
        assert_eq!(accepted.len(), 2);
    }

    #[test]
    fn an_invalid_version_leaves_the_one_in_force() {
        let mut accepted = Accepted::new(MAX_POLICY_BYTES);
        let good = policy("a", "1", 1, 5);
        accepted.apply(good.clone()).unwrap();
        let mut bad = policy("a", "2", 1, 5);
        bad.spec.tools[0].name = "has space".into();
        assert_eq!(accepted.apply(bad.clone()), Err(LeftOut::Invalid));
        assert_eq!(accepted.policies["a"].0, good);
        // A relist keeps it too, and drops what is no longer listed.
        accepted.apply(policy("b", "3", 1, 5)).unwrap();
        let left_out = accepted.replace(vec![bad]);
        assert_eq!(left_out, vec![("a".to_string(), LeftOut::Invalid)]);
        assert_eq!(accepted.len(), 1);
        assert_eq!(accepted.policies["a"].0, good);
    }

    #[test]
    fn a_relist_measures_changed_policies_against_the_rest() {
        let a = policy("a", "1", 2, 10);
        let cap = policy_bytes(&a) * 2 + 8;
        let mut accepted = Accepted::new(cap);
        accepted.apply(a.clone()).unwrap();
        // "0" sorts first; its new version does not fit beside "a" as it stands.
        let newcomer = policy("0", "2", 3, 10);
        let left_out = accepted.replace(vec![newcomer, a.clone()]);
        assert_eq!(left_out, vec![("0".to_string(), LeftOut::Oversize)]);
        assert_eq!(accepted.policies["a"].0, a);
        assert!(PolicyCache::default().index().is_none());
    }
}
