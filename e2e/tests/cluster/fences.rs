//! Fences reach no further than their creator's RBAC, through kube-apiserver: a revoker bound
//! in one namespace (RoleBinding) fences a server there only; one bound cluster-wide
//! (ClusterRoleBinding, as the controllers are) fences it in every namespace. MCP Access asks
//! kube-apiserver (SubjectAccessReview for `create revocations` at the cluster scope) which it
//! is.

use e2e::LocalCluster;

use super::{create_namespace, ok, service_account_kubeconfig, session_yaml};

const NS_A: &str = "e2e-fence-a";
const NS_B: &str = "e2e-fence-b";

fn fence_yaml(name: &str, uid: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {{name: {name}}}\nspec: {{target: {{server: {{name: github, uid: {uid}}}}}, cause: server_retired}}\n"
    )
}

fn phase(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    ok(
        &c.kubectl(&[
            "get",
            "acs",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.phase}",
        ]),
        "get session phase",
    )
}

pub fn fence_scope_follows_rbac(c: &mut LocalCluster) -> Result<(), String> {
    for ns in [NS_A, NS_B] {
        create_namespace(c, ns)?;
        for (name, uid) in [("local", "srv-fence-local"), ("global", "srv-fence-global")] {
            ok(
                &c.kubectl_as(
                    &c.kubeconfig,
                    &["create", "-n", ns, "-f", "-"],
                    Some(&session_yaml(name, uid)),
                ),
                "create session",
            )?;
        }
    }
    // A namespace revoker in A, a cluster-wide revoker living in A.
    let local = service_account_kubeconfig(c, NS_A, "local-revoker")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "local-revoker",
            "-n",
            NS_A,
            "--clusterrole=mcp-access-revoker",
            &format!("--serviceaccount={NS_A}:local-revoker"),
        ]),
        "bind the revoker in one namespace",
    )?;
    let global = service_account_kubeconfig(c, NS_A, "cluster-revoker")?;
    ok(
        &c.kubectl(&[
            "create",
            "clusterrolebinding",
            "e2e-fence-cluster-revoker",
            "--clusterrole=mcp-access-revoker",
            &format!("--serviceaccount={NS_A}:cluster-revoker"),
        ]),
        "bind the revoker cluster-wide",
    )?;

    let out = c.kubectl_as(
        &local,
        &[
            "create",
            "-n",
            NS_A,
            "-f",
            "-",
            "-o",
            "jsonpath={.status.clusterWide}",
        ],
        Some(&fence_yaml("retire-local", "srv-fence-local")),
    );
    let cluster_wide = ok(&out, "namespace revoker's fence")?;
    if !cluster_wide.is_empty() {
        return Err(format!(
            "a namespace revoker's fence is cluster-wide: {cluster_wide:?}"
        ));
    }
    if phase(c, NS_A, "local")? != "Revoked" || phase(c, NS_B, "local")? != "Active" {
        return Err("the namespace fence must revoke in its namespace only".into());
    }
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["create", "-n", NS_B, "-f", "-"],
        Some(&session_yaml("local-2", "srv-fence-local")),
    );
    ok(&out, "issuing in another namespace under a namespace fence")?;

    let out = c.kubectl_as(
        &global,
        &[
            "create",
            "-n",
            NS_A,
            "-f",
            "-",
            "-o",
            "jsonpath={.status.clusterWide}",
        ],
        Some(&fence_yaml("retire-global", "srv-fence-global")),
    );
    if ok(&out, "cluster revoker's fence")? != "true" {
        return Err(format!(
            "a cluster-wide revoker's fence is not cluster-wide: {out:?}"
        ));
    }
    if phase(c, NS_B, "global")? != "Revoked" {
        return Err("the cluster-wide fence must revoke in every namespace".into());
    }
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["create", "-n", NS_B, "-f", "-"],
        Some(&session_yaml("global-2", "srv-fence-global")),
    );
    if out.success || !out.stderr.contains("Conflict") {
        return Err(format!(
            "issuing under a cluster-wide fence must be 409: {out:?}"
        ));
    }
    let _ = c.kubectl(&["delete", "clusterrolebinding", "e2e-fence-cluster-revoker"]);
    Ok(())
}
