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

use std::time::{Duration, Instant};

use e2e::node::{self, Probe};
use e2e::{LocalCluster, NODE_IP as NODE_IP_STR};
use serde_json::{json, Value};

use super::{create_namespace, ok};

const READY_TIMEOUT: Duration = Duration::from_secs(120);

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
    node::apply(c, manifest).map_err(e(what))
}

fn host(c: &LocalCluster, ns: &str, name: &str, context: &str) -> Result<(), String> {
    node::host(c, ns, name, context).map_err(e("the Host"))
}

fn context(c: &LocalCluster, ns: &str, name: &str, servers: Value) -> Result<(), String> {
    node::context(c, ns, name, servers).map_err(e("the Context"))
}

fn sync_egress(c: &LocalCluster, ns: &str) -> Result<(), String> {
    node::sync_egress(c, ns).map_err(e("the sync egress stand-in"))
}

fn refused(p: &Probe, what: &str) -> Result<(), String> {
    ensure!(
        p.refused_by_policy(),
        "{what}: want the connection to {} refused by a policy, got {p:?}",
        p.target
    );
    Ok(())
}

/// One MCPServer (`demo`, the demo MCP server behind its gateway) in `<prefix>-srv`, a runtime
/// namespace; Context `granted` in `<prefix>-granted` grants it to Host `agent-a`; Context `other`
/// in `<prefix>-other` grants nothing to Host `agent-b`; Pod `bystander` in the granted
/// namespace is none of its hosts. Everything Ready, with a session for agent-a and its token.
struct Topology {
    server_ns: String,
    granted_ns: String,
    other_ns: String,
    server_ip: String,
    server_pod: String,
    agent_a: String,
    agent_b: String,
    token: String,
    /// `demo.<server ns>.svc:8086`, the gateway's Service.
    gateway: String,
    _controllers: e2e::Controllers,
}

impl Topology {
    fn start(c: &mut LocalCluster, prefix: &str) -> Result<Self, String> {
        let server_ns = format!("{prefix}-srv");
        let granted_ns = format!("{prefix}-granted");
        let other_ns = format!("{prefix}-other");
        for ns in [&server_ns, &granted_ns, &other_ns] {
            create_namespace(c, ns)?;
        }
        let bin =
            std::env::var("MCP_ACCESS_CONTROLLERS_BIN").map_err(e("MCP_ACCESS_CONTROLLERS_BIN"))?;
        let runtime = format!("--runtime-namespace={server_ns}");
        let controllers = c
            .start_controllers(std::path::Path::new(&bin), prefix, &[&runtime])
            .map_err(e("the controllers"))?;
        sync_egress(c, &server_ns)?;

        let image = node::demo_server_image().map_err(e("the server image"))?;
        apply(
            c,
            &json!({
                "apiVersion": "mcp-runtime.dev/v1alpha1",
                "kind": "MCPServer",
                "metadata": {"name": "demo", "namespace": server_ns},
                // Its owners admit the Contexts of other namespaces (the hosts' are).
                "spec": {
                    "image": image,
                    "port": 8080,
                    "allowedContexts": {"namespaces": {"from": "All"}},
                },
            }),
            "the MCPServer",
        )?;
        context(
            c,
            &granted_ns,
            "granted",
            json!([{"name": "demo", "namespace": server_ns}]),
        )?;
        context(c, &other_ns, "other", json!([]))?;
        host(c, &granted_ns, "agent-a", "granted")?;
        host(c, &other_ns, "agent-b", "other")?;
        apply(
            c,
            &json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bystander", "namespace": granted_ns, "labels": {"role": "bystander"}},
                "spec": {"containers": [{
                    "name": "bystander",
                    "image": node::demo_host_image().map_err(e("the host image"))?,
                    "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
                }]},
            }),
            "the bystander Pod",
        )?;

        node::wait_ready(c, &server_ns, "demo", READY_TIMEOUT).map_err(e("the MCPServer's Pod"))?;
        node::wait_ready(c, &granted_ns, "agent-a", READY_TIMEOUT).map_err(e("Host agent-a"))?;
        node::wait_ready(c, &other_ns, "agent-b", READY_TIMEOUT).map_err(e("Host agent-b"))?;
        ok(
            &c.kubectl(&[
                "wait",
                "--for=condition=Ready",
                "pod/bystander",
                "-n",
                &granted_ns,
                "--timeout=120s",
            ]),
            "the bystander Pod",
        )?;
        let (server_pod, server_ip) = node::pod_of(c, &server_ns, "mcp-runtime.dev/mcpserver=demo")
            .map_err(e("the server Pod"))?;
        let (agent_a, _) = node::pod_of(c, &granted_ns, "mcp-runtime.dev/host=agent-a")
            .map_err(e("agent-a's Pod"))?;
        let (agent_b, _) = node::pod_of(c, &other_ns, "mcp-runtime.dev/host=agent-b")
            .map_err(e("agent-b's Pod"))?;

        // A session for the server and its token, as a user would get them.
        let server_uid = ok(
            &c.kubectl(&[
                "get",
                "mcpserver",
                "demo",
                "-n",
                &server_ns,
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
                "metadata": {"name": "agent-a", "namespace": server_ns},
                "spec": {
                    "server": {"name": "demo", "uid": server_uid},
                    "teams": ["payments"],
                    "subject": {"user": "agent-a@example.com"},
                    "expiresAt": "2099-01-01T00:00:00Z",
                },
            }),
            "the AccessSession",
        )?;
        let token = e2e::mcp::session_token_for(c, &server_ns, "agent-a", 600)
            .map_err(e("the session token"))?;
        let gateway = format!("demo.{server_ns}.svc:8086");
        Ok(Self {
            server_ns,
            granted_ns,
            other_ns,
            server_ip,
            server_pod,
            agent_a,
            agent_b,
            token,
            gateway,
            _controllers: controllers,
        })
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.gateway)
    }
}

