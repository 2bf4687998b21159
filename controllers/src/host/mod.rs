//! The Host operator: a `Host` reconciled into its runtime objects: a ServiceAccount with a
//! Role and RoleBinding scoped to its own Host object and Secret, the workspace PVC, the
//! host-side egress NetworkPolicy (exactly its Context's servers, the cluster DNS and the Host
//! API), a Service and the Deployment. `spec.secretRef` is checked first: without the Secret
//! there is no workload, nor with an image outside the allow-list MCPServers have
//! (`--image-allow-prefix`, `--image-policy`), nor while a child's name is held by an object
//! that is not this Host's (left alone: [`crate::children::claimable`]). A sweep (at start and
//! then periodically) removes the objects of deleted Hosts, within the same caps as the
//! NetworkPolicy sweeps.
//!
//! [`desired`], [`status`] and [`sweep`] are pure; this file is the I/O: read, compare, apply
//! only what differs (a no-op reconcile makes no write), under one field manager.

pub mod desired;
pub mod grants;
pub mod status;
pub mod sweep;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::duration::GoDuration;
use apis::runtime::{Context, Host, MCPServer};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;

use crate::children::{self, ChildKind, ReconcileError};
use crate::mcpserver::status::ImagePolicy;
use crate::metrics::ReconcileMetrics;
use crate::netpol::settings::{is_dns_label, Label, NetpolSettings, SweepCaps};
use desired::{HostSettings, Inputs, HOST_LABEL};
use sweep::{LiveChild, LiveHost};

/// The field manager of everything this operator applies (children and Host status).
pub const FIELD_MANAGER: &str = "mcp-access-controllers-host";
const CONTROLLER: &str = "host";

/// Flags of the Host operator.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "host")]
pub struct Args {
    /// The Host API URL handed to hosts (`MCP_HOST_API_URL` in their container). Unset: the
    /// variable is not set.
    #[arg(long, env = "MCP_ACCESS_HOST_API_URL")]
    pub host_api_url: Option<String>,
    /// Namespace of the controllers serving the Host API (the hosts' egress allows it).
    #[arg(
        long,
        env = "MCP_ACCESS_HOST_API_NAMESPACE",
        default_value = "mcp-access"
    )]
    pub host_api_namespace: String,
    /// Label (`key=value`) of the controllers' pods serving the Host API.
    #[arg(
        long,
        env = "MCP_ACCESS_HOST_API_POD_LABEL",
        default_value = "app=mcp-access-controllers"
    )]
    pub host_api_pod_label: String,
    /// The Host API's port as the hosts' packets reach the pods (the listener, not the
    /// Service port).
    #[arg(
        long,
        env = "MCP_ACCESS_HOST_API_PORT_FOR_HOSTS",
        default_value_t = 8443
    )]
    pub host_api_port_for_hosts: u16,
    /// Port the host container listens on (its Service's port).
    #[arg(long, env = "MCP_ACCESS_HOST_CONTAINER_PORT", default_value_t = 8080)]
    pub host_container_port: u16,
    /// How often the orphan sweep of Host objects runs after the one at start.
    #[arg(long, env = "MCP_ACCESS_HOST_SWEEP_INTERVAL", default_value = "5m")]
    pub host_sweep_interval: GoDuration,
}

/// Settings that cannot work stop startup, naming the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("--host-api-url {0:?} must be an https:// URL")]
    PlainUrl(String),
    #[error("--host-api-namespace {0:?} is not a namespace name")]
    Namespace(String),
    #[error("--host-api-pod-label {0:?} is not a `key=value` label")]
    Label(String),
    #[error("{0} must not be 0")]
    ZeroPort(&'static str),
    #[error("--host-sweep-interval is 0s: it must be positive")]
    ZeroInterval,
}

impl Args {
    /// The validated settings, with the NetworkPolicy settings (the DNS) they reuse.
    pub fn settings(&self, netpol: NetpolSettings) -> Result<HostSettings, SettingsError> {
        let api_url = match self.host_api_url.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(u) if u.starts_with("https://") => Some(u.to_string()),
            Some(u) => return Err(SettingsError::PlainUrl(u.into())),
        };
        if !is_dns_label(&self.host_api_namespace) {
            return Err(SettingsError::Namespace(self.host_api_namespace.clone()));
        }
        let api_pod_label = match self.host_api_pod_label.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => Label {
                key: k.trim().into(),
                value: v.trim().into(),
            },
            _ => return Err(SettingsError::Label(self.host_api_pod_label.clone())),
        };
        for (flag, port) in [
            ("--host-api-port-for-hosts", self.host_api_port_for_hosts),
            ("--host-container-port", self.host_container_port),
        ] {
            if port == 0 {
                return Err(SettingsError::ZeroPort(flag));
            }
        }
        if self.host_sweep_interval.is_zero() {
            return Err(SettingsError::ZeroInterval);
        }
        Ok(HostSettings {
            api_url,
            api_namespace: self.host_api_namespace.clone(),
            api_pod_label,
            api_port: self.host_api_port_for_hosts,
            container_port: self.host_container_port,
            netpol,
        })
    }
}

