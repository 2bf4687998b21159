//! `mcp-access-local`: the product on this machine (what `hack/up.sh` runs). Starts etcd,
//! kube-apiserver, kube-controller-manager, PostgreSQL and MCP Access behind its APIService,
//! prints `GATEWAY_SYNC_URL=<url>`, `GATEWAY_SYNC_CA=<path>` (the gateway sync listener),
//! `HOST_API_URL=<url>` and `HOST_API_CA=<path>` (the controllers' Host API, when they run) and
//! `KUBECONFIG=<path>` when ready and runs until interrupted.
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
        node: false,
    })?;
    let host_api = cluster.host_api_args()?;
    let host_api: Vec<&str> = host_api.iter().map(String::as_str).collect();
    let controllers = match &cli.controllers_bin {
        Some(bin) => {
            Some(cluster.start_controllers(&std::path::absolute(bin)?, "local", &host_api)?)
        }
        None => None,
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
