//! The desired runtime of one Host: a pure function of the Host, its Context's granted
//! servers and the operator's settings, built as the JSON that server-side apply sends (and
//! that the compare-before-apply check reads), so it is snapshot-tested without a cluster.
//!
//! Every child carries [`MANAGED_BY_LABEL`] and [`HOST_LABEL`] and a controller owner
//! reference to the Host: kube-controller-manager's garbage collector removes them when the
//! Host goes; the startup sweep (`sweep.rs`) removes those whose Host is gone otherwise. None
//! carries the NetworkPolicy controller's `mcp-runtime.dev/policy-type` label, so its sweep
//! never takes the host's egress policy for one of its own.

use apis::runtime::{Host, MCPServer};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::children::{
    child_metadata, digest, name_of, namespace_of, quantity, Child, ChildKind, Incomplete,
    MANAGED_BY, MANAGED_BY_LABEL,
};
use crate::mcpserver::desired::SERVER_LABEL;
use crate::netpol::settings::{Label, NetpolSettings};

/// Label naming the Host an object belongs to (its name, or a fitted form of a long one).
pub const HOST_LABEL: &str = "mcp-runtime.dev/host";
/// Name of the host container.
pub const HOST_CONTAINER: &str = "host";
/// Where the workspace volume is mounted.
pub const WORKSPACE_MOUNT: &str = "/workspace";
/// Where the `spec.secretRef` Secret is mounted (read-only).
pub const SECRET_MOUNT: &str = "/var/run/secrets/mcp-host";
/// The workspace size when `spec.workspaceSize` is absent.
pub const DEFAULT_WORKSPACE: &str = "1Gi";
/// Longest Service name and label value (a DNS label).
const MAX_LABEL: usize = 63;
/// The label every namespace carries with its own name (set by kube-apiserver).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What the operator was configured with (flags and the NetworkPolicy settings it reuses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSettings {
    /// Handed to hosts as `MCP_HOST_API_URL` when set.
    pub api_url: Option<String>,
    /// Where the Host API runs: the controllers' namespace, pod label and listener port.
    pub api_namespace: String,
    pub api_pod_label: Label,
    pub api_port: u16,
    /// The port the host container listens on (the Service's port).
    pub container_port: u16,
    /// The cluster DNS (and the Kubernetes API addresses, if configured), as the
    /// NetworkPolicy controller has them.
    pub netpol: NetpolSettings,
    /// Whether the operator keeps runtime tokens (`--host-runtime-token-key-file`): the
    /// Deployment then mounts the Host's runtime-token Secret.
    pub runtime_token: bool,
}

/// The kinds of children [`children`] builds, in the order they are applied (the runtime-token
/// Secret, minted only when due, is added before the Deployment by the operator; see
/// [`SWEPT`]).
pub const KINDS: [ChildKind; 7] = [
    ChildKind::ServiceAccount,
    ChildKind::Role,
    ChildKind::RoleBinding,
    ChildKind::PersistentVolumeClaim,
    ChildKind::NetworkPolicy,
    ChildKind::Service,
    ChildKind::Deployment,
];

/// `base` + `suffix` as a DNS label (≤ 63, no dots): as is when it fits, otherwise the start
/// of it (dots made dashes) and a digest of the whole, so two Hosts never share a name.
pub fn fit_label(base: &str, suffix: &str) -> String {
    let name = format!("{base}{suffix}");
    if name.len() <= MAX_LABEL && !name.contains('.') {
        return name;
    }
    let digest = digest(&json!([base, suffix]));
    let keep = (MAX_LABEL - 17).min(name.len());
    let start: String = name[..keep]
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .collect();
    format!("{}-{}", start.trim_end_matches('-'), &digest[..16])
}

/// The value of [`HOST_LABEL`] for Host `name` (a label value is at most 63 characters):
/// the name, or for a longer one its start, `_` and a digest of the whole. A Host name never
/// holds `_`, so no other Host's name is that value and no two Hosts select each other's pods.
pub fn host_label(name: &str) -> String {
    if name.len() <= MAX_LABEL {
        return name.to_string();
    }
    let digest = digest(&json!([name, ""]));
    let start = name[..MAX_LABEL - 17].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{start}_{}", &digest[..16])
}

/// Every kind of child a Host may have: what the orphan sweep lists.
pub const SWEPT: [ChildKind; 8] = [
    KINDS[0],
    KINDS[1],
    KINDS[2],
    KINDS[3],
    KINDS[4],
    KINDS[5],
    KINDS[6],
    ChildKind::Secret,
];

