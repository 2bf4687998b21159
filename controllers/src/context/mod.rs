//! Context status: for every Context, where each MCPServer it names stands (Ready, NotReady,
//! Missing, Disabled, NotAllowed), how many are Ready, and a `Ready` condition, so
//! `kubectl get contexts` says what its hosts can use. A Context is reconciled again when it
//! changes, when an MCPServer it names changes, and when its namespace's labels change (a
//! server's `allowedContexts` may select by them).
//!
//! [`status`] is pure; this file is the I/O: read the servers and the namespace, write the
//! status only when it differs, publish Events on transitions. Nothing else is written.

pub mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::runtime::{Context, MCPServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::children::{self, ReconcileError};
use crate::host::grants;
use crate::metrics::ReconcileMetrics;
use status::Notice;

/// The field manager of the Context status (no other controller writes it).
pub const FIELD_MANAGER: &str = "mcp-access-controllers-context";
const CONTROLLER: &str = "context";

/// A resync with nothing changed: the watches say every change that matters.
const RESYNC: Duration = Duration::from_secs(300);

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    metrics: ReconcileMetrics,
}

/// The controller, polled by the leader (nothing is watched until the future is polled).
pub fn controller(
    client: kube::Client,
    metrics: ReconcileMetrics,
) -> impl std::future::Future<Output = anyhow::Result<()>> {
    metrics.declare(CONTROLLER, &ReconcileError::API_REASONS);
    async move {
        let reporter = Reporter {
            controller: "mcp-access-controllers".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let ctx = Arc::new(Ctx {
            recorder: Recorder::new(client.clone(), reporter),
            client: client.clone(),
            metrics,
        });
        let controller = Controller::new(
            Api::<Context>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(8));
        let contexts = controller.store();
        let (by_server, by_namespace) = (contexts.clone(), contexts);
        controller
            .watches(
                Api::<MCPServer>::all(client.clone()),
                watcher::Config::default(),
                move |server| {
                    let key = (server.namespace().unwrap_or_default(), server.name_any());
                    contexts_where(&by_server, |c| grants::granted_refs(c).contains(&key))
                },
            )
            // Metadata only: a namespace's labels decide a `Selector` consent; only Contexts
            // naming a server of another namespace can change with them.
            .watches(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
                move |namespace| {
                    let ns = namespace.name_any();
                    contexts_where(&by_namespace, |c| {
                        c.namespace().as_deref() == Some(ns.as_str())
                            && grants::granted_refs(c).iter().any(|(s, _)| *s != ns)
                    })
                },
            )
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "context reconcile");
                }
            })
            .await;
        anyhow::bail!("the Context watch ended")
    }
}

fn contexts_where(
    store: &Store<Context>,
    pick: impl Fn(&Context) -> bool,
) -> Vec<ObjectRef<Context>> {
    store
        .state()
        .into_iter()
        .filter(|c| pick(c))
        .map(|c| ObjectRef::from_obj(&*c))
        .collect()
}

fn error_policy(context: Arc<Context>, error: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.error(CONTROLLER, error.reason());
    tracing::warn!(
        namespace = context.namespace().unwrap_or_default(),
        name = context.name_any(),
        error = %error,
        "context reconcile failed"
    );
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(context: Arc<Context>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_one(&context, &ctx).await;
    ctx.metrics
        .observe(CONTROLLER, started.elapsed().as_secs_f64());
    result
}

async fn reconcile_one(context: &Context, ctx: &Ctx) -> Result<Action, ReconcileError> {
    // A Context being deleted grants nothing and will not be read again.
    if context.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = children::namespace_of(context)?;
    let client = ctx.client.clone();
    let refs = grants::granted_refs(context);

    // The namespace's labels, only when a server of another namespace could consent by them.
    let labels: Option<BTreeMap<String, String>> =
        if refs.iter().any(|(ns, _)| ns.as_str() != namespace) {
            Api::<Namespace>::all(client.clone())
                .get_metadata_opt(namespace)
                .await?
                .map(|n| n.metadata.labels.unwrap_or_default())
        } else {
            None
        };
    let mut live: Vec<MCPServer> = Vec::with_capacity(refs.len());
    for (ns, name) in &refs {
        if let Some(server) = Api::<MCPServer>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
        {
            live.push(server);
        }
    }
    let servers = status::servers(context, labels.as_ref(), |ns, name| {
        live.iter()
            .find(|s| s.namespace().as_deref() == Some(ns) && s.name_any() == name)
    });

    let previous = context.status.as_ref();
    let wanted = status::status(
        previous,
        context.metadata.generation,
        servers,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    // Events first: were the status write to fail, the retry publishes them again rather
    // than never.
    for notice in status::notices(previous, &wanted) {
        let (type_, related) = match &notice {
            Notice::ServerUnavailable {
                namespace, name, ..
            } => {
                let live = live
                    .iter()
                    .find(|s| s.namespace().as_deref() == Some(namespace) && s.name_any() == *name);
                (EventType::Warning, Some(server_ref(namespace, name, live)))
            }
            Notice::Ready { .. } => (EventType::Normal, None),
        };
        let event = Event {
            type_,
            reason: notice.reason().into(),
            note: Some(notice.note().to_string()),
            action: notice.action().into(),
            secondary: related,
        };
        ctx.recorder
            .publish(&event, &context.object_ref(&()))
            .await?;
        ctx.metrics.write(CONTROLLER, "Event");
    }
    if !status::current(previous, &wanted) {
        let body = json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Context",
            "status": wanted,
        });
        let api = Api::<Context>::namespaced(client, namespace);
        children::apply_status(&api, FIELD_MANAGER, &context.name_any(), &body).await?;
        ctx.metrics.write(CONTROLLER, "ContextStatus");
    }
    Ok(Action::requeue(RESYNC))
}

/// The related object of a server's Event: the live one (with its uid) or, when it is missing,
/// the one the Context names. Without a resourceVersion: the same server is the same related
/// object from one Event to the next.
fn server_ref(namespace: &str, name: &str, live: Option<&MCPServer>) -> ObjectReference {
    match live {
        Some(server) => ObjectReference {
            resource_version: None,
            ..server.object_ref(&())
        },
        None => ObjectReference {
            api_version: Some(MCPServer::api_version(&()).into_owned()),
            kind: Some(MCPServer::kind(&()).into_owned()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        },
    }
}
