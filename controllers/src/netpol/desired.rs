//! The desired NetworkPolicies: a pure function of the MCPServers, the Contexts, the proven
//! external allows and the controller's settings, built as the JSON that server-side apply
//! sends (and that the compare-before-apply check reads).
//!
//! Every policy carries [`MANAGED_BY_LABEL`] and [`POLICY_TYPE_LABEL`] plus labels naming its
//! owners; a sweep deletes only what carries both and whose owners are gone (see `sweep.rs`).
//! A policy never selects more than it must: server pods are picked by the labels the workload
//! controller puts on them, hosts by their Context's selector in the Context's namespace.

use std::collections::BTreeMap;

use apis::runtime::{Context, MCPServer, PodPeer, PortRef};
use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use serde_json::{json, Value};

use super::settings::{Label, NetpolSettings};
use crate::children::{digest, with_digest, MANAGED_BY, MANAGED_BY_LABEL};
use crate::mcpserver::desired::SERVER_LABEL;

/// Label typing a generated policy (its layer and role).
pub const POLICY_TYPE_LABEL: &str = "mcp-runtime.dev/policy-type";
/// Label naming the Context a policy belongs to (with [`CONTEXT_NAMESPACE_LABEL`]).
pub const CONTEXT_LABEL: &str = "mcp-runtime.dev/context";
/// Label naming the Context's namespace.
pub const CONTEXT_NAMESPACE_LABEL: &str = "mcp-runtime.dev/context-namespace";
/// Label naming the namespace of the MCPServer an L2 host-side policy opens a route to.
pub const SERVER_NAMESPACE_LABEL: &str = "mcp-runtime.dev/mcpserver-namespace";
/// The label every namespace carries with its own name (set by kube-apiserver).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Kubernetes' limit on an object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// An `ipBlock` peer: a CIDR with the ranges carved out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpBlock {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

/// One proven external destination of a server (layer L3): addresses and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAllow {
    /// The egress binding it comes from.
    pub binding: String,
    pub blocks: Vec<IpBlock>,
    pub ports: Vec<PortRef>,
}

/// The layer and role of a generated policy (the value of [`POLICY_TYPE_LABEL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyType {
    /// L0: no traffic in or out of any pod of a runtime namespace.
    DenyAll,
    /// L1: every pod of a runtime namespace may query the cluster DNS.
    Dns,
    /// L1: pods with the opt-in label may reach the Kubernetes API.
    KubeApi,
    /// L1: MCP server pods (their gateway container) may reach the apiserver's sync listener.
    GatewaySync,
    /// L2: a Context's hosts may reach a server's gateway port.
    ContextIngress,
    /// L2: the paired egress, on the hosts' side (with the cluster DNS: it isolates them).
    ContextEgress,
    /// L3: a server's proven external destinations.
    ExternalEgress,
    /// `spec.network.ingressFrom`.
    ServerIngress,
    /// `spec.network.egressTo` (with DNS).
    ServerEgress,
}

impl PolicyType {
    pub const ALL: [PolicyType; 9] = [
        PolicyType::DenyAll,
        PolicyType::Dns,
        PolicyType::KubeApi,
        PolicyType::GatewaySync,
        PolicyType::ContextIngress,
        PolicyType::ContextEgress,
        PolicyType::ExternalEgress,
        PolicyType::ServerIngress,
        PolicyType::ServerEgress,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyType::DenyAll => "l0-deny-all",
            PolicyType::Dns => "l1-dns",
            PolicyType::KubeApi => "l1-kube-api",
            PolicyType::GatewaySync => "l1-gateway-sync",
            PolicyType::ContextIngress => "l2-ingress",
            PolicyType::ContextEgress => "l2-egress",
            PolicyType::ExternalEgress => "l3-egress",
            PolicyType::ServerIngress => "server-ingress",
            PolicyType::ServerEgress => "server-egress",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// L0 and L1: owned by the runtime namespace list, not by an object.
    pub fn is_namespace_layer(self) -> bool {
        matches!(
            self,
            PolicyType::DenyAll | PolicyType::Dns | PolicyType::KubeApi | PolicyType::GatewaySync
        )
    }
}

/// One policy to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub policy_type: PolicyType,
    /// A whole `networking.k8s.io/v1` NetworkPolicy, with its digest annotation.
    pub body: Value,
}

/// What the policies are computed from.
pub struct Inventory<'a> {
    pub servers: &'a [MCPServer],
    pub contexts: &'a [Context],
    /// (namespace, server name) → the server's proven external allows.
    pub egress: &'a BTreeMap<(String, String), Vec<EgressAllow>>,
    /// Namespace name → its labels, for `allowedContexts.namespaces.from: Selector` (a
    /// namespace missing here is admitted by no selector).
    pub namespace_labels: &'a BTreeMap<String, BTreeMap<String, String>>,
}

