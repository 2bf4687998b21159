//! `status`: one look at MCP Access as the cluster sees it. Every figure names its source:
//!
//! - APIService `v1alpha1.access.mcp-runtime.dev`: its conditions, as kube-apiserver's
//!   aggregator writes them after probing the server.
//! - apiserver: the Service the APIService points at. A Deployment of that name (deploy/base)
//!   gives ready replicas and the image (its tag is the version); an ExternalName Service (the
//!   local cluster of `hack/up.sh`, where the server is a process on the host) has no Pods to
//!   read, so readiness is the APIService's and the version is unknown.
//! - controllers: their leader-election Lease (held and renewed in time means a leader runs)
//!   and, when present, their Deployment (ready replicas, image).
//! - sessions by phase per namespace and MCPServers by condition: lists of the API.
//! - change feed: the head is the resourceVersion of that session list (`epoch << 40 | seq`,
//!   `apiserver/src/store/rv.rs`); the oldest resourceVersion still served is found by asking
//!   the server — an Exact list at a position older than the retained log is 410 Expired, one
//!   inside it is served — bisecting between 0 and the head (about log2(head) one-item lists).

use std::collections::BTreeMap;
use std::future::Future;

use apis::types::{AccessSession, SessionPhase};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DynamicObject, ListParams, VersionMatch};
use serde::Serialize;

use crate::cli::StatusArgs;
use crate::client::Context;
use crate::error::{CliError, Result};
use crate::render::{self, Table};
use crate::revoke::mcpserver_resource;

/// The APIService MCP Access registers.
pub const API_SERVICE: &str = "v1alpha1.access.mcp-runtime.dev";
const SEQ_BITS: u32 = 40;

/// A part of the report, or why it could not be read.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Section<T> {
    Ok(T),
    Err { error: String },
}

