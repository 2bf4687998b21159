//! The `mcp-runtime.dev` custom resources the gateway path and the controllers act on. They
//! are served by kube-apiserver as CRDs (their YAML is generated from these types into
//! `deploy/crds/`, see `examples/crdgen.rs`), not by the aggregated API server.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the runtime resources.
pub const RUNTIME_GROUP: &str = "mcp-runtime.dev";

/// What to run for an MCP server and how clients reach it through its gateway.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mcp-runtime.dev",
    version = "v1alpha1",
    kind = "MCPServer",
    plural = "mcpservers",
    singular = "mcpserver",
    shortname = "mcps",
    namespaced,
    status = "MCPServerStatus",
    doc = "An MCP server that runs behind a gateway. Its UID is what sessions grant access to (AccessSession spec.server.uid): a server deleted and re-created under the same name is another server.",
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#,
    printcolumn = r#"{"name":"Transport","type":"string","jsonPath":".spec.transport"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.remote) != has(self.image)", "message": "exactly one of image and remote"},
    {"rule": "has(self.remote) != has(self.port)", "message": "port goes with image, and not with remote"},
    {"rule": "!has(self.remote) || (!has(self.command) && !has(self.args) && !has(self.resources) && !has(self.imagePullPolicy))", "message": "command, args, resources and imagePullPolicy describe an image: not with remote"},
    {"rule": "!has(self.transport) || self.transport != 'stdio' || (has(self.command) && size(self.command) > 0)", "message": "transport stdio needs command"},
    {"rule": "!has(self.remote) || !has(self.transport) || self.transport == 'streamable-http'", "message": "a remote server is reached over Streamable HTTP"},
]))]
pub struct MCPServerSpec {
    /// Container image of the MCP server. Exactly one of `image` and `remote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Port the MCP server listens on inside its pod, on loopback at least (with `transport:
    /// stdio`, the port the stdio bridge listens on). Required with `image`; not with `remote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// How the MCP server speaks MCP: over HTTP (`streamable-http`, `sse`) on `port`, or over
    /// its stdin and stdout (`stdio`: `command` runs behind a bridge that serves Streamable
    /// HTTP on `port`). Clients always speak HTTP to the gateway.
    #[serde(default)]
    pub transport: Transport,
    /// The MCP container's command (its image's entrypoint when absent); required with
    /// `transport: stdio`, where it is the process each MCP session runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments of `command` (or of the image's entrypoint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// An MCP server that runs elsewhere, reached through an egress proxy in the server's Pod
    /// whose only egress is the URL's host and port. Exactly one of `image` and `remote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteServer>,
    /// Pods of the Deployment (default 1; 0 keeps the server defined and stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Compute resources of the MCP container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// Pull policy of the MCP container's image (Kubernetes' default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Secrets of the server's namespace that pull its image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<k8s_openapi::api::core::v1::LocalObjectReference>,
    /// Environment of the MCP server container, from keys of a Secret in the server's
    /// namespace. The workload is not deployed until the Secret exists with every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_secret: Option<EnvSecret>,
    /// Destinations outside the cluster the server may reach (NetworkPolicy layer L3). A
    /// binding that cannot be proven safe keeps the workload from being deployed
    /// (condition `ExternalEgressReady=False`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub egress_bindings: Vec<EgressBinding>,
    /// In-cluster sources allowed in and destinations allowed out, beyond the gateway and the
    /// hosts of the Contexts that grant the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ServerNetwork>,
    /// The credential hosts obtain for this server through the Host API, after their
    /// Context's grant is checked: one key of a Secret in the server's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_credential: Option<SecretKeyRef>,
    /// Which namespaces' Contexts may grant this server to their hosts. Absent: only Contexts
    /// of the server's own namespace (`from: Same`). A Context of another namespace that names
    /// the server grants nothing (no route, no session, no credential) until the server's
    /// owners consent here, as a Gateway's `allowedRoutes` consents to routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_contexts: Option<AllowedContexts>,
}

/// Pull policies of a container image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    /// The Pod spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

/// An MCP server outside the cluster (or outside this namespace's pods).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteServer {
    /// Its MCP endpoint: an absolute `https://` (or `http://`) URL with a host. The egress
    /// proxy may reach that host on that port (the scheme's default when absent) and nothing
    /// else; a host the egress rules refuse keeps the server undeployed.
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^https?://[^/?#]+(/[^?#]*)?$")
    )]
    pub url: String,
}

