//! The kubectl plugin (`kubectl-access`, MCP_ACCESS_KUBECTL_ACCESS_BIN) against the local
//! cluster, through kube-apiserver with RBAC: the built binary run directly with
//! `--kubeconfig`, and the same binary found on PATH by the real `kubectl` as
//! `kubectl access ...` with `$KUBECONFIG` and the context's namespace. Each scenario asserts
//! on what the user sees (stdout, stderr, exit code) and on the cluster state after it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use e2e::LocalCluster;
use serde_json::{json, Value};

use super::{create_namespace, enrollment_yaml, ok, service_account_kubeconfig};

const NS_WHO: &str = "e2e-kx-who";
const NS_WHO_OTHER: &str = "e2e-kx-who-other";
const NS_REVOKE: &str = "e2e-kx-revoke";
const NS_RETIRE: &str = "e2e-kx-retire";
const NS_ENROLL: &str = "e2e-kx-enroll";
const NS_STATUS: &str = "e2e-kx-status";
const NS_TOKEN: &str = "e2e-kx-token";

/// What a command showed the user.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn plugin_bin() -> Result<PathBuf, String> {
    std::env::var("MCP_ACCESS_KUBECTL_ACCESS_BIN")
        .map(PathBuf::from)
        .map_err(|_| "MCP_ACCESS_KUBECTL_ACCESS_BIN is not set: run through hack/test.sh".into())
}

fn run(mut cmd: Command, stdin: Option<&str>) -> Result<Run, String> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `kubectl-access --kubeconfig KUBECONFIG ARGS...`, the built binary itself.
fn access(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<Run, String> {
    let mut cmd = Command::new(plugin_bin()?);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG");
    run(cmd, stdin)
}

/// `kubectl access ARGS...` with `$KUBECONFIG` set, the plugin's directory first on PATH.
fn kubectl_access(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<Run, String> {
    let bin = plugin_bin()?;
    let dir = bin.parent().ok_or("plugin binary has no directory")?;
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("kubectl");
    cmd.arg("access")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path);
    run(cmd, stdin)
}

fn succeeded(r: &Run, what: &str) -> Result<(), String> {
    if r.code == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

/// Retries while MCP Access's authorization cache (seconds, by design) has not seen a new
/// binding yet.
fn until_allowed(mut attempt: impl FnMut() -> Result<Run, String>) -> Result<Run, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = attempt()?;
        if r.code == 0 || !r.stderr.contains("Forbidden") || Instant::now() > deadline {
            return Ok(r);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn apply(c: &LocalCluster, ns: &str, yaml: &str) -> Result<String, String> {
    ok(
        &c.kubectl_as(&c.kubeconfig, &["apply", "-n", ns, "-f", "-"], Some(yaml)),
        "apply",
    )
}

fn get_json(c: &LocalCluster, ns: &str, what: &[&str]) -> Result<Value, String> {
    let mut args = vec!["get", "-n", ns];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&ok(&c.kubectl(&args), "get")?).map_err(|e| e.to_string())
}

fn phase(c: &LocalCluster, ns: &str, session: &str) -> Result<String, String> {
    Ok(get_json(c, ns, &["acs", session])?["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// An RFC 3339 time `secs` from now (UTC, whole seconds).
fn in_seconds(secs: u64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("+{secs} seconds"),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    out
}

struct Session<'a> {
    name: &'a str,
    server: &'a str,
    uid: &'a str,
    subject: Option<&'a str>,
    agent: Option<&'a str>,
    expires: &'a str,
}

impl Session<'_> {
    fn yaml(&self) -> String {
        let mut spec = format!(
            "  server: {{name: {}, uid: {}}}\n  teams: [payments]\n  expiresAt: \"{}\"\n",
            self.server, self.uid, self.expires
        );
        if let Some(user) = self.subject {
            spec.push_str(&format!("  subject: {{user: \"{user}\"}}\n"));
        }
        if let Some(agent) = self.agent {
            spec.push_str(&format!("  agent: {{name: {agent}}}\n"));
        }
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {}\nspec:\n{spec}",
            self.name
        )
    }
}

fn session<'a>(
    name: &'a str,
    server: &'a str,
    uid: &'a str,
    subject: Option<&'a str>,
) -> Session<'a> {
    Session {
        name,
        server,
        uid,
        subject,
        agent: None,
        expires: "2099-01-01T00:00:00Z",
    }
}

fn revocation_yaml(name: &str, session: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {{name: {name}}}\nspec: {{target: {{session: {session}}}, cause: manual}}\n"
    )
}

fn mcpserver_yaml(name: &str) -> String {
    format!(
        "apiVersion: mcp-runtime.dev/v1alpha1\nkind: MCPServer\nmetadata: {{name: {name}}}\nspec: {{image: ghcr.io/example/mcp:1, port: 8080}}\n"
    )
}

fn mcpserver_uid(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    Ok(get_json(c, ns, &["mcpserver", name])?["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// A service account of `ns` bound there to `cluster_role`; its kubeconfig's context names `ns`.
fn bound_account(
    c: &LocalCluster,
    ns: &str,
    account: &str,
    cluster_role: &str,
) -> Result<PathBuf, String> {
    let kubeconfig = service_account_kubeconfig(c, ns, account)?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            account,
            "-n",
            ns,
            &format!("--clusterrole={cluster_role}"),
            &format!("--serviceaccount={ns}:{account}"),
        ]),
        "rolebinding",
    )?;
    Ok(kubeconfig)
}

