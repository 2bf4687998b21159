//! Isolation proven by packets on the local node (`MCP_ACCESS_E2E_NODE=1`, `hack/node.sh`):
//! the MCPServer's Pod (the demo MCP server behind `mcp-access-gateway`, both from images
//! built from what is under test) and Host Pods (the official MCP Python SDK as the agent) run
//! under kubelet, and kube-router enforces the NetworkPolicies the controllers write. Every
//! verdict is a TCP connection opened from inside a Pod, or a tool called through the gateway.
//!
//! mcp-access-apiserver runs as a process of this machine here (as in every other scenario),
//! not as a Pod, so the controllers' L1 policy towards the apiserver Pods cannot select it: the
//! scenario adds the one stand-in an operator would, an ipBlock egress from the server's Pods to
//! the sync listener's address and port.

use std::time::Duration;

use e2e::node::{self, Probe};
use e2e::{LocalCluster, NODE_IP};
use serde_json::{json, Value};

use super::{create_namespace, ok};

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const SERVER_NS: &str = "node-srv";
const GRANTED_NS: &str = "node-granted";
const OTHER_NS: &str = "node-other";

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn e<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |err| format!("{what}: {err:#}")
}

fn apply(c: &LocalCluster, manifest: &Value, what: &str) -> Result<(), String> {
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["apply", "-f", "-"],
            Some(&manifest.to_string()),
        ),
        what,
    )
    .map(|_| ())
}

/// A PersistentVolume bound in advance to Host `ns/host`'s workspace claim: the node has no
/// volume provisioner, so the test hands each claim a hostPath volume of its own.
fn workspace_volume(c: &LocalCluster, ns: &str, host: &str) -> Result<(), String> {
    let path = c.dir.join(format!("volumes/{ns}-{host}"));
    std::fs::create_dir_all(&path).map_err(e("the volume directory"))?;
    // The host container runs as 65532 and writes its workspace.
    let _ = std::process::Command::new("chown")
        .arg("65532:65532")
        .arg(&path)
        .status();
    apply(
        c,
        &json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": format!("{ns}-{host}-workspace")},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "",
                "hostPath": {"path": path.to_string_lossy(), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": format!("{host}-workspace")},
            },
        }),
        "the workspace PersistentVolume",
    )
}

fn host(c: &LocalCluster, ns: &str, name: &str, context: &str) -> Result<(), String> {
    workspace_volume(c, ns, name)?;
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Host",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "contextRef": {"name": context},
                "image": node::demo_host_image().map_err(e("the host image"))?,
                "workspaceSize": "1Gi",
            },
        }),
        "the Host",
    )
}

fn context(c: &LocalCluster, ns: &str, name: &str, servers: Value) -> Result<(), String> {
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Context",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"mcpServers": servers, "hostSelector": {"matchLabels": {"agents": name}}},
        }),
        "the Context",
    )
}

/// The stand-in for L1 while mcp-access-apiserver runs outside the cluster (module doc).
fn sync_egress(c: &LocalCluster, ns: &str) -> Result<(), String> {
    apply(
        c,
        &json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "e2e-gateway-sync-on-the-node", "namespace": ns},
            "spec": {
                "podSelector": {"matchExpressions": [
                    {"key": "mcp-runtime.dev/mcpserver", "operator": "Exists"}]},
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [{"ipBlock": {"cidr": format!("{NODE_IP}/32")}}],
                    "ports": [{"protocol": "TCP", "port": c.sync_port}],
                }],
            },
        }),
        "the sync egress stand-in",
    )
}

fn refused(p: &Probe, what: &str) -> Result<(), String> {
    ensure!(
        p.refused_by_policy(),
        "{what}: want the connection to {} refused by a policy, got {p:?}",
        p.target
    );
    Ok(())
}

