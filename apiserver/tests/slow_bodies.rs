//! Request bodies that never finish, against real TLS listeners over a real PostgreSQL.
//! docs/operations.md ("HTTP"): "a body not received within 60 s is 504". A write whose
//! headers arrived and whose body is stalled, or trickled a byte a second (which no idle or
//! header timer ever sees as idle), holds an in-flight place: it must be answered 504
//! `Timeout` within that bound. The gateway sync listener reads no body at all (it serves
//! only reads): a request there with a stalled body is answered at once and its connection
//! does not outlive the same bound. `attacks_slow.rs` covers trickled headers and TLS
//! handshakes; nothing else covers bodies.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::auth::{
    AllowAuthenticated, Freshness, GatewayAuthenticator, GatewayIdentity, GatewayRefusal,
};
use apiserver::http::{AppState, HttpConfig, HttpMetrics, SyncState};
use apiserver::tls::{self, ReloadingCert};
use async_trait::async_trait;
use prometheus_client::registry::Registry;
use rustls_pki_types::pem::PemObject;
use support::server::{static_tokens, ADMIN_TOKEN};
use support::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The documented bound on receiving a request body.
const BODY_BOUND: Duration = Duration::from_secs(60);
/// How much later than the bound the answer may come on a loaded machine.
const SLACK: Duration = Duration::from_secs(10);

const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/default/accesssessions";

/// The sync listener knows no gateway: what is under test happens whoever calls.
struct NoGateways;

#[async_trait]
impl GatewayAuthenticator for NoGateways {
    async fn authenticate(
        &self,
        _token: &str,
        _freshness: Freshness,
    ) -> Result<GatewayIdentity, GatewayRefusal> {
        Err(GatewayRefusal::ChainBroken)
    }
}

/// The API and sync listeners of one application, as the binary wires them.
struct Listeners {
    api: SocketAddr,
    sync: SocketAddr,
    ca_pem: String,
    _shutdown: tokio::sync::watch::Sender<bool>,
    _db: TestDb,
}

impl Listeners {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let db = TestDb::new().await;
        let store = db.store().await;
        let (key, ca_pem) = tls::self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let cert = ReloadingCert::fixed(key);
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let app = AppState::new(
            store,
            static_tokens(),
            Arc::new(AllowAuthenticated),
            HttpConfig::default(),
            HttpMetrics::register(&mut Registry::default()),
            shutdown_rx.clone(),
        );
        let sync = SyncState::new(app.clone(), Arc::new(NoGateways), Duration::from_secs(30));
        let api_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sync_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (api, sync_addr) = (
            api_listener.local_addr().unwrap(),
            sync_listener.local_addr().unwrap(),
        );
        tokio::spawn(apiserver::server::serve_api(
            api_listener,
            tls::server_config(cert.clone(), None).unwrap(),
            app,
            shutdown_rx.clone(),
        ));
        tokio::spawn(apiserver::server::serve_api(
            sync_listener,
            tls::server_config(cert, None).unwrap(),
            sync,
            shutdown_rx,
        ));
        Self {
            api,
            sync: sync_addr,
            ca_pem,
            _shutdown: shutdown,
            _db: db,
        }
    }

    async fn connect(
        &self,
        addr: SocketAddr,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap()
    }
}

/// How the body after the headers is sent.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// One byte, then nothing.
    Stalled,
    /// A space (JSON whitespace) every second: the connection is never idle.
    Trickled,
}

/// What the client saw: the answer's status line and text (empty if none came), when it
/// came and when the server closed the connection, counted from the end of the headers.
#[derive(Debug)]
struct Seen {
    answer: String,
    answered_after: Option<Duration>,
    closed_after: Option<Duration>,
}

impl Seen {
    fn status(&self) -> Option<u16> {
        self.answer
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
    }
}

/// Sends a POST's headers promising a 1,000-byte body, then `body`, and watches the
/// connection for `watch_for`.
async fn post_with_slow_body(
    server: &Listeners,
    addr: SocketAddr,
    body: Body,
    watch_for: Duration,
) -> Seen {
    let mut conn = server.connect(addr).await;
    conn.write_all(
        format!(
            "POST {SESSIONS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    conn.flush().await.unwrap();
    let started = Instant::now();
    let mut seen = Seen {
        answer: String::new(),
        answered_after: None,
        closed_after: None,
    };
    let mut trickle = tokio::time::interval(Duration::from_secs(1));
    trickle.tick().await;
    let mut buf = [0u8; 4096];
    let mut writing = true;
    while started.elapsed() < watch_for {
        tokio::select! {
            read = conn.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    seen.closed_after = Some(started.elapsed());
                    break;
                }
                Ok(n) => {
                    seen.answered_after.get_or_insert(started.elapsed());
                    seen.answer.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            },
            _ = trickle.tick(), if writing && matches!(body, Body::Trickled) => {
                // A write error means the server closed: the read sees it next.
                writing = conn.write_all(b" ").await.is_ok() && conn.flush().await.is_ok();
            }
            _ = tokio::time::sleep(watch_for.saturating_sub(started.elapsed())) => break,
        }
    }
    seen
}

/// 504 `Timeout` Status, answered within the bound and not long before it.
fn assert_cut_at_the_body_bound(what: &str, seen: &Seen) {
    eprintln!("{what}: {seen:?}");
    let Some(after) = seen.answered_after else {
        panic!("{what}: no answer within {:?}", BODY_BOUND + SLACK);
    };
    assert_eq!(seen.status(), Some(504), "{what}: {}", seen.answer);
    assert!(
        seen.answer.contains("\"kind\":\"Status\"")
            && seen.answer.contains("\"reason\":\"Timeout\""),
        "{what}: not a Timeout Status: {}",
        seen.answer
    );
    assert!(
        after >= BODY_BOUND - Duration::from_secs(2),
        "{what}: answered after {after:?}, before the body bound of {BODY_BOUND:?}"
    );
    assert!(
        after <= BODY_BOUND + SLACK,
        "{what}: answered after {after:?}"
    );
}

#[tokio::test]
async fn a_body_stalled_or_trickled_is_cut_with_504_within_the_bound_on_both_listeners() {
    let server = Listeners::start().await;
    let watch_for = BODY_BOUND + SLACK;
    // All at once: each is timed on its own, and the test waits out the bound only once.
    let (stalled, trickled, sync) = tokio::join!(
        post_with_slow_body(&server, server.api, Body::Stalled, watch_for),
        post_with_slow_body(&server, server.api, Body::Trickled, watch_for),
        post_with_slow_body(&server, server.sync, Body::Stalled, watch_for),
    );
    assert_cut_at_the_body_bound("API listener, body stalled", &stalled);
    assert_cut_at_the_body_bound("API listener, body trickled a byte a second", &trickled);

    // The sync listener reads no body: the request is refused at once (no gateway here),
    // and the connection, whose unread body makes it unusable, is not held open for longer
    // than the body bound.
    eprintln!("sync listener, body stalled: {sync:?}");
    let answered = sync
        .answered_after
        .expect("the sync listener never answered");
    assert!(
        answered < Duration::from_secs(5),
        "the sync listener waited {answered:?} for a body it does not read"
    );
    assert_eq!(sync.status(), Some(401), "{}", sync.answer);
    let closed = sync
        .closed_after
        .unwrap_or_else(|| panic!("the sync listener held the connection over {watch_for:?}"));
    assert!(closed <= BODY_BOUND + SLACK, "closed after {closed:?}");
}
