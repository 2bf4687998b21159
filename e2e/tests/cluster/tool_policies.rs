//! ToolPolicy through kube-apiserver with kubectl (issue 31, items 2 and 7): `explain`
//! documents it, `apply` (client- and server-side) creates it `Ready`, `get -o wide` shows its
//! columns, a policy with any fault is refused whole with every fault named and the stored
//! one stays, the server it governs is immutable, and each change is a generation.

use serde_json::{json, Value};

use super::{create_namespace, ok};
use e2e::LocalCluster;

const NS: &str = "e2e-toolpolicies";

fn policy(name: &str, server: &str, tools: Value) -> String {
    json!({
        "apiVersion": "access.mcp-runtime.dev/v1alpha1",
        "kind": "ToolPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "server": {"name": server},
            "destructiveCallers": {"teams": ["sre"], "agents": ["release-bot"]},
            "tools": tools,
        },
    })
    .to_string()
}

fn get(c: &LocalCluster, name: &str) -> Result<Value, String> {
    let out = ok(
        &c.kubectl(&["get", "toolpolicy", name, "-n", NS, "-o", "json"]),
        "kubectl get toolpolicy",
    )?;
    serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))
}

fn ready(policy: &Value) -> (Value, Value, Value) {
    let status = &policy["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or(Value::Null);
    (
        ready["status"].clone(),
        ready["reason"].clone(),
        status["observedGeneration"].clone(),
    )
}

pub fn through_kubectl(c: &mut LocalCluster) -> Result<(), String> {
    create_namespace(c, NS)?;
    let explain = ok(
        &c.kubectl(&["explain", "toolpolicy.spec.tools"]),
        "kubectl explain",
    )?;
    ensure!(
        explain.contains("sideEffect")
            && explain.contains("destructive")
            && explain.contains("arguments"),
        "{explain}"
    );
    let admin = c.kubeconfig.clone();
    let good = policy(
        "guard",
        "github",
        json!([
            {"name": "delete_*", "sideEffect": "destructive"},
            {"name": "create_repo", "sideEffect": "write",
             "arguments": [{"name": "visibility", "values": ["private"]}]},
        ]),
    );
    let created = ok(
        &c.kubectl_as(&admin, &["apply", "-f", "-"], Some(&good)),
        "apply",
    )?;
    ensure!(
        created.contains("toolpolicy.access.mcp-runtime.dev/guard created"),
        "{created}"
    );
    let stored = get(c, "guard")?;
    ensure!(
        ready(&stored) == (json!("True"), json!("Accepted"), json!(1)),
        "a new policy is Ready at generation 1: {stored}"
    );
    let wide = ok(
        &c.kubectl(&["get", "tp", "-n", NS, "-o", "wide"]),
        "get -o wide",
    )?;
    let header: Vec<&str> = wide
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header
            == [
                "NAME",
                "SERVER",
                "MODE",
                "TOOLS",
                "DESTRUCTIVE",
                "READY",
                "AGE",
                "CALLERS"
            ],
        "{wide}"
    );
    let row: Vec<&str> = wide
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        row.len() == 8
            && row[..6] == ["guard", "github", "enforce", "2", "1", "True"]
            && row[7] == "sre,agent/release-bot",
        "{wide}"
    );

    // Every fault of a bad version is named, and nothing of it is stored.
    let bad = policy(
        "guard",
        "github",
        json!([
            {"name": "delete repo", "sideEffect": "destructive"},
            {"name": "create_repo", "sideEffect": "write",
             "arguments": [{"name": "visibility", "values": []}]},
            {"name": "create_repo", "sideEffect": "read"},
        ]),
    );
    let refused = c.kubectl_as(&admin, &["apply", "-f", "-"], Some(&bad));
    ensure!(
        !refused.success,
        "an invalid policy was applied: {}",
        refused.stdout
    );
    for field in [
        "spec.tools[0].name",
        "spec.tools[1].arguments[0].values",
        "spec.tools[2].name",
    ] {
        ensure!(
            refused.stderr.contains(field),
            "{field} not named: {}",
            refused.stderr
        );
    }
    ensure!(
        get(c, "guard")? == stored,
        "a refused apply changed the policy"
    );
    let unknown = policy(
        "odd",
        "github",
        json!([{"name": "x", "sideEffect": "explosive"}]),
    );
    let refused = c.kubectl_as(&admin, &["apply", "-f", "-"], Some(&unknown));
    ensure!(
        !refused.success && refused.stderr.contains("explosive"),
        "an unknown side effect: {} {}",
        refused.stdout,
        refused.stderr
    );
    // The server it governs is fixed.
    let moved = policy(
        "guard",
        "gitlab",
        json!([{"name": "delete_*", "sideEffect": "destructive"}]),
    );
    let refused = c.kubectl_as(&admin, &["apply", "-f", "-"], Some(&moved));
    ensure!(
        !refused.success
            && refused.stderr.contains("spec.server")
            && refused.stderr.contains("immutable"),
        "{}",
        refused.stderr
    );
    // A change is a new generation, accepted at once.
    ok(
        &c.kubectl(&[
            "patch",
            "tp",
            "guard",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"mode":"monitor"}}"#,
        ]),
        "patch mode",
    )?;
    let patched = get(c, "guard")?;
    ensure!(
        patched["spec"]["mode"] == "monitor"
            && ready(&patched) == (json!("True"), json!("Accepted"), json!(2)),
        "{patched}"
    );
    // Server-side apply, as for every kind.
    let ssa = policy(
        "ssa",
        "github",
        json!([{"name": "drop_*", "sideEffect": "destructive"}]),
    );
    ok(
        &c.kubectl_as(
            &admin,
            &["apply", "--server-side", "--field-manager=e2e", "-f", "-"],
            Some(&ssa),
        ),
        "apply --server-side",
    )?;
    ensure!(
        ready(&get(c, "ssa")?).0 == "True",
        "the server-side applied policy is not Ready"
    );
    ok(
        &c.kubectl(&["delete", "tp", "guard", "ssa", "-n", NS]),
        "delete",
    )?;
    Ok(())
}
