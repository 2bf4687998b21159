//! NetworkPolicy layers (DESIGN §6): every MCP server isolated by default and opened only along
//! declared routes.
//!
//! - L0 `deny-all` (ingress and egress) in every runtime namespace;
//! - L1 infrastructure in every runtime namespace: DNS, the Kubernetes API for pods that opt in,
//!   the gateway → apiserver sync path;
//! - L2 per Context × server: ingress to the server port from the server's own pods and the
//!   Context's host pods, and the paired egress (with the cluster DNS) on the hosts' side;
//! - L3 external egress from `spec.egressBindings` ([`egress`] proves each binding safe);
//! - per-server `spec.network` ingress sources and in-cluster egress allow-lists.
//!
//! [`desired`] computes the whole set as a pure function of the inventory and [`sweep`] decides
//! what goes; this file is the I/O. The inventory is global (a Context grants servers of any
//! namespace), so one pass recomputes everything from the watch caches whenever any input
//! changes, applies only what differs, and deletes what [`sweep`] allows. The first pass runs
//! only once every cache holds a complete list (an empty cache would make every allow look
//! obsolete), and the controller is ready only after it.

pub mod desired;
pub mod egress;
pub mod settings;
pub mod sweep;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::runtime::{Context, MCPServer, MCPServerStatus, ResolvedEgress};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Notify;

use crate::children::{self, up_to_date, ReconcileError};
use crate::metrics::ReconcileMetrics;
use desired::{EgressAllow, Inventory, Policy};
use egress::{EgressProof, Resolve};
use settings::{NetpolSettings, RuntimeIsolation, SweepCaps};
use sweep::{LivePolicy, Owners};

/// The field manager of the policies and of the egress status of MCPServers.
pub const FIELD_MANAGER: &str = "mcp-access-controllers-netpol";
/// The condition this controller owns on MCPServers that declare egress bindings.
pub const EXTERNAL_EGRESS_READY: &str = "ExternalEgressReady";
// `NetworkIsolated`, on every MCPServer: whether the L0 deny-all of a runtime namespace
// isolates it (the workload controller gates on the same flags, never on this condition).
pub use crate::mcpserver::status::{NETWORK_ISOLATED, OUTSIDE_RUNTIME_NAMESPACE};
const CONTROLLER: &str = "netpol";
/// Changes arriving together are taken in one pass.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// A failed pass is retried after this long (sooner when an input changes).
const RETRY: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    policy_type: String,
}

/// The NetworkPolicy controller's own metrics (with the shared reconcile metrics).
#[derive(Clone, Default)]
pub struct Metrics {
    /// Desired policies by layer, as of the last pass.
    policies: Family<TypeLabel, Gauge>,
    /// Orphaned L0/L1 policies the last sweep kept because they were over a cap (0: none).
    orphans_withheld: Gauge,
    /// Sweeps that withheld orphaned L0/L1 policies.
    sweeps_withheld: Counter,
    /// Orphaned allows deleted (never held back by the caps).
    orphan_allows_deleted: Counter,
    /// Desired policies whose name is taken by a policy we do not manage (not overwritten).
    unmanaged_conflicts: Gauge,
    /// 1 once the first complete pass has applied the desired set and removed what it may.
    synced: Gauge,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let sub = registry.sub_registry_with_prefix("mcp_controllers_netpol");
        sub.register(
            "policies",
            "Desired NetworkPolicies by policy type",
            m.policies.clone(),
        );
        sub.register(
            "orphans_withheld",
            "Orphaned L0 deny-all and L1 NetworkPolicies the last sweep did not delete because they exceed a cap (deleting a deny widens access)",
            m.orphans_withheld.clone(),
        );
        sub.register(
            "sweeps_withheld",
            "Sweeps that found more orphaned L0/L1 NetworkPolicies than a cap allows and deleted none of them",
            m.sweeps_withheld.clone(),
        );
        sub.register(
            "orphan_allows_deleted",
            "Orphaned allow NetworkPolicies (L2, L3, spec.network) deleted; the caps never hold these back",
            m.orphan_allows_deleted.clone(),
        );
        sub.register(
            "unmanaged_conflicts",
            "Desired NetworkPolicies whose name is held by a policy without our managed-by label",
            m.unmanaged_conflicts.clone(),
        );
        sub.register(
            "synced",
            "1 once the first complete pass finished (obsolete allows removed)",
            m.synced.clone(),
        );
        m
    }
}

