//! MCPServer → its workload (DESIGN §6): a ServiceAccount for the gateway's token, a
//! ConfigMap with the sync CA, the Service on the gateway port and the Deployment running the
//! MCP server behind the `mcp-access-gateway` proxy. The Secret and the image allow-list are
//! checked first; status conditions and Events say what happened.
//!
//! [`desired`] and [`status`] are pure; this file is the I/O: read, compare, apply only what
//! differs (a no-op reconcile makes no write), under one field manager.

pub mod desired;
pub mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::runtime::MCPServer;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use crate::children::{self, ChildKind, ReconcileError};
use crate::metrics::{ConditionLabels, ReconcileMetrics};
use crate::netpol::settings::RuntimeIsolation;
use desired::WorkloadSettings;
use status::{EgressGate, ImagePolicy, ImagePolicyMode, IsolationGate, SecretCheck, WorkloadState};

/// The field manager of everything this controller applies (children and its conditions).
/// Distinct from the retirement controller's, so applying our conditions never removes its
/// `Retiring` condition.
pub const FIELD_MANAGER: &str = "mcp-access-controllers-mcpserver";
const CONTROLLER: &str = "mcpserver";

/// Flags of this controller.
#[derive(Debug, clap::Args)]
#[group(id = "mcpserver")]
pub struct Args {
    /// Image of the `mcp-access-gateway` proxy put in every MCPServer's Pod (its only exposed
    /// port).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_IMAGE")]
    pub gateway_image: String,
    /// The gateway sync URL the gateways use (the apiserver's 8085 Service), `https://` only.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_SYNC_URL")]
    pub gateway_sync_url: String,
    /// PEM CA bundle that verifies the sync listener; copied into a ConfigMap per server.
    #[arg(long, env = "MCP_ACCESS_GATEWAY_SYNC_CA_FILE")]
    pub gateway_sync_ca_file: PathBuf,
    /// Port the gateway listens on in the Pod: the Service's port, the one port policies open,
    /// and part of every server's resource URI (`http://<name>.<namespace>.svc:<port>`).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_PORT", default_value_t = 8086)]
    pub gateway_port: u16,
    /// Lifetime of the gateway's projected token (Kubernetes' minimum is 600).
    #[arg(
        long,
        env = "MCP_ACCESS_GATEWAY_TOKEN_EXPIRATION_SECONDS",
        default_value_t = 600
    )]
    pub gateway_token_expiration_seconds: i64,
    /// Allowed image prefixes of MCPServers and Hosts (repeat or comma-separate). None: every
    /// image is allowed.
    #[arg(
        long = "image-allow-prefix",
        env = "MCP_ACCESS_IMAGE_ALLOW_PREFIXES",
        value_delimiter = ','
    )]
    pub image_allow_prefixes: Vec<String>,
    /// What a disallowed MCPServer or Host image gets: `audit` (Warning Event and condition,
    /// deployed) or `enforce` (not deployed).
    #[arg(long, env = "MCP_ACCESS_IMAGE_POLICY", value_enum, default_value_t = ImagePolicyMode::Enforce)]
    pub image_policy: ImagePolicyMode,
}

/// Settings that cannot work stop startup, naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("--gateway-sync-url must be an https:// URL")]
    PlainSyncUrl,
    #[error("--gateway-sync-ca-file {0}: {1}")]
    Ca(PathBuf, String),
    #[error("--gateway-token-expiration-seconds must be at least 600 (Kubernetes' minimum)")]
    TokenExpiration,
    #[error("--gateway-port must not be 0")]
    Port,
}

impl Args {
    fn settings(&self) -> Result<(WorkloadSettings, ImagePolicy), SettingsError> {
        if !self.gateway_sync_url.starts_with("https://") {
            return Err(SettingsError::PlainSyncUrl);
        }
        let pem = std::fs::read_to_string(&self.gateway_sync_ca_file)
            .map_err(|e| SettingsError::Ca(self.gateway_sync_ca_file.clone(), e.to_string()))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(SettingsError::Ca(
                self.gateway_sync_ca_file.clone(),
                "holds no PEM certificate".into(),
            ));
        }
        if self.gateway_token_expiration_seconds < 600 {
            return Err(SettingsError::TokenExpiration);
        }
        if self.gateway_port == 0 {
            return Err(SettingsError::Port);
        }
        Ok((
            WorkloadSettings {
                gateway_image: self.gateway_image.clone(),
                sync_url: self.gateway_sync_url.clone(),
                sync_ca_pem: pem,
                gateway_port: i32::from(self.gateway_port),
                token_expiration_seconds: self.gateway_token_expiration_seconds,
            },
            self.image_policy(),
        ))
    }

    /// The image allow-list, which holds for MCPServers and Hosts alike.
    pub fn image_policy(&self) -> ImagePolicy {
        ImagePolicy {
            prefixes: self
                .image_allow_prefixes
                .iter()
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
            mode: self.image_policy,
        }
    }
}