/// Hosts of the Context that grants the server open the gateway port and call a tool with a
/// session token through the official SDK; a Host of another Context, and a Pod of the granted
/// Context's namespace that is not one of its hosts, cannot open the connection; no Pod opens
/// the MCP container's own port, though it listens on every address of its Pod. np-guard's
/// verdict on the live policies agrees with the packets on every cell.
pub fn packets_follow_the_contexts(c: &mut LocalCluster) -> Result<(), String> {
    let t = Topology::start(c, "node-packets")?;
    let called = node::sdk_client_in_pod(c, &t.granted_ns, &t.agent_a, &t.url(), &t.token, "basic")
        .map_err(e("the SDK client in agent-a"))?;
    ensure!(
        called["ok"] == true && called["echo"] == "hello through the gateway",
        "agent-a, granted, could not call a tool through the gateway: {called}"
    );
    let from_a = node::probe(c, &t.granted_ns, &t.agent_a, &t.gateway).map_err(e("probe"))?;
    ensure!(
        from_a.connected,
        "agent-a cannot open the gateway port: {from_a:?}"
    );

    refused(
        &node::probe(c, &t.other_ns, &t.agent_b, &t.gateway).map_err(e("probe"))?,
        "agent-b, a host of a Context that does not grant the server",
    )?;
    refused(
        &node::probe(c, &t.granted_ns, "bystander", &t.gateway).map_err(e("probe"))?,
        "a Pod of the granted namespace that is not a host of the Context",
    )?;

    // The same matrix, Pod to Pod: the packets' verdict, np-guard's verdict on the live
    // policies, and what the design says, all three alike.
    let sources = [
        (t.granted_ns.as_str(), t.agent_a.as_str()),
        (t.other_ns.as_str(), t.agent_b.as_str()),
        (t.granted_ns.as_str(), "bystander"),
    ];
    let mut matrix = Vec::new();
    for (ns, pod) in sources {
        for port in [8086u16, 8080] {
            let want = pod == t.agent_a && port == 8086;
            let target = format!("{}:{port}", t.server_ip);
            let packets = node::probe(c, ns, pod, &target).map_err(e("probe"))?;
            let oracle = node::oracle_allows(c, (ns, pod), (&t.server_ns, &t.server_pod), port)
                .map_err(e("np-guard"))?;
            matrix.push(format!(
                "{ns}/{pod} -> {port}: packets {}, np-guard {oracle}, want {want}",
                packets.connected
            ));
            if want {
                ensure!(
                    packets.connected,
                    "{ns}/{pod} cannot open {target}: {packets:?}"
                );
            } else {
                refused(
                    &packets,
                    &format!("{ns}/{pod} to the server Pod's port {port}"),
                )?;
            }
            ensure!(
                oracle == want,
                "np-guard says {ns}/{pod} -> {target} is {}allowed; the packets say {}",
                if oracle { "" } else { "not " },
                packets.connected
            );
        }
    }
    eprintln!("    packets and np-guard agree: {}", matrix.join("; "));
    Ok(())
}

