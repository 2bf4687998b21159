//! A real nginx in front: `deploy/gateways/nginx.conf` (the configuration docs/gateways.md
//! shows, byte for byte) with `auth_request` to the real `mcp-access-authz` sidecar, whose
//! Pod-bound token belongs to a live MCPServer chain of the local cluster, and a stand-in MCP
//! server on loopback behind it. Clients present session tokens minted through the
//! `accesssessions/token` subresource (`kubectl create --raw`). What a client of nginx sees:
//! 200 with the MCP server's body, or 401 with the deny reason in the body, in
//! `X-MCP-Deny-Reason` and in the `WWW-Authenticate` challenge; what the MCP server sees: the
//! session's identity from the sidecar, never the token or a client's session header; and how
//! long after a Revocation write through kube-apiserver the first 401 reaches a client polling
//! nginx.
//!
//! Needs `MCP_ACCESS_AUTHZ_BIN` and `MCP_ACCESS_NGINX_BIN` (set by `hack/test.sh`, which
//! installs Debian's nginx when it is missing). `MCP_E2E_NGINX_TRIALS` sets the number of
//! revocations measured (default 40).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apis::{
    AccessSession, AccessSessionSpec, Revocation, RevocationSpec, RevocationTarget, ServerRef,
};
use e2e::LocalCluster;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

use super::create_namespace;

/// The configuration under test, as shipped and documented.
const NGINX_CONF: &str = "deploy/gateways/nginx.conf";
/// The addresses it names, replaced by this test's ports.
const PROXY_ADDR: &str = "127.0.0.1:8000";
const UPSTREAM_ADDR: &str = "127.0.0.1:8080";
const AUTHZ_ADDR: &str = "127.0.0.1:8086";
const ADMIN_ADDR: &str = "127.0.0.1:9091";
/// What the stand-in MCP server answers to everything.
const UPSTREAM_BODY: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"server":"stand-in"}}"#;
/// A generous bound on every revoke-to-deny through nginx (the target is a p99 of 100 ms,
/// docs/gateways.md; this only catches a broken path, e.g. a cached decision): 20x.
const DENY_BOUND: Duration = Duration::from_secs(2);

/// A port the kernel just chose, for nginx (which cannot report a port-0 bind): the caller
/// starts nginx there and retries with a fresh candidate when nginx fails to bind it.
fn candidate_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// One request the stand-in MCP server received: method, path, and the headers that must
/// come from the sidecar (`X-MCP-Access-Session`) or not at all (`Authorization`, a client's
/// `X-MCP-Session`).
#[derive(Clone, Debug, Default)]
struct Seen {
    method: String,
    path: String,
    identity: String,
    authorization: Option<String>,
    client_session: Option<String>,
}

/// The stand-in MCP server: a loopback HTTP/1.1 server answering every request with 200 and
/// [`UPSTREAM_BODY`], remembering what reached it. Its thread ends with the test process.
struct Upstream {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    fn start() -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let record = record.clone();
                std::thread::spawn(move || serve_upstream(conn, &record));
            }
        });
        Ok(Self { port, seen })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Serves the requests of one connection (nginx may keep it open).
fn serve_upstream(conn: TcpStream, record: &Mutex<Vec<Seen>>) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let (mut length, mut close) = (0usize, false);
        let mut seen = Seen {
            method,
            path,
            ..Default::default()
        };
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim();
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.parse().unwrap_or(0),
                    "x-mcp-access-session" => seen.identity = value.to_string(),
                    "authorization" => seen.authorization = Some(value.to_string()),
                    "x-mcp-session" => seen.client_session = Some(value.to_string()),
                    "connection" => close = value.eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(mut r) = record.lock() {
            r.push(seen);
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: stand-in\r\nContent-Length: {}\r\n{}\r\n{UPSTREAM_BODY}",
            UPSTREAM_BODY.len(),
            if close { "Connection: close\r\n" } else { "" },
        );
        if out.write_all(response.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// A process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx's master process: TERM on drop, so it stops its workers (a killed master would leave
/// them serving), then KILL if it has not ended within 5 s.
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx (not a daemon, in a directory of its own, on loopback only) with the shipped
/// configuration, the sidecar and the stand-in upstream; everything stops on drop.
struct Proxy {
    nginx: Nginx,
    authz: Option<Killed>,
    upstream: Upstream,
    dir: PathBuf,
    base: String,
    /// The sidecar's admin listener.
    authz_admin: String,
    authz_log: PathBuf,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    client: kube::Client,
}

/// What nginx answered: status, `X-MCP-Deny-Reason`, `WWW-Authenticate`, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    header: String,
    challenge: String,
    body: String,
}