/// The last proof of one server's bindings.
struct Proven {
    uid: String,
    generation: Option<i64>,
    at: Instant,
    proof: EgressProof,
}

struct Ctx {
    client: kube::Client,
    settings: NetpolSettings,
    caps: SweepCaps,
    isolation: RuntimeIsolation,
    resolver: Box<dyn Resolve>,
    dns_deadline: Duration,
    refresh: Duration,
    /// A full pass at least this often, without any change.
    resync: Duration,
    recorder: Recorder,
    /// What sweep alerts are published about (the controllers' Lease).
    regarding: ObjectReference,
    reconcile: ReconcileMetrics,
    metrics: Metrics,
    synced: Arc<AtomicBool>,
    servers: Store<MCPServer>,
    contexts: Store<Context>,
    policies: Store<NetworkPolicy>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
}

/// A handle on whether the first complete pass is done (readiness of the leader).
pub type Synced = Arc<AtomicBool>;

/// The controller, ready to run (nothing is watched until the future is polled), and the
/// flag it raises after its first complete pass.
pub fn controller(
    client: kube::Client,
    args: settings::Args,
    egress_args: egress::EgressArgs,
    gateway_port: u16,
    regarding: ObjectReference,
    reconcile: ReconcileMetrics,
    registry: &mut Registry,
) -> anyhow::Result<(
    impl std::future::Future<Output = anyhow::Result<()>>,
    Synced,
)> {
    let (settings, caps) = args.settings(gateway_port)?;
    let isolation = args.isolation(&settings);
    let resync = args.netpol_resync_interval.std();
    let egress_settings = egress_args.settings()?;
    let resolver: Box<dyn Resolve> = Box::new(egress_args.resolver()?);
    let metrics = Metrics::register(registry);
    reconcile.declare(CONTROLLER, &ReconcileError::API_REASONS);
    let synced: Synced = Arc::default();
    let flag = synced.clone();
    let run = async move {
        let (servers, servers_w) = reflector::store();
        let (contexts, contexts_w) = reflector::store();
        let (policies, policies_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        let changed = Arc::new(Notify::new());
        let managed = watcher::Config::default().labels(&children::managed_selector(&[]));
        let mut watches = tokio::task::JoinSet::new();
        watches.spawn(follow(
            "MCPServers",
            watcher(Api::<MCPServer>::all(client.clone()), Default::default())
                .default_backoff()
                .reflect(servers_w),
            changed.clone(),
        ));
        watches.spawn(follow(
            "Contexts",
            watcher(Api::<Context>::all(client.clone()), Default::default())
                .default_backoff()
                .reflect(contexts_w),
            changed.clone(),
        ));
        watches.spawn(follow(
            "NetworkPolicies",
            watcher(Api::<NetworkPolicy>::all(client.clone()), managed)
                .default_backoff()
                .reflect(policies_w),
            changed.clone(),
        ));
        watches.spawn(follow(
            "Namespaces",
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                Default::default(),
            )
            .default_backoff()
            .reflect(namespaces_w),
            changed.clone(),
        ));
        let reporter = Reporter {
            controller: "mcp-access-controllers".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let ctx = Ctx {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            caps,
            isolation,
            resolver,
            dns_deadline: egress_settings.dns_timeout,
            refresh: egress_settings.refresh_interval,
            resync,
            regarding,
            reconcile,
            metrics,
            synced: flag,
            servers,
            contexts,
            policies,
            namespaces,
        };
        tokio::select! {
            ended = watches.join_next() => match ended {
                Some(Ok(what)) => anyhow::bail!("the {what} watch of the NetworkPolicy controller ended"),
                Some(Err(e)) => anyhow::bail!("a watch of the NetworkPolicy controller failed: {e}"),
                None => anyhow::bail!("the NetworkPolicy controller has no watches"),
            },
            ended = ctx.run(changed) => ended,
        }
    };
    Ok((run, synced))
}

/// Drives one reflector and signals every change; returns (naming what) if the stream ends.
async fn follow<S, K>(what: &'static str, stream: S, changed: Arc<Notify>) -> &'static str
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => changed.notify_one(),
            Err(e) => tracing::debug!(error = %e, watch = what, "netpol watch"),
        }
    }
    what
}