struct Context {
    client: kube::Client,
    settings: WorkloadSettings,
    policy: ImagePolicy,
    isolation: RuntimeIsolation,
    recorder: Recorder,
    metrics: ReconcileMetrics,
    store: Store<MCPServer>,
}

/// The controller, ready to run (nothing is watched until the future is polled).
pub fn controller(
    client: kube::Client,
    args: Args,
    isolation: RuntimeIsolation,
    metrics: ReconcileMetrics,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    let (settings, policy) = args.settings()?;
    metrics.declare(CONTROLLER, &ReconcileError::REASONS);
    Ok(async move {
        let managed = watcher::Config::default().labels(&children::managed_selector(&[]));
        let controller = Controller::new(
            Api::<MCPServer>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(16));
        let store = controller.store();
        let by_secret = store.clone();
        // A Secret (metadata only: its values are never held here) re-queues the MCPServers
        // of its namespace that reference it, so creating a missing Secret deploys at once.
        let secrets = Api::<PartialObjectMeta<Secret>>::all(client.clone());
        let reporter = Reporter {
            controller: "mcp-access-controllers".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let context = Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
            settings,
            policy,
            isolation,
            metrics,
            store,
        });
        controller
            .owns(Api::<Deployment>::all(client.clone()), managed.clone())
            .owns(Api::<Service>::all(client.clone()), managed.clone())
            .owns(Api::<ServiceAccount>::all(client.clone()), managed.clone())
            .owns(Api::<ConfigMap>::all(client.clone()), managed)
            .watches(secrets, watcher::Config::default(), move |secret| {
                let ns = secret.namespace();
                let name = secret.name_any();
                by_secret
                    .state()
                    .into_iter()
                    .filter(|s| {
                        s.namespace() == ns
                            && s.spec.env_secret.as_ref().is_some_and(|e| e.name == name)
                    })
                    .map(|s| ObjectRef::from_obj(&*s))
                    .collect::<Vec<_>>()
            })
            .run(reconcile, error_policy, context)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "mcpserver reconcile");
                }
            })
            .await;
        anyhow::bail!("the MCPServer watch ended")
    })
}