/// The first column of a table's rows (the header dropped).
fn first_column(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

pub fn who_can_lists_the_sessions_that_grant_now(c: &mut LocalCluster) -> Result<(), String> {
    create_namespace(c, NS_WHO)?;
    create_namespace(c, NS_WHO_OTHER)?;
    apply(
        c,
        NS_WHO,
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Agent\nmetadata: {name: e2e-kx-bot}\nspec: {teams: [payments]}\n",
    )?;
    // Expires a few seconds after its creation (the time is taken right before it).
    let soon = in_seconds(4);
    apply(
        c,
        NS_WHO,
        &Session {
            expires: &soon,
            ..session("soon", "github", "srv-kx-gh", Some("carol@example.com"))
        }
        .yaml(),
    )?;
    let sessions = [
        Session {
            agent: Some("e2e-kx-bot"),
            ..session("alice", "github", "srv-kx-gh", Some("alice@example.com"))
        },
        session("team", "github", "srv-kx-gh", None),
        session("revoked", "github", "srv-kx-gh", Some("bob@example.com")),
        session(
            "elsewhere",
            "gitlab",
            "srv-kx-gl",
            Some("alice@example.com"),
        ),
    ];
    for s in &sessions {
        apply(c, NS_WHO, &s.yaml())?;
    }
    apply(
        c,
        NS_WHO_OTHER,
        &session("other-ns", "github", "srv-kx-gh", Some("dave@example.com")).yaml(),
    )?;
    apply(c, NS_WHO, &revocation_yaml("pull-revoked", "revoked"))?;
    apply(
        c,
        NS_WHO,
        &enrollment_yaml("pending").replace("uid: srv-enr", "uid: srv-kx-gh"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while phase(c, NS_WHO, "soon")? != "Expired" {
        if Instant::now() > deadline {
            return Err("session soon did not expire".into());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    ensure!(
        phase(c, NS_WHO, "pending")? == "PendingEnrollment",
        "pending is not pending"
    );

    let admin = c.kubeconfig.clone();
    let out = access(&admin, &["who-can", "github", "-n", NS_WHO], None)?;
    succeeded(&out, "who-can")?;
    let header = out.stdout.lines().next().unwrap_or_default();
    ensure!(
        header.split_whitespace().collect::<Vec<_>>()
            == ["NAME", "SUBJECT", "AGENT", "TEAMS", "EXPIRES", "EXPIRES", "IN"],
        "header: {}",
        out.stdout
    );
    ensure!(
        first_column(&out.stdout) == ["alice", "team"],
        "only the active, unexpired, unrevoked github sessions: {}",
        out.stdout
    );
    // The expiry shown is the server's (clamped to the server-wide maximum lifetime).
    let expires = get_json(c, NS_WHO, &["acs", "alice"])?["spec"]["expiresAt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let alice = out.stdout.lines().nth(1).unwrap_or_default();
    let cells: Vec<&str> = alice.split_whitespace().collect();
    ensure!(
        cells[..5]
            == [
                "alice",
                "alice@example.com",
                "e2e-kx-bot",
                "payments",
                expires.as_str()
            ]
            && (cells[5].ends_with('h') || cells[5].ends_with('m')),
        "alice's row: {alice:?} (expiresAt {expires})"
    );
    let team = out.stdout.lines().nth(2).unwrap_or_default();
    ensure!(
        team.split_whitespace().take(4).collect::<Vec<_>>()
            == ["team", "<none>", "<none>", "payments"],
        "team's row: {team:?}"
    );

    let all = access(&admin, &["who-can", "github", "-A"], None)?;
    succeeded(&all, "who-can -A")?;
    ensure!(
        all.stdout.starts_with("NAMESPACE ")
            && all
                .stdout
                .lines()
                .any(|l| l.starts_with(NS_WHO_OTHER) && l.contains("other-ns"))
            && all
                .stdout
                .lines()
                .any(|l| l.starts_with(&format!("{NS_WHO} ")) && l.contains("alice")),
        "-A: {}",
        all.stdout
    );
    ensure!(
        !all.stdout.contains("revoked") && !all.stdout.contains("soon"),
        "{}",
        all.stdout
    );

    let json = access(
        &admin,
        &["who-can", "github", "-n", NS_WHO, "-o", "json"],
        None,
    )?;
    succeeded(&json, "who-can -o json")?;
    let list: Value =
        serde_json::from_str(&json.stdout).map_err(|e| format!("{e}: {}", json.stdout))?;
    let names: Vec<&str> = list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        list["kind"] == "List"
            && names == ["alice", "team"]
            && list["items"][0]["kind"] == "AccessSession"
            && list["items"][0]["spec"]["agent"]["name"] == "e2e-kx-bot",
        "-o json: {}",
        json.stdout
    );
    let yaml = access(
        &admin,
        &["who-can", "github", "-n", NS_WHO, "-o", "yaml"],
        None,
    )?;
    ensure!(
        yaml.code == 0 && yaml.stdout.contains("kind: List") && yaml.stdout.contains("name: alice"),
        "-o yaml: {yaml:?}"
    );
    let wide = access(
        &admin,
        &["who-can", "github", "-n", NS_WHO, "-o", "wide"],
        None,
    )?;
    ensure!(
        wide.code == 0
            && wide
                .stdout
                .lines()
                .next()
                .unwrap_or_default()
                .contains("SERVER UID")
            && wide
                .stdout
                .lines()
                .nth(1)
                .unwrap_or_default()
                .contains("srv-kx-gh"),
        "-o wide: {wide:?}"
    );
    // Per tool: alice is narrowed to search; the team session grants every tool.
    let narrowed = c.kubectl(&[
        "patch",
        "acs",
        "alice",
        "-n",
        NS_WHO,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"tools":["search"]}}"#,
    ]);
    ensure!(
        narrowed.success,
        "narrowing alice's tools: {}",
        narrowed.stderr
    );
    let names = |out: &str| -> Vec<String> {
        out.lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let search = access(
        &admin,
        &["who-can", "github", "-n", NS_WHO, "--tool", "search"],
        None,
    )?;
    ensure!(
        search.code == 0 && names(&search.stdout) == ["alice", "team"],
        "who-can --tool search: {search:?}"
    );
    let delete = access(
        &admin,
        &["who-can", "github", "-n", NS_WHO, "--tool", "delete_repo"],
        None,
    )?;
    ensure!(
        delete.code == 0 && names(&delete.stdout) == ["team"],
        "who-can --tool delete_repo: {delete:?}"
    );
    let none = access(&admin, &["who-can", "nothing", "-n", NS_WHO], None)?;
    ensure!(
        none.code == 0
            && none.stdout.is_empty()
            && none.stderr.trim()
                == format!("No sessions grant access to nothing in namespace {NS_WHO}."),
        "no sessions: {none:?}"
    );

    // Through kubectl: the plugin on PATH, $KUBECONFIG, the context's namespace, a viewer.
    let viewer = bound_account(c, NS_WHO, "viewer", "view")?;
    let through = until_allowed(|| kubectl_access(&viewer, &["who-can", "github"], None))?;
    succeeded(&through, "kubectl access who-can")?;
    ensure!(
        through.stdout.lines().next() == out.stdout.lines().next()
            && first_column(&through.stdout) == ["alice", "team"],
        "kubectl access who-can as the viewer: {through:?}"
    );

    // --context picks another context of the kubeconfig, with its namespace.
    let two = c.dir.join("kubeconfig-kx-contexts");
    std::fs::copy(&admin, &two).map_err(|e| e.to_string())?;
    let two_arg = two.display().to_string();
    let current = |field: &str| {
        ok(
            &c.kubectl(&[
                "--kubeconfig",
                &two_arg,
                "config",
                "view",
                "--minify",
                "-o",
                &format!("jsonpath={{.contexts[0].context.{field}}}"),
            ]),
            "config view",
        )
    };
    let (cluster, user) = (current("cluster")?, current("user")?);
    ok(
        &c.kubectl(&[
            "--kubeconfig",
            &two_arg,
            "config",
            "set-context",
            "kx-who",
            &format!("--cluster={cluster}"),
            &format!("--user={user}"),
            &format!("--namespace={NS_WHO_OTHER}"),
        ]),
        "set-context",
    )?;
    let other = access(&two, &["who-can", "github", "--context", "kx-who"], None)?;
    ensure!(
        other.code == 0 && first_column(&other.stdout) == ["other-ns"],
        "--context kx-who: {other:?}"
    );
    let missing = access(&two, &["who-can", "github", "--context", "nope"], None)?;
    ensure!(
        missing.code == 1 && missing.stdout.is_empty() && missing.stderr.starts_with("error: "),
        "--context nope: {missing:?}"
    );
    Ok(())
}

pub fn revoke_waits_and_prints_what_was_revoked(c: &mut LocalCluster) -> Result<(), String> {
    let ns = NS_REVOKE;
    create_namespace(c, ns)?;
    apply(c, ns, &mcpserver_yaml("github"))?;
    let uid = mcpserver_uid(c, ns, "github")?;
    for s in [
        session("s1", "github", "srv-kx-other", Some("alice@example.com")),
        session("s2", "github", "srv-kx-other", Some("alice@example.com")),
        session("m1", "github", "srv-kx-other", Some("mallory@example.com")),
        session("m2", "gitlab", "srv-kx-other2", Some("mallory@example.com")),
        session("g1", "github", &uid, None),
        session("g2", "github", &uid, Some("erin@example.com")),
    ] {
        apply(c, ns, &s.yaml())?;
    }
    let viewer = bound_account(c, ns, "viewer", "view")?;
    let revoker = bound_account(c, ns, "revoker", "mcp-access-revoker")?;

    // Without the revoker role: kubectl's usual Forbidden, exit 1, nothing revoked. The
    // message is the one `kubectl create` prints for the same request.
    let denied = access(&viewer, &["revoke", "s1", "--cause", "compromised"], None)?;
    let kubectl = c.kubectl_as(
        &viewer,
        &["create", "-f", "-"],
        Some(&revocation_yaml("by-viewer", "s1")),
    );
    let kubectl_message = kubectl
        .stderr
        .trim()
        .replace("error when creating \"STDIN\": ", "");
    ensure!(
        denied.code == 1
            && denied.stdout.is_empty()
            && denied.stderr.trim() == kubectl_message
            && denied.stderr.starts_with(
                "Error from server (Forbidden): revocations.access.mcp-runtime.dev is forbidden: User \"system:serviceaccount:e2e-kx-revoke:viewer\" cannot create resource \"revocations\" in API group \"access.mcp-runtime.dev\" in the namespace \"e2e-kx-revoke\""
            ),
        "viewer's revoke: {denied:?}; kubectl said {kubectl:?}"
    );
    // kubectl runs the plugin and hands back its message and exit code.
    let through = kubectl_access(&viewer, &["revoke", "s1", "--cause", "compromised"], None)?;
    ensure!(
        through.code == 1 && through.stderr == denied.stderr,
        "kubectl access revoke as the viewer: {through:?}"
    );
    ensure!(phase(c, ns, "s1")? == "Active", "the viewer revoked s1");

    // One session, with a message.
    let one = until_allowed(|| {
        access(
            &revoker,
            &[
                "revoke",
                "s1",
                "--cause",
                "compromised",
                "--message",
                "laptop stolen",
            ],
            None,
        )
    })?;
    succeeded(&one, "revoke s1")?;
    let first = one.stdout.lines().next().unwrap_or_default();
    let name = first
        .strip_prefix("revocation.access.mcp-runtime.dev/")
        .and_then(|rest| rest.strip_suffix(" created"))
        .ok_or_else(|| format!("first line: {}", one.stdout))?
        .to_string();
    ensure!(name.starts_with("session-s1-"), "generated name {name}");
    // No gateway of s1's server is connected: the receipts say so instead of waiting.
    ensure!(
        one.stdout.contains(
            "delivered to no gateway watch: no gateway of the affected servers is connected"
        ),
        "revoke s1 receipts: {}",
        one.stdout
    );
    ensure!(
        one.stdout.contains(&format!(
            "in namespace {ns}: 1 session(s) covered (cause compromised)"
        )) && one
            .stdout
            .lines()
            .any(|l| l.starts_with(&format!("{ns}   s1 ")) && l.contains("alice@example.com")),
        "revoke s1 output: {}",
        one.stdout
    );
    let rvk = get_json(c, ns, &["revocation", &name])?;
    ensure!(
        rvk["spec"]["message"] == "laptop stolen"
            && rvk["spec"]["target"]["session"] == "s1"
            && rvk["status"]["completedAt"].is_string(),
        "{rvk}"
    );
    let s1 = get_json(c, ns, &["acs", "s1"])?;
    ensure!(
        s1["status"]["phase"] == "Revoked" && s1["status"]["revocation"]["cause"] == "compromised",
        "{s1}"
    );
    ensure!(phase(c, ns, "s2")? == "Active", "s2 must stay active");

    // Every session of a subject, with a chosen name; through kubectl with $KUBECONFIG.
    let subject = kubectl_access(
        &revoker,
        &[
            "revoke",
            "--subject",
            "mallory@example.com",
            "--cause",
            "compromised",
            "--name",
            "mallory-out",
        ],
        None,
    )?;
    succeeded(&subject, "kubectl access revoke --subject")?;
    ensure!(
        subject
            .stdout
            .starts_with("revocation.access.mcp-runtime.dev/mallory-out created\n")
            && subject.stdout.contains("2 session(s) covered")
            && subject.stdout.contains(&format!("{ns}   m1 "))
            && subject.stdout.contains(&format!("{ns}   m2 ")),
        "revoke --subject: {subject:?}"
    );
    ensure!(
        phase(c, ns, "m1")? == "Revoked" && phase(c, ns, "m2")? == "Revoked",
        "mallory's sessions must be revoked"
    );

    // Every session of the live server generation (the admin may read MCPServers), as JSON.
    let server = access(
        &c.kubeconfig,
        &["revoke", "--server", "github", "-n", ns, "-o", "json"],
        None,
    )?;
    succeeded(&server, "revoke --server")?;
    let applied: Value =
        serde_json::from_str(&server.stdout).map_err(|e| format!("{e}: {}", server.stdout))?;
    ensure!(
        applied["kind"] == "Revocation"
            && applied["spec"]["target"]["server"]["uid"] == uid.as_str()
            && applied["status"]["revokedSessions"] == 2
            && applied["status"]["completedAt"].is_string(),
        "revoke --server -o json: {}",
        server.stdout
    );
    ensure!(
        phase(c, ns, "g1")? == "Revoked"
            && phase(c, ns, "g2")? == "Revoked"
            && phase(c, ns, "s2")? == "Active",
        "only the live generation's sessions are revoked"
    );
    // The revoker may not read MCPServers: naming the uid is the way.
    let no_read = access(&revoker, &["revoke", "--server", "github"], None)?;
    ensure!(
        no_read.code == 1
            && no_read.stderr.starts_with(
                "Error from server (Forbidden): mcpservers.mcp-runtime.dev \"github\" is forbidden"
            ),
        "{no_read:?}"
    );
    let by_uid = access(
        &revoker,
        &[
            "revoke",
            "--server",
            "github",
            "--server-uid",
            "srv-kx-other",
        ],
        None,
    )?;
    succeeded(&by_uid, "revoke --server-uid")?;
    ensure!(
        // m1 is of that uid too: already revoked by mallory-out, covered all the same.
        by_uid.stdout.contains("3 session(s) covered")
            && by_uid.stdout.contains(&format!("{ns}   m1 "))
            && by_uid.stdout.contains(&format!("{ns}   s1 "))
            && by_uid.stdout.contains(&format!("{ns}   s2 ")),
        "{by_uid:?}"
    );
    Ok(())
}

pub fn retire_asks_before_fencing(c: &mut LocalCluster) -> Result<(), String> {
    let ns = NS_RETIRE;
    create_namespace(c, ns)?;
    apply(c, ns, &mcpserver_yaml("weather"))?;
    let uid = mcpserver_uid(c, ns, "weather")?;
    for name in ["w1", "w2"] {
        apply(
            c,
            ns,
            &session(name, "weather", &uid, Some("alice@example.com")).yaml(),
        )?;
    }
    let revocations = |c: &LocalCluster| {
        ok(
            &c.kubectl(&["get", "revocations", "-n", ns, "-o", "name"]),
            "list revocations",
        )
    };
    for answer in [Some("n\n"), Some("\n"), None] {
        let out = access(&c.kubeconfig, &["retire", "weather", "-n", ns], answer)?;
        ensure!(
            out.code == 0
                && out.stdout.is_empty()
                && out.stderr.contains(&format!(
                    "You are about to retire MCPServer {ns}/weather (uid {uid})"
                ))
                && out.stderr.contains("Do you want to continue? (y/n): ")
                && out.stderr.contains("retire cancelled: nothing was changed"),
            "answer {answer:?}: {out:?}"
        );
        ensure!(
            revocations(c)?.trim().is_empty(),
            "a revocation was created after {answer:?}"
        );
        ensure!(
            phase(c, ns, "w1")? == "Active",
            "w1 changed after {answer:?}"
        );
    }

    // Through kubectl, answering y on stdin.
    let admin = c.kubeconfig.clone();
    let namespaced = c.dir.join("kubeconfig-kx-retire");
    let text = std::fs::read_to_string(&admin).map_err(|e| e.to_string())?;
    std::fs::write(&namespaced, text).map_err(|e| e.to_string())?;
    ok(
        &c.kubectl(&[
            "--kubeconfig",
            &namespaced.display().to_string(),
            "config",
            "set-context",
            "--current",
            &format!("--namespace={ns}"),
        ]),
        "set the context's namespace",
    )?;
    let out = kubectl_access(&namespaced, &["retire", "weather"], Some("y\n"))?;
    succeeded(&out, "kubectl access retire")?;
    ensure!(
        out.stdout.contains("created\n")
            && out
                .stdout
                .contains("2 session(s) covered (cause server_retired)")
            && out.stdout.contains(&format!("server uid {uid} is fenced"))
            && out.stdout.contains(" w1 ")
            && out.stdout.contains(" w2 "),
        "retire: {out:?}"
    );
    let fence = revocations(c)?;
    let fence_name = fence
        .trim()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    ensure!(fence_name.starts_with("retire-weather-"), "fence {fence:?}");
    let fence = get_json(c, ns, &["revocation", &fence_name])?;
    ensure!(
        fence["spec"]["cause"] == "server_retired"
            && fence["spec"]["target"]["server"]
                == serde_json::json!({"name": "weather", "uid": uid}),
        "{fence}"
    );
    ensure!(
        phase(c, ns, "w1")? == "Revoked" && phase(c, ns, "w2")? == "Revoked",
        "the fence must revoke the server's sessions"
    );
    let issued = c.kubectl_as(
        &c.kubeconfig,
        &["create", "-n", ns, "-f", "-"],
        Some(&session("w3", "weather", &uid, None).yaml()),
    );
    ensure!(
        !issued.success && issued.stderr.contains("Conflict"),
        "issuing for a fenced uid must be 409: {issued:?}"
    );
    // --yes does not ask.
    let again = access(
        &admin,
        &[
            "retire",
            "weather",
            "-n",
            ns,
            "--yes",
            "--name",
            "weather-again",
        ],
        None,
    )?;
    ensure!(
        again.code == 0
            && !again.stderr.contains("continue?")
            && again
                .stdout
                .starts_with("revocation.access.mcp-runtime.dev/weather-again created\n"),
        "{again:?}"
    );
    Ok(())
}

pub fn enroll_complete_and_withdraw(c: &mut LocalCluster) -> Result<(), String> {
    let ns = NS_ENROLL;
    create_namespace(c, ns)?;
    let enroller = bound_account(c, ns, "enroller", "mcp-access-enroller")?;
    let approver = bound_account(c, ns, "approver", "mcp-access-enrollment-approver")?;
    for name in ["e1", "e2"] {
        super::eventually(
            c,
            &enroller,
            &["create", "-f", "-"],
            Some(&enrollment_yaml(name)),
        )?;
    }
    ensure!(
        phase(c, ns, "e1")? == "PendingEnrollment",
        "e1 is not pending"
    );

    // The enroller may not complete: kubectl's Forbidden, nothing changes.
    let denied = access(&enroller, &["enroll", "complete", "e1"], None)?;
    ensure!(
        denied.code == 1
            && denied.stderr.starts_with("Error from server (Forbidden): ")
            && denied.stderr.contains("enrollments/status"),
        "{denied:?}"
    );
    ensure!(phase(c, ns, "e1")? == "PendingEnrollment", "e1 changed");

    let done = until_allowed(|| access(&approver, &["enroll", "complete", "e1"], None))?;
    ensure!(
        done.code == 0
            && done.stdout
                == "enrollment.access.mcp-runtime.dev/e1 completed (session e1 is Active)\n",
        "{done:?}"
    );
    ensure!(phase(c, ns, "e1")? == "Active", "e1 not active");
    let e1 = get_json(c, ns, &["enrollment", "e1"])?;
    ensure!(e1["status"]["phase"] == "Completed", "{e1}");
    let again = kubectl_access(&approver, &["enroll", "complete", "e1"], None)?;
    ensure!(
        again.code == 0
            && again.stdout == "enrollment.access.mcp-runtime.dev/e1 already completed\n",
        "{again:?}"
    );

    let withdrawn = kubectl_access(&enroller, &["enroll", "withdraw", "e2"], None)?;
    ensure!(
        withdrawn.code == 0
            && withdrawn.stdout
                == "enrollment.access.mcp-runtime.dev/e2 withdrawn (pending session e2 deleted)\n",
        "{withdrawn:?}"
    );
    let gone = c.kubectl(&["get", "acs", "e2", "-n", ns]);
    ensure!(
        !gone.success && gone.stderr.contains("NotFound"),
        "{gone:?}"
    );
    let completed = access(&enroller, &["enroll", "withdraw", "e1"], None)?;
    ensure!(
        completed.code == 1
            && completed
                .stderr
                .starts_with("error: enrollment e1 is already completed"),
        "{completed:?}"
    );
    ensure!(
        phase(c, ns, "e1")? == "Active",
        "withdrawing a completed enrollment touched e1"
    );
    let missing = access(&approver, &["enroll", "complete", "missing"], None)?;
    ensure!(
        missing.code == 1
            && missing.stderr.trim()
                == "Error from server (NotFound): enrollments.access.mcp-runtime.dev \"missing\" not found",
        "{missing:?}"
    );
    Ok(())
}

/// The head resourceVersion of a list of sessions, decoded as `(epoch, seq)`.
fn head(c: &LocalCluster) -> Result<(u64, u64), String> {
    // kubectl's own List wrapper carries no resourceVersion: read the server's.
    let list = ok(
        &c.kubectl(&[
            "get",
            "--raw",
            "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions?limit=1",
        ]),
        "list sessions",
    )?;
    let list: Value = serde_json::from_str(&list).map_err(|e| format!("{e}: {list}"))?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let v: u64 = rv.parse().map_err(|e| format!("{rv:?}: {e}"))?;
    Ok((v >> 40, v & ((1 << 40) - 1)))
}

/// Whether kube-apiserver serves an Exact list of sessions at `rv` (else 410 Expired).
fn served_at(c: &LocalCluster, rv: u64) -> Result<bool, String> {
    let path = format!(
        "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions?limit=1&resourceVersionMatch=Exact&resourceVersion={rv}"
    );
    let out = c.kubectl(&["get", "--raw", &path]);
    if out.success {
        return Ok(true);
    }
    ensure!(
        out.stderr.contains("Expired") || out.stderr.contains("410"),
        "list at {rv}: {out:?}"
    );
    Ok(false)
}

fn status_json(c: &LocalCluster, args: &[&str]) -> Result<Value, String> {
    let mut all = vec!["status", "-o", "json"];
    all.extend_from_slice(args);
    let out = access(&c.kubeconfig, &all, None)?;
    succeeded(&out, "status -o json")?;
    serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))
}

pub fn status_reports_every_part(c: &mut LocalCluster) -> Result<(), String> {
    let ns = NS_STATUS;
    create_namespace(c, ns)?;
    // Before the controllers ever ran: no Lease.
    let before = access(
        &c.kubeconfig,
        &["status", "--controllers-lease", "e2e-kx-none"],
        None,
    )?;
    succeeded(&before, "status")?;
    ensure!(
        before.stdout.lines().any(|l| l.starts_with("controllers ")
            && l.contains("False")
            && l.contains("Lease mcp-access/e2e-kx-none: not found")),
        "{}",
        before.stdout
    );

    let bin = std::env::var("MCP_ACCESS_CONTROLLERS_BIN")
        .map_err(|_| "MCP_ACCESS_CONTROLLERS_BIN is not set: run through hack/test.sh")?;
    let _controllers = c
        .start_controllers(Path::new(&bin), "e2e-kx-leader", &[])
        .map_err(|e| format!("{e:#}"))?;
    apply(c, ns, &mcpserver_yaml("st-server"))?;
    for s in [
        session("a1", "st-server", "srv-kx-st", Some("alice@example.com")),
        session("a2", "st-server", "srv-kx-st", None),
        session("r1", "st-server", "srv-kx-st", Some("bob@example.com")),
    ] {
        apply(c, ns, &s.yaml())?;
    }
    apply(c, ns, &revocation_yaml("pull-r1", "r1"))?;
    apply(c, ns, &enrollment_yaml("p1"))?;
    // The controllers write the MCPServer's conditions.
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_json(c, ns, &["mcpserver", "st-server"])?["status"]["conditions"]
        .as_array()
        .is_none_or(|cs| cs.is_empty())
    {
        ensure!(
            Instant::now() < deadline,
            "the controllers wrote no conditions"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let server = get_json(c, ns, &["mcpserver", "st-server"])?;
    let ready = server["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|x| x["type"] == "Ready"))
        .and_then(|x| x["status"].as_str())
        .unwrap_or("Unknown")
        .to_string();

    let (epoch_before, seq_before) = head(c)?;
    let out = access(&c.kubeconfig, &["status"], None)?;
    let (_, seq_after) = head(c)?;
    succeeded(&out, "status")?;
    eprintln!("kubectl-access status:\n{}", out.stdout);
    let text = &out.stdout;
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_default()
            .to_string()
    };
    let apiservice = line("v1alpha1.access.mcp-runtime.dev ");
    ensure!(
        apiservice.split_whitespace().nth(2) == Some("True")
            && apiservice.contains("mcp-access/mcp-access-apiserver:"),
        "APIService row: {text}"
    );
    let apiserver = line("apiserver ");
    ensure!(
        apiserver.split_whitespace().nth(1) == Some("True")
            && apiserver.contains("is ExternalName localhost:"),
        "apiserver row: {text}"
    );
    let controllers = line("controllers ");
    ensure!(
        controllers.split_whitespace().nth(1) == Some("True")
            && controllers.contains(
                "Lease mcp-access/mcp-access-controllers: held by e2e-kx-leader, renewed"
            )
            && controllers.contains("no Deployment mcp-access/mcp-access-controllers"),
        "controllers row: {text}"
    );
    ensure!(
        text.contains("SESSIONS BY PHASE (all namespaces)"),
        "{text}"
    );
    let sessions = line(&format!("{ns} "));
    ensure!(
        sessions.split_whitespace().collect::<Vec<_>>() == [ns, "2", "1", "1", "0", "4"],
        "sessions row: {sessions:?} in {text}"
    );
    let ready_row = line("Ready ");
    ensure!(
        text.contains("MCPSERVERS BY CONDITION (")
            && ready_row.split_whitespace().count() == 5
            && text.contains("\nCHANGE FEED\nEPOCH "),
        "{text}"
    );

    let scoped = status_json(c, &["-n", ns])?;
    let counts = &scoped["mcpServers"];
    let ready_count = counts["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|x| x["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    ensure!(
        scoped["namespace"] == ns
            && scoped["sessions"]
                == serde_json::json!([{"namespace": ns, "active": 2, "pendingEnrollment": 1, "revoked": 1, "expired": 0}])
            && counts["total"] == 1
            && ready_count[match ready.as_str() {
                "True" => "true",
                "False" => "false",
                _ => "unknown",
            }] == 1,
        "status -n: {scoped}"
    );
    let feed = &scoped["changeFeed"];
    let head_seq = feed["headSeq"].as_u64().unwrap_or_default();
    ensure!(
        feed["epoch"].as_u64() == Some(epoch_before)
            && head_seq >= seq_before
            && head_seq <= seq_after,
        "head {feed} between {seq_before} and {seq_after}"
    );

    // A namespace viewer sees what it may read; the rest says why not, and nothing fails.
    let viewer = bound_account(c, ns, "viewer", "view")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let partial = loop {
        let r = kubectl_access(&viewer, &["status", "-n", ns], None)?;
        if r.code == 0 && r.stdout.contains(&format!("\n{ns}   2 ")) {
            break r;
        }
        ensure!(Instant::now() < deadline, "status as a viewer: {r:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let viewer_user = format!("User \"system:serviceaccount:{ns}:viewer\"");
    ensure!(
        partial.stdout.contains(&format!(
            "APISERVICE\nError from server (Forbidden): apiservices.apiregistration.k8s.io \"v1alpha1.access.mcp-runtime.dev\" is forbidden: {viewer_user} cannot get resource \"apiservices\""
        )) && partial
            .stdout
            .lines()
            .any(|l| l.starts_with("controllers ") && l.contains("Error from server (Forbidden): leases.coordination.k8s.io"))
            && partial.stdout.contains(&format!("SESSIONS BY PHASE (namespace {ns})")),
        "status as a viewer: {}",
        partial.stdout
    );

    // A short log: restart MCP Access keeping 20 events, write more than that, and wait for
    // the trimmer. The oldest served position is then exactly where lists start to be 410.
    c.start_apiserver_with(&["--retained-events=20"])
        .map_err(|e| format!("{e:#}"))?;
    c.wait_available(Duration::from_secs(90))
        .map_err(|e| format!("{e:#}"))?;
    let mut many = String::new();
    for i in 0..30 {
        many.push_str(&session(&format!("bulk-{i}"), "st-server", "srv-kx-st", None).yaml());
        many.push_str("---\n");
    }
    super::eventually(
        c,
        &c.kubeconfig.clone(),
        &["apply", "-n", ns, "-f", "-"],
        Some(&many),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let feed = loop {
        let report = status_json(c, &[])?;
        let feed = report["changeFeed"].clone();
        if feed["retainedEvents"].as_u64().is_some_and(|n| n <= 20) {
            break feed;
        }
        ensure!(
            Instant::now() < deadline,
            "the log was not trimmed to 20 events: {feed}"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let oldest = feed["oldestServedSeq"].as_u64().unwrap_or_default();
    let epoch = feed["epoch"].as_u64().unwrap_or_default();
    ensure!(
        oldest > 0 && feed["retainedEvents"] == 20,
        "trimmed feed: {feed}"
    );
    ensure!(
        served_at(c, (epoch << 40) | oldest)? && !served_at(c, (epoch << 40) | (oldest - 1))?,
        "kube-apiserver must serve the list at the oldest position and refuse one before it: {feed}"
    );
    let text = access(&c.kubeconfig, &["status"], None)?;
    ensure!(
        text.stdout.lines().any(|l| {
            l.split_whitespace().take(4).collect::<Vec<_>>()
                == [
                    epoch.to_string(),
                    feed["headSeq"].to_string(),
                    oldest.to_string(),
                    "20".to_string(),
                ]
        }),
        "the CHANGE FEED table: {}",
        text.stdout
    );
    c.start_apiserver().map_err(|e| format!("{e:#}"))?;
    c.wait_available(Duration::from_secs(90))
        .map_err(|e| format!("{e:#}"))?;
    Ok(())
}

/// The claims of a compact JWS, decoded without checking the signature (the gateway's
/// scenarios check that): the plugin's part is asking for the token and printing it.
fn jwt_claims(token: &str) -> Result<Value, String> {
    let parts: Vec<&str> = token.split('.').collect();
    ensure!(parts.len() == 3, "not a compact JWS: {token:?}");
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[1])
        .map_err(|e| format!("the payload is not base64url: {e}"))?;
    serde_json::from_slice(&payload).map_err(|e| format!("the payload is not JSON: {e}"))
}

/// The token of a successful `token` run: stdout is exactly one line, the token.
fn printed_token(r: &Run, what: &str) -> Result<String, String> {
    succeeded(r, what)?;
    let token = r
        .stdout
        .strip_suffix('\n')
        .filter(|t| !t.is_empty() && !t.contains('\n'))
        .ok_or_else(|| format!("{what}: stdout is not one line: {r:?}"))?;
    Ok(token.to_string())
}

fn lifetime(claims: &Value) -> Option<i64> {
    Some(claims["exp"].as_i64()? - claims["iat"].as_i64()?)
}

pub fn token_prints_a_session_token(c: &mut LocalCluster) -> Result<(), String> {
    let ns = NS_TOKEN;
    create_namespace(c, ns)?;
    apply(
        c,
        ns,
        &session("bot", "github", "srv-kx-tok", Some("alice@example.com")).yaml(),
    )?;
    let uid = get_json(c, ns, &["acs", "bot"])?["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(!uid.is_empty(), "session bot has no uid");

    // The admin, through kubectl, with -n: the server's default lifetime and audience.
    let admin = c.kubeconfig.clone();
    let out = kubectl_access(&admin, &["token", "bot", "-n", ns], None)?;
    let claims = jwt_claims(&printed_token(&out, "kubectl access token")?)?;
    ensure!(
        claims["access.mcp-runtime.dev"]["session"]
            == json!({"namespace": ns, "name": "bot", "uid": uid})
            && claims["access.mcp-runtime.dev"]["server"]
                == json!({"name": "github", "uid": "srv-kx-tok"})
            && claims["sub"] == format!("system:accesssession:{ns}:bot").as_str()
            && claims["aud"] == json!([format!("http://github.{ns}.svc:8086")])
            && lifetime(&claims) == Some(600),
        "the token's claims: {claims}"
    );

    // --duration is spec.expirationSeconds, --audience spec.audiences (repeatable).
    let asked = access(
        &admin,
        &[
            "token",
            "bot",
            "-n",
            ns,
            "--duration",
            "2m",
            "--audience",
            "https://a.example",
            "--audience",
            "https://b.example/mcp",
        ],
        None,
    )?;
    let claims = jwt_claims(&printed_token(&asked, "token --duration --audience")?)?;
    ensure!(
        lifetime(&claims) == Some(120)
            && claims["aud"] == json!(["https://a.example", "https://b.example/mcp"]),
        "--duration 2m and two audiences: {claims}"
    );
    let sub_second = access(
        &admin,
        &["token", "bot", "-n", ns, "--duration", "1500ms"],
        None,
    )?;
    ensure!(
        sub_second.code != 0 && sub_second.stdout.is_empty(),
        "--duration 1500ms: {sub_second:?}"
    );

    // mcp-access-token-requester suffices; the context's namespace is the default.
    let requester = bound_account(c, ns, "requester", "mcp-access-token-requester")?;
    let theirs = until_allowed(|| kubectl_access(&requester, &["token", "bot"], None))?;
    let claims = jwt_claims(&printed_token(&theirs, "token as the requester")?)?;
    ensure!(
        claims["access.mcp-runtime.dev"]["session"]["uid"] == uid.as_str(),
        "the requester's token: {claims}"
    );

    // A viewer may read the session but not mint: the server's Forbidden, as kubectl prints
    // it for the same request, exit 1, nothing on stdout.
    let viewer = bound_account(c, ns, "viewer", "view")?;
    let path =
        format!("/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions/bot/token");
    let body = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#;
    let kubectl = c.kubectl_as(&viewer, &["create", "--raw", &path, "-f", "-"], Some(body));
    let denied = access(&viewer, &["token", "bot"], None)?;
    ensure!(
        denied.code == 1
            && denied.stdout.is_empty()
            && denied.stderr.trim() == kubectl.stderr.trim()
            && denied.stderr.trim()
                == format!(
                    "Error from server (Forbidden): accesssessions.access.mcp-runtime.dev \"bot\" is forbidden: User \"system:serviceaccount:{ns}:viewer\" cannot create resource \"accesssessions/token\" in API group \"access.mcp-runtime.dev\" in the namespace \"{ns}\""
                ),
        "viewer's token: {denied:?}; kubectl create --raw said {kubectl:?}"
    );
    let through = kubectl_access(&viewer, &["token", "bot"], None)?;
    ensure!(
        through.code == 1 && through.stdout.is_empty() && through.stderr == denied.stderr,
        "kubectl access token as the viewer: {through:?}"
    );

    // A revoked session mints nothing: the server's Conflict.
    apply(c, ns, &revocation_yaml("pull-bot", "bot"))?;
    let revoked = access(&admin, &["token", "bot", "-n", ns], None)?;
    ensure!(
        revoked.code == 1
            && revoked.stdout.is_empty()
            && revoked.stderr.starts_with("Error from server (Conflict): "),
        "token of a revoked session: {revoked:?}"
    );
    let missing = access(&admin, &["token", "nobody", "-n", ns], None)?;
    ensure!(
        missing.code == 1 && missing.stderr.starts_with("Error from server (NotFound): "),
        "token of a missing session: {missing:?}"
    );
    Ok(())
}
