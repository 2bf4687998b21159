//! Interop tests: the real `kubectl` against the apiserver, asserting on what a user sees
//! (exit status, the printed tables and messages, and the objects that result).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;
use support::StoreExt;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use support::kubectl::*;
use support::server::TestServer;
use support::{mk_agent, mk_agent_session, mk_human_session, mk_session};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const SERVER_UID: &str = "srv-uid-1";
const SESSION_HEADER: [&str; 7] = [
    "NAME", "SERVER", "AGENT", "SUBJECT", "PHASE", "EXPIRES", "AGE",
];
const AGENT_HEADER: [&str; 5] = ["NAME", "ACTIVE", "TEAMS", "SESSIONS", "AGE"];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn yaml_labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut s = String::from("  labels:\n");
    for (k, v) in pairs {
        s.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    s
}

/// A human session manifest (no directory checks) expiring in 30 minutes.
fn session_yaml(name: &str, label_pairs: &[(&str, &str)]) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\n{}spec:\n  server:\n    name: github\n    uid: {SERVER_UID}\n  subject:\n    user: alice@example.com\n  expiresAt: \"{}\"\n",
        yaml_labels(label_pairs),
        in_secs(1800)
    )
}

fn agent_yaml(name: &str, label_pairs: &[(&str, &str)], spec: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: {name}\n{}spec:\n{spec}",
        yaml_labels(label_pairs)
    )
}

/// Creates a team session through the store.
async fn seed_session(server: &TestServer, ns: &str, name: &str, label_pairs: &[(&str, &str)]) {
    let mut s = mk_session(ns, name, SERVER_UID);
    s.metadata.labels = labels(label_pairs);
    server
        .store
        .create_session(s, false)
        .await
        .expect("seed session");
}

async fn seed_agent(server: &TestServer, name: &str, teams: &[&str], label_pairs: &[(&str, &str)]) {
    let mut a = mk_agent(name, teams);
    a.metadata.labels = labels(label_pairs);
    server
        .store
        .create_agent(a, false)
        .await
        .expect("seed agent");
}

fn write_file(server: &TestServer, name: &str, text: &str) -> String {
    let path = server.dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// A long-running `kubectl get -w`, read line by line.
struct Watch {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<String>,
}

impl Watch {
    fn spawn(server: &TestServer, args: &[&str]) -> Self {
        let mut child = server.kubectl_spawn(args);
        let stdout = child.stdout.take().expect("piped stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `pred`; `None` when `timeout` passes first.
    async fn try_until(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[&str]) -> bool,
    ) -> Option<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Err(_) => return None,
                Ok(Ok(Some(line))) => line,
                Ok(Ok(None)) | Ok(Err(_)) => self.fail("kubectl's output ended").await,
            };
            self.seen.push(line.clone());
            let words: Vec<&str> = line.split_whitespace().collect();
            if pred(&words) {
                return Some(line);
            }
        }
    }

    /// Reads lines until one satisfies `pred`, failing the test after 15 s.
    async fn until(&mut self, what: &str, pred: impl Fn(&[&str]) -> bool) -> String {
        match self.try_until(Duration::from_secs(15), pred).await {
            Some(line) => line,
            None => self.fail(&format!("timed out waiting for {what}")).await,
        }
    }

    async fn fail<T>(&mut self, why: &str) -> T {
        let _ = self.child.start_kill();
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ =
                tokio::time::timeout(Duration::from_secs(2), e.read_to_string(&mut stderr)).await;
        }
        panic!("{why}; lines so far: {:#?}; stderr: {stderr}", self.seen);
    }

    async fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill().await;
        self.seen
    }
}

// ---------------------------------------------------------------------------------------------
// get: tables and output formats
// ---------------------------------------------------------------------------------------------

/// `kubectl get acs` prints the AccessSession columns, with agent, human and team sessions
/// rendered as a user expects (`<none>`, `team:…`, the remaining lifetime and the age).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_sessions_prints_table_columns() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments", "ops"], &[]).await;
    server
        .store
        .create_session(
            mk_agent_session(
                "default",
                "agent-s",
                SERVER_UID,
                "billing-bot",
                &["payments"],
            ),
            false,
        )
        .await
        .unwrap();
    server
        .store
        .create_session(
            mk_human_session("default", "human-s", SERVER_UID, "alice@example.com"),
            false,
        )
        .await
        .unwrap();
    seed_session(&server, "default", "team-s", &[]).await;

    let out = server.kubectl(&["get", "acs"]).await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(t.header, SESSION_HEADER, "{}", out.stdout);
    assert_eq!(t.names(), ["agent-s", "human-s", "team-s"]);
    assert_eq!(
        t.row("agent-s")[..5],
        [
            "agent-s",
            "github",
            "billing-bot",
            "team:payments",
            "Active"
        ]
    );
    assert_eq!(
        t.row("human-s")[..5],
        ["human-s", "github", "<none>", "alice@example.com", "Active"]
    );
    assert_eq!(
        t.row("team-s")[..5],
        ["team-s", "github", "<none>", "team:payments", "Active"]
    );
    for name in ["agent-s", "human-s", "team-s"] {
        let expires = t.cell(name, "EXPIRES");
        assert!(
            expires == "59m" || expires == "60m",
            "EXPIRES of {name}: {expires}"
        );
        assert!(
            is_age(t.cell(name, "AGE")),
            "AGE of {name}: {}",
            t.cell(name, "AGE")
        );
    }

    // The full resource name and the singular work the same.
    let full = get_table(&server, &["accesssessions.access.mcp-runtime.dev"]).await;
    assert_eq!(full.names(), t.names());
    let singular = get_table(&server, &["accesssession"]).await;
    assert_eq!(singular.names(), t.names());
}

/// `kubectl get agents` prints the Agent columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_agents_prints_table_columns() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments", "ops"], &[]).await;
    let mut off = mk_agent("retired-bot", &[]);
    off.spec.active = false;
    server.store.create_agent(off, false).await.unwrap();

    let out = server.kubectl(&["get", "agents"]).await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(t.header, AGENT_HEADER, "{}", out.stdout);
    assert_eq!(t.names(), ["billing-bot", "retired-bot"]);
    assert_eq!(
        t.row("billing-bot")[..4],
        ["billing-bot", "true", "payments,ops", "0"]
    );
    assert_eq!(
        t.row("retired-bot")[..4],
        ["retired-bot", "false", "<none>", "0"]
    );
    assert!(is_age(t.cell("billing-bot", "AGE")), "{}", out.stdout);
}