/// Every policy the inventory implies, sorted by (namespace, name). Servers and Contexts
/// being deleted imply none: their allows go as soon as deletion starts. A Context of another
/// namespace than the server's opens a route to it only if the server consents
/// ([`MCPServer::admits_context_from`]).
pub fn policies(inventory: &Inventory, settings: &NetpolSettings) -> Vec<Policy> {
    let mut out = Vec::new();
    for ns in &settings.runtime_namespaces {
        namespace_layers(ns, settings, &mut out);
    }
    let live_servers: BTreeMap<(&str, &str), &MCPServer> = inventory
        .servers
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| {
            Some((
                (
                    s.metadata.namespace.as_deref()?,
                    s.metadata.name.as_deref()?,
                ),
                s,
            ))
        })
        .collect();
    for (&(ns, name), server) in &live_servers {
        server_layers(ns, name, server, inventory.egress, settings, &mut out);
    }
    for context in inventory.contexts {
        if context.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(ctx_ns), Some(ctx_name)) = (
            context.metadata.namespace.as_deref(),
            context.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let mut granted: Vec<(&str, &str)> = context
            .spec
            .mcp_servers
            .iter()
            .map(|r| (r.namespace.as_deref().unwrap_or(ctx_ns), r.name.as_str()))
            .collect();
        granted.sort_unstable();
        granted.dedup();
        let ctx_labels = inventory.namespace_labels.get(ctx_ns);
        for key in granted {
            // A grant of a server that does not exist (yet), or that does not consent to
            // Contexts of this namespace, opens nothing.
            if let Some(server) = live_servers.get(&key) {
                if server.admits_context_from(ctx_ns, ctx_labels) {
                    context_pair(context, (ctx_ns, ctx_name), key, server, settings, &mut out);
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

fn namespace_layers(ns: &str, settings: &NetpolSettings, out: &mut Vec<Policy>) {
    let labels = base_labels(PolicyType::DenyAll);
    out.push(policy(
        ns,
        "mcp-l0-deny-all".into(),
        PolicyType::DenyAll,
        labels,
        None,
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ));

    out.push(policy(
        ns,
        "mcp-l1-dns".into(),
        PolicyType::Dns,
        base_labels(PolicyType::Dns),
        None,
        json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [dns_rule(settings)],
        }),
    ));

    if !settings.kube_api_cidrs.is_empty() {
        let to: Vec<Value> = settings
            .kube_api_cidrs
            .iter()
            .map(|c| json!({"ipBlock": {"cidr": c.to_string()}}))
            .collect();
        out.push(policy(
            ns,
            "mcp-l1-kube-api".into(),
            PolicyType::KubeApi,
            base_labels(PolicyType::KubeApi),
            None,
            json!({
                "podSelector": {"matchLabels": label_map(&settings.kube_api_access_label)},
                "policyTypes": ["Egress"],
                "egress": [{"to": to, "ports": [{"protocol": "TCP", "port": settings.kube_api_port}]}],
            }),
        ));
    }

    out.push(policy(
        ns,
        "mcp-l1-gateway-sync".into(),
        PolicyType::GatewaySync,
        base_labels(PolicyType::GatewaySync),
        None,
        json!({
            "podSelector": {
                "matchLabels": {MANAGED_BY_LABEL: MANAGED_BY},
                "matchExpressions": [{"key": SERVER_LABEL, "operator": "Exists"}],
            },
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{
                    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.apiserver_namespace}},
                    "podSelector": {"matchLabels": label_map(&settings.apiserver_pod_label)},
                }],
                "ports": [{"protocol": "TCP", "port": settings.apiserver_sync_port}],
            }],
        }),
    ));
}

