//! The gateway sync listener's scope and surface, over a real PostgreSQL store, driven
//! through `SyncState::handle` without sockets. Who a gateway is comes from a fixed table
//! here (kube-apiserver's TokenReview and the live owner chain are exercised end to end in
//! `e2e/tests/cluster/gateway_*.rs`): what is under test is that no request shape reaches
//! outside the gateway's server — namespaces, names, label and field selectors, pages,
//! streaming lists, watches from a resourceVersion, Table rendering — and that nothing but
//! reads of sessions and tool policies is served, besides the session-token keys and issuer.

mod support;

use std::sync::Arc;
use std::time::Duration;

use apiserver::auth::{AllowAuthenticated, TokenFile};
use apiserver::http::{AppState, HttpConfig, HttpMetrics, SyncState};
use apiserver::store::PgStore;
use apiserver::tokens::{SessionTokens, SigningKey, TokenMetrics};
use axum::body::Body;
use http::{header, Method, Request};
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use serde_json::Value;
use support::gateways::Gateways;
use support::{mk_session, StoreExt, TestDb};

const A_TOKEN: &str = "gateway-a-token";
const B_TOKEN: &str = "gateway-b-token";
const NS: &str = "team";
const OTHER_NS: &str = "elsewhere";
const SERVER_A: &str = "uid-server-a";
const SERVER_B: &str = "uid-server-b";
const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const ADMIN_TOKEN: &str = "admin-token";
const ISSUER: &str = "https://mcp-access.sync.test";
const JWKS: &str = "/openid/v1/jwks";
const OPENID_CONFIGURATION: &str = "/.well-known/openid-configuration";

fn ns_sessions(ns: &str) -> String {
    format!("/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions")
}

