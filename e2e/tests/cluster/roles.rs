//! The default roles of `deploy/rbac/user-roles.yaml`, verb by verb, through kube-apiserver:
//! every role is bound to a service account of its own and performs each request for real
//! (no `kubectl auth can-i`); the outcome is what kubectl reports, allowed or Forbidden.
//! docs/rbac.md holds the same matrix.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{LocalCluster, Output};
use serde_json::Value;

use super::{create_namespace, enrollment_yaml, ok, service_account_kubeconfig, session_yaml};

const NS: &str = "e2e-roles";
const OTHER_NS: &str = "e2e-roles-other";

/// A role under test: the ClusterRole bound in `NS` and the service account holding it.
struct Role {
    cluster_role: &'static str,
    account: &'static str,
}

const ROLES: &[Role] = &[
    Role {
        cluster_role: "view",
        account: "view",
    },
    Role {
        cluster_role: "edit",
        account: "edit",
    },
    Role {
        cluster_role: "admin",
        account: "admin",
    },
    Role {
        cluster_role: "mcp-access-issuer",
        account: "issuer",
    },
    Role {
        cluster_role: "mcp-access-enrollment-approver",
        account: "approver",
    },
    Role {
        cluster_role: "mcp-access-revoker",
        account: "revoker",
    },
    Role {
        cluster_role: "mcp-access-enroller",
        account: "enroller",
    },
    Role {
        cluster_role: "mcp-access-policy-author",
        account: "policy-author",
    },
];

/// The requests of the matrix. Each works on objects of its own per role (seeded by the
/// cluster admin), so one role's success never changes what the next role meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    GetSession,
    ListSessions,
    WatchSessions,
    CreateSession,
    PatchSession,
    CreateEnrollment,
    CompleteEnrollment,
    CreateRevocation,
    DeleteRevocation,
    BindIssuerRole,
    ListToolPolicies,
    CreateToolPolicy,
}

const VERBS: &[Verb] = &[
    Verb::GetSession,
    Verb::ListSessions,
    Verb::WatchSessions,
    Verb::CreateSession,
    Verb::PatchSession,
    Verb::CreateEnrollment,
    Verb::CompleteEnrollment,
    Verb::CreateRevocation,
    Verb::DeleteRevocation,
    Verb::BindIssuerRole,
    Verb::ListToolPolicies,
    Verb::CreateToolPolicy,
];

/// Whether `account` may perform `verb` in its namespace: the contract of docs/rbac.md.
fn expected(account: &str, verb: Verb) -> bool {
    use Verb::*;
    match verb {
        // Every role reads sessions.
        GetSession | ListSessions | WatchSessions => account != "policy-author",
        CreateSession | PatchSession => account == "issuer",
        CreateEnrollment => matches!(account, "edit" | "admin" | "enroller"),
        CompleteEnrollment => account == "approver",
        CreateRevocation => account == "revoker",
        // Withdrawing a revocation restores access: cluster admins only.
        DeleteRevocation => false,
        BindIssuerRole => account == "admin",
        ListToolPolicies => matches!(account, "view" | "edit" | "admin" | "policy-author"),
        // Relaxing a policy widens access: its own role.
        CreateToolPolicy => account == "policy-author",
    }
}

fn revocation_yaml(name: &str, session: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: {name}\nspec:\n  target: {{session: {session}}}\n  cause: manual\n  message: roles matrix\n"
    )
}

fn rolebinding_yaml(
    name: &str,
    ns: &str,
    cluster_role: &str,
    subject_ns: &str,
    sa: &str,
) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: {name}\n  namespace: {ns}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {cluster_role}\nsubjects:\n- kind: ServiceAccount\n  name: {sa}\n  namespace: {subject_ns}\n"
    )
}