/// How long after `kubectl create revocation` returns the open tool call of a host Pod may
/// still run: the revoke-to-deny bound, measured through the gateway Pod.
const CUT_BOUND: Duration = Duration::from_secs(1);

/// A host Pod's open `count` stream through the gateway Pod ends within 1 s of the Revocation's
/// creation, with the gateway's JSON-RPC error naming `session_revoked`; the token is refused
/// from then on.
pub fn revocation_cuts_a_host_pod_within_a_second(c: &mut LocalCluster) -> Result<(), String> {
    let t = Topology::start(c, "node-revoke")?;
    // 600 steps of 100 ms: a minute of streaming unless it is cut.
    let mut client = node::spawn_sdk_client_in_pod(
        c,
        &t.granted_ns,
        &t.agent_a,
        &t.url(),
        &t.token,
        "count",
        &["--count", "600", "--delay-ms", "100"],
    )
    .map_err(e("the streaming client in agent-a"))?;
    client
        .next_progress(Duration::from_secs(60))
        .map_err(e("the first progress through the gateway Pod"))?;
    client
        .next_progress(Duration::from_secs(10))
        .map_err(e("the second progress"))?;
    let revocation = format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {{name: rvk-agent-a, namespace: {}}}\nspec: {{target: {{session: agent-a}}, cause: compromised}}\n",
        t.server_ns
    );
    let asked = Instant::now();
    ok(
        &c.kubectl_as(&c.kubeconfig, &["create", "-f", "-"], Some(&revocation)),
        "kubectl create revocation",
    )?;
    let written = Instant::now();
    let run = client
        .finish(Duration::from_secs(30))
        .map_err(e("the stream was not cut"))?;
    let after = run.ended.saturating_duration_since(written);
    let r = &run.result;
    eprintln!(
        "    host Pod's stream cut {after:?} after kubectl create revocation returned, {:?} after \
         it started ({} steps)",
        run.ended.saturating_duration_since(asked),
        run.progress.len()
    );
    ensure!(
        r["ok"] == false && r["count"].is_null(),
        "the tool call completed after the revocation: {r}"
    );
    ensure!(
        r["error"].to_string().contains("session_revoked"),
        "the host got {} — not the gateway's JSON-RPC error naming session_revoked",
        r["error"]
    );
    ensure!(
        after <= CUT_BOUND,
        "the stream ended {after:?} after kubectl create revocation returned (bound {CUT_BOUND:?})"
    );
    let again = node::sdk_client_in_pod(c, &t.granted_ns, &t.agent_a, &t.url(), &t.token, "basic")
        .map_err(e("the SDK client after the revocation"))?;
    ensure!(
        again["ok"] == false,
        "the revoked token still works from the host Pod: {again}"
    );
    Ok(())
}

/// The partner API of the L3 scenario: a public-looking address that exists only in a network
/// namespace this test made (routed there on this machine, so nothing leaves it), and a second
/// address beside it that no binding names.
const PARTNER_ADDR: &str = "11.22.33.44";
const UNBOUND_ADDR: &str = "11.22.33.45";