/// The operator's own metrics (the sweep's).
#[derive(Clone, Default)]
struct Metrics {
    /// Orphans the last sweep found over a cap and left in place (0: within the caps).
    over_cap: Gauge,
    /// Sweeps that withheld their orphans.
    sweeps_withheld: Counter,
    /// Orphans deleted.
    deleted: Counter,
}

impl Metrics {
    fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        let sub = registry.sub_registry_with_prefix("mcp_controllers");
        sub.register(
            "host_orphans_over_cap",
            "Orphaned Host objects the last sweep left in place because they were over a cap",
            m.over_cap.clone(),
        );
        sub.register(
            "host_sweeps_withheld",
            "Host orphan sweeps that deleted nothing because the orphans were over a cap",
            m.sweeps_withheld.clone(),
        );
        sub.register(
            "host_orphans_deleted",
            "Orphaned Host objects deleted by the sweep",
            m.deleted.clone(),
        );
        m
    }
}

struct Ctx {
    client: kube::Client,
    settings: HostSettings,
    policy: ImagePolicy,
    caps: SweepCaps,
    recorder: Recorder,
    metrics: ReconcileMetrics,
    own: Metrics,
}

/// The Host operator, polled by the leader.
pub fn controller(
    client: kube::Client,
    args: Args,
    netpol: NetpolSettings,
    policy: ImagePolicy,
    orphan_caps: SweepCaps,
    reconcile: ReconcileMetrics,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    let settings = args.settings(netpol)?;
    let interval = args.host_sweep_interval.std();
    let own = Metrics::register(registry);
    reconcile.declare(CONTROLLER, &ReconcileError::REASONS);
    Ok(async move {
        let reporter = Reporter {
            controller: "mcp-access-controllers".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let ctx = Arc::new(Ctx {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
            settings,
            policy,
            caps: orphan_caps,
            metrics: reconcile,
            own,
        });
        let sweeper = ctx.clone();
        let sweeping = async move {
            loop {
                if let Err(e) = sweep_orphans(&sweeper).await {
                    sweeper.metrics.error(CONTROLLER, e.reason());
                    tracing::warn!(error = %e, "host orphan sweep failed; retried next interval");
                }
                tokio::time::sleep(interval).await;
            }
        };

        // Contexts cached to map an MCPServer to the Hosts whose Context grants it.
        let (contexts, contexts_w) = reflector::store::<Context>();
        let context_cache = watcher(Api::<Context>::all(client.clone()), Default::default())
            .default_backoff()
            .reflect(contexts_w)
            .for_each(|_| std::future::ready(()));

        let managed = watcher::Config::default().labels(&children::managed_selector(&[HOST_LABEL]));
        let controller =
            Controller::new(Api::<Host>::all(client.clone()), watcher::Config::default())
                .with_config(kube::runtime::controller::Config::default().concurrency(8));
        let hosts = controller.store();
        let (by_context, by_server, by_secret) = (hosts.clone(), hosts.clone(), hosts);
        let running = controller
            .owns(Api::<Deployment>::all(client.clone()), managed.clone())
            .owns(Api::<Service>::all(client.clone()), managed.clone())
            .owns(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                managed.clone(),
            )
            .owns(Api::<ServiceAccount>::all(client.clone()), managed.clone())
            .owns(Api::<Role>::all(client.clone()), managed.clone())
            .owns(Api::<RoleBinding>::all(client.clone()), managed.clone())
            .owns(Api::<NetworkPolicy>::all(client.clone()), managed)
            .watches(
                Api::<Context>::all(client.clone()),
                watcher::Config::default(),
                move |context| {
                    let ns = context.namespace();
                    let name = context.name_any();
                    hosts_where(&by_context, |h| {
                        h.namespace() == ns && h.spec.context_ref.name == name
                    })
                },
            )
            .watches(
                Api::<MCPServer>::all(client.clone()),
                watcher::Config::default(),
                move |server| {
                    let key = (server.namespace().unwrap_or_default(), server.name_any());
                    let granting: Vec<(Option<String>, String)> = contexts
                        .state()
                        .iter()
                        .filter(|c| grants::granted_refs(c).contains(&key))
                        .map(|c| (c.namespace(), c.name_any()))
                        .collect();
                    hosts_where(&by_server, |h| {
                        granting.iter().any(|(ns, name)| {
                            h.namespace() == *ns && h.spec.context_ref.name == *name
                        })
                    })
                },
            )
            // A Secret (metadata only) re-queues the Hosts of its namespace naming it, so
            // creating a missing Secret deploys at once.
            .watches(
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                watcher::Config::default(),
                move |secret| {
                    let ns = secret.namespace();
                    let name = secret.name_any();
                    hosts_where(&by_secret, |h| {
                        h.namespace() == ns
                            && h.spec.secret_ref.as_ref().is_some_and(|s| s.name == name)
                    })
                },
            )
            .run(reconcile_host, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "host reconcile");
                }
            });
        tokio::select! {
            _ = running => anyhow::bail!("the Host watch ended"),
            _ = context_cache => anyhow::bail!("the Context watch of the Host operator ended"),
            _ = sweeping => anyhow::bail!("the Host orphan sweep ended"),
        }
    })
}