/// The name of the egress binding a `remote` server's URL implies.
pub const REMOTE_BINDING: &str = "remote";

impl RemoteServer {
    /// The one destination the egress proxy may reach: an `ExactHost` binding named
    /// [`REMOTE_BINDING`] for the URL's host (a `cidr` of one address when the host is an IP
    /// literal) on its port (443 for `https`, 80 for `http` when absent), over TCP. It is
    /// proven as `spec.egressBindings` are: a URL that names no usable host or port yields a
    /// binding without one, which the proof refuses, so the server stays undeployed.
    pub fn egress_binding(&self) -> EgressBinding {
        let mut binding = EgressBinding {
            name: REMOTE_BINDING.into(),
            kind: EgressBindingType::ExactHost,
            cidr: None,
            host: None,
            port: None,
            protocol: Some(NetworkProtocol::Tcp),
        };
        let Some((host, port)) = remote_host_port(&self.url) else {
            return binding;
        };
        match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => binding.cidr = Some(format!("{ip}/32")),
            Ok(std::net::IpAddr::V6(ip)) => binding.cidr = Some(format!("{ip}/128")),
            Err(_) => binding.host = Some(host.to_ascii_lowercase()),
        }
        binding.port = Some(i32::from(port));
        binding
    }
}

/// The host and port of an `http(s)://` URL; None for another scheme, userinfo (credentials
/// do not belong in a spec), an empty host or a port that is not one.
fn remote_host_port(url: &str) -> Option<(&str, u16)> {
    let (rest, default_port) = if let Some(rest) = url.strip_prefix("https://") {
        (rest, 443)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (rest, 80)
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    (!host.is_empty()).then_some((host, port))
}

impl MCPServerSpec {
    /// Every external destination of the server: `spec.egressBindings`, and the one a
    /// `remote` URL implies ([`RemoteServer::egress_binding`]). The NetworkPolicy layer L3
    /// proves and allows exactly these, and the workload waits for their proof.
    pub fn external_egress(&self) -> Vec<EgressBinding> {
        let mut bindings = self.egress_bindings.clone();
        if let Some(remote) = &self.remote {
            bindings.push(remote.egress_binding());
        }
        bindings
    }
}

/// The consent of a server's owners to Contexts of other namespaces.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedContexts {
    /// The namespaces whose Contexts may grant the server.
    #[serde(default)]
    pub namespaces: ContextNamespaces,
}

/// Namespaces by relation to the server's, as Gateway API's `RouteNamespaces`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextNamespaces {
    /// `Same` (the default): only the server's namespace. `All`: every namespace. `Selector`:
    /// the server's namespace and the namespaces whose labels `selector` matches.
    #[serde(default)]
    pub from: NamespacesFrom,
    /// The namespaces' labels, with `from: Selector` (required then; ignored otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// See [`ContextNamespaces::from`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NamespacesFrom {
    #[default]
    Same,
    All,
    Selector,
}

impl MCPServer {
    /// Whether a Context of `context_namespace` may grant this server. `namespace_labels` are
    /// that namespace's labels (None when unknown: a `Selector` then admits nothing). A
    /// `Selector` without a selector, or with one that cannot be evaluated, admits nothing
    /// beyond the server's own namespace: consent fails closed.
    pub fn admits_context_from(
        &self,
        context_namespace: &str,
        namespace_labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> bool {
        if self.metadata.namespace.as_deref() == Some(context_namespace) {
            return true;
        }
        let Some(allowed) = &self.spec.allowed_contexts else {
            return false;
        };
        match allowed.namespaces.from {
            NamespacesFrom::Same => false,
            NamespacesFrom::All => true,
            NamespacesFrom::Selector => match (&allowed.namespaces.selector, namespace_labels) {
                (Some(selector), Some(labels)) => label_selector_matches(selector, labels),
                _ => false,
            },
        }
    }
}

/// Whether `selector` matches `labels`, by the rules of metav1.LabelSelector. A selector that
/// is not valid (an unknown operator, `In` without values, `Exists` with values) matches
/// nothing, where kube-apiserver would refuse it.
pub fn label_selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => !values.is_empty() && value.is_some_and(|v| values.contains(v)),
            "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.contains(v)),
            "Exists" => values.is_empty() && value.is_some(),
            "DoesNotExist" => values.is_empty() && value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// One key of a Secret in the referring object's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key whose value is the credential.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// One external destination of an MCP server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressBinding {
    /// Names the binding (unique within the server; `status.resolvedEgressIPs` is keyed by it).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// `ExactHost`: one `cidr` or one public DNS `host`, on one `port`/`protocol`.
    /// `PublicWeb`: any public address on TCP 80 and 443, private and special ranges excluded.
    #[serde(rename = "type")]
    pub kind: EgressBindingType,
    /// ExactHost: a public CIDR (a host address or a network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// ExactHost: a public DNS name, resolved to /32 (or /128) addresses and refreshed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// ExactHost: the destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// ExactHost: `TCP` (default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<NetworkProtocol>,
}