/// L3 by packets: an MCPServer with an ExactHost egress binding (one address, one port) reaches
/// that address and port from its own Pod, and nothing else outside the cluster: not another
/// port of it, not the address beside it, not the Kubernetes API; the cluster DNS always answers.
pub fn egress_reaches_only_the_bound_address(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "node-l3";
    create_namespace(c, ns)?;
    let _partner = node::TestHost::start(
        "l3",
        ("10.251.0.1", "10.251.0.2"),
        &[PARTNER_ADDR, UNBOUND_ADDR],
        &[9443, 9444],
    )
    .map_err(e("the partner test host"))?;
    let bin =
        std::env::var("MCP_ACCESS_CONTROLLERS_BIN").map_err(e("MCP_ACCESS_CONTROLLERS_BIN"))?;
    let runtime = format!("--runtime-namespace={ns}");
    let _controllers = c
        .start_controllers(std::path::Path::new(&bin), "node-l3", &[&runtime])
        .map_err(e("the controllers"))?;
    sync_egress(c, ns)?;
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": "partner", "namespace": ns},
            "spec": {
                "image": node::demo_server_image().map_err(e("the server image"))?,
                "port": 8080,
                "egressBindings": [{
                    "name": "partner-api",
                    "type": "ExactHost",
                    "cidr": format!("{PARTNER_ADDR}/32"),
                    "port": 9443,
                }],
            },
        }),
        "the MCPServer",
    )?;
    node::wait_ready(c, ns, "partner", READY_TIMEOUT).map_err(e("the MCPServer's Pod"))?;
    let (pod, _) =
        node::pod_of(c, ns, "mcp-runtime.dev/mcpserver=partner").map_err(e("its Pod"))?;
    let from_server = |target: &str| {
        node::probe_from(c, ns, &pod, Some("mcp"), target)
            .map_err(e("probe from the MCP container"))
    };

    let bound = from_server(&format!("{PARTNER_ADDR}:9443"))?;
    ensure!(
        bound.connected,
        "the server cannot reach its bound destination: {bound:?}"
    );
    refused(
        &from_server(&format!("{PARTNER_ADDR}:9444"))?,
        "another port of the bound address",
    )?;
    refused(
        &from_server(&format!("{UNBOUND_ADDR}:9443"))?,
        "the address beside the bound one",
    )?;
    refused(&from_server("10.0.0.1:443")?, "the Kubernetes API")?;
    let dns = from_server("kube-dns.kube-system.svc.cluster.local:53")?;
    ensure!(
        dns.connected,
        "the cluster DNS is not reachable from the server: {dns:?}"
    );
    Ok(())
}

/// `deploy/` as a user installs it (kustomize), on the node, with the images built from what is
/// under test: the apiserver Deployment (two replicas) behind its APIService, the controllers
/// (two replicas, leader-elected) with their RBAC and NetworkPolicy, against the test's
/// PostgreSQL. kubectl then works through the apiserver Pods. Runs last: it takes the APIService
/// and the controllers' Lease, and gives the APIService back to the harness's process after.
pub fn deploy_manifests_run_as_installed(c: &mut LocalCluster) -> Result<(), String> {
    let result = deploy_and_use(c);
    // Whatever happened: the harness's apiserver behind the APIService again, no controllers of
    // deploy/ left to hold the Lease.
    let _ = c.kubectl(&[
        "delete",
        "deployment",
        "mcp-access-controllers",
        "mcp-access-apiserver",
        "-n",
        "mcp-access",
        "--ignore-not-found",
        "--wait=false",
    ]);
    let _ = delete_apiserver_service(c);
    c.register_apiservice()
        .map_err(e("giving the APIService back"))?;
    result
}

/// Service `mcp-access/mcp-access-apiserver`, the harness's (ExternalName) or deploy/'s.
fn delete_apiserver_service(c: &LocalCluster) -> Result<(), String> {
    ok(
        &c.kubectl(&[
            "delete",
            "service",
            "mcp-access-apiserver",
            "-n",
            "mcp-access",
            "--ignore-not-found",
        ]),
        "delete Service mcp-access/mcp-access-apiserver",
    )
    .map(|_| ())
}