/// Names of a Host's children.
pub fn workload_name(host: &str) -> String {
    fit_label(host, "")
}
pub fn identity_name(host: &str) -> String {
    fit_label(host, "-host")
}
pub fn workspace_name(host: &str) -> String {
    fit_label(host, "-workspace")
}
/// The Secret holding the Host's runtime token.
pub fn runtime_token_name(host: &str) -> String {
    fit_label(host, "-runtime-token")
}
pub fn egress_policy_name(host: &str) -> String {
    fit_label(host, "-host-egress")
}

/// The labels every child and the host pods carry.
pub fn labels(host: &str) -> Value {
    json!({MANAGED_BY_LABEL: MANAGED_BY, HOST_LABEL: host_label(host)})
}

/// Whether a Host's label may be put on its pods: not one of the
/// prefixes Kubernetes and this project reserve (`mcp-runtime.dev/`, `kubernetes.io/`,
/// `k8s.io/` and their subdomains), whose meaning is another controller's.
pub fn copyable_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let prefix = prefix.to_ascii_lowercase();
    !["mcp-runtime.dev", "kubernetes.io", "k8s.io"]
        .iter()
        .any(|reserved| prefix == *reserved || prefix.ends_with(&format!(".{reserved}")))
}

/// The Secret holding a freshly minted runtime token (applied only when one is minted: the
/// operator never reads a token back).
pub fn runtime_token_secret(
    host: &Host,
    secret_name: &str,
    host_uid: &str,
    token: &str,
    expires: k8s_openapi::jiff::Timestamp,
) -> Result<Child, Incomplete> {
    use super::runtime_token::{EXPIRES_ANNOTATION, HOST_UID_ANNOTATION, KEY};
    use base64::Engine;
    let mut meta = metadata(host, secret_name)?;
    meta["annotations"] = json!({
        HOST_UID_ANNOTATION: host_uid,
        EXPIRES_ANNOTATION: expires.to_string(),
    });
    Ok(Child::new(
        ChildKind::Secret,
        secret_name,
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "data": {KEY: base64::engine::general_purpose::STANDARD.encode(token)},
        }),
    ))
}

/// The selector of a Host's pods.
pub fn host_pods(host: &str) -> Value {
    json!({"matchLabels": labels(host)})
}

fn metadata(host: &Host, name: &str) -> Result<Value, Incomplete> {
    child_metadata(host, name, labels(name_of(host)?))
}

/// What the children are built from besides the Host.
pub struct Inputs<'a> {
    /// The servers the Host's Context grants, enabled and existing (`grants::granted`);
    /// empty when the Context is missing.
    pub servers: &'a [&'a MCPServer],
    /// The Host's own labels, put on the host pods (outside the reserved prefixes): the
    /// Context's `hostSelector` admits the Host by them (`grants::selects`) and the server
    /// side of L2 admits its pods by the same selector.
    pub host_labels: Option<&'a std::collections::BTreeMap<String, String>>,
    /// The size the live workspace claim asks for, if it exists (a claim never shrinks).
    pub live_workspace: Option<&'a str>,
}

