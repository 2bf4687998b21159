//! `mcp-access-local`: the product on this machine (what `hack/up.sh` runs). Starts etcd,
//! kube-apiserver, kube-controller-manager, PostgreSQL and MCP Access behind its APIService,
//! prints `GATEWAY_SYNC_URL=<url>`, `GATEWAY_SYNC_CA=<path>` (the gateway sync listener),
//! `HOST_API_URL=<url>` and `HOST_API_CA=<path>` (the controllers' Host API, when they run) and
//! `KUBECONFIG=<path>` when ready and runs until interrupted. With `--node`, a real node too
//! (`hack/node.sh`) and the demo on it, and how to call a tool through its gateway.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use e2e::{Database, LocalCluster, Options};

#[derive(Parser)]
#[command(name = "mcp-access-local", about)]
struct Cli {
    /// Working directory (pki, logs, data); reused across runs.
    #[arg(long, env = "MCP_ACCESS_LOCAL_DIR")]
    dir: PathBuf,
    /// The mcp-access-apiserver binary.
    #[arg(long, env = "MCP_ACCESS_APISERVER_BIN")]
    apiserver_bin: PathBuf,
    /// The mcp-access-controllers binary: started as one replica when given.
    #[arg(long, env = "MCP_ACCESS_CONTROLLERS_BIN")]
    controllers_bin: Option<PathBuf>,
    /// A real node beside the control plane (hack/node.sh; root, one per machine), and on it
    /// the demo: an MCPServer (the demo MCP server behind mcp-access-gateway built from
    /// `--gateway-bin`), a Host and the Context that grants it the server, and a session token.
    #[arg(long, env = "MCP_ACCESS_LOCAL_NODE", requires_all = ["controllers_bin", "gateway_bin"])]
    node: bool,
    /// The mcp-access-gateway binary the demo's gateway image is built from (with `--node`).
    #[arg(long, env = "MCP_ACCESS_GATEWAY_BIN")]
    gateway_bin: Option<PathBuf>,
}

/// The demo of `--node`: its namespaces, and what it prints.
const DEMO_SERVER_NS: &str = "demo-mcp";
const DEMO_HOST_NS: &str = "demo-agents";

/// Deploys the demo on the node and waits until it runs: MCPServer `demo-mcp/demo`, Context
/// `demo-agents/agents` granting it, Host `demo-agents/agent`, and AccessSession
/// `demo-mcp/agent` whose token is written to `DIR/demo-session.token` (mode 600). Returns the
/// lines that say how to call a tool through the gateway.
fn demo(cluster: &LocalCluster) -> anyhow::Result<Vec<String>> {
    use e2e::node;
    use serde_json::json;
    for ns in [DEMO_SERVER_NS, DEMO_HOST_NS] {
        let out = cluster.kubectl(&["create", "namespace", ns]);
        anyhow::ensure!(
            out.success || out.stderr.contains("AlreadyExists"),
            "kubectl create namespace {ns}: {}",
            out.stderr
        );
    }
    node::sync_egress(cluster, DEMO_SERVER_NS)?;
    node::apply(
        cluster,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": "demo", "namespace": DEMO_SERVER_NS},
            // Its owners admit the Contexts of the hosts' namespace, and only those.
            "spec": {
                "image": node::demo_server_image()?,
                "port": 8080,
                "allowedContexts": {"namespaces": {
                    "from": "Selector",
                    "selector": {"matchLabels": {"kubernetes.io/metadata.name": DEMO_HOST_NS}},
                }},
            },
        }),
    )?;
    node::context(
        cluster,
        DEMO_HOST_NS,
        "agents",
        json!([{"name": "demo", "namespace": DEMO_SERVER_NS}]),
    )?;
    node::host(cluster, DEMO_HOST_NS, "agent", "agents")?;
    let ready = std::time::Duration::from_secs(180);
    node::wait_ready(cluster, DEMO_SERVER_NS, "demo", ready)?;
    node::wait_ready(cluster, DEMO_HOST_NS, "agent", ready)?;
    let out = cluster.kubectl(&[
        "get",
        "mcpserver",
        "demo",
        "-n",
        DEMO_SERVER_NS,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    anyhow::ensure!(out.success, "the demo MCPServer's uid: {}", out.stderr);
    let expires = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(24))?
        .to_string();
    node::apply(
        cluster,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "AccessSession",
            "metadata": {"name": "agent", "namespace": DEMO_SERVER_NS},
            "spec": {
                "server": {"name": "demo", "uid": out.stdout.trim()},
                "subject": {"user": "demo-agent@example.com"},
                "teams": ["demo"],
                "expiresAt": expires,
            },
        }),
    )?;
    let token = e2e::mcp::session_token_for(cluster, DEMO_SERVER_NS, "agent", 3600)?;
    let token_file = cluster.dir.join("demo-session.token");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&token_file)?;
        f.write_all(token.as_bytes())?;
    }
    let python = node::demo_python()?;
    Ok(vec![
        format!(
            "demo: MCPServer {DEMO_SERVER_NS}/demo (the demo MCP server behind mcp-access-gateway), \
             Host {DEMO_HOST_NS}/agent of Context {DEMO_HOST_NS}/agents, AccessSession \
             {DEMO_SERVER_NS}/agent (token in {}, valid 1 h)",
            token_file.display()
        ),
        "demo: kubectl get pods -A".to_string(),
        format!(
            "demo: call a tool from the host, with the official MCP Python SDK, through the gateway:\n  \
             kubectl exec -i -n {DEMO_HOST_NS} deploy/agent -- {} /app/client.py \\\n    \
             --url http://demo.{DEMO_SERVER_NS}.svc:8086/mcp --token-file /dev/stdin < {}",
            python.display(),
            token_file.display()
        ),
        format!(
            "demo: then revoke it, and the same call is refused (session_revoked):\n  \
             kubectl create -n {DEMO_SERVER_NS} -f - <<'EOF'\n  \
             apiVersion: access.mcp-runtime.dev/v1alpha1\n  \
             kind: Revocation\n  \
             metadata: {{name: demo}}\n  \
             spec: {{target: {{session: agent}}, cause: compromised}}\n  \
             EOF"
        ),
    ])
}