fn deploy_and_use(c: &mut LocalCluster) -> Result<(), String> {
    let env = |k: &str| {
        c.env
            .get(k)
            .cloned()
            .ok_or_else(|| format!("{k} missing from the cluster env"))
    };
    // The test's PostgreSQL listens on loopback; Pods reach it through a forwarder on the node's
    // address.
    let dsn = c.database_url.clone();
    let field = |k: &str| {
        dsn.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_string))
            .ok_or_else(|| format!("the test DSN has no {k}= (key=value form expected)"))
    };
    let target: std::net::SocketAddr = format!("{}:{}", field("host")?, field("port")?)
        .parse()
        .map_err(e("the test DSN's address"))?;
    let forward =
        node::TcpForward::start(NODE_IP_STR, target).map_err(e("the PostgreSQL forwarder"))?;
    let pod_dsn = dsn
        .split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some(("host", _)) => format!("host={NODE_IP_STR}"),
            Some(("port", _)) => format!("port={}", forward.port),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ");

    let overlay = c.dir.join("deploy-overlay");
    std::fs::create_dir_all(&overlay).map_err(e("the overlay directory"))?;
    let copy = |from: &str, to: &str| {
        std::fs::copy(env(from)?, overlay.join(to))
            .map(|_| ())
            .map_err(e(to))
    };
    copy("MCP_ACCESS_TLS_CERT_FILE", "apiserver-tls.crt")?;
    copy("MCP_ACCESS_TLS_PRIVATE_KEY_FILE", "apiserver-tls.key")?;
    copy("AGGREGATED_CA_FILE", "sync-ca.crt")?;
    copy("SESSION_TOKEN_SIGNING_KEY_FILE", "signing-key.pem")?;
    copy("HOST_API_TLS_CERT_FILE", "host-api-tls.crt")?;
    copy("HOST_API_TLS_KEY_FILE", "host-api-tls.key")?;
    copy("HOST_TOKEN_PUBLIC_KEY_FILE", "public-key.pem")?;
    let ca_bundle = {
        use base64::Engine;
        let pem = std::fs::read(env("AGGREGATED_CA_FILE")?).map_err(e("the aggregated CA"))?;
        base64::engine::general_purpose::STANDARD.encode(pem)
    };
    // Relative: kustomize takes bases by path from the overlay.
    let root = e2e::repo_root();
    let up = "../".repeat(overlay.components().count() - 1);
    let base = |d: &str| {
        format!(
            "{up}{}",
            root.join(d).display().to_string().trim_start_matches('/')
        )
    };
    let image_tag = e2e::NODE_GATEWAY_IMAGE
        .rsplit_once(':')
        .map(|(_, t)| t)
        .unwrap_or("local");
    let kustomization = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base_dir}
  - {controllers_dir}
images:
  - {{name: ghcr.io/mcp-runtime/mcp-access-apiserver, newTag: {image_tag}}}
  - {{name: ghcr.io/mcp-runtime/mcp-access-controllers, newTag: {image_tag}}}
generatorOptions: {{disableNameSuffixHash: true}}
secretGenerator:
  - name: mcp-access-apiserver-tls
    namespace: mcp-access
    type: kubernetes.io/tls
    files: [tls.crt=apiserver-tls.crt, tls.key=apiserver-tls.key]
  - name: mcp-access-database
    namespace: mcp-access
    literals: ["url={pod_dsn}"]
  - name: mcp-access-session-token
    namespace: mcp-access
    files: [signing-key.pem]
  - name: mcp-access-host-api-tls
    namespace: mcp-access
    type: kubernetes.io/tls
    files: [tls.crt=host-api-tls.crt, tls.key=host-api-tls.key]
configMapGenerator:
  - name: mcp-access-session-token
    namespace: mcp-access
    behavior: replace
    literals: ["issuer={issuer}"]
  - name: mcp-access-sync-ca
    namespace: mcp-access
    files: [ca.crt=sync-ca.crt]
  - name: mcp-access-host-token
    namespace: mcp-access
    files: [public-key.pem]
    literals: ["issuer={host_issuer}", "audience={host_audience}"]
patches:
  - target: {{kind: APIService, name: v1alpha1.access.mcp-runtime.dev}}
    patch: |
      - {{op: add, path: /spec/caBundle, value: "{ca_bundle}"}}
  # The apiserver's NetworkPolicy narrowed as its comment asks: kube-apiserver runs on this
  # machine (the node's address) and so does the test's PostgreSQL, behind the forwarder.
  - target: {{kind: NetworkPolicy, name: mcp-access-apiserver}}
    patch: |
      - {{op: replace, path: /spec/ingress/1/from/0/ipBlock/cidr, value: "{node_ip}/32"}}
      - {{op: replace, path: /spec/egress/2, value: {{to: [{{ipBlock: {{cidr: "{node_ip}/32"}}}}], ports: [{{protocol: TCP, port: {pg_port}}}]}}}}
  - target: {{kind: Deployment, name: mcp-access-controllers}}
    patch: |
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: mcp-access-controllers, namespace: mcp-access}}
      spec:
        template:
          spec:
            containers:
              - name: controllers
                env:
                  - {{name: MCP_ACCESS_GATEWAY_IMAGE, value: "{gateway_image}"}}