/// `-o wide` adds the priority-1 columns of both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_wide_shows_extra_columns() {
    let server = TestServer::start().await;
    let mut agent = mk_agent("billing-bot", &["payments", "ops"]);
    agent.spec.display_name = Some("Billing Bot".into());
    agent.spec.owners = vec!["bob".into(), "carol".into()];
    agent.spec.max_session_ttl = Some("8h".into());
    server.store.create_agent(agent, false).await.unwrap();
    seed_session(&server, "default", "s1", &[]).await;
    seed_session(&server, "default", "s2", &[]).await;
    support::revoke(&server.store, "default", "s2", "compromised").await;

    let t = get_table(&server, &["acs", "-o", "wide"]).await;
    let mut wide_header: Vec<&str> = SESSION_HEADER.to_vec();
    wide_header.extend(["SERVER UID", "TEAMS", "REVOCATION", "TOOLS"]);
    assert_eq!(t.header, wide_header);
    assert_eq!(t.row("s1")[7..], [SERVER_UID, "payments", "<none>", "*"]);
    assert_eq!(t.cell("s2", "PHASE"), "Revoked");
    assert_eq!(t.cell("s2", "REVOCATION"), "compromised");

    // TOOLS: the grant, narrowed with kubectl patch (a widening is refused).
    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"tools":["search","issues_*"]}}"#,
        ])
        .await;
    assert!(out.success, "{}", out.stderr);
    let t = get_table(&server, &["acs", "-o", "wide"]).await;
    assert_eq!(t.cell("s1", "TOOLS"), "search,issues_*");
    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"tools":["*"]}}"#,
        ])
        .await;
    assert!(!out.success);
    assert!(
        out.stderr.contains("may only be narrowed"),
        "{}",
        out.stderr
    );

    let t = get_table(&server, &["agents", "-o", "wide"]).await;
    let mut wide_header: Vec<&str> = AGENT_HEADER.to_vec();
    wide_header.extend(["DISPLAY NAME", "OWNERS", "MAX TTL"]);
    assert_eq!(t.header, wide_header);
    assert_eq!(
        t.row("billing-bot")[5..],
        ["Billing Bot", "bob,carol", "8h"]
    );

    // Without -o wide the extra columns stay hidden.
    let narrow = get_table(&server, &["agents"]).await;
    assert_eq!(narrow.header, AGENT_HEADER);
}

/// `-o json` and `-o yaml` print the full objects (one, and lists) for both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_json_and_yaml_print_objects() {
    let server = TestServer::start().await;
    seed_agent(
        &server,
        "billing-bot",
        &["payments"],
        &[("team", "payments")],
    )
    .await;
    server
        .store
        .create_session(
            mk_agent_session("default", "s1", SERVER_UID, "billing-bot", &["payments"]),
            false,
        )
        .await
        .unwrap();
    seed_session(&server, "default", "s2", &[]).await;

    let s1 = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(s1["apiVersion"], "access.mcp-runtime.dev/v1alpha1");
    assert_eq!(s1["kind"], "AccessSession");
    assert_eq!(s1["metadata"]["name"], "s1");
    assert_eq!(s1["metadata"]["namespace"], "default");
    assert!(
        s1["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{s1}"
    );
    assert!(
        s1["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{s1}"
    );
    assert!(s1["metadata"]["creationTimestamp"].is_string(), "{s1}");
    assert_eq!(
        s1["spec"]["server"],
        serde_json::json!({"name": "github", "uid": SERVER_UID})
    );
    assert_eq!(s1["spec"]["teams"], serde_json::json!(["payments"]));
    assert_eq!(s1["status"]["phase"], "Active");

    let agent = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(agent["kind"], "Agent");
    assert!(
        agent["metadata"].get("namespace").is_none(),
        "cluster-scoped: {agent}"
    );
    // The session's agent uid was bound to the Agent's uid at issuance.
    assert_eq!(s1["spec"]["agent"]["uid"], agent["metadata"]["uid"]);
    assert_eq!(agent["spec"]["active"], true);
    assert_eq!(agent["metadata"]["labels"]["team"], "payments");

    let list = get_json(&server, &["acs"]).await;
    assert_eq!(list["kind"], "List");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"]);
    assert!(list["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["kind"] == "AccessSession"));

    let out = server.kubectl(&["get", "acs", "s2", "-o", "yaml"]).await;
    ok(&out);
    for line in [
        "apiVersion: access.mcp-runtime.dev/v1alpha1",
        "kind: AccessSession",
        "  name: s2",
        "  namespace: default",
        "    uid: srv-uid-1",
        "  - payments",
        "  phase: Active",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "missing {line:?} in\n{}",
            out.stdout
        );
    }
    let out = server.kubectl(&["get", "agents", "-o", "yaml"]).await;
    ok(&out);
    assert!(out.stdout.contains("kind: List"), "{}", out.stdout);
    assert!(
        out.stdout.lines().any(|l| l.trim() == "kind: Agent"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.lines().any(|l| l.trim() == "name: billing-bot"),
        "{}",
        out.stdout
    );

    // jsonpath reads the same objects.
    let out = server
        .kubectl(&["get", "acs", "-o", "jsonpath={.items[*].metadata.name}"])
        .await;
    ok(&out);
    assert_eq!(out.stdout, "s1 s2");
}

/// `-A` lists every namespace with a NAMESPACE column; `-n` restricts to one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_all_namespaces() {
    let server = TestServer::start().await;
    seed_session(&server, "team-a", "s1", &[]).await;
    seed_session(&server, "team-a", "s2", &[]).await;
    seed_session(&server, "team-b", "s1", &[]).await;
    seed_session(&server, "default", "d1", &[]).await;

    let t = get_table(&server, &["acs", "-A"]).await;
    let mut header = vec!["NAMESPACE"];
    header.extend(SESSION_HEADER);
    assert_eq!(t.header, header);
    let mut pairs: Vec<(String, String)> = t
        .rows
        .iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    pairs.sort();
    let want: Vec<(String, String)> = [
        ("default", "d1"),
        ("team-a", "s1"),
        ("team-a", "s2"),
        ("team-b", "s1"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(pairs, want);

    let t = get_table(&server, &["acs", "-n", "team-b"]).await;
    assert_eq!(t.header, SESSION_HEADER);
    assert_eq!(t.names(), ["s1"]);
    let t = get_table(&server, &["acs"]).await;
    assert_eq!(t.names(), ["d1"]);

    let out = server.kubectl(&["get", "acs", "-n", "empty"]).await;
    ok(&out);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr
            .contains("No resources found in empty namespace."),
        "{out:?}"
    );
}

/// `-L team` adds a column per label key and `--show-labels` a LABELS column, from the row
/// objects of the Table, for both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_label_columns_and_show_labels() {
    let server = TestServer::start().await;
    seed_session(
        &server,
        "default",
        "s1",
        &[("team", "payments"), ("tier", "gold")],
    )
    .await;
    seed_session(&server, "default", "s2", &[]).await;
    seed_agent(
        &server,
        "billing-bot",
        &["payments"],
        &[("team", "payments")],
    )
    .await;

    let t = get_table(&server, &["acs", "-L", "team"]).await;
    assert_eq!(t.header.last().unwrap(), "TEAM");
    assert_eq!(t.cell("s1", "TEAM"), "payments");
    assert_eq!(t.cell("s2", "TEAM"), "");

    let t = get_table(&server, &["acs", "--show-labels"]).await;
    assert_eq!(t.header.last().unwrap(), "LABELS");
    assert_eq!(t.cell("s1", "LABELS"), "team=payments,tier=gold");
    assert_eq!(t.cell("s2", "LABELS"), "<none>");

    let t = get_table(&server, &["agents", "-L", "team", "--show-labels"]).await;
    let n = t.header.len();
    assert_eq!(t.header[n - 2..], ["TEAM", "LABELS"]);
    assert_eq!(t.cell("billing-bot", "TEAM"), "payments");
    assert_eq!(t.cell("billing-bot", "LABELS"), "team=payments");

    // With -A the namespace comes from the row objects too.
    let t = get_table(&server, &["acs", "-A", "-L", "tier"]).await;
    assert_eq!(t.header.first().unwrap(), "NAMESPACE");
    assert_eq!(t.cell("s1", "NAMESPACE"), "default");
    assert_eq!(t.cell("s1", "TIER"), "gold");
}

/// `--chunk-size=2` pages through 5 objects with continue tokens and lists all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_chunk_size_pages_through_everything() {
    let server = TestServer::start().await;
    for i in 1..=5 {
        seed_session(&server, "default", &format!("s{i}"), &[]).await;
        seed_agent(&server, &format!("agent-{i}"), &[], &[]).await;
    }
    // Not in the namespace: must not leak into the pages.
    seed_session(&server, "other", "s0", &[]).await;

    let out = server
        .kubectl(&["get", "acs", "--chunk-size=2", "-v=6"])
        .await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(
        t.header, SESSION_HEADER,
        "one header for all pages: {}",
        out.stdout
    );
    assert_eq!(t.names(), ["s1", "s2", "s3", "s4", "s5"]);
    let requests: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("GET ") && l.contains("/accesssessions?"))
        .collect();
    assert_eq!(requests.len(), 3, "three pages: {requests:#?}");
    assert!(
        requests.iter().all(|r| r.contains("limit=2")),
        "{requests:#?}"
    );
    assert_eq!(
        requests.iter().filter(|r| r.contains("continue=")).count(),
        2,
        "{requests:#?}"
    );

    let t = get_table(&server, &["agents", "--chunk-size=2"]).await;
    assert_eq!(
        t.names(),
        ["agent-1", "agent-2", "agent-3", "agent-4", "agent-5"]
    );

    let t = get_table(&server, &["acs", "-A", "--chunk-size=2"]).await;
    assert_eq!(t.rows.len(), 6, "{t:?}");
}

