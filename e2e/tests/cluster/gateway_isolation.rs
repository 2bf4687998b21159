//! The gateway sync listener's isolation matrix (issue 10, "What it must show"), against the
//! real local cluster: real Pod-bound tokens minted by kube-apiserver (`kubectl create token
//! --bound-object-kind Pod`), real Deployment → ReplicaSet → Pod chains made by
//! kube-controller-manager, and real HTTPS to the listener, its certificate verified with the
//! sync CA. Each case is a scenario working in namespaces of its own.
//!
//! Most scenarios use three servers: `alpha` (the gateway under test) and `gamma` in one
//! namespace, `beta` in another, with sessions of each, plus a session carrying alpha's UID in
//! beta's namespace (alpha's scope is its UID *in its namespace*). Whatever alpha's gateway
//! asks, it must get alpha's sessions in alpha's namespace and nothing else — never a 403 or
//! an error that would tell it another server's session exists.
//!
//! The "re-created" cases hold the old objects in a deleting state with a finalizer
//! ([`HOLD`]) so that the old chain still resolves by name and only a UID differs: what
//! refuses the token is then the UID check, not a missing object.
//!
//! The harness starts the apiserver with `--gateway-reverify-interval=2s` (see `main`), so a
//! broken chain must be noticed within [`REVERIFY`] (plus lookups: [`CHAIN_BREAK_BOUND`]).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::gateway::{GatewayChain, GATEWAY_AUDIENCE};
use e2e::LocalCluster;
use reqwest::Method;
use serde_json::{json, Value};

use super::{create_namespace, ok};

const GROUP_VERSION: &str = "/apis/access.mcp-runtime.dev/v1alpha1";

/// The apiserver's `--gateway-reverify-interval` in the e2e harness.
const REVERIFY: Duration = Duration::from_secs(2);

/// How long a broken chain may keep working: the re-verification period after the change,
/// plus time for the owner lookups on a loaded 2-core machine (a liveness bound, not a
/// performance figure; here it measures ~1-2 s, at most REVERIFY): 5x REVERIFY.
const CHAIN_BREAK_BOUND: Duration = Duration::from_secs(REVERIFY.as_secs() * 5);

/// The finalizer the scenarios put on objects they want to keep in a deleting state.
const HOLD: &str = "e2e.mcp-access.dev/hold";

// ---------------------------------------------------------------------------------------
// HTTPS clients

/// One response: status code and body (JSON, or `Value::Null` when it is not JSON).
#[derive(Debug)]
struct Reply {
    code: u16,
    body: Value,
    text: String,
}

/// A line read from a watch stream, or its end.
#[derive(Debug)]
enum WatchLine {
    Event(Value),
    /// The server closed the stream (cleanly or not: the detail says).
    End(String),
}

/// An open watch: its events arrive on a channel, read by a task on the client's runtime.
struct Watch {
    lines: mpsc::Receiver<WatchLine>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// Every event received within `wait`, stopping early at the end of the stream.
    fn drain(&self, wait: Duration) -> (Vec<Value>, Option<String>) {
        let deadline = Instant::now() + wait;
        let mut events = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(WatchLine::Event(v)) => events.push(v),
                Ok(WatchLine::End(detail)) => return (events, Some(detail)),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return (events, Some("reader gone".into()))
                }
            }
        }
        (events, None)
    }

    /// Events until one satisfies `pred` (included), or an error on timeout or end.
    fn until(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Vec<Value>, String> {
        let deadline = Instant::now() + timeout;
        let mut events = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(WatchLine::Event(v)) => {
                    let done = pred(&v);
                    events.push(v);
                    if done {
                        return Ok(events);
                    }
                }
                Ok(WatchLine::End(detail)) => {
                    return Err(format!(
                        "watch ended ({detail}) before {what}; got {events:?}"
                    ))
                }
                Err(_) => break,
            }
        }
        Err(format!(
            "no {what} within {timeout:?}; got {}",
            summary(&events)
        ))
    }
}

/// An HTTPS client of one server (the sync listener, MCP Access's API port or
/// kube-apiserver), verifying its certificate with `ca`.
struct Https {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Https {
    fn new(base: String, ca: &std::path::Path, identity: Option<Vec<u8>>) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        let mut builder = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).map_err(|e| e.to_string())?]);
        if let Some(pem) = identity {
            builder =
                builder.identity(reqwest::Identity::from_pem(&pem).map_err(|e| e.to_string())?);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        // Watches are read by a task while the scenario goes on making requests.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { rt, client, base })
    }

    /// The gateway sync listener (8085 in a cluster).
    fn sync(c: &LocalCluster) -> Result<Self, String> {
        Self::new(c.sync_url(), &c.sync_ca(), None)
    }

    /// MCP Access's own API port (8443 in a cluster), bypassing kube-apiserver.
    fn api(c: &LocalCluster) -> Result<Self, String> {
        Self::new(
            format!("https://127.0.0.1:{}", c.api_port),
            &c.sync_ca(),
            None,
        )
    }

    /// kube-apiserver.
    fn kube(c: &LocalCluster) -> Result<Self, String> {
        Self::new(
            env(c, "KUBE_APISERVER_URL")?,
            &PathBuf::from(env(c, "CLUSTER_CA_FILE")?),
            None,
        )
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<(&str, String)>,
    ) -> Result<Reply, String> {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some((content_type, body)) = body {
            request = request.header("Content-Type", content_type).body(body);
        }
        self.rt.block_on(async {
            let response = request
                .send()
                .await
                .map_err(|e| format!("{method} {path}: {e}"))?;
            let code = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            Ok(Reply { code, body, text })
        })
    }

    fn get(&self, path: &str, token: &str) -> Result<Reply, String> {
        self.request(Method::GET, path, Some(token), &[], None)
    }

    /// Opens a watch (`path` carries `watch=1`); fails unless the server answers 200.
    fn watch(&self, path: &str, token: &str) -> Result<Watch, String> {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(300));
        // Sent from inside the runtime: the request's timer needs its reactor.
        let response = self
            .rt
            .block_on(async { request.send().await })
            .map_err(|e| format!("watch {path}: {e}"))?;
        let code = response.status().as_u16();
        if code != 200 {
            let text = self.rt.block_on(response.text()).unwrap_or_default();
            return Err(format!("watch {path}: {code} {text}"));
        }
        let (tx, lines) = mpsc::channel();
        let task = self.rt.spawn(async move {
            let mut response = response;
            let mut buffer = Vec::new();
            let end = loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        buffer.extend_from_slice(&chunk);
                        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = buffer.drain(..=at).collect();
                            let event = serde_json::from_slice(&line).unwrap_or_else(
                                |_| json!({"unparsed": String::from_utf8_lossy(&line)}),
                            );
                            if tx.send(WatchLine::Event(event)).is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => break "closed".to_string(),
                    Err(e) => break format!("error: {e}"),
                }
            };
            let _ = tx.send(WatchLine::End(end));
        });
        Ok(Watch { lines, task })
    }
}

fn env(c: &LocalCluster, key: &str) -> Result<String, String> {
    c.env
        .get(key)
        .cloned()
        .ok_or_else(|| format!("{key} missing from the cluster env"))
}

// ---------------------------------------------------------------------------------------
// Fixtures

fn kubectl_ok(c: &LocalCluster, args: &[&str]) -> Result<String, String> {
    ok(&c.kubectl(args), &format!("kubectl {}", args.join(" ")))
}

fn apply(c: &LocalCluster, manifest: &Value) -> Result<Value, String> {
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["apply", "-o", "json", "-f", "-"],
        Some(&manifest.to_string()),
    );
    serde_json::from_str(&ok(&out, "kubectl apply")?).map_err(|e| e.to_string())
}

fn uid_of(object: &Value) -> Result<String, String> {
    object["metadata"]["uid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no uid in {object}"))
}