"#,
        base_dir = base("deploy/base"),
        controllers_dir = base("deploy/controllers"),
        issuer = env("SESSION_TOKEN_ISSUER")?,
        host_issuer = env("HOST_TOKEN_ISSUER")?,
        host_audience = env("HOST_TOKEN_AUDIENCE")?,
        gateway_image = e2e::NODE_GATEWAY_IMAGE,
        node_ip = NODE_IP_STR,
        pg_port = forward.port,
    );
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).map_err(e("the overlay"))?;

    // The harness's ExternalName Service of the same name gives way to deploy/'s.
    delete_apiserver_service(c)?;
    let overlay_path = overlay.display().to_string();
    ok(
        &c.kubectl(&["apply", "-k", &overlay_path]),
        "kubectl apply -k (deploy/ with the overlay)",
    )?;

    for name in ["mcp-access-apiserver", "mcp-access-controllers"] {
        node::wait_replicas(
            c,
            "mcp-access",
            name,
            if name == "mcp-access-apiserver" { 2 } else { 1 },
            READY_TIMEOUT,
        )
        .map_err(e(name))?;
    }
    ok(
        &c.kubectl(&[
            "wait",
            "--for=condition=Available",
            "apiservice/v1alpha1.access.mcp-runtime.dev",
            "--timeout=60s",
        ]),
        "the APIService served by the Pods",
    )?;
    // No Pod of deploy/ restarts: every container started from its manifest and stayed up.
    let restarts = ok(
        &c.kubectl(&["get", "pods", "-n", "mcp-access", "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[*].restartCount}{\"\\n\"}{end}"]),
        "the Pods of deploy/",
    )?;
    let pods: Vec<&str> = restarts.lines().filter(|l| !l.trim().is_empty()).collect();
    ensure!(
        pods.len() >= 4,
        "want 2 apiserver and 2 controllers Pods, got {pods:?}"
    );
    ensure!(
        pods.iter().all(|l| l.ends_with(" Running 0")),
        "a Pod of deploy/ is not running or restarted: {pods:?}"
    );

    // kubectl through kube-apiserver, the APIService and the Pods.
    let ns = "node-deploy";
    create_namespace(c, ns)?;
    let session = format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata: {{name: through-pods, namespace: {ns}}}\nspec:\n  server: {{name: github, uid: 7d4c0d2e-0000-4000-8000-000000000001}}\n  subject: {{user: alice@example.com}}\n  teams: [payments]\n  expiresAt: \"2099-01-01T00:00:00Z\"\n"
    );
    ok(
        &c.kubectl_as(&c.kubeconfig, &["create", "-f", "-"], Some(&session)),
        "kubectl create accesssession",
    )?;
    let listed = ok(
        &c.kubectl(&["get", "accesssessions", "-n", ns, "-o", "name"]),
        "kubectl get accesssessions",
    )?;
    ensure!(
        listed.trim() == "accesssession.access.mcp-runtime.dev/through-pods",
        "kubectl get accesssessions -n {ns} listed {listed:?}"
    );
    let logs = ok(
        &c.kubectl(&[
            "logs",
            "-n",
            "mcp-access",
            "-l",
            "app=mcp-access-apiserver",
            "--tail=-1",
            "--prefix",
        ]),
        "the apiserver Pods' logs",
    )?;
    ensure!(
        logs.lines()
            .any(|l| l.contains("\"create\"") && l.contains(ns)),
        "no apiserver Pod logged the create in {ns}: the request did not go through the Pods"
    );
    apiserver_policy_by_packets(c)?;
    runtime_namespaces_as_shipped(c, ns)?;
    drop(forward);
    Ok(())
}