/// Label selectors (`-l`), equality- and set-based.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_label_selectors() {
    let server = TestServer::start().await;
    seed_session(
        &server,
        "default",
        "s1",
        &[("team", "payments"), ("env", "prod")],
    )
    .await;
    seed_session(
        &server,
        "default",
        "s2",
        &[("team", "payments"), ("env", "dev")],
    )
    .await;
    seed_session(&server, "default", "s3", &[("team", "ops")]).await;
    seed_session(&server, "default", "s4", &[]).await;
    seed_agent(&server, "a1", &[], &[("team", "payments")]).await;
    seed_agent(&server, "a2", &[], &[("team", "ops")]).await;

    for (selector, want) in [
        ("team=payments", vec!["s1", "s2"]),
        ("team==payments,env=prod", vec!["s1"]),
        ("team!=payments", vec!["s3", "s4"]),
        ("env in (prod,dev)", vec!["s1", "s2"]),
        ("env notin (prod)", vec!["s2", "s3", "s4"]),
        ("team", vec!["s1", "s2", "s3"]),
        ("!env", vec!["s3", "s4"]),
    ] {
        let t = get_table(&server, &["acs", "-l", selector]).await;
        assert_eq!(t.names(), want, "selector {selector:?}");
    }
    let t = get_table(&server, &["agents", "-l", "team=ops"]).await;
    assert_eq!(t.names(), ["a2"]);

    let out = server.kubectl(&["get", "acs", "-l", "team=nobody"]).await;
    ok(&out);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr
            .contains("No resources found in default namespace."),
        "{out:?}"
    );

    let out = server
        .kubectl(&["get", "acs", "-l", "team in (payments"])
        .await;
    failed(&out);
}

/// Field selectors on the supported fields, including `status.phase` after a revocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_field_selectors() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[("team", "payments")]).await;
    seed_session(&server, "default", "s2", &[("team", "payments")]).await;
    let mut gitlab = mk_human_session("default", "s3", "srv-uid-2", "bob@example.com");
    gitlab.spec.server.name = "gitlab".into();
    server.store.create_session(gitlab, false).await.unwrap();
    support::revoke(&server.store, "default", "s2", "manual").await;

    for (selector, want) in [
        ("spec.server.name=github", vec!["s1", "s2"]),
        ("spec.server.name=gitlab", vec!["s3"]),
        ("spec.server.uid=srv-uid-2", vec!["s3"]),
        ("spec.subject.user=bob@example.com", vec!["s3"]),
        ("status.phase=Revoked", vec!["s2"]),
        ("status.phase!=Revoked", vec!["s1", "s3"]),
        ("status.phase=Active,spec.server.name=github", vec!["s1"]),
        ("metadata.name=s1", vec!["s1"]),
    ] {
        let t = get_table(&server, &["acs", "--field-selector", selector]).await;
        assert_eq!(t.names(), want, "field selector {selector:?}");
    }
    let t = get_table(
        &server,
        &[
            "acs",
            "--field-selector",
            "status.phase=Revoked",
            "-o",
            "wide",
        ],
    )
    .await;
    assert_eq!(t.cell("s2", "PHASE"), "Revoked");
    assert_eq!(t.cell("s2", "REVOCATION"), "manual");
    // Combined with a label selector.
    let t = get_table(
        &server,
        &[
            "acs",
            "-l",
            "team=payments",
            "--field-selector",
            "status.phase=Active",
        ],
    )
    .await;
    assert_eq!(t.names(), ["s1"]);

    let out = server
        .kubectl(&["get", "acs", "--field-selector", "spec.teams=payments"])
        .await;
    failed(&out);
    assert!(out.stderr.contains("BadRequest"), "{out:?}");
    assert!(
        out.stderr.contains("field label not supported: spec.teams"),
        "{out:?}"
    );
}

/// `kubectl get acs NAME` prints one row; a missing name is NotFound, for both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_by_name_and_not_found() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[]).await;
    seed_session(&server, "default", "s2", &[]).await;
    seed_agent(&server, "billing-bot", &[], &[]).await;

    let t = get_table(&server, &["acs", "s1"]).await;
    assert_eq!(t.header, SESSION_HEADER);
    assert_eq!(t.names(), ["s1"]);
    let t = get_table(&server, &["acs", "s1", "s2"]).await;
    assert_eq!(t.names(), ["s1", "s2"]);
    let t = get_table(&server, &["agent", "billing-bot"]).await;
    assert_eq!(t.names(), ["billing-bot"]);

    let out = server.kubectl(&["get", "acs", "nope"]).await;
    failed(&out);
    assert_eq!(out.stdout, "");
    assert_eq!(
        out.stderr.trim(),
        r#"Error from server (NotFound): accesssessions.access.mcp-runtime.dev "nope" not found"#
    );
    let out = server.kubectl(&["get", "agent", "nope"]).await;
    failed(&out);
    assert_eq!(
        out.stderr.trim(),
        r#"Error from server (NotFound): agents.access.mcp-runtime.dev "nope" not found"#
    );
    // The same name in another namespace is another object.
    let out = server.kubectl(&["get", "acs", "s1", "-n", "other"]).await;
    failed(&out);
    assert!(out.stderr.contains("(NotFound)"), "{out:?}");
}

