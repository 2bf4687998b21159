//! Idle watches at gateway scale (run by `hack/bench-watches.sh`, never by CI): one real
//! `mcp-access-apiserver` behind the local kube-apiserver holds N idle watches on its API
//! port (8443's role: a front-proxy client certificate, as kube-apiserver's aggregator
//! connects, one TLS connection per watch) and M on its gateway sync listener (8085's role:
//! a Pod-bound gateway token checked by TokenReview and the live owner chain, one connection
//! per watch, as gateways connect). Prints the process's resident memory (VmRSS) before and
//! after, KiB per watch, and how long one session took to reach every watcher.
//!
//! Then, in the same process and run, `--h2` more watches on the API port multiplexed over
//! HTTP/2 connections (`--h2-streams` per connection), as kube-apiserver's aggregator and
//! client-go/kube-rs clients hold them; the memory they add is reported on its own line, side
//! by side with the one-connection-per-watch figure.
//!
//! Usage: `idle_watches [--api 5000] [--sync 5000] [--h2 5000] [--h2-streams 100]
//! [--settle 10]`; needs
//! `MCP_ACCESS_APISERVER_BIN` and `KUBE_APISERVER`, `KUBE_CONTROLLER_MANAGER`, `ETCD` (from
//! `hack/build-kube.sh`). The figure to compare with the target (50 KiB per watch) is the
//! "KiB per watch" line; nothing here gates anything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::{Database, LocalCluster, Options};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "bench-watches";
/// How an ADDED event line ends (the encoder sorts keys).
const ADDED: &[u8] = b"\"type\":\"ADDED\"";
/// The name in the serving certificate (the Service kube-apiserver's aggregator dials).
const SERVICE_HOST: &str = "mcp-access-apiserver.mcp-access.svc";

struct Args {
    api: usize,
    sync: usize,
    h2: usize,
    h2_streams: usize,
    settle: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        api: 5000,
        sync: 5000,
        h2: 5000,
        h2_streams: 100,
        settle: Duration::from_secs(10),
    };
    // `cargo bench` passes `--bench`.
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--api" => args.api = value.parse()?,
            "--sync" => args.sync = value.parse()?,
            "--h2" => args.h2 = value.parse()?,
            "--h2-streams" => args.h2_streams = value.parse::<usize>()?.clamp(1, 250),
            "--settle" => args.settle = Duration::from_secs(value.parse()?),
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

fn need(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run hack/bench-watches.sh"))
}