impl Ctx {
    async fn run(&self, changed: Arc<Notify>) -> anyhow::Result<()> {
        // Never a pass on a partial view: every cache first holds a complete list.
        let (a, b, c, d) = tokio::join!(
            self.servers.wait_until_ready(),
            self.contexts.wait_until_ready(),
            self.policies.wait_until_ready(),
            self.namespaces.wait_until_ready(),
        );
        for ready in [a, b, c, d] {
            ready.map_err(|e| anyhow::anyhow!("a watch cache was dropped: {e}"))?;
        }
        let mut proofs: HashMap<(String, String), Proven> = HashMap::new();
        let mut last_withheld = 0usize;
        loop {
            let started = Instant::now();
            let next = match self.pass(&mut proofs, &mut last_withheld).await {
                Ok(()) => {
                    if !self.synced.swap(true, Ordering::Relaxed) {
                        tracing::info!("NetworkPolicies in place: obsolete allows removed");
                        self.metrics.synced.set(1);
                    }
                    self.resync
                }
                Err(e) => {
                    self.reconcile.error(CONTROLLER, e.reason());
                    tracing::warn!(error = %e, "NetworkPolicy pass failed");
                    RETRY
                }
            };
            self.reconcile
                .observe(CONTROLLER, started.elapsed().as_secs_f64());
            // The next pass: on a change (taking what arrives within the debounce together),
            // or when DNS-derived allows are due for a refresh, or a failed pass is retried.
            let next = next.min(self.next_refresh(&proofs));
            tokio::select! {
                () = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                () = tokio::time::sleep(next) => {}
            }
        }
    }

    /// Time until the oldest DNS proof is due again.
    fn next_refresh(&self, proofs: &HashMap<(String, String), Proven>) -> Duration {
        proofs
            .values()
            .filter(|p| !p.proof.resolved.is_empty() || !p.proof.failures.is_empty())
            .map(|p| self.refresh.saturating_sub(p.at.elapsed()))
            .min()
            .unwrap_or(self.refresh)
            .max(Duration::from_millis(100))
    }