/// Whether an executable `name` is in a directory of PATH.
fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // kubectl applies the CRDs, RBAC and APIService; hack/up.sh puts one on PATH first.
    if !on_path("kubectl") {
        anyhow::bail!(
            "kubectl is not on PATH: run hack/up.sh (hack/lib/prereqs.sh builds the pinned \
             release's kubectl with `hack/build-kube.sh kubectl` and puts it on PATH)"
        );
    }
    let dir = std::path::absolute(&cli.dir)?;
    let cluster = LocalCluster::start(Options {
        dir,
        apiserver_bin: std::path::absolute(&cli.apiserver_bin)?,
        database: Database::Local,
        apiserver_args: Vec::new(),
        node: cli.node,
    })?;
    if let (true, Some(gateway)) = (cli.node, &cli.gateway_bin) {
        e2e::node::import_images(&cluster, &std::path::absolute(gateway)?)?;
    }
    let mut controller_args = cluster.host_api_args()?;
    controller_args.extend(cluster.runtime_token_args()?);
    if cli.node {
        controller_args.push(format!("--runtime-namespace={DEMO_SERVER_NS}"));
        // As deploy/controllers ships: a server outside the runtime namespace is not deployed.
        controller_args.push("--require-runtime-namespace".into());
    }
    let controller_args: Vec<&str> = controller_args.iter().map(String::as_str).collect();
    let controllers = match &cli.controllers_bin {
        Some(bin) => Some(cluster.start_controllers(
            &std::path::absolute(bin)?,
            "local",
            &controller_args,
        )?),
        None => None,
    };
    let demo = if cli.node {
        demo(&cluster)?
    } else {
        Vec::new()
    };
    eprintln!(
        "MCP Access is served through kube-apiserver at {}; logs in {}",
        cluster
            .env
            .get("KUBE_APISERVER_URL")
            .map(String::as_str)
            .unwrap_or("?"),
        cluster.dir.join("logs").display()
    );
    // What a gateway needs besides its Pod-bound token (see the README); printed before
    // KUBECONFIG= so that a reader waiting for KUBECONFIG= has all three.
    println!("GATEWAY_SYNC_URL={}", cluster.sync_url());
    println!("GATEWAY_SYNC_CA={}", cluster.sync_ca().display());
    if let Some(host_api_port) = controllers.as_ref().and_then(|c| c.host_api_port) {
        // The controllers' Host API; hack/host-token.sh signs a host's token for it.
        println!("HOST_API_URL=https://127.0.0.1:{host_api_port}");
        if let Some(ca) = cluster.env.get("HOST_API_CA_FILE") {
            println!("HOST_API_CA={ca}");
        }
    }
    for line in &demo {
        eprintln!("{line}");
    }
    println!("KUBECONFIG={}", cluster.kubeconfig.display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        anyhow::Ok(())
    })?;
    eprintln!("stopping");
    drop(controllers);
    drop(cluster);
    Ok(())
}
