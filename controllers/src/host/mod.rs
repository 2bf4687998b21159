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
pub mod runtime_token;
pub mod sessions;
pub mod status;
pub mod sweep;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::duration::GoDuration;
use apis::runtime::{Context, Host, HostSessionStatus, MCPServer};
use apis::types::{AccessSession, Revocation};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
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
    /// The RSA private key (PEM) the operator signs each Host's runtime token with (the key
    /// whose public half is the Host API's `--host-token-public-key-file`). Unset: no runtime
    /// tokens (`RuntimeTokenReady=False`).
    #[arg(long, env = "MCP_ACCESS_HOST_RUNTIME_TOKEN_KEY_FILE")]
    pub host_runtime_token_key_file: Option<std::path::PathBuf>,
    /// The lifetime of a runtime token.
    #[arg(long, env = "MCP_ACCESS_HOST_RUNTIME_TOKEN_TTL", default_value = "1h")]
    pub host_runtime_token_ttl: GoDuration,
    /// How long before its expiry a runtime token is replaced.
    #[arg(
        long,
        env = "MCP_ACCESS_HOST_RUNTIME_TOKEN_REFRESH_BEFORE",
        default_value = "900s"
    )]
    pub host_runtime_token_refresh_before: GoDuration,
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
            runtime_token: self.host_runtime_token_key_file.is_some(),
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
    /// Mints the Hosts' runtime tokens, when configured.
    signer: Option<runtime_token::Signer>,
    /// Namespaces (metadata): a Context's namespace labels, for a server's consent.
    namespaces: Store<PartialObjectMeta<Namespace>>,
    settings: HostSettings,
    policy: ImagePolicy,
    caps: SweepCaps,
    recorder: Recorder,
    metrics: ReconcileMetrics,
    own: Metrics,
}

/// The Host operator, polled by the leader.
/// The claims the Host API checks, for the runtime tokens: its issuer, its audience, and its
/// `--host-token-max-ttl` when this process serves it.
pub struct TokenClaims {
    pub issuer: Option<String>,
    pub audience: Vec<String>,
    pub api_max_ttl: Option<Duration>,
}

/// What the Host operator shares with the other controllers.
pub struct Shared {
    /// The cluster DNS and API addresses, as the NetworkPolicy controller has them.
    pub netpol: NetpolSettings,
    /// The image allow-list MCPServers have.
    pub policy: ImagePolicy,
    /// The orphan sweep's caps.
    pub orphan_caps: SweepCaps,
    /// The claims of the runtime tokens.
    pub claims: TokenClaims,
}

