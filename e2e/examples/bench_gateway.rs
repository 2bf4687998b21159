//! `mcp-access-gateway` against the MCP server direct and against nginx `proxy_pass` to the same
//! server, and revoke → stream-cut latency (run by `hack/bench-gateway.sh`, never by CI).
//!
//! Starts the local cluster once (PostgreSQL, etcd, kube-apiserver, kube-controller-manager,
//! MCP Access behind its APIService) and `mcp-access-controllers`, which make the MCPServer's
//! Deployment; the gateway runs as a local process with a token bound to that Deployment's Pod.
//! The upstream is a minimal MCP responder in this process (raw HTTP/1.1 on tokio, keep-alive):
//! a JSON-RPC answer to every POST, and for `tools/call` an SSE stream that stays open (one
//! progress event at once and every 500 ms), so what is measured is the proxies.
//!
//! - request overhead: the same `tools/list` POST with a valid session token through the
//!   three paths (direct, gateway, nginx), `--requests` sequential ones taking turns, then the
//!   same number with `--concurrency` clients per path; p50/p99 of each, and the gateway's and
//!   nginx's p50/p99 minus direct's;
//! - revoke → stream cut: N open `tools/call` SSE streams through the gateway, each of its own
//!   session, all of one subject; one Revocation of that subject through kube-apiserver; each
//!   stream's end timed from the API's 201 (p50/p99 over every stream of `--big-trials`
//!   revocations; for 1 stream over `--trials` revocations).
//!
//! With `--breakdown`, a second watcher of the feed in this process times when the revoked
//! sessions reached a watcher, beside the gateway's own cut histogram.
//!
//! Usage: `bench_gateway [--requests 2000] [--concurrency 16] [--streams 1,500] [--trials 20] [--big-trials 1] [--breakdown]`;
//! needs `MCP_ACCESS_APISERVER_BIN`, `MCP_ACCESS_GATEWAY_BIN`, `MCP_ACCESS_CONTROLLERS_BIN`,
//! `MCP_ACCESS_NGINX_BIN` and `KUBE_APISERVER`, `KUBE_CONTROLLER_MANAGER`, `ETCD`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::{Database, LocalCluster, Options};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const NS: &str = "bench-gateway";
const SERVER: &str = "bench";
const GROUP: &str = "/apis/access.mcp-runtime.dev/v1alpha1";
const LIST_BODY: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
const CALL_BODY: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"count","arguments":{},"_meta":{"progressToken":"p"}}}"#;
const LIST_ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"count","inputSchema":{"type":"object"}}]}}"#;

struct Args {
    requests: usize,
    concurrency: usize,
    streams: Vec<usize>,
    trials: usize,
    /// Revocations timed for each count of streams above 1.
    big_trials: usize,
    /// Also watch the feed from the bench (a second watcher: it adds load, so it is off by
    /// default) to tell the apiserver's delivery from the gateway's fan-out.
    breakdown: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        requests: 2000,
        concurrency: 16,
        streams: vec![1, 500],
        trials: 20,
        big_trials: 1,
        breakdown: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--breakdown" {
            args.breakdown = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--requests" => args.requests = value.parse()?,
            "--concurrency" => args.concurrency = value.parse()?,
            "--streams" => {
                args.streams = value.split(',').map(str::parse).collect::<Result<_, _>>()?
            }
            "--trials" => args.trials = value.parse()?,
            "--big-trials" => args.big_trials = value.parse()?,
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The upstream: a minimal MCP responder.

async fn serve_upstream(listener: TcpListener) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let _ = conn.set_nodelay(true);
        tokio::spawn(upstream_connection(conn));
    }
}