/// The children of `host`, in the order they are applied (the Deployment last).
pub fn children(
    host: &Host,
    settings: &HostSettings,
    inputs: &Inputs,
) -> Result<Vec<Child>, Incomplete> {
    let name = name_of(host)?;
    let namespace = namespace_of(host)?;
    let spec = &host.spec;
    let identity = identity_name(name);
    let workload = workload_name(name);
    let workspace = workspace_name(name);

    let service_account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(host, &identity)?,
    });
    let mut rules = vec![json!({
        "apiGroups": ["mcp-runtime.dev"],
        "resources": ["hosts"],
        "resourceNames": [name],
        "verbs": ["get", "watch"],
    })];
    if let Some(secret) = &spec.secret_ref {
        rules.push(json!({
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [secret.name],
            "verbs": ["get"],
        }));
    }
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(host, &identity)?,
        "rules": rules,
    });
    let role_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(host, &identity)?,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": identity},
        "subjects": [{"kind": "ServiceAccount", "name": identity, "namespace": namespace}],
    });
    let wanted = spec
        .workspace_size
        .as_ref()
        .map(|q| q.0.as_str())
        .unwrap_or(DEFAULT_WORKSPACE);
    let claim = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(host, &workspace)?,
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": workspace_size(wanted, inputs.live_workspace)}},
        },
    });
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(host, &egress_policy_name(name))?,
        "spec": {
            "podSelector": host_pods(name),
            "policyTypes": ["Egress"],
            "egress": egress_rules(inputs.servers, settings),
        },
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(host, &workload)?,
        "spec": {
            "selector": labels(name),
            "ports": [{"name": "http", "port": settings.container_port, "targetPort": "http", "protocol": "TCP"}],
        },
    });

    let mut env = vec![
        json!({"name": "MCP_HOST_NAME", "value": name}),
        json!({"name": "MCP_HOST_NAMESPACE", "value": namespace}),
    ];
    if let Some(url) = &settings.api_url {
        env.push(json!({"name": "MCP_HOST_API_URL", "value": url}));
    }
    let mut mounts = vec![
        json!({"name": "workspace", "mountPath": WORKSPACE_MOUNT}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "workspace", "persistentVolumeClaim": {"claimName": workspace}}),
        json!({"name": "tmp", "emptyDir": {}}),
    ];
    if let Some(secret) = &spec.secret_ref {
        mounts.push(json!({"name": "secret", "mountPath": SECRET_MOUNT, "readOnly": true}));
        volumes.push(json!({"name": "secret", "secret": {"secretName": secret.name}}));
    }
    if settings.runtime_token {
        use super::runtime_token::{KEY, MOUNT};
        // A directory mount (not subPath): the kubelet replaces the file when the operator
        // refreshes the token.
        env.push(json!({"name": "MCP_HOST_RUNTIME_TOKEN_FILE", "value": format!("{MOUNT}/{KEY}")}));
        mounts.push(json!({"name": "runtime-token", "mountPath": MOUNT, "readOnly": true}));
        volumes.push(json!({"name": "runtime-token", "secret": {
            "secretName": runtime_token_name(name),
        }}));
    }
    let mut container = json!({
        "name": HOST_CONTAINER,
        "image": spec.image,
        "ports": [{"name": "http", "containerPort": settings.container_port, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
    });
    if let Some(resources) = &spec.resources {
        let resources = serde_json::to_value(resources).unwrap_or(Value::Null);
        if resources.as_object().is_some_and(|r| !r.is_empty()) {
            container["resources"] = resources;
        }
    }
    let mut pod_labels = labels(name);
    for (k, v) in inputs.host_labels.into_iter().flatten() {
        // Our own labels are never overridden by the Host's, and no reserved label
        // is copied: with `mcp-runtime.dev/mcpserver` a host pod would be one of that
        // server's pods (its Service, its egress and external egress), with
        // `mcp-runtime.dev/kube-api-access` it would reach the Kubernetes API.
        if pod_labels.get(k).is_none() && copyable_label(k) {
            pod_labels[k] = json!(v);
        }
    }
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(host, &workload)?,
        "spec": {
            "replicas": 1,
            // One writer of a ReadWriteOnce workspace: the old Pod goes before the new one.
            "strategy": {"type": "Recreate"},
            "selector": host_pods(name),
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": identity,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    });

    Ok([
        (ChildKind::ServiceAccount, identity.clone(), service_account),
        (ChildKind::Role, identity.clone(), role),
        (ChildKind::RoleBinding, identity, role_binding),
        (ChildKind::PersistentVolumeClaim, workspace, claim),
        (ChildKind::NetworkPolicy, egress_policy_name(name), policy),
        (ChildKind::Service, workload.clone(), service),
        (ChildKind::Deployment, workload, deployment),
    ]
    .into_iter()
    .map(|(kind, name, body)| Child::new(kind, name, body))
    .collect())
}

/// The egress of the host pods: each granted server's pods on the gateway port (never the
/// MCP container's `spec.port`), the cluster DNS, the Host API, and the Kubernetes API when
/// its addresses are configured. Nothing else.
pub fn egress_rules(servers: &[&MCPServer], settings: &HostSettings) -> Vec<Value> {
    let gateway_port = i32::from(settings.netpol.gateway_port);
    let mut routes: Vec<(String, String, i32)> = servers
        .iter()
        .filter_map(|s| Some((s.namespace()?, s.metadata.name.clone()?, gateway_port)))
        .collect();
    routes.sort();
    routes.dedup();
    let mut out: Vec<Value> = routes
        .into_iter()
        .map(|(ns, name, port)| {
            json!({
                "to": [{
                    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}},
                    "podSelector": {"matchLabels": {MANAGED_BY_LABEL: MANAGED_BY, SERVER_LABEL: name}},
                }],
                "ports": [{"protocol": "TCP", "port": port}],
            })
        })
        .collect();
    let net = &settings.netpol;
    let mut dns = vec![json!({
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: net.dns_namespace}},
        "podSelector": {"matchLabels": label_map(&net.dns_pod_label)},
    })];
    if let Some(ip) = net.node_local_dns {
        dns.push(json!({"ipBlock": {"cidr": ip.to_string()}}));
    }
    out.push(json!({
        "to": dns,
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }));
    out.push(json!({
        "to": [{
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.api_namespace}},
            "podSelector": {"matchLabels": label_map(&settings.api_pod_label)},
        }],
        "ports": [{"protocol": "TCP", "port": settings.api_port}],
    }));
    if !net.kube_api_cidrs.is_empty() {
        out.push(json!({
            "to": net.kube_api_cidrs.iter().map(|c| json!({"ipBlock": {"cidr": c.to_string()}})).collect::<Vec<_>>(),
            "ports": [{"protocol": "TCP", "port": net.kube_api_port}],
        }));
    }
    out
}

