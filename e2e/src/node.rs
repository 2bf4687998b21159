//! Pods on the local node (`hack/node.sh`, [`crate::Options::node`]): the images they run,
//! imported into the node's containerd, and what the scenarios do inside them.
//!
//! Every image is built here from what is under test and imported, never pulled:
//! `hack/image.sh` builds the gateway image from `MCP_ACCESS_GATEWAY_BIN` and the two demo
//! images (the official MCP Python SDK as the MCP server and as the agent), `hack/node.sh
//! import` loads them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{repo_root, LocalCluster, NODE_GATEWAY_IMAGE, NODE_IP};

/// The version of the MCP Python SDK the demo images hold (`e2e/mcp/requirements.txt`), their tag.
pub fn demo_tag() -> Result<String> {
    let req = std::fs::read_to_string(repo_root().join("e2e/mcp/requirements.txt"))?;
    req.lines()
        .find_map(|l| l.strip_prefix("mcp=="))
        .map(|v| v.split_whitespace().next().unwrap_or(v).to_string())
        .context("no mcp==X.Y.Z pin in e2e/mcp/requirements.txt")
}

/// `localhost/mcp-access/demo-mcp-server:<sdk>`: `upstream.py` on 0.0.0.0:8080.
pub fn demo_server_image() -> Result<String> {
    Ok(format!(
        "localhost/mcp-access/demo-mcp-server:{}",
        demo_tag()?
    ))
}

/// `localhost/mcp-access/demo-host:<sdk>`: waits; agents run in it with `kubectl exec`.
pub fn demo_host_image() -> Result<String> {
    Ok(format!("localhost/mcp-access/demo-host:{}", demo_tag()?))
}

/// The Python of the demo images: the SDK venv at its fixed path in them (`hack/image.sh`).
pub fn demo_python() -> Result<PathBuf> {
    Ok(PathBuf::from("/opt/mcp-sdk/bin/python"))
}

/// What [`import_images`] builds and imports (`hack/image.sh` names).
const IMAGES: &[&str] = &[
    "mcp-access-apiserver",
    "mcp-access-controllers",
    "mcp-access-gateway",
    "demo-mcp-server",
    "demo-host",
];