impl Answer {
    fn reason(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// A 401 whose body, header and challenge all carry `reason` (the challenge names it
    /// except for `token_missing`, which has no `error=`).
    fn is_denied(&self, reason: &str) -> bool {
        let challenge = if reason == "token_missing" {
            self.challenge.starts_with("Bearer resource_metadata=")
                && !self.challenge.contains("error=")
        } else {
            self.challenge.starts_with("Bearer resource_metadata=")
                && self.challenge.ends_with(&format!(
                    "error=\"invalid_token\", error_description=\"{reason}\""
                ))
        };
        self.status == 401 && self.header == reason && self.reason() == reason && challenge
    }
}

/// The shipped configuration with this test's ports; each address must be named once.
fn shipped_config(proxy: u16, upstream: u16, authz: u16, admin: u16) -> Result<String, String> {
    let path = e2e::repo_root().join(NGINX_CONF);
    let mut conf = std::fs::read_to_string(&path).map_err(|e| format!("{NGINX_CONF}: {e}"))?;
    for (addr, port) in [
        (PROXY_ADDR, proxy),
        (UPSTREAM_ADDR, upstream),
        (AUTHZ_ADDR, authz),
        (ADMIN_ADDR, admin),
    ] {
        // Outside comments, exactly once: the test then runs what the file says.
        let uses = conf
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter(|l| l.contains(addr))
            .count();
        ensure!(
            uses == 1,
            "{NGINX_CONF} must name {addr} once outside comments, names it {uses} times"
        );
        conf = conf
            .lines()
            .map(|l| {
                if l.trim_start().starts_with('#') {
                    l.to_string()
                } else {
                    l.replace(addr, &format!("127.0.0.1:{port}"))
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
    Ok(conf)
}

/// The main configuration around it: nothing outside `dir`, no daemon, loopback only (the
/// shipped server block is the only listener).
fn main_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  \
         proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
         scgi_temp_path {d}/scgi;\n  include {d}/mcp-access.conf;\n}}\n"
    )
}

/// nginx with the shipped configuration on a candidate port: a fresh one when nginx reports
/// the port taken ("Address already in use") instead of writing its pid file, which it does
/// once its listeners are bound.
fn start_nginx(
    nginx_bin: &str,
    dir: &Path,
    upstream: &Upstream,
    authz_port: u16,
    admin_port: u16,
) -> Result<(u16, Nginx), String> {
    for _ in 0..5 {
        let proxy_port = candidate_port()?;
        let _ = std::fs::remove_file(dir.join("error.log"));
        let _ = std::fs::remove_file(dir.join("nginx.pid"));
        let conf = shipped_config(proxy_port, upstream.port, authz_port, admin_port)?;
        std::fs::write(dir.join("mcp-access.conf"), conf).map_err(|e| e.to_string())?;
        let main = dir.join("nginx.conf");
        std::fs::write(&main, main_config(dir)).map_err(|e| e.to_string())?;
        // nginx with its prefix, error log and configuration in `dir`.
        let nginx_in_dir = || {
            let mut cmd = Command::new(nginx_bin);
            cmd.arg("-p")
                .arg(dir)
                .arg("-e")
                .arg(dir.join("error.log"))
                .arg("-c")
                .arg(&main);
            cmd
        };
        // The configuration must pass nginx's own check first, with its message if not.
        let test = nginx_in_dir()
            .arg("-t")
            .output()
            .map_err(|e| format!("run {nginx_bin}: {e}"))?;
        ensure!(
            test.status.success(),
            "nginx -t refused the configuration: {}",
            String::from_utf8_lossy(&test.stderr)
        );
        let log = std::fs::File::create(dir.join("nginx.out")).map_err(|e| e.to_string())?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut nginx = Nginx(
            nginx_in_dir()
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .spawn()
                .map_err(|e| format!("start nginx: {e}"))?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let taken = loop {
            let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
            if log.contains("Address already in use") {
                break true;
            }
            if dir.join("nginx.pid").exists() {
                break false;
            }
            if let Ok(Some(status)) = nginx.0.try_wait() {
                return Err(format!(
                    "nginx exited ({status}): {}",
                    tail(&dir.join("error.log"), 10)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nginx did not start: {}",
                    tail(&dir.join("error.log"), 10)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !taken {
            return Ok((proxy_port, nginx));
        }
        eprintln!("nginx: port {proxy_port} taken, another");
    }
    Err("nginx found every candidate port taken".into())
}

impl Proxy {
    /// nginx and a sidecar with the gateway's Pod-bound `token`, checking session tokens for
    /// the resource `public_url`.
    fn start(c: &LocalCluster, name: &str, token: &str, public_url: &str) -> Result<Self, String> {
        let nginx_bin = std::env::var("MCP_ACCESS_NGINX_BIN")
            .map_err(|_| "MCP_ACCESS_NGINX_BIN is not set: run through hack/test.sh".to_string())?;
        let dir = c.dir.join(format!("nginx-{name}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let kubeconfig = c.kubeconfig.clone();
        let client = rt
            .block_on(async move {
                let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig)?;
                let config = kube::Config::from_custom_kubeconfig(
                    kubeconfig,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await?;
                anyhow::Ok(kube::Client::try_from(config)?)
            })
            .map_err(|e| format!("kube client: {e:#}"))?;

        // The sidecar, on the cluster's sync listener with the gateway Pod's token.
        let spawned = e2e::gateway::spawn_authz(
            c,
            &format!("nginx-{name}"),
            token,
            &["--public-url", public_url],
        )
        .map_err(|e| format!("{e:#}"))?;
        let (authz_port, admin_port, authz_log) = (spawned.port, spawned.admin_port, spawned.log);
        let authz = Killed(spawned.child);

        let upstream = Upstream::start()?;
        let (proxy_port, nginx) = start_nginx(&nginx_bin, &dir, &upstream, authz_port, admin_port)?;

        let mut proxy = Self {
            nginx,
            authz: Some(authz),
            upstream,
            base: format!("http://127.0.0.1:{proxy_port}"),
            authz_admin: format!("http://127.0.0.1:{admin_port}"),
            dir,
            authz_log,
            rt,
            http,
            client,
        };
        proxy.wait_ready(Duration::from_secs(30))?;
        Ok(proxy)
    }

    fn evidence(&self) -> String {
        format!(
            "nginx error.log:\n{}\nmcp-access-authz log:\n{}",
            tail(&self.dir.join("error.log"), 10),
            tail(&self.authz_log, 10)
        )
    }

    /// The sidecar has synced and nginx answers.
    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.nginx.0.try_wait() {
                return Err(format!("nginx exited ({status}): {}", self.evidence()));
            }
            if let Some(Killed(authz)) = self.authz.as_mut() {
                if let Ok(Some(status)) = authz.try_wait() {
                    return Err(format!(
                        "mcp-access-authz exited ({status}): {}",
                        self.evidence()
                    ));
                }
            }
            let ready = self.http.get(format!("{}/readyz", self.authz_admin));
            let ready = self
                .rt
                .block_on(async { ready.send().await })
                .is_ok_and(|r| r.status() == 200);
            let nginx_up =
                std::net::TcpStream::connect(self.base.trim_start_matches("http://")).is_ok();
            if ready && nginx_up {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready within {limit:?} (sidecar ready: {ready}, nginx listening: {nginx_up}): {}",
                    self.evidence()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An MCP request through nginx with the session `token` if given, and `headers`.
    fn call_with(&self, token: Option<&str>, headers: &[(&str, &str)]) -> Result<Answer, String> {
        let mut request = self
            .http
            .post(format!("{}/mcp/message", self.base))
            .header("Content-Type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.rt.block_on(async {
            let resp = request.send().await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let text = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            let (header, challenge) = (text("x-mcp-deny-reason"), text("www-authenticate"));
            let body = resp.text().await.map_err(|e| e.to_string())?;
            Ok(Answer {
                status,
                header,
                challenge,
                body,
            })
        })
    }

    /// An MCP request through nginx with the session `token` if given.
    fn call(&self, token: Option<&str>) -> Result<Answer, String> {
        self.call_with(token, &[])
    }

    /// Issues a session of MCPServer `server` (`server_uid`) through kube-apiserver.
    fn create_session(
        &self,
        ns: &str,
        name: &str,
        server: &str,
        server_uid: &str,
    ) -> Result<(), String> {
        let api: Api<AccessSession> = Api::namespaced(self.client.clone(), ns);
        let session = AccessSession {
            api_version: apis::API_VERSION.into(),
            kind: "AccessSession".into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: AccessSessionSpec {
                server: ServerRef {
                    name: server.into(),
                    uid: server_uid.into(),
                },
                teams: vec!["payments".into()],
                expires_at: Some(Time(Timestamp::now() + SignedDuration::from_hours(1))),
                ..Default::default()
            },
            status: None,
        };
        self.rt
            .block_on(api.create(&PostParams::default(), &session))
            .map(|_| ())
            .map_err(|e| format!("create session {ns}/{name}: {e}"))
    }

    /// Creates a Revocation of one session through kube-apiserver; returns when the write
    /// has returned.
    fn revoke(&self, ns: &str, session: &str) -> Result<(), String> {
        let api: Api<Revocation> = Api::namespaced(self.client.clone(), ns);
        let revocation = Revocation {
            api_version: apis::API_VERSION.into(),
            kind: "Revocation".into(),
            metadata: ObjectMeta {
                name: Some(format!("rvk-{session}")),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: RevocationSpec {
                target: RevocationTarget {
                    session: Some(session.into()),
                    ..Default::default()
                },
                cause: "compromised".into(),
                ..Default::default()
            },
            status: None,
        };
        self.rt
            .block_on(api.create(&PostParams::default(), &revocation))
            .map(|_| ())
            .map_err(|e| format!("create revocation of {ns}/{session}: {e}"))
    }

    /// Calls through nginx with `token` until `pred` holds; the time it took.
    fn wait_for(
        &self,
        token: &str,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Answer) -> bool,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let answer = self.call(Some(token))?;
            if pred(&answer) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "not {what} within {limit:?}, last answer {answer:?}: {}",
                    self.evidence()
                ));
            }
        }
    }
}

/// The resource URI of MCPServer `server` in `ns`: the default audience of its session tokens
/// and its gateway's `--public-url`.
fn public_url(ns: &str, server: &str) -> String {
    format!("http://{server}.{ns}.svc:8086")
}

/// A session token for `ns/name` through the `token` subresource (`kubectl create --raw`, as
/// the cluster admin), for `audience` or the default one.
fn mint(c: &LocalCluster, ns: &str, name: &str, audience: Option<&str>) -> Result<String, String> {
    let path = format!(
        "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions/{name}/token"
    );
    let spec = match audience {
        Some(a) => serde_json::json!({"audiences": [a]}),
        None => serde_json::json!({}),
    };
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
    });
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["create", "--raw", &path, "-f", "-"],
        Some(&body.to_string()),
    );
    ensure!(out.success, "token request for {ns}/{name}: {}", out.stderr);
    let answer: serde_json::Value =
        serde_json::from_str(&out.stdout).map_err(|e| format!("token request answer: {e}"))?;
    answer["status"]["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("no status.token for {ns}/{name}: {answer}"))
}

/// An MCPServer with its gateway chain and a Pod-bound token; (server uid, token).
fn chain(c: &LocalCluster, ns: &str, server: &str) -> Result<(String, String), String> {
    let chain = c
        .create_gateway_chain(ns, server)
        .map_err(|e| format!("{e:#}"))?;
    let token = c.gateway_token(&chain).map_err(|e| format!("{e:#}"))?;
    Ok((chain.server_uid, token))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Through nginx, with session tokens: an active session's token reaches the MCP server,
/// which sees the session's identity and neither the token nor a client's session header; no
/// token, a garbage token, a token for another resource, another server's session, and a bare
/// `X-MCP-Session` naming an active session get 401 with the reason in the body, the header and
/// the challenge, and never reach the MCP server; a revoked session's token is refused; with
/// the sidecar gone, nginx denies (500) instead of forwarding.
pub fn nginx_auth_request_passes_and_denies(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-nginx";
    create_namespace(c, ns)?;
    let (alpha, token) = chain(c, ns, "alpha")?;
    let (beta, _) = chain(c, ns, "beta")?;
    let mut proxy = Proxy::start(c, "answers", &token, &public_url(ns, "alpha"))?;
    proxy.create_session(ns, "alice", "alpha", &alpha)?;
    proxy.create_session(ns, "bob", "beta", &beta)?;
    let alice = mint(c, ns, "alice", None)?;

    // Active: forwarded, the MCP server's answer comes back as it is.
    proxy.wait_for(&alice, "allowed", Duration::from_secs(10), |a| {
        a.status == 200
    })?;
    let answer = proxy.call_with(Some(&alice), &[("X-MCP-Session", &format!("{ns}/bob"))])?;
    ensure!(
        answer.status == 200 && answer.body == UPSTREAM_BODY && answer.header.is_empty(),
        "an active session through nginx: {answer:?}"
    );
    let seen = proxy.upstream.seen();
    let last = seen.last().cloned().unwrap_or_default();
    ensure!(
        last.method == "POST"
            && last.path == "/mcp/message"
            && last.identity == format!("{ns}/alice")
            && last.authorization.is_none()
            && last.client_session.is_none(),
        "the MCP server must get alice's identity, no token, no client session header: {last:?}"
    );

    // Denied: 401 with the sidecar's reason, and nothing reaches the MCP server.
    let bob_here = mint(c, ns, "bob", Some(&public_url(ns, "alpha")))?;
    let alice_elsewhere = mint(c, ns, "alice", Some(&public_url(ns, "beta")))?;
    let before = proxy.upstream.seen().len();
    let named = format!("{ns}/alice");
    for (what, token, headers, reason) in [
        ("no token", None, vec![], "token_missing"),
        (
            "a garbage token",
            Some("not-a-token"),
            vec![],
            "token_invalid",
        ),
        (
            "alice's token for beta's resource",
            Some(alice_elsewhere.as_str()),
            vec![],
            "token_invalid",
        ),
        (
            "beta's session minted for alpha's resource",
            Some(bob_here.as_str()),
            vec![],
            "session_not_found",
        ),
        (
            "X-MCP-Session naming an active session",
            None,
            vec![("X-MCP-Session", named.as_str())],
            "token_missing",
        ),
    ] {
        let answer = proxy.call_with(token, &headers)?;
        ensure!(
            answer.is_denied(reason) && answer.body == format!("{{\"reason\": \"{reason}\"}}\n"),
            "{what}: expected 401 {reason} in the body, the header and the challenge, got {answer:?}"
        );
    }
    let after = proxy.upstream.seen();
    ensure!(
        after.len() == before,
        "denied requests reached the MCP server: {:?}",
        &after[before..]
    );

    // The challenge's metadata document, through nginx.
    let doc = proxy.rt.block_on(async {
        let resp = proxy
            .http
            .get(format!(
                "{}/.well-known/oauth-protected-resource",
                proxy.base
            ))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        resp.json::<serde_json::Value>()
            .await
            .map_err(|e| e.to_string())
    })?;
    ensure!(
        doc["resource"] == public_url(ns, "alpha").as_str(),
        "the RFC 9728 document through nginx: {doc}"
    );

    // Revoked through kube-apiserver: 401 session_revoked, from then on. The polls until the
    // sidecar has seen the revocation are still allowed (and reach the MCP server): only
    // what comes after counts.
    proxy.revoke(ns, "alice")?;
    let took = proxy.wait_for(&alice, "denied", Duration::from_secs(10), |a| {
        a.status != 200
    })?;
    let before = proxy.upstream.seen().len();
    for _ in 0..10 {
        let answer = proxy.call(Some(&alice))?;
        ensure!(
            answer.is_denied("session_revoked"),
            "a revoked session through nginx: {answer:?}"
        );
    }
    let after = proxy.upstream.seen();
    ensure!(
        after.len() == before,
        "denied requests reached the MCP server: {:?}",
        &after[before..]
    );
    eprintln!(
        "    nginx: 401 session_revoked {:.1} ms after the Revocation write returned",
        took.as_secs_f64() * 1e3
    );

    // Fail closed: without the sidecar nginx answers 500 and forwards nothing.
    proxy.authz.take();
    let answer = proxy.call(Some(&bob_here))?;
    ensure!(
        answer.status == 500,
        "nginx with the sidecar stopped: {answer:?}"
    );
    ensure!(
        proxy.upstream.seen().len() == before,
        "a request reached the MCP server with the sidecar stopped"
    );
    Ok(())
}

/// Revoke-to-deny through nginx: from the moment the Revocation create through
/// kube-apiserver returns to the first 401 `session_revoked` seen by a client polling
/// nginx, over N revocations (p50/p99/max printed; every one within [`DENY_BOUND`]).
pub fn nginx_revoke_to_deny(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-nginx-latency";
    create_namespace(c, ns)?;
    let trials: usize = std::env::var("MCP_E2E_NGINX_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(40);
    let (uid, token) = chain(c, ns, "alpha")?;
    let proxy = Proxy::start(c, "latency", &token, &public_url(ns, "alpha"))?;
    let mut ms = Vec::with_capacity(trials);
    for trial in 0..trials {
        let name = format!("s-{trial}");
        proxy.create_session(ns, &name, "alpha", &uid)?;
        let session = mint(c, ns, &name, None)?;
        proxy.wait_for(&session, "allowed", Duration::from_secs(10), |a| {
            a.status == 200
        })?;
        proxy.revoke(ns, &name)?;
        let written = Instant::now();
        loop {
            let answer = proxy.call(Some(&session))?;
            if answer.is_denied("session_revoked") {
                ms.push(written.elapsed().as_secs_f64() * 1e3);
                break;
            }
            ensure!(
                answer.status == 200 && answer.body == UPSTREAM_BODY,
                "{ns}/{name}: between the revocation and the deny, nginx answered {answer:?}"
            );
            ensure!(
                written.elapsed() < DENY_BOUND,
                "{ns}/{name}: still allowed {DENY_BOUND:?} after the Revocation write: {}",
                proxy.evidence()
            );
        }
    }
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "    nginx revoke-to-deny over {trials} revocations: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}

/// The nginx block of docs/gateways.md is the shipped file, byte for byte.
pub fn nginx_config_in_the_docs_is_the_one_tested(_c: &mut LocalCluster) -> Result<(), String> {
    let root = e2e::repo_root();
    let shipped =
        std::fs::read_to_string(root.join(NGINX_CONF)).map_err(|e| format!("{NGINX_CONF}: {e}"))?;
    let docs = std::fs::read_to_string(root.join("docs/gateways.md"))
        .map_err(|e| format!("docs/gateways.md: {e}"))?;
    let block = docs
        .split("```nginx\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .ok_or("docs/gateways.md has no ```nginx block")?;
    ensure!(
        block == shipped,
        "the ```nginx block of docs/gateways.md differs from {NGINX_CONF}: copy the file into it"
    );
    Ok(())
}