fn server_layers(
    ns: &str,
    name: &str,
    server: &MCPServer,
    egress: &BTreeMap<(String, String), Vec<EgressAllow>>,
    settings: &NetpolSettings,
    out: &mut Vec<Policy>,
) {
    let owner = server_owner(server);
    let mut labels = base_labels(PolicyType::ExternalEgress);
    labels.insert(SERVER_LABEL.into(), name.into());

    let allows = egress
        .get(&(ns.to_string(), name.to_string()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let rules: Vec<Value> = allows
        .iter()
        .filter(|a| !a.blocks.is_empty() && !a.ports.is_empty())
        .map(|a| {
            json!({
                "to": a.blocks.iter().map(ip_block).collect::<Vec<_>>(),
                "ports": a.ports.iter().map(port).collect::<Vec<_>>(),
            })
        })
        .collect();
    if !rules.is_empty() {
        out.push(policy(
            ns,
            fit("mcp-l3-egress", &[name]),
            PolicyType::ExternalEgress,
            labels.clone(),
            owner.clone(),
            json!({
                "podSelector": server_pods(name),
                "policyTypes": ["Egress"],
                "egress": rules,
            }),
        ));
    }

    let network = server.spec.network.clone().unwrap_or_default();
    let gateway_port = gateway_port(settings);
    if !network.ingress_from.is_empty() {
        labels.insert(
            POLICY_TYPE_LABEL.into(),
            PolicyType::ServerIngress.as_str().into(),
        );
        let from: Vec<Value> = network
            .ingress_from
            .iter()
            .map(|p| pod_peer(p, ns))
            .collect();
        out.push(policy(
            ns,
            fit("mcp-net-ingress", &[name]),
            PolicyType::ServerIngress,
            labels.clone(),
            owner.clone(),
            json!({
                "podSelector": server_pods(name),
                "policyTypes": ["Ingress"],
                "ingress": [{"from": from, "ports": gateway_port}],
            }),
        ));
    }
    if !network.egress_to.is_empty() {
        labels.insert(
            POLICY_TYPE_LABEL.into(),
            PolicyType::ServerEgress.as_str().into(),
        );
        let mut rules: Vec<Value> = network
            .egress_to
            .iter()
            .filter(|p| !p.ports.is_empty())
            .map(|p| {
                json!({
                    "to": [pod_peer(&PodPeer { namespace: p.namespace.clone(), pod_selector: p.pod_selector.clone() }, ns)],
                    "ports": p.ports.iter().map(port).collect::<Vec<_>>(),
                })
            })
            .collect();
        // A restricted server still resolves names, through the cluster DNS only: allows add
        // up, so a rule on port 53 to any destination would open port 53 everywhere, L1 or not.
        rules.push(dns_rule(settings));
        out.push(policy(
            ns,
            fit("mcp-net-egress", &[name]),
            PolicyType::ServerEgress,
            labels,
            owner,
            json!({
                "podSelector": server_pods(name),
                "policyTypes": ["Egress"],
                "egress": rules,
            }),
        ));
    }
}

fn context_pair(
    context: &Context,
    (ctx_ns, ctx_name): (&str, &str),
    (server_ns, server_name): (&str, &str),
    server: &MCPServer,
    settings: &NetpolSettings,
    out: &mut Vec<Policy>,
) {
    let hosts = host_pods(&context.spec.host_selector);
    let gateway_port = gateway_port(settings);

    let mut labels = base_labels(PolicyType::ContextIngress);
    labels.insert(CONTEXT_LABEL.into(), ctx_name.into());
    labels.insert(CONTEXT_NAMESPACE_LABEL.into(), ctx_ns.into());
    labels.insert(SERVER_LABEL.into(), server_name.into());
    out.push(policy(
        server_ns,
        fit("mcp-l2-ingress", &[server_name, ctx_ns, ctx_name]),
        PolicyType::ContextIngress,
        labels.clone(),
        server_owner(server),
        json!({
            "podSelector": server_pods(server_name),
            "policyTypes": ["Ingress"],
            // The gateway port only: `spec.port` is the MCP container's, which the gateway
            // reaches on loopback (no policy applies inside a Pod).
            "ingress": [{
                "from": [{
                    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ctx_ns}},
                    "podSelector": hosts,
                }],
                "ports": gateway_port,
            }],
        }),
    ));

    labels.insert(
        POLICY_TYPE_LABEL.into(),
        PolicyType::ContextEgress.as_str().into(),
    );
    labels.insert(SERVER_NAMESPACE_LABEL.into(), server_ns.into());
    // A plain owner reference (kube's helper): the garbage collector removes the policy
    // with the Context, and no controller claims it.
    let owner = context.owner_ref(&()).map(|o| json!(o));
    out.push(policy(
        ctx_ns,
        fit("mcp-l2-egress", &[ctx_name, server_ns, server_name]),
        PolicyType::ContextEgress,
        labels,
        owner,
        json!({
            "podSelector": hosts,
            "policyTypes": ["Egress"],
            // Selecting the hosts for egress isolates them: without the DNS rule they could
            // not even resolve the server's Service name.
            "egress": [
                {
                    "to": [{
                        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: server_ns}},
                        "podSelector": server_pods(server_name),
                    }],
                    "ports": gateway_port,
                },
                dns_rule(settings),
            ],
        }),
    ));
}

