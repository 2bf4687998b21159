//! The `mcp-access-apiserver` process's lifecycle, on a real PostgreSQL: one log line per
//! request that never carries a token, a serving certificate rotated on disk and served to
//! new connections without a restart, and the SIGTERM drain (readiness fails first, in-flight
//! writes complete, watches end with the clean end of their stream, exit 0).
//!
//! Run with `hack/test.sh -p apiserver --test lifecycle`.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::replica::{
    announced_ports, apiserver_bin, readyz_answer, session_json, signal, wait_ready, Shared,
};
use support::server::ADMIN_TOKEN;
use support::TestDb;

/// One apiserver process in standalone mode over `db`, with `extra` flags.
struct Process {
    child: Child,
    port: u16,
    metrics_port: u16,
    log: PathBuf,
}

impl Process {
    async fn start(shared: &Shared, db: &TestDb, name: &str, extra: &[&str]) -> Self {
        let log = shared.dir.join(format!("{name}.log"));
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
            .args(extra)
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
        let mut process = Self {
            child,
            port,
            metrics_port,
            log,
        };
        wait_ready(
            &mut process.child,
            process.metrics_port,
            name,
            &process.log,
            Duration::from_secs(60),
        )
        .await;
        process
    }

    /// `/readyz`: its status and body, `(0, "")` when the listener does not answer.
    async fn readyz_answer(&self) -> (u16, String) {
        readyz_answer(self.metrics_port).await
    }

    async fn readyz(&self) -> u16 {
        self.readyz_answer().await.0
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sessions_url(&self, ns: &str) -> String {
        format!(
            "https://127.0.0.1:{}/apis/{}/namespaces/{ns}/accesssessions",
            self.port,
            apis::API_VERSION
        )
    }

    /// Waits for the process to exit; its exit status.
    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS client trusting `roots` (PEM), speaking HTTP/1.1 only.
fn tls_connector(roots: &[&str]) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for pem in roots {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            store.add(cert.unwrap()).unwrap();
        }
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // A resumed session carries the certificate of the session it resumes: every connection
    // here is a full handshake, so it shows what the server presents now.
    config.resumption = rustls::client::Resumption::disabled();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn tls_connect(connector: &tokio_rustls::TlsConnector, port: u16) -> std::io::Result<Tls> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
}

/// The leaf certificate the server presented on `tls`.
fn peer_leaf(tls: &Tls) -> Vec<u8> {
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec()
}

/// An HTTP/1.1 client on one TLS connection: requests are sent one after the other on it.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    leaf: Vec<u8>,
}

impl Connection {
    async fn open(connector: &tokio_rustls::TlsConnector, port: u16) -> Self {
        let tls = tls_connect(connector, port).await.unwrap();
        let leaf = peer_leaf(&tls);
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        Self { sender, leaf }
    }

    /// GETs `path` as the admin; the status.
    async fn get(&mut self, path: &str) -> u16 {
        use http_body_util::BodyExt;
        self.sender.ready().await.unwrap();
        let request = http::Request::get(path)
            .header(http::header::HOST, "127.0.0.1")
            .header(http::header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"))
            .body(http_body_util::Empty::new())
            .unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        response.into_body().collect().await.unwrap();
        status
    }
}

fn new_pair() -> (String, String, CertificateDer<'static>) {
    let generated =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    (
        generated.cert.pem(),
        generated.signing_key.serialize_pem(),
        generated.cert.der().clone(),
    )
}

/// Writes `contents` to `path` as a rotation tool does: a new file renamed over the old one.
fn replace_file(path: &std::path::Path, contents: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The lines the request log wrote (JSON format).
fn request_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "mcp_access::request")
        .collect()
}