/// Creates session `name` in `ns` for the server `(server_name, server_uid)`, labelled with
/// the server's name.
fn create_session(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    server_name: &str,
    server_uid: &str,
) -> Result<(), String> {
    apply(
        c,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "AccessSession",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"team": "payments", "server": server_name},
            },
            "spec": {
                "server": {"name": server_name, "uid": server_uid},
                "teams": ["payments"],
                "expiresAt": "2099-01-01T00:00:00Z",
            },
        }),
    )
    .map(|_| ())
}

/// Three servers and their sessions (see the module doc).
struct World {
    /// alpha's and gamma's namespace.
    ns_a: String,
    /// beta's namespace.
    ns_b: String,
    alpha: GatewayChain,
    beta: GatewayChain,
    gamma: GatewayChain,
}

impl World {
    /// alpha's sessions, as `namespace/name`.
    fn alphas(&self) -> BTreeSet<String> {
        ["alpha-1", "alpha-2"]
            .iter()
            .map(|n| format!("{}/{n}", self.ns_a))
            .collect()
    }

    /// Names (as `namespace/name`) of everything alpha must never see.
    fn others(&self) -> BTreeSet<String> {
        [
            format!("{}/beta-1", self.ns_b),
            format!("{}/beta-2", self.ns_b),
            format!("{}/alpha-uid-elsewhere", self.ns_b),
            format!("{}/gamma-1", self.ns_a),
        ]
        .into_iter()
        .collect()
    }
}

/// Namespaces `<prefix>-a` and `<prefix>-b`, servers alpha and gamma in the first and beta
/// in the second, each with its gateway chain, and sessions of each.
fn world(c: &LocalCluster, prefix: &str) -> Result<World, String> {
    let (ns_a, ns_b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    create_namespace(c, &ns_a)?;
    create_namespace(c, &ns_b)?;
    let chain = |ns: &str, server: &str| {
        c.create_gateway_chain(ns, server)
            .map_err(|e| format!("gateway chain {ns}/{server}: {e:#}"))
    };
    let world = World {
        alpha: chain(&ns_a, "alpha")?,
        beta: chain(&ns_b, "beta")?,
        gamma: chain(&ns_a, "gamma")?,
        ns_a,
        ns_b,
    };
    let (a, b, g) = (&world.alpha, &world.beta, &world.gamma);
    create_session(c, &world.ns_a, "alpha-1", "alpha", &a.server_uid)?;
    create_session(c, &world.ns_a, "alpha-2", "alpha", &a.server_uid)?;
    create_session(c, &world.ns_a, "gamma-1", "gamma", &g.server_uid)?;
    create_session(c, &world.ns_b, "beta-1", "beta", &b.server_uid)?;
    create_session(c, &world.ns_b, "beta-2", "beta", &b.server_uid)?;
    // alpha's UID in another namespace: not alpha's (the scope is the UID in its namespace).
    create_session(
        c,
        &world.ns_b,
        "alpha-uid-elsewhere",
        "alpha",
        &a.server_uid,
    )?;
    Ok(world)
}

fn gateway_token(c: &LocalCluster, chain: &GatewayChain) -> Result<String, String> {
    c.gateway_token(chain)
        .map_err(|e| format!("gateway token for {}: {e:#}", chain.pod))
}

fn sessions_path(ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("{GROUP_VERSION}/namespaces/{ns}/accesssessions"),
        None => format!("{GROUP_VERSION}/accesssessions"),
    }
}

/// `namespace/name` of every item of a list.
fn listed(reply: &Reply) -> Result<BTreeSet<String>, String> {
    if reply.code != 200 || reply.body["kind"] != "AccessSessionList" {
        return Err(format!(
            "expected an AccessSessionList, got {} {}",
            reply.code, reply.text
        ));
    }
    Ok(reply.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(key)
        .collect())
}