/// The apiserver's NetworkPolicy of deploy/base, by packets: a Pod labelled as the
/// controllers label gateway Pods opens the sync listener (8085) and not the API port; a Pod
/// without those labels opens neither. kube-apiserver still reaches the API port: the APIService
/// stayed Available, and kubectl went through the Pods above.
fn apiserver_policy_by_packets(c: &LocalCluster) -> Result<(), String> {
    let ns = "node-deploy-peers";
    create_namespace(c, ns)?;
    let image = node::demo_host_image().map_err(e("the host image"))?;
    for (name, labels) in [
        (
            "gateway-like",
            json!({"mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/mcpserver": "demo"}),
        ),
        ("bystander", json!({"role": "bystander"})),
    ] {
        apply(
            c,
            &json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"containers": [{
                    "name": name,
                    "image": image,
                    "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
                }]},
            }),
            name,
        )?;
    }
    for name in ["gateway-like", "bystander"] {
        ok(
            &c.kubectl(&[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{name}"),
                "-n",
                ns,
                "--timeout=120s",
            ]),
            name,
        )?;
    }
    let sync = "mcp-access-apiserver.mcp-access.svc:8085";
    let api = "mcp-access-apiserver.mcp-access.svc:443";
    let probe = |pod: &str, target: &str| node::probe(c, ns, pod, target).map_err(e("probe"));
    let p = probe("gateway-like", sync)?;
    ensure!(
        p.connected,
        "a gateway Pod does not reach the sync listener: {p:?}"
    );
    refused(
        &probe("bystander", sync)?,
        "a Pod that is no gateway, on 8085",
    )?;
    refused(&probe("bystander", api)?, "a Pod, on the API port")?;
    refused(
        &probe("gateway-like", api)?,
        "a gateway Pod, on the API port",
    )?;
    let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    Ok(())
}