pub fn controller(
    client: kube::Client,
    args: Args,
    shared: Shared,
    reconcile: ReconcileMetrics,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    let Shared {
        netpol,
        policy,
        orphan_caps,
        claims,
    } = shared;
    let settings = args.settings(netpol)?;
    let signer = match &args.host_runtime_token_key_file {
        None => None,
        Some(file) => Some(runtime_token::Signer::load(
            file,
            claims.issuer.as_deref(),
            &claims.audience,
            args.host_runtime_token_ttl.std(),
            args.host_runtime_token_refresh_before.std(),
            claims.api_max_ttl,
        )?),
    };
    let interval = args.host_sweep_interval.std();
    let own = Metrics::register(registry);
    reconcile.declare(CONTROLLER, &ReconcileError::REASONS);
    Ok(async move {
        let reporter = Reporter {
            controller: "mcp-access-controllers".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let (namespaces, namespaces_w) = reflector::store::<PartialObjectMeta<Namespace>>();
        let namespace_cache = watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .reflect(namespaces_w)
        .for_each(|_| std::future::ready(()));
        let ctx = Arc::new(Ctx {
            signer,
            namespaces,
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
        let (by_context, by_server, by_secret, by_session) =
            (hosts.clone(), hosts.clone(), hosts.clone(), hosts);
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
                            && (h.spec.secret_ref.as_ref().is_some_and(|s| s.name == name)
                                || desired::runtime_token_name(&h.name_any()) == name)
                    })
                },
            )
            // A Host's sessions (a revocation, an expiry, a deletion) re-queue it.
            .watches(
                Api::<AccessSession>::all(client.clone()),
                watcher::Config::default().labels(&format!(
                    "{},{}",
                    children::managed_selector(&[]),
                    sessions::HOST_UID_LABEL
                )),
                move |session| {
                    let uid = session.labels().get(sessions::HOST_UID_LABEL).cloned();
                    hosts_where(&by_session, |h| h.metadata.uid == uid)
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
            _ = namespace_cache => anyhow::bail!("the Namespace watch of the Host operator ended"),
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
    let namespace = children::namespace_of(host)?;
    let name = host.name_any();
    let client = ctx.client.clone();
    // A Host being deleted: its sessions go first, in every namespace (which cuts it at the
    // gateways), then the finalizer; the garbage collector removes its other children.
    if host.metadata.deletion_timestamp.is_some() {
        if host.finalizers().iter().any(|f| f == sessions::FINALIZER) {
            delete_sessions(ctx, host).await?;
            set_finalizer(ctx, host, false).await?;
        }
        return Ok(Action::await_change());
    }
    if !host.finalizers().iter().any(|f| f == sessions::FINALIZER) {
        set_finalizer(ctx, host, true).await?;
    }

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
        Some(c) => grants::granted(host, c, &servers, |ns| namespace_labels(ctx, ns)),
        None => Vec::new(),
    };
    let selected = context.as_ref().is_none_or(|c| grants::selects(c, host));
    // 2b. One AccessSession per granted server.
    let teams = context
        .as_ref()
        .map(|c| c.spec.teams.clone())
        .unwrap_or_default();
    let kept = keep_sessions(ctx, host, &granted, &teams, context_name).await?;
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
        host_labels: host.metadata.labels.as_ref(),
        live_workspace: live_size.as_deref(),
    };
    let secret_resolved = secret.as_ref().is_none_or(|(_, found)| *found);
    // 3. The image, against the allow-list MCPServers have.
    let image = ctx.policy.check(&host.spec.image);

    // 4. The runtime token, minted when due (absent, for another Host UID, or close to expiry).
    let mut wanted_children = desired::children(host, &ctx.settings, &inputs)?;
    let runtime_token = match &ctx.signer {
        None => status::RuntimeToken::NotConfigured,
        Some(signer) => {
            let secret_name = desired::runtime_token_name(&name);
            let live = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_metadata_opt(&secret_name)
                .await?;
            let uid = host.metadata.uid.clone().unwrap_or_default();
            let now = k8s_openapi::jiff::Timestamp::now();
            let live_annotations = live.as_ref().map(|s| s.annotations().clone());
            if signer.due(live_annotations.as_ref(), &uid, now) {
                match signer.mint(namespace, &name, &uid, now) {
                    Ok((token, expires)) => {
                        let at = wanted_children
                            .iter()
                            .position(|c| c.kind == ChildKind::Deployment)
                            .unwrap_or(wanted_children.len());
                        wanted_children.insert(
                            at,
                            desired::runtime_token_secret(
                                host,
                                &secret_name,
                                &uid,
                                &token,
                                expires,
                            )?,
                        );
                        status::RuntimeToken::Current(expires)
                    }
                    Err(e) => status::RuntimeToken::Failed(format!("signing failed: {e}")),
                }
            } else {
                let expires = live_annotations
                    .as_ref()
                    .and_then(|a| a.get(runtime_token::EXPIRES_ANNOTATION))
                    .and_then(|e| e.parse().ok())
                    .unwrap_or(now);
                status::RuntimeToken::Current(expires)
            }
        }
    };

    let mut applied_deployment = false;
    let mut workload_observed = false;
    // Children whose names are held by objects that are not this Host's: left alone, and the
    // host is not deployed (its pods would run as, or be reached through, someone else's).
    let mut conflicts = Vec::new();
    // Children kube-apiserver refused (invalid, forbidden): said in `Ready`, retried, and no
    // reason to stop applying the others.
    let mut refused = Vec::new();
    for child in wanted_children {
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

    let revoked: Vec<String> = kept
        .plan
        .revoked()
        .iter()
        .map(|s| revoked_note(s))
        .collect();
    if !revoked.is_empty() && status::ready_reason(previous) != Some(status::SESSION_REVOKED) {
        publish(
            ctx,
            host,
            EventType::Warning,
            status::SESSION_REVOKED,
            "KeepSessions",
            status::revoked_message(&revoked),
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
        selected,
        runtime_token: runtime_token.clone(),
        servers: granted.len(),
        workload_observed,
        sessions: status::SessionsObserved {
            issued: kept
                .plan
                .status
                .iter()
                .filter(|s| s.phase == "Active")
                .count()
                + kept.issued,
            revoked,
            refused: kept.refused.clone(),
        },
    };
    let generation = host.metadata.generation;
    let wanted = status::conditions(
        previous,
        generation,
        &observed,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if !status::current(previous, generation, &wanted)
        || previous.map(|p| &p.sessions) != Some(&kept.status)
    {
        let body = json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Host",
            "status": {
                "observedGeneration": generation,
                "conditions": wanted,
                "sessions": kept.status,
            },
        });
        let api = Api::<Host>::namespaced(client, namespace);
        children::apply_status(&api, FIELD_MANAGER, &name, &body).await?;
        ctx.metrics.write(CONTROLLER, "HostStatus");
    }
    // A name held by another object: look again in 10 s (its removal wakes nothing here). Not
    // observed yet: soon (the Deployment's status change also wakes us).
    let next = if name_conflict {
        children::NAME_CONFLICT_RETRY
    } else if any_refused || !kept.refused.is_empty() {
        REFUSED_RETRY
    } else if kept.held {
        HELD_RETRY
    } else if workload_observed {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(30)
    };
    // Back when the next session successor is due.
    let refresh = match (&runtime_token, &ctx.signer) {
        (status::RuntimeToken::Current(expires), Some(signer)) => {
            Some(signer.next_refresh(*expires, k8s_openapi::jiff::Timestamp::now()))
        }
        _ => None,
    };
    let next = refresh.map_or(next, |r| r.min(next));
    let roll = kept.plan.next_roll.map(|t| {
        let left = t.duration_since(k8s_openapi::jiff::Timestamp::now());
        Duration::from_secs(left.as_secs().max(1) as u64)
    });
    Ok(Action::requeue(roll.map_or(next, |r| r.min(next))))
}

/// A Namespace's labels, from the watch cache (None while unknown).
fn namespace_labels(
    ctx: &Ctx,
    namespace: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    ctx.namespaces
        .get(&ObjectRef::new(namespace))
        .map(|n| n.metadata.labels.clone().unwrap_or_default())
}

/// What keeping a Host's sessions did.
struct Kept {
    plan: sessions::Plan,
    /// Sessions issued by this reconcile.
    issued: usize,
    /// Issuances the aggregated API refused (`server: its message`).
    refused: Vec<String>,
    /// The status entries, with the names of sessions issued now.
    status: Vec<HostSessionStatus>,
    /// A deleted revoked session is held by its standing Revocation: nothing watched here
    /// changes when that Revocation is withdrawn, so the reconcile comes back to look.
    held: bool,
}

/// Issues, deletes and reports the Host's sessions by [`sessions::plan`].
async fn keep_sessions(
    ctx: &Ctx,
    host: &Host,
    granted: &[&MCPServer],
    teams: &[String],
    context_name: &str,
) -> Result<Kept, ReconcileError> {
    let uid = host.metadata.uid.clone().unwrap_or_default();
    let live = Api::<AccessSession>::all(ctx.client.clone())
        .list(&ListParams::default().labels(&sessions::selector(&uid)))
        .await?
        .items;
    let now = k8s_openapi::jiff::Timestamp::now();
    let held = still_revoked(ctx, host, &live, now).await?;
    let plan = sessions::plan(granted, teams, &live, &held, now);
    for gone in &plan.delete {
        let api = Api::<AccessSession>::namespaced(ctx.client.clone(), &gone.namespace);
        if children::delete_exact(&api, &gone.name, gone.uid.clone()).await? {
            ctx.metrics.write(CONTROLLER, "SessionDelete");
        }
    }
    let mut status = plan.status.clone();
    let mut refused = Vec::new();
    let mut issued = 0;
    for want in &plan.issue {
        let session = session_object(host, want, teams, context_name, now)?;
        let api = Api::<AccessSession>::namespaced(ctx.client.clone(), &want.namespace);
        match api.create(&PostParams::default(), &session).await {
            Ok(made) => {
                issued += 1;
                ctx.metrics.write(CONTROLLER, "SessionCreate");
                if let Some(entry) = status
                    .iter_mut()
                    .find(|s| s.namespace == want.namespace && s.server == want.server)
                {
                    if entry.phase != "Active" {
                        entry.session = made.metadata.name.clone();
                        entry.phase = "Active".into();
                    }
                }
            }
            // Refused (a fenced server: 409, not allowed: 403, invalid: 422): said in the
            // status and tried again; any other failure fails the reconcile.
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 409 | 422) => {
                refused.push(format!("{}/{}: {}", want.namespace, want.server, s.message));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Kept {
        plan,
        issued,
        refused,
        status,
        held: !held.is_empty(),
    })
}

/// The entries of the Host's status that showed a session revoked whose session is gone
/// while the Revocation they named still stands against it (one GET per such entry, only
/// then). Deleting a revoked session (whoever may delete sessions) is no withdrawal: without
/// this, the plan would issue a successor that no Revocation covers.
async fn still_revoked(
    ctx: &Ctx,
    host: &Host,
    live: &[AccessSession],
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Vec<HostSessionStatus>, ReconcileError> {
    let mut held = Vec::new();
    for entry in host.status.iter().flat_map(|s| &s.sessions) {
        let (Some(session), Some(revocation)) = (&entry.session, &entry.revocation) else {
            continue;
        };
        let gone = !live.iter().any(|s| {
            s.namespace().as_deref() == Some(entry.namespace.as_str()) && s.name_any() == *session
        });
        // A revocation without a Revocation object (shown as "(cause)": an agent
        // deactivated) is the session's own state, which goes with it.
        let a_name = apis::validation::is_dns1123_subdomain(revocation);
        if entry.phase != "Revoked" || !gone || !a_name {
            continue;
        }
        let api = Api::<Revocation>::namespaced(ctx.client.clone(), &entry.namespace);
        let stands = api.get_opt(revocation).await?.is_some_and(|r| {
            r.spec.target.session.as_deref() == Some(session.as_str())
                && apis::locks::stands(&r, now)
        });
        if stands {
            held.push(entry.clone());
        }
    }
    Ok(held)
}

/// The AccessSession for one (Host, server). Owned by the Host when they share a namespace (an
/// owner reference cannot cross namespaces; the finalizer covers both).
fn session_object(
    host: &Host,
    want: &sessions::Issue,
    teams: &[String],
    context_name: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<AccessSession, ReconcileError> {
    let host_ns = children::namespace_of(host)?;
    let name = host.name_any();
    // Session names are reserved forever once used: a successor needs a new one. A digest of
    // the Host, the server and the instant is unique and tells nothing guessable about either.
    let seed = format!(
        "{}/{}/{}",
        host.metadata.uid.as_deref().unwrap_or_default(),
        want.server_uid,
        now.as_nanosecond()
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, seed.as_bytes());
    let suffix: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let session_name =
        desired::fit_label(&format!("{name}-{}", want.server), &format!("-{suffix}"));
    let mut labels = std::collections::BTreeMap::from([
        (
            children::MANAGED_BY_LABEL.to_string(),
            children::MANAGED_BY.to_string(),
        ),
        (HOST_LABEL.to_string(), desired::host_label(&name)),
        (
            sessions::HOST_UID_LABEL.to_string(),
            host.metadata.uid.clone().unwrap_or_default(),
        ),
        (
            sessions::HOST_NAMESPACE_LABEL.to_string(),
            host_ns.to_string(),
        ),
    ]);
    labels.retain(|_, v| !v.is_empty());
    let owner = (want.namespace == host_ns).then(|| {
        vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "mcp-runtime.dev/v1alpha1".into(),
                kind: "Host".into(),
                name: name.clone(),
                uid: host.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]
    });
    let expires = now + sessions::REQUESTED_TTL;
    let value = json!({
        "apiVersion": "access.mcp-runtime.dev/v1alpha1",
        "kind": "AccessSession",
        "metadata": {
            "name": session_name,
            "namespace": want.namespace,
            "labels": labels,
            "ownerReferences": owner,
        },
        "spec": {
            "server": {"name": want.server, "uid": want.server_uid},
            "subject": {"user": sessions::subject(host_ns, &name)},
            "teams": teams,
            "grant": {"name": format!("context/{context_name}")},
            "expiresAt": expires.to_string(),
        },
    });
    serde_json::from_value(value).map_err(|e| ReconcileError::Encode("AccessSession", e))
}

/// Deletes every session of a Host (all namespaces).
async fn delete_sessions(ctx: &Ctx, host: &Host) -> Result<(), ReconcileError> {
    let uid = host.metadata.uid.clone().unwrap_or_default();
    let live = Api::<AccessSession>::all(ctx.client.clone())
        .list_metadata(&ListParams::default().labels(&sessions::selector(&uid)))
        .await?
        .items;
    for s in live {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let api = Api::<AccessSession>::namespaced(ctx.client.clone(), &ns);
        if children::delete_exact(&api, &s.name_any(), s.metadata.uid.clone()).await? {
            ctx.metrics.write(CONTROLLER, "SessionDelete");
        }
    }
    Ok(())
}

/// Adds or removes the sessions finalizer, with the Host's resourceVersion as precondition
/// (another writer's finalizers are never lost: a conflict retries the reconcile).
async fn set_finalizer(ctx: &Ctx, host: &Host, present: bool) -> Result<(), ReconcileError> {
    let mut finalizers: Vec<String> = host
        .finalizers()
        .iter()
        .filter(|f| *f != sessions::FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(sessions::FINALIZER.into());
    }
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": host.resource_version(),
        }
    });
    let api = Api::<Host>::namespaced(ctx.client.clone(), children::namespace_of(host)?);
    match api
        .patch(
            &host.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            ctx.metrics.write(CONTROLLER, "HostFinalizer");
            Ok(())
        }
        // Gone already (removing): nothing left to hold.
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn revoked_note(s: &HostSessionStatus) -> String {
    format!(
        "session {}/{} for server {} revoked by Revocation {}",
        s.namespace,
        s.session.as_deref().unwrap_or("?"),
        s.server,
        s.revocation.as_deref().unwrap_or("?")
    )
}

/// How often a Host with a refused child tries again (what made kube-apiserver refuse, a
/// StorageClass or an admission policy, may change without waking the Host).
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// How often a Host whose deleted revoked session is held looks whether the Revocation was
/// withdrawn (no watch of Revocations wakes it).
const HELD_RETRY: Duration = Duration::from_secs(30);

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

/// Sessions of Hosts that no longer exist (a finalizer removed by hand, or a Host deleted while
/// the sessions API was down): deleted, whatever their number, since deleting a session only
/// ever narrows access. `sessions` were listed before `hosts`, so a Host created meanwhile
/// keeps its sessions.
async fn sweep_sessions(
    ctx: &Ctx,
    sessions: Vec<PartialObjectMeta<AccessSession>>,
    hosts: &[LiveHost],
) -> Result<(), ReconcileError> {
    for s in sessions {
        let owner = s.labels().get(sessions::HOST_UID_LABEL).cloned();
        if hosts.iter().any(|h| Some(&h.uid) == owner.as_ref()) {
            continue;
        }
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let api = Api::<AccessSession>::namespaced(ctx.client.clone(), &ns);
        if children::delete_exact(&api, &s.name_any(), s.metadata.uid.clone()).await? {
            ctx.metrics.write(CONTROLLER, "SessionDelete");
            tracing::info!(
                namespace = ns,
                name = s.name_any(),
                "deleted the session of a Host that no longer exists"
            );
        }
    }
    Ok(())
}

/// One sweep: the children are listed before the Hosts, so a Host created meanwhile has
/// none listed and none of its objects can look orphaned.
async fn sweep_orphans(ctx: &Ctx) -> Result<(), ReconcileError> {
    let selector = children::managed_selector(&[HOST_LABEL]);
    let mut live = Vec::new();
    for kind in desired::SWEPT {
        live.extend(list_children(&ctx.client, kind, &selector).await?);
    }
    let host_sessions = Api::<AccessSession>::all(ctx.client.clone())
        .list_metadata(&ListParams::default().labels(&format!(
            "{},{}",
            children::managed_selector(&[]),
            sessions::HOST_UID_LABEL
        )))
        .await?
        .items;
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
    sweep_sessions(ctx, host_sessions, &hosts).await?;
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
    fn a_hosts_session_names_it_and_is_owned_only_beside_it() {
        let mut host = Host::new(
            "agent",
            serde_json::from_value(serde_json::json!({
                "contextRef": {"name": "dev"}, "image": "img"
            }))
            .unwrap(),
        );
        host.metadata.namespace = Some("team".into());
        host.metadata.uid = Some("host-uid".into());
        let teams = vec!["payments".to_string()];
        let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let want = |ns: &str| sessions::Issue {
            namespace: ns.into(),
            server: "github".into(),
            server_uid: "srv-uid".into(),
        };
        let same = session_object(&host, &want("team"), &teams, "dev", now).unwrap();
        let name = same.metadata.name.clone().unwrap();
        assert!(
            name.starts_with("agent-github-") && name.len() <= 63,
            "{name}"
        );
        assert_eq!(same.metadata.namespace.as_deref(), Some("team"));
        let owners = same.metadata.owner_references.clone().unwrap();
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Host", "host-uid")
        );
        let labels = same.metadata.labels.clone().unwrap();
        assert_eq!(labels[sessions::HOST_UID_LABEL], "host-uid");
        assert_eq!(labels[sessions::HOST_NAMESPACE_LABEL], "team");
        assert_eq!(labels[children::MANAGED_BY_LABEL], children::MANAGED_BY);
        assert_eq!(
            same.spec.subject.as_ref().map(|s| s.user.as_str()),
            Some("system:serviceaccount:team:agent-host")
        );
        assert_eq!(same.spec.teams, teams);
        assert_eq!(same.spec.server.uid, "srv-uid");
        assert_eq!(
            same.spec.expires_at.as_ref().map(|t| t.0.as_second()),
            Some(1_800_000_000 + 24 * 3600)
        );
        // In the server's other namespace: no owner reference (the garbage collector would
        // look for the Host there and delete the session); the finalizer covers it.
        let other = session_object(&host, &want("tools"), &teams, "dev", now).unwrap();
        assert!(other.metadata.owner_references.is_none_or(|o| o.is_empty()));
        // A later successor gets another name: names are reserved forever once used.
        let later = session_object(
            &host,
            &want("team"),
            &teams,
            "dev",
            now + k8s_openapi::jiff::SignedDuration::from_secs(1),
        )
        .unwrap();
        assert_ne!(later.metadata.name, same.metadata.name);
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