/// Builds the project's images tagged as [`NODE_GATEWAY_IMAGE`] is (from the binaries beside
/// `gateway_bin`: the ones under test, or hack/up.sh's release build) and the demo images, and
/// imports them into the node.
pub fn import_images(c: &LocalCluster, gateway_bin: &Path) -> Result<()> {
    let started = Instant::now();
    let bin_dir = gateway_bin
        .parent()
        .context("the gateway binary has no directory")?
        .to_path_buf();
    let oci = c.dir.join("images");
    let tag = NODE_GATEWAY_IMAGE
        .rsplit_once(':')
        .map(|(_, t)| t)
        .unwrap_or("e2e");
    let root = repo_root();
    let out = Command::new("bash")
        .arg(root.join("hack/image.sh"))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .args(["--tag", tag])
        .arg("--oci-dir")
        .arg(&oci)
        .args(IMAGES)
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!(
            "hack/image.sh failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let archives: Vec<PathBuf> = IMAGES
        .iter()
        .map(|n| oci.join(format!("{n}.oci.tar")))
        .collect();
    let status = Command::new("bash")
        .arg(root.join("hack/node.sh"))
        .arg("import")
        .arg(&c.dir)
        .args(&archives)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()?;
    if !status.success() {
        bail!("hack/node.sh import failed ({status})");
    }
    eprintln!(
        "node images built and imported in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What `probe.py` saw: one TCP connection from inside a Pod.
#[derive(Debug, Clone)]
pub struct Probe {
    pub target: String,
    /// What the name resolved to inside the Pod; `None` when it did not.
    pub address: Option<String>,
    pub connected: bool,
    pub error: Option<String>,
    pub seconds: f64,
}

/// Runs `python ARGS...` in the first container of Pod `ns/pod` (`kubectl exec`, `stdin` fed
/// when given) and returns its stdout; fails when kubectl or the program fails.
pub fn exec_python(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String> {
    exec_python_in(c, ns, pod, None, args, stdin)
}

/// [`exec_python`] in `container` of the Pod (none: its first).
pub fn exec_python_in(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    container: Option<&str>,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String> {
    let python = demo_python()?;
    let python = python.to_string_lossy();
    let mut argv = vec!["exec"];
    if stdin.is_some() {
        argv.push("-i");
    }
    if let Some(container) = container {
        argv.extend_from_slice(&["-c", container]);
    }
    argv.extend_from_slice(&["-n", ns, pod, "--", &python]);
    argv.extend_from_slice(args);
    let out = c.kubectl_as(&c.kubeconfig, &argv, stdin);
    if !out.success {
        bail!(
            "kubectl exec {ns}/{pod} python {args:?}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    Ok(out.stdout)
}

/// Opens one TCP connection to `target` (HOST:PORT) from inside Pod `ns/pod`.
pub fn probe(c: &LocalCluster, ns: &str, pod: &str, target: &str) -> Result<Probe> {
    probe_from(c, ns, pod, None, target)
}

/// [`probe`] from `container` of the Pod (none: its first).
pub fn probe_from(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    container: Option<&str>,
    target: &str,
) -> Result<Probe> {
    let out = exec_python_in(
        c,
        ns,
        pod,
        container,
        &["/app/probe.py", target, "--timeout", "3"],
        None,
    )?;
    let v: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("probe.py printed {out:?}"))?;
    Ok(Probe {
        target: target.to_string(),
        address: v["address"].as_str().map(str::to_string),
        connected: v["connected"] == true,
        error: v["error"].as_str().map(str::to_string),
        seconds: v["seconds"].as_f64().unwrap_or_default(),
    })
}

/// Runs the official SDK's client (`client.py`) inside Pod `ns/pod` against `url` with the
/// bearer `token` (fed on stdin, never on a command line); its one JSON result.
pub fn sdk_client_in_pod(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    url: &str,
    token: &str,
    scenario: &str,
) -> Result<Value> {
    let run = spawn_sdk_client_in_pod(c, ns, pod, url, token, scenario, &[])?
        .finish(Duration::from_secs(120))?;
    Ok(run.result)
}

/// Starts the official SDK's client (`client.py`) inside Pod `ns/pod` for `scenario` with
/// `extra` arguments, streaming: its progress lines are read as they come, through
/// `kubectl exec`.
pub fn spawn_sdk_client_in_pod(
    c: &LocalCluster,
    ns: &str,
    pod: &str,
    url: &str,
    token: &str,
    scenario: &str,
    extra: &[&str],
) -> Result<crate::mcp::ClientProcess> {
    let dir = c.dir.join("mcp-clients");
    std::fs::create_dir_all(&dir)?;
    let log = dir.join(format!("{ns}-{pod}-{}.log", uuid::Uuid::new_v4().simple()));
    let python = demo_python()?;
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["exec", "-i", "-n", ns, pod, "--"])
        .arg(&python)
        .args(["/app/client.py", "--url", url, "--token-file", "/dev/stdin"])
        .args(["--mode", "legacy", "--scenario", scenario])
        .args(extra);
    crate::mcp::ClientProcess::spawn(cmd, crate::mcp::Sdk::PythonLegacy, log, Some(token))
}

/// Waits until Deployment `ns/name` has a ready replica ([`wait_replicas`]).
pub fn wait_ready(c: &LocalCluster, ns: &str, name: &str, timeout: Duration) -> Result<()> {
    wait_replicas(c, ns, name, 1, timeout)
}

/// Waits until Deployment `ns/name` has at least `want` ready replicas; on timeout, the Pods'
/// state and the namespace's Events.
pub fn wait_replicas(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    want: u32,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = c.kubectl(&[
            "get",
            "deployment",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.readyReplicas}",
        ]);
        if out.success && out.stdout.trim().parse::<u32>().is_ok_and(|n| n >= want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let pods = c.kubectl(&["get", "pods", "-n", ns, "-o", "wide"]);
            let events = c.kubectl(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"]);
            let deploy = format!("deployment/{name}");
            let mut logs = c.kubectl(&[
                "logs",
                "-n",
                ns,
                &deploy,
                "--all-containers",
                "--previous",
                "--tail=20",
            ]);
            if !logs.success {
                logs = c.kubectl(&["logs", "-n", ns, &deploy, "--all-containers", "--tail=20"]);
            }
            bail!(
                "Deployment {ns}/{name} has not {want} ready replicas within {timeout:?}:\n{}\n{}\nlogs:\n{}{}",
                pods.stdout,
                events.stdout,
                logs.stdout,
                logs.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The name and IP of the running Pod of Deployment `ns/name` (selected by `selector`).
pub fn pod_of(c: &LocalCluster, ns: &str, selector: &str) -> Result<(String, String)> {
    let out = c.kubectl(&[
        "get",
        "pods",
        "-n",
        ns,
        "-l",
        selector,
        "--field-selector=status.phase=Running",
        "-o",
        "jsonpath={.items[0].metadata.name} {.items[0].status.podIP}",
    ]);
    match out.stdout.trim().split_once(' ') {
        Some((name, ip)) if out.success && !ip.is_empty() => Ok((name.into(), ip.into())),
        _ => bail!(
            "no running Pod -l {selector} in {ns}: {}{}",
            out.stdout,
            out.stderr
        ),
    }
}

impl Probe {
    /// Refused by a NetworkPolicy: the name resolved, and the connection was rejected
    /// (kube-router answers with a reject) or never answered, not anything else.
    pub fn refused_by_policy(&self) -> bool {
        !self.connected
            && self.address.is_some()
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.contains("refused") || e.contains("timed out"))
    }
}

/// np-guard's verdict (`netpolicy eval` on the live cluster: its Pods, Namespaces and
/// NetworkPolicies) on one TCP connection from Pod `src` to Pod `dst` (namespace, name) on
/// `port`: the oracle the packets are compared with.
pub fn oracle_allows(
    c: &LocalCluster,
    src: (&str, &str),
    dst: (&str, &str),
    port: u16,
) -> Result<bool> {
    let bin = std::env::var("MCP_ACCESS_NETPOL_ANALYZER_BIN")
        .context("MCP_ACCESS_NETPOL_ANALYZER_BIN is not set: run through hack/test.sh")?;
    let out = Command::new(&bin)
        .arg("eval")
        .arg("-k")
        .arg(&c.kubeconfig)
        .args(["-n", src.0, "-s", src.1])
        .args(["--destination-namespace", dst.0, "-d", dst.1])
        .args(["-p", &port.to_string()])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("netpolicy eval failed ({}): {stdout}{stderr}", out.status);
    }
    match stdout.trim().rsplit_once(": ") {
        Some((_, "true")) => Ok(true),
        Some((_, "false")) => Ok(false),
        _ => bail!("netpolicy eval printed {stdout:?} {stderr:?}"),
    }
}

/// A test host outside the cluster: a network namespace this test made, joined to this machine
/// by a veth pair, holding `addrs` (public-looking addresses, routed to it here only, so nothing
/// leaves the machine), with a TCP listener on each of `ports` of each address that accepts and
/// closes. Removed on drop.
pub struct TestHost {
    netns: String,
    veth: String,
    addrs: Vec<String>,
    listener: Option<std::process::Child>,
}

impl TestHost {
    pub fn start(name: &str, link: (&str, &str), addrs: &[&str], ports: &[u16]) -> Result<Self> {
        let netns = format!("mcpa-{name}");
        let veth = format!("mcpa-{name}");
        let peer = format!("mcpa-{name}-p");
        let mut host = Self {
            netns: netns.clone(),
            veth: veth.clone(),
            addrs: addrs.iter().map(|a| a.to_string()).collect(),
            listener: None,
        };
        host.remove();
        let ip = |args: &[&str]| -> Result<()> {
            let out = Command::new("ip").args(args).output()?;
            if !out.status.success() {
                bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        let (here, there) = link;
        ip(&["netns", "add", &netns])?;
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &netns])?;
        ip(&["addr", "add", &format!("{here}/30"), "dev", &veth])?;
        ip(&["link", "set", &veth, "up"])?;
        let inside = |args: &[&str]| -> Result<()> {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &format!("{there}/30"), "dev", &peer])?;
        for a in addrs {
            inside(&["addr", "add", &format!("{a}/32"), "dev", &peer])?;
        }
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        for a in addrs {
            ip(&[
                "route",
                "replace",
                &format!("{a}/32"),
                "via",
                there,
                "dev",
                &veth,
            ])?;
        }
        let script = format!(
            "import socket, selectors\nsel = selectors.DefaultSelector()\nfor a in {addrs:?}:\n    for p in {ports:?}:\n        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((a, p)); s.listen(64); sel.register(s, selectors.EVENT_READ)\nprint('listening', flush=True)\nwhile True:\n    for k, _ in sel.select():\n        conn, _ = k.fileobj.accept(); conn.close()\n"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        host.listener = Some(child);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        if line.trim() != "listening" {
            bail!("the test host's listener did not start: {line:?}");
        }
        Ok(host)
    }

    fn remove(&mut self) {
        if let Some(mut child) = self.listener.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for a in &self.addrs {
            let _ = Command::new("ip")
                .args(["route", "del", &format!("{a}/32")])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `kubectl apply` of one object.
pub fn apply(c: &LocalCluster, manifest: &Value) -> Result<()> {
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["apply", "-f", "-"],
        Some(&manifest.to_string()),
    );
    if !out.success {
        bail!("kubectl apply: {}{}", out.stdout, out.stderr);
    }
    Ok(())
}

/// A PersistentVolume bound in advance to Host `ns/host`'s workspace claim: the node has no
/// volume provisioner, so each claim gets a hostPath volume of its own under the cluster's
/// directory.
pub fn workspace_volume(c: &LocalCluster, ns: &str, host: &str) -> Result<()> {
    let path = c.dir.join(format!("volumes/{ns}-{host}"));
    std::fs::create_dir_all(&path)?;
    // The host container runs as 65532 and writes its workspace.
    let status = Command::new("chown")
        .arg("65532:65532")
        .arg(&path)
        .status()?;
    if !status.success() {
        bail!("chown 65532:65532 {}: {status}", path.display());
    }
    apply(
        c,
        &json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": format!("{ns}-{host}-workspace")},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": path.to_string_lossy(), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": format!("{host}-workspace")},
            },
        }),
    )
}

/// Host `ns/name` of Context `context`, running the demo host image, with its workspace volume.
pub fn host(c: &LocalCluster, ns: &str, name: &str, context: &str) -> Result<()> {
    workspace_volume(c, ns, name)?;
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Host",
            // The label its Context's hostSelector selects ([`context`]).
            "metadata": {"name": name, "namespace": ns, "labels": {"agents": context}},
            "spec": {
                "contextRef": {"name": context},
                "image": demo_host_image()?,
                "workspaceSize": "1Gi",
            },
        }),
    )
}

/// Context `ns/name` granting `servers` (`[{"name", "namespace"}]`) to the hosts labelled
/// `agents: <name>`.
pub fn context(c: &LocalCluster, ns: &str, name: &str, servers: Value) -> Result<()> {
    apply(
        c,
        &json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "Context",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"mcpServers": servers, "hostSelector": {"matchLabels": {"agents": name}}},
        }),
    )
}