/// The kinds of egress bindings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EgressBindingType {
    ExactHost,
    PublicWeb,
}

/// Transport protocols of NetworkPolicy ports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NetworkProtocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl NetworkProtocol {
    /// The NetworkPolicy spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkProtocol::Tcp => "TCP",
            NetworkProtocol::Udp => "UDP",
            NetworkProtocol::Sctp => "SCTP",
        }
    }
}

/// Per-server in-cluster network rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerNetwork {
    /// Further pods allowed to reach the server's gateway port (the granted hosts always are;
    /// nothing reaches the MCP container itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_from: Vec<PodPeer>,
    /// In-cluster destinations the server may reach. DNS is always allowed alongside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_to: Vec<EgressPeer>,
}

/// Pods selected by labels in one namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPeer {
    /// Namespace of the pods; the server's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Which pods of that namespace (an empty selector: all of them).
    #[serde(default)]
    pub pod_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
}

/// An in-cluster destination on given ports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressPeer {
    /// Namespace of the pods; the server's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Which pods of that namespace (an empty selector: all of them).
    #[serde(default)]
    pub pod_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    /// Destination ports (at least one: an allow on every port is not offered).
    #[schemars(length(min = 1))]
    pub ports: Vec<PortRef>,
}

/// A port and its protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortRef {
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    #[serde(default)]
    pub protocol: NetworkProtocol,
}

/// The addresses a DNS-named egress binding resolved to, as last proven.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedEgress {
    /// The binding's name.
    pub binding: String,
    /// Its host.
    pub host: String,
    /// The addresses, each checked to be public.
    #[serde(default)]
    pub ips: Vec<String>,
    /// When they were resolved (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<String>,
}

/// Which MCPServers a group of hosts may use: the NetworkPolicy layer L2 opens exactly these
/// routes (host pods → server pods on the gateway port) and nothing else.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mcp-runtime.dev",
    version = "v1alpha1",
    kind = "Context",
    plural = "contexts",
    singular = "context",
    shortname = "mctx",
    namespaced,
    status = "ContextStatus",
    doc = "A group of MCP hosts (pods of this namespace chosen by hostSelector) and the MCPServers they may use.",
    printcolumn = r#"{"name":"Servers","type":"string","jsonPath":".spec.mcpServers[*].name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Granted","type":"integer","jsonPath":".status.readyServers"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ContextSpec {
    /// The MCPServers granted to the hosts.
    #[serde(default)]
    pub mcp_servers: Vec<ServerRef>,
    /// The host pods, in the Context's namespace (never an MCPServer's pods). An empty selector
    /// selects every other pod there.
    pub host_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    /// The authority teams the hosts act for: the `teams` of every AccessSession the
    /// controllers keep for a Host bound to this Context.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub teams: Vec<String>,
}

/// What the controllers observed of a Context's servers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many of the referenced servers are granted and Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_servers: Option<i32>,
    /// Each referenced server, in `spec.mcpServers` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ContextServerStatus>,
    /// `Ready`, by Kubernetes condition conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// One referenced server as the controllers see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextServerStatus {
    pub name: String,
    pub namespace: String,
    /// `Ready`, `NotReady`, `Missing`, `Disabled` (being deleted or retiring) or `NotAllowed`
    /// (the server's `allowedContexts` does not consent to this Context's namespace).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A reference to an MCPServer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerRef {
    /// The MCPServer's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Its namespace; the Context's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A Secret whose keys become environment variables of the same names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvSecret {
    /// Name of the Secret, in the MCPServer's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Keys the server needs; each becomes an environment variable of that name.
    #[serde(default)]
    pub keys: Vec<String>,
}