impl<T> Section<T> {
    fn of(result: Result<T>) -> Self {
        match result {
            Ok(t) => Self::Ok(t),
            Err(e) => Self::Err {
                error: e.to_string(),
            },
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub api_service: Section<ApiServiceState>,
    pub components: Vec<Component>,
    /// `None` for all namespaces.
    pub namespace: Option<String>,
    pub sessions: Section<Vec<NamespacePhases>>,
    pub mcp_servers: Section<ServersByCondition>,
    pub change_feed: Section<ChangeFeed>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServiceState {
    pub name: String,
    pub available: String,
    pub reason: String,
    pub message: String,
    /// `namespace/name:port` of the Service it points at.
    pub service: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    pub name: String,
    /// True, False or Unknown.
    pub ready: String,
    pub version: String,
    /// Where the figures come from.
    pub source: String,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NamespacePhases {
    pub namespace: String,
    pub active: u64,
    pub pending_enrollment: u64,
    pub revoked: u64,
    pub expired: u64,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConditionCount {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(rename = "true")]
    pub true_: u64,
    #[serde(rename = "false")]
    pub false_: u64,
    pub unknown: u64,
    /// Servers without this condition.
    pub not_set: u64,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServersByCondition {
    pub total: u64,
    pub conditions: Vec<ConditionCount>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChangeFeed {
    pub epoch: u32,
    pub head_seq: u64,
    pub head_resource_version: String,
    /// The oldest position a list (and so a watch or continue token) is still served at.
    pub oldest_served_seq: u64,
    pub oldest_served_resource_version: String,
    /// Changes after the oldest served position: `head_seq - oldest_served_seq`.
    pub retained_events: u64,
}

/// `(epoch, seq)` of a resourceVersion, `None` when it is not MCP Access's shape.
pub fn decode_rv(rv: &str) -> Option<(u32, u64)> {
    if rv.is_empty() || (rv.len() > 1 && rv.starts_with('0')) {
        return None;
    }
    let v: u64 = rv.parse().ok()?;
    let epoch = u32::try_from(v >> SEQ_BITS).ok().filter(|e| *e > 0)?;
    Some((epoch, v & ((1 << SEQ_BITS) - 1)))
}

pub fn encode_rv(epoch: u32, seq: u64) -> String {
    ((u64::from(epoch) << SEQ_BITS) | seq).to_string()
}

/// The smallest position in `0..=head` that `served` accepts, given that `head` is served
/// and that served positions form a suffix (everything from the oldest retained on).
pub async fn oldest_served<F, Fut>(head: u64, mut served: F) -> Result<u64>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    if served(0).await? {
        return Ok(0);
    }
    let (mut lo, mut hi) = (0u64, head);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if served(mid).await? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// Counts per namespace and phase, namespaces in order.
pub fn phases_by_namespace(sessions: &[AccessSession]) -> Vec<NamespacePhases> {
    let mut by_ns: BTreeMap<String, NamespacePhases> = BTreeMap::new();
    for s in sessions {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let row = by_ns.entry(ns.clone()).or_insert_with(|| NamespacePhases {
            namespace: ns,
            ..NamespacePhases::default()
        });
        match s.phase() {
            SessionPhase::Active => row.active += 1,
            SessionPhase::PendingEnrollment => row.pending_enrollment += 1,
            SessionPhase::Revoked => row.revoked += 1,
            SessionPhase::Expired => row.expired += 1,
        }
    }
    by_ns.into_values().collect()
}

/// Counts of each condition type's status over `servers` (their `status.conditions`).
pub fn servers_by_condition(servers: &[serde_json::Value]) -> ServersByCondition {
    let mut counts: BTreeMap<String, ConditionCount> = BTreeMap::new();
    for server in servers {
        let Some(conditions) = server["status"]["conditions"].as_array() else {
            continue;
        };
        for c in conditions {
            let Some(type_) = c["type"].as_str() else {
                continue;
            };
            let count = counts
                .entry(type_.to_string())
                .or_insert_with(|| ConditionCount {
                    type_: type_.to_string(),
                    ..ConditionCount::default()
                });
            match c["status"].as_str() {
                Some("True") => count.true_ += 1,
                Some("False") => count.false_ += 1,
                _ => count.unknown += 1,
            }
        }
    }
    let total = servers.len() as u64;
    let conditions = counts
        .into_values()
        .map(|mut c| {
            c.not_set = total - (c.true_ + c.false_ + c.unknown);
            c
        })
        .collect();
    ServersByCondition { total, conditions }
}

/// The image tags of a Deployment's containers (`name:tag`), the version it runs.
fn image_versions(d: &Deployment) -> String {
    let images: Vec<String> = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| {
            p.containers
                .iter()
                .filter_map(|c| c.image.clone())
                .collect()
        })
        .unwrap_or_default();
    let tags: Vec<String> = images
        .iter()
        .map(|i| {
            let last = i.rsplit('/').next().unwrap_or(i);
            match last.split_once(['@', ':']) {
                Some((_, tag)) => tag.to_string(),
                None => "latest".into(),
            }
        })
        .collect();
    if tags.is_empty() {
        "<unknown>".into()
    } else {
        tags.join(",")
    }
}

/// `ready/desired` and whether at least one replica is available.
fn deployment_readiness(d: &Deployment) -> (String, bool) {
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    (format!("{ready}/{desired}"), ready > 0)
}

fn not_found(e: &CliError) -> bool {
    e.code() == Some(404)
}

async fn api_service(ctx: &Context) -> Result<(ApiServiceState, Option<(String, String, i32)>)> {
    let api: Api<APIService> = Api::all(ctx.client.clone());
    let svc = api.get(API_SERVICE).await?;
    let available = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Available"));
    let reference = svc.spec.as_ref().and_then(|s| s.service.as_ref()).map(|s| {
        (
            s.namespace.clone().unwrap_or_default(),
            s.name.clone().unwrap_or_default(),
            s.port.unwrap_or(443),
        )
    });
    Ok((
        ApiServiceState {
            name: API_SERVICE.into(),
            available: available
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into()),
            reason: available.and_then(|c| c.reason.clone()).unwrap_or_default(),
            message: available
                .and_then(|c| c.message.clone())
                .unwrap_or_default(),
            service: reference
                .as_ref()
                .map(|(ns, name, port)| format!("{ns}/{name}:{port}"))
                .unwrap_or_else(|| "<local>".into()),
        },
        reference,
    ))
}

async fn apiserver(
    ctx: &Context,
    reference: Option<(String, String, i32)>,
    available: &str,
) -> Component {
    let mut component = Component {
        name: "apiserver".into(),
        ready: available.to_string(),
        version: "<unknown>".into(),
        source: String::new(),
    };
    let Some((ns, name, port)) = reference else {
        component.source = "the APIService names no Service".into();
        return component;
    };
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    match services.get(&name).await.map_err(CliError::from) {
        Ok(svc) => {
            let spec = svc.spec.unwrap_or_default();
            if spec.type_.as_deref() == Some("ExternalName") {
                component.source = format!(
                    "Service {ns}/{name} is ExternalName {}:{port}: the server runs outside the \
                     cluster, no Pods to read a version from; ready is the APIService's \
                     Available",
                    spec.external_name.unwrap_or_default()
                );
                return component;
            }
        }
        Err(e) => {
            component.source = format!("Service {ns}/{name}: {e}");
            return component;
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    match deployments.get(&name).await.map_err(CliError::from) {
        Ok(d) => {
            let (replicas, any_ready) = deployment_readiness(&d);
            component.version = image_versions(&d);
            component.ready = if any_ready && available == "True" {
                "True".into()
            } else {
                "False".into()
            };
            component.source = format!(
                "Deployment {ns}/{name}: {replicas} ready; APIService Available={available}"
            );
        }
        Err(e) => {
            component.source = format!("Deployment {ns}/{name}: {e}");
        }
    }
    component
}

async fn controllers(ctx: &Context, args: &StatusArgs, now: Timestamp) -> Component {
    let ns = &args.system_namespace;
    let mut component = Component {
        name: "controllers".into(),
        ready: "Unknown".into(),
        version: "<unknown>".into(),
        source: String::new(),
    };
    let mut sources = Vec::new();
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    match leases
        .get(&args.controllers_lease)
        .await
        .map_err(CliError::from)
    {
        Ok(lease) => {
            let spec = lease.spec.unwrap_or_default();
            let holder = spec.holder_identity.filter(|h| !h.is_empty());
            let renewed = spec.renew_time.map(|t| t.0);
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            let fresh = renewed.is_some_and(|r| now.duration_since(r).as_secs() <= duration);
            let lease_name = format!("Lease {ns}/{}", args.controllers_lease);
            match (&holder, renewed) {
                (Some(holder), Some(renewed)) => {
                    sources.push(format!(
                        "{lease_name}: held by {holder}, renewed {} ago{}",
                        render::human_duration(now.duration_since(renewed)),
                        if fresh { "" } else { " (expired)" }
                    ));
                    component.ready = if fresh { "True" } else { "False" }.into();
                }
                _ => {
                    sources.push(format!("{lease_name}: not held (no leader)"));
                    component.ready = "False".into();
                }
            }
        }
        Err(e) if not_found(&e) => {
            sources.push(format!(
                "Lease {ns}/{}: not found (controllers never ran)",
                args.controllers_lease
            ));
            component.ready = "False".into();
        }
        Err(e) => sources.push(format!("Lease {ns}/{}: {e}", args.controllers_lease)),
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    match deployments
        .get("mcp-access-controllers")
        .await
        .map_err(CliError::from)
    {
        Ok(d) => {
            let (replicas, _) = deployment_readiness(&d);
            component.version = image_versions(&d);
            sources.push(format!(
                "Deployment {ns}/mcp-access-controllers: {replicas} ready"
            ));
        }
        Err(e) if not_found(&e) => sources.push(format!(
            "no Deployment {ns}/mcp-access-controllers (they run outside the cluster)"
        )),
        Err(e) => sources.push(format!("Deployment {ns}/mcp-access-controllers: {e}")),
    }
    component.source = sources.join("; ");
    component
}

/// Whether the state at `epoch`/`seq` is still served: an Exact one-item list.
async fn served(api: &Api<AccessSession>, epoch: u32, seq: u64) -> Result<bool> {
    let params = ListParams::default()
        .at(&encode_rv(epoch, seq))
        .matching(VersionMatch::Exact)
        .limit(1);
    match api.list(&params).await.map_err(CliError::from) {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some(410) => Ok(false),
        Err(e) => Err(e),
    }
}

async fn change_feed(api: &Api<AccessSession>, head_rv: &str) -> Result<ChangeFeed> {
    let (epoch, head) = decode_rv(head_rv).ok_or_else(|| {
        CliError::other(format!(
            "the list's resourceVersion {head_rv:?} is not MCP Access's"
        ))
    })?;
    let oldest = oldest_served(head, |seq| served(api, epoch, seq)).await?;
    // A rotated epoch in between would make every probe 410: check the head still serves.
    if !served(api, epoch, head).await? {
        return Err(CliError::other(
            "the epoch rotated while the retained range was measured (the apiserver restarted); try again",
        ));
    }
    Ok(ChangeFeed {
        epoch,
        head_seq: head,
        head_resource_version: head_rv.to_string(),
        oldest_served_seq: oldest,
        oldest_served_resource_version: encode_rv(epoch, oldest),
        retained_events: head - oldest,
    })
}

pub async fn gather(ctx: &Context, args: &StatusArgs, scoped: bool) -> Report {
    let now = Timestamp::now();
    let namespace = scoped.then(|| ctx.namespace.clone());
    let (api_service, reference) = match api_service(ctx).await {
        Ok((state, reference)) => (Section::Ok(state), reference),
        Err(e) => (
            Section::Err {
                error: e.to_string(),
            },
            None,
        ),
    };
    let available = match &api_service {
        Section::Ok(s) => s.available.clone(),
        Section::Err { .. } => "Unknown".into(),
    };
    let components = vec![
        apiserver(ctx, reference, &available).await,
        controllers(ctx, args, now).await,
    ];
    let sessions_api: Api<AccessSession> = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (sessions, change_feed) = match sessions_api.list(&ListParams::default()).await {
        Ok(list) => {
            let rv = list.metadata.resource_version.clone().unwrap_or_default();
            (
                Section::Ok(phases_by_namespace(&list.items)),
                Section::of(change_feed(&sessions_api, &rv).await),
            )
        }
        Err(e) => {
            let e = CliError::from(e).to_string();
            (Section::Err { error: e.clone() }, Section::Err { error: e })
        }
    };
    let servers_api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &mcpserver_resource()),
        None => Api::all_with(ctx.client.clone(), &mcpserver_resource()),
    };
    let mcp_servers = Section::of(
        servers_api
            .list(&ListParams::default())
            .await
            .map_err(CliError::from)
            .map(|list| {
                let values: Vec<serde_json::Value> =
                    list.items.into_iter().map(|o| o.data).collect();
                servers_by_condition(&values)
            }),
    );
    Report {
        api_service,
        components,
        namespace,
        sessions,
        mcp_servers,
        change_feed,
    }
}

fn section<T>(title: &str, s: &Section<T>, table: impl FnOnce(&T) -> Table) -> String {
    match s {
        Section::Ok(t) => format!("{title}\n{}", table(t).render()),
        Section::Err { error } => format!("{title}\n{error}\n"),
    }
}

/// The report as text: one table per part, a blank line between parts.
pub fn render_text(report: &Report) -> String {
    let mut parts = Vec::new();
    parts.push(section("APISERVICE", &report.api_service, |s| {
        let mut t = Table::new(&["NAME", "SERVICE", "AVAILABLE", "REASON", "MESSAGE"]);
        t.push(vec![
            s.name.clone(),
            s.service.clone(),
            s.available.clone(),
            render::or_none(s.reason.clone()),
            render::or_none(s.message.clone()),
        ]);
        t
    }));
    let mut t = Table::new(&["COMPONENT", "READY", "VERSION", "SOURCE"]);
    for c in &report.components {
        t.push(vec![
            c.name.clone(),
            c.ready.clone(),
            c.version.clone(),
            c.source.clone(),
        ]);
    }
    parts.push(format!("COMPONENTS\n{}", t.render()));
    let scope = match &report.namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".into(),
    };
    parts.push(section(
        &format!("SESSIONS BY PHASE ({scope})"),
        &report.sessions,
        |rows| {
            let mut t = Table::new(&[
                "NAMESPACE",
                "ACTIVE",
                "PENDINGENROLLMENT",
                "REVOKED",
                "EXPIRED",
                "TOTAL",
            ]);
            for r in rows {
                t.push(vec![
                    r.namespace.clone(),
                    r.active.to_string(),
                    r.pending_enrollment.to_string(),
                    r.revoked.to_string(),
                    r.expired.to_string(),
                    (r.active + r.pending_enrollment + r.revoked + r.expired).to_string(),
                ]);
            }
            t
        },
    ));
    let servers_title = match &report.mcp_servers {
        Section::Ok(s) => format!("MCPSERVERS BY CONDITION ({} in {scope})", s.total),
        Section::Err { .. } => format!("MCPSERVERS BY CONDITION ({scope})"),
    };
    parts.push(section(&servers_title, &report.mcp_servers, |s| {
        let mut t = Table::new(&["CONDITION", "TRUE", "FALSE", "UNKNOWN", "NOT SET"]);
        for c in &s.conditions {
            t.push(vec![
                c.type_.clone(),
                c.true_.to_string(),
                c.false_.to_string(),
                c.unknown.to_string(),
                c.not_set.to_string(),
            ]);
        }
        t
    }));
    parts.push(section("CHANGE FEED", &report.change_feed, |f| {
        let mut t = Table::new(&[
            "EPOCH",
            "HEAD SEQ",
            "OLDEST SERVED SEQ",
            "RETAINED EVENTS",
            "HEAD RESOURCEVERSION",
            "OLDEST RESOURCEVERSION",
        ]);
        t.push(vec![
            f.epoch.to_string(),
            f.head_seq.to_string(),
            f.oldest_served_seq.to_string(),
            f.retained_events.to_string(),
            f.head_resource_version.clone(),
            f.oldest_served_resource_version.clone(),
        ]);
        t
    }));
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::types::AccessSessionStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn resource_versions_decode_to_epoch_and_seq() {
        let rv = encode_rv(123, 4567);
        assert_eq!(rv, ((123u64 << 40) | 4567).to_string());
        assert_eq!(decode_rv(&rv), Some((123, 4567)));
        assert_eq!(decode_rv("4567"), None, "epoch 0 is not ours");
        assert_eq!(decode_rv("0123"), None);
        assert_eq!(decode_rv(""), None);
        assert_eq!(decode_rv("x"), None);
    }

    fn probe(oldest: u64) -> impl FnMut(u64) -> std::future::Ready<Result<bool>> {
        move |seq| std::future::ready(Ok(seq >= oldest))
    }

    #[tokio::test]
    async fn bisection_finds_the_oldest_served_position() {
        for (head, oldest) in [
            (0, 0),
            (1, 0),
            (1, 1),
            (10, 0),
            (10, 7),
            (10, 10),
            (100_000, 31_337),
        ] {
            assert_eq!(
                oldest_served(head, probe(oldest)).await.unwrap(),
                oldest,
                "{head} {oldest}"
            );
        }
    }

    #[tokio::test]
    async fn bisection_asks_about_log2_questions() {
        let mut asked = 0;
        let found = oldest_served(1 << 20, |seq| {
            asked += 1;
            std::future::ready(Ok(seq >= 777_777))
        })
        .await
        .unwrap();
        assert_eq!(found, 777_777);
        assert!(asked <= 22, "{asked} probes");
    }

    #[tokio::test]
    async fn a_failed_probe_is_an_error_not_a_figure() {
        let r = oldest_served(10, |_| std::future::ready(Err(CliError::other("down")))).await;
        assert!(r.is_err());
    }

    fn mk_session(ns: &str, phase: SessionPhase) -> AccessSession {
        AccessSession {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            status: Some(AccessSessionStatus {
                phase,
                ..AccessSessionStatus::default()
            }),
            ..AccessSession::default()
        }
    }

    #[test]
    fn phases_are_counted_per_namespace() {
        let rows = phases_by_namespace(&[
            mk_session("b", SessionPhase::Active),
            mk_session("a", SessionPhase::Revoked),
            mk_session("b", SessionPhase::Active),
            mk_session("b", SessionPhase::PendingEnrollment),
            mk_session("a", SessionPhase::Expired),
        ]);
        assert_eq!(
            rows,
            vec![
                NamespacePhases {
                    namespace: "a".into(),
                    revoked: 1,
                    expired: 1,
                    ..NamespacePhases::default()
                },
                NamespacePhases {
                    namespace: "b".into(),
                    active: 2,
                    pending_enrollment: 1,
                    ..NamespacePhases::default()
                },
            ]
        );
    }

    #[test]
    fn conditions_are_counted_with_the_servers_lacking_them() {
        let counted = servers_by_condition(&[
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ImageAllowed", "status": "True"}]}}),
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "ImageAllowed", "status": "Unknown"}]}}),
            json!({"spec": {}}),
        ]);
        assert_eq!(counted.total, 3);
        let ready = counted
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.true_, ready.false_, ready.unknown, ready.not_set),
            (1, 1, 0, 1)
        );
        let image = &counted.conditions[0];
        assert_eq!(image.type_, "ImageAllowed");
        assert_eq!((image.true_, image.unknown, image.not_set), (1, 1, 1));
    }

    #[test]
    fn versions_are_the_image_tags() {
        let d: Deployment = serde_json::from_value(json!({
            "spec": {"replicas": 2, "selector": {}, "template": {"spec": {"containers": [
                {"name": "a", "image": "ghcr.io/mcp-runtime/mcp-access-apiserver:0.3.1"},
                {"name": "b", "image": "localhost:5000/x"}]}}},
            "status": {"readyReplicas": 1}
        }))
        .unwrap();
        assert_eq!(image_versions(&d), "0.3.1,latest");
        assert_eq!(deployment_readiness(&d), ("1/2".into(), true));
    }

    #[test]
    fn the_text_report_names_each_part() {
        let report = Report {
            api_service: Section::Ok(ApiServiceState {
                name: API_SERVICE.into(),
                available: "True".into(),
                reason: "Passed".into(),
                message: "all checks passed".into(),
                service: "mcp-access/mcp-access-apiserver:443".into(),
            }),
            components: vec![],
            namespace: None,
            sessions: Section::Err {
                error: "Error from server (Forbidden): no".into(),
            },
            mcp_servers: Section::Ok(ServersByCondition::default()),
            change_feed: Section::Ok(ChangeFeed {
                epoch: 5,
                head_seq: 10,
                head_resource_version: encode_rv(5, 10),
                oldest_served_seq: 4,
                oldest_served_resource_version: encode_rv(5, 4),
                retained_events: 6,
            }),
        };
        let yaml = render::object(&report, crate::cli::ObjectOutput::Yaml).unwrap();
        assert!(yaml.contains("  headSeq: 10\n"), "{yaml}");
        assert!(
            yaml.contains("sessions:\n  error: 'Error from server (Forbidden): no'\n"),
            "{yaml}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render::object(&report, crate::cli::ObjectOutput::Json).unwrap())
                .unwrap();
        assert_eq!(json["changeFeed"]["retainedEvents"], 6);
        assert_eq!(json["apiService"]["available"], "True");
        let text = render_text(&report);
        assert!(
            text.contains(
                "v1alpha1.access.mcp-runtime.dev   mcp-access/mcp-access-apiserver:443   True"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "SESSIONS BY PHASE (all namespaces)\nError from server (Forbidden): no\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("MCPSERVERS BY CONDITION (0 in all namespaces)"),
            "{text}"
        );
        assert!(
            text.contains("\n5       10         4                   6"),
            "{text}"
        );
    }
}
