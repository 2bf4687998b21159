//! The MCPServer workload controller against the local cluster: `mcp-access-controllers`
//! (MCP_ACCESS_CONTROLLERS_BIN) runs as its own service account with the RBAC of
//! deploy/controllers. Each scenario starts its replicas on a Lease of its own and stops them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::gateway::GATEWAY_AUDIENCE;
use e2e::{Controllers, LocalCluster};
use serde_json::{json, Value};

use super::{create_namespace, ok};

pub(super) fn controllers_bin() -> Result<PathBuf, String> {
    std::env::var("MCP_ACCESS_CONTROLLERS_BIN")
        .map(PathBuf::from)
        .map_err(|_| "MCP_ACCESS_CONTROLLERS_BIN is not set: run through hack/test.sh".into())
}

pub(super) fn start(
    c: &LocalCluster,
    name: &str,
    lease: &str,
    extra: &[&str],
) -> Result<Controllers, String> {
    let lease = format!("--lease-name={lease}");
    let mut args = vec![lease.as_str()];
    args.extend_from_slice(extra);
    c.start_controllers(&controllers_bin()?, name, &args)
        .map_err(|e| format!("{e:#}"))
}

pub(super) fn apply(c: &LocalCluster, manifest: &Value) -> Result<(), String> {
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["apply", "-f", "-"],
        Some(&manifest.to_string()),
    );
    ok(&out, "kubectl apply").map(|_| ())
}

pub(super) fn get_json(c: &LocalCluster, args: &[&str]) -> Result<Option<Value>, String> {
    let mut full = args.to_vec();
    full.extend(["-o", "json"]);
    let out = c.kubectl(&full);
    if !out.success {
        if out.stderr.contains("NotFound") {
            return Ok(None);
        }
        return Err(format!("kubectl {} failed: {}", args.join(" "), out.stderr));
    }
    serde_json::from_str(&out.stdout)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn mcpserver(name: &str, image: &str, env_secret: Option<(&str, &[&str])>) -> Value {
    let mut spec = json!({"image": image, "port": 8080});
    if let Some((secret, keys)) = env_secret {
        spec["envSecret"] = json!({"name": secret, "keys": keys});
    }
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name},
        "spec": spec,
    })
}

