//! The real `mcp-access-apiserver` binary (standalone mode, static token file) over a database
//! of its own, started, stopped and restarted on one port with one certificate, so a cache sees
//! exactly what it would see across an outage or a restart (a new epoch). The port is the one
//! the first process bound for port 0 (read from its `listening on` line); a restart asks for
//! it again, as a Pod restarted behind its Service keeps its address. Its main API has the
//! same paths and wire format as the gateway sync listener.
//!
//! Needs (set by `hack/test.sh`): `MCP_TEST_DATABASE_URL`, `MCP_ACCESS_APISERVER_BIN`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gateway::{CacheConfig, CacheMetrics, SessionCache, SyncTask};
use serde_json::{json, Value};

/// The gateway's tokens (user `gateway`); both valid.
pub const GATEWAY_TOKEN: &str = "gateway-token-0123456789abcdef";
pub const GATEWAY_TOKEN_ROTATED: &str = "gateway-token-rotated-0123456789";
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
const API_VERSION: &str = "access.mcp-runtime.dev/v1alpha1";

/// A TCP port that refuses connections for as long as the returned socket lives: bound (no
/// other process can take it) and never listening, so the kernel resets every connection.
pub fn refusing_port() -> (u16, tokio::net::TcpSocket) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (held.local_addr().unwrap().port(), held)
}