/// `kubectl get mcp-access` (the category) lists both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_category_lists_both_kinds() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[]).await;
    seed_agent(&server, "billing-bot", &[], &[]).await;

    let out = server.kubectl(&["get", "mcp-access"]).await;
    ok(&out);
    let text = &out.stdout;
    assert!(
        text.lines()
            .any(|l| l.starts_with("accesssession.access.mcp-runtime.dev/s1 ")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("agent.access.mcp-runtime.dev/billing-bot ")),
        "{text}"
    );
    // Each kind with its own columns.
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == SESSION_HEADER),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == AGENT_HEADER),
        "{text}"
    );

    let out = server.kubectl(&["get", "mcp-access", "-o", "name"]).await;
    ok(&out);
    let mut names: Vec<&str> = out.stdout.lines().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "accesssession.access.mcp-runtime.dev/s1",
            "agent.access.mcp-runtime.dev/billing-bot"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// get -w
// ---------------------------------------------------------------------------------------------

/// `kubectl get acs -w` prints the list, then every change another client makes in the
/// namespace, and nothing from other namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_collection_sees_changes() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[]).await;

    let mut w = Watch::spawn(&server, &["get", "acs", "-w", "--output-watch-events"]);
    w.until("the header", |c| {
        c.first() == Some(&"EVENT") && c.get(1) == Some(&"NAME")
    })
    .await;
    w.until("s1 from the list", |c| c.starts_with(&["ADDED", "s1"]))
        .await;

    // Another kubectl creates a session: it appears.
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-f", "-"],
            Some(&session_yaml("s2", &[])),
        )
        .await;
    ok(&out);
    let line = w
        .until("ADDED s2", |c| c.starts_with(&["ADDED", "s2"]))
        .await;
    assert!(
        line.contains("alice@example.com") && line.contains("Active"),
        "{line}"
    );

    // In another namespace: not for this watch.
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-n", "other", "-f", "-"],
            Some(&session_yaml("elsewhere", &[])),
        )
        .await;
    ok(&out);

    // A Revocation of s2 (created through the store) shows up as a change of its phase.
    support::revoke(&server.store, "default", "s2", "manual").await;
    w.until("MODIFIED s2 Revoked", |c| {
        c.starts_with(&["MODIFIED", "s2"]) && c.contains(&"Revoked")
    })
    .await;

    let out = server.kubectl(&["delete", "acs", "s2"]).await;
    ok(&out);
    w.until("DELETED s2", |c| c.starts_with(&["DELETED", "s2"]))
        .await;

    let seen = w.stop().await;
    assert!(!seen.iter().any(|l| l.contains("elsewhere")), "{seen:#?}");
}

/// `kubectl get acs NAME -w` follows one object (kubectl drops the synthetic ADDED of its
/// resourceVersion=0 watch, so changes are poked until one arrives) and ignores others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_single_object_sees_changes() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[]).await;
    seed_session(&server, "default", "s2", &[]).await;

    let mut w = Watch::spawn(&server, &["get", "acs", "s1", "-w", "-L", "color"]);
    w.until("the header", |c| {
        c.first() == Some(&"NAME") && c.last() == Some(&"COLOR")
    })
    .await;
    w.until("s1", |c| c.first() == Some(&"s1")).await;

    // The watch starts just after the GET; poke until a change is seen.
    let mut seen_change = false;
    for i in 0..10 {
        let value = format!("blue{i}");
        let out = server
            .kubectl(&[
                "label",
                "acs",
                "s1",
                &format!("color={value}"),
                "--overwrite",
            ])
            .await;
        ok(&out);
        assert!(
            out.stdout
                .contains("accesssession.access.mcp-runtime.dev/s1 labeled"),
            "{out:?}"
        );
        if w.try_until(Duration::from_secs(2), |c| {
            c.first() == Some(&"s1") && c.last().is_some_and(|l| l.starts_with("blue"))
        })
        .await
        .is_some()
        {
            seen_change = true;
            break;
        }
    }
    assert!(seen_change, "no change seen: {:#?}", w.seen);

    // Changes of another object are not shown; a revocation of this one is.
    let out = server.kubectl(&["label", "acs", "s2", "color=red"]).await;
    ok(&out);
    support::revoke(&server.store, "default", "s1", "manual").await;
    w.until("s1 Revoked", |c| {
        c.first() == Some(&"s1") && c.contains(&"Revoked")
    })
    .await;
    let seen = w.stop().await;
    assert!(!seen.iter().any(|l| l.starts_with("s2")), "{seen:#?}");
}

/// `kubectl get acs -w -l …`: a change that moves an object into the selection is shown as
/// ADDED, one that moves it out as DELETED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_label_selector_follows_the_selection() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[("env", "prod")]).await;
    seed_session(&server, "default", "s2", &[("env", "dev")]).await;

    let mut w = Watch::spawn(
        &server,
        &[
            "get",
            "acs",
            "-w",
            "-l",
            "env=prod",
            "--output-watch-events",
        ],
    );
    w.until("s1 from the list", |c| c.starts_with(&["ADDED", "s1"]))
        .await;

    let out = server
        .kubectl(&["label", "acs", "s2", "env=prod", "--overwrite"])
        .await;
    ok(&out);
    w.until("s2 entering the selection", |c| {
        c.starts_with(&["ADDED", "s2"])
    })
    .await;
    let out = server
        .kubectl(&["label", "acs", "s1", "env=dev", "--overwrite"])
        .await;
    ok(&out);
    w.until("s1 leaving the selection", |c| {
        c.starts_with(&["DELETED", "s1"])
    })
    .await;
    let seen = w.stop().await;
    // The initial list held s1 only.
    assert_eq!(
        seen.iter().filter(|l| l.contains(" s2 ")).count(),
        1,
        "{seen:#?}"
    );
    // s1 is still there, just not selected.
    assert_eq!(get_table(&server, &["acs"]).await.names(), ["s1", "s2"]);
}

/// `kubectl get agents -w` (cluster-scoped) sees a deactivation made by another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_agents_sees_changes() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments"], &[]).await;

    let mut w = Watch::spawn(&server, &["get", "agents", "-w"]);
    w.until("the header", |c| c.first() == Some(&"NAME")).await;
    w.until("billing-bot active", |c| {
        c.starts_with(&["billing-bot", "true"])
    })
    .await;

    let out = server
        .kubectl(&[
            "patch",
            "agent",
            "billing-bot",
            "--type=merge",
            "-p",
            r#"{"spec":{"active":false}}"#,
        ])
        .await;
    ok(&out);
    w.until("billing-bot inactive", |c| {
        c.starts_with(&["billing-bot", "false"])
    })
    .await;

    seed_agent(&server, "new-bot", &[], &[]).await;
    w.until("new-bot", |c| c.first() == Some(&"new-bot")).await;
    w.stop().await;
}