/// A response as a client reads it: status, content type, body.
struct Raw {
    code: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Raw {
    async fn of(response: axum::response::Response) -> Self {
        let code = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Self {
            code,
            content_type,
            body: body.to_vec(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A GET, with `Authorization: Bearer TOKEN` when a token is given.
fn get_request(token: Option<&str>, path: &str) -> Request<Body> {
    let mut request = Request::builder().uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(Body::empty()).unwrap()
}

struct Sync {
    sync: SyncState<PgStore>,
    /// The API listener over the same state, as the server runs both.
    api: AppState<PgStore>,
    /// The session-token signing key's kid, and the verification key's published beside it.
    signing_kid: String,
    verification_kid: String,
    store: PgStore,
    gateways: Arc<Gateways>,
    /// Kept: watches end when the server's shutdown channel closes.
    _shutdown: tokio::sync::watch::Sender<bool>,
    _db: TestDb,
}

impl Sync {
    async fn start(reverify: Duration) -> Self {
        let db = TestDb::new().await;
        let store = db.store().await;
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        // A signing key and, as during a rotation, a verification key beside it.
        let signing = SigningKey::generate().expect("a P-256 key");
        let verification = SigningKey::generate().expect("a P-256 key").public;
        let (signing_kid, verification_kid) =
            (signing.public.kid.clone(), verification.kid.clone());
        let published = vec![signing.public.clone(), verification];
        let tokens = SessionTokens::from_keys(
            signing,
            published,
            ISSUER.into(),
            Duration::from_secs(3600),
            apis::session_token::DEFAULT_AUDIENCE_TEMPLATE.into(),
            TokenMetrics::register(&mut Registry::default()),
        );
        let app = AppState::new(
            store.clone(),
            // The API listener's users are not gateways.
            Arc::new(
                TokenFile::parse("admin-token,admin,admin-uid,\"system:masters\"\n", "test")
                    .expect("token file"),
            ),
            Arc::new(AllowAuthenticated),
            HttpConfig::default(),
            HttpMetrics::register(&mut Registry::default()),
            shutdown,
        )
        .with_session_tokens(Arc::new(tokens));
        let gateways = Gateways::with(&[(A_TOKEN, NS, SERVER_A), (B_TOKEN, NS, SERVER_B)]);
        let sync = SyncState::new(app.clone(), gateways.clone(), reverify);
        // A's sessions in its namespace; B's beside them; A's server UID in another
        // namespace (another namespace's server of that UID is not A's).
        for (ns, name, uid) in [
            (NS, "a-1", SERVER_A),
            (NS, "a-2", SERVER_A),
            (NS, "a-3", SERVER_A),
            (NS, "b-1", SERVER_B),
            (NS, "b-2", SERVER_B),
            (OTHER_NS, "a-elsewhere", SERVER_A),
        ] {
            store
                .create_session(mk_session(ns, name, uid), false)
                .await
                .expect("session created");
        }
        Self {
            sync,
            api: app,
            signing_kid,
            verification_kid,
            store,
            gateways,
            _shutdown: shutdown_tx,
            _db: db,
        }
    }

    /// `body` sent to the API listener as the admin: a write through the whole API path.
    async fn admin(&self, method: Method, uri: &str, body: &Value) -> Raw {
        Raw::of(
            self.api
                .clone()
                .handle(
                    Request::builder()
                        .method(method)
                        .uri(uri)
                        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                        .header("content-type", "application/json")
                        .body(Body::from(body.to_string()))
                        .unwrap(),
                )
                .await,
        )
        .await
    }

    async fn send(&self, method: Method, token: &str, path: &str, accept: &str) -> (u16, Value) {
        let response = self
            .sync
            .clone()
            .handle(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .header("authorization", format!("Bearer {token}"))
                    .header("accept", accept)
                    .header("content-type", "application/json")
                    .body(Body::from("{}"))
                    .unwrap(),
            )
            .await;
        let code = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// A GET on the sync listener.
    async fn sync_raw(&self, token: Option<&str>, path: &str) -> Raw {
        Raw::of(self.sync.clone().handle(get_request(token, path)).await).await
    }

    /// A GET on the API listener.
    async fn api_raw(&self, token: Option<&str>, path: &str) -> Raw {
        Raw::of(self.api.clone().handle(get_request(token, path)).await).await
    }

    async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        self.send(Method::GET, token, path, "application/json")
            .await
    }

    /// The names a list answers with, after checking it is a 200 AccessSessionList.
    async fn names(&self, token: &str, path: &str) -> Vec<String> {
        let (code, body) = self.get(token, path).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert_eq!(body["kind"], "AccessSessionList", "{path}: {body}");
        names(&body)
    }

    /// Opens a watch and returns its body, to read events from.
    async fn watch(&self, token: &str, path: &str) -> Body {
        let response = self
            .sync
            .clone()
            .handle(
                Request::builder()
                    .uri(path)
                    .header("authorization", format!("Bearer {token}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(response.status(), 200, "{path}");
        response.into_body()
    }
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Reads watch events until `n` arrived or `within` passed; `None` as the last element when
/// the stream ended.
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
            Ok(_) => return (out, true),
            Err(_) => break,
        }
    }
    (out, false)
}

fn event_names(events: &[Value], kind: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| {
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn lists_hold_only_the_gateways_server_in_its_namespace_whatever_is_asked() {
    let s = Sync::start(Duration::from_secs(30)).await;
    let own = ["a-1", "a-2", "a-3"];
    assert_eq!(s.names(A_TOKEN, SESSIONS).await, own);
    assert_eq!(s.names(A_TOKEN, &ns_sessions(NS)).await, own);
    assert_eq!(s.names(B_TOKEN, SESSIONS).await, ["b-1", "b-2"]);
    // Another namespace, though it holds a session of the same server UID.
    assert!(s.names(A_TOKEN, &ns_sessions(OTHER_NS)).await.is_empty());
    for selector in [
        format!("fieldSelector=spec.server.uid%3D{SERVER_B}"),
        format!("fieldSelector=spec.server.uid!%3D{SERVER_A}"),
        format!("fieldSelector=metadata.namespace%3D{OTHER_NS}"),
        "fieldSelector=metadata.name%3Db-1".to_string(),
        "labelSelector=nothing%3Dhere".to_string(),
    ] {
        assert!(
            s.names(A_TOKEN, &format!("{SESSIONS}?{selector}"))
                .await
                .is_empty(),
            "{selector}"
        );
    }
    // Selectors inside the scope narrow it as usual.
    assert_eq!(
        s.names(
            A_TOKEN,
            &format!("{SESSIONS}?fieldSelector=metadata.name%3Da-2")
        )
        .await,
        ["a-2"]
    );
    // Pages walk the scope only.
    let mut seen = Vec::new();
    let mut next = format!("{SESSIONS}?limit=1");
    loop {
        let (code, page) = s.get(A_TOKEN, &next).await;
        assert_eq!(code, 200, "{page}");
        seen.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(token) if !token.is_empty() => {
                next = format!("{SESSIONS}?limit=1&continue={token}")
            }
            _ => break,
        }
    }
    assert_eq!(seen, own);
    // kubectl's Table rendering too.
    let (code, table) = s.send(Method::GET, A_TOKEN, &ns_sessions(NS), TABLE).await;
    assert_eq!(code, 200, "{table}");
    let rows: Vec<&str> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["object"]["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(rows, own);
}

#[tokio::test]
async fn another_servers_session_is_the_404_of_a_missing_one() {
    let s = Sync::start(Duration::from_secs(30)).await;
    let (code, own) = s.get(A_TOKEN, &format!("{}/a-1", ns_sessions(NS))).await;
    assert_eq!((code, own["metadata"]["name"].as_str()), (200, Some("a-1")));
    let (code, missing) = s.get(A_TOKEN, &format!("{}/b-9", ns_sessions(NS))).await;
    assert_eq!(code, 404, "{missing}");
    for (ns, name) in [(NS, "b-1"), (OTHER_NS, "a-elsewhere")] {
        let (code, theirs) = s.get(A_TOKEN, &format!("{}/{name}", ns_sessions(ns))).await;
        assert_eq!(code, 404, "{theirs}");
        // The very answer a missing name gets, but for the name: no hint it exists.
        let expected = serde_json::to_string(&missing)
            .unwrap()
            .replace("b-9", name);
        assert_eq!(serde_json::to_string(&theirs).unwrap(), expected);
    }
}

#[tokio::test]
async fn watches_and_streaming_lists_carry_only_the_gateways_sessions() {
    let s = Sync::start(Duration::from_secs(30)).await;
    // A streaming list (what client-go's WatchList sends).
    let mut streaming = s
        .watch(
            A_TOKEN,
            &format!("{SESSIONS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
        )
        .await;
    let (initial, ended) = events(&mut streaming, 4, Duration::from_secs(5)).await;
    assert!(!ended);
    assert_eq!(event_names(&initial, "ADDED"), ["a-1", "a-2", "a-3"]);
    assert_eq!(initial[3]["type"], "BOOKMARK");
    // A watch from a resourceVersion sees A's changes and not B's.
    let (_, list) = s.get(A_TOKEN, SESSIONS).await;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut from_rv = s
        .watch(A_TOKEN, &format!("{SESSIONS}?watch=1&resourceVersion={rv}"))
        .await;
    for (ns, name, uid) in [
        (NS, "b-new", SERVER_B),
        (OTHER_NS, "a-new-elsewhere", SERVER_A),
        (NS, "a-new", SERVER_A),
    ] {
        s.store
            .create_session(mk_session(ns, name, uid), false)
            .await
            .unwrap();
    }
    support::revoke(&s.store, NS, "b-1", "user_requested").await;
    support::revoke(&s.store, NS, "a-1", "user_requested").await;
    for body in [&mut from_rv, &mut streaming] {
        let (seen, _) = events(body, 2, Duration::from_secs(5)).await;
        let seen: Vec<&Value> = seen.iter().filter(|e| e["type"] != "BOOKMARK").collect();
        let seen: Vec<Value> = seen.into_iter().cloned().collect();
        assert_eq!(event_names(&seen, "ADDED"), ["a-new"], "{seen:?}");
        assert_eq!(event_names(&seen, "MODIFIED"), ["a-1"], "{seen:?}");
        // Nothing else arrives: B's revocation and the other namespace's session never do.
        let (more, _) = events(body, 1, Duration::from_millis(300)).await;
        assert!(more.iter().all(|e| e["type"] == "BOOKMARK"), "{more:?}");
    }
}

#[tokio::test]
async fn only_reads_of_sessions_are_served() {
    let s = Sync::start(Duration::from_secs(30)).await;
    let one = format!("{}/a-1", ns_sessions(NS));
    for (method, path) in [
        (Method::POST, ns_sessions(NS)),
        (Method::PUT, one.clone()),
        (Method::PATCH, one.clone()),
        (Method::DELETE, one.clone()),
        (Method::DELETE, ns_sessions(NS)),
    ] {
        let (code, body) = s
            .send(method.clone(), A_TOKEN, &path, "application/json")
            .await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (405, Some("MethodNotAllowed")),
            "{method} {path}: {body}"
        );
    }
    let nothing_else = [
        "/apis/access.mcp-runtime.dev/v1alpha1/agents".to_string(),
        "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/team/revocations".to_string(),
        "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/team/enrollments".to_string(),
        format!("{one}/status"),
        "/openapi/v2".to_string(),
        "/openapi/v3".to_string(),
        "/api/v1/namespaces/team/pods".to_string(),
    ];
    for path in nothing_else {
        let (code, body) = s.get(A_TOKEN, &path).await;
        assert_eq!(code, 404, "{path}: {body}");
    }
    // Discovery names sessions and tool policies, read-only, and nothing else.
    let (code, list) = s
        .get(A_TOKEN, "/apis/access.mcp-runtime.dev/v1alpha1")
        .await;
    assert_eq!(code, 200);
    let resources = list["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 2, "{list}");
    assert_eq!(resources[0]["name"], "accesssessions");
    assert_eq!(resources[1]["name"], "toolpolicies");
    for resource in resources {
        assert_eq!(
            resource["verbs"],
            serde_json::json!(["get", "list", "watch"])
        );
    }
}

/// A tool policy for the server `server` in `ns`, created through the API listener.
async fn create_policy(s: &Sync, ns: &str, name: &str, server: &str) {
    let body = serde_json::json!({
        "apiVersion": "access.mcp-runtime.dev/v1alpha1",
        "kind": "ToolPolicy",
        "metadata": {"name": name},
        "spec": {
            "server": {"name": server},
            "tools": [{"name": "delete_*", "sideEffect": "destructive"}],
        },
    });
    let raw = s.admin(Method::POST, &ns_policies(ns), &body).await;
    assert_eq!(raw.code, 201, "{}", String::from_utf8_lossy(&raw.body));
}

fn ns_policies(ns: &str) -> String {
    format!("/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/toolpolicies")
}

const POLICIES: &str = "/apis/access.mcp-runtime.dev/v1alpha1/toolpolicies";

/// Tool policies are scoped by server name (they hold for every generation of the server):
/// a gateway lists, gets and watches its server's policies in its namespace and nothing
/// else, and cannot write them.
#[tokio::test]
async fn tool_policies_are_served_to_their_servers_gateways_only() {
    const C_TOKEN: &str = "gateway-c-token";
    let s = Sync::start(Duration::from_secs(30)).await;
    s.gateways.add_named(C_TOKEN, NS, "gitlab", "uid-server-c");
    for (ns, name, server) in [
        (NS, "gh-1", "github"),
        (NS, "gh-2", "github"),
        (NS, "gl-1", "gitlab"),
        (OTHER_NS, "gh-elsewhere", "github"),
    ] {
        create_policy(&s, ns, name, server).await;
    }
    let listed = |token: &'static str, path: String| {
        let s = &s;
        async move {
            let (code, body) = s.get(token, &path).await;
            assert_eq!(code, 200, "{path}: {body}");
            assert_eq!(body["kind"], "ToolPolicyList", "{path}: {body}");
            names(&body)
        }
    };
    // A and B are both gateways of "github" (two generations): both see its policies.
    assert_eq!(listed(A_TOKEN, POLICIES.into()).await, ["gh-1", "gh-2"]);
    assert_eq!(listed(B_TOKEN, ns_policies(NS)).await, ["gh-1", "gh-2"]);
    assert_eq!(listed(C_TOKEN, POLICIES.into()).await, ["gl-1"]);
    assert!(listed(A_TOKEN, ns_policies(OTHER_NS)).await.is_empty());
    for selector in [
        "spec.server.name%3Dgitlab",
        "metadata.namespace%3Delsewhere",
    ] {
        let path = format!("{POLICIES}?fieldSelector={selector}");
        assert!(listed(A_TOKEN, path).await.is_empty(), "{selector}");
    }
    let (code, _) = s.get(A_TOKEN, &format!("{}/gh-1", ns_policies(NS))).await;
    assert_eq!(code, 200);
    for (token, path) in [
        (A_TOKEN, format!("{}/gl-1", ns_policies(NS))),
        (A_TOKEN, format!("{}/gh-elsewhere", ns_policies(OTHER_NS))),
        (C_TOKEN, format!("{}/gh-1", ns_policies(NS))),
    ] {
        let (code, body) = s.get(token, &path).await;
        assert_eq!(code, 404, "{path}: {body}");
    }
    // A watch carries the server's new policies and nothing else.
    let (_, list) = s.get(A_TOKEN, POLICIES).await;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = s
        .watch(A_TOKEN, &format!("{POLICIES}?watch=1&resourceVersion={rv}"))
        .await;
    create_policy(&s, NS, "gl-2", "gitlab").await;
    create_policy(&s, OTHER_NS, "gh-elsewhere-2", "github").await;
    create_policy(&s, NS, "gh-3", "github").await;
    let (seen, _) = events(&mut watch, 1, Duration::from_secs(5)).await;
    assert_eq!(event_names(&seen, "ADDED"), ["gh-3"], "{seen:?}");
    let (more, _) = events(&mut watch, 1, Duration::from_millis(300)).await;
    assert!(more.iter().all(|e| e["type"] == "BOOKMARK"), "{more:?}");
    // Reads only.
    for (method, path) in [
        (Method::POST, ns_policies(NS)),
        (Method::PUT, format!("{}/gh-1", ns_policies(NS))),
        (Method::DELETE, format!("{}/gh-1", ns_policies(NS))),
        (Method::DELETE, ns_policies(NS)),
    ] {
        let (code, body) = s
            .send(method.clone(), A_TOKEN, &path, "application/json")
            .await;
        assert_eq!(code, 405, "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn unknown_gateways_are_401_with_a_reason_that_names_no_object() {
    let s = Sync::start(Duration::from_secs(30)).await;
    for token in ["", "not-a-gateway"] {
        let (code, body) = s.get(token, SESSIONS).await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (401, Some("Unauthorized")),
            "{body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        for named in [NS, "github", SERVER_A, SERVER_B, "pod-of-"] {
            assert!(!message.contains(named), "{message}");
        }
    }
    // Discovery too is for gateways only; health is for everyone.
    let (code, _) = s.get("not-a-gateway", "/apis").await;
    assert_eq!(code, 401);
    let (code, _) = s.get("", "/readyz").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn an_open_watch_ends_when_the_gateways_chain_breaks() {
    let s = Sync::start(Duration::from_millis(200)).await;
    let mut a = s.watch(A_TOKEN, &format!("{SESSIONS}?watch=1")).await;
    let mut b = s.watch(B_TOKEN, &format!("{SESSIONS}?watch=1")).await;
    let (first, _) = events(&mut a, 3, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 3);
    s.gateways.break_chain(A_TOKEN);
    let (_, ended) = events(&mut a, usize::MAX, Duration::from_secs(5)).await;
    assert!(ended, "the watch outlived its chain");
    // The other gateway's watch goes on.
    let (_, ended) = events(&mut b, usize::MAX, Duration::from_millis(600)).await;
    assert!(!ended);
    let (code, _) = s.get(A_TOKEN, SESSIONS).await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn gateways_get_the_token_keys_and_issuer_of_the_api_listener() {
    let s = Sync::start(Duration::from_secs(30)).await;
    let jwks = s.sync_raw(Some(A_TOKEN), JWKS).await;
    assert_eq!(jwks.code, 200, "{}", jwks.json());
    assert_eq!(jwks.content_type, "application/jwk-set+json");
    let set = jwks.json();
    let kids: Vec<&str> = set["keys"]
        .as_array()
        .expect("a JWK Set")
        .iter()
        .map(|k| k["kid"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        kids,
        [s.signing_kid.as_str(), s.verification_kid.as_str()],
        "{set}"
    );
    assert_eq!(
        (&set["keys"][0]["kty"], &set["keys"][0]["alg"]),
        (&Value::from("EC"), &Value::from("ES256"))
    );
    // The very document the API listener serves: gateways trust what kubectl users fetch.
    let from_api = s.api_raw(Some(ADMIN_TOKEN), JWKS).await;
    assert_eq!(from_api.code, 200);
    assert_eq!(jwks.body, from_api.body);
    // Every gateway gets it, whichever its server.
    assert_eq!(s.sync_raw(Some(B_TOKEN), JWKS).await.body, jwks.body);

    let config = s.sync_raw(Some(A_TOKEN), OPENID_CONFIGURATION).await;
    assert_eq!(config.code, 200, "{}", config.json());
    assert_eq!(config.content_type, "application/json");
    let document = config.json();
    assert_eq!(document["issuer"], ISSUER, "{document}");
    // Relative, so it names the JWKS of the listener it was fetched from.
    assert_eq!(document["jwks_uri"], JWKS, "{document}");
    assert_eq!(
        document["id_token_signing_alg_values_supported"],
        serde_json::json!(["ES256"])
    );
    let from_api = s.api_raw(Some(ADMIN_TOKEN), OPENID_CONFIGURATION).await;
    assert_eq!(from_api.code, 200);
    assert_eq!(config.body, from_api.body);
}

#[tokio::test]
async fn the_token_keys_and_issuer_are_401_without_a_gateway() {
    let s = Sync::start(Duration::from_secs(30)).await;
    for path in [JWKS, OPENID_CONFIGURATION] {
        // No Authorization header, an empty bearer, a token of no gateway, a user of the API
        // listener (not a gateway).
        for token in [None, Some(""), Some("not-a-gateway"), Some(ADMIN_TOKEN)] {
            let refused = s.sync_raw(token, path).await;
            let status = refused.json();
            assert_eq!(
                (
                    refused.code,
                    status["kind"].as_str(),
                    status["reason"].as_str()
                ),
                (401, Some("Status"), Some("Unauthorized")),
                "{path} with {token:?}: {status}"
            );
            assert!(
                !String::from_utf8_lossy(&refused.body).contains(&s.signing_kid)
                    && !String::from_utf8_lossy(&refused.body).contains(ISSUER),
                "{path} with {token:?}: {status}"
            );
        }
    }
    // A gateway whose chain broke is refused as well.
    s.gateways.break_chain(A_TOKEN);
    assert_eq!(s.sync_raw(Some(A_TOKEN), JWKS).await.code, 401);
    assert_eq!(s.sync_raw(Some(B_TOKEN), JWKS).await.code, 200);
}

/// A gateway's report of a pinned tool listed with another definition (issue 31): taken (202)
/// for a policy of its own server that pins exactly that, and handed on to become an Event on
/// its MCPServer; anything else is refused and hands on nothing.
#[tokio::test]
async fn drift_reports_are_taken_for_the_gateways_own_pins_only() {
    let mut s = Sync::start(Duration::from_secs(30)).await;
    let (events, mut drifts) = apiserver::events::DriftEvents::channel(8);
    s.sync = s.sync.clone().with_drift_events(events);
    let pinned = format!("sha256:{}", "a".repeat(64));
    let observed = format!("sha256:{}", "b".repeat(64));
    for (name, server) in [("gh-pins", "github"), ("gl-pins", "gitlab")] {
        let body = serde_json::json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "ToolPolicy",
            "metadata": {"name": name},
            "spec": {"server": {"name": server},
                     "tools": [{"name": "echo", "sideEffect": "read", "digest": pinned}]},
        });
        let raw = s.admin(Method::POST, &ns_policies(NS), &body).await;
        assert_eq!(raw.code, 201, "{}", String::from_utf8_lossy(&raw.body));
    }
    let report = |policy: &str, body: String| {
        let s = &s;
        let uri = format!("{}/{policy}/drift", ns_policies(NS));
        async move {
            let response = s
                .sync
                .clone()
                .handle(
                    Request::builder()
                        .method(Method::POST)
                        .uri(uri)
                        .header("authorization", format!("Bearer {A_TOKEN}"))
                        .header("content-type", "application/json")
                        .body(Body::from(body))
                        .unwrap(),
                )
                .await;
            Raw::of(response).await.code
        }
    };
    let good =
        serde_json::json!({"tool": "echo", "pinned": pinned, "observed": observed}).to_string();
    assert_eq!(report("gh-pins", good.clone()).await, 202);
    let drift = drifts.try_recv().expect("the report is handed on");
    assert_eq!(
        (
            drift.server_name.as_str(),
            drift.server_uid.as_str(),
            drift.tool.as_str()
        ),
        ("github", SERVER_A, "echo")
    );
    assert_eq!(
        (drift.pinned, drift.observed),
        (pinned.clone(), observed.clone())
    );
    // Another server's policy, an unknown one, a pin it does not hold, a malformed or oversized
    // report: refused, nothing handed on.
    assert_eq!(report("gl-pins", good.clone()).await, 404);
    assert_eq!(report("missing", good.clone()).await, 404);
    let other_pin =
        serde_json::json!({"tool": "echo", "pinned": observed, "observed": pinned}).to_string();
    assert_eq!(report("gh-pins", other_pin).await, 400);
    let bad_digest =
        serde_json::json!({"tool": "echo", "pinned": pinned, "observed": "md5:x"}).to_string();
    assert_eq!(report("gh-pins", bad_digest).await, 400);
    assert_eq!(report("gh-pins", "{".into()).await, 400);
    assert_eq!(report("gh-pins", "x".repeat(10_000)).await, 413);
    assert!(drifts.try_recv().is_err());
    let (code, _) = s
        .get(A_TOKEN, &format!("{}/gh-pins/drift", ns_policies(NS)))
        .await;
    assert_eq!(code, 405);
}

/// A server's ToolPolicies are capped together at admission (700 KiB, what gateways take): a
/// policy that would carry them past it is refused whole (422 naming the cap), whether created
/// or grown by an update; another server's policies do not count.
#[tokio::test]
async fn a_servers_policies_are_capped_together() {
    let s = Sync::start(Duration::from_secs(30)).await;
    // About 370 KB each: 2,600 destructive rules of 105-character names; two pass the cap.
    let big = |name: &str, server: &str, rules: usize| {
        let tools: Vec<Value> = (0..rules)
            .map(|i| serde_json::json!({"name": format!("{i:0>100}_tail"), "sideEffect": "destructive"}))
            .collect();
        serde_json::json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "ToolPolicy",
            "metadata": {"name": name},
            "spec": {"server": {"name": server}, "tools": tools},
        })
    };
    let send = |method: Method, uri: String, body: Value| {
        let s = &s;
        async move {
            let raw = s.admin(method, &uri, &body).await;
            (raw.code, raw.json())
        }
    };
    let (code, body) = send(Method::POST, ns_policies(NS), big("one", "github", 2_600)).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = send(Method::POST, ns_policies(NS), big("two", "github", 2_600)).await;
    assert_eq!(code, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("would take") && message.contains("716800"),
        "{message}"
    );
    // Another server's policies are capped apart.
    let (code, body) = send(Method::POST, ns_policies(NS), big("other", "gitlab", 2_600)).await;
    assert_eq!(code, 201, "{body}");
    // A small one beside the big one fits; growing it past the cap is refused, and the stored
    // version stays.
    let (code, body) = send(Method::POST, ns_policies(NS), big("small", "github", 10)).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = send(
        Method::PUT,
        format!("{}/small", ns_policies(NS)),
        big("small", "github", 2_600),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    let stored = s
        .api_raw(Some(ADMIN_TOKEN), &format!("{}/small", ns_policies(NS)))
        .await
        .json();
    assert_eq!(stored["spec"]["tools"].as_array().map(Vec::len), Some(10));
    assert_eq!(stored["metadata"]["generation"], 1);
}