/// What the controllers observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MCPServerStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `SecretsResolved`, `ImageAllowed`, `ExternalEgressReady`, `NetworkIsolated`, `Retiring`, by Kubernetes condition
    /// conventions. Each controller owns its own types (server-side apply keyed by `type`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// The addresses the DNS-named egress bindings resolved to at the last refresh. A binding
    /// absent here has no DNS-derived allow.
    #[serde(
        default,
        rename = "resolvedEgressIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["binding"]))]
    pub resolved_egress_ips: Vec<ResolvedEgress>,
}

/// MCP transports a server can be reached over through its gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Transport {
    /// The streamable HTTP transport (one endpoint, optional SSE responses).
    #[default]
    #[serde(rename = "streamable-http")]
    StreamableHttp,
    /// The older HTTP+SSE transport.
    #[serde(rename = "sse")]
    Sse,
    /// MCP over the stdin and stdout of `command`, one process per MCP session, served as
    /// Streamable HTTP by the stdio bridge: clients speak `streamable-http`.
    #[serde(rename = "stdio")]
    Stdio,
}

/// An MCP host: the runtime an agent runs in. The Host operator provisions it (Deployment,
/// Service, workspace PVC, ServiceAccount and Role, NetworkPolicies) and the Host API tells it,
/// from this object's live Context, which servers it may use.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mcp-runtime.dev",
    version = "v1alpha1",
    kind = "Host",
    plural = "hosts",
    singular = "host",
    shortname = "mch",
    namespaced,
    status = "HostStatus",
    doc = "An MCP host (the runtime agents run in), bound to one Context of its namespace. Host tokens name it by namespace, name and UID: a Host deleted and re-created is another host.",
    printcolumn = r#"{"name":"Context","type":"string","jsonPath":".spec.contextRef.name"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostSpec {
    /// The Context (in the Host's namespace) whose servers the host may use.
    pub context_ref: LocalRef,
    /// Container image of the host runtime.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Compute resources of the host container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// A Secret of the Host's namespace mounted into the host (read-only). The workload is
    /// not deployed until it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalRef>,
    /// Size of the workspace volume (a PersistentVolumeClaim); 1Gi when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// The name of an object in the referring object's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What the Host operator observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `SecretResolved`, `ContextResolved`, `SessionsReady`, `RuntimeTokenReady`, by
    /// Kubernetes condition conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// The AccessSession the controllers keep for each server the Context grants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<HostSessionStatus>,
}

/// A Host's AccessSession for one server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostSessionStatus {
    /// The MCPServer, and the session's namespace (a session lives beside its server).
    pub server: String,
    pub namespace: String,
    /// The AccessSession's name; absent until one is issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Its phase: `Active`, `Revoked`, `Expired`, or `Pending` before it exists.
    pub phase: String,
    /// The Revocation that revoked it, while one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation: Option<String>,
}

/// Every CRD this project defines, with the file it is kept in under `deploy/crds/`.
pub fn crds() -> Vec<(
    &'static str,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
)> {
    use kube::CustomResourceExt;
    let mut host = Host::crd();
    let mut server = MCPServer::crd();
    for (crd, kind) in [(&mut host, "a Host"), (&mut server, "an MCPServer")] {
        name_starts_with_a_letter(crd, kind);
    }
    if let Some(size) = root_schema(&mut host)
        .and_then(|root| root.properties.as_mut()?.get_mut("spec"))
        .and_then(|spec| spec.properties.as_mut()?.get_mut("workspaceSize"))
    {
        // kube-apiserver's own Quantity syntax: a malformed size is refused at the door, not
        // by every apply of the claim.
        size.pattern = Some(QUANTITY_PATTERN.into());
    }
    vec![
        ("mcpservers.yaml", server),
        ("contexts.yaml", Context::crd()),
        ("hosts.yaml", host),
    ]
}

/// The syntax of a `resource.Quantity` as a string (what controller-gen puts in CRDs).
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

type Crd =
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
type Schema = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

fn root_schema(crd: &mut Crd) -> Option<&mut Schema> {
    crd.spec
        .versions
        .first_mut()?
        .schema
        .as_mut()?
        .open_api_v3_schema
        .as_mut()
}