fn main() -> Result<()> {
    // `cargo test --all-targets` runs benches too: only the script starts this one.
    if std::env::var_os("MCP_BENCH_WATCHES").is_none() {
        eprintln!("MCP_BENCH_WATCHES is not set; run hack/bench-watches.sh");
        return Ok(());
    }
    let args = parse_args()?;
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-bench-watches-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let most = (args.api + args.h2).max(args.sync);
    let cluster = LocalCluster::start(Options {
        dir: dir.clone(),
        apiserver_bin: PathBuf::from(need("MCP_ACCESS_APISERVER_BIN")?),
        database: Database::Local,
        // All API watches are one user's, all sync watches one gateway Pod's.
        apiserver_args: vec![format!("--max-watches-per-user={}", most + 100)],
        node: false,
    })?;
    let result = bench(&cluster, &args);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

fn bench(cluster: &LocalCluster, args: &Args) -> Result<()> {
    let out = cluster.kubectl(&["create", "namespace", NS]);
    if !out.success {
        bail!("create namespace: {}", out.stderr);
    }
    let chain = cluster.create_gateway_chain(NS, "bench")?;
    let token = cluster.gateway_token(&chain)?;
    let pid = cluster
        .apiserver_pid()
        .context("the apiserver is not running")?;
    let ca = std::fs::read(cluster.sync_ca())?;
    let pki = PathBuf::from(
        cluster
            .env
            .get("FRONT_PROXY_CA_FILE")
            .context("FRONT_PROXY_CA_FILE missing")?,
    )
    .parent()
    .context("no pki directory")?
    .to_path_buf();
    let proxy_cert = std::fs::read(pki.join("front-proxy-client.crt"))?;
    let proxy_key = std::fs::read(pki.join("front-proxy-client.key"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(
        cluster,
        args,
        pid,
        Clients {
            api: connector(&ca, Some((&proxy_cert, &proxy_key)), b"http/1.1")?,
            sync: connector(&ca, None, b"http/1.1")?,
            h2: connector(&ca, Some((&proxy_cert, &proxy_key)), b"h2")?,
        },
        &token,
        &chain.server_uid,
    ))
}

struct Clients {
    api: tokio_rustls::TlsConnector,
    sync: tokio_rustls::TlsConnector,
    /// The API port's client offering only HTTP/2.
    h2: tokio_rustls::TlsConnector,
}

fn connector(
    ca: &[u8],
    identity: Option<(&[u8], &[u8])>,
    alpn: &[u8],
) -> Result<tokio_rustls::TlsConnector> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(key)?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One watch over its own TLS connection: waits for the response head, then reads events
/// in the background and reports when the first ADDED arrives.
async fn open_watch(
    connector: tokio_rustls::TlsConnector,
    addr: SocketAddr,
    request: String,
    added: tokio::sync::mpsc::UnboundedSender<Instant>,
) -> Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = connector
        .connect(ServerName::try_from(SERVICE_HOST)?, tcp)
        .await?;
    tls.write_all(request.as_bytes()).await?;
    tls.flush().await?;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut buf).await?;
        if n == 0 {
            bail!("closed before the response head");
        }
        head.extend_from_slice(&buf[..n]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!(
            "answered {}",
            String::from_utf8_lossy(&head[..head.len().min(600)])
        );
    }
    let mut seen = head;
    tokio::spawn(async move {
        let mut reported = false;
        loop {
            if !reported && seen.windows(ADDED.len()).any(|w| w == ADDED) {
                let _ = added.send(Instant::now());
                reported = true;
                seen = Vec::new();
            }
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) if !reported => {
                    // Keep a little context for a match across reads.
                    let keep = seen.len().saturating_sub(32);
                    seen.drain(..keep);
                    seen.extend_from_slice(&buf[..n]);
                }
                Ok(_) => {}
            }
        }
    });
    Ok(())
}