/// Hosts of the Context that grants the server open the gateway port and call a tool with a
/// session token through the official SDK; a Host of another Context, and a Pod of the granted
/// Context's namespace that is not one of its hosts, cannot open the connection; no Pod opens
/// the MCP container's own port, though it listens on every address of its Pod.
pub fn packets_follow_the_contexts(c: &mut LocalCluster) -> Result<(), String> {
    for ns in [SERVER_NS, GRANTED_NS, OTHER_NS] {
        create_namespace(c, ns)?;
    }
    let bin =
        std::env::var("MCP_ACCESS_CONTROLLERS_BIN").map_err(e("MCP_ACCESS_CONTROLLERS_BIN"))?;
    let runtime = format!("--runtime-namespace={SERVER_NS}");
    let _controllers = c
        .start_controllers(std::path::Path::new(&bin), "node-packets", &[&runtime])
        .map_err(e("the controllers"))?;
    sync_egress(c, SERVER_NS)?;

    let image = node::demo_server_image().map_err(e("the server image"))?;
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": "demo", "namespace": SERVER_NS},
            "spec": {"image": image, "port": 8080},
        }),
        "the MCPServer",
    )?;
    context(
        c,
        GRANTED_NS,
        "granted",
        json!([{"name": "demo", "namespace": SERVER_NS}]),
    )?;
    context(c, OTHER_NS, "other", json!([]))?;
    host(c, GRANTED_NS, "agent-a", "granted")?;
    host(c, OTHER_NS, "agent-b", "other")?;
    // A Pod of the granted Context's namespace that is none of its hosts.
    apply(
        c,
        &json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bystander", "namespace": GRANTED_NS, "labels": {"role": "bystander"}},
            "spec": {"containers": [{
                "name": "bystander",
                "image": node::demo_host_image().map_err(e("the host image"))?,
                "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
            }]},
        }),
        "the bystander Pod",
    )?;

    node::wait_ready(c, SERVER_NS, "demo", READY_TIMEOUT).map_err(e("the MCPServer's Pod"))?;
    node::wait_ready(c, GRANTED_NS, "agent-a", READY_TIMEOUT).map_err(e("Host agent-a"))?;
    node::wait_ready(c, OTHER_NS, "agent-b", READY_TIMEOUT).map_err(e("Host agent-b"))?;
    ok(
        &c.kubectl(&[
            "wait",
            "--for=condition=Ready",
            "pod/bystander",
            "-n",
            GRANTED_NS,
            "--timeout=120s",
        ]),
        "the bystander Pod",
    )?;
    let (_, server_ip) = node::pod_of(c, SERVER_NS, "mcp-runtime.dev/mcpserver=demo")
        .map_err(e("the server Pod"))?;
    let (agent_a, _) =
        node::pod_of(c, GRANTED_NS, "mcp-runtime.dev/host=agent-a").map_err(e("agent-a's Pod"))?;
    let (agent_b, _) =
        node::pod_of(c, OTHER_NS, "mcp-runtime.dev/host=agent-b").map_err(e("agent-b's Pod"))?;

    // A session for the server and its token, as a user would get them.
    let server_uid = ok(
        &c.kubectl(&[
            "get",
            "mcpserver",
            "demo",
            "-n",
            SERVER_NS,
            "-o",
            "jsonpath={.metadata.uid}",
        ]),
        "the MCPServer's uid",
    )?;
    apply(
        c,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "AccessSession",
            "metadata": {"name": "agent-a", "namespace": SERVER_NS},
            "spec": {
                "server": {"name": "demo", "uid": server_uid},
                "teams": ["payments"],
                "subject": {"user": "agent-a@example.com"},
                "expiresAt": "2099-01-01T00:00:00Z",
            },
        }),
        "the AccessSession",
    )?;
    let token = e2e::mcp::session_token_for(c, SERVER_NS, "agent-a", 600)
        .map_err(e("the session token"))?;

    let gateway = format!("demo.{SERVER_NS}.svc:8086");
    let url = format!("http://{gateway}/mcp");
    let called = node::sdk_client_in_pod(c, GRANTED_NS, &agent_a, &url, &token, "basic")
        .map_err(e("the SDK client in agent-a"))?;
    ensure!(
        called["ok"] == true && called["echo"] == "hello through the gateway",
        "agent-a, granted, could not call a tool through the gateway: {called}"
    );
    let from_a = node::probe(c, GRANTED_NS, &agent_a, &gateway).map_err(e("probe"))?;
    ensure!(
        from_a.connected,
        "agent-a cannot open the gateway port: {from_a:?}"
    );

    refused(
        &node::probe(c, OTHER_NS, &agent_b, &gateway).map_err(e("probe"))?,
        "agent-b, a host of a Context that does not grant the server",
    )?;
    refused(
        &node::probe(c, GRANTED_NS, "bystander", &gateway).map_err(e("probe"))?,
        "a Pod of the granted namespace that is not a host of the Context",
    )?;
    let mcp_port = format!("{server_ip}:8080");
    for (ns, pod) in [
        (GRANTED_NS, agent_a.as_str()),
        (OTHER_NS, agent_b.as_str()),
        (GRANTED_NS, "bystander"),
    ] {
        refused(
            &node::probe(c, ns, pod, &mcp_port).map_err(e("probe"))?,
            &format!("{ns}/{pod} to the MCP container's own port"),
        )?;
    }
    Ok(())
}