/// A Host's or MCPServer's Service is named after it, and a Service name (DNS-1035) starts
/// with a letter: the CRD refuses other names with a 422 saying why, rather than the
/// controllers failing every apply of the Service.
fn name_starts_with_a_letter(crd: &mut Crd, kind: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    if let Some(root) = root_schema(crd) {
        root.x_kubernetes_validations = Some(vec![ValidationRule {
            rule: "self.metadata.name.matches('^[a-z]')".into(),
            message: Some(format!(
                "{kind}'s name must start with a letter: its Service is named after it"
            )),
            ..ValidationRule::default()
        }]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRD files are what the types generate: regenerate them with
    /// `cargo run -p apis --example crdgen` after changing a type.
    #[test]
    fn committed_crds_match_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        for (file, crd) in crds() {
            let want = serde_norway::to_string(&crd).expect("a CRD serializes");
            let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            assert!(
                have == want,
                "deploy/crds/{file} is out of date: run `cargo run -p apis --example crdgen`"
            );
        }
    }

    /// The status field is spelled as the API documents it (`resolvedEgressIPs`, not the
    /// camel-case default `resolvedEgressIps`), in the type and so in the CRD schema.
    #[test]
    fn resolved_egress_ips_keeps_its_api_spelling() {
        let status = MCPServerStatus {
            resolved_egress_ips: vec![ResolvedEgress {
                binding: "api".into(),
                host: "api.github.com".into(),
                ips: vec!["140.82.112.3".into()],
                resolved_at: None,
            }],
            ..Default::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert!(json.get("resolvedEgressIPs").is_some(), "{json}");
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MCPServer::crd()).unwrap();
        let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["status"]["properties"];
        assert!(props.get("resolvedEgressIPs").is_some(), "{props}");
    }

    fn server_in(ns: &str, allowed: Option<AllowedContexts>) -> MCPServer {
        let mut server = MCPServer::new(
            "github",
            serde_json::from_value(serde_json::json!({"image": "i", "port": 1})).unwrap(),
        );
        server.metadata.namespace = Some(ns.into());
        server.spec.allowed_contexts = allowed;
        server
    }

    #[test]
    fn cross_namespace_grants_need_the_servers_consent() {
        use std::collections::BTreeMap;
        let team = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let other = BTreeMap::from([("team".to_string(), "b".to_string())]);
        let same = server_in("tools", None);
        assert!(same.admits_context_from("tools", None));
        assert!(!same.admits_context_from("team-a", Some(&team)));
        let explicit_same = server_in("tools", Some(AllowedContexts::default()));
        assert!(!explicit_same.admits_context_from("team-a", Some(&team)));
        let all = server_in(
            "tools",
            Some(AllowedContexts {
                namespaces: ContextNamespaces {
                    from: NamespacesFrom::All,
                    selector: None,
                },
            }),
        );
        assert!(all.admits_context_from("team-a", None));
        let selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": {"team": "a"}})).unwrap();
        let by_label = server_in(
            "tools",
            Some(AllowedContexts {
                namespaces: ContextNamespaces {
                    from: NamespacesFrom::Selector,
                    selector: Some(selector),
                },
            }),
        );
        assert!(by_label.admits_context_from("team-a", Some(&team)));
        assert!(!by_label.admits_context_from("team-b", Some(&other)));
        assert!(
            !by_label.admits_context_from("team-a", None),
            "unknown labels admit nothing"
        );
        let no_selector = server_in(
            "tools",
            Some(AllowedContexts {
                namespaces: ContextNamespaces {
                    from: NamespacesFrom::Selector,
                    selector: None,
                },
            }),
        );
        assert!(!no_selector.admits_context_from("team-a", Some(&team)));
        assert!(no_selector.admits_context_from("tools", None));
    }

    #[test]
    fn label_selectors_match_as_kubernetes_does() {
        use std::collections::BTreeMap;
        let labels = BTreeMap::from([
            ("app".to_string(), "agent".to_string()),
            ("tier".to_string(), "dev".to_string()),
        ]);
        let matches = |json: serde_json::Value| {
            label_selector_matches(&serde_json::from_value(json).unwrap(), &labels)
        };
        assert!(matches(serde_json::json!({})), "empty selects everything");
        assert!(matches(
            serde_json::json!({"matchLabels": {"app": "agent"}})
        ));
        assert!(!matches(
            serde_json::json!({"matchLabels": {"app": "other"}})
        ));
        let expr = |op: &str, values: Option<Vec<&str>>| {
            let mut e = serde_json::json!({"key": "tier", "operator": op});
            if let Some(v) = values {
                e["values"] = serde_json::json!(v);
            }
            matches(serde_json::json!({"matchExpressions": [e]}))
        };
        assert!(expr("In", Some(vec!["dev", "prod"])));
        assert!(!expr("In", Some(vec!["prod"])));
        assert!(!expr("In", Some(vec![])), "In without values is invalid");
        assert!(expr("NotIn", Some(vec!["prod"])));
        assert!(!expr("NotIn", Some(vec!["dev"])));
        assert!(expr("Exists", None));
        assert!(
            !expr("Exists", Some(vec!["dev"])),
            "Exists with values is invalid"
        );
        assert!(!expr("DoesNotExist", None));
        assert!(
            !expr("Matches", Some(vec!["dev"])),
            "an unknown operator matches nothing"
        );
    }

    #[test]
    fn a_remote_url_implies_one_exact_host_binding() {
        let binding = |url: &str| RemoteServer { url: url.into() }.egress_binding();
        let b = binding("https://MCP.example.com/v1/mcp");
        assert_eq!(b.name, REMOTE_BINDING);
        assert_eq!(b.kind, EgressBindingType::ExactHost);
        assert_eq!(
            (b.host.as_deref(), b.cidr.as_deref(), b.port, b.protocol),
            (
                Some("mcp.example.com"),
                None,
                Some(443),
                Some(NetworkProtocol::Tcp)
            )
        );
        let b = binding("http://mcp.example.com:8443");
        assert_eq!(
            (b.host.as_deref(), b.port),
            (Some("mcp.example.com"), Some(8443))
        );
        assert_eq!(binding("http://mcp.example.com?x=1").port, Some(80));
        let b = binding("https://203.0.113.7:9000/mcp");
        assert_eq!(
            (b.cidr.as_deref(), b.host, b.port),
            (Some("203.0.113.7/32"), None, Some(9000))
        );
        let b = binding("https://[2001:db8::1]/mcp");
        assert_eq!(
            (b.cidr.as_deref(), b.port),
            (Some("2001:db8::1/128"), Some(443))
        );
        // Nothing usable: a binding without host, cidr or port, which the proof refuses.
        for bad in [
            "https://user:secret@mcp.example.com/",
            "https://mcp.example.com:0/",
            "https://mcp.example.com:99999/",
            "https:///mcp",
            "ftp://mcp.example.com/",
        ] {
            let b = binding(bad);
            assert_eq!((b.host, b.cidr, b.port), (None, None, None), "{bad}");
        }
        // Beside the declared bindings, never instead of them.
        let spec: MCPServerSpec = serde_json::from_value(serde_json::json!({
            "remote": {"url": "https://mcp.example.com/mcp"},
            "egressBindings": [{"name": "api", "type": "PublicWeb"}],
        }))
        .unwrap();
        let names: Vec<String> = spec.external_egress().into_iter().map(|b| b.name).collect();
        assert_eq!(names, ["api", "remote"]);
        assert_eq!(spec.image, None);
        assert_eq!(spec.port, None);
    }

    #[test]
    fn the_crd_validates_what_runs() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MCPServer::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rules: Vec<&str> = spec["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["rule"].as_str())
            .collect();
        assert!(
            rules.contains(&"has(self.remote) != has(self.image)"),
            "{rules:?}"
        );
        assert!(rules
            .iter()
            .any(|r| r.contains("'stdio'") && r.contains("self.command")));
        assert_eq!(
            spec["properties"]["transport"]["enum"],
            serde_json::json!(["streamable-http", "sse", "stdio"])
        );
        // An optional enum: its values and null (the field is nullable).
        assert_eq!(
            spec["properties"]["imagePullPolicy"]["enum"],
            serde_json::json!(["Always", "IfNotPresent", "Never", null])
        );
        assert_eq!(spec["properties"]["replicas"]["minimum"], 0.0);
        assert_eq!(
            spec["required"],
            serde_json::Value::Null,
            "image and port are optional now"
        );
    }

    #[test]
    fn mcpserver_is_namespaced_in_its_group() {
        use kube::CustomResourceExt;
        let crd = MCPServer::crd();
        assert_eq!(crd.spec.group, RUNTIME_GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, "mcpservers");
        let spec: MCPServerSpec =
            serde_json::from_value(serde_json::json!({"image": "ghcr.io/x/y:1", "port": 8080}))
                .unwrap();
        assert_eq!(spec.transport, Transport::StreamableHttp);
    }
}