async fn upstream_connection(conn: TcpStream) {
    let (read, mut write) = conn.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        if body.windows(10).any(|w| w == b"tools/call") {
            // An SSE stream that stays open until the peer goes.
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
            if write.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut step = 0u64;
            loop {
                step += 1;
                let event = format!(
                    "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":\"p\",\"progress\":{step}}}}}\n\n"
                );
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                if write.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{LIST_ANSWER}",
            LIST_ANSWER.len()
        );
        if write.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// nginx

struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx with `proxy_pass` to the upstream, as people run it in front of an MCP server
/// (HTTP/1.1 keep-alive to the upstream, no buffering so streams flow).
fn start_nginx(dir: &std::path::Path, upstream: u16) -> Result<(Nginx, u16)> {
    let bin = std::env::var("MCP_ACCESS_NGINX_BIN").context("MCP_ACCESS_NGINX_BIN is not set")?;
    // nginx binds its own listen address from its configuration: the port is found free here
    // and handed over (the one place a port is chosen outside the kernel's bind; a benchmark).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = dir.join("nginx");
    std::fs::create_dir_all(dir.join("logs"))?;
    let conf = format!(
        "worker_processes auto;\ndaemon off;\nerror_log {d}/logs/error.log warn;\npid {d}/nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n  upstream mcp {{ server 127.0.0.1:{upstream}; keepalive 64; }}\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://mcp;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_read_timeout 300s;\n    }}\n  }}\n}}\n",
        d = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf)?;
    let child = std::process::Command::new(bin)
        .args(["-p"])
        .arg(&dir)
        .args(["-c"])
        .arg(dir.join("nginx.conf"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("logs/stderr.log"))?)
        .spawn()?;
    let nginx = Nginx(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nginx did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((nginx, port))
}

// ---------------------------------------------------------------------------------------
// The cluster side

/// An HTTPS client of kube-apiserver as the admin (client certificate).
struct Kube {
    client: reqwest::Client,
    base: String,
}

impl Kube {
    fn new(c: &LocalCluster) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let env = |k: &str| {
            c.env
                .get(k)
                .cloned()
                .with_context(|| format!("{k} missing"))
        };
        let ca = std::fs::read(env("CLUSTER_CA_FILE")?)?;
        let mut identity = std::fs::read(env("ADMIN_CERT_FILE")?)?;
        identity.extend(std::fs::read(env("ADMIN_KEY_FILE")?)?);
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca)?])
            .identity(reqwest::Identity::from_pem(&identity)?)
            .build()?;
        Ok(Self {
            client,
            base: env("KUBE_APISERVER_URL")?,
        })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("POST {path}: {status} {text}");
        }
        Ok(serde_json::from_str(&text)?)
    }

    async fn session_with_token(
        &self,
        name: &str,
        server_uid: &str,
        subject: &str,
    ) -> Result<String> {
        self.post(
            &format!("{GROUP}/namespaces/{NS}/accesssessions"),
            &json!({
                "apiVersion": "access.mcp-runtime.dev/v1alpha1", "kind": "AccessSession",
                "metadata": {"name": name},
                "spec": {"server": {"name": SERVER, "uid": server_uid}, "teams": ["bench"],
                         "subject": {"user": subject}, "expiresAt": "2099-01-01T00:00:00Z"},
            }),
        )
        .await?;
        let answer = self
            .post(
                &format!("{GROUP}/namespaces/{NS}/accesssessions/{name}/token"),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}}),
            )
            .await?;
        answer["status"]["token"]
            .as_str()
            .map(str::to_string)
            .context("no status.token")
    }

    /// Revokes every session of `subject`; returns when the API has answered.
    async fn revoke_subject(&self, name: &str, subject: &str) -> Result<()> {
        self.post(
            &format!("{GROUP}/namespaces/{NS}/revocations"),
            &json!({
                "apiVersion": "access.mcp-runtime.dev/v1alpha1", "kind": "Revocation",
                "metadata": {"name": name},
                "spec": {"target": {"subject": subject}, "cause": "compromised"},
            }),
        )
        .await
        .map(|_| ())
    }
}

fn kubectl(c: &LocalCluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = c.kubectl_as(&c.kubeconfig, args, stdin);
    if !out.success {
        bail!("kubectl {}: {}", args.join(" "), out.stderr);
    }
    Ok(out.stdout)
}

