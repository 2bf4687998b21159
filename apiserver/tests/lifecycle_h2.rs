//! The SIGTERM drain as an HTTP/2 peer sees it (kube-apiserver's aggregator and client-go
//! speak HTTP/2 to us over TLS). docs/operations.md: on SIGTERM a replica keeps serving for
//! `--shutdown-delay`, then closes its listeners, "watches end cleanly and their clients
//! re-watch", and the drain takes at most 15 s. `lifecycle.rs` checks the HTTP/1.1 wire (the
//! last chunk); here, on one HTTP/2 connection: the open watch's stream ends with END_STREAM
//! (no RST_STREAM, no error), the connection gets a GOAWAY with NO_ERROR (so the client opens
//! a new connection elsewhere instead of retrying here) and closes without a connection
//! error, and the process exits 0 within the delay plus the drain.
//!
//! Run with `hack/test.sh -p apiserver --test lifecycle_h2`.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;

use support::replica::{announced_ports, apiserver_bin, session_json, signal, wait_ready, Shared};
use support::server::ADMIN_TOKEN;
use support::TestDb;

/// `--shutdown-delay` of the process under test.
const DELAY: Duration = Duration::from_secs(2);
/// The documented bound on the drain after the delay.
const DRAIN: Duration = Duration::from_secs(15);

/// One standalone apiserver process over `db`.
struct Process {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Process {
    async fn start(shared: &Shared, db: &TestDb) -> Self {
        let log = shared.dir.join("h2-drain.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(apiserver_bin())
            .arg("--standalone")
            .arg("--token-auth-file")
            .arg(shared.dir.join("tokens.csv"))
            .arg("--tls-cert-file")
            .arg(shared.dir.join("tls.crt"))
            .arg("--tls-private-key-file")
            .arg(shared.dir.join("tls.key"))
            .args(["--bind-address", "127.0.0.1"])
            .args(["--secure-port", "0"])
            .args(["--metrics-port", "0"])
            .args(["--database-pool-size", "4"])
            .arg(format!("--shutdown-delay={}s", DELAY.as_secs()))
            .arg("--watch-bookmark-interval=1s")
            .env("MCP_ACCESS_DATABASE_URL", db.dsn())
            .env("RUST_LOG", "info")
            .stdout(out.try_clone().unwrap())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start mcp-access-apiserver");
        let stderr = child.stderr.take().expect("stderr is piped");
        let ports = announced_ports(stderr, out, &["api", "metrics"], &log).await;
        let (port, metrics_port) = (ports[0], ports[1]);
        wait_ready(
            &mut child,
            metrics_port,
            "h2-drain",
            &log,
            Duration::from_secs(60),
        )
        .await;
        Self { child, port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS connection that negotiated HTTP/2 (ALPN `h2` only, as the aggregator's transport).
/// The client's transport, whose own goodbye (TLS close_notify, then FIN) may meet a server
/// that has already closed: that write failing (EPIPE, ECONNRESET) is the client's race with
/// a clean close, not something the server did, and is not reported as a connection error.
struct ClientTransport(tokio_rustls::client::TlsStream<tokio::net::TcpStream>);

impl tokio::io::AsyncRead for ClientTransport {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ClientTransport {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset, NotConnected};
        match std::pin::Pin::new(&mut self.0).poll_shutdown(cx) {
            std::task::Poll::Ready(Err(e))
                if matches!(e.kind(), BrokenPipe | ConnectionReset | NotConnected) =>
            {
                std::task::Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

async fn h2_tls(ca_pem: &str, port: u16) -> ClientTransport {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the server did not negotiate HTTP/2"
    );
    ClientTransport(tls)
}

/// Reads the stream to its end; the events (one JSON object per line) and how it ended:
/// `Ok` at END_STREAM, the error on RST_STREAM or a connection error.
async fn read_stream(mut body: h2::RecvStream) -> (Vec<Value>, Result<(), h2::Error>) {
    let mut bytes = Vec::new();
    let end = loop {
        match body.data().await {
            Some(Ok(chunk)) => {
                let _ = body.flow_control().release_capacity(chunk.len());
                bytes.extend_from_slice(&chunk);
            }
            Some(Err(e)) => break Err(e),
            None => break Ok(()),
        }
    };
    let events = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("an event per line"))
        .collect();
    (events, end)
}

#[tokio::test]
async fn sigterm_ends_an_http2_watch_with_end_stream_and_goaway_then_exits_0() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let mut process = Process::start(&shared, &db).await;
    let sessions = format!(
        "https://127.0.0.1:{}/apis/{}/namespaces/h2-drain/accesssessions",
        process.port,
        apis::API_VERSION
    );
    let created = shared
        .http()
        .post(&sessions)
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_json("before"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let rv = created.json::<Value>().await.unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let tls = h2_tls(&shared.ca_pem, process.port).await;
    let (client, connection) = h2::client::handshake(tls).await.unwrap();
    let connection = tokio::spawn(connection);
    let watch = http::Request::get(format!(
        "{sessions}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
    ))
    .header(http::header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
    .body(())
    .unwrap();
    let mut sender = client.clone().ready().await.unwrap();
    let (response, _) = sender.send_request(watch, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let stream = tokio::spawn(read_stream(response.into_body()));
    // The watch is live: an event written now reaches it before the signal.
    let created = shared
        .http()
        .post(&sessions)
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_json("watched"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!stream.is_finished(), "the watch ended before SIGTERM");

    let sent = Instant::now();
    signal("-TERM", process.child.id());

    // The watch's stream ends with END_STREAM after the delay and within the drain.
    let (events, end) = tokio::time::timeout(DELAY + DRAIN, stream)
        .await
        .unwrap_or_else(|_| panic!("the watch outlived the drain: {}", process.log()))
        .unwrap();
    let ended_after = sent.elapsed();
    assert!(
        end.is_ok(),
        "the watch's HTTP/2 stream did not end cleanly: {end:?}\n{}",
        process.log()
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "watched"),
        "the watch was not live: {events:?}"
    );
    assert!(
        events.iter().all(|e| e["type"] != "ERROR"),
        "a drain is not an error: {events:?}"
    );

    // The connection was told to go away, gracefully, and closed without an error.
    let closed = tokio::time::timeout(DRAIN, connection)
        .await
        .expect("the HTTP/2 connection outlived the drain")
        .unwrap();
    assert!(
        closed.is_ok(),
        "the HTTP/2 connection ended with an error: {closed:?}"
    );
    let refused = match client.ready().await {
        Err(e) => e,
        Ok(mut sender) => {
            let request = http::Request::get(&sessions).body(()).unwrap();
            match sender.send_request(request, true) {
                Err(e) => e,
                Ok((response, _)) => response.await.expect_err("a request after the drain"),
            }
        }
    };
    assert!(
        refused.is_go_away()
            && refused.is_remote()
            && refused.reason() == Some(h2::Reason::NO_ERROR),
        "no GOAWAY(NO_ERROR) from the server: {refused:?}"
    );

    // The process exits 0 within the delay and the drain.
    let exit = loop {
        if let Some(status) = process.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < DELAY + DRAIN,
            "still running {:?} after SIGTERM: {}",
            sent.elapsed(),
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "exit status {exit}: {}", process.log());
    eprintln!(
        "HTTP/2 watch ended cleanly {ended_after:?} after SIGTERM (delay {DELAY:?}); exited 0 after {:?}",
        sent.elapsed()
    );
}
