//! API benchmark against the real `mcp-access-apiserver` binary (a separate process, so its
//! memory is measured alone):
//! - watch event latency, write sent → event delivered, p50/p99 at 1, 100 and 1,000 watchers;
//! - listing 10,000 sessions, all pages (500 per page, as kubectl and client-go do) and one page;
//! - resident memory per idle watch.
//!
//! Run through `hack/bench-api.sh`, which starts a throwaway PostgreSQL and sets
//! `MCP_BENCH_DATABASE_URL`.

use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::{AccessSession, AccessSessionSpec, ServerRef};
use apiserver::store::{Context, PgStore, Requester, Store, StoreConfig};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

const TOKEN: &str = "bench-admin-token-0123456789";
const SESSIONS: usize = 10_000;

fn session(ns: &str, name: &str, server_uid: &str) -> AccessSession {
    let mut s = AccessSession {
        spec: AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: server_uid.into(),
            },
            teams: vec!["payments".into()],
            expires_at: Some(Time(Timestamp::now() + SignedDuration::from_hours(12))),
            ..Default::default()
        },
        ..Default::default()
    };
    s.metadata.namespace = Some(ns.into());
    s.metadata.name = Some(name.into());
    s
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// Peak resident memory (VmHWM) of `pid` in KiB since the last [`reset_peak`].
fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// Resets the peak resident memory of `pid` to its current resident memory.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Server {
    child: std::process::Child,
    url: String,
    client: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_server(dsn: &str, dir: &std::path::Path) -> Server {
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{TOKEN},admin,admin,\"system:masters\"\n"),
    )
    .unwrap();
    // The server refuses a token file others may read.
    std::fs::set_permissions(
        dir.join("tokens.csv"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-access-apiserver"))
        .args(["--standalone", "--bind-address", "127.0.0.1"])
        .arg("--token-auth-file")
        .arg(dir.join("tokens.csv"))
        .arg("--cert-dir")
        .arg(dir)
        // Port 0: the process says which ports it bound.
        .args(["--secure-port", "0", "--metrics-port", "0"])
        .env("MCP_ACCESS_DATABASE_URL", dsn)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("apiserver starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let ports = e2e::listening::follow("mcp-access-apiserver", stderr, std::io::stderr())
        .wait_ports(&["api", "metrics"], e2e::listening::LISTEN_TIMEOUT)
        .await
        .expect("the apiserver announces its listeners");
    let (port, metrics) = (ports[0], ports[1]);
    let ready = format!("http://127.0.0.1:{metrics}/readyz");
    let plain = reqwest::Client::new();
    for _ in 0..200 {
        if plain
            .get(&ready)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = std::fs::read(dir.join("apiserver.crt")).expect("self-signed certificate written");
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .http1_only()
        .pool_max_idle_per_host(usize::MAX)
        .build()
        .unwrap();
    Server {
        child,
        url: format!("https://127.0.0.1:{port}"),
        client,
    }
}

impl Server {
    async fn current_rv(&self, ns: &str) -> String {
        let list: Value = self
            .client
            .get(format!(
                "{}/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions?limit=1",
                self.url
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Opens a watch; each received event's object name is sent with its arrival time.
    async fn watch(
        &self,
        ns: &str,
        rv: &str,
        seen: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
    ) -> tokio::task::JoinHandle<()> {
        let response = self
            .client
            .get(format!(
                "{}/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions?watch=1&resourceVersion={rv}",
                self.url
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("watch opens");
        assert!(response.status().is_success());
        tokio::spawn(async move {
            let mut stream = response.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = stream.next().await {
                let now = Instant::now();
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                        if let Some(name) = event["object"]["metadata"]["name"].as_str() {
                            let _ = seen.send((name.to_string(), now));
                        }
                    }
                }
            }
        })
    }

    async fn create(&self, ns: &str, name: &str) {
        let body = serde_json::to_vec(&session(ns, name, "srv-latency")).unwrap();
        let r = self
            .client
            .post(format!(
                "{}/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions",
                self.url
            ))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "create: {}", r.status());
    }
}

/// Latency of `writes` writes seen by `watchers` watchers.
async fn watch_latency(
    server: &Server,
    watchers: usize,
    writes: usize,
) -> (Duration, Duration, Duration) {
    let ns = format!("lat-{watchers}");
    let rv = server.current_rv(&ns).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        tasks.push(server.watch(&ns, &rv, tx.clone()).await);
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sent = std::collections::HashMap::new();
    let mut write_rtt = Vec::new();
    for i in 0..writes {
        let name = format!("w-{i}");
        let t0 = Instant::now();
        sent.insert(name.clone(), t0);
        server.create(&ns, &name).await;
        write_rtt.push(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let expected = watchers * writes;
    let mut latencies = Vec::with_capacity(expected);
    let deadline = Instant::now() + Duration::from_secs(60);
    while latencies.len() < expected && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some((name, at))) => {
                if let Some(t0) = sent.get(&name) {
                    latencies.push(at.saturating_duration_since(*t0));
                }
            }
            _ => break,
        }
    }
    for t in tasks {
        t.abort();
    }
    assert_eq!(latencies.len(), expected, "every watcher saw every write");
    latencies.sort();
    write_rtt.sort();
    (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&write_rtt, 0.5),
    )
}

async fn list_all(server: &Server, limit: usize) -> (Duration, usize) {
    let start = Instant::now();
    let mut count = 0;
    let mut token = String::new();
    loop {
        let mut url = format!(
            "{}/apis/access.mcp-runtime.dev/v1alpha1/namespaces/bulk/accesssessions?limit={limit}",
            server.url
        );
        if !token.is_empty() {
            url.push_str(&format!("&continue={token}"));
        }
        let page: Value = server
            .client
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        count += page["items"].as_array().map_or(0, Vec::len);
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => token = c.to_string(),
            _ => break,
        }
    }
    (start.elapsed(), count)
}

/// Lists of every session: the server's peak resident memory during one one-page list
/// (first, on a heap no earlier list has grown), then all pages of 500 and one page (median
/// of 5 each, the client parsing every page into JSON values).
async fn run_lists(server: &Server, pid: u32) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    reset_peak(pid);
    let (_, n) = list_all(server, 0).await;
    assert_eq!(n, SESSIONS);
    println!(
        "list of {SESSIONS} sessions: one page peaks at {:.1} MiB resident above the {:.1} MiB before it",
        peak_kib(pid).saturating_sub(before) as f64 / 1024.0,
        before as f64 / 1024.0
    );
    println!("list of {SESSIONS} sessions (median of 5, client-side JSON parse included):");
    for limit in [500, 0] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let (t, n) = list_all(server, limit).await;
            assert_eq!(n, SESSIONS);
            times.push(t);
        }
        times.sort();
        let label = if limit == 0 {
            "one page".to_string()
        } else {
            format!("pages of {limit}")
        };
        println!("  {label:<14} {:>8.1} ms", ms(times[2]));
    }
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Ok(url) = std::env::var("MCP_BENCH_DATABASE_URL") else {
        eprintln!("MCP_BENCH_DATABASE_URL is not set; run hack/bench-api.sh");
        return;
    };
    let admin = tokio_postgres::Config::from_str(&url).expect("MCP_BENCH_DATABASE_URL parses");
    let (client, conn) = admin.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let db = format!("bench_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let mut config = admin.clone();
    config.dbname(&db);

    // Seed 10,000 sessions through the store before the server starts.
    {
        let store = PgStore::start(StoreConfig::new(config.clone()))
            .await
            .expect("store");
        let store = Arc::new(store);
        let mut tasks = Vec::new();
        for w in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in (w..SESSIONS).step_by(8) {
                    store
                        .create(
                            session("bulk", &format!("s-{i:05}"), "srv-bulk"),
                            &Context::new(apiserver::store::now(), Requester::default()),
                            false,
                        )
                        .await
                        .expect("seed");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    let dsn = format!(
        "host=127.0.0.1 port={} user={} dbname={db}",
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_user().unwrap_or("postgres")
    );
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-bench-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let server = start_server(&dsn, &dir).await;

    // `MCP_BENCH_ONLY=list` measures the lists alone (a shorter run).
    let lists_only = std::env::var("MCP_BENCH_ONLY").is_ok_and(|v| v == "list");
    let pid = server.child.id();
    if lists_only {
        run_lists(&server, pid).await;
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // Memory per idle watcher, measured first, on a fresh process, before lists
    // and latency runs have grown a heap that new watches would reuse: open 1,000
    // watches that receive nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(pid);
    let rv = server.current_rv("idle").await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(server.watch("idle", &rv, tx.clone()).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    println!(
        "resident memory: {:.1} MiB with no watches, {:.1} MiB with 1,000 idle watches: {:.1} KiB per idle watcher",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / 1000.0
    );
    for t in idle {
        t.abort();
    }
    run_lists(&server, pid).await;

    println!("watch latency, write sent -> event delivered (JSON, HTTP/1.1, one connection per watcher):");
    for (watchers, writes) in [(1, 200), (100, 100), (1000, 40)] {
        let (p50, p99, rtt) = watch_latency(&server, watchers, writes).await;
        println!(
            "  {watchers:>5} watchers  p50 {:>7.2} ms  p99 {:>7.2} ms  (write round trip p50 {:.2} ms)",
            ms(p50),
            ms(p99),
            ms(rtt)
        );
    }

    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