    async fn pass(
        &self,
        proofs: &mut HashMap<(String, String), Proven>,
        last_withheld: &mut usize,
    ) -> Result<(), ReconcileError> {
        let servers = self.servers.state();
        let contexts: Vec<Context> = self
            .contexts
            .state()
            .iter()
            .map(|c| (**c).clone())
            .collect();

        let mut failed = None;
        let egress = self.prove_egress(&servers, proofs, &mut failed).await;
        let servers: Vec<MCPServer> = servers.iter().map(|s| (**s).clone()).collect();
        let namespaces = self.namespaces.state();
        // Labels for `allowedContexts` selectors: a relabelled namespace is a watched change.
        let namespace_labels: BTreeMap<String, BTreeMap<String, String>> = namespaces
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect();
        let inventory = Inventory {
            servers: &servers,
            contexts: &contexts,
            egress: &egress,
            namespace_labels: &namespace_labels,
        };
        // A namespace that does not exist (or is going away) cannot hold a policy; one
        // created later triggers a pass through the namespace watch.
        let usable: BTreeSet<String> = namespaces
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .map(|n| n.name_any())
            .collect();
        let wanted: Vec<Policy> = desired::policies(&inventory, &self.settings)
            .into_iter()
            .filter(|p| usable.contains(&p.namespace))
            .collect();

        let mut counts: BTreeMap<&str, i64> = desired::PolicyType::ALL
            .iter()
            .map(|t| (t.as_str(), 0))
            .collect();
        for p in &wanted {
            *counts.entry(p.policy_type.as_str()).or_default() += 1;
        }
        for (t, n) in counts {
            self.metrics
                .policies
                .get_or_create(&TypeLabel {
                    policy_type: t.into(),
                })
                .set(n);
        }

        let live: BTreeMap<(String, String), Arc<NetworkPolicy>> = self
            .policies
            .state()
            .into_iter()
            .map(|p| ((p.namespace().unwrap_or_default(), p.name_any()), p))
            .collect();
        let mut conflicts = 0;
        for policy in &wanted {
            let key = (policy.namespace.clone(), policy.name.clone());
            let result = match live.get(&key) {
                Some(current) => self.apply_if_changed(policy, Some(current)).await,
                None => self.apply_if_unclaimed(policy, &mut conflicts).await,
            };
            // One policy failing (a namespace being created, say) must not hold back the
            // others; the pass still reports the failure and is retried.
            if let Err(e) = result {
                tracing::warn!(ns = %policy.namespace, name = %policy.name, error = %e, "cannot apply the NetworkPolicy");
                failed = Some(e);
            }
        }
        self.metrics.unmanaged_conflicts.set(conflicts);

        let desired_keys: BTreeSet<(String, String)> = wanted
            .iter()
            .map(|p| (p.namespace.clone(), p.name.clone()))
            .collect();
        let owners = Owners {
            servers: servers
                .iter()
                .filter_map(|s| Some((s.namespace()?, s.name_any())))
                .collect(),
            contexts: contexts
                .iter()
                .filter_map(|c| Some((c.namespace()?, c.name_any())))
                .collect(),
            runtime_namespaces: self.settings.runtime_namespaces.iter().cloned().collect(),
        };
        let live_policies: Vec<LivePolicy> = live
            .values()
            .map(|p| LivePolicy {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                uid: p.uid(),
                labels: p.labels().clone(),
            })
            .collect();
        let plan = sweep::plan(&live_policies, &desired_keys, &owners, self.caps);
        for policy in &plan.delete {
            if let Err(e) = self.delete(policy).await {
                tracing::warn!(ns = %policy.namespace, name = %policy.name, error = %e, "cannot delete the NetworkPolicy");
                failed = Some(e);
            }
        }
        if plan.orphan_allows > 0 {
            self.metrics
                .orphan_allows_deleted
                .inc_by(plan.orphan_allows as u64);
            tracing::info!(
                allows = plan.orphan_allows,
                "deleted orphaned allows (an owner is gone); the sweep caps never hold allows back"
            );
        }
        self.metrics
            .orphans_withheld
            .set(plan.withheld.len() as i64);
        // Alerted once per change of the withheld set's size, not on every pass.
        if !plan.withheld.is_empty() && plan.withheld.len() != *last_withheld {
            self.metrics.sweeps_withheld.inc();
            self.alert_withheld(&plan).await;
        }
        *last_withheld = plan.withheld.len();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Proves the egress bindings of every live server (reusing a proof while its server is
    /// unchanged and it is fresh), writes what changed into the servers' status, and returns
    /// the proven allows by server. A status write that fails (the server deleted meanwhile,
    /// say) is reported in `failed` and does not hold back the policies.
    async fn prove_egress(
        &self,
        servers: &[Arc<MCPServer>],
        proofs: &mut HashMap<(String, String), Proven>,
        failed: &mut Option<ReconcileError>,
    ) -> BTreeMap<(String, String), Vec<EgressAllow>> {
        let live: Vec<&Arc<MCPServer>> = servers
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .collect();
        let keys: BTreeSet<(String, String)> = live
            .iter()
            .filter_map(|s| Some((s.namespace()?, s.name_any())))
            .collect();
        proofs.retain(|k, _| keys.contains(k));

        let due: Vec<&Arc<MCPServer>> = live
            .iter()
            .copied()
            .filter(|s| {
                let Some(ns) = s.namespace() else {
                    return false;
                };
                match proofs.get(&(ns, s.name_any())) {
                    None => true,
                    Some(p) => {
                        Some(p.uid.as_str()) != s.metadata.uid.as_deref()
                            || p.generation != s.metadata.generation
                            || ((!p.proof.resolved.is_empty() || !p.proof.failures.is_empty())
                                && p.at.elapsed() >= self.refresh)
                    }
                }
            })
            .collect();
        let now = k8s_openapi::jiff::Timestamp::now();
        // With a `remote` URL's binding: one proof, one condition for both.
        let bindings: Vec<_> = due.iter().map(|s| s.spec.external_egress()).collect();
        let fresh = futures::future::join_all(bindings.iter().map(|bindings| {
            egress::prove(bindings, self.resolver.as_ref(), self.dns_deadline, now)
        }))
        .await;
        for (server, mut proof) in due.into_iter().zip(fresh) {
            let key = (server.namespace().unwrap_or_default(), server.name_any());
            keep_resolution_times(server, &mut proof.resolved);
            for failure in &proof.failures {
                tracing::warn!(ns = %key.0, name = %key.1, binding = %failure.binding, error = %failure.error, "egress binding not proven: no allow");
            }
            proofs.insert(
                key,
                Proven {
                    uid: server.metadata.uid.clone().unwrap_or_default(),
                    generation: server.metadata.generation,
                    at: Instant::now(),
                    proof,
                },
            );
        }

        let mut allows = BTreeMap::new();
        for server in live {
            let Some(ns) = server.namespace() else {
                continue;
            };
            let key = (ns, server.name_any());
            let Some(proven) = proofs.get(&key) else {
                continue;
            };
            if let Err(e) = self.write_status(server, &proven.proof).await {
                tracing::warn!(ns = %key.0, name = %key.1, error = %e, "cannot write the network status");
                *failed = Some(e);
            }
            allows.insert(key, proven.proof.allows.clone());
        }
        allows
    }

    /// Applies this controller's part of the status (`NetworkIsolated`, and
    /// `ExternalEgressReady` with `status.resolvedEgressIPs`) when it differs from what the
    /// server shows; for a server without bindings, removes the egress part if present. A
    /// server that turns out not to be isolated gets a Warning Event.
    async fn write_status(
        &self,
        server: &MCPServer,
        proof: &EgressProof,
    ) -> Result<(), ReconcileError> {
        let status = server.status.as_ref();
        let find =
            |type_: &str| status.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
        let previous = find(EXTERNAL_EGRESS_READY);
        let previous_isolated = find(NETWORK_ISOLATED);
        let shown = status
            .map(|s| s.resolved_egress_ips.clone())
            .unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = egress_condition(server, proof, previous, now.clone());
        let isolated = isolation_condition(server, &self.isolation, previous_isolated, now);
        let current = previous_isolated == Some(&isolated)
            && match &condition {
                None => previous.is_none() && shown.is_empty(),
                Some(c) => previous == Some(c) && shown == proof.resolved,
            };
        if current {
            return Ok(());
        }
        // Once per transition to False: after the status says so, so a failed write retries
        // both rather than repeating the Event.
        let warn = (isolated.status == "False"
            && previous_isolated.map(|c| c.status.as_str()) != Some("False"))
        .then(|| isolated.message.clone());
        // Typed, so the field names are the CRD's; what we leave out (no bindings: nothing)
        // server-side apply removes from what this manager owned. The conditions list is a
        // map keyed by type: the workload and retirement controllers' entries are theirs.
        let owned = MCPServerStatus {
            conditions: std::iter::once(isolated).chain(condition).collect(),
            resolved_egress_ips: proof.resolved.clone(),
            ..MCPServerStatus::default()
        };
        let body = json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "status": owned,
        });
        let api = Api::<MCPServer>::namespaced(
            self.client.clone(),
            &server.namespace().unwrap_or_default(),
        );
        children::apply_status(&api, FIELD_MANAGER, &server.name_any(), &body).await?;
        self.reconcile.write(CONTROLLER, "MCPServerStatus");
        if let Some(message) = warn {
            self.warn_not_isolated(server, &message).await;
        }
        Ok(())
    }