/// While mcp-access-apiserver runs as a process of this machine rather than as Pods, the
/// controllers' L1 policy towards the apiserver Pods cannot select it: the one stand-in an
/// operator would add, an ipBlock egress from namespace `ns`'s MCP server Pods to the sync
/// listener's address and port.
pub fn sync_egress(c: &LocalCluster, ns: &str) -> Result<()> {
    apply(
        c,
        &json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "gateway-sync-on-this-machine", "namespace": ns},
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
    )
}

/// A TCP forwarder on `listen` (an address Pods reach, e.g. [`NODE_IP`], port chosen by the
/// kernel) to `target` on this machine: how Pods reach the test's PostgreSQL, which listens on
/// loopback only. Stops accepting on drop; open connections end with either side.
pub struct TcpForward {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    listen: std::net::SocketAddr,
}

impl TcpForward {
    pub fn start(listen: &str, target: std::net::SocketAddr) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind((listen, 0))?;
        let local = listener.local_addr()?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = conn else { continue };
                let Ok(outbound) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (inbound.try_clone(), outbound.try_clone()),
                    (Ok(outbound), Ok(inbound)),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Ok(Self {
            port: local.port(),
            stop,
            listen: local,
        })
    }
}

impl Drop for TcpForward {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = std::net::TcpStream::connect(self.listen);
    }
}