fn key(object: &Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// A short account of watch events for error messages.
fn summary(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or("?"),
                key(&e["object"])
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The listener's refusal: 401 and a `Status` with reason `Unauthorized`.
fn expect_unauthorized(reply: &Reply, what: &str) -> Result<(), String> {
    ensure!(
        reply.code == 401
            && reply.body["kind"] == "Status"
            && reply.body["reason"] == "Unauthorized",
        "{what}: expected 401 Unauthorized, got {} {}",
        reply.code,
        reply.text
    );
    Ok(())
}

/// Polls `path` with `token` until the listener answers 401, within [`CHAIN_BREAK_BOUND`];
/// returns how long it took.
fn eventually_unauthorized(
    sync: &Https,
    token: &str,
    path: &str,
    what: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let reply = sync.get(path, token)?;
        if reply.code == 401 {
            expect_unauthorized(&reply, what)?;
            return Ok(started.elapsed());
        }
        ensure!(
            reply.code == 200,
            "{what}: expected 200 until the chain breaks, then 401; got {} {}",
            reply.code,
            reply.text
        );
        ensure!(
            started.elapsed() < CHAIN_BREAK_BOUND,
            "{what}: the token still works {CHAIN_BREAK_BOUND:?} later"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Adds [`HOLD`] to an object's finalizers.
fn hold(c: &LocalCluster, ns: &str, resource: &str, name: &str) -> Result<(), String> {
    kubectl_ok(
        c,
        &[
            "patch",
            resource,
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &json!({"metadata": {"finalizers": [HOLD]}}).to_string(),
        ],
    )
    .map(|_| ())
}

/// Removes every finalizer of an object (so namespaces can go away after the suite).
fn release(c: &LocalCluster, ns: &str, resource: &str, name: &str) {
    let _ = c.kubectl(&[
        "patch",
        resource,
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
}

/// Waits until a deleted object is gone.
fn wait_gone(c: &LocalCluster, ns: &str, resource: &str, name: &str) -> Result<(), String> {
    kubectl_ok(
        c,
        &[
            "wait",
            "--for=delete",
            "--timeout=60s",
            resource,
            name,
            "-n",
            ns,
        ],
    )
    .map(|_| ())
}

/// One server alone in a namespace: (chain, listener client, its gateway token).
fn one_gateway(c: &LocalCluster, ns: &str) -> Result<(GatewayChain, Https, String), String> {
    create_namespace(c, ns)?;
    let chain = c
        .create_gateway_chain(ns, "solo")
        .map_err(|e| format!("gateway chain: {e:#}"))?;
    create_session(c, ns, "solo-1", "solo", &chain.server_uid)?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &chain)?;
    // The control: this token works, so a 401 below is about what the scenario changed.
    let listed = listed(&sync.get(&sessions_path(Some(ns)), &token)?)?;
    ensure!(
        listed == BTreeSet::from([format!("{ns}/solo-1")]),
        "the gateway token must list its session: {listed:?}"
    );
    Ok((chain, sync, token))
}

// ---------------------------------------------------------------------------------------
// Reads never leave the server's scope

/// List: alpha's namespace, beta's namespace, a namespace that does not exist and every
/// namespace (`kubectl get -A`): alpha's sessions or nothing; also through real kubectl.
pub fn gateway_lists_only_its_servers_sessions(c: &mut LocalCluster) -> Result<(), String> {
    let w = world(c, "e2e-gwi-list")?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &w.alpha)?;
    let cases: [(Option<&str>, BTreeSet<String>); 4] = [
        (Some(&w.ns_a), w.alphas()),
        (Some(&w.ns_b), BTreeSet::new()),
        (Some("e2e-gwi-no-such-namespace"), BTreeSet::new()),
        (None, w.alphas()),
    ];
    for (ns, want) in cases {
        let path = sessions_path(ns);
        let got = listed(&sync.get(&path, &token)?)?;
        ensure!(got == want, "GET {path}: want {want:?}, got {got:?}");
        // Paginated, as informers and kube-rs list: still the same set.
        let first = sync.get(&format!("{path}?limit=1"), &token)?;
        let mut paged = listed(&first)?;
        let mut cont = first.body["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        while !cont.is_empty() {
            let page = sync.get(&format!("{path}?limit=1&continue={cont}"), &token)?;
            paged.extend(listed(&page)?);
            cont = page.body["metadata"]["continue"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        ensure!(
            paged == want,
            "GET {path}?limit=1 pages: want {want:?}, got {paged:?}"
        );
    }

    // Real kubectl with a kubeconfig holding nothing but the listener, its CA and the token.
    let kubeconfig = gateway_kubeconfig(c, "list", &token)?;
    let out = c.kubectl_as(
        &kubeconfig,
        &["get", "accesssessions", "-A", "-o", "json"],
        None,
    );
    let all: Value = serde_json::from_str(&ok(&out, "kubectl get accesssessions -A")?)
        .map_err(|e| e.to_string())?;
    let got: BTreeSet<String> = all["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(key)
        .collect();
    ensure!(
        got == w.alphas(),
        "kubectl get -A: want {:?}, got {got:?}",
        w.alphas()
    );
    let out = c.kubectl_as(
        &kubeconfig,
        &["get", "accesssessions", "-n", &w.ns_b, "-o", "json"],
        None,
    );
    let theirs: Value =
        serde_json::from_str(&ok(&out, "kubectl get -n beta")?).map_err(|e| e.to_string())?;
    ensure!(
        theirs["items"].as_array().is_some_and(Vec::is_empty),
        "kubectl get -n {}: {theirs}",
        w.ns_b
    );
    Ok(())
}

/// A kubeconfig for kubectl holding only the sync URL, the sync CA and a token.
fn gateway_kubeconfig(c: &LocalCluster, name: &str, token: &str) -> Result<PathBuf, String> {
    let path = c.dir.join(format!("gateway-{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sync\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: gateway\n  user:\n    token: {token}\ncontexts:\n- name: sync\n  context: {{cluster: sync, user: gateway}}\ncurrent-context: sync\n",
            c.sync_url(),
            c.sync_ca().display()
        ),
    )
    .map_err(|e| e.to_string())?;
    Ok(path)
}

/// Get by name: another server's session — in the other namespace, in alpha's own
/// namespace, or carrying alpha's UID in another namespace — is a 404 NotFound that reads
/// exactly as a session that does not exist.
pub fn gateway_get_of_another_servers_session_is_not_found(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let w = world(c, "e2e-gwi-get")?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &w.alpha)?;
    let own = sync.get(&format!("{}/alpha-1", sessions_path(Some(&w.ns_a))), &token)?;
    ensure!(
        own.code == 200 && own.body["metadata"]["name"] == "alpha-1",
        "alpha's own session: {} {}",
        own.code,
        own.text
    );
    for other in w.others() {
        let (ns, name) = other.split_once('/').ok_or("bad key")?;
        let hidden = sync.get(&format!("{}/{name}", sessions_path(Some(ns))), &token)?;
        let missing_name = format!("{name}-missing");
        let missing = sync.get(
            &format!("{}/{missing_name}", sessions_path(Some(ns))),
            &token,
        )?;
        ensure!(
            hidden.code == 404 && hidden.body["reason"] == "NotFound",
            "GET {other}: expected 404 NotFound, got {} {}",
            hidden.code,
            hidden.text
        );
        // Byte for byte what a missing session gets, once the name is swapped.
        ensure!(
            hidden.text.replace(name, "NAME") == missing.text.replace(&missing_name, "NAME"),
            "GET {other} must read as a missing session:\n  hidden:  {}\n  missing: {}",
            hidden.text,
            missing.text
        );
    }
    let kubeconfig = gateway_kubeconfig(c, "get", &token)?;
    let out = c.kubectl_as(
        &kubeconfig,
        &[
            "get",
            "accesssessions",
            "beta-1",
            "-n",
            &w.ns_b,
            "-o",
            "json",
        ],
        None,
    );
    ensure!(
        !out.success && out.stderr.contains("NotFound"),
        "kubectl get of beta's session: {out:?}"
    );
    Ok(())
}

/// Label and field selectors — beta's UID, gamma's UID, beta's namespace, beta's session
/// names, negations — never widen the scope: alpha's sessions or nothing.
pub fn gateway_selectors_never_widen_its_scope(c: &mut LocalCluster) -> Result<(), String> {
    let w = world(c, "e2e-gwi-sel")?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &w.alpha)?;
    let none = BTreeSet::new();
    let alpha_1 = BTreeSet::from([format!("{}/alpha-1", w.ns_a)]);
    let all = sessions_path(None);
    let in_a = sessions_path(Some(&w.ns_a));
    let in_b = sessions_path(Some(&w.ns_b));
    let (a_uid, b_uid, g_uid) = (&w.alpha.server_uid, &w.beta.server_uid, &w.gamma.server_uid);
    let cases: Vec<(String, BTreeSet<String>)> = vec![
        (format!("{all}?labelSelector=team%3Dpayments"), w.alphas()),
        (format!("{all}?labelSelector=server%3Dbeta"), none.clone()),
        (format!("{all}?labelSelector=server%3Dgamma"), none.clone()),
        (
            format!("{in_a}?labelSelector=server%21%3Dalpha"),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=spec.server.uid%3D{b_uid}"),
            none.clone(),
        ),
        (
            format!("{in_b}?fieldSelector=spec.server.uid%3D{b_uid}"),
            none.clone(),
        ),
        (
            format!("{in_a}?fieldSelector=spec.server.uid%3D{g_uid}"),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=spec.server.uid%3D{a_uid}"),
            w.alphas(),
        ),
        (
            format!("{all}?fieldSelector=spec.server.uid%21%3D{a_uid}"),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=spec.server.name%3Dbeta"),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=metadata.namespace%3D{}", w.ns_b),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=metadata.namespace%3D{}", w.ns_a),
            w.alphas(),
        ),
        (
            format!("{all}?fieldSelector=metadata.namespace%21%3D{}", w.ns_a),
            none.clone(),
        ),
        (
            format!("{all}?fieldSelector=metadata.name%3Dbeta-1"),
            none.clone(),
        ),
        (
            format!("{in_b}?fieldSelector=metadata.name%3Dalpha-uid-elsewhere"),
            none.clone(),
        ),
        (
            format!("{in_a}?fieldSelector=metadata.name%3Dgamma-1"),
            none.clone(),
        ),
        (
            format!("{in_a}?fieldSelector=metadata.name%3Dalpha-1"),
            alpha_1,
        ),
    ];
    for (path, want) in cases {
        let got = listed(&sync.get(&path, &token)?)?;
        ensure!(got == want, "GET {path}: want {want:?}, got {got:?}");
    }
    Ok(())
}

/// Watches — every namespace, beta's namespace, by beta's UID, by a name of beta's — see
/// only alpha's sessions while beta's and gamma's are created, changed and deleted.
pub fn gateway_watches_only_its_servers_sessions(c: &mut LocalCluster) -> Result<(), String> {
    let w = world(c, "e2e-gwi-watch")?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &w.alpha)?;
    let all = sync.watch(&format!("{}?watch=1", sessions_path(None)), &token)?;
    let from_zero = sync.watch(
        &format!("{}?watch=1&resourceVersion=0", sessions_path(None)),
        &token,
    )?;
    let others: Vec<(String, Watch)> = [
        format!("{}?watch=1", sessions_path(Some(&w.ns_b))),
        format!(
            "{}?watch=1&fieldSelector=spec.server.uid%3D{}",
            sessions_path(None),
            w.beta.server_uid
        ),
        format!(
            "{}?watch=1&fieldSelector=metadata.name%3Dbeta-3",
            sessions_path(Some(&w.ns_b))
        ),
        format!(
            "{}?watch=1&fieldSelector=metadata.namespace%3D{}",
            sessions_path(None),
            w.ns_b
        ),
        format!(
            "{}?watch=1&labelSelector=server%3Dgamma",
            sessions_path(Some(&w.ns_a))
        ),
    ]
    .into_iter()
    .map(|path| sync.watch(&path, &token).map(|watch| (path, watch)))
    .collect::<Result<_, _>>()?;

    // Without a resourceVersion a watch starts with the current state: alpha's only.
    for (name, watch) in [("watch", &all), ("watch from 0", &from_zero)] {
        let initial = watch.until("alpha's two sessions", Duration::from_secs(20), {
            let mut seen = BTreeSet::new();
            let want = w.alphas();
            move |e| {
                seen.insert(key(&e["object"]));
                seen == want
            }
        })?;
        ensure!(
            initial.iter().all(|e| e["type"] == "ADDED"),
            "{name}: initial events {}",
            summary(&initial)
        );
    }

    // Everything but alpha changes; then alpha's marker, which comes after all of it.
    let (b_uid, g_uid) = (&w.beta.server_uid, &w.gamma.server_uid);
    create_session(c, &w.ns_b, "beta-3", "beta", b_uid)?;
    create_session(c, &w.ns_a, "gamma-2", "gamma", g_uid)?;
    create_session(
        c,
        &w.ns_b,
        "alpha-uid-elsewhere-2",
        "alpha",
        &w.alpha.server_uid,
    )?;
    kubectl_ok(
        c,
        &[
            "label",
            "accesssessions",
            "beta-1",
            "-n",
            &w.ns_b,
            "color=red",
        ],
    )?;
    kubectl_ok(
        c,
        &[
            "label",
            "accesssessions",
            "gamma-1",
            "-n",
            &w.ns_a,
            "color=red",
        ],
    )?;
    kubectl_ok(c, &["delete", "accesssessions", "beta-2", "-n", &w.ns_b])?;
    kubectl_ok(c, &["delete", "accesssessions", "beta-3", "-n", &w.ns_b])?;
    create_session(c, &w.ns_a, "alpha-3", "alpha", &w.alpha.server_uid)?;
    let marker = format!("{}/alpha-3", w.ns_a);
    for (name, watch) in [("watch", &all), ("watch from 0", &from_zero)] {
        let events = watch.until("ADDED alpha-3", Duration::from_secs(20), |e| {
            e["type"] == "ADDED" && key(&e["object"]) == marker
        })?;
        ensure!(
            events.len() == 1,
            "{name}: only alpha-3 was due, got {}",
            summary(&events)
        );
    }
    // The other watches had the same changes delivered before alpha-3 reached the first
    // two; a second more covers the streams' own scheduling.
    for (path, watch) in &others {
        let (events, end) = watch.drain(Duration::from_secs(1));
        ensure!(
            events.is_empty() && end.is_none(),
            "{path}: alpha's gateway got {} (end: {end:?})",
            summary(&events)
        );
    }
    // Positive control on the same streams: a session of alpha's labelled `server=gamma` is
    // due on the label-selector watch, so the silence above was the filter, not a dead stream.
    apply(
        c,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "AccessSession",
            "metadata": {
                "name": "alpha-labelled-gamma",
                "namespace": &w.ns_a,
                "labels": {"team": "payments", "server": "gamma"},
            },
            "spec": {
                "server": {"name": "alpha", "uid": &w.alpha.server_uid},
                "teams": ["payments"],
                "expiresAt": "2099-01-01T00:00:00Z",
            },
        }),
    )?;
    let marker = format!("{}/alpha-labelled-gamma", w.ns_a);
    let (path, labelled) = others.last().ok_or("no label-selector watch")?;
    ensure!(path.contains("labelSelector"), "{path}");
    labelled.until("ADDED alpha-labelled-gamma", Duration::from_secs(20), |e| {
        e["type"] == "ADDED" && key(&e["object"]) == marker
    })?;
    Ok(())
}

/// The streaming list client-go informers use (WatchList): its initial events are alpha's
/// sessions only, in every namespace or none in beta's, each ending with the
/// initial-events-end bookmark.
pub fn gateway_streaming_list_sends_only_its_servers_sessions(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let w = world(c, "e2e-gwi-stream")?;
    let sync = Https::sync(c)?;
    let token = gateway_token(c, &w.alpha)?;
    let query =
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let cases: Vec<(String, BTreeSet<String>)> = vec![
        (format!("{}?{query}", sessions_path(None)), w.alphas()),
        (
            format!("{}?{query}", sessions_path(Some(&w.ns_a))),
            w.alphas(),
        ),
        (
            format!("{}?{query}", sessions_path(Some(&w.ns_b))),
            BTreeSet::new(),
        ),
        (
            format!(
                "{}?{query}&fieldSelector=spec.server.uid%3D{}",
                sessions_path(None),
                w.beta.server_uid
            ),
            BTreeSet::new(),
        ),
        (
            format!(
                "{}?{query}&labelSelector=server%3Dgamma",
                sessions_path(None)
            ),
            BTreeSet::new(),
        ),
    ];
    for (path, want) in cases {
        let watch = sync.watch(&path, &token)?;
        let events = watch.until(
            "the initial-events-end bookmark",
            Duration::from_secs(20),
            |e| {
                e["type"] == "BOOKMARK"
                    && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
            },
        )?;
        let added: BTreeSet<String> = events
            .iter()
            .filter(|e| e["type"] == "ADDED")
            .map(|e| key(&e["object"]))
            .collect();
        ensure!(
            added == want
                && events
                    .iter()
                    .all(|e| e["type"] == "ADDED" || e["type"] == "BOOKMARK"),
            "{path}: want {want:?}, got {}",
            summary(&events)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Tokens that are not a live gateway of an MCPServer: 401

/// A Pod-bound token for another audience, or for kube-apiserver's own: 401.
pub fn gateway_token_with_wrong_audience_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-aud";
    let (chain, sync, _) = one_gateway(c, ns)?;
    for audience in [Some("not-mcp-runtime-gateway"), None] {
        let token = c
            .service_account_token(
                ns,
                &chain.service_account,
                audience,
                Some((&chain.pod, &chain.pod_uid)),
            )
            .map_err(|e| format!("{e:#}"))?;
        let reply = sync.get(&sessions_path(Some(ns)), &token)?;
        expect_unauthorized(&reply, &format!("audience {audience:?}"))?;
    }
    Ok(())
}

/// A token with the right audience but bound to no Pod (no Pod name/UID extras): 401.
pub fn gateway_token_without_pod_binding_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-unbound";
    let (chain, sync, _) = one_gateway(c, ns)?;
    let token = c
        .service_account_token(ns, &chain.service_account, Some(GATEWAY_AUDIENCE), None)
        .map_err(|e| format!("{e:#}"))?;
    expect_unauthorized(
        &sync.get(&sessions_path(Some(ns)), &token)?,
        "unbound token",
    )?;
    Ok(())
}

/// The token's Pod is deleted (the ReplicaSet makes another): the old token is refused
/// within the re-verification period, the new Pod's token works.
pub fn gateway_token_of_a_deleted_pod_is_unauthorized(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gwi-pod";
    let (chain, sync, token) = one_gateway(c, ns)?;
    kubectl_ok(c, &["delete", "pod", &chain.pod, "-n", ns, "--wait=false"])?;
    let took = eventually_unauthorized(&sync, &token, &sessions_path(Some(ns)), "deleted Pod")?;
    eprintln!("gateway_isolation: a deleted Pod's token refused after {took:?}");
    let (pod, pod_uid) = c
        .wait_owned(ns, "pods", &chain.replicaset_uid)
        .map_err(|e| format!("{e:#}"))?;
    ensure!(pod_uid != chain.pod_uid, "no new Pod");
    let fresh = GatewayChain {
        pod,
        pod_uid,
        ..chain
    };
    let ok_reply = sync.get(&sessions_path(Some(ns)), &gateway_token(c, &fresh)?)?;
    ensure!(
        ok_reply.code == 200,
        "the new Pod's token: {} {}",
        ok_reply.code,
        ok_reply.text
    );
    Ok(())
}

/// The token's Pod is deleted and a namesake created in its place (same name, same
/// ReplicaSet, a new UID): the old token is refused, the namesake's own token works, so only
/// the Pod's UID told them apart. The ReplicaSet is held deleting by a finalizer, so that its
/// controller neither replaces the Pod nor removes the namesake.
pub fn gateway_token_of_a_recreated_pod_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-repod";
    let (chain, sync, token) = one_gateway(c, ns)?;
    hold(c, ns, "replicaset", &chain.replicaset)?;
    let result = (|| {
        kubectl_ok(
            c,
            &[
                "delete",
                "replicaset",
                &chain.replicaset,
                "-n",
                ns,
                "--wait=false",
            ],
        )?;
        kubectl_ok(c, &["delete", "pod", &chain.pod, "-n", ns])?;
        let namesake = apply(
            c,
            &json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": chain.pod, "namespace": ns,
                    "labels": {
                        "app": chain.deployment,
                        e2e::gateway::MANAGED_BY_LABEL: e2e::gateway::MANAGED_BY,
                        e2e::gateway::SERVER_LABEL: chain.server,
                    },
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": chain.replicaset, "uid": chain.replicaset_uid,
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {
                    "serviceAccountName": chain.service_account,
                    "containers": [{"name": "gateway", "image": "registry.invalid/mcp/gateway:1"}],
                },
            }),
        )?;
        let namesake_uid = uid_of(&namesake)?;
        ensure!(namesake_uid != chain.pod_uid, "the namesake kept the UID");
        let took =
            eventually_unauthorized(&sync, &token, &sessions_path(Some(ns)), "re-created Pod")?;
        eprintln!("gateway_isolation: a re-created Pod's old token refused after {took:?}");
        let fresh = GatewayChain {
            pod_uid: namesake_uid,
            ..chain.clone()
        };
        let reply = sync.get(&sessions_path(Some(ns)), &gateway_token(c, &fresh)?)?;
        ensure!(
            reply.code == 200,
            "the namesake's own token: {} {}",
            reply.code,
            reply.text
        );
        Ok(())
    })();
    release(c, ns, "replicaset", &chain.replicaset);
    result
}