fn hosts_where(store: &Store<Host>, pick: impl Fn(&Host) -> bool) -> Vec<ObjectRef<Host>> {
    store
        .state()
        .into_iter()
        .filter(|h| pick(h))
        .map(|h| ObjectRef::from_obj(&*h))
        .collect()
}

fn error_policy(host: Arc<Host>, error: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.error(CONTROLLER, error.reason());
    tracing::warn!(
        namespace = host.namespace().unwrap_or_default(),
        name = host.name_any(),
        error = %error,
        "host reconcile failed"
    );
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile_host(host: Arc<Host>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_one(&host, &ctx).await;
    ctx.metrics
        .observe(CONTROLLER, started.elapsed().as_secs_f64());
    result
}

async fn reconcile_one(host: &Host, ctx: &Ctx) -> Result<Action, ReconcileError> {
    // A Host being deleted: the garbage collector removes its children.
    if host.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = children::namespace_of(host)?;
    let name = host.name_any();
    let client = ctx.client.clone();

    // 1. The Secret first: without it there is no workload.
    let secret = match &host.spec.secret_ref {
        None => None,
        Some(r) => {
            let found = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_metadata_opt(&r.name)
                .await?
                .is_some();
            Some((r.name.clone(), found))
        }
    };
    // 2. The Context of the Host's own namespace, and the servers it grants.
    let context_name = &host.spec.context_ref.name;
    // A Context being deleted grants nothing any more (as for the NetworkPolicy controller).
    let context = Api::<Context>::namespaced(client.clone(), namespace)
        .get_opt(context_name)
        .await?
        .filter(|c| c.metadata.deletion_timestamp.is_none());
    let mut servers = Vec::new();
    if let Some(context) = &context {
        for (ns, server) in grants::granted_refs(context) {
            if let Some(s) = Api::<MCPServer>::namespaced(client.clone(), &ns)
                .get_opt(&server)
                .await?
            {
                servers.push(s);
            }
        }
    }
    let granted: Vec<&MCPServer> = match &context {
        Some(c) => grants::granted(host, c, &servers),
        None => Vec::new(),
    };
    let live_claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(&desired::workspace_name(&name))
        .await?;
    let live_size = live_claim
        .as_ref()
        .and_then(|c| c.spec.as_ref()?.resources.as_ref()?.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    let inputs = Inputs {
        servers: &granted,
        context_labels: context
            .as_ref()
            .and_then(|c| c.spec.host_selector.match_labels.as_ref()),
        live_workspace: live_size.as_deref(),
    };
    let secret_resolved = secret.as_ref().is_none_or(|(_, found)| *found);
    // 3. The image, against the allow-list MCPServers have.
    let image = ctx.policy.check(&host.spec.image);

    let mut applied_deployment = false;
    let mut workload_observed = false;
    // Children whose names are held by objects that are not this Host's: left alone, and the
    // host is not deployed (its pods would run as, or be reached through, someone else's).
    let mut conflicts = Vec::new();
    // Children kube-apiserver refused (invalid, forbidden): said in `Ready`, retried, and no
    // reason to stop applying the others.
    let mut refused = Vec::new();
    for child in desired::children(host, &ctx.settings, &inputs)? {
        let deployable = secret_resolved && image.deployable() && conflicts.is_empty();
        if child.kind == ChildKind::Deployment && !deployable {
            if children::prune_owned(&client, namespace, child.kind, &child.name, host).await? {
                ctx.metrics.write(CONTROLLER, "DeploymentDelete");
            }
            continue;
        }
        // The binding names its ServiceAccount and Role by name: while either name is held by
        // another object, a binding would hand that Role to, or this Host's Secret to, someone
        // else's object. None is written, and one this Host wrote before goes.
        if child.kind == ChildKind::RoleBinding && !conflicts.is_empty() {
            if children::prune_owned(&client, namespace, child.kind, &child.name, host).await? {
                ctx.metrics.write(CONTROLLER, "RoleBindingDelete");
            }
            continue;
        }
        let applied = match children::apply_child(&client, namespace, FIELD_MANAGER, &child).await {
            Ok(applied) => applied,
            Err(e) => {
                let Some(message) = e.refusal() else {
                    return Err(e);
                };
                ctx.metrics.error(CONTROLLER, "refused");
                refused.push(format!(
                    "{} {}: {}",
                    child.kind.as_str(),
                    child.name,
                    message
                ));
                continue;
            }
        };
        let Some(applied) = applied else {
            conflicts.push(format!("{} {}", child.kind.as_str(), child.name));
            continue;
        };
        if applied.written {
            ctx.metrics.write(CONTROLLER, child.kind.as_str());
        }
        if child.kind == ChildKind::Deployment {
            applied_deployment = applied.written;
            let live = &applied.live;
            let generation = live["metadata"]["generation"].as_i64();
            let observed = live["status"]["observedGeneration"].as_i64();
            workload_observed = matches!((generation, observed), (Some(g), Some(o)) if o >= g);
        }
    }

    let previous = host.status.as_ref();
    if applied_deployment {
        publish(
            ctx,
            host,
            EventType::Normal,
            "Deployed",
            "Apply",
            format!("Deployment applied with image {}", host.spec.image),
        )
        .await?;
    }
    if let Some((secret_name, false)) = &secret {
        if status::condition_status(previous, status::SECRET_RESOLVED) != Some("False") {
            publish(
                ctx,
                host,
                EventType::Warning,
                "SecretMissing",
                "ValidateSecret",
                format!("Secret {secret_name} not found: not deployed"),
            )
            .await?;
        }
    }

    if let Some(note) = image.refusal() {
        if status::condition_status(previous, status::IMAGE_ALLOWED) != Some("False") {
            publish(
                ctx,
                host,
                EventType::Warning,
                "ImageNotAllowed",
                "CheckImage",
                note,
            )
            .await?;
        }
    }

    if !conflicts.is_empty() && status::ready_reason(previous) != Some(status::NAME_CONFLICT) {
        publish(
            ctx,
            host,
            EventType::Warning,
            status::NAME_CONFLICT,
            "Apply",
            children::conflict_message("Host", &conflicts),
        )
        .await?;
    }

    if !refused.is_empty() && status::ready_reason(previous) != Some(status::APPLY_REFUSED) {
        publish(
            ctx,
            host,
            EventType::Warning,
            status::APPLY_REFUSED,
            "Apply",
            status::refused_message(&refused),
        )
        .await?;
    }

    let name_conflict = !conflicts.is_empty();
    let any_refused = !refused.is_empty();
    let observed = status::Observed {
        secret,
        image,
        conflicts,
        refused,
        context: (context_name.clone(), context.is_some()),
        servers: granted.len(),
        workload_observed,
    };
    let generation = host.metadata.generation;
    let wanted = status::conditions(
        previous,
        generation,
        &observed,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if !status::current(previous, generation, &wanted) {
        let body = json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Host",
            "status": {"observedGeneration": generation, "conditions": wanted},
        });
        let api = Api::<Host>::namespaced(client, namespace);
        children::apply_status(&api, FIELD_MANAGER, &name, &body).await?;
        ctx.metrics.write(CONTROLLER, "HostStatus");
    }
    // A name held by another object: look again in 10 s (its removal wakes nothing here). Not
    // observed yet: soon (the Deployment's status change also wakes us).
    Ok(Action::requeue(if name_conflict {
        children::NAME_CONFLICT_RETRY
    } else if any_refused {
        REFUSED_RETRY
    } else if workload_observed {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(30)
    }))
}

/// How often a Host with a refused child tries again (what made kube-apiserver refuse, a
/// StorageClass or an admission policy, may change without waking the Host).
const REFUSED_RETRY: Duration = Duration::from_secs(30);

async fn publish(
    ctx: &Ctx,
    host: &Host,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) -> Result<(), ReconcileError> {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &host.object_ref(&())).await?;
    ctx.metrics.write(CONTROLLER, "Event");
    Ok(())
}