/// deploy/controllers as shipped: `mcp-servers` is the runtime namespace and
/// `--require-runtime-namespace` is set. A server there runs isolated (its L0 and L1 in place)
/// and its gateway syncs with the apiserver Pods through both their policies (it is Ready only
/// after a complete sync); a server of `elsewhere` is not deployed, and its conditions say why.
fn runtime_namespaces_as_shipped(c: &LocalCluster, elsewhere: &str) -> Result<(), String> {
    let ns = "mcp-servers";
    create_namespace(c, ns)?;
    let image = node::demo_server_image().map_err(e("the server image"))?;
    let server = |namespace: &str| {
        json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": "demo", "namespace": namespace},
            "spec": {"image": image, "port": 8080},
        })
    };
    apply(c, &server(ns), "the MCPServer in mcp-servers")?;
    apply(c, &server(elsewhere), "the MCPServer elsewhere")?;
    node::wait_ready(c, ns, "demo", READY_TIMEOUT)
        .map_err(e("the gateway syncing through the policies"))?;
    let condition = |namespace: &str, type_: &str| -> Result<(String, String), String> {
        let out = ok(
            &c.kubectl(&[
                "get",
                "mcpserver",
                "demo",
                "-n",
                namespace,
                "-o",
                &format!(
                    "jsonpath={{.status.conditions[?(@.type==\"{type_}\")].status}} {{.status.conditions[?(@.type==\"{type_}\")].reason}}"
                ),
            ]),
            "the MCPServer's conditions",
        )?;
        let (status, reason) = out.trim().split_once(' ').unwrap_or_default();
        Ok((status.to_string(), reason.to_string()))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let isolated = condition(ns, "NetworkIsolated")?;
        let exposed = condition(elsewhere, "NetworkIsolated")?;
        let ready = condition(elsewhere, "Ready")?;
        let want_out = ("False".to_string(), "OutsideRuntimeNamespace".to_string());
        if isolated.0 == "True" && exposed == want_out && ready == want_out {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "conditions: {ns} NetworkIsolated {isolated:?}; {elsewhere} NetworkIsolated {exposed:?}, Ready {ready:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let deployment = c.kubectl(&["get", "deployment", "demo", "-n", elsewhere]);
    ensure!(
        !deployment.success,
        "the server outside the runtime namespaces was deployed: {}",
        deployment.stdout
    );
    let policies = ok(
        &c.kubectl(&["get", "networkpolicy", "-n", ns, "-o", "name"]),
        "the runtime namespace's policies",
    )?;
    ensure!(
        policies.contains("mcp-l0-deny-all") && policies.contains("mcp-l1-gateway-sync"),
        "mcp-servers lacks its L0/L1: {policies}"
    );
    for namespace in [ns, elsewhere] {
        let _ = c.kubectl(&[
            "delete",
            "mcpserver",
            "demo",
            "-n",
            namespace,
            "--timeout=60s",
        ]);
    }
    Ok(())
}

/// `hack/node.sh` with `args`, its environment plus `env`: (success, stdout + stderr, how long).
fn node_sh(
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<(bool, String, Duration), String> {
    let started = Instant::now();
    let out = std::process::Command::new("bash")
        .arg(e2e::repo_root().join("hack/node.sh"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .map_err(e("bash hack/node.sh"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text, started.elapsed()))
}

fn node_is_ready(c: &LocalCluster) -> bool {
    c.kubectl(&[
        "get",
        "node",
        "mcp-access-node",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])
    .stdout
    .trim()
        == "True"
}

/// One node per machine: starting a second one, from another cluster directory, fails naming
/// the first and touches nothing of it (its bridge, chains and address stay; it stays Ready and
/// its DNS answers).
pub fn second_node_on_the_machine_is_refused(c: &mut LocalCluster) -> Result<(), String> {
    let other = c.dir.join("second-cluster");
    std::fs::create_dir_all(&other).map_err(e("the second directory"))?;
    for f in ["admin.kubeconfig", "ports"] {
        std::fs::copy(c.dir.join(f), other.join(f)).map_err(e(f))?;
    }
    let (started, text, _) = node_sh(&["start".as_ref(), other.as_os_str()], &[])?;
    ensure!(!started, "a second node started beside the first:\n{text}");
    let first = c.dir.display().to_string();
    ensure!(
        text.contains("already runs on this machine") && text.contains(&first),
        "the refusal does not name the running node {first}:\n{text}"
    );
    let (_, _, _) = node_sh(&["stop".as_ref(), other.as_os_str()], &[])?;
    ensure!(
        node_is_ready(c),
        "the first node is not Ready after the refused start and its stop"
    );
    ok(
        &c.kubectl(&[
            "rollout",
            "status",
            "deployment/coredns",
            "-n",
            "kube-system",
            "--timeout=30s",
        ]),
        "CoreDNS after the refused start",
    )?;
    Ok(())
}

/// A kubelet that never makes its node Ready fails `hack/node.sh start` within
/// `NODE_START_TIMEOUT`, loudly, with the kubelet's last lines, and leaves nothing running;
/// the real one then starts again. (After the others: it restarts the node.)
pub fn kubelet_never_ready_fails_the_start_loudly(c: &mut LocalCluster) -> Result<(), String> {
    let fake = c.dir.join("fake-kubelet");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'fake kubelet: registering nothing' >&2\nexec sleep 600\n",
    )
    .map_err(e("the fake kubelet"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))
            .map_err(e("chmod the fake kubelet"))?;
    }
    let dir = c.dir.as_os_str();
    let (stopped, text, _) = node_sh(&["stop".as_ref(), dir], &[])?;
    ensure!(stopped, "hack/node.sh stop failed:\n{text}");
    let (started, text, took) = node_sh(
        &["start".as_ref(), dir],
        &[
            ("KUBELET", fake.as_os_str()),
            ("NODE_START_TIMEOUT", "15".as_ref()),
        ],
    )?;
    ensure!(
        !started,
        "the start succeeded with a kubelet that never registers:\n{text}"
    );
    ensure!(
        text.contains("was not Ready after 15s")
            && text.contains("fake kubelet: registering nothing"),
        "the failure does not say the node was not Ready, with the kubelet's last lines:\n{text}"
    );
    ensure!(
        took < Duration::from_secs(60),
        "the failed start took {took:?} (timeout 15s)"
    );
    let left = std::process::Command::new("pgrep")
        .args(["-f", &fake.display().to_string()])
        .output()
        .map_err(e("pgrep"))?;
    ensure!(
        left.stdout.is_empty(),
        "the fake kubelet outlived the failed start: pids {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let (again, text, _) = node_sh(&["start".as_ref(), dir], &[])?;
    ensure!(
        again,
        "the node did not start again with the real kubelet:\n{text}"
    );
    ensure!(
        node_is_ready(c),
        "the node is not Ready after starting again"
    );
    Ok(())
}