/// The ReplicaSet is deleted and the Deployment controller re-creates it under the same
/// name with a new UID, while the old Pod is held by a finalizer (so its chain still
/// resolves by name, only the ReplicaSet's UID differs): the old Pod's token is refused, the
/// new Pod's works.
pub fn gateway_token_after_replicaset_recreated_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-rs";
    let (chain, sync, token) = one_gateway(c, ns)?;
    hold(c, ns, "pod", &chain.pod)?;
    let result = (|| {
        kubectl_ok(
            c,
            &[
                "delete",
                "replicaset",
                &chain.replicaset,
                "-n",
                ns,
                "--wait=false",
            ],
        )?;
        let (rs, rs_uid) = wait_new_owned(
            c,
            ns,
            "replicasets",
            &chain.deployment_uid,
            &chain.replicaset_uid,
        )?;
        ensure!(
            rs == chain.replicaset,
            "expected the ReplicaSet re-created under its name {}, got {rs}",
            chain.replicaset
        );
        kubectl_ok(c, &["get", "pod", &chain.pod, "-n", ns])?;
        let took = eventually_unauthorized(
            &sync,
            &token,
            &sessions_path(Some(ns)),
            "re-created ReplicaSet",
        )?;
        eprintln!("gateway_isolation: a re-created ReplicaSet's old token refused after {took:?}");
        let (pod, pod_uid) = c
            .wait_owned(ns, "pods", &rs_uid)
            .map_err(|e| format!("{e:#}"))?;
        let fresh = GatewayChain {
            replicaset_uid: rs_uid,
            pod,
            pod_uid,
            ..chain.clone()
        };
        let reply = sync.get(&sessions_path(Some(ns)), &gateway_token(c, &fresh)?)?;
        ensure!(
            reply.code == 200,
            "the new Pod's token: {} {}",
            reply.code,
            reply.text
        );
        // The old token stays refused.
        expect_unauthorized(&sync.get(&sessions_path(Some(ns)), &token)?, "old token")
    })();
    release(c, ns, "pod", &chain.pod);
    result
}