fn error_policy(server: Arc<MCPServer>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(CONTROLLER, error.reason());
    tracing::warn!(
        namespace = server.namespace().unwrap_or_default(),
        name = server.name_any(),
        error = %error,
        "mcpserver reconcile failed"
    );
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(server: Arc<MCPServer>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_server(&server, &ctx).await;
    ctx.metrics
        .observe(CONTROLLER, started.elapsed().as_secs_f64());
    update_condition_gauges(&ctx);
    result
}

async fn reconcile_server(server: &MCPServer, ctx: &Context) -> Result<Action, ReconcileError> {
    // A server being deleted belongs to the retirement controller: nothing is re-applied.
    if server.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = children::namespace_of(server)?;
    let client = ctx.client.clone();

    let secrets = match &server.spec.env_secret {
        None => SecretCheck::NotReferenced,
        Some(reference) => {
            let secret = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(&reference.name)
                .await?;
            let keys = secret.map(|s| s.data.unwrap_or_default().into_keys().collect::<Vec<_>>());
            SecretCheck::of(
                Some(reference),
                keys.as_ref().map(|k| k.iter().map(String::as_str)),
            )
        }
    };
    let image = match &server.spec.image {
        Some(image) => ctx.policy.check(image),
        None => status::ImageCheck::Remote,
    };
    let previous = server.status.as_ref();
    let egress = EgressGate::of(
        server.spec.external_egress().len(),
        previous,
        server.metadata.generation,
    );

    let isolation = IsolationGate::of(namespace, &ctx.isolation);

    let mut applied_deployment = false;
    let workload = if secrets.resolved() && image.deployable() && egress.open() && isolation.open()
    {
        let mut deployment = Value::Null;
        // Children whose names are held by objects that are not this server's: left alone,
        // and no Deployment (its pods would run as, or be reached through, someone else's).
        let mut conflicts = Vec::new();
        for child in desired::children(server, &ctx.settings)? {
            if child.kind == ChildKind::Deployment && !conflicts.is_empty() {
                continue;
            }
            let applied = children::apply_child(&client, namespace, FIELD_MANAGER, &child).await?;
            let Some(applied) = applied else {
                conflicts.push(format!("{} {}", child.kind.as_str(), child.name));
                continue;
            };
            if applied.written {
                ctx.metrics.write(CONTROLLER, child.kind.as_str());
            }
            if child.kind == ChildKind::Deployment {
                applied_deployment = applied.written;
                deployment = applied.live;
            }
        }
        let generation = deployment["metadata"]["generation"].as_i64();
        let observed = deployment["status"]["observedGeneration"].as_i64();
        match (generation, observed) {
            _ if !conflicts.is_empty() => WorkloadState::NameConflict(conflicts),
            (Some(g), Some(o)) if o >= g => WorkloadState::Observed,
            _ => WorkloadState::Pending,
        }
    } else {
        WorkloadState::Blocked
    };

    // Events on transitions only, so a no-op reconcile publishes nothing.
    if let WorkloadState::NameConflict(conflicts) = &workload {
        let before = previous.and_then(|p| status::reason_of(&p.conditions, status::READY));
        if before != Some(status::NAME_CONFLICT) {
            publish(
                ctx,
                server,
                EventType::Warning,
                status::NAME_CONFLICT,
                "Apply",
                children::conflict_message("MCPServer", conflicts),
            )
            .await?;
        }
    }
    if applied_deployment {
        publish(
            ctx,
            server,
            EventType::Normal,
            "Deployed",
            "Apply",
            match (&server.spec.image, &server.spec.remote) {
                (Some(image), _) => format!(
                    "Deployment {} applied with image {image}",
                    server.name_any()
                ),
                (None, Some(remote)) => format!(
                    "Deployment {} applied, proxying to {}",
                    server.name_any(),
                    remote.url
                ),
                (None, None) => format!("Deployment {} applied", server.name_any()),
            },
        )
        .await?;
    }
    if !secrets.resolved()
        && status::condition_status(previous, status::SECRETS_RESOLVED) != Some("False")
    {
        let note = match &secrets {
            SecretCheck::NotFound { name } => format!("Secret {name} not found: not deployed"),
            SecretCheck::KeysMissing { name, missing } => format!(
                "Secret {name} lacks keys {}: not deployed",
                missing.join(", ")
            ),
            _ => String::new(),
        };
        publish(
            ctx,
            server,
            EventType::Warning,
            "SecretMissing",
            "ValidateSecret",
            note,
        )
        .await?;
    }
    if let Some(note) = image.refusal() {
        if status::condition_status(previous, status::IMAGE_ALLOWED) != Some("False") {
            publish(
                ctx,
                server,
                EventType::Warning,
                "ImageNotAllowed",
                "CheckImage",
                note,
            )
            .await?;
        }
    }

    let generation = server.metadata.generation;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let wanted = status::conditions(
        previous, generation, &secrets, &image, &egress, &isolation, &workload, now,
    );
    if !status::status_current(previous, generation, &wanted) {
        let body = json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "status": {"observedGeneration": generation, "conditions": wanted},
        });
        let api = Api::<MCPServer>::namespaced(client, namespace);
        children::apply_status(&api, FIELD_MANAGER, &server.name_any(), &body).await?;
        ctx.metrics.write(CONTROLLER, "MCPServerStatus");
    }
    Ok(Action::requeue(match workload {
        // Their removal wakes nothing: look again soon.
        WorkloadState::NameConflict(_) => children::NAME_CONFLICT_RETRY,
        _ => Duration::from_secs(600),
    }))
}

async fn publish(
    ctx: &Context,
    server: &MCPServer,
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
    ctx.recorder
        .publish(&event, &server.object_ref(&()))
        .await?;
    ctx.metrics.write(CONTROLLER, "Event");
    Ok(())
}

/// MCPServers by condition and status, counted from the controller's cache.
fn update_condition_gauges(ctx: &Context) {
    let mut counts = std::collections::HashMap::<(String, String), i64>::new();
    for server in ctx.store.state() {
        for c in server.status.iter().flat_map(|s| s.conditions.iter()) {
            *counts
                .entry((c.type_.clone(), c.status.clone()))
                .or_default() += 1;
        }
    }
    for condition in status::OWNED {
        for s in ["True", "False"] {
            let n = counts
                .get(&(condition.to_string(), s.to_string()))
                .copied()
                .unwrap_or(0);
            ctx.metrics
                .servers
                .get_or_create(&ConditionLabels {
                    condition: condition.into(),
                    status: s.into(),
                })
                .set(n);
        }
    }
}