fn private_file(path: &Path, contents: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mcp-gateway-test-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A standalone apiserver process. Dropping it kills the process(es) and removes its files.
pub struct Apiserver {
    child: Option<Child>,
    peer: Option<Child>,
    pub port: u16,
    metrics_port: u16,
    pub dir: PathBuf,
    pub url: String,
    pub ca_file: PathBuf,
    ca_pem: String,
    /// The apiserver's database, dropped after the processes are killed.
    db: e2e::scratch_db::ScratchDatabase,
    extra: Vec<String>,
    /// The writer: this process's URL, or a peer's while this one is stopped.
    write_url: String,
}

impl Drop for Apiserver {
    fn drop(&mut self) {
        for child in [self.child.take(), self.peer.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test shows what the server said.
        if std::thread::panicking() {
            for log in ["apiserver.log", "peer.log"] {
                if let Ok(text) = std::fs::read_to_string(self.dir.join(log)) {
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    eprintln!("--- {log} (last lines) ---");
                    for line in tail.into_iter().rev() {
                        eprintln!("{line}");
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn apiserver_bin() -> String {
    std::env::var("MCP_ACCESS_APISERVER_BIN").expect(
        "MCP_ACCESS_APISERVER_BIN is not set: run through hack/test.sh, which builds the binary",
    )
}

impl Apiserver {
    /// The pid of the running process.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// A superuser connection to the apiserver's own database.
    pub async fn database(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(self.db.dsn(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }

    /// Backend pids of the change feed's LISTEN connections.
    pub async fn feed_backends(&self) -> Vec<i32> {
        self.database()
            .await
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'mcp-access-feed' \
                 AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Files, database and port, without starting the process (see [`Apiserver::launch`]).
    /// `extra` flags are passed on every start.
    pub async fn prepare(extra: &[&str]) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let db = e2e::scratch_db::ScratchDatabase::for_test("t");
        let dir = scratch_dir();
        private_file(
            &dir.join("tokens.csv"),
            &format!(
                "{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n\
                 {GATEWAY_TOKEN},gateway,gateway-uid\n\
                 {GATEWAY_TOKEN_ROTATED},gateway,gateway-uid\n"
            ),
        );
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        let ca_pem = cert.cert.pem();
        std::fs::write(dir.join("apiserver.crt"), &ca_pem).unwrap();
        private_file(
            &dir.join("apiserver.key"),
            &cert.signing_key.serialize_pem(),
        );
        let mut server = Self {
            child: None,
            peer: None,
            port: 0,
            metrics_port: 0,
            ca_file: dir.join("apiserver.crt"),
            dir,
            write_url: String::new(),
            url: String::new(),
            ca_pem,
            db,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // The URL is needed before the first launch (a cache may start before the server):
        // one start on port 0 learns the ports, which every launch then asks for.
        let (mut child, port, metrics_port) = server.spawn(0, 0, "apiserver.log").await;
        let _ = child.kill();
        let _ = child.wait();
        server.port = port;
        server.metrics_port = metrics_port;
        server.url = format!("https://127.0.0.1:{port}");
        server.write_url = server.url.clone();
        server
    }

    /// A started apiserver.
    pub async fn start(extra: &[&str]) -> Self {
        let mut server = Self::prepare(extra).await;
        server.launch().await;
        server
    }

    /// Starts the binary on `port` and `metrics_port` (0: any free port): the child and the
    /// ports it bound, from its `listening on` lines.
    async fn spawn(&self, port: u16, metrics_port: u16, log_name: &str) -> (Child, u16, u16) {
        let log = std::fs::File::create(self.dir.join(log_name)).unwrap();
        let mut args: Vec<String> = [
            "--standalone",
            "--token-auth-file",
            &self.dir.join("tokens.csv").display().to_string(),
            "--tls-cert-file",
            &self.dir.join("apiserver.crt").display().to_string(),
            "--tls-private-key-file",
            &self.dir.join("apiserver.key").display().to_string(),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
            "--metrics-port",
            &metrics_port.to_string(),
            "--database-pool-size",
            "4",
            "--watch-bookmark-interval",
            "1s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(self.extra.iter().cloned());
        let mut child = Command::new(apiserver_bin())
            .args(&args)
            .env("MCP_ACCESS_DATABASE_URL", self.db.dsn())
            .env(
                "RUST_LOG",
                std::env::var("MCP_TEST_APISERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(log.try_clone().unwrap())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start mcp-access-apiserver");
        let stderr = child.stderr.take().expect("stderr is piped");
        let ports = e2e::listening::follow("mcp-access-apiserver", stderr, log)
            .wait_ports(&["api", "metrics"], e2e::listening::LISTEN_TIMEOUT)
            .await
            .unwrap_or_else(|e| {
                let text = std::fs::read_to_string(self.dir.join(log_name)).unwrap_or_default();
                panic!("{e}\n{text}")
            });
        (child, ports[0], ports[1])
    }

    async fn wait_ready(child: &mut Child, metrics_port: u16, dir: &Path, log: &str) {
        let ready = format!("http://127.0.0.1:{metrics_port}/readyz");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the apiserver exited ({status}): {}",
                    std::fs::read_to_string(dir.join(log)).unwrap_or_default()
                );
            }
            if let Ok(resp) = reqwest::get(&ready).await {
                if resp.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the apiserver is not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts (or restarts) the process on its port; returns when it is ready.
    pub async fn launch(&mut self) {
        assert!(self.child.is_none(), "already running");
        let (mut child, _, _) = self
            .spawn(self.port, self.metrics_port, "apiserver.log")
            .await;
        Self::wait_ready(&mut child, self.metrics_port, &self.dir, "apiserver.log").await;
        self.child = Some(child);
        self.write_url = self.url.clone();
    }

    /// Restarts the process with extra flags for this start only (e.g. `--rotate-epoch`).
    pub async fn launch_with(&mut self, extra: &[&str]) {
        let kept = self.extra.clone();
        self.extra.extend(extra.iter().map(|s| s.to_string()));
        self.launch().await;
        self.extra = kept;
    }

    /// Kills the process (as a crash or a node loss would); open watches break.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A second apiserver over the same database, which takes the writes from now on (so
    /// sessions can change while this one is stopped).
    pub async fn start_peer(&mut self) {
        let (mut peer, port, metrics_port) = self.spawn(0, 0, "peer.log").await;
        Self::wait_ready(&mut peer, metrics_port, &self.dir, "peer.log").await;
        self.peer = Some(peer);
        self.write_url = format!("https://127.0.0.1:{port}");
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap()
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/apis/{API_VERSION}/{path}", self.write_url);
        let mut req = self
            .http()
            .request(method.clone(), &url)
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("request to the apiserver");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "{method} {path}: {status}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Issues an Active session of team `payments` for `server_uid`, expiring in `expires_in`.
    pub async fn create_session(
        &self,
        ns: &str,
        name: &str,
        server_uid: &str,
        expires_in: Duration,
    ) -> Value {
        self.create_team_session(ns, name, server_uid, expires_in, &["payments"])
            .await
    }

    /// [`Apiserver::create_session`] for `teams`.
    pub async fn create_team_session(
        &self,
        ns: &str,
        name: &str,
        server_uid: &str,
        expires_in: Duration,
        teams: &[&str],
    ) -> Value {
        let expires = k8s_openapi::jiff::Timestamp::now()
            + k8s_openapi::jiff::SignedDuration::try_from(expires_in).unwrap();
        self.post_session(
            ns,
            name,
            json!({
                "server": {"name": "github", "uid": server_uid},
                "teams": teams,
                "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }),
        )
        .await
    }

    /// Creates session `name` with `spec`.
    async fn post_session(&self, ns: &str, name: &str, spec: Value) -> Value {
        let body = json!({
            "apiVersion": API_VERSION,
            "kind": "AccessSession",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        self.send(
            reqwest::Method::POST,
            &format!("namespaces/{ns}/accesssessions"),
            Some(body),
        )
        .await
    }

    /// A JSON merge patch of a session (as `kubectl patch --type merge` sends it): the status
    /// code and the body (the object, or the Status of a refusal).
    pub async fn merge_patch_session(&self, ns: &str, name: &str, patch: Value) -> (u16, Value) {
        self.merge_patch(&format!("namespaces/{ns}/accesssessions/{name}"), patch)
            .await
    }

    /// A JSON merge patch of the object at `path` (below the group version).
    async fn merge_patch(&self, path: &str, patch: Value) -> (u16, Value) {
        let url = format!("{}/apis/{API_VERSION}/{path}", self.write_url);
        let resp = self
            .http()
            .patch(&url)
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/merge-patch+json")
            .body(patch.to_string())
            .send()
            .await
            .expect("request to the apiserver");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Creates Agent `name` of team `payments` with `callsPerMinute`, and a session of it.
    pub async fn create_agent_session(
        &self,
        agent: &str,
        calls_per_minute: u32,
        ns: &str,
        name: &str,
        server_uid: &str,
    ) {
        let _ = self
            .http()
            .post(format!("{}/apis/{API_VERSION}/agents", self.write_url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({
                "apiVersion": API_VERSION,
                "kind": "Agent",
                "metadata": {"name": agent},
                "spec": {"teams": ["payments"], "callsPerMinute": calls_per_minute},
            }))
            .send()
            .await
            .expect("request to the apiserver");
        self.post_session(
            ns,
            name,
            json!({
                "server": {"name": "github", "uid": server_uid},
                "agent": {"name": agent},
                "teams": ["payments"],
                "expiresAt": "2099-01-01T00:00:00Z",
            }),
        )
        .await;
    }

    /// Creates ToolPolicy `name` for the server `github` with `spec` (its `server` filled in).
    pub async fn create_policy(&self, ns: &str, name: &str, mut spec: Value) -> Value {
        spec["server"] = json!({"name": "github"});
        let body = json!({
            "apiVersion": API_VERSION,
            "kind": "ToolPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        self.send(
            reqwest::Method::POST,
            &format!("namespaces/{ns}/toolpolicies"),
            Some(body),
        )
        .await
    }

    /// A JSON merge patch of a ToolPolicy; returns the stored object.
    pub async fn merge_patch_policy(&self, ns: &str, name: &str, patch: Value) -> Value {
        let (status, body) = self
            .merge_patch(&format!("namespaces/{ns}/toolpolicies/{name}"), patch)
            .await;
        assert_eq!(status, 200, "patch toolpolicy: {body}");
        body
    }

    pub async fn delete_policy(&self, ns: &str, name: &str) {
        self.send(
            reqwest::Method::DELETE,
            &format!("namespaces/{ns}/toolpolicies/{name}"),
            None,
        )
        .await;
    }

    /// Revokes one session with a Revocation (as `kubectl create revocation` does).
    pub async fn revoke(&self, ns: &str, session: &str) {
        let body = json!({
            "apiVersion": API_VERSION,
            "kind": "Revocation",
            "metadata": {"name": format!("rvk-{session}"), "namespace": ns},
            "spec": {"target": {"session": session}, "cause": "compromised"}
        });
        self.send(
            reqwest::Method::POST,
            &format!("namespaces/{ns}/revocations"),
            Some(body),
        )
        .await;
    }

    pub async fn delete_session(&self, ns: &str, name: &str) {
        self.send(
            reqwest::Method::DELETE,
            &format!("namespaces/{ns}/accesssessions/{name}"),
            None,
        )
        .await;
    }
}

/// A cache under test with its own token file.
pub struct TestCache {
    pub cache: SessionCache,
    pub sync: SyncTask,
    pub token_file: PathBuf,
    pub registry: prometheus_client::registry::Registry,
    _dir: PathBuf,
}

impl TestCache {
    /// A cache of `server` presenting `token`, with a short stale window and short watches.
    pub fn start(server: &Apiserver, token: &str, tweak: impl FnOnce(&mut CacheConfig)) -> Self {
        let dir = scratch_dir();
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).unwrap();
        let mut config = CacheConfig::new(&server.url, &server.ca_file, &token_file);
        config.retry_max = Duration::from_millis(500);
        tweak(&mut config);
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = CacheMetrics::register(&mut registry);
        let (cache, sync) =
            SessionCache::start_with_metrics(config, metrics).expect("cache starts");
        Self {
            cache,
            sync,
            token_file,
            registry,
            _dir: dir,
        }
    }

    pub fn set_token(&self, token: &str) {
        std::fs::write(&self.token_file, token).unwrap();
    }

    pub async fn ready(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.cache.ready())
            .await
            .expect("the cache syncs within 10 s");
    }

    /// The value of a metric line (`name value`) in the registry's text encoding.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Polls `f` every 20 ms until it returns true, or panics after `limit` with `what`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The epoch of a resourceVersion (`epoch << 40 | seq`).
pub fn epoch_of(rv: &str) -> u64 {
    rv.parse::<u64>().expect("numeric resourceVersion") >> 40
}

/// The `iss` of session tokens minted by a test apiserver started with
/// [`session_token_flags`].
pub const TOKEN_ISSUER: &str = "https://mcp-access.test";

/// Flags that give the apiserver an ES256 session-token signing key (written into `dir`, mode
/// 600) and [`TOKEN_ISSUER`].
pub fn session_token_flags(dir: &Path) -> Vec<String> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let path = dir.join("session-token.key");
    private_file(&path, &key.serialize_pem());
    vec![
        "--session-token-signing-key-file".into(),
        path.display().to_string(),
        "--session-token-issuer".into(),
        TOKEN_ISSUER.into(),
    ]
}

impl Apiserver {
    /// Asks the `token` subresource of `ns/name` for a token with `spec`; (status, body).
    pub async fn request_token(&self, ns: &str, name: &str, spec: Value) -> (u16, Value) {
        let url = format!(
            "{}/apis/{API_VERSION}/namespaces/{ns}/accesssessions/{name}/token",
            self.write_url
        );
        let body =
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        let resp = self
            .http()
            .post(&url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .expect("token request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A session token for `ns/name` with the default audience.
    pub async fn mint_token(&self, ns: &str, name: &str) -> String {
        let (status, body) = self.request_token(ns, name, json!({})).await;
        assert_eq!(status, 201, "token request: {body}");
        body["status"]["token"]
            .as_str()
            .expect("status.token")
            .to_string()
    }
}

/// A TCP relay to `target` that can turn every connection it carries half-open: bytes stop
/// flowing both ways, and nothing is closed (a NAT or a middlebox that lost the flow). New
/// connections are carried normally.
pub struct Blackhole {
    pub addr: std::net::SocketAddr,
    /// Bumped to silence the connections open now.
    silence: tokio::sync::watch::Sender<u64>,
}

impl Blackhole {
    pub async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (silence, _) = tokio::sync::watch::channel(0u64);
        let events = silence.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let mut silenced = events.subscribe();
                silenced.borrow_and_update();
                tokio::spawn(async move {
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let relay = async {
                        tokio::select! {
                            _ = tokio::io::copy(&mut dr, &mut uw) => {}
                            _ = tokio::io::copy(&mut ur, &mut dw) => {}
                        }
                    };
                    tokio::select! {
                        _ = relay => {}
                        // Half-open: hold both sockets open, move nothing, for as long as the
                        // test runs.
                        _ = silenced.changed() => {
                            let _keep = (dr, dw, ur, uw);
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Self { addr, silence }
    }

    /// Every connection open now stops carrying bytes.
    pub fn silence_open_connections(&self) {
        self.silence.send_modify(|n| *n += 1);
    }
}