/// Waits for an object of `resource` controlled by `owner_uid` other than `old_uid`.
fn wait_new_owned(
    c: &LocalCluster,
    ns: &str,
    resource: &str,
    owner_uid: &str,
    old_uid: &str,
) -> Result<(String, String), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (name, uid) = c
            .wait_owned(ns, resource, owner_uid)
            .map_err(|e| format!("{e:#}"))?;
        if uid != old_uid {
            return Ok((name, uid));
        }
        ensure!(
            Instant::now() < deadline,
            "no new {resource} of {owner_uid}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Deployment is deleted and re-created under the same name (same MCPServer owner)
/// while the old ReplicaSet is held by a finalizer (so the old Pod lives and its chain
/// resolves by name; only the Deployment's UID differs): the old Pod's token is refused, the
/// new chain's works.
pub fn gateway_token_after_deployment_recreated_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-deploy";
    let (chain, sync, token) = one_gateway(c, ns)?;
    hold(c, ns, "replicaset", &chain.replicaset)?;
    let result = (|| {
        kubectl_ok(
            c,
            &[
                "delete",
                "deployment",
                &chain.deployment,
                "-n",
                ns,
                "--wait=false",
            ],
        )?;
        wait_gone(c, ns, "deployment", &chain.deployment)?;
        let (deployment_uid, replicaset, replicaset_uid, pod, pod_uid) = c
            .create_server_deployment(ns, &chain.server, &chain.server_uid)
            .map_err(|e| format!("{e:#}"))?;
        ensure!(
            deployment_uid != chain.deployment_uid,
            "the Deployment was not re-created"
        );
        kubectl_ok(c, &["get", "pod", &chain.pod, "-n", ns])?;
        let took = eventually_unauthorized(
            &sync,
            &token,
            &sessions_path(Some(ns)),
            "re-created Deployment",
        )?;
        eprintln!("gateway_isolation: a re-created Deployment's old token refused after {took:?}");
        let fresh = GatewayChain {
            deployment_uid,
            replicaset,
            replicaset_uid,
            pod,
            pod_uid,
            ..chain.clone()
        };
        let reply = sync.get(&sessions_path(Some(ns)), &gateway_token(c, &fresh)?)?;
        ensure!(
            reply.code == 200,
            "the new chain's token: {} {}",
            reply.code,
            reply.text
        );
        Ok(())
    })();
    release(c, ns, "replicaset", &chain.replicaset);
    result
}

/// The MCPServer is deleted and re-created under the same name (a new UID) while its
/// Deployment is held (a finalizer keeps the old Deployment → ReplicaSet → Pod alive, still
/// naming the old UID): the token is refused. A gateway of the new server does not see the
/// old server's sessions.
pub fn gateway_token_after_mcpserver_recreated_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-server";
    let (chain, sync, token) = one_gateway(c, ns)?;
    hold(c, ns, "deployment", &chain.deployment)?;
    let result = (|| {
        kubectl_ok(
            c,
            &[
                "delete",
                "mcpserver",
                &chain.server,
                "-n",
                ns,
                "--wait=false",
            ],
        )?;
        wait_gone(c, ns, "mcpserver", &chain.server)?;
        let new_uid = c
            .create_mcpserver(ns, &chain.server)
            .map_err(|e| format!("{e:#}"))?;
        ensure!(new_uid != chain.server_uid, "the MCPServer kept its UID");
        // The held Pod is alive and its chain complete by name; only the UIDs differ.
        kubectl_ok(c, &["get", "pod", &chain.pod, "-n", ns])?;
        let took = eventually_unauthorized(
            &sync,
            &token,
            &sessions_path(Some(ns)),
            "re-created MCPServer",
        )?;
        eprintln!("gateway_isolation: a re-created MCPServer's old token refused after {took:?}");

        // The republished server's own gateway sees its sessions, not the retired server's.
        // Its Deployment takes the server's name, so the old one must be gone first (the
        // garbage collector removes it once released: its owner is gone).
        create_session(c, ns, "solo-new", "solo", &new_uid)?;
        release(c, ns, "deployment", &chain.deployment);
        wait_gone(c, ns, "deployment", &chain.deployment)?;
        let (deployment_uid, replicaset, replicaset_uid, pod, pod_uid) = c
            .create_server_deployment(ns, &chain.server, &new_uid)
            .map_err(|e| format!("{e:#}"))?;
        let fresh = GatewayChain {
            server_uid: new_uid,
            deployment_uid,
            replicaset,
            replicaset_uid,
            pod,
            pod_uid,
            ..chain.clone()
        };
        let got = listed(&sync.get(&sessions_path(None), &gateway_token(c, &fresh)?)?)?;
        ensure!(
            got == BTreeSet::from([format!("{ns}/solo-new")]),
            "the new server's gateway must see only the new server's session: {got:?}"
        );
        Ok(())
    })();
    release(c, ns, "deployment", &chain.deployment);
    result
}