/// The MCPServer, its Deployment's Pod (made by the controllers and kube-controller-manager):
/// (server uid, pod name, pod uid).
fn create_server(c: &LocalCluster) -> Result<(String, String, String)> {
    let manifest = json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
        "metadata": {"name": SERVER, "namespace": NS},
        "spec": {"image": "registry.invalid/mcp/bench:1", "port": 8080},
    });
    kubectl(c, &["apply", "-f", "-"], Some(&manifest.to_string()))?;
    let uid = kubectl(
        c,
        &[
            "get",
            "mcpserver",
            SERVER,
            "-n",
            NS,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let deployment = loop {
        let out = c.kubectl(&[
            "get",
            "deployment",
            SERVER,
            "-n",
            NS,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        if out.success && !out.stdout.trim().is_empty() {
            break out.stdout.trim().to_string();
        }
        if Instant::now() > deadline {
            bail!("the controllers made no Deployment {NS}/{SERVER}");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let (_, rs) = c.wait_owned(NS, "replicasets", &deployment)?;
    let (pod, pod_uid) = c.wait_owned(NS, "pods", &rs)?;
    Ok((uid, pod, pod_uid))
}

// ---------------------------------------------------------------------------------------
// Measurements

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn p50_p99(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 50.0), percentile(&ms, 99.0))
}

async fn one_request(client: &reqwest::Client, url: &str, token: &str) -> Result<f64> {
    let started = Instant::now();
    let response = client
        .post(url)
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(LIST_BODY)
        .send()
        .await?;
    let status = response.status();
    let body = response.bytes().await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() || !body.starts_with(b"{\"jsonrpc\"") {
        bail!("{url}: {status} {}", String::from_utf8_lossy(&body));
    }
    Ok(ms)
}

/// Sequential requests, the paths taking turns; latencies per path in ms.
async fn sequential(targets: &[(String, String)], n: usize, token: &str) -> Result<Vec<Vec<f64>>> {
    let clients: Vec<reqwest::Client> = targets
        .iter()
        .map(|_| {
            reqwest::Client::builder()
                .http1_only()
                .tcp_nodelay(true)
                .build()
        })
        .collect::<Result<_, _>>()?;
    let mut out = vec![Vec::with_capacity(n); targets.len()];
    for (i, (_, url)) in targets.iter().enumerate() {
        for _ in 0..50 {
            one_request(&clients[i], url, token).await?; // warm-up
        }
    }
    for round in 0..n {
        for k in 0..targets.len() {
            let i = (round + k) % targets.len();
            out[i].push(one_request(&clients[i], &targets[i].1, token).await?);
        }
    }
    Ok(out)
}

/// `concurrency` clients at once per path (one path at a time, in turns of 1/10 of `n`).
async fn concurrent(
    targets: &[(String, String)],
    n: usize,
    concurrency: usize,
    token: &str,
) -> Result<Vec<Vec<f64>>> {
    let mut out = vec![Vec::with_capacity(n); targets.len()];
    let clients: Vec<reqwest::Client> = targets
        .iter()
        .map(|_| {
            reqwest::Client::builder()
                .http1_only()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(concurrency)
                .build()
        })
        .collect::<Result<_, _>>()?;
    let turns = 10;
    for _ in 0..turns {
        for (i, (_, url)) in targets.iter().enumerate() {
            let per_client = (n / turns / concurrency).max(1);
            let mut tasks = Vec::new();
            for _ in 0..concurrency {
                let (client, url, token) = (clients[i].clone(), url.clone(), token.to_string());
                tasks.push(tokio::spawn(async move {
                    let mut ms = Vec::with_capacity(per_client);
                    for _ in 0..per_client {
                        ms.push(one_request(&client, &url, &token).await?);
                    }
                    Ok::<_, anyhow::Error>(ms)
                }));
            }
            for task in tasks {
                out[i].extend(task.await??);
            }
        }
    }
    Ok(out)
}

/// Opens a stream per token, revokes their subject, and times each stream's end from the
/// API's answer (ms).
async fn stream_cut(
    kube: &Kube,
    gateway: &str,
    tokens: &[String],
    subject: &str,
    revocation: &str,
) -> Result<(Instant, Vec<f64>)> {
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .build()?;
    let ends: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<Result<()>>(tokens.len());
    let mut tasks = Vec::new();
    for token in tokens {
        let (client, url, token, ends, opened) = (
            client.clone(),
            gateway.to_string(),
            token.clone(),
            ends.clone(),
            opened_tx.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let response = client
                .post(&url)
                .bearer_auth(&token)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .body(CALL_BODY)
                .send()
                .await;
            let mut response = match response {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    let _ = opened
                        .send(Err(anyhow::anyhow!("stream refused: {}", r.status())))
                        .await;
                    return;
                }
                Err(e) => {
                    let _ = opened.send(Err(e.into())).await;
                    return;
                }
            };
            let mut first = true;
            while let Ok(Some(_)) = response.chunk().await {
                if first {
                    first = false;
                    let _ = opened.send(Ok(())).await;
                }
            }
            if let Ok(mut e) = ends.lock() {
                e.push(Instant::now());
            }
        }));
    }
    drop(opened_tx);
    for _ in 0..tokens.len() {
        match tokio::time::timeout(Duration::from_secs(60), opened_rx.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => bail!("opening the streams: {e:#}"),
            _ => bail!("not every stream opened within 60 s"),
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    kube.revoke_subject(revocation, subject).await?;
    let answered = Instant::now();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .context("a stream outlived its session's revocation by 30 s")??;
    }
    let ends = ends.lock().map(|e| e.clone()).unwrap_or_default();
    Ok((
        answered,
        ends.iter()
            .map(|end| end.saturating_duration_since(answered).as_secs_f64() * 1000.0)
            .collect(),
    ))
}

/// A second watcher of the gateway's own feed (the sync listener, with the gateway's Pod
/// token): when the first and the last of `expect` sessions of `subject` arrived revoked, so
/// the apiserver's delivery can be told apart from the gateway's fan-out.
struct Probe {
    task: tokio::task::JoinHandle<Result<(Instant, Instant)>>,
}

impl Probe {
    async fn start(c: &LocalCluster, token: &str, subject: &str, expect: usize) -> Result<Self> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(c.sync_ca())?)?;
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .build()?;
        let url = format!("{}{GROUP}/accesssessions", c.sync_url());
        let list: Value = client
            .get(&url)
            .bearer_auth(token)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut response = client
            .get(format!(
                "{url}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
            ))
            .bearer_auth(token)
            .send()
            .await?
            .error_for_status()?;
        let subject = subject.to_string();
        let task = tokio::spawn(async move {
            let (mut first, mut seen, mut buf) = (None, 0usize, Vec::new());
            while let Some(chunk) = response.chunk().await? {
                buf.extend_from_slice(&chunk);
                while let Some(at) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=at).collect();
                    let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    let o = &event["object"];
                    if o["spec"]["subject"]["user"] == subject.as_str()
                        && o["status"]["phase"] == "Revoked"
                    {
                        let now = Instant::now();
                        let first = *first.get_or_insert(now);
                        seen += 1;
                        if seen == expect {
                            return Ok((first, now));
                        }
                    }
                }
            }
            bail!("the probe's watch ended after {seen} of {expect} revoked sessions")
        });
        Ok(Self { task })
    }
}