    async fn warn_not_isolated(&self, server: &MCPServer, message: &str) {
        let event = Event {
            type_: EventType::Warning,
            reason: OUTSIDE_RUNTIME_NAMESPACE.into(),
            note: Some(message.into()),
            action: "Isolate".into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &server.object_ref(&())).await {
            Ok(()) => self.reconcile.write(CONTROLLER, "Event"),
            Err(e) => tracing::warn!(error = %e, "cannot publish the isolation Event"),
        }
    }

    async fn apply_if_changed(
        &self,
        policy: &Policy,
        live: Option<&NetworkPolicy>,
    ) -> Result<(), ReconcileError> {
        let live =
            serde_json::to_value(live).map_err(|e| ReconcileError::Encode("NetworkPolicy", e))?;
        if up_to_date(&policy.body, &live) {
            return Ok(());
        }
        let api = Api::<NetworkPolicy>::namespaced(self.client.clone(), &policy.namespace);
        children::apply(&api, FIELD_MANAGER, &policy.name, &policy.body).await?;
        self.reconcile.write(CONTROLLER, "NetworkPolicy");
        Ok(())
    }

    /// A desired policy absent from the cache of managed policies: created, unless a policy
    /// of that name exists without our label — that one is someone else's and stays as is.
    async fn apply_if_unclaimed(
        &self,
        policy: &Policy,
        conflicts: &mut i64,
    ) -> Result<(), ReconcileError> {
        let api = Api::<NetworkPolicy>::namespaced(self.client.clone(), &policy.namespace);
        if let Some(existing) = api.get_opt(&policy.name).await? {
            if !children::is_managed(existing.labels()) {
                *conflicts += 1;
                tracing::warn!(ns = %policy.namespace, name = %policy.name, "a NetworkPolicy we do not manage holds this name: left alone");
                return Ok(());
            }
            return self.apply_if_changed(policy, Some(&existing)).await;
        }
        self.apply_if_changed(policy, None).await
    }