pub(super) fn in_ns(mut manifest: Value, ns: &str) -> Value {
    manifest["metadata"]["namespace"] = json!(ns);
    manifest
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `within`.
/// Annotates `resource/name` (a change that asks nothing of `controller`), waits for the
/// reconcile it causes and checks that it wrote nothing: no child, no status, no Event.
pub(super) fn touch_writes_nothing(
    c: &LocalCluster,
    controllers: &e2e::Controllers,
    controller: &str,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<(), String> {
    let label = format!("controller=\"{controller}\"");
    let metric = |m: &str| controllers.metric(m, &[&label]).map_err(|e| e.to_string());
    let writes = metric("mcp_controllers_writes_total")?;
    let reconciles = metric("mcp_controllers_reconcile_duration_seconds_count")?;
    ok(
        &c.kubectl(&["annotate", resource, name, "-n", ns, "example.com/touch=1"]),
        &format!("annotate {resource} {name}"),
    )?;
    until(
        Duration::from_secs(15),
        "a reconcile after the touch",
        || {
            Ok(
                (metric("mcp_controllers_reconcile_duration_seconds_count")? > reconciles)
                    .then_some(()),
            )
        },
    )?;
    let after = metric("mcp_controllers_writes_total")?;
    ensure!(
        after == writes,
        "a no-op reconcile of {resource} {name} wrote {} times",
        after - writes
    );
    Ok(())
}

pub(super) fn until<T>(
    within: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn condition(server: &Value, type_: &str) -> Option<Value> {
    server["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

pub(super) fn wait_condition(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
) -> Result<Value, String> {
    until(
        Duration::from_secs(30),
        &format!("{ns}/{name} {type_}={status}"),
        || {
            let server = get_json(c, &["get", "mcpserver", name, "-n", ns])?;
            Ok(server
                .as_ref()
                .and_then(|s| condition(s, type_))
                .filter(|cond| cond["status"] == status))
        },
    )
}

pub(super) fn events(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    ok(
        &c.kubectl(&["events", "-n", ns, "--for", &format!("mcpserver/{name}")]),
        "kubectl events",
    )
}

/// `kubectl apply` of an MCPServer yields its Deployment (token only in the gateway
/// container), Service, ServiceAccount; kube-controller-manager makes the ReplicaSet and the
/// (Pending) Pod; a token bound to that Pod passes the 8085 sync listener; Ready and a
/// `Deployed` Event follow.
pub fn mcpserver_yields_its_gateway_workload(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-deploy";
    create_namespace(c, ns)?;
    let controllers = start(c, "deploy", "ctl-deploy", &[])?;
    apply(
        c,
        &in_ns(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "github-env"},
        "stringData": {"GITHUB_TOKEN": "t0ken"}}),
            ns,
        ),
    )?;
    apply(
        c,
        &in_ns(
            mcpserver(
                "github",
                "ghcr.io/acme/github-mcp:2",
                Some(("github-env", &["GITHUB_TOKEN"])),
            ),
            ns,
        ),
    )?;
    let server = get_json(c, &["get", "mcpserver", "github", "-n", ns])?.ok_or("no MCPServer")?;
    let server_uid = server["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    let deployment = until(Duration::from_secs(30), "Deployment github", || {
        get_json(
            c,
            &[
                "get",
                "deployment",
                "github",
                "-n",
                ns,
                "--show-managed-fields",
            ],
        )
    })?;
    let meta = &deployment["metadata"];
    ensure!(
        meta["labels"]["app"] == "github"
            && meta["labels"]["mcp-runtime.dev/managed-by"] == "mcp-access-controllers"
            && meta["labels"]["mcp-runtime.dev/mcpserver"] == "github",
        "labels: {}",
        meta["labels"]
    );
    let owner = &meta["ownerReferences"][0];
    ensure!(
        owner["kind"] == "MCPServer"
            && owner["uid"] == server_uid.as_str()
            && owner["controller"] == true,
        "owner reference: {owner}"
    );
    ensure!(
        meta["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .any(
                |f| f["manager"] == "mcp-access-controllers-mcpserver" && f["operation"] == "Apply"
            ),
        "applied by the controller's field manager: {}",
        meta["managedFields"]
    );
    let pod = &deployment["spec"]["template"]["spec"];
    ensure!(
        pod["automountServiceAccountToken"] == false,
        "automount: {pod}"
    );
    ensure!(
        pod["serviceAccountName"] == "github-gateway",
        "service account: {pod}"
    );
    let containers = pod["containers"].as_array().ok_or("no containers")?;
    ensure!(containers.len() == 2, "containers: {pod}");
    for container in containers {
        let mounts = container["volumeMounts"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0);
        match container["name"].as_str() {
            Some("gateway") => {
                ensure!(
                    mounts == 1 && container["volumeMounts"][0]["name"] == "mcp-access",
                    "gateway mounts: {container}"
                );
                // The enforcing proxy: the MCP container on loopback behind it, the Service URL
                // as the resource URI (the apiserver's default token audience).
                let args = &container["args"];
                ensure!(
                    args.as_array().is_some_and(|a| {
                        a.iter().any(|a| a == "--upstream=http://127.0.0.1:8080")
                            && a.iter()
                                .any(|a| *a == format!("--public-url=http://github.{ns}.svc:8086"))
                    }),
                    "gateway args: {args}"
                );
                ensure!(
                    container["ports"]
                        == json!([{"name": "gateway", "containerPort": 8086, "protocol": "TCP"}]),
                    "gateway ports: {container}"
                );
            }
            _ => {
                ensure!(
                    container["ports"].is_null(),
                    "the MCP server container declares no port: {container}"
                );
                ensure!(
                    mounts == 0,
                    "the MCP server container mounts nothing: {container}"
                );
                ensure!(
                    container["env"][0]["valueFrom"]["secretKeyRef"]
                        == json!({"name": "github-env", "key": "GITHUB_TOKEN"}),
                    "env from the Secret: {container}"
                );
            }
        }
    }
    let token_source = &pod["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"];
    ensure!(
        token_source["audience"] == GATEWAY_AUDIENCE && token_source["expirationSeconds"] == 600,
        "projected token: {token_source}"
    );
    let service = get_json(c, &["get", "service", "github", "-n", ns])?.ok_or("no Service")?;
    ensure!(
        service["spec"]["ports"][0]["port"] == 8086,
        "service: {}",
        service["spec"]
    );
    let sa = get_json(c, &["get", "serviceaccount", "github-gateway", "-n", ns])?
        .ok_or("no ServiceAccount")?;
    ensure!(sa["automountServiceAccountToken"] == false, "sa: {sa}");

    let deployment_uid = deployment["metadata"]["uid"].as_str().unwrap_or_default();
    let (_rs, rs_uid) = c
        .wait_owned(ns, "replicasets", deployment_uid)
        .map_err(|e| e.to_string())?;
    let (pod_name, pod_uid) = c
        .wait_owned(ns, "pods", &rs_uid)
        .map_err(|e| e.to_string())?;
    let phase = ok(
        &c.kubectl(&[
            "get",
            "pod",
            &pod_name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.phase}",
        ]),
        "pod phase",
    )?;
    ensure!(
        phase == "Pending",
        "no kubelet: the Pod stays Pending, got {phase}"
    );

    // What the kubelet would project: a token of the server's SA bound to that Pod.
    let token = c
        .service_account_token(
            ns,
            "github-gateway",
            Some(GATEWAY_AUDIENCE),
            Some((&pod_name, &pod_uid)),
        )
        .map_err(|e| e.to_string())?;
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
            "--cacert",
        ])
        .arg(c.sync_ca())
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!(
            "{}/apis/access.mcp-runtime.dev/v1alpha1/accesssessions",
            c.sync_url()
        ))
        .output()
        .map_err(|e| e.to_string())?;
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        code == "200",
        "the Pod-bound gateway token lists on 8085: {code}"
    );

    let ready = wait_condition(c, ns, "github", "Ready", "True")?;
    ensure!(ready["reason"] == "DeploymentObserved", "ready: {ready}");
    let server = get_json(c, &["get", "mcpserver", "github", "-n", ns])?.ok_or("no MCPServer")?;
    ensure!(
        server["status"]["observedGeneration"] == server["metadata"]["generation"],
        "status: {}",
        server["status"]
    );
    for (t, s) in [("SecretsResolved", "True"), ("ImageAllowed", "True")] {
        ensure!(
            condition(&server, t).is_some_and(|c| c["status"] == s),
            "{t}: {}",
            server["status"]
        );
    }
    let events = until(Duration::from_secs(10), "Deployed event", || {
        let e = events(c, ns, "github")?;
        Ok(e.contains("Deployed").then_some(e))
    })?;
    ensure!(events.contains("Normal"), "events: {events}");
    // Probes, and the MCPServers-by-condition gauge (from the controller's cache).
    ensure!(
        controllers.get("/livez").is_ok() && controllers.get("/readyz").is_ok(),
        "probes"
    );
    // Absent until the first reconcile sets it: read as 0 while waiting for it to reach 1.
    let ready_gauge = until(Duration::from_secs(10), "Ready gauge", || {
        let n = controllers
            .metric_or_zero(
                "mcp_controllers_mcpservers",
                &["condition=\"Ready\"", "status=\"True\""],
            )
            .map_err(|e| e.to_string())?;
        Ok((n >= 1.0).then_some(n))
    })?;
    println!(
        "controllers: mcp_controllers_mcpservers{{condition=Ready,status=True}} = {ready_gauge}"
    );
    Ok(())
}