/// The MCPServer is being deleted (a finalizer keeps it): its gateway's token is refused
/// although every object of the chain still exists.
pub fn gateway_token_of_a_deleting_mcpserver_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-deleting";
    let (chain, sync, token) = one_gateway(c, ns)?;
    hold(c, ns, "mcpserver", &chain.server)?;
    let result = (|| {
        kubectl_ok(
            c,
            &[
                "delete",
                "mcpserver",
                &chain.server,
                "-n",
                ns,
                "--wait=false",
            ],
        )?;
        let deleting = kubectl_ok(
            c,
            &[
                "get",
                "mcpserver",
                &chain.server,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
        )?;
        ensure!(
            !deleting.trim().is_empty(),
            "the MCPServer is not marked deleting"
        );
        let took = eventually_unauthorized(
            &sync,
            &token,
            &sessions_path(Some(ns)),
            "deleting MCPServer",
        )?;
        eprintln!("gateway_isolation: a deleting MCPServer's token refused after {took:?}");
        kubectl_ok(c, &["get", "pod", &chain.pod, "-n", ns])?;
        Ok(())
    })();
    release(c, ns, "mcpserver", &chain.server);
    result
}

/// Pods whose ReplicaSet is not controlled by a Deployment of an MCPServer: a bare
/// ReplicaSet, a Deployment without an owner, a Deployment that names the MCPServer as an
/// owner but not as its controller. Each Pod's bound token is refused.
pub fn gateway_token_of_a_pod_outside_an_mcpserver_chain_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-orphan";
    let (chain, sync, _) = one_gateway(c, ns)?;
    let sa = &chain.service_account;
    let pod_template = |app: &str| {
        json!({
            "metadata": {"labels": {"app": app}},
            "spec": {
                "serviceAccountName": sa,
                "containers": [{"name": "gateway", "image": "registry.invalid/mcp/gateway:1"}],
            },
        })
    };
    let mut pods = Vec::new();

    let rs = apply(
        c,
        &json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "bare-rs", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "bare-rs"}}, "template": pod_template("bare-rs")},
        }),
    )?;
    pods.push((
        "a bare ReplicaSet",
        c.wait_owned(ns, "pods", &uid_of(&rs)?)
            .map_err(|e| format!("{e:#}"))?,
    ));

    let (_, _, _, pod, pod_uid) = c
        .create_gateway_deployment(ns, "ownerless", sa, None, Some(&chain.server))
        .map_err(|e| format!("{e:#}"))?;
    pods.push(("a Deployment without an owner", (pod, pod_uid)));

    let deployment = apply(
        c,
        &json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "not-controlled", "namespace": ns,
                "ownerReferences": [{
                    "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
                    "name": chain.server, "uid": chain.server_uid, "controller": false,
                }],
            },
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "not-controlled"}}, "template": pod_template("not-controlled")},
        }),
    )?;
    let (_, rs_uid) = c
        .wait_owned(ns, "replicasets", &uid_of(&deployment)?)
        .map_err(|e| format!("{e:#}"))?;
    pods.push((
        "a Deployment the MCPServer owns but does not control",
        c.wait_owned(ns, "pods", &rs_uid)
            .map_err(|e| format!("{e:#}"))?,
    ));

    for (what, (pod, pod_uid)) in pods {
        let token = c
            .service_account_token(ns, sa, Some(GATEWAY_AUDIENCE), Some((&pod, &pod_uid)))
            .map_err(|e| format!("{e:#}"))?;
        expect_unauthorized(&sync.get(&sessions_path(Some(ns)), &token)?, what)?;
        expect_unauthorized(&sync.get(&sessions_path(None), &token)?, what)?;
    }
    Ok(())
}

