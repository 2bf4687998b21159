//! The NetworkPolicy layers against the local cluster: `mcp-access-controllers` (its own service
//! account and RBAC) writes, changes and removes policies as MCPServers and Contexts change,
//! gates a workload on its egress proofs, and sweeps orphans only within its caps. The local
//! cluster has no CNI, so what is checked is the policies kube-apiserver holds; what they allow
//! is proven by the analyzer test of the builders (`controllers/tests/netpol_oracle.rs`).

use std::net::UdpSocket;
use std::time::Duration;

use e2e::LocalCluster;
use serde_json::{json, Value};

use super::controllers::{apply, get_json, in_ns, start, until, wait_condition};
use super::{create_namespace, ok};

const MANAGED: &str = "mcp-runtime.dev/managed-by=mcp-access-controllers";

/// `result`, with the last lines of the controllers' log when it is an error.
fn with_log<T>(result: Result<T, String>, log: &std::path::Path) -> Result<T, String> {
    result.map_err(|e| {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n    ");
        format!("{e}\n    --- {} ---\n    {tail}", log.display())
    })
}

/// A DNS server on 127.0.0.1 (UDP) that answers A queries for the names it was given and
/// stays silent for every other query (a hanging upstream). AAAA queries for a known name get
/// an empty NOERROR answer. Stops when dropped.
struct LoopbackDns {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LoopbackDns {
    fn start(names: &[(&str, [u8; 4])]) -> Result<Self, String> {
        let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let addr = socket.local_addr().map_err(|e| e.to_string())?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let names: Vec<(String, [u8; 4])> =
            names.iter().map(|(n, ip)| (n.to_string(), *ip)).collect();
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(reply) = dns_reply(&buf[..n], &names) {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        });
        Ok(Self { addr, stop })
    }
}

impl Drop for LoopbackDns {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The answer to one query, or `None` to stay silent.
fn dns_reply(query: &[u8], names: &[(String, [u8; 4])]) -> Option<Vec<u8>> {
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    let ip = names
        .iter()
        .find(|(n, _)| *n == labels.join("."))
        .map(|(_, ip)| *ip)?;
    let answers: u16 = if qtype == 1 { 1 } else { 0 };
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(query.get(0..2)?);
    reply.extend_from_slice(&[0x81, 0x80, 0, 1]);
    reply.extend_from_slice(&answers.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if answers == 1 {
        // The question's name by pointer, type A, class IN, TTL 60, four bytes.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        reply.extend_from_slice(&ip);
    }
    Some(reply)
}

fn policy(c: &LocalCluster, ns: &str, name: &str) -> Result<Option<Value>, String> {
    get_json(c, &["get", "networkpolicy", name, "-n", ns])
}

fn wait_policy(c: &LocalCluster, ns: &str, name: &str) -> Result<Value, String> {
    until(
        Duration::from_secs(30),
        &format!("policy {ns}/{name}"),
        || policy(c, ns, name),
    )
}

fn wait_policy_gone(c: &LocalCluster, ns: &str, name: &str) -> Result<(), String> {
    until(
        Duration::from_secs(30),
        &format!("policy {ns}/{name} removed"),
        || Ok(policy(c, ns, name)?.is_none().then_some(())),
    )
}

/// Names of the managed policies in `ns`, sorted.
fn managed_names(c: &LocalCluster, ns: &str) -> Result<Vec<String>, String> {
    let list = get_json(c, &["get", "networkpolicy", "-n", ns, "-l", MANAGED])?.ok_or("no list")?;
    let mut names: Vec<String> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    Ok(names)
}

fn server(name: &str, port: i64, bindings: Value) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name},
        // Its owners admit Contexts of every namespace (the default admits only their own).
        "spec": {
            "image": "ghcr.io/acme/mcp:1",
            "port": port,
            "egressBindings": bindings,
            "allowedContexts": {"namespaces": {"from": "All"}},
        },
    })
}