/// Every object of `kind` carrying our managed-by and host labels, in all namespaces.
async fn list_children(
    client: &kube::Client,
    kind: ChildKind,
    selector: &str,
) -> Result<Vec<LiveChild>, ReconcileError> {
    let live = children::list_managed(client, kind, selector).await?;
    Ok(live
        .into_iter()
        .map(|meta| LiveChild {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            owner_uid: children::owner_uid::<Host>(&meta).map(str::to_string),
            deleting: meta.deletion_timestamp.is_some(),
            labels: meta.labels.unwrap_or_default(),
        })
        .collect())
}

/// One sweep: the children are listed before the Hosts, so a Host created meanwhile has
/// none listed and none of its objects can look orphaned.
async fn sweep_orphans(ctx: &Ctx) -> Result<(), ReconcileError> {
    let selector = children::managed_selector(&[HOST_LABEL]);
    let mut live = Vec::new();
    for kind in desired::KINDS {
        live.extend(list_children(&ctx.client, kind, &selector).await?);
    }
    let hosts: Vec<LiveHost> = Api::<Host>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|h| {
            Some(LiveHost {
                namespace: h.metadata.namespace?,
                name: h.metadata.name?,
                uid: h.metadata.uid?,
            })
        })
        .collect();
    let plan = sweep::plan(&live, &hosts, ctx.caps);
    ctx.own.over_cap.set(plan.withheld.len() as i64);
    if !plan.withheld.is_empty() {
        ctx.own.sweeps_withheld.inc();
        tracing::error!(
            orphans = plan.withheld.len(),
            managed = plan.fleet,
            max = ctx.caps.max,
            max_percent = ctx.caps.max_percent,
            "orphaned ServiceAccounts, Services and workspaces of Hosts over the sweep caps: none \
             of them deleted (check for a fault, then delete them by hand or raise \
             --orphan-delete-max / --orphan-delete-max-percent); orphaned egress policies, \
             Roles, RoleBindings and Deployments are deleted regardless"
        );
    }
    for child in &plan.delete {
        // Gone already, or re-created meanwhile (the uid precondition): left alone.
        let api: Api<DynamicObject> = Api::namespaced_with(
            ctx.client.clone(),
            &child.namespace,
            &child.kind.api_resource(),
        );
        children::delete_exact(&api, &child.name, child.uid.clone()).await?;
        ctx.own.deleted.inc();
        ctx.metrics.write(CONTROLLER, "OrphanDelete");
        tracing::info!(
            kind = child.kind.as_str(),
            namespace = child.namespace,
            name = child.name,
            "deleted an orphaned Host object"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        host: Args,
    }

    fn netpol() -> NetpolSettings {
        #[derive(Parser)]
        struct N {
            #[command(flatten)]
            n: crate::netpol::settings::Args,
        }
        N::parse_from(["t"]).n.settings(8086).unwrap().0
    }

    #[test]
    fn settings_fail_closed() {
        let parse = |args: &[&str]| {
            let mut all = vec!["t"];
            all.extend_from_slice(args);
            T::parse_from(all).host.settings(netpol())
        };
        let s = parse(&[]).unwrap();
        assert_eq!(s.api_url, None);
        assert_eq!(s.api_namespace, "mcp-access");
        assert_eq!(s.api_port, 8443);
        assert_eq!(
            parse(&["--host-api-url=http://x"]),
            Err(SettingsError::PlainUrl("http://x".into()))
        );
        assert_eq!(
            parse(&["--host-api-pod-label=app"]),
            Err(SettingsError::Label("app".into()))
        );
        assert_eq!(
            parse(&["--host-api-namespace=Not_A_Namespace"]),
            Err(SettingsError::Namespace("Not_A_Namespace".into()))
        );
        assert_eq!(
            parse(&["--host-api-port-for-hosts=0"]),
            Err(SettingsError::ZeroPort("--host-api-port-for-hosts"))
        );
        assert_eq!(
            parse(&["--host-api-url=https://h:8443"])
                .unwrap()
                .api_url
                .as_deref(),
            Some("https://h:8443")
        );
    }
}