// ---------------------------------------------------------------------------------------------
// create / apply
// ---------------------------------------------------------------------------------------------

/// `kubectl create -f -` (stdin), `-f file` and a multi-document file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_from_stdin_and_file() {
    let server = TestServer::start().await;

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-f", "-"],
            Some(&session_yaml("from-stdin", &[])),
        )
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/from-stdin created"
    );

    let path = write_file(
        &server,
        "session.yaml",
        &session_yaml("from-file", &[("env", "prod")]),
    );
    let out = server
        .kubectl(&["create", "-f", &path, "-n", "team-a"])
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/from-file created"
    );

    let multi = format!(
        "{}---\n{}",
        agent_yaml(
            "billing-bot",
            &[],
            "  displayName: Billing Bot\n  teams: [payments]\n"
        ),
        session_yaml("third", &[])
    );
    let path = write_file(&server, "multi.yaml", &multi);
    let out = server.kubectl(&["create", "-f", &path]).await;
    ok(&out);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "agent.access.mcp-runtime.dev/billing-bot created",
            "accesssession.access.mcp-runtime.dev/third created"
        ]
    );

    let t = get_table(&server, &["acs", "-A"]).await;
    let mut pairs: Vec<String> = t
        .rows
        .iter()
        .map(|r| format!("{}/{}", r[0], r[1]))
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        ["default/from-stdin", "default/third", "team-a/from-file"]
    );
    let s = get_json(&server, &["acs", "from-file", "-n", "team-a"]).await;
    assert_eq!(s["metadata"]["labels"]["env"], "prod");
    assert_eq!(s["spec"]["subject"]["user"], "alice@example.com");
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(a["spec"]["displayName"], "Billing Bot");

    // Creating an existing object again is AlreadyExists.
    let out = server.kubectl(&["create", "-f", &path]).await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (AlreadyExists)"),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains(r#"agents.access.mcp-runtime.dev "billing-bot" already exists"#),
        "{out:?}"
    );
}

/// `kubectl apply -f` creates, then reports `unchanged`, then `configured` with a change
/// that becomes visible (for both kinds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_then_unchanged_then_configured() {
    let server = TestServer::start().await;
    let manifest = session_yaml("s1", &[("env", "prod")]);
    let path = write_file(&server, "s1.yaml", &manifest);

    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 created"
    );
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 unchanged"
    );

    let changed = manifest.replace(
        "    env: \"prod\"\n",
        "    env: \"prod\"\n    tier: \"gold\"\n",
    );
    assert_ne!(changed, manifest);
    std::fs::write(&path, &changed).unwrap();
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 configured"
    );
    let t = get_table(&server, &["acs", "--show-labels"]).await;
    assert_eq!(t.cell("s1", "LABELS"), "env=prod,tier=gold");
    let s = get_json(&server, &["acs", "s1"]).await;
    let last_applied = s["metadata"]["annotations"]
        ["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .unwrap_or_else(|| panic!("no last-applied annotation: {s}"));
    assert!(last_applied.contains(r#""tier":"gold""#), "{last_applied}");
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 unchanged"
    );

    // An Agent: a list field edited in the manifest is replaced as written.
    let agent = agent_yaml(
        "billing-bot",
        &[],
        "  teams: [payments, ops, support]\n  owners: [bob]\n",
    );
    let path = write_file(&server, "agent.yaml", &agent);
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "agent.access.mcp-runtime.dev/billing-bot created"
    );
    std::fs::write(
        &path,
        agent.replace("[payments, ops, support]", "[support, payments]"),
    )
    .unwrap();
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "agent.access.mcp-runtime.dev/billing-bot configured"
    );
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(
        a["spec"]["teams"],
        serde_json::json!(["support", "payments"])
    );
    assert_eq!(a["spec"]["owners"], serde_json::json!(["bob"]));
    let out = server.kubectl(&["apply", "-f", &path]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "agent.access.mcp-runtime.dev/billing-bot unchanged"
    );
}

/// Field errors come back as 422 Invalid and kubectl lists each cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_invalid_object_lists_causes() {
    let server = TestServer::start().await;
    let manifest = format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: Bad_Name\nspec:\n  server: {{name: github}}\n  expiresAt: \"{}\"\n",
        in_secs(600)
    );
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    failed(&out);
    assert!(
        out.stderr
            .contains(r#"The AccessSession "Bad_Name" is invalid"#),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains(r#"metadata.name: Invalid value: "Bad_Name""#),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("spec.server.uid: Required value"),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("at least one of spec.agent, spec.subject or spec.teams is required"),
        "{out:?}"
    );

    let agent = agent_yaml("ttl-bot", &[], "  maxSessionTTL: forever\n");
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&agent))
        .await;
    failed(&out);
    assert!(
        out.stderr.contains(r#"The Agent "ttl-bot" is invalid"#),
        "{out:?}"
    );
    assert!(out.stderr.contains("spec.maxSessionTTL"), "{out:?}");

    let out = server.kubectl(&["get", "acs,agents"]).await;
    ok(&out);
    assert_eq!(out.stdout, "", "nothing was stored");
}

/// `kubectl label --resource-version` is an optimistic-concurrency precondition: a stale
/// version is a 409 Conflict, the current one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_resource_version_conflicts() {
    let server = TestServer::start().await;
    seed_session(&server, "default", "s1", &[]).await;
    let stale = get_json(&server, &["acs", "s1"]).await["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let out = server.kubectl(&["label", "acs", "s1", "a=1"]).await;
    ok(&out);

    let out = server
        .kubectl(&[
            "label",
            "acs",
            "s1",
            "b=2",
            &format!("--resource-version={stale}"),
        ])
        .await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (Conflict)"),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("the object has been modified"),
        "{out:?}"
    );

    let current = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(current["metadata"]["labels"], serde_json::json!({"a": "1"}));
    let rv = current["metadata"]["resourceVersion"].as_str().unwrap();
    let out = server
        .kubectl(&[
            "label",
            "acs",
            "s1",
            "b=2",
            &format!("--resource-version={rv}"),
        ])
        .await;
    ok(&out);
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(
        s["metadata"]["labels"],
        serde_json::json!({"a": "1", "b": "2"})
    );
}