fn label_map(l: &Label) -> Value {
    json!({ l.key.clone(): l.value })
}

/// The workspace size to apply: the wanted one, unless the live claim already asks for more
/// (a claim can grow, never shrink: a smaller size is refused by the API server and would
/// fail every reconcile). An unparsable size is applied as written (the API server judges).
pub fn workspace_size(wanted: &str, live: Option<&str>) -> String {
    match (live, quantity_bytes(wanted), live.and_then(quantity_bytes)) {
        (Some(live), Some(w), Some(l)) if l > w => live.to_string(),
        _ => wanted.to_string(),
    }
}

/// Bytes of a Kubernetes quantity (`1Gi`, `500M`, `1.5Ti`, `2e9`), if it parses.
pub fn quantity_bytes(q: &str) -> Option<f64> {
    quantity(q.trim()).filter(|n| n.is_finite() && *n >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::{HostSpec, LocalRef, MCPServerSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn settings() -> HostSettings {
        let args = <crate::netpol::settings::Args as clap::FromArgMatches>::from_arg_matches(
            &<crate::netpol::settings::Args as clap::Args>::augment_args(clap::Command::new("t"))
                .get_matches_from(["t"]),
        )
        .unwrap();
        HostSettings {
            api_url: Some("https://mcp-access-controllers.mcp-access.svc:8443".into()),
            api_namespace: "mcp-access".into(),
            api_pod_label: Label {
                key: "app".into(),
                value: "mcp-access-controllers".into(),
            },
            api_port: 8443,
            container_port: 8080,
            netpol: args.settings(8086).unwrap().0,
            runtime_token: false,
        }
    }

    fn host(name: &str, secret: Option<&str>, size: Option<&str>) -> Host {
        let mut h = Host::new(
            name,
            HostSpec {
                context_ref: LocalRef { name: "dev".into() },
                image: "ghcr.io/acme/agent:1".into(),
                resources: None,
                secret_ref: secret.map(|s| LocalRef { name: s.into() }),
                workspace_size: size.map(|s| Quantity(s.into())),
            },
        );
        h.metadata.namespace = Some("team".into());
        h.metadata.uid = Some("uid-1".into());
        h
    }

    fn server(ns: &str, name: &str, port: i32) -> MCPServer {
        let mut s = MCPServer::new(
            name,
            MCPServerSpec {
                allowed_contexts: None,
                image: Some("img".into()),
                port: Some(port),
                transport: Default::default(),
                env_secret: None,
                egress_bindings: vec![],
                network: None,
                host_credential: None,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some(ns.into());
        s
    }

    fn none() -> Inputs<'static> {
        Inputs {
            servers: &[],
            host_labels: None,
            live_workspace: None,
        }
    }

    fn find(children: &[Child], kind: ChildKind) -> &Value {
        &children.iter().find(|c| c.kind == kind).unwrap().body
    }

    #[test]
    fn every_child_is_labelled_and_owned_by_the_host() {
        let children = children(
            &host("agent", Some("agent-env"), None),
            &settings(),
            &none(),
        )
        .unwrap();
        let kinds: Vec<ChildKind> = children.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, KINDS);
        for c in &children {
            let meta = &c.body["metadata"];
            assert_eq!(meta["namespace"], "team");
            assert_eq!(meta["labels"][MANAGED_BY_LABEL], MANAGED_BY, "{}", c.name);
            assert_eq!(meta["labels"][HOST_LABEL], "agent");
            assert!(meta["labels"].get("mcp-runtime.dev/policy-type").is_none());
            assert_eq!(
                meta["ownerReferences"],
                json!([{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host", "name": "agent",
                        "uid": "uid-1", "controller": true, "blockOwnerDeletion": true}])
            );
            assert_eq!(
                meta["annotations"][crate::children::DESIRED_DIGEST]
                    .as_str()
                    .map(str::len),
                Some(64)
            );
        }
    }

    #[test]
    fn the_netpol_sweep_never_takes_the_egress_policy_for_its_own() {
        use crate::netpol::sweep::{classify, managed_type, LivePolicy, Owners, Verdict};
        let children = children(&host("agent", None, None), &settings(), &none()).unwrap();
        let policy = find(&children, ChildKind::NetworkPolicy);
        let labels: std::collections::BTreeMap<String, String> =
            serde_json::from_value(policy["metadata"]["labels"].clone()).unwrap();
        assert_eq!(managed_type(&labels), None);
        let live = LivePolicy {
            namespace: "team".into(),
            name: "agent-host-egress".into(),
            uid: Some("u".into()),
            labels,
        };
        let verdict = classify(&live, &Default::default(), &Owners::default());
        assert_eq!(verdict, Verdict::NotOurs);
    }

    #[test]
    fn deployment_snapshot() {
        let children = children(
            &host("agent", Some("agent-env"), None),
            &settings(),
            &none(),
        )
        .unwrap();
        let mut d = find(&children, ChildKind::Deployment).clone();
        d["metadata"] = Value::Null;
        let want = json!({
          "apiVersion": "apps/v1", "kind": "Deployment", "metadata": null,
          "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/host": "agent"}},
            "template": {
              "metadata": {"labels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/host": "agent"}},
              "spec": {
                "serviceAccountName": "agent-host",
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                  "name": "host", "image": "ghcr.io/acme/agent:1",
                  "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                  "env": [
                    {"name": "MCP_HOST_NAME", "value": "agent"},
                    {"name": "MCP_HOST_NAMESPACE", "value": "team"},
                    {"name": "MCP_HOST_API_URL", "value": "https://mcp-access-controllers.mcp-access.svc:8443"}
                  ],
                  "volumeMounts": [
                    {"name": "workspace", "mountPath": "/workspace"},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "secret", "mountPath": "/var/run/secrets/mcp-host", "readOnly": true}
                  ],
                  "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                      "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}}
                }],
                "volumes": [
                  {"name": "workspace", "persistentVolumeClaim": {"claimName": "agent-workspace"}},
                  {"name": "tmp", "emptyDir": {}},
                  {"name": "secret", "secret": {"secretName": "agent-env"}}
                ]
              }
            }
          }
        });
        assert_eq!(d, want, "{d:#}");
        // No URL configured: no variable.
        let mut s = settings();
        s.api_url = None;
        let children = super::children(&host("agent", None, None), &s, &none()).unwrap();
        let env = &find(&children, ChildKind::Deployment)["spec"]["template"]["spec"]["containers"]
            [0]["env"];
        assert_eq!(env.as_array().unwrap().len(), 2);
        let volumes =
            &find(&children, ChildKind::Deployment)["spec"]["template"]["spec"]["volumes"];
        assert_eq!(
            volumes.as_array().unwrap().len(),
            2,
            "no secret volume without secretRef"
        );
    }

    #[test]
    fn role_is_scoped_to_the_host_and_its_secret() {
        let children = children(
            &host("agent", Some("agent-env"), None),
            &settings(),
            &none(),
        )
        .unwrap();
        assert_eq!(
            find(&children, ChildKind::Role)["rules"],
            json!([
                {"apiGroups": ["mcp-runtime.dev"], "resources": ["hosts"], "resourceNames": ["agent"], "verbs": ["get", "watch"]},
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["agent-env"], "verbs": ["get"]}
            ])
        );
        let binding = find(&children, ChildKind::RoleBinding);
        assert_eq!(binding["roleRef"]["name"], "agent-host");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "agent-host", "namespace": "team"}])
        );
        let without = super::children(&host("agent", None, None), &settings(), &none()).unwrap();
        let rules = find(&without, ChildKind::Role)["rules"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(
            rules.len(),
            1,
            "no secrets rule without a secretRef: {rules:?}"
        );
        assert_eq!(rules[0]["resources"], json!(["hosts"]));
    }

    #[test]
    fn egress_opens_exactly_the_granted_servers_gateways_dns_and_the_host_api() {
        let a = server("tools", "github", 8080);
        let b = server("team", "jira", 9000);
        let servers = [&b, &a, &a];
        let inputs = Inputs {
            servers: &servers,
            host_labels: None,
            live_workspace: None,
        };
        let children = children(&host("agent", None, None), &settings(), &inputs).unwrap();
        let policy = find(&children, ChildKind::NetworkPolicy);
        assert_eq!(policy["metadata"]["name"], "agent-host-egress");
        assert_eq!(policy["spec"]["podSelector"], host_pods("agent"));
        assert_eq!(policy["spec"]["policyTypes"], json!(["Egress"]));
        assert_eq!(
            policy["spec"]["egress"],
            json!([
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team"}},
                         "podSelector": {"matchLabels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/mcpserver": "jira"}}}],
                 "ports": [{"protocol": "TCP", "port": 8086}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}},
                         "podSelector": {"matchLabels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/mcpserver": "github"}}}],
                 "ports": [{"protocol": "TCP", "port": 8086}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mcp-access"}},
                         "podSelector": {"matchLabels": {"app": "mcp-access-controllers"}}}],
                 "ports": [{"protocol": "TCP", "port": 8443}]}
            ])
        );
        // The gateway port (--gateway-port), whatever spec.port says: never the MCP container.
        let mut other_port = settings();
        other_port.netpol.gateway_port = 9443;
        let children = super::children(&host("agent", None, None), &other_port, &inputs).unwrap();
        let egress = &find(&children, ChildKind::NetworkPolicy)["spec"]["egress"];
        assert_eq!(
            egress[0]["ports"],
            json!([{"protocol": "TCP", "port": 9443}])
        );
        assert_eq!(
            egress[1]["ports"],
            json!([{"protocol": "TCP", "port": 9443}])
        );
        // No Context (or nothing granted): DNS and the Host API only.
        let children = super::children(&host("agent", None, None), &settings(), &none()).unwrap();
        let rules = find(&children, ChildKind::NetworkPolicy)["spec"]["egress"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(rules, 2);
    }

    #[test]
    fn host_labels_go_on_the_pods_but_never_replace_ours() {
        let labels = std::collections::BTreeMap::from([
            ("host".to_string(), "dev".to_string()),
            ("team.example.org/tier".to_string(), "agents".to_string()),
            (HOST_LABEL.to_string(), "someone-else".to_string()),
            // A Host could otherwise make its pods pods of a server (its Service, its
            // external egress) or give them the Kubernetes API.
            (SERVER_LABEL.to_string(), "github".to_string()),
            (
                "mcp-runtime.dev/kube-api-access".to_string(),
                "true".to_string(),
            ),
            ("policy.MCP-Runtime.dev/x".to_string(), "y".to_string()),
            (
                "node-role.kubernetes.io/control-plane".to_string(),
                String::new(),
            ),
            ("k8s.io/x".to_string(), "y".to_string()),
        ]);
        let inputs = Inputs {
            servers: &[],
            host_labels: Some(&labels),
            live_workspace: None,
        };
        let children = children(&host("agent", None, None), &settings(), &inputs).unwrap();
        let d = find(&children, ChildKind::Deployment);
        let pod = &d["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod["host"], "dev");
        assert_eq!(pod["team.example.org/tier"], "agents");
        assert_eq!(pod[HOST_LABEL], "agent");
        assert_eq!(
            pod.as_object().unwrap().len(),
            4,
            "no reserved label is copied: {pod}"
        );
        assert_eq!(
            d["spec"]["selector"],
            host_pods("agent"),
            "the selector stays ours"
        );
    }

    #[test]
    fn workspace_grows_but_never_shrinks() {
        let claim = |size: Option<&str>, live: Option<&str>| {
            let inputs = Inputs {
                servers: &[],
                host_labels: None,
                live_workspace: live,
            };
            let children = children(&host("agent", None, size), &settings(), &inputs).unwrap();
            find(&children, ChildKind::PersistentVolumeClaim)["spec"].clone()
        };
        assert_eq!(
            claim(None, None),
            json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}})
        );
        assert_eq!(
            claim(Some("5Gi"), Some("1Gi"))["resources"]["requests"]["storage"],
            "5Gi"
        );
        assert_eq!(
            claim(Some("500Mi"), Some("2Gi"))["resources"]["requests"]["storage"],
            "2Gi"
        );
        assert_eq!(
            claim(Some("1G"), Some("1Gi"))["resources"]["requests"]["storage"],
            "1Gi"
        );
        assert_eq!(quantity_bytes("1.5Ki"), Some(1536.0));
        assert_eq!(quantity_bytes("2e3"), Some(2000.0));
        assert_eq!(quantity_bytes("3x"), None);
        assert_eq!(workspace_size("lots", Some("1Gi")), "lots");
    }

    #[test]
    fn names_fit_dns_labels() {
        assert_eq!(workload_name("agent"), "agent");
        assert_eq!(identity_name("agent"), "agent-host");
        let long = "a".repeat(60);
        let sa = identity_name(&long);
        assert!(sa.len() <= 63, "{sa}");
        assert_ne!(identity_name(&long), identity_name(&"a".repeat(61)));
        let dotted = workload_name("agent.v2");
        assert!(
            !dotted.contains('.') && dotted.starts_with("agent-v2-"),
            "{dotted}"
        );
        assert_ne!(dotted, workload_name("agent-v2"));
        assert_eq!(
            host_label("agent.v2"),
            "agent.v2",
            "a label value may hold dots"
        );
        let label = host_label(&"b".repeat(100));
        assert!(label.len() <= 63);
        assert_ne!(label, host_label(&"b".repeat(101)));
        // A fitted value is no Host's name: `_` is not allowed in one.
        assert!(label.contains('_') && !apis::validation::is_dns1123_subdomain(&label));
        let dotted = host_label(&format!("{}.{}", "c".repeat(45), "d".repeat(30)));
        assert!(
            dotted.len() <= 63 && dotted.starts_with(&"c".repeat(45)),
            "{dotted}"
        );
        assert!(dotted.chars().nth(45) == Some('_'), "{dotted}");
        for c in children(&host(&"x.".repeat(60), None, None), &settings(), &none()).unwrap() {
            assert!(c.name.len() <= 63 && !c.name.contains('.'), "{}", c.name);
            assert!(
                c.body["metadata"]["labels"][HOST_LABEL]
                    .as_str()
                    .unwrap()
                    .len()
                    <= 63
            );
        }
    }

    /// The digests of every child, pinned: a change to how bodies are built or hashed would
    /// make every live child look changed and re-apply the whole fleet once.
    #[test]
    fn digests_are_pinned() {
        let server = server("tools", "github", 8080);
        let servers = [&server];
        let inputs = Inputs {
            servers: &servers,
            host_labels: None,
            live_workspace: Some("2Gi"),
        };
        let got: Vec<String> = children(
            &host("agent", Some("agent-env"), None),
            &settings(),
            &inputs,
        )
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c.kind.as_str(),
                c.body["metadata"]["annotations"][crate::children::DESIRED_DIGEST]
                    .as_str()
                    .unwrap()
            )
        })
        .collect();
        assert_eq!(got, PINNED, "{got:#?}");
    }

    const PINNED: [&str; 7] = [
        "ServiceAccount ef4644fe97fc910681a3bc8cef473a3879970ac804c97ef28eeeb78be3df5e1a",
        "Role 943690f3a95c0ee04b9ccf4369f97e36995403714c9eff37e7bec76fabb7bd64",
        "RoleBinding d052bff0fb68f15c679ee6bb873201241918be7efb55337686a8b209f2d03f7c",
        "PersistentVolumeClaim 3e2f835c8666446ad84eb11bfba07a31ce6d199f3739a9fd614d9ba6279ad0b1",
        "NetworkPolicy 5ecb98dc5ea17f8f4a13a779ce5b728367d2f5fd1f0851a75ac68ea3d3cf6629",
        "Service 8ae280da82f76bbc3aec0a1e49686822b463cd758ca5216ef85d8e9879215c20",
        "Deployment f9e5f8bd249fc04653175eb1106e214b2740afee29b384fd5335e827b35ef826",
    ];
}