fn context(name: &str, servers: Value) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "Context",
        "metadata": {"name": name},
        "spec": {"mcpServers": servers, "hostSelector": {"matchLabels": {"host": name}}},
    })
}

/// Waits until this replica leads and its first NetworkPolicy pass is complete (a standby is
/// ready too, so readiness alone does not say the sweep has run).
fn synced(controllers: &e2e::Controllers) -> Result<(), String> {
    until(
        Duration::from_secs(30),
        "the first NetworkPolicy pass",
        || {
            let synced = controllers
                .metric("mcp_controllers_netpol_synced", &[])
                .map_err(|e| e.to_string())?;
            Ok((synced == 1.0).then_some(()))
        },
    )
}

fn deployment_exists(c: &LocalCluster, ns: &str, name: &str) -> Result<bool, String> {
    Ok(get_json(c, &["get", "deployment", name, "-n", ns])?.is_some())
}

/// Deletes what a scenario left: its MCPServers and Contexts while the controllers still run
/// (the retirement fences servers), then, stopped, the managed policies of its namespaces.
fn clean_up(c: &LocalCluster, namespaces: &[&str]) {
    for ns in namespaces {
        let _ = c.kubectl(&[
            "delete",
            "contexts.mcp-runtime.dev",
            "--all",
            "-n",
            ns,
            "--wait=false",
        ]);
        let _ = c.kubectl(&["delete", "mcpservers", "--all", "-n", ns, "--timeout=60s"]);
    }
}

fn delete_managed(c: &LocalCluster, namespaces: &[&str]) {
    for ns in namespaces {
        let _ = c.kubectl(&["delete", "networkpolicy", "-n", ns, "-l", MANAGED]);
    }
}