/// `kubectl describe` renders spec and status of both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_shows_spec_and_status() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments"], &[]).await;
    server
        .store
        .create_session(
            mk_agent_session("default", "s1", SERVER_UID, "billing-bot", &["payments"]),
            false,
        )
        .await
        .unwrap();
    support::revoke(&server.store, "default", "s1", "compromised").await;

    let out = server.kubectl(&["describe", "acs", "s1"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &[
            "Name: s1",
            "Namespace: default",
            "Kind: AccessSession",
            "Phase: Revoked",
            "Cause: compromised",
            "Name: billing-bot",
            "UID: srv-uid-1",
        ],
    );
    let out = server.kubectl(&["describe", "agent", "billing-bot"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &["Name: billing-bot", "Kind: Agent", "Active: true"],
    );
}

// ---------------------------------------------------------------------------------------------
// patch
// ---------------------------------------------------------------------------------------------

/// `kubectl patch --type=merge`: maps merge, `null` removes, and immutable fields are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_merge() {
    let server = TestServer::start().await;
    seed_session(
        &server,
        "default",
        "s1",
        &[("team", "payments"), ("env", "dev")],
    )
    .await;
    let earlier = in_secs(600);

    let patch = format!(
        r#"{{"metadata":{{"labels":{{"env":null,"tier":"gold"}}}},"spec":{{"expiresAt":"{earlier}"}}}}"#
    );
    let out = server
        .kubectl(&["patch", "acs", "s1", "--type=merge", "-p", &patch])
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 patched"
    );
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(
        s["metadata"]["labels"],
        serde_json::json!({"team": "payments", "tier": "gold"})
    );
    assert_eq!(s["spec"]["expiresAt"], earlier.as_str());
    assert_eq!(
        s["spec"]["teams"],
        serde_json::json!(["payments"]),
        "untouched fields stay"
    );

    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "--type=merge",
            "-p",
            r#"{"spec":{"teams":["finance"]}}"#,
        ])
        .await;
    failed(&out);
    assert!(out.stderr.contains("spec.teams"), "{out:?}");
    assert!(out.stderr.contains("field is immutable"), "{out:?}");
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(s["spec"]["teams"], serde_json::json!(["payments"]));

    // On an Agent, a merge patch replaces lists.
    seed_agent(&server, "billing-bot", &["payments", "ops"], &[]).await;
    let out = server
        .kubectl(&[
            "patch",
            "agent",
            "billing-bot",
            "--type=merge",
            "-p",
            r#"{"spec":{"teams":["ops"],"maxSessionTTL":"2h"}}"#,
        ])
        .await;
    ok(&out);
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(a["spec"]["teams"], serde_json::json!(["ops"]));
    assert_eq!(a["spec"]["maxSessionTTL"], "2h");
}

/// `kubectl patch --type=json`: RFC 6902 operations; a failing `test` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_json() {
    let server = TestServer::start().await;
    let mut agent = mk_agent("billing-bot", &["payments"]);
    agent.metadata.labels = labels(&[("team", "payments")]);
    agent.spec.display_name = Some("Old".into());
    server.store.create_agent(agent, false).await.unwrap();

    let patch = r#"[
        {"op":"replace","path":"/spec/displayName","value":"Billing Bot"},
        {"op":"add","path":"/spec/teams/-","value":"ops"},
        {"op":"remove","path":"/metadata/labels/team"},
        {"op":"add","path":"/metadata/labels/tier","value":"gold"}
    ]"#;
    let out = server
        .kubectl(&["patch", "agent", "billing-bot", "--type=json", "-p", patch])
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "agent.access.mcp-runtime.dev/billing-bot patched"
    );
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(a["spec"]["displayName"], "Billing Bot");
    assert_eq!(a["spec"]["teams"], serde_json::json!(["payments", "ops"]));
    assert_eq!(a["metadata"]["labels"], serde_json::json!({"tier": "gold"}));

    // A failing test operation rejects the whole patch.
    let patch = r#"[{"op":"test","path":"/spec/displayName","value":"Someone Else"},{"op":"replace","path":"/spec/displayName","value":"X"}]"#;
    let out = server
        .kubectl(&["patch", "agent", "billing-bot", "--type=json", "-p", patch])
        .await;
    failed(&out);
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(a["spec"]["displayName"], "Billing Bot");

    // On a session.
    seed_session(&server, "default", "s1", &[]).await;
    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/annotations","value":{"note":"hi"}}]"#,
        ])
        .await;
    ok(&out);
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(s["metadata"]["annotations"]["note"], "hi");
}

/// `kubectl patch` with the default (strategic merge) type: maps merge, lists without a merge
/// key are replaced, a `$patch: replace` directive works; checked on both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_strategic() {
    let server = TestServer::start().await;
    let mut agent = mk_agent("billing-bot", &["payments", "ops", "support"]);
    agent.metadata.labels = labels(&[("team", "payments")]);
    agent.spec.owners = vec!["bob".into()];
    server.store.create_agent(agent, false).await.unwrap();

    // No --type: kubectl sends application/strategic-merge-patch+json.
    let out = server
        .kubectl(&[
            "patch",
            "agent",
            "billing-bot",
            "-v=6",
            "-p",
            r#"{"metadata":{"labels":{"tier":"gold"}},"spec":{"teams":["ops"],"displayName":"Billing Bot"}}"#,
        ])
        .await;
    ok(&out);
    assert!(
        out.stdout
            .contains("agent.access.mcp-runtime.dev/billing-bot patched"),
        "{out:?}"
    );
    assert!(out.stderr.contains("PATCH https://"), "{out:?}");
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(
        a["metadata"]["labels"],
        serde_json::json!({"team": "payments", "tier": "gold"})
    );
    assert_eq!(a["spec"]["teams"], serde_json::json!(["ops"]));
    assert_eq!(a["spec"]["owners"], serde_json::json!(["bob"]));
    assert_eq!(a["spec"]["displayName"], "Billing Bot");

    // Explicit --type=strategic, with a delete directive on a map field.
    let out = server
        .kubectl(&[
            "patch",
            "agent",
            "billing-bot",
            "--type=strategic",
            "-p",
            r#"{"metadata":{"labels":{"$patch":"replace","only":"this"}}}"#,
        ])
        .await;
    ok(&out);
    let a = get_json(&server, &["agent", "billing-bot"]).await;
    assert_eq!(a["metadata"]["labels"], serde_json::json!({"only": "this"}));

    // On a session, and an immutable field still refused.
    seed_session(&server, "default", "s1", &[("team", "payments")]).await;
    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "-p",
            r#"{"metadata":{"labels":{"env":"prod"}}}"#,
        ])
        .await;
    ok(&out);
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(
        s["metadata"]["labels"],
        serde_json::json!({"team": "payments", "env": "prod"})
    );
    let out = server
        .kubectl(&[
            "patch",
            "acs",
            "s1",
            "-p",
            r#"{"spec":{"server":{"uid":"another"}}}"#,
        ])
        .await;
    failed(&out);
    assert!(out.stderr.contains("spec.server"), "{out:?}");
    assert!(out.stderr.contains("field is immutable"), "{out:?}");
    let s = get_json(&server, &["acs", "s1"]).await;
    assert_eq!(s["spec"]["server"]["uid"], SERVER_UID);
}

// ---------------------------------------------------------------------------------------------
// delete
// ---------------------------------------------------------------------------------------------