/// (sum, count) of the gateway's `mcp_gateway_stream_cut_seconds` (the cache saw the session
/// unusable -> the stream ended).
async fn gateway_means(gateway_mcp_url: &str) -> Result<(f64, f64)> {
    let base = gateway_mcp_url.trim_end_matches("/mcp");
    let text = reqwest::get(format!("{base}/metrics"))
        .await?
        .text()
        .await?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((
        value("mcp_gateway_stream_cut_seconds_sum"),
        value("mcp_gateway_stream_cut_seconds_count"),
    ))
}

fn row(figure: &str, values: &[String]) {
    println!(
        "{figure:<44} {}",
        values
            .iter()
            .map(|v| format!("{v:>12}"))
            .collect::<String>()
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = std::env::temp_dir().join(format!("mcp-bench-gateway-{}", std::process::id()));
    let apiserver_bin = PathBuf::from(
        std::env::var("MCP_ACCESS_APISERVER_BIN").context("MCP_ACCESS_APISERVER_BIN")?,
    );
    let controllers_bin = PathBuf::from(
        std::env::var("MCP_ACCESS_CONTROLLERS_BIN").context("MCP_ACCESS_CONTROLLERS_BIN")?,
    );
    let cluster = tokio::task::block_in_place(|| {
        LocalCluster::start(Options {
            dir: dir.clone(),
            apiserver_bin,
            database: Database::Local,
            apiserver_args: vec![],
            node: false,
        })
    })?;
    let c = &cluster;
    let _controllers = tokio::task::block_in_place(|| {
        c.start_controllers(&controllers_bin, "bench", &["--lease-name=bench-gateway"])
    })?;
    kubectl(c, &["create", "namespace", NS], None)?;
    let (server_uid, pod, pod_uid) = tokio::task::block_in_place(|| create_server(c))?;

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream_port = listener.local_addr()?.port();
    tokio::spawn(serve_upstream(listener));
    let pod_token = c.service_account_token(
        NS,
        &format!("{SERVER}-gateway"),
        Some(e2e::gateway::GATEWAY_AUDIENCE),
        Some((&pod, &pod_uid)),
    )?;
    let gateway = tokio::task::block_in_place(|| {
        e2e::mcp::spawn_gateway(
            c,
            "bench",
            &pod_token,
            &format!("http://127.0.0.1:{upstream_port}"),
            &e2e::mcp::public_url(NS, SERVER),
            &[],
        )
    })?;
    let (_nginx, nginx_port) = start_nginx(&dir, upstream_port)?;
    let kube = Kube::new(c)?;
    let token = kube
        .session_with_token("bench", &server_uid, "bench@example.com")
        .await?;
    // The gateway learns of the session through its watch (its first session: before it,
    // the gateway knows no server uid to check a get-on-miss against).
    let probe_client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while one_request(&probe_client, &gateway.url(), &token)
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("the gateway did not admit the bench session within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let targets = vec![
        (
            "direct".to_string(),
            format!("http://127.0.0.1:{upstream_port}/mcp"),
        ),
        ("gateway".to_string(), gateway.url()),
        (
            "nginx".to_string(),
            format!("http://127.0.0.1:{nginx_port}/mcp"),
        ),
    ];
    eprintln!(
        "request overhead: {} sequential requests per path",
        args.requests
    );
    let seq = sequential(&targets, args.requests, &token).await?;
    eprintln!(
        "request overhead: {} requests per path, {} at once",
        args.requests, args.concurrency
    );
    let conc = concurrent(&targets, args.requests, args.concurrency, &token).await?;

    let mut cuts = Vec::new();
    let mut breakdown = Vec::new();
    for &count in &args.streams {
        let trials = if count == 1 {
            args.trials
        } else {
            args.big_trials
        };
        eprintln!("revoke -> stream cut: {count} stream(s), {trials} trial(s)");
        let mut all = Vec::new();
        for trial in 0..trials {
            let subject = format!("cut-{count}-{trial}@example.com");
            let mut tokens = Vec::with_capacity(count);
            for i in 0..count {
                tokens.push(
                    kube.session_with_token(
                        &format!("cut-{count}-{trial}-{i}"),
                        &server_uid,
                        &subject,
                    )
                    .await?,
                );
            }
            // The gateway learns of new sessions through its watch.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let before = gateway_means(&gateway.url()).await?;
            let probe = if count > 1 && args.breakdown {
                Some(Probe::start(c, &pod_token, &subject, count).await?)
            } else {
                None
            };
            let (answered, ends) = stream_cut(
                &kube,
                &gateway.url(),
                &tokens,
                &subject,
                &format!("rvk-{count}-{trial}"),
            )
            .await?;
            if let Some(probe) = probe {
                // Where the time went: a second watcher of the feed, and the gateway's own
                // histogram of cache -> stream end, over this trial.
                let after = gateway_means(&gateway.url()).await?;
                let (sum, n) = (after.0 - before.0, after.1 - before.1);
                let cut_mean = if n > 0.0 { sum / n * 1000.0 } else { f64::NAN };
                let (first, last) = ends
                    .iter()
                    .fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                let (fed_first, fed_last) =
                    tokio::time::timeout(Duration::from_secs(30), probe.task).await???;
                let ms = |t: Instant| {
                    (t.saturating_duration_since(answered).as_secs_f64()
                        - answered.saturating_duration_since(t).as_secs_f64())
                        * 1000.0
                };
                breakdown.push(format!(
                    "{count} streams, ms after the 201: a second watcher of the feed got the first revoked session at {:.1} and the last at {:.1}; the streams ended from {first:.1} to {last:.1}; the gateway's mean cache -> stream end {cut_mean:.1}",
                    ms(fed_first),
                    ms(fed_last),
                ));
            }
            all.extend(ends);
        }
        cuts.push((count, p50_p99(all)));
    }

    println!();
    println!(
        "mcp-access-gateway benchmark (release; {} requests per path; one run)",
        args.requests
    );
    row(
        "figure (ms)",
        &[
            "direct".into(),
            "gateway".into(),
            "nginx".into(),
            "gw-direct".into(),
            "nginx-direct".into(),
            "gw/nginx".into(),
        ],
    );
    for (label, data) in [
        ("sequential", &seq),
        (&format!("{} concurrent", args.concurrency) as &str, &conc),
    ] {
        let stats: Vec<(f64, f64)> = data.iter().map(|d| p50_p99(d.clone())).collect();
        for (k, name) in [(0usize, "p50"), (1, "p99")] {
            let v = |i: usize| if k == 0 { stats[i].0 } else { stats[i].1 };
            row(
                &format!("request {name}, {label}"),
                &[
                    format!("{:.3}", v(0)),
                    format!("{:.3}", v(1)),
                    format!("{:.3}", v(2)),
                    format!("{:+.3}", v(1) - v(0)),
                    format!("{:+.3}", v(2) - v(0)),
                    format!("{:.2}", v(1) / v(2)),
                ],
            );
        }
    }
    for (count, (p50, p99)) in &cuts {
        row(
            &format!("revoke -> stream cut, {count} stream(s)"),
            &[format!("p50 {p50:.1}"), format!("p99 {p99:.1}")],
        );
    }
    for line in &breakdown {
        println!("  {line}");
    }
    let gw_overhead_p99 = p50_p99(seq[1].clone()).1 - p50_p99(seq[0].clone()).1;
    let nginx_overhead_p99 = p50_p99(seq[2].clone()).1 - p50_p99(seq[0].clone()).1;
    println!();
    println!(
        "goals: overhead p99 <= 1 ms above direct: {:+.3} ms ({}); below nginx's ({:+.3} ms): {}; stream cut p99 <= 50 ms at 500 streams: {}",
        gw_overhead_p99,
        if gw_overhead_p99 <= 1.0 { "met" } else { "missed" },
        nginx_overhead_p99,
        if gw_overhead_p99 < nginx_overhead_p99 { "met" } else { "missed" },
        cuts.iter()
            .find(|(n, _)| *n == 500)
            .map(|(_, (_, p99))| format!("{p99:.1} ms ({})", if *p99 <= 50.0 { "met" } else { "missed" }))
            .unwrap_or_else(|| "not measured".into()),
    );
    drop(gateway);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