/// `streams` watches over one HTTP/2 connection: waits for every response head, then reads
/// each stream in the background (returning its flow-control credit) and reports when its
/// first ADDED arrives.
async fn open_h2_watches(
    connector: tokio_rustls::TlsConnector,
    addr: SocketAddr,
    uri: String,
    headers: &[(&'static str, &'static str)],
    streams: usize,
    added: tokio::sync::mpsc::UnboundedSender<Instant>,
) -> Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = connector
        .connect(ServerName::try_from(SERVICE_HOST)?, tcp)
        .await?;
    if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        bail!("the server did not negotiate h2");
    }
    let (client, connection) = h2::client::handshake(tls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await?;
    let mut responses = Vec::with_capacity(streams);
    for _ in 0..streams {
        let mut request = http::Request::get(&uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (response, _) = client.send_request(request.body(())?, true)?;
        responses.push(response);
        client = client.ready().await?;
    }
    for response in responses {
        let response = response.await?;
        if response.status() != 200 {
            bail!("answered {}", response.status());
        }
        let mut body = response.into_body();
        let added = added.clone();
        tokio::spawn(async move {
            let mut reported = false;
            let mut seen: Vec<u8> = Vec::new();
            while let Some(Ok(data)) = body.data().await {
                let _ = body.flow_control().release_capacity(data.len());
                if reported {
                    continue;
                }
                let keep = seen.len().saturating_sub(32);
                seen.drain(..keep);
                seen.extend_from_slice(&data);
                if seen.windows(ADDED.len()).any(|w| w == ADDED) {
                    let _ = added.send(Instant::now());
                    reported = true;
                    seen = Vec::new();
                }
            }
        });
    }
    // The connection lives as long as a clone of its handle does.
    tokio::spawn(async move {
        let _client = client;
        std::future::pending::<()>().await
    });
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `mcp_access_apiserver_open_watches` from the metrics listener.
async fn open_watches(metrics_port: u16) -> Result<i64> {
    let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|l| l.strip_prefix("mcp_access_apiserver_open_watches "))
        .and_then(|v| v.trim().parse().ok())
        .context("no open_watches in /metrics")
}

async fn run(
    cluster: &LocalCluster,
    args: &Args,
    pid: u32,
    clients: Clients,
    token: &str,
    server_uid: &str,
) -> Result<()> {
    let path = format!("/apis/{}/namespaces/{NS}/accesssessions", apis::API_VERSION);
    let api_addr: SocketAddr = ([127, 0, 0, 1], cluster.api_port).into();
    let sync_addr: SocketAddr = ([127, 0, 0, 1], cluster.sync_port).into();
    let user_headers =
        "X-Remote-User: bench-watcher\r\nX-Remote-Group: system:masters\r\nX-Remote-Group: system:authenticated\r\n";
    // The current resourceVersion, so no watch starts with a list of its own.
    let rv = {
        let tcp = tokio::net::TcpStream::connect(api_addr).await?;
        let mut tls = clients
            .api
            .connect(ServerName::try_from(SERVICE_HOST)?, tcp)
            .await?;
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n{user_headers}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await.ok();
        let text = String::from_utf8_lossy(&out);
        let body = text.split("\r\n\r\n").nth(1).context("no list body")?;
        let at = body
            .find("\"resourceVersion\":\"")
            .context("no resourceVersion in the list")?;
        let rest = &body[at + 19..];
        rest[..rest.find('"').context("unterminated resourceVersion")?].to_string()
    };
    let query = format!("watch=1&allowWatchBookmarks=true&resourceVersion={rv}");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(pid)?;
    let (added_tx, mut added_rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(64));
    let mut opening = Vec::new();
    for i in 0..args.api + args.sync {
        let (connector, addr, request) = if i < args.api {
            (
                clients.api.clone(),
                api_addr,
                format!(
                    "GET {path}?{query} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n{user_headers}\r\n"
                ),
            )
        } else {
            (
                clients.sync.clone(),
                sync_addr,
                format!(
                    "GET {path}?{query} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nAuthorization: Bearer {token}\r\n\r\n"
                ),
            )
        };
        let (added, handshakes) = (added_tx.clone(), handshakes.clone());
        opening.push(tokio::spawn(async move {
            let _permit = handshakes.acquire_owned().await?;
            open_watch(connector, addr, request, added).await
        }));
    }
    for (i, task) in opening.into_iter().enumerate() {
        task.await?.with_context(|| {
            format!("watch {i} ({})", if i < args.api { "API" } else { "sync" })
        })?;
    }
    let total = args.api + args.sync;
    eprintln!(
        "{total} watches established in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // Bookmarks have been sent and every buffer has been touched.
    tokio::time::sleep(args.settle).await;
    let open = open_watches(cluster.metrics_port).await?;
    let after = rss_kib(pid)?;
    // kube-controller-manager's metadata informers (garbage collector, quota) hold a few
    // watches of their own.
    if open < total as i64 {
        bail!("the apiserver reports {open} open watches, {total} were opened");
    }

    // The same watches multiplexed over HTTP/2, in this process beside the others.
    let started = Instant::now();
    let connections = args.h2.div_ceil(args.h2_streams);
    let mut opening = Vec::new();
    let uri = format!("https://{SERVICE_HOST}{path}?{query}");
    for c in 0..connections {
        let streams = args.h2_streams.min(args.h2 - c * args.h2_streams);
        let (connector, uri, added) = (clients.h2.clone(), uri.clone(), added_tx.clone());
        opening.push(tokio::spawn(async move {
            open_h2_watches(
                connector,
                api_addr,
                uri,
                &[
                    ("x-remote-user", "bench-watcher"),
                    ("x-remote-group", "system:masters"),
                ],
                streams,
                added,
            )
            .await
        }));
    }
    drop(added_tx);
    for (i, task) in opening.into_iter().enumerate() {
        task.await?
            .with_context(|| format!("HTTP/2 connection {i}"))?;
    }
    if args.h2 > 0 {
        eprintln!(
            "{} HTTP/2 watches on {connections} connections established in {:.1}s",
            args.h2,
            started.elapsed().as_secs_f64()
        );
    }
    tokio::time::sleep(args.settle).await;
    let open_h2 = open_watches(cluster.metrics_port).await?;
    let after_h2 = rss_kib(pid)?;
    if open_h2 < (total + args.h2) as i64 {
        bail!(
            "the apiserver reports {open_h2} open watches, {} were opened",
            total + args.h2
        );
    }
    let total = total + args.h2;

    // One session of the gateways' server: every watcher must see it.
    let body = serde_json::json!({
        "apiVersion": apis::API_VERSION,
        "kind": "AccessSession",
        "metadata": {"name": "everyone", "namespace": NS},
        "spec": {
            "server": {"name": "bench", "uid": server_uid},
            "teams": ["bench"],
            "expiresAt": k8s_openapi::jiff::Timestamp::from_second(
                k8s_openapi::jiff::Timestamp::now().as_second() + 3600
            )?.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }
    })
    .to_string();
    let tcp = tokio::net::TcpStream::connect(api_addr).await?;
    let mut tls = clients
        .api
        .connect(ServerName::try_from(SERVICE_HOST)?, tcp)
        .await?;
    tls.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n{user_headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    let sent = Instant::now();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.ok();
    if !out.starts_with(b"HTTP/1.1 201") {
        bail!(
            "the session was not created: {}",
            String::from_utf8_lossy(&out[..out.len().min(600)])
        );
    }
    let written = Instant::now();
    let mut delivered = Vec::with_capacity(total);
    while delivered.len() < total {
        match tokio::time::timeout(Duration::from_secs(60), added_rx.recv()).await {
            Ok(Some(at)) => delivered.push(at.saturating_duration_since(sent).as_secs_f64() * 1e3),
            _ => bail!(
                "only {} of {total} watchers got the session within 60 s",
                delivered.len()
            ),
        }
    }
    delivered.sort_by(f64::total_cmp);
    let after_event = rss_kib(pid)?;

    println!();
    println!(
        "idle watches in one mcp-access-apiserver: {} on the API port (front-proxy certificate), {} on the gateway sync listener (Pod-bound token); one TLS connection each ({open} open in all, kube-controller-manager's included)",
        args.api, args.sync
    );
    let one_each = args.api + args.sync;
    println!(
        "  VmRSS before {:.1} MiB, with {one_each} watches {:.1} MiB (after {}s idle): {:.1} KiB per watch",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        args.settle.as_secs(),
        (after.saturating_sub(before)) as f64 / one_each.max(1) as f64
    );
    println!(
        "  then {} watches multiplexed over HTTP/2 ({} per connection, API port): VmRSS {:.1} MiB: {:.1} KiB per watch; ratio one-connection-each / HTTP/2 = {:.2}",
        args.h2,
        args.h2_streams,
        after_h2 as f64 / 1024.0,
        after_h2.saturating_sub(after) as f64 / args.h2.max(1) as f64,
        (after.saturating_sub(before) as f64 / one_each.max(1) as f64)
            / (after_h2.saturating_sub(after) as f64 / args.h2.max(1) as f64)
    );
    println!(
        "  one session to every watcher (from the write sent; the write took {:.1} ms): p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms; VmRSS then {:.1} MiB",
        written.duration_since(sent).as_secs_f64() * 1e3,
        percentile(&delivered, 50.0),
        percentile(&delivered, 99.0),
        delivered.last().copied().unwrap_or(f64::NAN),
        after_event as f64 / 1024.0
    );
    Ok(())
}