/// A missing Secret (or key) blocks the workload with `SecretsResolved=False` naming the
/// keys and a `SecretMissing` Event; creating it deploys, without restarting anything.
pub fn missing_secret_blocks_until_it_appears(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-secret";
    create_namespace(c, ns)?;
    let mut controllers = start(c, "secret", "ctl-secret", &[])?;
    apply(
        c,
        &in_ns(
            mcpserver(
                "db",
                "ghcr.io/acme/db-mcp:1",
                Some(("db-env", &["DB_URL", "DB_PASSWORD"])),
            ),
            ns,
        ),
    )?;
    let cond = wait_condition(c, ns, "db", "SecretsResolved", "False")?;
    ensure!(cond["reason"] == "SecretNotFound", "condition: {cond}");
    // A Secret lacking one key: the condition names it.
    apply(
        c,
        &in_ns(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-env"},
        "stringData": {"DB_URL": "postgres://db"}}),
            ns,
        ),
    )?;
    let cond = until(Duration::from_secs(30), "SecretKeysMissing", || {
        let s = get_json(c, &["get", "mcpserver", "db", "-n", ns])?;
        Ok(s.and_then(|s| condition(&s, "SecretsResolved"))
            .filter(|c| c["reason"] == "SecretKeysMissing"))
    })?;
    ensure!(
        cond["message"]
            .as_str()
            .is_some_and(|m| m.contains("DB_PASSWORD") && !m.contains("DB_URL")),
        "names the missing key only: {cond}"
    );
    let ready = wait_condition(c, ns, "db", "Ready", "False")?;
    ensure!(ready["reason"] == "SecretsUnresolved", "ready: {ready}");
    ensure!(
        get_json(c, &["get", "deployment", "db", "-n", ns])?.is_none(),
        "no Deployment while unresolved"
    );
    let e = events(c, ns, "db")?;
    ensure!(
        e.contains("SecretMissing") && e.contains("Warning"),
        "events: {e}"
    );

    // The missing key arrives: deployed by the watch on Secrets, same process.
    apply(
        c,
        &in_ns(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-env"},
        "stringData": {"DB_URL": "postgres://db", "DB_PASSWORD": "pw"}}),
            ns,
        ),
    )?;
    until(
        Duration::from_secs(10),
        "Deployment after the Secret appeared",
        || get_json(c, &["get", "deployment", "db", "-n", ns]),
    )?;
    wait_condition(c, ns, "db", "SecretsResolved", "True")?;
    ensure!(controllers.running(), "the controllers did not restart");
    Ok(())
}