    async fn delete(&self, policy: &LivePolicy) -> Result<(), ReconcileError> {
        let api = Api::<NetworkPolicy>::namespaced(self.client.clone(), &policy.namespace);
        // Gone already (the garbage collector, or another pass) or re-created: fine.
        children::delete_exact(&api, &policy.name, policy.uid.clone()).await?;
        self.reconcile.write(CONTROLLER, "NetworkPolicyDelete");
        tracing::info!(ns = %policy.namespace, name = %policy.name, "deleted a NetworkPolicy no longer desired");
        Ok(())
    }

    async fn alert_withheld(&self, plan: &sweep::SweepPlan) {
        let sample: Vec<String> = plan
            .withheld
            .iter()
            .take(5)
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        let note = format!(
            "{} orphaned L0/L1 NetworkPolicies (deny-all and infrastructure of namespaces no longer in --runtime-namespace) exceed the sweep cap (at most {} and {}% of {} managed): none of them deleted, since deleting a deny widens access; orphaned allows are deleted regardless. First: {}",
            plan.withheld.len(),
            self.caps.max,
            self.caps.max_percent,
            plan.fleet,
            sample.join(", ")
        );
        tracing::warn!(orphans = plan.withheld.len(), fleet = plan.fleet, "{note}");
        let event = Event {
            type_: EventType::Warning,
            reason: "OrphanSweepWithheld".into(),
            note: Some(note),
            action: "Sweep".into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &self.regarding).await {
            Ok(()) => self.reconcile.write(CONTROLLER, "Event"),
            Err(e) => tracing::warn!(error = %e, "cannot publish the sweep Event"),
        }
    }
}

/// A re-proven binding that resolved to the same addresses keeps the time they were first
/// resolved, so an unchanged answer writes nothing.
fn keep_resolution_times(server: &MCPServer, resolved: &mut [ResolvedEgress]) {
    let Some(status) = &server.status else {
        return;
    };
    for r in resolved {
        if let Some(before) = status
            .resolved_egress_ips
            .iter()
            .find(|b| b.binding == r.binding && b.host == r.host && b.ips == r.ips)
        {
            r.resolved_at.clone_from(&before.resolved_at);
        }
    }
}