/// The one port of a server's pods any policy opens: its gateway's. The MCP container's
/// `spec.port` is reached by the gateway on loopback and by nothing outside the Pod.
fn gateway_port(settings: &NetpolSettings) -> Value {
    json!([{"protocol": "TCP", "port": settings.gateway_port}])
}

/// The pods of one MCPServer, as the workload controller labels them.
fn server_pods(name: &str) -> Value {
    json!({"matchLabels": {MANAGED_BY_LABEL: MANAGED_BY, SERVER_LABEL: name}})
}

fn pod_peer(peer: &PodPeer, own_ns: &str) -> Value {
    let ns = peer.namespace.as_deref().unwrap_or(own_ns);
    json!({
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}},
        "podSelector": selector(&peer.pod_selector),
    })
}

/// A label selector as the API writes it (absent parts left out).
/// A Context's host pods: its selector, and never an MCP server's pods (whatever the selector,
/// an empty one included, says). A server pod selected as a host would be let into the other
/// servers of the Context and have its own egress widened to them.
fn host_pods(s: &LabelSelector) -> Value {
    let mut out = selector(s);
    let not_a_server = json!({"key": SERVER_LABEL, "operator": "DoesNotExist"});
    match out["matchExpressions"].as_array_mut() {
        Some(exprs) => exprs.push(not_a_server),
        None => out["matchExpressions"] = json!([not_a_server]),
    }
    out
}

fn selector(s: &LabelSelector) -> Value {
    let mut out = json!({});
    if let Some(labels) = s.match_labels.as_ref().filter(|m| !m.is_empty()) {
        out["matchLabels"] = json!(labels);
    }
    if let Some(exprs) = s.match_expressions.as_ref().filter(|e| !e.is_empty()) {
        out["matchExpressions"] = exprs
            .iter()
            .map(|e| {
                let mut v = json!({"key": e.key, "operator": e.operator});
                if let Some(values) = e.values.as_ref().filter(|v| !v.is_empty()) {
                    v["values"] = json!(values);
                }
                v
            })
            .collect();
    }
    out
}

fn ip_block(b: &IpBlock) -> Value {
    let mut v = json!({"ipBlock": {"cidr": b.cidr.to_string()}});
    if !b.except.is_empty() {
        v["ipBlock"]["except"] = b.except.iter().map(|e| json!(e.to_string())).collect();
    }
    v
}

fn port(p: &PortRef) -> Value {
    json!({"protocol": p.protocol.as_str(), "port": p.port})
}

/// Egress to the cluster DNS (and the NodeLocal cache, if any) on port 53, UDP and TCP.
fn dns_rule(settings: &NetpolSettings) -> Value {
    let mut to = vec![json!({
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.dns_namespace}},
        "podSelector": {"matchLabels": label_map(&settings.dns_pod_label)},
    })];
    if let Some(ip) = settings.node_local_dns {
        to.push(json!({"ipBlock": {"cidr": ip.to_string()}}));
    }
    json!({"to": to, "ports": dns_ports()})
}

fn dns_ports() -> Value {
    json!([{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}])
}

fn label_map(l: &Label) -> Value {
    json!({ l.key.clone(): l.value })
}

fn base_labels(t: PolicyType) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (POLICY_TYPE_LABEL.to_string(), t.as_str().to_string()),
    ])
}

/// A plain owner reference to `server` (kube's helper; `None` without a name or uid).
fn server_owner(server: &MCPServer) -> Option<Value> {
    server.owner_ref(&()).map(|o| json!(o))
}

fn policy(
    ns: &str,
    name: String,
    policy_type: PolicyType,
    labels: BTreeMap<String, String>,
    owner: Option<Value>,
    spec: Value,
) -> Policy {
    let mut metadata = json!({"name": name, "namespace": ns, "labels": labels});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    Policy {
        namespace: ns.into(),
        name,
        policy_type,
        body: with_digest(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata,
            "spec": spec,
        })),
    }
}