/// Enforce mode refuses a disallowed image (no workload, condition, Warning Event) and
/// deploys an allowed one; `ghcr.io/acme` does not admit `ghcr.io/acme-evil/...`.
pub fn enforce_mode_refuses_a_disallowed_image(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-image";
    create_namespace(c, ns)?;
    let _controllers = start(
        c,
        "image",
        "ctl-image",
        &[
            "--image-allow-prefix=ghcr.io/acme",
            "--image-policy=enforce",
        ],
    )?;
    apply(
        c,
        &in_ns(mcpserver("evil", "ghcr.io/acme-evil/x:1", None), ns),
    )?;
    apply(c, &in_ns(mcpserver("good", "ghcr.io/acme/x:1", None), ns))?;
    let cond = wait_condition(c, ns, "evil", "ImageAllowed", "False")?;
    ensure!(cond["reason"] == "ImageNotAllowed", "condition: {cond}");
    until(Duration::from_secs(30), "Deployment good", || {
        get_json(c, &["get", "deployment", "good", "-n", ns])
    })?;
    ensure!(
        get_json(c, &["get", "deployment", "evil", "-n", ns])?.is_none(),
        "a refused image has no Deployment"
    );
    let e = events(c, ns, "evil")?;
    ensure!(
        e.contains("ImageNotAllowed") && e.contains("Warning"),
        "events: {e}"
    );
    Ok(())
}