/// Layers appear, change and disappear with MCPServers and Contexts; a binding that cannot be
/// proven (a private CIDR, a DNS server that never answers) blocks the workload before its
/// Deployment exists, and the condition says why.
pub fn policies_follow_servers_and_contexts(c: &mut LocalCluster) -> Result<(), String> {
    let runtime = ["np1-a", "np1-b", "np1-c"];
    let hosts = "np1-hosts";
    for ns in runtime.iter().chain([&hosts]) {
        create_namespace(c, ns)?;
    }
    // A DNS server on loopback: it answers `good.example.com` (A 140.82.112.3) and never
    // answers anything else, so a binding to another name must fail at the deadline, closed.
    let dns_server = LoopbackDns::start(&[("good.example.com", [140, 82, 112, 3])])?;
    let dns = format!("--egress-dns-server={}", dns_server.addr);
    let mut controllers = start(
        c,
        "netpol-1",
        "netpol-1",
        &[
            "--runtime-namespace=np1-a,np1-b,np1-c",
            "--kube-api-cidr=10.96.0.1/32",
            &dns,
            "--egress-dns-timeout=1s",
        ],
    )?;
    let result = (|| {
        // L0 and L1 in every runtime namespace, and nowhere else.
        for ns in runtime {
            let names = until(Duration::from_secs(30), "L0/L1", || {
                let names = managed_names(c, ns)?;
                Ok((names.len() >= 4).then_some(names))
            })?;
            ensure!(
                names
                    == [
                        "mcp-l0-deny-all",
                        "mcp-l1-dns",
                        "mcp-l1-gateway-sync",
                        "mcp-l1-kube-api"
                    ],
                "{ns}: {names:?}"
            );
        }
        ensure!(managed_names(c, hosts)?.is_empty(), "hosts has no L0/L1");
        let deny = wait_policy(c, "np1-a", "mcp-l0-deny-all")?;
        ensure!(
            deny["spec"]["podSelector"] == json!({})
                && deny["spec"]["policyTypes"] == json!(["Ingress", "Egress"]),
            "deny-all: {}",
            deny["spec"]
        );
        let api = wait_policy(c, "np1-a", "mcp-l1-kube-api")?;
        ensure!(
            api["spec"]["egress"][0]["to"] == json!([{"ipBlock": {"cidr": "10.96.0.1/32"}}]),
            "kube-api: {}",
            api["spec"]
        );

        // A proven exact-host binding: the L3 policy, the condition, then the Deployment.
        apply(
            c,
            &in_ns(
                server(
                    "github",
                    8080,
                    json!([{"name": "api", "type": "ExactHost", "cidr": "140.82.112.0/24", "port": 443}]),
                ),
                "np1-a",
            ),
        )?;
        let l3 = wait_policy(c, "np1-a", "mcp-l3-egress.github")?;
        ensure!(
            l3["spec"]["egress"]
                == json!([{"to": [{"ipBlock": {"cidr": "140.82.112.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]}]),
            "L3: {}",
            l3["spec"]
        );
        ensure!(
            l3["metadata"]["labels"]["mcp-runtime.dev/policy-type"] == "l3-egress",
            "typed: {}",
            l3["metadata"]["labels"]
        );
        wait_condition(c, "np1-a", "github", "ExternalEgressReady", "True")?;
        until(Duration::from_secs(30), "github deployed", || {
            Ok(deployment_exists(c, "np1-a", "github")?.then_some(()))
        })?;

        // A private CIDR and an unanswered hostname: refused, not deployed.
        apply(
            c,
            &in_ns(
                server(
                    "private",
                    8080,
                    json!([{"name": "db", "type": "ExactHost", "cidr": "10.0.0.0/8", "port": 5432}]),
                ),
                "np1-b",
            ),
        )?;
        let refused = wait_condition(c, "np1-b", "private", "ExternalEgressReady", "False")?;
        let message = refused["message"].as_str().unwrap_or_default();
        ensure!(message.contains("10.0.0.0/8"), "names the CIDR: {message}");
        let ready = wait_condition(c, "np1-b", "private", "Ready", "False")?;
        ensure!(
            ready["reason"] == "ExternalEgressNotReady",
            "Ready: {ready}"
        );
        ensure!(
            !deployment_exists(c, "np1-b", "private")?,
            "a refused binding deploys nothing"
        );
        ensure!(
            policy(c, "np1-b", "mcp-l3-egress.private")?.is_none(),
            "no L3 allow for a refused binding"
        );

        apply(
            c,
            &in_ns(
                server(
                    "named",
                    8080,
                    json!([{"name": "api", "type": "ExactHost", "host": "api.example.com", "port": 443}]),
                ),
                "np1-c",
            ),
        )?;
        let timed_out = wait_condition(c, "np1-c", "named", "ExternalEgressReady", "False")?;
        let message = timed_out["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("api.example.com"),
            "names the host: {message}"
        );
        ensure!(
            !deployment_exists(c, "np1-c", "named")?
                && policy(c, "np1-c", "mcp-l3-egress.named")?.is_none(),
            "an unresolved name deploys and allows nothing"
        );

        // A name the DNS server answers: its addresses become the allow and the status.
        apply(
            c,
            &in_ns(
                server(
                    "resolved",
                    8080,
                    json!([{"name": "api", "type": "ExactHost", "host": "good.example.com", "port": 443}]),
                ),
                "np1-b",
            ),
        )?;
        wait_condition(c, "np1-b", "resolved", "ExternalEgressReady", "True")?;
        let status = get_json(c, &["get", "mcpserver", "resolved", "-n", "np1-b"])?
            .ok_or("resolved is gone")?;
        let shown = &status["status"]["resolvedEgressIPs"];
        ensure!(
            shown[0]["binding"] == "api"
                && shown[0]["host"] == "good.example.com"
                && shown[0]["ips"] == json!(["140.82.112.3"])
                && shown[0]["resolvedAt"].is_string(),
            "status.resolvedEgressIPs: {shown}"
        );
        let l3 = wait_policy(c, "np1-b", "mcp-l3-egress.resolved")?;
        ensure!(
            l3["spec"]["egress"][0]["to"] == json!([{"ipBlock": {"cidr": "140.82.112.3/32"}}]),
            "L3 of a resolved name: {}",
            l3["spec"]
        );

        // A Context opens github to its hosts, both sides.
        apply(
            c,
            &in_ns(
                context("dev", json!([{"name": "github", "namespace": "np1-a"}])),
                hosts,
            ),
        )?;
        let ingress = wait_policy(c, "np1-a", "mcp-l2-ingress.github.np1-hosts.dev")?;
        // The gateway port (8086), never the server's spec.port (8080).
        let gateway_port = json!([{"protocol": "TCP", "port": 8086}]);
        ensure!(
            ingress["spec"]["ingress"][0]["from"]
                == json!([{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": hosts}},
                    // The Context's selector, and never a server's pods.
                    "podSelector": {
                        "matchLabels": {"host": "dev"},
                        "matchExpressions": [{"key": "mcp-runtime.dev/mcpserver", "operator": "DoesNotExist"}],
                    },
                }])
                && ingress["spec"]["ingress"][0]["ports"] == gateway_port,
            "L2 ingress: {}",
            ingress["spec"]
        );
        let egress = wait_policy(c, hosts, "mcp-l2-egress.dev.np1-a.github")?;
        ensure!(
            egress["spec"]["egress"][0]["ports"] == gateway_port,
            "L2 egress: {}",
            egress["spec"]
        );

        // The server's port changes: the gateway forwards to the new one on loopback, and the
        // routes stay on the gateway port.
        apply(
            c,
            &in_ns(
                server(
                    "github",
                    9090,
                    json!([{"name": "api", "type": "ExactHost", "cidr": "140.82.112.0/24", "port": 443}]),
                ),
                "np1-a",
            ),
        )?;
        until(
            Duration::from_secs(30),
            "the gateway forwarding to 9090",
            || {
                let d = get_json(c, &["get", "deployment", "github", "-n", "np1-a"])?;
                Ok(d.filter(|d| {
                    d["spec"]["template"]["spec"]["containers"][1]["args"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|a| a == "--upstream=http://127.0.0.1:9090"))
                })
                .map(|_| ()))
            },
        )?;
        // The NetworkPolicy pass after an MCPServer change runs 200 ms after it (debounced):
        // let it run, then the routes must still be the gateway's.
        std::thread::sleep(Duration::from_secs(2));
        for (ns, name, rule) in [
            ("np1-a", "mcp-l2-ingress.github.np1-hosts.dev", "ingress"),
            (hosts, "mcp-l2-egress.dev.np1-a.github", "egress"),
        ] {
            let p = wait_policy(c, ns, name)?;
            ensure!(
                p["spec"][rule][0]["ports"] == gateway_port,
                "{name} after the port change: {}",
                p["spec"]
            );
        }

        // The Context stops granting github: both sides go.
        apply(c, &in_ns(context("dev", json!([])), hosts))?;
        wait_policy_gone(c, "np1-a", "mcp-l2-ingress.github.np1-hosts.dev")?;
        wait_policy_gone(c, hosts, "mcp-l2-egress.dev.np1-a.github")?;

        // Granted again, then the Context is deleted: its families go.
        apply(
            c,
            &in_ns(
                context("dev", json!([{"name": "github", "namespace": "np1-a"}])),
                hosts,
            ),
        )?;
        wait_policy(c, "np1-a", "mcp-l2-ingress.github.np1-hosts.dev")?;
        ok(
            &c.kubectl(&["delete", "contexts.mcp-runtime.dev", "dev", "-n", hosts]),
            "delete context",
        )?;
        wait_policy_gone(c, "np1-a", "mcp-l2-ingress.github.np1-hosts.dev")?;
        wait_policy_gone(c, hosts, "mcp-l2-egress.dev.np1-a.github")?;

        // The server is deleted (fenced by the retirement controller first): its L3 goes.
        ok(
            &c.kubectl(&[
                "delete",
                "mcpserver",
                "github",
                "-n",
                "np1-a",
                "--timeout=60s",
            ]),
            "delete mcpserver",
        )?;
        wait_policy_gone(c, "np1-a", "mcp-l3-egress.github")?;
        let withheld = controllers
            .metric("mcp_controllers_netpol_orphans_withheld", &[])
            .map_err(|e| e.to_string())?;
        ensure!(withheld == 0.0, "nothing withheld here: {withheld}");
        Ok(())
    })();
    let result = with_log(result, &controllers.log);
    clean_up(c, &runtime);
    controllers.stop();
    delete_managed(c, &runtime);
    delete_managed(c, &[hosts]);
    drop(dns_server);
    result
}

/// Orphans over the caps: eleven orphaned deny-all policies (of a namespace that is no longer a
/// runtime namespace) are over the absolute cap, so the sweep deletes none of them and the
/// metric and a Warning Event say so; eleven orphaned allows (L3 policies of MCPServers that do
/// not exist) go at once all the same. Policies that look like ours but lack the managed-by label
/// are never touched, not even one holding the name of a policy the controller wants. Within
/// the caps, the denies are swept too.
pub fn orphan_sweep_over_the_cap_deletes_nothing(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "np2-a";
    let old = "np2-old";
    create_namespace(c, ns)?;
    create_namespace(c, old)?;
    let orphan = |i: usize| {
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": format!("mcp-l3-egress.ghost-{i}"),
                "namespace": ns,
                "labels": {
                    "mcp-runtime.dev/managed-by": "mcp-access-controllers",
                    "mcp-runtime.dev/policy-type": "l3-egress",
                    "mcp-runtime.dev/mcpserver": format!("ghost-{i}"),
                },
            },
            "spec": {"podSelector": {"matchLabels": {"mcp-runtime.dev/mcpserver": format!("ghost-{i}")}}, "policyTypes": ["Egress"]},
        })
    };
    // What a runtime namespace dropped from the flag leaves: denies naming no object, only
    // their namespace (one name per type in real life; eleven here to pass the cap).
    let orphan_deny = |i: usize| {
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": format!("mcp-l0-deny-all-{i}"),
                "namespace": old,
                "labels": {
                    "mcp-runtime.dev/managed-by": "mcp-access-controllers",
                    "mcp-runtime.dev/policy-type": "l0-deny-all",
                },
            },
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        })
    };
    for i in 0..11 {
        apply(c, &orphan(i))?;
        apply(c, &orphan_deny(i))?;
    }
    // Lookalikes: our naming and type label, no managed-by. One holds the name of the L0
    // policy the controller will want in this namespace, with another spec.
    let lookalike = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "mcp-l3-egress.ghost-x",
            "namespace": ns,
            "labels": {"mcp-runtime.dev/policy-type": "l3-egress", "mcp-runtime.dev/mcpserver": "ghost-x"},
        },
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    });
    let squatter = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "mcp-l0-deny-all",
            "namespace": ns,
            "labels": {"mcp-runtime.dev/policy-type": "l0-deny-all"},
        },
        "spec": {"podSelector": {"matchLabels": {"team": "a"}}, "policyTypes": ["Ingress"]},
    });
    apply(c, &lookalike)?;
    apply(c, &squatter)?;

    let result = (|| {
        let controllers = start(c, "netpol-2", "netpol-2", &["--runtime-namespace=np2-a"])?;
        synced(&controllers)?;
        let withheld = controllers
            .metric("mcp_controllers_netpol_orphans_withheld", &[])
            .map_err(|e| e.to_string())?;
        ensure!(withheld == 11.0, "orphaned denies withheld: {withheld}");
        let sweeps = controllers
            .metric("mcp_controllers_netpol_sweeps_withheld_total", &[])
            .map_err(|e| e.to_string())?;
        ensure!(
            sweeps == 1.0,
            "one withheld sweep (11 orphans, alerted once): {sweeps}"
        );
        let conflicts = controllers
            .metric("mcp_controllers_netpol_unmanaged_conflicts", &[])
            .map_err(|e| e.to_string())?;
        ensure!(conflicts == 1.0, "the squatter is counted: {conflicts}");
        // The stale allows went in the same pass, past the cap.
        let allows = controllers
            .metric("mcp_controllers_netpol_orphan_allows_deleted_total", &[])
            .map_err(|e| e.to_string())?;
        ensure!(allows == 11.0, "orphaned allows deleted: {allows}");
        let names = managed_names(c, ns)?;
        ensure!(
            !names.iter().any(|n| n.contains("ghost-")),
            "every orphaned allow deleted: {names:?}"
        );
        let names = managed_names(c, old)?;
        ensure!(names.len() == 11, "no orphaned deny deleted: {names:?}");
        wait_policy(c, ns, "mcp-l1-dns")?;
        let events = until(Duration::from_secs(15), "the sweep's Warning Event", || {
            let out = c.kubectl(&[
                "get",
                "events.events.k8s.io",
                "-n",
                "mcp-access",
                "-o",
                "json",
            ]);
            let list: Value =
                serde_json::from_str(&ok(&out, "get events")?).map_err(|e| e.to_string())?;
            let found: Vec<Value> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| {
                    e["reason"] == "OrphanSweepWithheld"
                        && e["note"].as_str().is_some_and(|n| n.contains(old))
                })
                .cloned()
                .collect();
            Ok((!found.is_empty()).then_some(found))
        })?;
        let note = events[0]["note"].as_str().unwrap_or_default();
        ensure!(
            events[0]["type"] == "Warning"
                && note.contains("11 orphaned L0/L1")
                && note.contains("none of them deleted")
                && note.contains("orphaned allows are deleted regardless"),
            "event: {}",
            events[0]
        );
        ensure!(
            events[0]["regarding"]["kind"] == "Lease",
            "regarding: {}",
            events[0]["regarding"]
        );
        let untouched = |c: &LocalCluster| -> Result<(), String> {
            let l = policy(c, ns, "mcp-l3-egress.ghost-x")?.ok_or("the lookalike was deleted")?;
            ensure!(
                l["spec"]["podSelector"] == json!({}),
                "lookalike changed: {}",
                l["spec"]
            );
            let s = policy(c, ns, "mcp-l0-deny-all")?.ok_or("the squatter was deleted")?;
            ensure!(
                s["spec"]["podSelector"] == json!({"matchLabels": {"team": "a"}})
                    && s["metadata"]["labels"]
                        .get("mcp-runtime.dev/managed-by")
                        .is_none(),
                "squatter overwritten: {}",
                s
            );
            Ok(())
        };
        untouched(c)?;
        drop(controllers);

        // Within the caps (2 orphans in a fleet of 4: two L1 policies and the orphans, so at
        // most 50 %), the denies are swept; the lookalikes still stay.
        for i in 2..11 {
            ok(
                &c.kubectl(&[
                    "delete",
                    "networkpolicy",
                    &format!("mcp-l0-deny-all-{i}"),
                    "-n",
                    old,
                ]),
                "delete orphan",
            )?;
        }
        let controllers = start(
            c,
            "netpol-2b",
            "netpol-2",
            &[
                "--runtime-namespace=np2-a",
                "--orphan-delete-max-percent=50",
            ],
        )?;
        synced(&controllers)?;
        let withheld = controllers
            .metric("mcp_controllers_netpol_orphans_withheld", &[])
            .map_err(|e| e.to_string())?;
        ensure!(withheld == 0.0, "within the caps: {withheld}");
        until(Duration::from_secs(15), "orphaned denies swept", || {
            Ok(managed_names(c, old)?.is_empty().then_some(()))
        })?;
        let names = managed_names(c, ns)?;
        ensure!(
            names == ["mcp-l1-dns", "mcp-l1-gateway-sync"],
            "what remains managed: {names:?}"
        );
        untouched(c)?;
        drop(controllers);
        Ok(())
    })();
    delete_managed(c, &[ns, old]);
    let _ = c.kubectl(&["delete", "networkpolicy", "--all", "-n", ns]);
    result
}