/// `kubectl delete acs NAME` removes it, and the name is reserved: creating it again is
/// AlreadyExists with a message that says the name was used before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_reserves_the_name() {
    let server = TestServer::start().await;
    let manifest = session_yaml("s1", &[]);
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    ok(&out);

    let out = server.kubectl(&["delete", "acs", "s1"]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"accesssession.access.mcp-runtime.dev "s1" deleted"#
    );
    let out = server.kubectl(&["get", "acs", "s1"]).await;
    failed(&out);
    assert!(out.stderr.contains("(NotFound)"), "{out:?}");

    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (AlreadyExists)"),
        "{out:?}"
    );
    assert!(out.stderr.contains("the name was used before"), "{out:?}");
    let out = server.kubectl(&["get", "acs", "s1"]).await;
    failed(&out);

    // Deleting something that is not there.
    let out = server.kubectl(&["delete", "acs", "s1"]).await;
    failed(&out);
    assert!(
        out.stderr.contains(
            r#"Error from server (NotFound): accesssessions.access.mcp-runtime.dev "s1" not found"#
        ),
        "{out:?}"
    );

    // The reservation is per namespace.
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-n", "other", "-f", "-"],
            Some(&manifest),
        )
        .await;
    ok(&out);
}

/// `kubectl delete -l`, `delete --all`, and a DELETE on the collection (deletecollection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_by_selector_and_collection() {
    let server = TestServer::start().await;
    for (name, grp) in [
        ("s1", "x"),
        ("s2", "x"),
        ("s3", "y"),
        ("s4", "z"),
        ("s5", "z"),
    ] {
        seed_session(&server, "default", name, &[("grp", grp)]).await;
    }
    seed_session(&server, "other", "o1", &[("grp", "x")]).await;
    for (name, grp) in [("a1", "x"), ("a2", "y")] {
        seed_agent(&server, name, &[], &[("grp", grp)]).await;
    }

    let out = server.kubectl(&["delete", "acs", "-l", "grp=x"]).await;
    ok(&out);
    let mut lines: Vec<&str> = out.stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            r#"accesssession.access.mcp-runtime.dev "s1" deleted"#,
            r#"accesssession.access.mcp-runtime.dev "s2" deleted"#
        ]
    );
    assert_eq!(
        get_table(&server, &["acs"]).await.names(),
        ["s3", "s4", "s5"]
    );

    // deletecollection, as the namespace controller calls it.
    let out = server
        .kubectl(&["delete", "--raw", "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/default/accesssessions?labelSelector=grp%3Dz"])
        .await;
    ok(&out);
    assert_eq!(get_table(&server, &["acs"]).await.names(), ["s3"]);

    let out = server.kubectl(&["delete", "acs", "--all"]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"accesssession.access.mcp-runtime.dev "s3" deleted"#
    );
    let out = server.kubectl(&["get", "acs"]).await;
    ok(&out);
    assert!(
        out.stderr
            .contains("No resources found in default namespace."),
        "{out:?}"
    );
    // Other namespaces are untouched.
    assert_eq!(
        get_table(&server, &["acs", "-n", "other"]).await.names(),
        ["o1"]
    );

    let out = server.kubectl(&["delete", "agents", "-l", "grp=x"]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"agent.access.mcp-runtime.dev "a1" deleted"#
    );
    assert_eq!(get_table(&server, &["agents"]).await.names(), ["a2"]);
}

// ---------------------------------------------------------------------------------------------
// explain, dry run, field validation
// ---------------------------------------------------------------------------------------------

/// `kubectl explain` (OpenAPI v3) shows the fields and their descriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_fields_and_descriptions() {
    let server = TestServer::start().await;

    let out = server.kubectl(&["explain", "accesssession.spec"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &[
            "GROUP: access.mcp-runtime.dev",
            "KIND: AccessSession",
            "VERSION: v1alpha1",
            "FIELD: spec <AccessSessionSpec>",
            "server <ServerRef> -required-",
            "The MCPServer generation this session is for.",
            "agent <AgentRef>",
            "subject <Subject>",
            "teams <[]string>",
            "Authority teams.",
            "tools <[]string>",
            "The tools this session may call.",
            "expiresAt <string>",
            "When the session stops being valid; clamped by the server.",
        ],
    );

    let out = server.kubectl(&["explain", "agent.spec"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &[
            "KIND: Agent",
            "FIELD: spec <AgentSpec>",
            "active <boolean>",
            "Whether the agent may hold sessions; false revokes all of them.",
            "teams <[]string>",
            "maxSessionTTL <string>",
            "Longest session this agent may hold, as a Go duration (`8h`, `90m`).",
            "maxActiveSessions <integer>",
            "owners <[]string>",
        ],
    );

    // Short name and a nested field.
    let out = server.kubectl(&["explain", "acs.spec.server.uid"]).await;
    ok(&out);
    assert!(
        out.stdout.contains("UID of the MCPServer generation."),
        "{}",
        out.stdout
    );
    // The field docs beyond the first line (apis/src/types.rs), as kubectl wraps them.
    let words = out.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("so a re-created MCPServer of the same name is a new generation."),
        "{}",
        out.stdout
    );
    let out = server
        .kubectl(&["explain", "accesssession.spec.bogus"])
        .await;
    failed(&out);
    assert!(out.stderr.contains("bogus"), "{out:?}");
}

/// `--dry-run=server`: a create stores nothing (and reserves nothing), a delete removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_server() {
    let server = TestServer::start().await;
    let manifest = session_yaml("s1", &[]);

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&manifest),
        )
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 created (server dry run)"
    );
    let out = server.kubectl(&["get", "acs", "s1"]).await;
    failed(&out);
    assert!(out.stderr.contains("(NotFound)"), "{out:?}");

    // The server fills in what it would have stored.
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&manifest),
        )
        .await;
    ok(&out);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["status"]["phase"], "Active");
    assert!(v["metadata"]["creationTimestamp"].is_string(), "{v}");

    // The name was not reserved by the dry run.
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 created"
    );

    let out = server
        .kubectl(&["delete", "acs", "s1", "--dry-run=server"])
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"accesssession.access.mcp-runtime.dev "s1" deleted (server dry run)"#
    );
    let t = get_table(&server, &["acs"]).await;
    assert_eq!(t.names(), ["s1"]);

    seed_agent(&server, "billing-bot", &[], &[]).await;
    let out = server
        .kubectl(&["delete", "agent", "billing-bot", "--dry-run=server"])
        .await;
    ok(&out);
    assert_eq!(
        get_table(&server, &["agents"]).await.names(),
        ["billing-bot"]
    );
    let out = server
        .kubectl(&["delete", "acs", "--all", "--dry-run=server"])
        .await;
    ok(&out);
    assert_eq!(get_table(&server, &["acs"]).await.names(), ["s1"]);
}