/// Runs `verb` as the holder of `kubeconfig`; objects are suffixed with `who`.
fn perform(c: &LocalCluster, kubeconfig: &Path, who: &str, verb: Verb) -> Output {
    let run = |args: &[&str], stdin: Option<&str>| c.kubectl_as(kubeconfig, args, stdin);
    match verb {
        Verb::GetSession => run(&["get", "acs", "seed", "-n", NS, "-o", "name"], None),
        Verb::ListSessions => run(&["get", "acs", "-n", NS, "-o", "name"], None),
        // A real watch that ends by itself: the server closes it after one second.
        Verb::WatchSessions => run(
            &[
                "get",
                "--raw",
                &format!(
                    "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{NS}/accesssessions?watch=1&timeoutSeconds=1"
                ),
            ],
            None,
        ),
        Verb::CreateSession => run(
            &["create", "-n", NS, "-f", "-"],
            Some(&session_yaml(&format!("new-{who}"), "srv-roles")),
        ),
        Verb::PatchSession => run(
            &[
                "patch",
                "acs",
                "seed",
                "-n",
                NS,
                "--type=merge",
                "-p",
                &format!(r#"{{"metadata":{{"labels":{{"patched-by":"{who}"}}}}}}"#),
            ],
            None,
        ),
        Verb::CreateEnrollment => run(
            &["create", "-n", NS, "-f", "-"],
            Some(&enrollment_yaml(&format!("enr-{who}"))),
        ),
        Verb::CompleteEnrollment => run(
            &[
                "patch",
                "enrollment",
                &format!("pending-{who}"),
                "-n",
                NS,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Completed"}}"#,
            ],
            None,
        ),
        Verb::CreateRevocation => run(
            &["create", "-n", NS, "-f", "-"],
            Some(&revocation_yaml(
                &format!("rvk-{who}"),
                &format!("victim-{who}"),
            )),
        ),
        Verb::DeleteRevocation => run(
            &["delete", "revocation", &format!("standing-{who}"), "-n", NS],
            None,
        ),
        Verb::BindIssuerRole => run(
            &["create", "-f", "-"],
            Some(&rolebinding_yaml(
                &format!("issuer-by-{who}"),
                NS,
                "mcp-access-issuer",
                NS,
                "delegate",
            )),
        ),
        Verb::ListToolPolicies => run(&["get", "toolpolicies", "-n", NS, "-o", "name"], None),
        Verb::CreateToolPolicy => run(
            &["create", "-n", NS, "-f", "-"],
            Some(&format!(
                "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: ToolPolicy\nmetadata:\n  name: tp-{who}\nspec:\n  server: {{name: srv-roles}}\n  tools: [{{name: drop_table, sideEffect: destructive}}]\n"
            )),
        ),
    }
}

/// Seeds, as the cluster admin, what each role's requests act on.
fn seed(c: &LocalCluster, who: &str) -> Result<(), String> {
    let admin = c.kubeconfig.clone();
    let apply = |yaml: String, what: &str| {
        ok(
            &c.kubectl_as(&admin, &["create", "-n", NS, "-f", "-"], Some(&yaml)),
            what,
        )
        .map(|_| ())
    };
    apply(
        enrollment_yaml(&format!("pending-{who}")),
        "seed enrollment",
    )?;
    apply(
        session_yaml(&format!("victim-{who}"), "srv-roles"),
        "seed victim",
    )?;
    apply(
        session_yaml(&format!("withdrawn-{who}"), "srv-roles"),
        "seed withdrawn",
    )?;
    apply(
        revocation_yaml(&format!("standing-{who}"), &format!("withdrawn-{who}")),
        "seed revocation",
    )
}

/// Whether kubectl reported an RBAC refusal of this identity.
fn forbidden(out: &Output, account: &str) -> bool {
    !out.success
        && out.stderr.contains("(Forbidden)")
        && out
            .stderr
            .contains(&format!("system:serviceaccount:{NS}:{account}"))
}

fn phase(c: &LocalCluster, kind: &str, name: &str) -> Result<String, String> {
    let got: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", kind, name, "-n", NS, "-o", "json"]),
        "get",
    )?)
    .map_err(|e| e.to_string())?;
    Ok(got["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The request's effect is visible to the cluster admin, so "allowed" means it happened.
fn check_effect(c: &LocalCluster, who: &str, verb: Verb, allowed: bool) -> Result<(), String> {
    match verb {
        Verb::CompleteEnrollment => {
            let want = if allowed {
                "Active"
            } else {
                "PendingEnrollment"
            };
            let got = phase(c, "acs", &format!("pending-{who}"))?;
            ensure!(got == want, "pending-{who}: phase {got}, want {want}");
        }
        Verb::CreateRevocation => {
            let want = if allowed { "Revoked" } else { "Active" };
            let got = phase(c, "acs", &format!("victim-{who}"))?;
            ensure!(got == want, "victim-{who}: phase {got}, want {want}");
        }
        Verb::DeleteRevocation => {
            let got = phase(c, "acs", &format!("withdrawn-{who}"))?;
            ensure!(
                got == "Revoked",
                "withdrawn-{who}: phase {got}: a refused withdrawal changed it"
            );
        }
        _ => {}
    }
    Ok(())
}

/// Waits until RBAC (kube-apiserver's and MCP Access's cached reviews) sees the new binding.
fn wait_bound(c: &LocalCluster, kubeconfig: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Every role reads sessions or tool policies.
        let out = c.kubectl_as(kubeconfig, &["get", "acs", "seed", "-n", NS], None);
        if out.success
            || c.kubectl_as(kubeconfig, &["get", "tp", "-n", NS], None)
                .success
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "binding never took effect: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn default_roles_matrix(c: &mut LocalCluster) -> Result<(), String> {
    create_namespace(c, NS)?;
    create_namespace(c, OTHER_NS)?;
    ok(
        &c.kubectl_as(
            &c.kubeconfig.clone(),
            &["create", "-n", NS, "-f", "-"],
            Some(&session_yaml("seed", "srv-roles")),
        ),
        "seed session",
    )?;
    // The account an admin delegates the issuer role to.
    let delegate = service_account_kubeconfig(c, NS, "delegate")?;

    let mut accounts: Vec<(&Role, PathBuf)> = Vec::new();
    for role in ROLES {
        let kubeconfig = service_account_kubeconfig(c, NS, role.account)?;
        ok(
            &c.kubectl(&[
                "create",
                "rolebinding",
                role.account,
                "-n",
                NS,
                &format!("--clusterrole={}", role.cluster_role),
                &format!("--serviceaccount={NS}:{}", role.account),
            ]),
            "rolebinding",
        )?;
        seed(c, role.account)?;
        accounts.push((role, kubeconfig));
    }
    for (_, kubeconfig) in &accounts {
        wait_bound(c, kubeconfig)?;
    }

    let mut mismatches = Vec::new();
    let mut table = String::new();
    for (role, kubeconfig) in &accounts {
        for &verb in VERBS {
            let want = expected(role.account, verb);
            let out = perform(c, kubeconfig, role.account, verb);
            let got = if out.success {
                Some(true)
            } else if forbidden(&out, role.account) {
                Some(false)
            } else {
                None
            };
            table.push_str(&format!(
                "{:<32} {:<20} {}\n",
                role.cluster_role,
                format!("{verb:?}"),
                match got {
                    Some(true) => "allowed",
                    Some(false) => "Forbidden",
                    None => "error",
                }
            ));
            if got != Some(want) {
                mismatches.push(format!(
                    "{} {verb:?}: want {}, kubectl said: {}{}",
                    role.cluster_role,
                    if want { "allowed" } else { "Forbidden" },
                    out.stdout.trim(),
                    out.stderr.trim()
                ));
                continue;
            }
            if let Err(e) = check_effect(c, role.account, verb, want) {
                mismatches.push(format!("{} {verb:?}: {e}", role.cluster_role));
            }
        }
    }
    eprintln!("roles matrix:\n{table}");
    ensure!(
        mismatches.is_empty(),
        "the roles do not match docs/rbac.md:\n    {}",
        mismatches.join("\n    ")
    );

    // The controls: each refused verb is one the cluster admin can perform, so the refusals
    // above are RBAC and not a broken request.
    let admin = c.kubeconfig.clone();
    seed(c, "cluster-admin")?;
    for verb in [
        Verb::CreateSession,
        Verb::PatchSession,
        Verb::CompleteEnrollment,
        Verb::CreateRevocation,
        Verb::DeleteRevocation,
    ] {
        let out = perform(c, &admin, "cluster-admin", verb);
        ensure!(out.success, "cluster admin {verb:?}: {out:?}");
    }
    ensure!(
        phase(c, "acs", "withdrawn-cluster-admin")? == "Active",
        "the cluster admin's withdrawal did not restore the session"
    );

    // What the admin's bind permission is for: the delegate now issues sessions...
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = perform(c, &delegate, "delegate", Verb::CreateSession);
        if out.success {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the delegate bound by the namespace admin cannot issue: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // ...but only in the admin's namespace, and the admin cannot bind roles beyond its own.
    let admin_sa = &accounts
        .iter()
        .find(|(r, _)| r.account == "admin")
        .ok_or("no admin account")?
        .1;
    let elsewhere = c.kubectl_as(
        admin_sa,
        &["create", "-f", "-"],
        Some(&rolebinding_yaml(
            "issuer-elsewhere",
            OTHER_NS,
            "mcp-access-issuer",
            NS,
            "delegate",
        )),
    );
    ensure!(
        forbidden(&elsewhere, "admin"),
        "admin bound the issuer role in another namespace: {elsewhere:?}"
    );
    let escalate = c.kubectl_as(
        admin_sa,
        &["create", "-f", "-"],
        Some(&rolebinding_yaml(
            "cluster-admin-by-admin",
            NS,
            "cluster-admin",
            NS,
            "delegate",
        )),
    );
    ensure!(
        forbidden(&escalate, "admin"),
        "admin bound cluster-admin: {escalate:?}"
    );
    Ok(())
}
