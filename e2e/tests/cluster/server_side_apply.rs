//! Server-side apply through kube-apiserver's aggregation proxy, as `kubectl apply
//! --server-side` and a GitOps applier use it: create, a second manager's conflict with the
//! managers named, `--force-conflicts`, and RBAC: a role granting `patch` on sessions (for
//! labelling them) cannot mint one by apply.

use e2e::LocalCluster;
use serde_json::Value;

use super::{create_namespace, ok, service_account_kubeconfig, session_yaml};

const NS: &str = "e2e-ssa";

fn managers(c: &LocalCluster, name: &str) -> Result<Vec<(String, String)>, String> {
    let text = ok(
        &c.kubectl(&[
            "get",
            "acs",
            name,
            "-n",
            NS,
            "-o",
            "json",
            "--show-managed-fields",
        ]),
        "get session",
    )?;
    let object: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(e2e::managed_field_managers(&object))
}

pub fn apply_conflicts_and_rbac_through_kube_apiserver(c: &mut LocalCluster) -> Result<(), String> {
    create_namespace(c, NS)?;
    let manifest = session_yaml("applied", "srv-ssa");
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["apply", "--server-side", "-n", NS, "-f", "-"],
        Some(&manifest),
    );
    let printed = ok(&out, "apply --server-side (create)")?;
    ensure!(
        printed.contains("accesssession.access.mcp-runtime.dev/applied serverside-applied"),
        "apply printed {printed:?}"
    );
    let found = managers(c, "applied")?;
    ensure!(
        found == [("kubectl".to_string(), "Apply".to_string())],
        "managers after create: {found:?}"
    );

    // Another manager changing the applied label conflicts; kubectl says how to resolve it.
    // (It applies the labels only: the session's expiry was clamped at issuance, so a
    // manifest's expiresAt differs from the stored one and would conflict too.)
    let labels = |labels: &str| {
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: applied\n  labels: {{{labels}}}\n"
        )
    };
    let relabelled = labels("team: ops");
    let out = c.kubectl_as(
        &c.kubeconfig,
        &[
            "apply",
            "--server-side",
            "--field-manager=gitops",
            "-n",
            NS,
            "-f",
            "-",
        ],
        Some(&relabelled),
    );
    ensure!(
        !out.success
            && out.stderr.contains(
                "Apply failed with 1 conflict: conflict with \"kubectl\": .metadata.labels.team"
            )
            && out.stderr.contains("--force-conflicts"),
        "conflicting apply: {out:?}"
    );
    let out = c.kubectl_as(
        &c.kubeconfig,
        &[
            "apply",
            "--server-side",
            "--field-manager=gitops",
            "--force-conflicts",
            "-n",
            NS,
            "-f",
            "-",
        ],
        Some(&relabelled),
    );
    ok(&out, "forced apply")?;
    let label = ok(
        &c.kubectl(&[
            "get",
            "acs",
            "applied",
            "-n",
            NS,
            "-o",
            "jsonpath={.metadata.labels.team}",
        ]),
        "get label",
    )?;
    ensure!(label == "ops", "label after the forced apply: {label:?}");
    let found = managers(c, "applied")?;
    ensure!(
        found.contains(&("gitops".to_string(), "Apply".to_string()))
            && found.contains(&("kubectl".to_string(), "Apply".to_string())),
        "managers after the forced apply: {found:?}"
    );

    // A labeller role: get and patch on sessions, no create.
    ok(
        &c.kubectl(&[
            "create",
            "role",
            "session-labeller",
            "-n",
            NS,
            "--verb=get,patch",
            "--resource=accesssessions.access.mcp-runtime.dev",
        ]),
        "create role",
    )?;
    let labeller = service_account_kubeconfig(c, NS, "labeller")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "session-labeller",
            "-n",
            NS,
            "--role=session-labeller",
            &format!("--serviceaccount={NS}:labeller"),
        ]),
        "create rolebinding",
    )?;
    let minted = session_yaml("minted", "srv-ssa");
    let out = c.kubectl_as(
        &labeller,
        &["apply", "--server-side", "-n", NS, "-f", "-"],
        Some(&minted),
    );
    ensure!(
        !out.success
            && out.stderr.contains("Forbidden")
            && out
                .stderr
                .contains("cannot create resource \"accesssessions\""),
        "a patch-only role applied a new session: {out:?}"
    );
    let out = c.kubectl(&["get", "acs", "minted", "-n", NS]);
    ensure!(
        !out.success && out.stderr.contains("NotFound"),
        "the refused apply left a session: {out:?}"
    );
    // The same role may apply to a session that exists (its labels).
    let out = c.kubectl_as(
        &labeller,
        &[
            "apply",
            "--server-side",
            "--field-manager=labeller",
            "--force-conflicts",
            "-n",
            NS,
            "-f",
            "-",
        ],
        Some(&labels("team: ops, reviewed: \"yes\"")),
    );
    ok(&out, "labeller's apply to an existing session")?;
    Ok(())
}