/// A Context that grants more servers than the orphan cap is deleted: every ingress allow it
/// implied on the servers' side goes (an orphaned allow is never held back), and so does the
/// hosts' side. A server named by the Context that does not consent to Contexts of the hosts'
/// namespace never had a route.
pub fn a_deleted_context_takes_all_its_allows(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "np4-a";
    let hosts = "np4-hosts";
    create_namespace(c, ns)?;
    create_namespace(c, hosts)?;
    let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    let controllers = start(c, "netpol-4", "netpol-4", &["--runtime-namespace=np4-a"])?;
    let result = (|| {
        synced(&controllers)?;
        for name in &names {
            apply(c, &in_ns(server(name, 8080, json!([])), ns))?;
        }
        // Its owners consent to no other namespace.
        apply(
            c,
            &in_ns(
                json!({
                    "apiVersion": "mcp-runtime.dev/v1alpha1",
                    "kind": "MCPServer",
                    "metadata": {"name": "closed"},
                    "spec": {"image": "ghcr.io/acme/mcp:1", "port": 8080},
                }),
                ns,
            ),
        )?;
        let mut granted: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "namespace": ns}))
            .collect();
        granted.push(json!({"name": "closed", "namespace": ns}));
        apply(c, &in_ns(context("big", json!(granted)), hosts))?;
        for name in &names {
            wait_policy(c, ns, &format!("mcp-l2-ingress.{name}.{hosts}.big"))?;
            wait_policy(c, hosts, &format!("mcp-l2-egress.big.{ns}.{name}"))?;
        }
        ensure!(
            policy(c, ns, &format!("mcp-l2-ingress.closed.{hosts}.big"))?.is_none()
                && policy(c, hosts, &format!("mcp-l2-egress.big.{ns}.closed"))?.is_none(),
            "a route to a server that does not consent"
        );
        // It consents to namespaces labelled team=np4: still none until the hosts' namespace
        // carries the label, then both sides (the Namespace watch starts the pass).
        apply(
            c,
            &in_ns(
                json!({
                    "apiVersion": "mcp-runtime.dev/v1alpha1",
                    "kind": "MCPServer",
                    "metadata": {"name": "closed"},
                    "spec": {
                        "image": "ghcr.io/acme/mcp:1",
                        "port": 8080,
                        "allowedContexts": {"namespaces": {
                            "from": "Selector",
                            "selector": {"matchLabels": {"team": "np4"}},
                        }},
                    },
                }),
                ns,
            ),
        )?;
        std::thread::sleep(Duration::from_secs(2));
        ensure!(
            policy(c, ns, &format!("mcp-l2-ingress.closed.{hosts}.big"))?.is_none(),
            "a selector the hosts' namespace does not match admits nothing"
        );
        ok(
            &c.kubectl(&["label", "namespace", hosts, "team=np4"]),
            "label the hosts' namespace",
        )?;
        wait_policy(c, ns, &format!("mcp-l2-ingress.closed.{hosts}.big"))?;
        wait_policy(c, hosts, &format!("mcp-l2-egress.big.{ns}.closed"))?;

        ok(
            &c.kubectl(&["delete", "contexts.mcp-runtime.dev", "big", "-n", hosts]),
            "delete the Context",
        )?;
        until(Duration::from_secs(30), "every L2 allow gone", || {
            let left: Vec<String> = managed_names(c, ns)?
                .into_iter()
                .chain(managed_names(c, hosts)?)
                .filter(|n| n.starts_with("mcp-l2-"))
                .collect();
            Ok(left.is_empty().then_some(()))
        })?;
        let withheld = controllers
            .metric("mcp_controllers_netpol_orphans_withheld", &[])
            .map_err(|e| e.to_string())?;
        ensure!(withheld == 0.0, "no allow is held back: {withheld}");
        Ok(())
    })();
    let result = with_log(result, &controllers.log);
    clean_up(c, &[ns, hosts]);
    drop(controllers);
    delete_managed(c, &[ns, hosts]);
    result
}