/// The `ExternalEgressReady` condition of a server with bindings (`None` without), keeping
/// `lastTransitionTime` while the status holds.
pub fn egress_condition(
    server: &MCPServer,
    proof: &EgressProof,
    previous: Option<&Condition>,
    now: Time,
) -> Option<Condition> {
    let bindings = server.spec.external_egress();
    if bindings.is_empty() {
        return None;
    }
    let (status, reason, message) = if proof.failures.is_empty() {
        (
            "True",
            "EgressProven",
            format!("{} egress binding(s) proven and allowed", bindings.len()),
        )
    } else {
        let failures: Vec<String> = proof
            .failures
            .iter()
            .map(|f| format!("{}: {}", f.binding, f.error))
            .collect();
        (
            "False",
            "EgressBindingRejected",
            format!("not deployed: {}", failures.join("; ")),
        )
    };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now,
    };
    Some(Condition {
        type_: EXTERNAL_EGRESS_READY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: server.metadata.generation,
        last_transition_time,
    })
}

/// The `NetworkIsolated` condition of a live server: True in a runtime namespace (its L0
/// deny-all isolates the server's pods, and only declared routes open them), False outside,
/// saying whether it was deployed anyway. `lastTransitionTime` is kept while the status holds.
pub fn isolation_condition(
    server: &MCPServer,
    isolation: &RuntimeIsolation,
    previous: Option<&Condition>,
    now: Time,
) -> Condition {
    let namespace = server.metadata.namespace.as_deref().unwrap_or_default();
    let (status, reason, message) = if isolation.isolates(namespace) {
        (
            "True",
            "RuntimeNamespace",
            format!(
                "namespace {namespace} is a --runtime-namespace: its deny-all policy isolates \
                 the server, opened only along declared routes"
            ),
        )
    } else {
        let outcome = if isolation.required {
            "not deployed (--require-runtime-namespace)"
        } else {
            "deployed anyway; set --require-runtime-namespace to refuse such servers"
        };
        (
            "False",
            OUTSIDE_RUNTIME_NAMESPACE,
            format!(
                "namespace {namespace} is not a --runtime-namespace: no deny-all policy isolates \
                 the server, so any pod may reach it and it may reach anything; {outcome}"
            ),
        )
    };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now,
    };
    Condition {
        type_: NETWORK_ISOLATED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: server.metadata.generation,
        last_transition_time,
    }
}

/// A reference to the Lease the controllers elect their leader with (what sweep alerts are
/// about: they concern the controller, not one object).
pub fn lease_reference(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::{MCPServerSpec, Transport};

    fn mk_server(ns: &str) -> MCPServer {
        let mut s = MCPServer::new(
            "github",
            MCPServerSpec {
                image: Some("ghcr.io/acme/mcp:1".into()),
                port: Some(8080),
                transport: Transport::StreamableHttp,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some(ns.into());
        s.metadata.generation = Some(3);
        s
    }

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn a_server_outside_the_runtime_namespaces_is_not_isolated() {
        let mut isolation = RuntimeIsolation {
            runtime_namespaces: ["tools".to_string()].into(),
            required: false,
        };
        let inside = isolation_condition(&mk_server("tools"), &isolation, None, t(1));
        assert_eq!(
            (
                inside.type_.as_str(),
                inside.status.as_str(),
                inside.reason.as_str()
            ),
            (NETWORK_ISOLATED, "True", "RuntimeNamespace")
        );
        assert_eq!(inside.observed_generation, Some(3));
        let outside = isolation_condition(&mk_server("default"), &isolation, None, t(1));
        assert_eq!(
            (outside.status.as_str(), outside.reason.as_str()),
            ("False", OUTSIDE_RUNTIME_NAMESPACE)
        );
        assert!(
            outside.message.contains("deployed anyway"),
            "{}",
            outside.message
        );
        isolation.required = true;
        let refused = isolation_condition(&mk_server("default"), &isolation, Some(&outside), t(9));
        assert!(
            refused
                .message
                .contains("not deployed (--require-runtime-namespace)"),
            "{}",
            refused.message
        );
        assert_eq!(refused.last_transition_time, t(1), "still False: time kept");
        let moved = isolation_condition(&mk_server("tools"), &isolation, Some(&outside), t(9));
        assert_eq!(moved.last_transition_time, t(9));
    }
}