/// kubectl sends `fieldValidation=Strict` (the OpenAPI advertises it): an unknown field is
/// refused; `--validate=false` stores the object without it; `--validate=warn` warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_rejected_under_strict_validation() {
    let server = TestServer::start().await;
    let bogus =
        |name: &str| session_yaml(name, &[]).replace("  subject:\n", "  bogus: 1\n  subject:\n");
    assert!(bogus("x").contains("  bogus: 1\n"));

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-f", "-"],
            Some(&bogus("strict")),
        )
        .await;
    failed(&out);
    assert!(
        out.stderr.contains(r#"unknown field "spec.bogus""#),
        "{out:?}"
    );
    let out = server.kubectl(&["get", "acs", "strict"]).await;
    failed(&out);

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "--validate=false", "-f", "-"],
            Some(&bogus("lenient")),
        )
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/lenient created"
    );
    let s = get_json(&server, &["acs", "lenient"]).await;
    assert!(s["spec"].get("bogus").is_none(), "{s}");

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "--validate=warn", "-f", "-"],
            Some(&bogus("warned")),
        )
        .await;
    ok(&out);
    assert!(
        out.stderr
            .contains(r#"Warning: unknown field "spec.bogus""#),
        "{out:?}"
    );

    // apply (a PATCH under Strict) refuses it too.
    let path = write_file(&server, "bogus.yaml", &bogus("lenient"));
    let out = server.kubectl(&["apply", "-f", &path]).await;
    failed(&out);
    assert!(
        out.stderr.contains(r#"unknown field "spec.bogus""#),
        "{out:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Session rules through kubectl
// ---------------------------------------------------------------------------------------------

/// An agent's tool ceiling (`spec.tools`): a session naming a tool outside it is refused
/// (403 ScopeEscalation, the tool named); one naming none is granted the ceiling, with a
/// Warning kubectl prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_tool_ceiling_bounds_the_tools_a_session_is_granted() {
    let server = TestServer::start().await;
    let mut agent = mk_agent("tool-bot", &["payments"]);
    agent.spec.tools = Some(vec!["search".into(), "issues_*".into()]);
    server.store.create_agent(agent, false).await.unwrap();
    let manifest = |name: &str, tools: &str| {
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\nspec:\n  server: {{name: github, uid: {SERVER_UID}}}\n  agent: {{name: tool-bot}}\n  teams: [payments]\n{tools}  expiresAt: \"{}\"\n",
            in_secs(1800)
        )
    };
    let create = |m: String| {
        let server = &server;
        async move {
            server
                .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&m))
                .await
        }
    };
    let out = create(manifest("outside", "  tools: [search, delete_repo]\n")).await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (ScopeEscalation)"),
        "{out:?}"
    );
    assert!(out.stderr.contains(r#"tool "delete_repo""#), "{out:?}");

    let out = create(manifest("inside", "  tools: [issues_close]\n")).await;
    ok(&out);
    let out = create(manifest("unasked", "")).await;
    ok(&out);
    assert!(
        out.stderr
            .contains("Warning: spec.tools set to the tools agent"),
        "{out:?}"
    );
    let t = get_table(&server, &["acs", "-o", "wide"]).await;
    assert_eq!(t.cell("inside", "TOOLS"), "issues_close");
    assert_eq!(t.cell("unasked", "TOOLS"), "search,issues_*");
}

/// A session whose teams are not all the agent's is refused (403 ScopeEscalation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_escalation_is_refused() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments"], &[]).await;
    let manifest = |name: &str, teams: &str| {
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\nspec:\n  server: {{name: github, uid: {SERVER_UID}}}\n  agent: {{name: billing-bot}}\n  teams: {teams}\n  expiresAt: \"{}\"\n",
            in_secs(1800)
        )
    };

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-f", "-"],
            Some(&manifest("escalated", "[payments, finance]")),
        )
        .await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (ScopeEscalation)"),
        "{out:?}"
    );
    assert!(out.stderr.contains("is forbidden"), "{out:?}");
    assert!(out.stderr.contains(r#"["finance"]"#), "{out:?}");
    let out = server.kubectl(&["get", "acs", "escalated"]).await;
    failed(&out);

    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &["create", "-f", "-"],
            Some(&manifest("within", "[payments]")),
        )
        .await;
    ok(&out);
    let t = get_table(&server, &["acs", "within"]).await;
    assert_eq!(
        t.row("within")[..5],
        ["within", "github", "billing-bot", "team:payments", "Active"]
    );
}

/// An expiry beyond the agent's maxSessionTTL is clamped, with a Warning kubectl prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_clamp_warning_is_printed() {
    let server = TestServer::start().await;
    let mut agent = mk_agent("billing-bot", &["payments"]);
    agent.spec.max_session_ttl = Some("1h".into());
    server.store.create_agent(agent, false).await.unwrap();
    let requested = in_secs(5 * 3600);
    let manifest = format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: s1\nspec:\n  server: {{name: github, uid: {SERVER_UID}}}\n  agent: {{name: billing-bot}}\n  teams: [payments]\n  expiresAt: \"{requested}\"\n"
    );

    let before = Timestamp::now();
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "accesssession.access.mcp-runtime.dev/s1 created"
    );
    let warning = out
        .stderr
        .lines()
        .find(|l| l.starts_with("Warning: "))
        .unwrap_or_else(|| panic!("no warning: {out:?}"));
    assert!(warning.contains("clamped"), "{warning}");
    assert!(warning.contains(&requested), "{warning}");
    assert!(warning.contains("maxSessionTTL"), "{warning}");

    let s = get_json(&server, &["acs", "s1"]).await;
    let expires: Timestamp = s["spec"]["expiresAt"].as_str().unwrap().parse().unwrap();
    let limit = Timestamp::now() + SignedDuration::from_hours(1);
    assert!(expires <= limit, "{expires} > {limit}");
    assert!(
        expires >= before + SignedDuration::from_mins(59),
        "{expires}"
    );
    let t = get_table(&server, &["acs", "s1"]).await;
    let cell = t.cell("s1", "EXPIRES");
    assert!(cell == "59m" || cell == "60m", "{cell}");

    // Within the limit: no warning.
    let manifest = manifest
        .replace("name: s1", "name: s2")
        .replace(&requested, &in_secs(1800));
    let out = server
        .kubectl_with(&server.kubeconfig, &["create", "-f", "-"], Some(&manifest))
        .await;
    ok(&out);
    assert!(!out.stderr.contains("clamped"), "{out:?}");
}

/// The SESSIONS column of an Agent counts its active sessions (DESIGN §2:
/// `status.activeSessions`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sessions_column_counts_active_sessions() {
    let server = TestServer::start().await;
    seed_agent(&server, "billing-bot", &["payments"], &[]).await;
    for name in ["s1", "s2"] {
        server
            .store
            .create_session(
                mk_agent_session("default", name, SERVER_UID, "billing-bot", &["payments"]),
                false,
            )
            .await
            .unwrap();
    }
    support::revoke(&server.store, "default", "s2", "manual").await;
    let t = get_table(&server, &["agents"]).await;
    assert_eq!(t.cell("billing-bot", "SESSIONS"), "1", "{t:?}");
}

/// `kubectl explain --output=plaintext-openapiv2` asks `/openapi/v2` for protobuf only. The
/// document is served as JSON alone, so the answer is a clear 406 rather than bytes kubectl
/// cannot parse; the default `explain` (OpenAPI v3, JSON) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_with_openapi_v2() {
    let server = TestServer::start().await;
    let out = server
        .kubectl(&["explain", "agent.spec", "--output=plaintext-openapiv2"])
        .await;
    failed(&out);
    assert!(out.stderr.contains("NotAcceptable"), "{}", out.stderr);
    assert!(!out.stderr.contains("proto:"), "{}", out.stderr);
}