/// Deployments a namespace member points at an MCPServer as its controller, each differing
/// from the one the controllers make in one respect: another name (with every label and the
/// server's ServiceAccount), no controllers' labels, labels naming another server, another
/// ServiceAccount. Each Pod's bound token is refused (401). Then the unlabelled one is given
/// the controllers' labels and its token is let in: the labels were what refused it.
pub fn gateway_token_of_a_deployment_the_controllers_did_not_make_is_unauthorized(
    c: &mut LocalCluster,
) -> Result<(), String> {
    use e2e::gateway::{gateway_service_account, MANAGED_BY, MANAGED_BY_LABEL, SERVER_LABEL};
    let ns = "e2e-gwi-foreign";
    let (chain, sync, _) = one_gateway(c, ns)?;
    let controlled_by = |server: &str| -> Result<String, String> {
        let uid = c
            .create_mcpserver(ns, server)
            .map_err(|e| format!("{e:#}"))?;
        Ok(uid)
    };
    let owner = |server: &'static str, uid: &str| {
        (
            "mcp-runtime.dev/v1alpha1".to_string(),
            "MCPServer".to_string(),
            server.to_string(),
            uid.to_string(),
        )
    };
    let bare_uid = controlled_by("bare")?;
    let mislabel_uid = controlled_by("mislabel")?;
    let wrongsa_uid = controlled_by("wrongsa")?;
    // The controller reference: (apiVersion, kind, name, uid).
    type Owner = (String, String, String, String);
    // (what, deployment name, service account, controller, labels for)
    let cases: [(&str, &str, String, Owner, Option<&str>); 4] = [
        (
            "another name than the server's",
            "solo-copy",
            chain.service_account.clone(),
            owner("solo", &chain.server_uid),
            Some("solo"),
        ),
        (
            "without the controllers' labels",
            "bare",
            gateway_service_account("bare"),
            owner("bare", &bare_uid),
            None,
        ),
        (
            "labelled for another server",
            "mislabel",
            gateway_service_account("mislabel"),
            owner("mislabel", &mislabel_uid),
            Some("solo"),
        ),
        (
            "run as another ServiceAccount",
            "wrongsa",
            chain.service_account.clone(),
            owner("wrongsa", &wrongsa_uid),
            Some("wrongsa"),
        ),
    ];
    let mut bare_pod = None;
    for (what, name, sa, (api_version, kind, owner_name, owner_uid), labelled_for) in &cases {
        let (_, _, _, pod, pod_uid) = c
            .create_gateway_deployment(
                ns,
                name,
                sa,
                Some((api_version, kind, owner_name, owner_uid)),
                *labelled_for,
            )
            .map_err(|e| format!("{what}: {e:#}"))?;
        let token = c
            .service_account_token(ns, sa, Some(GATEWAY_AUDIENCE), Some((&pod, &pod_uid)))
            .map_err(|e| format!("{e:#}"))?;
        expect_unauthorized(&sync.get(&sessions_path(Some(ns)), &token)?, what)?;
        expect_unauthorized(&sync.get(&sessions_path(None), &token)?, what)?;
        if *name == "bare" {
            bare_pod = Some(token);
        }
    }

    // The control: labelled as the controllers label it, `bare`'s own gateway is let in (once
    // the refusal is no longer cached) and sees its server's sessions: none.
    let token = bare_pod.ok_or("the bare case did not run")?;
    kubectl_ok(
        c,
        &[
            "label",
            "deployment",
            "bare",
            "-n",
            ns,
            &format!("{MANAGED_BY_LABEL}={MANAGED_BY}"),
            &format!("{SERVER_LABEL}=bare"),
        ],
    )?;
    let started = Instant::now();
    loop {
        let reply = sync.get(&sessions_path(Some(ns)), &token)?;
        if reply.code == 200 {
            let got = listed(&reply)?;
            ensure!(
                got.is_empty(),
                "bare's gateway sees another server's sessions: {got:?}"
            );
            break;
        }
        expect_unauthorized(&reply, "bare before its labels are seen")?;
        ensure!(
            started.elapsed() < CHAIN_BREAK_BOUND,
            "bare's gateway is still refused {CHAIN_BREAK_BOUND:?} after it was labelled"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Credentials that are not a gateway's: none, the admin's client certificate, a plain
/// service-account token, and kube-apiserver's front-proxy certificate asserting a
/// system:masters user — all 401 on the sync listener.
pub fn plain_user_credentials_are_unauthorized_on_the_sync_listener(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-users";
    let (chain, sync, _) = one_gateway(c, ns)?;
    let path = sessions_path(Some(ns));
    expect_unauthorized(
        &sync.request(Method::GET, &path, None, &[], None)?,
        "no credentials",
    )?;

    let pem = |key: &str, crt: &str| -> Result<Vec<u8>, String> {
        let mut pem = std::fs::read(env(c, key)?).map_err(|e| e.to_string())?;
        pem.extend(std::fs::read(env(c, crt)?).map_err(|e| e.to_string())?);
        Ok(pem)
    };
    let admin = Https::new(
        c.sync_url(),
        &c.sync_ca(),
        Some(pem("ADMIN_KEY_FILE", "ADMIN_CERT_FILE")?),
    )?;
    expect_unauthorized(
        &admin.request(Method::GET, &path, None, &[], None)?,
        "the admin's client certificate",
    )?;

    let front_proxy_dir = PathBuf::from(env(c, "FRONT_PROXY_CA_FILE")?)
        .parent()
        .map(PathBuf::from)
        .ok_or("no pki directory")?;
    let mut proxy_pem =
        std::fs::read(front_proxy_dir.join("front-proxy-client.key")).map_err(|e| e.to_string())?;
    proxy_pem.extend(
        std::fs::read(front_proxy_dir.join("front-proxy-client.crt")).map_err(|e| e.to_string())?,
    );
    let proxy = Https::new(c.sync_url(), &c.sync_ca(), Some(proxy_pem))?;
    expect_unauthorized(
        &proxy.request(
            Method::GET,
            &path,
            None,
            &[
                ("X-Remote-User", "admin"),
                ("X-Remote-Group", "system:masters"),
            ],
            None,
        )?,
        "the front-proxy certificate with X-Remote-User",
    )?;

    // A service account's ordinary API token (kube-apiserver's audience, no Pod), the
    // gateway's own and a cluster-admin's.
    kubectl_ok(c, &["create", "serviceaccount", "e2e-gwi-admin", "-n", ns])?;
    kubectl_ok(
        c,
        &[
            "create",
            "clusterrolebinding",
            "e2e-gwi-admin",
            "--clusterrole=cluster-admin",
            &format!("--serviceaccount={ns}:e2e-gwi-admin"),
        ],
    )?;
    for sa in [chain.service_account.as_str(), "e2e-gwi-admin"] {
        let token = c
            .service_account_token(ns, sa, None, None)
            .map_err(|e| format!("{e:#}"))?;
        expect_unauthorized(&sync.get(&path, &token)?, &format!("{sa}'s API token"))?;
    }
    Ok(())
}

/// The gateway token is only good on the sync listener: MCP Access's API port and
/// kube-apiserver refuse it (401), also through kubectl.
pub fn gateway_token_is_unauthorized_on_the_api(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gwi-api";
    let (_, _, token) = one_gateway(c, ns)?;
    let path = sessions_path(Some(ns));
    let api = Https::api(c)?;
    expect_unauthorized(&api.get(&path, &token)?, "MCP Access's API port")?;
    let kube = Https::kube(c)?;
    let reply = kube.get(&path, &token)?;
    ensure!(
        reply.code == 401 && reply.body["reason"] == "Unauthorized",
        "kube-apiserver: expected 401, got {} {}",
        reply.code,
        reply.text
    );
    let kubeconfig = c.dir.join("gateway-token-on-kube.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            env(c, "KUBE_APISERVER_URL")?,
            env(c, "CLUSTER_CA_FILE")?
        ),
    )
    .map_err(|e| e.to_string())?;
    let out = c.kubectl_as(&kubeconfig, &["get", "accesssessions", "-n", ns], None);
    ensure!(
        !out.success && out.stderr.contains("Unauthorized"),
        "kubectl through kube-apiserver with the gateway token: {out:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Read-only, sessions only

/// A write request: method, path, and (content type, body).
type WriteRequest = (Method, String, Option<(&'static str, String)>);

/// Every write verb on the listener — create, update, patch (every patch type), delete,
/// deletecollection — is 405 MethodNotAllowed and changes nothing.
pub fn writes_on_the_sync_listener_are_method_not_allowed(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-writes";
    let (chain, sync, token) = one_gateway(c, ns)?;
    let collection = sessions_path(Some(ns));
    let object = format!("{collection}/solo-1");
    let session = json!({
        "apiVersion": "access.mcp-runtime.dev/v1alpha1", "kind": "AccessSession",
        "metadata": {"name": "solo-2", "namespace": ns},
        "spec": {"server": {"name": "solo", "uid": chain.server_uid}, "teams": ["payments"], "expiresAt": "2099-01-01T00:00:00Z"},
    });
    let before = kubectl_ok(
        c,
        &["get", "accesssessions", "solo-1", "-n", ns, "-o", "json"],
    )?;
    let label = r#"{"metadata":{"labels":{"written":"yes"}}}"#.to_string();
    let writes: Vec<WriteRequest> = vec![
        (
            Method::POST,
            collection.clone(),
            Some(("application/json", session.to_string())),
        ),
        (
            Method::PUT,
            object.clone(),
            Some(("application/json", before.clone())),
        ),
        (
            Method::PATCH,
            object.clone(),
            Some(("application/merge-patch+json", label.clone())),
        ),
        (
            Method::PATCH,
            object.clone(),
            Some(("application/strategic-merge-patch+json", label.clone())),
        ),
        (
            Method::PATCH,
            object.clone(),
            Some((
                "application/json-patch+json",
                r#"[{"op":"add","path":"/metadata/labels/written","value":"yes"}]"#.into(),
            )),
        ),
        (
            Method::PATCH,
            format!("{object}?fieldManager=gateway"),
            Some(("application/apply-patch+yaml", label.clone())),
        ),
        (Method::DELETE, object.clone(), None),
        (Method::DELETE, collection.clone(), None),
    ];
    for (method, path, body) in writes {
        let reply = sync.request(method.clone(), &path, Some(&token), &[], body)?;
        ensure!(
            reply.code == 405
                && reply.body["kind"] == "Status"
                && reply.body["reason"] == "MethodNotAllowed",
            "{method} {path}: expected 405 MethodNotAllowed, got {} {}",
            reply.code,
            reply.text
        );
    }
    let after = kubectl_ok(
        c,
        &["get", "accesssessions", "solo-1", "-n", ns, "-o", "json"],
    )?;
    ensure!(
        before == after,
        "a write changed solo-1:\n{before}\n{after}"
    );
    let missing = c.kubectl(&["get", "accesssessions", "solo-2", "-n", ns]);
    ensure!(!missing.success, "a POST created solo-2");
    Ok(())
}

/// Nothing but accesssessions: the other kinds of the group, core and MCPServer resources
/// are 404 on the listener, even to a valid gateway.
pub fn other_resources_on_the_sync_listener_are_not_found(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-gwi-other";
    let (chain, sync, token) = one_gateway(c, ns)?;
    let paths = [
        format!("{GROUP_VERSION}/agents"),
        format!("{GROUP_VERSION}/namespaces/{ns}/enrollments"),
        format!("{GROUP_VERSION}/namespaces/{ns}/revocations"),
        format!("{GROUP_VERSION}/revocations"),
        format!("/api/v1/namespaces/{ns}/pods"),
        format!("/api/v1/namespaces/{ns}/secrets"),
        format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        format!(
            "/apis/mcp-runtime.dev/v1alpha1/namespaces/{ns}/mcpservers/{}",
            chain.server
        ),
    ];
    for path in paths {
        let reply = sync.get(&path, &token)?;
        ensure!(
            reply.code == 404,
            "GET {path}: expected 404, got {} {}",
            reply.code,
            reply.text
        );
    }
    // Subresources are other resources too: the status of the gateway's own session is not
    // served, to read or to write.
    let status = format!("{}/solo-1/status", sessions_path(Some(ns)));
    let body = kubectl_ok(
        c,
        &["get", "accesssessions", "solo-1", "-n", ns, "-o", "json"],
    )?;
    for (method, body) in [
        (Method::GET, None),
        (Method::PUT, Some(("application/json", body))),
    ] {
        let reply = sync.request(method.clone(), &status, Some(&token), &[], body)?;
        ensure!(
            reply.code == 404,
            "{method} {status}: expected 404, got {} {}",
            reply.code,
            reply.text
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Open watches follow the chain

/// An open watch survives re-verification while the chain holds, and ends within the
/// re-verification period once the gateway's Deployment is deleted; the token is then
/// refused.
pub fn open_watch_ends_when_the_deployment_is_deleted(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gwi-rewatch";
    let (chain, sync, token) = one_gateway(c, ns)?;
    let watch = sync.watch(&format!("{}?watch=1", sessions_path(Some(ns))), &token)?;
    watch.until("ADDED solo-1", Duration::from_secs(20), |e| {
        e["type"] == "ADDED"
    })?;
    // Two and a half periods: the re-verifications that pass must not end the watch.
    let (events, end) = watch.drain(REVERIFY * 5 / 2);
    ensure!(
        end.is_none() && events.is_empty(),
        "the watch must stay open while the chain holds: {} (end: {end:?})",
        summary(&events)
    );
    let deleted = Instant::now();
    kubectl_ok(
        c,
        &[
            "delete",
            "deployment",
            &chain.deployment,
            "-n",
            ns,
            "--wait=false",
        ],
    )?;
    let (events, end) = watch.drain(CHAIN_BREAK_BOUND);
    let took = deleted.elapsed();
    let Some(end) = end else {
        return Err(format!(
            "the watch is still open {CHAIN_BREAK_BOUND:?} after the Deployment was deleted: {}",
            summary(&events)
        ));
    };
    // It ends with nothing of the session's data: at most an ERROR Status.
    ensure!(
        events.iter().all(|e| e["type"] == "ERROR"),
        "events before the end: {}",
        summary(&events)
    );
    eprintln!(
        "gateway_isolation: watch ended {took:?} after the Deployment was deleted ({end}; reverify every {REVERIFY:?})"
    );
    expect_unauthorized(
        &sync.get(&sessions_path(Some(ns)), &token)?,
        "after the watch ended",
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The client-go recipe

/// The JSON lines the client-go example printed, read as they come.
struct Printed {
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Printed {
    /// Reads lines until one satisfies `pred`, within a minute.
    fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    let done = pred(&v);
                    self.seen.push(v);
                    if done {
                        return Ok(());
                    }
                }
                Err(_) => break,
            }
        }
        Err(format!(
            "gateway-informer: no {what}; printed {:?}",
            self.seen
        ))
    }
}

/// The client-go example (`e2e/gateway-informer`) with alpha's token lists and watches only
/// alpha's sessions — its ADD/UPDATE/DELETE lines never name another server's — follows a
/// revocation, and exits with status 3 and the HTTP 401 once alpha's Deployment is deleted.
pub fn client_go_gateway_informer_sees_only_its_servers_sessions(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let w = world(c, "e2e-gwi-go")?;
    let token_file = c.dir.join("e2e-gwi-go.token");
    std::fs::write(&token_file, gateway_token(c, &w.alpha)?).map_err(|e| e.to_string())?;
    let bin = std::env::var("MCP_ACCESS_GATEWAY_INFORMER_BIN")
        .map_err(|_| "MCP_ACCESS_GATEWAY_INFORMER_BIN is not set".to_string())?;
    let stderr = std::fs::File::create(c.dir.join("logs/gateway-informer.log"))
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(bin)
        .arg("--sync-url")
        .arg(c.sync_url())
        .arg("--ca-file")
        .arg(c.sync_ca())
        .arg("--token-file")
        .arg(&token_file)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let v = serde_json::from_str(&line).unwrap_or_else(|_| json!({"unparsed": line}));
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    let result = (|| {
        let mut printed = Printed {
            lines: rx,
            seen: Vec::new(),
        };
        let is = |event: &'static str, ns: String, name: &'static str| {
            move |v: &Value| {
                v["event"] == event && v["namespace"] == ns.as_str() && v["name"] == name
            }
        };
        printed.wait("SYNCED", |v| v["event"] == "SYNCED")?;
        create_session(c, &w.ns_b, "beta-3", "beta", &w.beta.server_uid)?;
        create_session(c, &w.ns_a, "gamma-2", "gamma", &w.gamma.server_uid)?;
        kubectl_ok(
            c,
            &[
                "label",
                "accesssessions",
                "beta-1",
                "-n",
                &w.ns_b,
                "color=red",
            ],
        )?;
        kubectl_ok(c, &["delete", "accesssessions", "beta-2", "-n", &w.ns_b])?;
        create_session(c, &w.ns_a, "alpha-3", "alpha", &w.alpha.server_uid)?;
        printed.wait("ADD alpha-3", is("ADD", w.ns_a.clone(), "alpha-3"))?;
        let revocation = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {name: pull-alpha-1}\nspec: {target: {session: alpha-1}, cause: compromised}\n";
        ok(
            &c.kubectl_as(
                &c.kubeconfig,
                &["create", "-n", &w.ns_a, "-f", "-"],
                Some(revocation),
            ),
            "create revocation",
        )?;
        printed.wait("UPDATE alpha-1 Revoked", |v| {
            v["event"] == "UPDATE"
                && v["name"] == "alpha-1"
                && v["phase"] == "Revoked"
                && v["usable"] == false
        })?;
        kubectl_ok(c, &["delete", "accesssessions", "alpha-2", "-n", &w.ns_a])?;
        printed.wait("DELETE alpha-2", is("DELETE", w.ns_a.clone(), "alpha-2"))?;

        // What it printed: ADDs of alpha's sessions, changes of alpha's, nothing else.
        let mut added = BTreeSet::new();
        for v in &printed.seen {
            if v["event"] == "SYNCED" {
                continue;
            }
            ensure!(
                v["namespace"] == w.ns_a.as_str() && v["serverUID"] == w.alpha.server_uid.as_str(),
                "gateway-informer printed another server's session: {v}"
            );
            if v["event"] == "ADD" {
                added.insert(format!(
                    "{}/{}",
                    w.ns_a,
                    v["name"].as_str().unwrap_or_default()
                ));
                ensure!(v["phase"] == "Active" && v["usable"] == true, "{v}");
            }
        }
        let mut want = w.alphas();
        want.insert(format!("{}/alpha-3", w.ns_a));
        ensure!(added == want, "ADDs: want {want:?}, got {added:?}");

        // The chain breaks: the informer's watch is closed, its relist refused, and it exits 3.
        kubectl_ok(
            c,
            &[
                "delete",
                "deployment",
                &w.alpha.deployment,
                "-n",
                &w.ns_a,
                "--wait=false",
            ],
        )?;
        printed.wait("ERROR 401", |v| v["event"] == "ERROR" && v["code"] == 401)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                ensure!(
                    status.code() == Some(3),
                    "gateway-informer exited with {status}"
                );
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "gateway-informer did not exit after the 401"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