/// `NetworkIsolated`: True for a server of a runtime namespace, False (with a Warning Event)
/// for one elsewhere, which is still deployed; under `--require-runtime-namespace` such a
/// server is not deployed, and `Ready` says why.
pub fn servers_outside_the_runtime_namespaces(c: &mut LocalCluster) -> Result<(), String> {
    let inside = "np3-a";
    let outside = "np3-out";
    create_namespace(c, inside)?;
    create_namespace(c, outside)?;
    let plain = |name: &str| {
        json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": name},
            "spec": {"image": "ghcr.io/acme/mcp:1", "port": 8080},
        })
    };
    let warning_for = |name: &str| -> Result<Value, String> {
        until(
            Duration::from_secs(15),
            &format!("the OutsideRuntimeNamespace Event of {name}"),
            || {
                let list = get_json(c, &["get", "events.events.k8s.io", "-n", outside])?
                    .ok_or("no event list")?;
                Ok(list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|e| {
                        e["reason"] == "OutsideRuntimeNamespace" && e["regarding"]["name"] == name
                    })
                    .cloned())
            },
        )
    };

    let controllers = start(c, "netpol-3", "netpol-3", &["--runtime-namespace=np3-a"])?;
    let result = (|| {
        apply(c, &in_ns(plain("isolated"), inside))?;
        apply(c, &in_ns(plain("exposed"), outside))?;
        let isolated = wait_condition(c, inside, "isolated", "NetworkIsolated", "True")?;
        ensure!(
            isolated["reason"] == "RuntimeNamespace",
            "inside: {isolated}"
        );
        let exposed = wait_condition(c, outside, "exposed", "NetworkIsolated", "False")?;
        let message = exposed["message"].as_str().unwrap_or_default();
        ensure!(
            exposed["reason"] == "OutsideRuntimeNamespace"
                && message.contains(outside)
                && message.contains("deployed anyway"),
            "outside: {exposed}"
        );
        until(Duration::from_secs(30), "exposed deployed", || {
            Ok(deployment_exists(c, outside, "exposed")?.then_some(()))
        })?;
        let event = warning_for("exposed")?;
        ensure!(event["type"] == "Warning", "event: {event}");
        // Both controllers' conditions side by side: applying one never drops the other's.
        wait_condition(c, outside, "exposed", "SecretsResolved", "True")?;
        wait_condition(c, outside, "exposed", "NetworkIsolated", "False")?;
        Ok(())
    })();
    let result = with_log(result, &controllers.log);
    drop(controllers);
    result?;

    let controllers = start(
        c,
        "netpol-3b",
        "netpol-3",
        &["--runtime-namespace=np3-a", "--require-runtime-namespace"],
    )?;
    let result = (|| {
        apply(c, &in_ns(plain("refused"), outside))?;
        let ready = wait_condition(c, outside, "refused", "Ready", "False")?;
        let message = ready["message"].as_str().unwrap_or_default();
        ensure!(
            ready["reason"] == "OutsideRuntimeNamespace"
                && message.contains("--require-runtime-namespace"),
            "Ready: {ready}"
        );
        let isolated = wait_condition(c, outside, "refused", "NetworkIsolated", "False")?;
        ensure!(
            isolated["message"]
                .as_str()
                .is_some_and(|m| m.contains("not deployed (--require-runtime-namespace)")),
            "NetworkIsolated: {isolated}"
        );
        warning_for("refused")?;
        std::thread::sleep(Duration::from_secs(2));
        ensure!(
            !deployment_exists(c, outside, "refused")?,
            "a server outside the runtime namespaces is deployed"
        );
        // Inside, the same flags deploy.
        apply(c, &in_ns(plain("allowed"), inside))?;
        until(Duration::from_secs(30), "allowed deployed", || {
            Ok(deployment_exists(c, inside, "allowed")?.then_some(()))
        })?;
        Ok(())
    })();
    let result = with_log(result, &controllers.log);
    clean_up(c, &[inside, outside]);
    drop(controllers);
    delete_managed(c, &[inside, outside]);
    result
}