/// Audit mode deploys a disallowed image but says so: `ImageAllowed=False` and a Warning
/// `ImageNotAllowed` Event, while `Ready` follows the Deployment.
pub fn audit_mode_deploys_a_disallowed_image_with_a_warning(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "ctl-audit";
    create_namespace(c, ns)?;
    let _controllers = start(
        c,
        "audit",
        "ctl-audit",
        &["--image-allow-prefix=ghcr.io/acme", "--image-policy=audit"],
    )?;
    apply(c, &in_ns(mcpserver("evil", "evil.example/x:1", None), ns))?;
    until(Duration::from_secs(30), "Deployment evil", || {
        get_json(c, &["get", "deployment", "evil", "-n", ns])
    })?;
    let cond = wait_condition(c, ns, "evil", "ImageAllowed", "False")?;
    ensure!(
        cond["message"]
            .as_str()
            .is_some_and(|m| m.contains("audit")),
        "condition: {cond}"
    );
    wait_condition(c, ns, "evil", "Ready", "True")?;
    let e = events(c, ns, "evil")?;
    ensure!(
        e.contains("ImageNotAllowed") && e.contains("Warning") && e.contains("Deployed"),
        "events: {e}"
    );
    Ok(())
}

fn leader_of(replicas: &[&Controllers]) -> Option<usize> {
    replicas
        .iter()
        .position(|r| r.metric("mcp_controllers_leader", &[]).ok() == Some(1.0))
}

/// Two replicas on one Lease: only the leader acts; kill -9 it, create an MCPServer in the
/// meantime, and the standby takes over within the lease duration and deploys it.
pub fn standby_takes_over_after_the_leader_is_killed(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-leader";
    create_namespace(c, ns)?;
    let lease = ["--lease-duration-seconds=4", "--lease-grace-seconds=1"];
    let mut a = start(c, "leader-a", "ctl-leader", &lease)?;
    let mut b = start(c, "leader-b", "ctl-leader", &lease)?;
    let first = until(Duration::from_secs(20), "a leader", || {
        Ok(leader_of(&[&a, &b]))
    })?;
    apply(c, &in_ns(mcpserver("before", "ghcr.io/acme/x:1", None), ns))?;
    until(Duration::from_secs(30), "Deployment before", || {
        get_json(c, &["get", "deployment", "before", "-n", ns])
    })?;
    let (leader, standby) = if first == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    // The writes family has no series before a process's first write, so 0 here is read
    // from an absent series; the standby's own writes after the takeover (below) show the
    // same measurement counting.
    ensure!(
        standby
            .metric_or_zero("mcp_controllers_writes_total", &[])
            .map_err(|e| e.to_string())?
            == 0.0,
        "the standby wrote nothing"
    );
    leader.kill9();
    let killed = Instant::now();
    apply(
        c,
        &in_ns(mcpserver("meanwhile", "ghcr.io/acme/x:1", None), ns),
    )?;
    until(
        Duration::from_secs(30),
        "the standby deploys the change",
        || get_json(c, &["get", "deployment", "meanwhile", "-n", ns]),
    )?;
    let took = killed.elapsed();
    ensure!(
        standby
            .metric("mcp_controllers_leader", &[])
            .map_err(|e| e.to_string())?
            == 1.0,
        "the standby leads"
    );
    // The positive control of "the standby wrote nothing": its deploy of `meanwhile` counted.
    let standby_writes = standby
        .metric("mcp_controllers_writes_total", &[])
        .map_err(|e| e.to_string())?;
    ensure!(
        standby_writes.ge(&1.0),
        "the standby deployed `meanwhile` but counted {standby_writes} writes"
    );
    // Expected ~6 s (4 s lease + 1 s grace + a reconcile); 30 s keeps a 5x margin on a
    // loaded 2-core machine: a liveness bound, not a benchmark.
    ensure!(took < Duration::from_secs(30), "takeover took {took:?}");
    println!(
        "controllers: standby took over and deployed in {:.1}s after kill -9",
        took.as_secs_f64()
    );
    Ok(())
}

