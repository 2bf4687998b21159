//! The gateway sync listener while kube-apiserver cannot answer TokenReview (an outage of
//! the control plane), with the real `PodChainAuthenticator` against a fake kube-apiserver
//! this test switches off and on. docs/operations.md ("The gateway sync listener") promises:
//! a verified chain is reused for `--gateway-reverify-interval`; an open watch re-reads the
//! chain at that interval and ends "after two intervals kube-apiserver cannot answer"; and
//! kube-apiserver unreachable is 503, not 401 (a 401 tells a gateway to drop its authority).
//! So a gateway keeps working through a short outage — its watch goes on delivering events
//! for one interval of grace — and then is refused with 503 until the outage ends.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::auth::{AllowAuthenticated, PodChainAuthenticator, TokenFile};
use apiserver::http::{AppState, HttpConfig, HttpMetrics, SyncState};
use apiserver::store::PgStore;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use support::{mk_session, StoreExt, TestDb};

const NS: &str = "team";
const SERVER: &str = "github";
const SERVER_UID: &str = "uid-server-github";
const POD: &str = "github-7d9f-abcde";
const POD_UID: &str = "uid-pod";
const RS: &str = "github-7d9f";
const RS_UID: &str = "uid-rs";
const DEPLOY_UID: &str = "uid-deploy";
const TOKEN: &str = "projected-gateway-token";
const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/team/accesssessions";
/// `--gateway-reverify-interval` of this test.
const REVERIFY: Duration = Duration::from_secs(3);

/// A kube-apiserver that knows one gateway Pod and its chain, until it is told to be down:
/// then every request is answered 500 (as when etcd fails). Not 503: kube's client retries a
/// 503 with backoff until the review's 10 s timeout, which is another test (`auth_hangs.rs`).
#[derive(Default)]
struct FakeKube {
    down: AtomicBool,
    /// TokenReviews asked while down.
    reviews_while_down: AtomicUsize,
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

async fn fake_kube(State(kube): State<Arc<FakeKube>>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    if kube.down.load(Ordering::SeqCst) {
        if path.ends_with("/tokenreviews") {
            kube.reviews_while_down.fetch_add(1, Ordering::SeqCst);
        }
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "code": 500, "reason": "InternalError", "message": "etcd is down"});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(status)).into_response();
    }
    let object = match (method, path) {
        (Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews") => json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": TOKEN, "audiences": [apiserver::auth::GATEWAY_AUDIENCE]},
            "status": {
                "authenticated": true,
                "audiences": [apiserver::auth::GATEWAY_AUDIENCE],
                "user": {
                    "username": format!("system:serviceaccount:{NS}:{SERVER}-gateway"),
                    "extra": {
                        "authentication.kubernetes.io/pod-name": [POD],
                        "authentication.kubernetes.io/pod-uid": [POD_UID],
                    },
                },
            },
        }),
        (Method::GET, p) if p == format!("/api/v1/namespaces/{NS}/pods/{POD}") => json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": NS, "uid": POD_UID,
                "ownerReferences": owner("apps/v1", "ReplicaSet", RS, RS_UID)},
            "spec": {"serviceAccountName": format!("{SERVER}-gateway"), "containers": []},
        }),
        (Method::GET, p) if p == format!("/apis/apps/v1/namespaces/{NS}/replicasets/{RS}") => {
            json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": RS, "namespace": NS, "uid": RS_UID,
                    "ownerReferences": owner("apps/v1", "Deployment", SERVER, DEPLOY_UID)},
                "spec": {"selector": {}},
            })
        }
        (Method::GET, p) if p == format!("/apis/apps/v1/namespaces/{NS}/deployments/{SERVER}") => {
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": SERVER, "namespace": NS, "uid": DEPLOY_UID,
                    "labels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers",
                               "mcp-runtime.dev/mcpserver": SERVER},
                    "ownerReferences": owner("mcp-runtime.dev/v1alpha1", "MCPServer", SERVER, SERVER_UID)},
                "spec": {"selector": {}, "template": {}},
            })
        }
        (Method::GET, p)
            if p == format!(
                "/apis/mcp-runtime.dev/v1alpha1/namespaces/{NS}/mcpservers/{SERVER}"
            ) =>
        {
            json!({
                "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
                "metadata": {"name": SERVER, "namespace": NS, "uid": SERVER_UID},
                "spec": {"image": "example/github-mcp:1", "port": 8080},
            })
        }
        _ => {
            let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "code": 404, "reason": "NotFound", "message": format!("{path} not found")});
            return (StatusCode::NOT_FOUND, axum::Json(status)).into_response();
        }
    };
    axum::Json(object).into_response()
}

async fn start_fake_kube() -> (kube::Client, Arc<FakeKube>) {
    let kube = Arc::new(FakeKube::default());
    let app = axum::Router::new()
        .fallback(fake_kube)
        .with_state(kube.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), kube)
}

struct Sync {
    sync: SyncState<PgStore>,
    store: PgStore,
    _shutdown: tokio::sync::watch::Sender<bool>,
    _db: TestDb,
}

