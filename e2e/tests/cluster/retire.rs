//! Retirement through the API (DESIGN §6), against the local cluster: deleting an MCPServer
//! creates a `server_retired` Revocation through the aggregated API (the permanent fence on its
//! uid), every session of that uid is Revoked in every namespace, issuing a new one is refused,
//! and only then does the MCPServer (and, by garbage collection, what it owns) go away. With the
//! APIService down the deletion waits with `Retiring=False` (APIUnavailable) and completes once
//! it is back. A namesake (same name, new uid) is another server: the old fence does not touch it.
//!
//! `mcp-access-controllers` (MCP_ACCESS_CONTROLLERS_BIN) runs as its own service account with the
//! RBAC of deploy/controllers (the revoker role bound cluster-wide); each scenario starts one
//! replica on a Lease of its own and stops it.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::LocalCluster;

use super::{create_namespace, ok, session_yaml};

const NS: &str = "e2e-retire";
const NS_OTHER: &str = "e2e-retire-other";
const NS_DOWN: &str = "e2e-retire-down";
const NS_TORN_DOWN: &str = "e2e-retire-torn-down";
const NS_FENCES: &str = "e2e-retire-fences";

/// The finalizer of the retirement controller (`FINALIZER`).
const FINALIZER: &str = "mcp-runtime.dev/retire";