/// 200 MCPServers: time until all are Ready (Deployment applied and its generation observed
/// by kube-controller-manager), then a fresh replica resyncs them all with 0 writes.
pub fn noop_resync_of_200_mcpservers_writes_nothing(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-scale";
    create_namespace(c, ns)?;
    let items: Vec<Value> = (0..200)
        .map(|i| in_ns(mcpserver(&format!("s{i:03}"), "ghcr.io/acme/x:1", None), ns))
        .collect();
    let mut first = start(c, "scale-1", "ctl-scale", &[])?;
    let started = Instant::now();
    apply(
        c,
        &json!({"apiVersion": "v1", "kind": "List", "items": items}),
    )?;
    until(Duration::from_secs(300), "all 200 Ready", || {
        let list = get_json(c, &["get", "mcpservers", "-n", ns])?.ok_or("no list")?;
        let ready = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| condition(s, "Ready").is_some_and(|c| c["status"] == "True"))
            .count();
        Ok((ready == 200).then_some(()))
    })?;
    let all_ready = started.elapsed();
    // The second replica must find the world the first one left, so the first is stopped
    // only once it is done: every server in the cluster (other scenarios' too) carries the
    // NetworkPolicy controller's NetworkIsolated, and its write counter stands still for 3 s.
    // A controller that never settles fails here, which is a finding of its own.
    until(
        Duration::from_secs(120),
        "NetworkIsolated on every MCPServer",
        || {
            let list = get_json(c, &["get", "mcpservers", "-A"])?.ok_or("no list")?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            Ok(items
                .iter()
                .all(|s| condition(s, "NetworkIsolated").is_some())
                .then_some(()))
        },
    )?;
    let mut last = (f64::NAN, Instant::now());
    until(
        Duration::from_secs(120),
        "the first replica's writes to stand still for 3 s",
        || {
            let n = first
                .metric("mcp_controllers_writes_total", &[])
                .map_err(|e| e.to_string())?;
            if n != last.0 {
                last = (n, Instant::now());
            }
            Ok((last.1.elapsed() >= Duration::from_secs(3)).then_some(()))
        },
    )?;
    // The counter is live (so its 0 below means no writes, not a wrong name): the first
    // replica applied 4 children and a status for each of the 200.
    let first_writes = first
        .metric("mcp_controllers_writes_total", &[])
        .map_err(|e| e.to_string())?;
    ensure!(
        first_writes as u64 >= 1000,
        "the first replica counted {first_writes} writes"
    );
    first.stop();

    // Every MCPServer in the cluster (other scenarios' too) is reconciled on start.
    let total = get_json(c, &["get", "mcpservers", "-A"])?
        .and_then(|l| l["items"].as_array().map(Vec::len))
        .unwrap_or(0) as f64;
    let second = start(c, "scale-2", "ctl-scale", &[])?;
    let resync = Instant::now();
    until(
        Duration::from_secs(120),
        "a reconcile of every MCPServer",
        || {
            let n = second
                .metric(
                    "mcp_controllers_reconcile_duration_seconds_count",
                    &["controller=\"mcpserver\""],
                )
                .map_err(|e| e.to_string())?;
            Ok((n >= total).then_some(()))
        },
    )?;
    let resynced = resync.elapsed();
    // No write yet means no series yet: the change below is this process's positive control.
    let writes = second
        .metric_or_zero("mcp_controllers_writes_total", &[])
        .map_err(|e| e.to_string())?;
    println!(
        "controllers: 200 MCPServers all Ready in {:.1}s; no-op resync of {total} in {:.1}s with {} writes",
        all_ready.as_secs_f64(),
        resynced.as_secs_f64(),
        writes as u64
    );
    if writes != 0.0 {
        // Which controller wrote what kind: the series themselves, and the replica's log.
        let series: Vec<String> = second
            .get("/metrics")
            .map_err(|e| e.to_string())?
            .lines()
            .filter(|l| l.starts_with("mcp_controllers_writes_total"))
            .map(str::to_owned)
            .collect();
        return Err(format!(
            "a no-op resync made {writes} writes:\n{}\nlog:\n{}",
            series.join("\n"),
            e2e::mcp::tail(&second.log, 30)
        ));
    }
    // Positive control on the same process and measurement: a real change is written and
    // counted, so the 0 above is "no writes", not a series this replica never exports.
    apply(c, &in_ns(mcpserver("s000", "ghcr.io/acme/x:2", None), ns))?;
    let counted = until(
        Duration::from_secs(30),
        "the change's writes counted",
        || {
            let n = second
                .metric_or_zero("mcp_controllers_writes_total", &[])
                .map_err(|e| e.to_string())?;
            Ok((n >= 1.0).then_some(n))
        },
    )?;
    println!("controllers: the resyncing replica counted {counted} writes for one change");
    Ok(())
}