/// `prefix.part.part…`: names are unique because the parts (namespace and object names) are
/// joined with a character they cannot hold; a part that holds it, or a name too long for
/// Kubernetes, gives a prefix, the start of the name and a digest of the parts instead.
fn fit(prefix: &str, parts: &[&str]) -> String {
    let name = std::iter::once(prefix)
        .chain(parts.iter().copied())
        .collect::<Vec<_>>()
        .join(".");
    if name.len() <= MAX_NAME && !parts.iter().any(|p| p.contains('.')) {
        return name;
    }
    let digest = digest(&json!(parts));
    let keep = (MAX_NAME - 17).min(name.len());
    let start: String = name[..keep]
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .collect();
    format!("{}-{}", start.trim_end_matches('-'), &digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netpol::settings::Label;
    use apis::runtime::{
        AllowedContexts, ContextNamespaces, ContextSpec, EgressPeer, MCPServerSpec, NamespacesFrom,
        NetworkProtocol, ServerNetwork, ServerRef, Transport,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn settings() -> NetpolSettings {
        NetpolSettings {
            runtime_namespaces: vec!["team-a".into(), "team-b".into()],
            kube_api_cidrs: vec!["172.18.0.2/32".parse().unwrap()],
            kube_api_port: 6443,
            kube_api_access_label: Label {
                key: "mcp-runtime.dev/kube-api-access".into(),
                value: "true".into(),
            },
            dns_namespace: "kube-system".into(),
            dns_pod_label: Label {
                key: "k8s-app".into(),
                value: "kube-dns".into(),
            },
            node_local_dns: Some("169.254.20.10/32".parse().unwrap()),
            apiserver_namespace: "mcp-access".into(),
            apiserver_pod_label: Label {
                key: "app".into(),
                value: "mcp-access-apiserver".into(),
            },
            apiserver_sync_port: 8085,
            gateway_port: 8086,
        }
    }

    fn mk_server(ns: &str, name: &str, port: i32) -> MCPServer {
        let mut s = MCPServer::new(
            name,
            MCPServerSpec {
                allowed_contexts: None,
                image: Some("ghcr.io/acme/mcp:1".into()),
                port: Some(port),
                transport: Transport::StreamableHttp,
                env_secret: None,
                host_credential: None,
                egress_bindings: Vec::new(),
                network: None,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some(ns.into());
        s.metadata.uid = Some(format!("uid-{ns}-{name}"));
        s
    }

    /// A server whose owners admit Contexts of every namespace.
    fn mk_open_server(ns: &str, name: &str, port: i32) -> MCPServer {
        let mut s = mk_server(ns, name, port);
        s.spec.allowed_contexts = Some(AllowedContexts {
            namespaces: ContextNamespaces {
                from: NamespacesFrom::All,
                selector: None,
            },
        });
        s
    }

    fn mk_context(ns: &str, name: &str, servers: &[(&str, &str)]) -> Context {
        let mut c = Context::new(
            name,
            ContextSpec {
                teams: vec![],
                mcp_servers: servers
                    .iter()
                    .map(|(ns, n)| ServerRef {
                        name: (*n).into(),
                        namespace: Some((*ns).into()),
                    })
                    .collect(),
                host_selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([("host".into(), name.into())])),
                    ..Default::default()
                },
            },
        );
        c.metadata.namespace = Some(ns.into());
        c.metadata.uid = Some(format!("uid-ctx-{name}"));
        c
    }

    fn find<'a>(ps: &'a [Policy], ns: &str, name: &str) -> &'a Policy {
        ps.iter()
            .find(|p| p.namespace == ns && p.name == name)
            .unwrap_or_else(|| panic!("{ns}/{name} in {:?}", names(ps)))
    }

    fn names(ps: &[Policy]) -> Vec<String> {
        ps.iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect()
    }

    #[test]
    fn every_runtime_namespace_gets_l0_and_l1() {
        let egress = BTreeMap::new();
        let inv = Inventory {
            servers: &[],
            contexts: &[],
            egress: &egress,
            namespace_labels: &BTreeMap::new(),
        };
        let ps = policies(&inv, &settings());
        assert_eq!(
            names(&ps),
            [
                "team-a/mcp-l0-deny-all",
                "team-a/mcp-l1-dns",
                "team-a/mcp-l1-gateway-sync",
                "team-a/mcp-l1-kube-api",
                "team-b/mcp-l0-deny-all",
                "team-b/mcp-l1-dns",
                "team-b/mcp-l1-gateway-sync",
                "team-b/mcp-l1-kube-api",
            ]
        );
        let deny = &find(&ps, "team-a", "mcp-l0-deny-all").body;
        assert_eq!(
            deny["spec"],
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
        );
        assert_eq!(deny["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(deny["metadata"]["labels"][POLICY_TYPE_LABEL], "l0-deny-all");
        let dns = &find(&ps, "team-a", "mcp-l1-dns").body["spec"]["egress"][0];
        assert_eq!(
            dns["to"][1],
            json!({"ipBlock": {"cidr": "169.254.20.10/32"}})
        );
        assert_eq!(dns["ports"], dns_ports());
        let api = &find(&ps, "team-a", "mcp-l1-kube-api").body["spec"];
        assert_eq!(
            api["podSelector"],
            json!({"matchLabels": {"mcp-runtime.dev/kube-api-access": "true"}})
        );
        assert_eq!(
            api["egress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 6443}])
        );

        // No API CIDR configured: no API egress at all (never an open one).
        let mut s = settings();
        s.kube_api_cidrs.clear();
        assert!(!names(&policies(&inv, &s))
            .iter()
            .any(|n| n.contains("kube-api")));
    }

    #[test]
    fn a_context_opens_exactly_its_servers_on_their_gateway_port() {
        let servers = [
            mk_open_server("team-a", "github", 8080),
            mk_open_server("team-b", "jira", 9000),
            mk_open_server("team-b", "secret", 9001),
        ];
        let contexts = [mk_context(
            "hosts",
            "dev",
            &[
                ("team-a", "github"),
                ("team-b", "jira"),
                ("team-b", "missing"),
            ],
        )];
        let egress = BTreeMap::new();
        let inv = Inventory {
            servers: &servers,
            contexts: &contexts,
            egress: &egress,
            namespace_labels: &BTreeMap::new(),
        };
        let ps = policies(&inv, &settings());
        let l2: Vec<String> = names(&ps)
            .into_iter()
            .filter(|n| n.contains("-l2-"))
            .collect();
        assert_eq!(
            l2,
            [
                "hosts/mcp-l2-egress.dev.team-a.github",
                "hosts/mcp-l2-egress.dev.team-b.jira",
                "team-a/mcp-l2-ingress.github.hosts.dev",
                "team-b/mcp-l2-ingress.jira.hosts.dev",
            ]
        );
        let ingress = &find(&ps, "team-b", "mcp-l2-ingress.jira.hosts.dev").body;
        // The gateway's port, never spec.port (9000): the MCP container is not reachable from
        // outside its Pod.
        assert_eq!(
            ingress["spec"]["ingress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 8086}])
        );
        assert_eq!(
            ingress["spec"]["ingress"][0]["from"],
            json!([{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "hosts"}},
                "podSelector": {
                    "matchLabels": {"host": "dev"},
                    "matchExpressions": [{"key": SERVER_LABEL, "operator": "DoesNotExist"}],
                },
            }])
        );
        assert_eq!(
            ingress["metadata"]["ownerReferences"][0]["kind"],
            "MCPServer"
        );
        assert_eq!(ingress["metadata"]["labels"][CONTEXT_LABEL], "dev");
        let egress = &find(&ps, "hosts", "mcp-l2-egress.dev.team-b.jira").body;
        // Never a server's pods, whatever the selector says.
        assert_eq!(
            egress["spec"]["podSelector"],
            json!({
                "matchLabels": {"host": "dev"},
                "matchExpressions": [{"key": SERVER_LABEL, "operator": "DoesNotExist"}],
            })
        );
        assert_eq!(egress["metadata"]["ownerReferences"][0]["kind"], "Context");
        assert_eq!(
            egress["spec"]["egress"][0]["to"][0]["podSelector"],
            server_pods("jira")
        );
        assert_eq!(
            egress["spec"]["egress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 8086}])
        );
        // The hosts are egress-isolated by this policy: they keep the cluster DNS, and only it.
        assert_eq!(egress["spec"]["egress"][1], dns_rule(&settings()));
        assert_eq!(
            egress["spec"]["egress"][1]["to"][0],
            json!({
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            })
        );
        assert_eq!(egress["spec"]["egress"].as_array().unwrap().len(), 2);

        // A Context or a server being deleted opens nothing any more.
        let mut deleting = contexts.clone();
        deleting[0].metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let inv = Inventory {
            servers: &servers,
            contexts: &deleting,
            egress: inv.egress,
            namespace_labels: inv.namespace_labels,
        };
        assert!(!names(&policies(&inv, &settings()))
            .iter()
            .any(|n| n.contains("-l2-")));
    }

    /// Gateway API's allowedRoutes shape: a Context of another namespace opens a route only
    /// to a server that consents to it; one of the server's own namespace always does.
    #[test]
    fn a_context_opens_no_route_to_a_server_that_does_not_consent() {
        let by = |from: NamespacesFrom, selector: Option<LabelSelector>| {
            Some(AllowedContexts {
                namespaces: ContextNamespaces { from, selector },
            })
        };
        let mut same = mk_server("tools", "same", 8080);
        same.spec.allowed_contexts = by(NamespacesFrom::Same, None);
        let default = mk_server("tools", "default", 8080);
        let all = mk_open_server("tools", "all", 8080);
        let mut labelled = mk_server("tools", "labelled", 8080);
        labelled.spec.allowed_contexts = by(
            NamespacesFrom::Selector,
            Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["trusted".into()]),
                }]),
                ..Default::default()
            }),
        );
        let mut no_selector = mk_server("tools", "no-selector", 8080);
        no_selector.spec.allowed_contexts = by(NamespacesFrom::Selector, None);
        let servers = [same, default, all, labelled, no_selector];
        let every: Vec<(&str, &str)> = ["same", "default", "all", "labelled", "no-selector"]
            .into_iter()
            .map(|n| ("tools", n))
            .collect();
        let contexts = [
            mk_context("trusted-hosts", "a", &every),
            mk_context("other-hosts", "b", &every),
            mk_context("unknown-hosts", "c", &every),
            mk_context("tools", "local", &every),
        ];
        let labels = BTreeMap::from([
            (
                "trusted-hosts".to_string(),
                BTreeMap::from([("tier".to_string(), "trusted".to_string())]),
            ),
            (
                "other-hosts".to_string(),
                BTreeMap::from([("tier".to_string(), "public".to_string())]),
            ),
        ]);
        let egress = BTreeMap::new();
        let inv = Inventory {
            servers: &servers,
            contexts: &contexts,
            egress: &egress,
            namespace_labels: &labels,
        };
        let ps = policies(&inv, &settings());
        let ingress: Vec<String> = names(&ps)
            .into_iter()
            .filter(|n| n.contains("-l2-ingress"))
            .collect();
        assert_eq!(
            ingress,
            [
                "tools/mcp-l2-ingress.all.other-hosts.b",
                "tools/mcp-l2-ingress.all.tools.local",
                "tools/mcp-l2-ingress.all.trusted-hosts.a",
                "tools/mcp-l2-ingress.all.unknown-hosts.c",
                "tools/mcp-l2-ingress.default.tools.local",
                "tools/mcp-l2-ingress.labelled.tools.local",
                "tools/mcp-l2-ingress.labelled.trusted-hosts.a",
                "tools/mcp-l2-ingress.no-selector.tools.local",
                "tools/mcp-l2-ingress.same.tools.local",
            ]
        );
        // No half route either: the hosts' egress exists exactly where the ingress does.
        let egress_of = |ctx_ns: &str| -> Vec<String> {
            ps.iter()
                .filter(|p| p.namespace == ctx_ns && p.policy_type == PolicyType::ContextEgress)
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(egress_of("other-hosts"), ["mcp-l2-egress.b.tools.all"]);
        assert_eq!(
            egress_of("trusted-hosts"),
            [
                "mcp-l2-egress.a.tools.all",
                "mcp-l2-egress.a.tools.labelled"
            ]
        );
        assert_eq!(egress_of("unknown-hosts"), ["mcp-l2-egress.c.tools.all"]);
        assert_eq!(egress_of("tools").len(), 5);
    }

    #[test]
    fn external_egress_and_server_network_rules() {
        let mut server = mk_server("team-a", "github", 8080);
        server.spec.network = Some(ServerNetwork {
            ingress_from: vec![PodPeer {
                namespace: Some("monitoring".into()),
                pod_selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".into(), "probe".into())])),
                    ..Default::default()
                },
            }],
            egress_to: vec![EgressPeer {
                namespace: None,
                pod_selector: LabelSelector::default(),
                ports: vec![PortRef {
                    port: 5432,
                    protocol: NetworkProtocol::Tcp,
                }],
            }],
        });
        let egress = BTreeMap::from([(
            ("team-a".to_string(), "github".to_string()),
            vec![EgressAllow {
                binding: "api".into(),
                blocks: vec![IpBlock {
                    cidr: "140.82.112.3/32".parse().unwrap(),
                    except: vec![],
                }],
                ports: vec![PortRef {
                    port: 443,
                    protocol: NetworkProtocol::Tcp,
                }],
            }],
        )]);
        let servers = [server];
        let inv = Inventory {
            servers: &servers,
            contexts: &[],
            egress: &egress,
            namespace_labels: &BTreeMap::new(),
        };
        let ps = policies(&inv, &settings());
        let l3 = &find(&ps, "team-a", "mcp-l3-egress.github").body;
        assert_eq!(
            l3["spec"]["egress"],
            json!([{"to": [{"ipBlock": {"cidr": "140.82.112.3/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}])
        );
        assert_eq!(l3["metadata"]["labels"][POLICY_TYPE_LABEL], "l3-egress");
        let net_in = &find(&ps, "team-a", "mcp-net-ingress.github").body;
        assert_eq!(
            net_in["metadata"]["labels"][POLICY_TYPE_LABEL],
            "server-ingress"
        );
        // ingressFrom admits more clients to the gateway, never past it to spec.port.
        assert_eq!(
            net_in["spec"]["ingress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 8086}])
        );
        let net_out = &find(&ps, "team-a", "mcp-net-egress.github").body["spec"]["egress"];
        assert_eq!(
            net_out[1],
            dns_rule(&settings()),
            "DNS stays allowed, to the cluster DNS only"
        );
        // Never port 53 to anywhere: every rule names its destinations.
        for rule in net_out.as_array().unwrap() {
            assert!(
                rule["to"].as_array().is_some_and(|to| !to.is_empty()),
                "{rule}"
            );
        }
        assert_eq!(
            net_out[0]["to"][0]["namespaceSelector"],
            json!({"matchLabels": {"kubernetes.io/metadata.name": "team-a"}})
        );
    }

    #[test]
    fn long_names_stay_unique_and_valid() {
        let long = "a".repeat(63);
        let a = fit(
            "mcp-l2-ingress",
            &[&long, &long, &format!("{long}x"), &long],
        );
        let b = fit(
            "mcp-l2-ingress",
            &[&long, &long, &format!("{long}y"), &long],
        );
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
        assert_ne!(a, b);
        assert_eq!(fit("mcp-l3-egress", &["x"]), "mcp-l3-egress.x");
        // "a-b" + "c" and "a" + "b-c" must not meet; dotted parts go the digest way.
        assert_ne!(fit("p", &["a-b", "c"]), fit("p", &["a", "b-c"]));
        let dotted = fit("p", &["a.b", "c"]);
        assert_ne!(dotted, fit("p", &["a", "b.c"]));
        assert!(!dotted.contains('.'), "{dotted}");
    }

    #[test]
    fn policy_types_round_trip() {
        for t in PolicyType::ALL {
            assert_eq!(PolicyType::parse(t.as_str()), Some(t));
        }
        assert_eq!(PolicyType::parse("l0-deny-some"), None);
    }

    /// The digests of every policy, pinned: a change to how bodies are built or hashed would
    /// make every live policy look changed and re-apply them all once.
    #[test]
    fn digests_are_pinned() {
        let egress = BTreeMap::new();
        let servers = [mk_open_server("team-a", "github", 8080)];
        let contexts = [mk_context("team-b", "dev", &[("team-a", "github")])];
        let inv = Inventory {
            servers: &servers,
            contexts: &contexts,
            egress: &egress,
            namespace_labels: &BTreeMap::new(),
        };
        let got: Vec<String> = policies(&inv, &settings())
            .iter()
            .map(|p| {
                format!(
                    "{}/{} {}",
                    p.namespace,
                    p.name,
                    p.body["metadata"]["annotations"][crate::children::DESIRED_DIGEST]
                        .as_str()
                        .unwrap()
                )
            })
            .collect();
        assert_eq!(got, PINNED, "{got:#?}");
    }

    const PINNED: [&str; 10] = [
        "team-a/mcp-l0-deny-all 4324333c00ab7aafdaf82ef27e08ae9127daa8c22af8c2b1c2a7e841bde48957",
        "team-a/mcp-l1-dns 99246112419250140e52dd7cdf226dfe5a893be4d07a2b0ec062a1a65bf5f860",
        "team-a/mcp-l1-gateway-sync 8d4ddc127b86886427b7d380c84575d65b09d30ce7ac4df52f94cb5380a6109c",
        "team-a/mcp-l1-kube-api ea50598735fdb35e49afeddaca31ab23f02479c9b230b6372bebcfe06fb48862",
        "team-a/mcp-l2-ingress.github.team-b.dev 5cbaf10a8d6bccbcad572946d2639de076a676f957215ef4cc75fd6531a9953e",
        "team-b/mcp-l0-deny-all 763c298636c514247a3efc3c2ee4c259905bdaf2ab3c94d3a51885c9c3a23131",
        "team-b/mcp-l1-dns a52452d67674f4db17e0ec7dad70a34cb4bff857945475d31a318f125a3395f1",
        "team-b/mcp-l1-gateway-sync 8f29869724ec6425b16135e5d6465e47e690236640ab6a0b07a5fde377a3c1b4",
        "team-b/mcp-l1-kube-api 1523e760e71460482e4fc500bacb32fefc09c3f47c1d530d5193454b3693bc50",
        "team-b/mcp-l2-egress.dev.team-a.github 40e63d54ecfc5ce0d792f56918be0a2a24d386776834111e83644f02298939b8",
    ];
}