#[tokio::test]
async fn every_request_is_logged_once_with_its_fields_and_never_its_token() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let process = Process::start(&shared, &db, "json", &["--log-format=json"]).await;
    let client = shared.http();
    let bad_token = "wrong-token-5f3c9a1b7e";

    let created = client
        .post(process.sessions_url("logs"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_json("s1"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let got = client
        .get(format!("{}/s1", process.sessions_url("logs")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    let missing = client
        .get(format!("{}/nope", process.sessions_url("logs")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let refused = client
        .get(process.sessions_url("logs"))
        .bearer_auth(bad_token)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Lines are written as the response head goes out: wait until all four are there.
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let lines = request_lines(&process.log());
        if lines.len() >= 4 || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), 4, "one line per request: {lines:#?}");
    let fields: Vec<(String, String, String, String, String, u64)> = lines
        .iter()
        .map(|l| {
            let f = &l["fields"];
            assert!(
                f["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
                "latency: {l}"
            );
            assert_eq!(f["message"], "request", "{l}");
            (
                f["verb"].as_str().unwrap().to_string(),
                f["resource"].as_str().unwrap().to_string(),
                f["namespace"].as_str().unwrap().to_string(),
                f["name"].as_str().unwrap().to_string(),
                f["user"].as_str().unwrap().to_string(),
                f["code"].as_u64().unwrap(),
            )
        })
        .collect();
    let s = |v: &str| v.to_string();
    assert_eq!(
        fields,
        vec![
            (
                s("create"),
                s("accesssessions"),
                s("logs"),
                s(""),
                s("admin"),
                201
            ),
            (
                s("get"),
                s("accesssessions"),
                s("logs"),
                s("s1"),
                s("admin"),
                200
            ),
            (
                s("get"),
                s("accesssessions"),
                s("logs"),
                s("nope"),
                s("admin"),
                404
            ),
            // Refused before the request was understood: the verb by method, no user.
            (s("get"), s(""), s("logs"), s(""), s(""), 401),
        ]
    );
    let log = process.log();
    for secret in [ADMIN_TOKEN, bad_token] {
        assert!(!log.contains(secret), "a token reached the log:\n{log}");
    }
    assert!(
        !log.to_ascii_lowercase().contains("bearer"),
        "an Authorization header reached the log:\n{log}"
    );
    drop(process);

    // The text format carries the same fields.
    let text = Process::start(&shared, &db, "text", &["--log-format=text"]).await;
    let got = client
        .get(format!("{}/s1", text.sessions_url("logs")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = text.log();
        let line = log.lines().find(|l| l.contains("mcp_access::request"));
        if let Some(line) = line {
            for field in [
                "verb=\"get\"",
                "resource=\"accesssessions\"",
                "namespace=\"logs\"",
                "name=\"s1\"",
                "user=\"admin\"",
                "code=200",
                "latency_ms=",
            ] {
                assert!(line.contains(field), "{field} in {line}");
            }
            assert!(
                !log.contains(ADMIN_TOKEN),
                "a token reached the log:\n{log}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no request line:\n{log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rotated_serving_certificate_reaches_new_connections_without_a_restart() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let mut process =
        Process::start(&shared, &db, "rotate", &["--tls-reload-interval=100ms"]).await;
    let old_pem = shared.ca_pem.clone();
    let old_leaf = CertificateDer::from_pem_slice(old_pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec();
    let (new_pem, new_key, new_der) = new_pair();
    let connector = tls_connector(&[&old_pem, &new_pem]);
    let path = format!(
        "/apis/{}/namespaces/rotate/accesssessions",
        apis::API_VERSION
    );

    let mut before = Connection::open(&connector, process.port).await;
    assert_eq!(before.leaf, old_leaf, "the certificate on disk is served");
    assert_eq!(before.get(&path).await, 200);

    // Rotated as cert-manager or a Secret volume does: the key, then the certificate. The
    // half-rotated pair does not load; the old certificate is kept until the pair matches.
    replace_file(&shared.dir.join("tls.key"), &new_key);
    replace_file(&shared.dir.join("tls.crt"), &new_pem);
    let rotated = Instant::now();
    let deadline = rotated + Duration::from_secs(10);
    let mut after = loop {
        let conn = Connection::open(&connector, process.port).await;
        if conn.leaf == new_der.as_ref() {
            break conn;
        }
        assert_eq!(conn.leaf, old_leaf, "a certificate nobody wrote");
        assert!(
            Instant::now() < deadline,
            "new connections still get the old certificate: {}",
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "new connections got the rotated certificate {:?} after it was written",
        rotated.elapsed()
    );
    assert_eq!(after.get(&path).await, 200);
    // The connection opened before the rotation goes on, with the certificate it negotiated.
    assert_eq!(before.get(&path).await, 200);
    assert_eq!(before.leaf, old_leaf);
    // No restart: the same process, and the reload is in its log.
    assert!(process.child.try_wait().unwrap().is_none());
    assert!(
        process.log().contains("reloaded serving certificate"),
        "{}",
        process.log()
    );
    // A client that trusts only the old CA cannot reach the rotated server any more.
    let old_only = tls_connector(&[&old_pem]);
    assert!(tls_connect(&old_only, process.port).await.is_err());
}

/// Reads a raw HTTP/1.1 response to its end: (the bytes, whether it ended with a clean TLS
/// close, as opposed to a reset or a truncated stream).
async fn read_to_end(mut tls: Tls) -> (Vec<u8>, Result<(), String>) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) => return (bytes, Ok(())),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => return (bytes, Err(format!("{:?}: {e}", e.kind()))),
        }
    }
}

#[tokio::test]
async fn sigterm_fails_readiness_first_completes_writes_and_ends_watches_cleanly() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let delay = Duration::from_secs(2);
    let mut process = Process::start(
        &shared,
        &db,
        "drain",
        &[
            "--shutdown-delay=2s",
            "--database-lock-timeout=30s",
            "--watch-bookmark-interval=1s",
        ],
    )
    .await;
    let client = shared.http();
    let created = client
        .post(process.sessions_url("drain"))
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

    // A watch on a raw connection, to see how its stream ends on the wire.
    let connector = tls_connector(&[&shared.ca_pem]);
    let mut watch = tls_connect(&connector, process.port).await.unwrap();
    watch
        .write_all(
            format!(
                "GET /apis/{}/namespaces/drain/accesssessions?watch=true&allowWatchBookmarks=true&resourceVersion={rv} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n",
                apis::API_VERSION
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let watch = tokio::spawn(read_to_end(watch));

    // A write held in flight: the sync-state row lock every write takes is held here.
    let pg = db.client().await;
    pg.batch_execute("BEGIN; SELECT epoch FROM sync_state WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let write = tokio::spawn({
        let client = client.clone();
        let url = process.sessions_url("drain");
        async move {
            let resp = client
                .post(url)
                .bearer_auth(ADMIN_TOKEN)
                .json(&session_json("in-flight"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(resp.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!write.is_finished(), "the write waits for the lock");

    let pid = process.child.id();
    let sent = Instant::now();
    signal("-TERM", pid);

    // 1. Readiness fails at once, while the API still serves new connections.
    let (code, body) = loop {
        let answer = process.readyz_answer().await;
        if answer.0 != 200 {
            break answer;
        }
        // Expected a few ms (the signal handler flips readiness); 1 s is over 5x.
        assert!(sent.elapsed() < Duration::from_secs(1), "still ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let not_ready_after = sent.elapsed();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("shutting-down"), "{body}");
    let fresh = shared.http();
    let served = fresh
        .get(process.sessions_url("drain"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("a new connection is served during the shutdown delay");
    assert_eq!(served.status(), 200);
    // An ordering: served before the listener closes at `delay` (2 s); expected ~100 ms.
    assert!(sent.elapsed() < delay, "served within the delay");

    // 2. After the delay the listener is closed: new connections are refused, while the
    //    probes still answer (not ready) and the in-flight write is still waiting.
    let closed_after = loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", process.port))
            .await
            .is_err()
        {
            break sent.elapsed();
        }
        // Expected `delay` plus a few ms; 3 s past it is a margin of far more than 5x.
        assert!(
            sent.elapsed() < delay + Duration::from_secs(3),
            "the listener is still open: {}",
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        closed_after >= delay,
        "the listener closed before the delay: {closed_after:?}"
    );
    assert_eq!(process.readyz().await, 503, "the probes stop last");
    assert!(!write.is_finished(), "the write is still in flight");
    assert!(
        process.child.try_wait().unwrap().is_none(),
        "the process waits for its in-flight write"
    );

    // 3. The write completes and is answered.
    pg.batch_execute("COMMIT").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), write)
        .await
        .expect("the in-flight write is answered")
        .unwrap()
        .expect("the in-flight write's connection is not dropped");
    assert_eq!(status, 201, "the in-flight write completes");

    // 4. The watch ended with the clean end of its chunked stream, then a clean close.
    let (bytes, end) = tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("the watch ends")
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.starts_with("HTTP/1.1 200")
            && text
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
        "{text}"
    );
    assert!(
        text.ends_with("\r\n0\r\n\r\n"),
        "the watch stream ends with its last chunk: {text}"
    );
    assert_eq!(end, Ok(()), "closed cleanly, not reset: {text}");

    // 5. Exit 0 once drained.
    let exit = process.wait_exit(Duration::from_secs(10));
    assert!(exit.success(), "exit status {exit}: {}", process.log());
    eprintln!(
        "not ready {not_ready_after:?} after SIGTERM, listener closed after {closed_after:?}, exited after {:?}",
        sent.elapsed()
    );
    let stored: i64 = pg
        .query_one(
            "SELECT count(*) FROM objects WHERE resource = 'accesssessions' AND name = 'in-flight'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "the in-flight write is stored");
    assert!(
        process.log().contains("drained; exiting"),
        "{}",
        process.log()
    );
}