/// `kubectl apply` of a manifest the CRD must refuse: the refusal carries `message`.
fn refused(c: &LocalCluster, manifest: &Value, message: &str) -> Result<(), String> {
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["apply", "-f", "-"],
        Some(&manifest.to_string()),
    );
    ensure!(!out.success, "accepted: {manifest}");
    ensure!(
        out.stderr.contains(message),
        "refused without {message:?}: {}",
        out.stderr
    );
    Ok(())
}

fn server_with(ns: &str, name: &str, spec: Value) -> Value {
    in_ns(
        json!({"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
               "metadata": {"name": name}, "spec": spec}),
        ns,
    )
}

/// The three ways a server speaks MCP, on a real kube-apiserver: the CRD's CEL rules refuse
/// what cannot run (stdio without a command, image beside remote, a port for a remote); a
/// stdio server's Deployment runs its command behind the bridge an init container delivers,
/// with its replicas (0 kept), resources, pull policy and pull secrets; a remote server runs
/// the platform's proxy once the URL's own egress binding is proven, and a URL the L3 rules
/// refuse (a private address) keeps it undeployed with `ExternalEgressReady=False` naming the
/// binding `remote`.
pub fn stdio_and_remote_servers_take_their_shape(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "ctl-shape";
    create_namespace(c, ns)?;
    let _controllers = start(c, "shape", "ctl-shape", &[])?;

    refused(
        c,
        &server_with(
            ns,
            "x",
            json!({"image": "ghcr.io/acme/x:1", "port": 8080, "transport": "stdio"}),
        ),
        "transport stdio needs command",
    )?;
    refused(
        c,
        &server_with(
            ns,
            "x",
            json!({"image": "ghcr.io/acme/x:1", "port": 8080,
                                       "remote": {"url": "https://mcp.example.com/mcp"}}),
        ),
        "exactly one of image and remote",
    )?;
    refused(
        c,
        &server_with(
            ns,
            "x",
            json!({"port": 8080, "remote": {"url": "https://mcp.example.com/mcp"}}),
        ),
        "port goes with image, and not with remote",
    )?;
    refused(
        c,
        &server_with(
            ns,
            "x",
            json!({"image": "ghcr.io/acme/x:1", "port": 8080, "imagePullPolicy": "Sometimes"}),
        ),
        "imagePullPolicy",
    )?;

    apply(
        c,
        &server_with(
            ns,
            "fs",
            json!({
                "image": "ghcr.io/acme/fs-mcp:1", "port": 9000, "transport": "stdio",
                "command": ["python", "-m", "fs_mcp"], "args": ["--root=/data"],
                "replicas": 0,
                "resources": {"limits": {"memory": "256Mi"}},
                "imagePullPolicy": "IfNotPresent",
                "imagePullSecrets": [{"name": "registry"}],
            }),
        ),
    )?;
    let deployment = until(Duration::from_secs(30), "Deployment fs", || {
        get_json(c, &["get", "deployment", "fs", "-n", ns])
    })?;
    ensure!(
        deployment["spec"]["replicas"] == 0,
        "replicas: {}",
        deployment["spec"]
    );
    let pod = &deployment["spec"]["template"]["spec"];
    ensure!(
        pod["imagePullSecrets"] == json!([{"name": "registry"}]),
        "pod: {pod}"
    );
    let init = &pod["initContainers"][0];
    ensure!(
        init["name"] == "stdio-bridge"
            && init["args"] == json!(["--install=/mcp-access-bridge/mcp-access-stdio-bridge"]),
        "init: {init}"
    );
    let mcp = &pod["containers"][0];
    ensure!(
        mcp["command"] == json!(["/mcp-access-bridge/mcp-access-stdio-bridge"])
            && mcp["args"]
                == json!([
                    "--listen=127.0.0.1:9000",
                    "--",
                    "python",
                    "-m",
                    "fs_mcp",
                    "--root=/data"
                ]),
        "mcp: {mcp}"
    );
    ensure!(
        mcp["resources"]["limits"]["memory"] == "256Mi" && mcp["imagePullPolicy"] == "IfNotPresent",
        "mcp: {mcp}"
    );
    let gateway_args = pod["containers"][1]["args"].to_string();
    ensure!(
        gateway_args.contains("--upstream=http://127.0.0.1:9000"),
        "gateway: {gateway_args}"
    );

    // A remote server whose host is public: its binding proven, then the proxy deployed.
    apply(
        c,
        &server_with(ns, "far", json!({"remote": {"url": "https://1.1.1.1/mcp"}})),
    )?;
    let cond = wait_condition(c, ns, "far", "ExternalEgressReady", "True")?;
    ensure!(cond["reason"] == "EgressProven", "condition: {cond}");
    let deployment = until(Duration::from_secs(30), "Deployment far", || {
        get_json(c, &["get", "deployment", "far", "-n", ns])
    })?;
    let proxy = &deployment["spec"]["template"]["spec"]["containers"][0];
    ensure!(
        proxy["args"] == json!(["--listen=127.0.0.1:8080", "--remote=https://1.1.1.1/mcp"]),
        "proxy: {proxy}"
    );
    // The Pod's one way out: the URL's host (a /32 here) on its port, nothing else.
    until(Duration::from_secs(30), "the remote's egress allow", || {
        let list = get_json(c, &["get", "networkpolicy", "-n", ns])?;
        Ok(list.filter(|l| {
            let text = l.to_string();
            text.contains("1.1.1.1/32") && text.contains("\"port\":443")
        }))
    })?;
    let image = wait_condition(c, ns, "far", "ImageAllowed", "True")?;
    ensure!(image["reason"] == "Remote", "ImageAllowed: {image}");

    // A private address: refused by L3, never deployed.
    apply(
        c,
        &server_with(
            ns,
            "near",
            json!({"remote": {"url": "http://10.1.2.3:8080/mcp"}}),
        ),
    )?;
    let cond = wait_condition(c, ns, "near", "ExternalEgressReady", "False")?;
    ensure!(
        cond["message"]
            .as_str()
            .is_some_and(|m| m.contains("remote")),
        "condition: {cond}"
    );
    let ready = wait_condition(c, ns, "near", "Ready", "False")?;
    ensure!(
        ready["reason"] == "ExternalEgressNotReady",
        "ready: {ready}"
    );
    ensure!(
        get_json(c, &["get", "deployment", "near", "-n", ns])?.is_none(),
        "a refused remote has no Deployment"
    );
    let policies = get_json(c, &["get", "networkpolicy", "-n", ns])?.unwrap_or_default();
    ensure!(
        !policies.to_string().contains("10.1.2.3"),
        "no allow for a refused remote: {policies}"
    );
    Ok(())
}