impl Sync {
    async fn start(kube: kube::Client) -> Self {
        let db = TestDb::new().await;
        let store = db.store().await;
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let app = AppState::new(
            store.clone(),
            Arc::new(TokenFile::parse("admin,admin,admin-uid,\"system:masters\"\n", "t").unwrap()),
            Arc::new(AllowAuthenticated),
            HttpConfig::default(),
            HttpMetrics::register(&mut Registry::default()),
            shutdown,
        );
        let gateways = Arc::new(PodChainAuthenticator::new(kube, REVERIFY));
        for name in ["s-1", "s-2"] {
            store
                .create_session(mk_session(NS, name, SERVER_UID), false)
                .await
                .expect("session created");
        }
        Self {
            sync: SyncState::new(app, gateways, REVERIFY),
            store,
            _shutdown: shutdown_tx,
            _db: db,
        }
    }

    async fn request(&self, path: &str) -> axum::response::Response {
        self.sync
            .clone()
            .handle(
                Request::builder()
                    .uri(path)
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
    }

    /// Status code and body of a list.
    async fn list(&self) -> (u16, Value) {
        let response = self.request(SESSIONS).await;
        let code = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// Reads watch events until `n` arrived or `within` passed; also whether the stream ended.
async fn events(body: &mut Body, n: usize, within: Duration) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut buffer = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                while let Some(i) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=i).collect();
                    out.push(serde_json::from_slice(&line).expect("an event per line"));
                }
            }
            Ok(Some(Err(e))) => panic!("the watch stream failed: {e}"),
            Ok(None) => return (out, true),
            Err(_) => break,
        }
    }
    (out, false)
}

fn added(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .filter_map(|e| e["object"]["metadata"]["name"].as_str())
        .collect()
}

#[tokio::test]
async fn a_gateway_keeps_its_watch_through_one_reverify_interval_of_outage_then_gets_503() {
    let (kube, fake) = start_fake_kube().await;
    let s = Sync::start(kube).await;

    // Verified against the live chain: the list is the gateway's sessions.
    let (code, body) = s.list().await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["items"].as_array().map(Vec::len), Some(2), "{body}");
    let response = s.request(&format!("{SESSIONS}?watch=1")).await;
    assert_eq!(response.status(), 200);
    let mut watch = response.into_body();
    let (initial, ended) = events(&mut watch, 2, Duration::from_secs(5)).await;
    assert!(!ended);
    assert_eq!(added(&initial), ["s-1", "s-2"]);

    // The control plane goes down.
    fake.down.store(true, Ordering::SeqCst);
    let outage = Instant::now();

    // Within the interval the verified chain is reused: a new request is still served.
    let (code, body) = s.list().await;
    assert_eq!(code, 200, "a list right after the outage began: {body}");

    // The watch's first re-verification meets the outage and is the grace, not the end...
    let asked = Instant::now();
    while fake.reviews_while_down.load(Ordering::SeqCst) == 0 {
        assert!(
            asked.elapsed() < REVERIFY * 2,
            "the open watch never re-verified the gateway"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_failure = outage.elapsed();
    // ...so the watch still delivers what happens during it.
    s.store
        .create_session(mk_session(NS, "during-outage", SERVER_UID), false)
        .await
        .expect("session created");
    let (during, ended) = events(&mut watch, 1, Duration::from_secs(2)).await;
    assert!(
        !ended,
        "the watch ended at the first re-verification kube-apiserver could not answer \
         ({first_failure:?} into the outage): no grace"
    );
    assert_eq!(
        added(&during),
        ["during-outage"],
        "a write during the grace did not reach the gateway: {during:?}"
    );

    // After two intervals kube-apiserver could not answer, the watch ends: a closed stream,
    // no ERROR event (the gateway's relist meets the outage itself).
    let (after, ended) = events(&mut watch, usize::MAX, REVERIFY * 3).await;
    let ended_after = outage.elapsed();
    assert!(
        ended,
        "the watch was still open {ended_after:?} into the outage (re-verify every {REVERIFY:?})"
    );
    assert!(
        after.iter().all(|e| e["type"] != "ERROR"),
        "the watch ended with an event: {after:?}"
    );
    assert!(
        ended_after <= REVERIFY * 2 + Duration::from_secs(2),
        "the watch ended {ended_after:?} into the outage; the bound is two intervals of {REVERIFY:?}"
    );
    eprintln!(
        "first failed re-verification {first_failure:?} into the outage, watch ended after {ended_after:?}"
    );

    // The reuse of the chain has run out too: a new request is refused with 503 (retry
    // later), never the 401 that makes a gateway drop its authority.
    let (code, body) = s.list().await;
    assert_eq!(
        code,
        503,
        "a list {:?} into the outage: {body}",
        outage.elapsed()
    );
    assert_eq!(body["reason"], "ServiceUnavailable", "{body}");
    let response = s.request(&format!("{SESSIONS}?watch=1")).await;
    assert_eq!(response.status(), 503, "a new watch during the outage");

    // The control plane is back: the gateway is served again at once.
    fake.down.store(false, Ordering::SeqCst);
    let (code, body) = s.list().await;
    assert_eq!(code, 200, "after the outage: {body}");
    assert_eq!(body["items"].as_array().map(Vec::len), Some(3), "{body}");
}