/// One `mcp-access-controllers` replica as the controllers' service account (RBAC of
/// deploy/controllers: the revoker role bound cluster-wide), on a Lease of its own, with a short
/// backoff so a scenario sees the deletion complete soon after the API returns. Stopped on drop.
fn start_controllers(
    c: &LocalCluster,
    name: &str,
    fence_namespace: Option<&str>,
) -> Result<e2e::Controllers, String> {
    let bin = std::env::var("MCP_ACCESS_CONTROLLERS_BIN")
        .map_err(|_| "MCP_ACCESS_CONTROLLERS_BIN is not set: run through hack/test.sh")?;
    let lease = format!("--lease-name=e2e-{name}");
    let mut args = vec![lease, "--retire-max-backoff-seconds=2".to_string()];
    if let Some(ns) = fence_namespace {
        args.push(format!("--retire-fence-namespace={ns}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.start_controllers(Path::new(&bin), name, &args)
        .map_err(|e| format!("{e:#}"))
}

fn mcpserver_yaml(name: &str) -> String {
    format!(
        "apiVersion: mcp-runtime.dev/v1alpha1\nkind: MCPServer\nmetadata: {{name: {name}}}\nspec: {{image: ghcr.io/example/mcp:1, port: 8080}}\n"
    )
}

/// A ConfigMap owned by the MCPServer, standing in for the workload it owns.
fn owned_configmap_yaml(name: &str, owner: &str, uid: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  ownerReferences:\n  - {{apiVersion: mcp-runtime.dev/v1alpha1, kind: MCPServer, name: {owner}, uid: {uid}, controller: true}}\ndata: {{k: v}}\n"
    )
}

fn apply(c: &LocalCluster, ns: &str, yaml: &str, what: &str) -> Result<String, String> {
    ok(
        &c.kubectl_as(&c.kubeconfig, &["apply", "-n", ns, "-f", "-"], Some(yaml)),
        what,
    )
}

fn get(c: &LocalCluster, ns: &str, what: &[&str], path: &str) -> Result<String, String> {
    let jsonpath = format!("jsonpath={path}");
    let mut args = vec!["get", "-n", ns];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", &jsonpath]);
    ok(&c.kubectl(&args), &format!("get {what:?} {path}"))
}

fn exists(c: &LocalCluster, ns: &str, what: &[&str]) -> bool {
    let mut args = vec!["get", "-n", ns];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", "name", "--ignore-not-found"]);
    let out = c.kubectl(&args);
    !(out.success && out.stdout.trim().is_empty())
}

/// Polls `check` until it holds or `timeout` passes.
fn wait_until(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut last = Ok(false);
    while Instant::now() < deadline {
        last = check();
        if let Ok(true) = last {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!("{what} not within {timeout:?} (last: {last:?})"))
}

/// Creates MCPServer `name` in `ns` and waits until the controller holds it with its finalizer;
/// returns its uid.
fn create_held_server(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    apply(c, ns, &mcpserver_yaml(name), "create the MCPServer")?;
    wait_until(Duration::from_secs(20), "the retire finalizer", || {
        Ok(get(c, ns, &["mcpserver", name], "{.metadata.finalizers}")?.contains(FINALIZER))
    })?;
    get(c, ns, &["mcpserver", name], "{.metadata.uid}")
}

fn phase(c: &LocalCluster, ns: &str, session: &str) -> Result<String, String> {
    get(c, ns, &["acs", session], "{.status.phase}")
}

fn issue(c: &LocalCluster, ns: &str, name: &str, uid: &str) -> e2e::Output {
    c.kubectl_as(
        &c.kubeconfig,
        &["create", "-n", ns, "-f", "-"],
        Some(&session_yaml(name, uid)),
    )
}

/// Deleting an MCPServer fences its uid through the API, revokes its sessions everywhere,
/// refuses new ones, says so in an Event, and lets the server and what it owns go; a namesake
/// created afterwards is untouched by the old fence.
pub fn deleting_an_mcpserver_fences_its_uid(c: &mut LocalCluster) -> Result<(), String> {
    let _controllers = start_controllers(c, "retire", None)?;
    create_namespace(c, NS)?;
    create_namespace(c, NS_OTHER)?;
    let uid = create_held_server(c, NS, "github")?;
    for (ns, session) in [(NS, "s1"), (NS, "s2"), (NS_OTHER, "s3")] {
        ok(&issue(c, ns, session, &uid), "issue a session")?;
    }
    apply(
        c,
        NS,
        &owned_configmap_yaml("github-owned", "github", &uid),
        "create an owned ConfigMap",
    )?;

    ok(
        &c.kubectl(&[
            "delete",
            "mcpserver",
            "github",
            "-n",
            NS,
            "--wait=true",
            "--timeout=60s",
        ]),
        "delete the MCPServer",
    )?;
    ensure!(
        !exists(c, NS, &["mcpserver", "github"]),
        "the MCPServer is still there after the delete returned"
    );

    let fence = format!("server-retired-{uid}");
    let cause = get(c, NS, &["revocation", &fence], "{.spec.cause}")?;
    let target = get(c, NS, &["revocation", &fence], "{.spec.target.server.uid}")?;
    let cluster_wide = get(c, NS, &["revocation", &fence], "{.status.clusterWide}")?;
    ensure!(
        cause == "server_retired" && target == uid && cluster_wide == "true",
        "the fence: cause {cause:?}, target uid {target:?} (want {uid}), clusterWide {cluster_wide:?}"
    );
    for (ns, session) in [(NS, "s1"), (NS, "s2"), (NS_OTHER, "s3")] {
        let p = phase(c, ns, session)?;
        ensure!(
            p == "Revoked",
            "session {ns}/{session} is {p:?}, not Revoked"
        );
        let by = get(c, ns, &["acs", session], "{.status.revocation.cause}")?;
        ensure!(
            by == "server_retired",
            "session {ns}/{session} revoked by {by:?}"
        );
    }
    for ns in [NS, NS_OTHER] {
        let out = issue(c, ns, "after-retirement", &uid);
        ensure!(
            !out.success && out.stderr.contains("Conflict"),
            "issuing a session for the retired uid in {ns} must be 409: {out:?}"
        );
    }
    let retired = get(
        c,
        NS,
        &[
            "events",
            "--field-selector",
            "reason=Retired,involvedObject.name=github",
        ],
        "{.items[*].type}",
    )?;
    ensure!(
        retired.split_whitespace().any(|t| t == "Normal"),
        "no Retired Event on the MCPServer: {retired:?}"
    );
    // kube-controller-manager's garbage collector may take a discovery resync to watch a new
    // kind, as in the gateway scenarios.
    let collecting = Instant::now();
    wait_until(
        Duration::from_secs(90),
        "garbage collection of what the MCPServer owned",
        || Ok(!exists(c, NS, &["configmap", "github-owned"])),
    )?;
    eprintln!(
        "    owned ConfigMap collected {:.1}s after the MCPServer went",
        collecting.elapsed().as_secs_f64()
    );

    // A namesake is another server: the old fence neither revokes nor refuses its sessions.
    let new_uid = create_held_server(c, NS, "github")?;
    ensure!(new_uid != uid, "the re-created MCPServer kept uid {uid}");
    ok(
        &issue(c, NS, "namesake", &new_uid),
        "issue a session for the namesake",
    )?;
    let p = phase(c, NS, "namesake")?;
    ensure!(p == "Active", "the namesake's session is {p:?}, not Active");
    ensure!(
        !issue(c, NS, "old-uid-again", &uid).success,
        "the old uid must stay fenced after the namesake appears"
    );
    // Retiring the namesake fences its own uid under its own name.
    ok(
        &c.kubectl(&["delete", "mcpserver", "github", "-n", NS, "--timeout=60s"]),
        "delete the namesake",
    )?;
    let p = phase(c, NS, "namesake")?;
    ensure!(
        p == "Revoked",
        "the namesake's session after its retirement: {p:?}"
    );
    ensure!(
        exists(c, NS, &["revocation", &format!("server-retired-{new_uid}")]),
        "no fence of its own for the namesake"
    );
    Ok(())
}

/// With the APIService down, deleting an MCPServer waits: the finalizer stays, `Retiring` is
/// False with `APIUnavailable`, a Warning Event says so, and no session changes. Once the API is
/// back the fence is created and the deletion completes.
pub fn retirement_waits_for_the_access_api(c: &mut LocalCluster) -> Result<(), String> {
    let controllers = start_controllers(c, "retire-down", None)?;
    create_namespace(c, NS_DOWN)?;
    let uid = create_held_server(c, NS_DOWN, "down")?;
    ok(&issue(c, NS_DOWN, "s1", &uid), "issue a session")?;
    // The workload controller's conditions (another field manager) stay beside `Retiring`:
    // each manager applies only its own entries of the map list.
    wait_until(
        Duration::from_secs(20),
        "the workload controller's SecretsResolved",
        || {
            Ok(!get(
                c,
                NS_DOWN,
                &["mcpserver", "down"],
                "{.status.conditions[?(@.type==\"SecretsResolved\")].status}",
            )?
            .is_empty())
        },
    )?;

    c.stop_apiserver();
    let result = (|| {
        ok(
            &c.kubectl(&["delete", "mcpserver", "down", "-n", NS_DOWN, "--wait=false"]),
            "delete the MCPServer",
        )?;
        wait_until(
            Duration::from_secs(45),
            "Retiring=False APIUnavailable",
            || {
                let cond = get(
                    c,
                    NS_DOWN,
                    &["mcpserver", "down"],
                    "{.status.conditions[?(@.type==\"Retiring\")].status}/{.status.conditions[?(@.type==\"Retiring\")].reason}",
                )?;
                Ok(cond == "False/APIUnavailable")
            },
        )?;
        let secrets = get(
            c,
            NS_DOWN,
            &["mcpserver", "down"],
            "{.status.conditions[?(@.type==\"SecretsResolved\")].status}",
        )?;
        ensure!(
            !secrets.is_empty(),
            "the workload controller's SecretsResolved condition is gone"
        );
        // Several backoff periods later it still waits, with its finalizer.
        std::thread::sleep(Duration::from_secs(5));
        let finalizers = get(c, NS_DOWN, &["mcpserver", "down"], "{.metadata.finalizers}")?;
        ensure!(
            finalizers.contains(FINALIZER),
            "the MCPServer lost its finalizer while the API was down: {finalizers:?}"
        );
        let deleting = get(
            c,
            NS_DOWN,
            &["mcpserver", "down"],
            "{.metadata.deletionTimestamp}",
        )?;
        ensure!(!deleting.is_empty(), "the MCPServer is not being deleted");
        let blocked = get(
            c,
            NS_DOWN,
            &[
                "events",
                "--field-selector",
                "reason=RetirementBlocked,involvedObject.name=down",
            ],
            "{.items[*].type}",
        )?;
        ensure!(
            blocked.split_whitespace().any(|t| t == "Warning"),
            "no RetirementBlocked Warning Event: {blocked:?}"
        );
        Ok::<(), String>(())
    })();
    // The API comes back whatever happened, so later scenarios find it.
    c.start_apiserver().map_err(|e| format!("{e:#}"))?;
    c.wait_available(Duration::from_secs(60))
        .map_err(|e| format!("{e:#}"))?;
    result?;

    wait_until(
        Duration::from_secs(60),
        "the deletion completes once the API is back",
        || Ok(!exists(c, NS_DOWN, &["mcpserver", "down"])),
    )?;
    let fence = format!("server-retired-{uid}");
    let cause = get(c, NS_DOWN, &["revocation", &fence], "{.spec.cause}")?;
    ensure!(cause == "server_retired", "the fence's cause: {cause:?}");
    let p = phase(c, NS_DOWN, "s1")?;
    ensure!(p == "Revoked", "the session after retirement: {p:?}");
    drop(controllers);
    Ok(())
}

/// Deleting the namespace of an MCPServer: no object may be created there any more, so the fence
/// goes to the fence namespace (`--retire-fence-namespace`), cluster-wide as ever, and the
/// namespace's deletion completes. Then the fence namespace itself, which now holds a fence,
/// is deleted too: its teardown takes the fence's record, and the fence stays (a namespace of
/// that name made again still refuses the retired uid).
pub fn deleting_the_namespace_fences_its_servers(c: &mut LocalCluster) -> Result<(), String> {
    let _controllers = start_controllers(c, "retire-ns", Some(NS_FENCES))?;
    create_namespace(c, NS_FENCES)?;
    create_namespace(c, NS_TORN_DOWN)?;
    let late = create_held_server(c, NS_TORN_DOWN, "late")?;
    ok(&issue(c, NS_TORN_DOWN, "s1", &late), "issue a session")?;

    ok(
        &c.kubectl(&["delete", "namespace", NS_TORN_DOWN, "--wait=false"]),
        "delete the namespace",
    )?;
    wait_until(
        Duration::from_secs(90),
        "the namespace's deletion completes",
        || {
            let out = c.kubectl(&["get", "namespace", NS_TORN_DOWN, "-o", "name"]);
            Ok(!out.success && out.stderr.contains("NotFound"))
        },
    )
    .map_err(|e| {
        let why = c.kubectl(&[
            "get",
            "namespace",
            NS_TORN_DOWN,
            "-o",
            "jsonpath={.status.conditions}",
        ]);
        let servers = c.kubectl(&[
            "get",
            "mcpservers",
            "-n",
            NS_TORN_DOWN,
            "-o",
            "jsonpath={.items[*].status.conditions}",
        ]);
        format!(
            "{e}; namespace: {}; servers: {}",
            why.stdout, servers.stdout
        )
    })?;
    let fence = format!("server-retired-{late}");
    let cluster_wide = get(
        c,
        NS_FENCES,
        &["revocation", &fence],
        "{.status.clusterWide}",
    )?;
    let target = get(
        c,
        NS_FENCES,
        &["revocation", &fence],
        "{.spec.target.server.uid}",
    )?;
    ensure!(
        cluster_wide == "true" && target == late,
        "the rehomed fence: clusterWide {cluster_wide:?}, target {target:?}"
    );
    let out = issue(c, NS_FENCES, "after-teardown", &late);
    ensure!(
        !out.success && out.stderr.contains("Conflict"),
        "issuing for the retired uid after the teardown must be 409: {out:?}"
    );

    ok(
        &c.kubectl(&["delete", "namespace", NS_FENCES, "--wait=false"]),
        "delete the namespace holding the fence",
    )?;
    wait_until(
        Duration::from_secs(90),
        "the deletion of the namespace holding the fence completes",
        || {
            let out = c.kubectl(&["get", "namespace", NS_FENCES, "-o", "name"]);
            Ok(!out.success && out.stderr.contains("NotFound"))
        },
    )?;
    create_namespace(c, NS_FENCES)?;
    let out = issue(c, NS_FENCES, "after-namespace-gone", &late);
    ensure!(
        !out.success && out.stderr.contains("Conflict"),
        "the fence must outlive its namespace: {out:?}"
    );
    Ok(())
}
