//! The `token` subresource of AccessSession (docs/session-tokens.md) against real PostgreSQL:
//! minted tokens verified with the published JWKS (jsonwebtoken, independent of the signer),
//! every refusal, RBAC on `accesssessions/token`, discovery and OpenAPI, key rotation, the real
//! `kubectl create --raw`, and startup refusals of bad key configurations.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use apiserver::store::Store;
use apiserver::tokens::SigningKey;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};
use support::server::{
    TestServer, TokenSetup, ADMIN_TOKEN, TEST_ISSUER, TEST_TOKEN_MAX_TTL, USER_TOKEN,
};
use support::store_ext::StoreExt;
use support::{in_hours, mk_human_session, mk_session, revoke};

const NS: &str = "demo";
const SERVER_UID: &str = "srv-uid-1";

fn token_request(spec: Value) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
}

async fn jwks(server: &TestServer) -> JwkSet {
    let response = server
        .http()
        .get(format!("{}/openid/v1/jwks", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("the JWKS is served");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.expect("a JWK Set")
}

/// Verifies `token` with the JWK of its `kid` in `set`, for `audience`, and returns its
/// claims.
fn verify(set: &JwkSet, token: &str, audience: &str) -> Value {
    let header = jsonwebtoken::decode_header(token).expect("a JOSE header");
    assert_eq!(header.alg, Algorithm::ES256);
    assert_eq!(header.typ.as_deref(), Some("JWT"));
    let kid = header.kid.expect("a kid");
    let jwk = set.find(&kid).expect("the kid is published");
    let key = DecodingKey::from_jwk(jwk).expect("an EC JWK");
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_issuer(&[TEST_ISSUER]);
    validation.set_audience(&[audience]);
    validation.validate_nbf = true;
    validation.leeway = 0;
    jsonwebtoken::decode::<Value>(token, &key, &validation)
        .expect("the token verifies")
        .claims
}

async fn create(server: &TestServer, session: apis::AccessSession) -> apis::AccessSession {
    server
        .store
        .create_session(session, false)
        .await
        .expect("the session is created")
        .object
}

fn counter(server: &TestServer, series: &str) -> u64 {
    let text = server.metrics_text();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{series} in /metrics:\n{text}"))
}

async fn status_of(response: reqwest::Response) -> (u16, Value) {
    let code = response.status().as_u16();
    let body = response.json().await.expect("a JSON body");
    (code, body)
}

#[tokio::test]
async fn a_token_names_its_session_and_verifies_with_the_published_jwks() {
    let server = TestServer::start().await;
    let session = create(
        &server,
        mk_human_session(NS, "alice-github", SERVER_UID, "alice@example.com"),
    )
    .await;
    let rv_before = server.store.current_version().await.unwrap();

    let response = server
        .request_token_as(ADMIN_TOKEN, NS, "alice-github", &token_request(json!({})))
        .await;
    let (code, body) = status_of(response).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(body["kind"], "TokenRequest");
    assert_eq!(body["metadata"]["name"], "alice-github");
    assert_eq!(body["metadata"]["namespace"], NS);
    assert_eq!(body["spec"]["expirationSeconds"], 600);
    let audience = "http://github.demo.svc:8086";
    assert_eq!(body["spec"]["audiences"], json!([audience]));
    let token = body["status"]["token"].as_str().expect("status.token");

    let claims = verify(&jwks(&server).await, token, audience);
    assert_eq!(claims["iss"], TEST_ISSUER);
    assert_eq!(claims["sub"], "system:accesssession:demo:alice-github");
    assert_eq!(claims["aud"], json!([audience]), "aud is always an array");
    let (iat, nbf, exp) = (
        claims["iat"].as_i64().unwrap(),
        claims["nbf"].as_i64().unwrap(),
        claims["exp"].as_i64().unwrap(),
    );
    assert_eq!(nbf, iat);
    assert_eq!(exp - iat, 600);
    assert!((Timestamp::now().as_second() - iat).abs() <= 5);
    let jti = claims["jti"].as_str().expect("jti");
    assert_eq!(
        uuid::Uuid::parse_str(jti)
            .expect("a UUID")
            .get_version_num(),
        4
    );
    assert_eq!(
        claims["access.mcp-runtime.dev"],
        json!({
            "session": {"namespace": NS, "name": "alice-github", "uid": session.metadata.uid.clone().unwrap()},
            "server": {"name": "github", "uid": SERVER_UID},
            "subject": "alice@example.com",
        }),
        "agent is absent: the session names none"
    );
    let object = claims.as_object().unwrap();
    let mut names: Vec<&str> = object.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "access.mcp-runtime.dev",
            "aud",
            "exp",
            "iat",
            "iss",
            "jti",
            "nbf",
            "sub"
        ]
    );
    let expiration = Timestamp::from_second(exp).unwrap();
    assert_eq!(
        body["status"]["expirationTimestamp"],
        expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    );

    // A token for another audience, asked for.
    let asked = "https://mcp.example.com/github";
    let response = server
        .request_token_as(
            ADMIN_TOKEN,
            NS,
            "alice-github",
            &token_request(json!({"audiences": [asked], "expirationSeconds": 60})),
        )
        .await;
    let (code, body) = status_of(response).await;
    assert_eq!(code, 201, "{body}");
    let claims = verify(
        &jwks(&server).await,
        body["status"]["token"].as_str().unwrap(),
        asked,
    );
    assert_eq!(claims["aud"], json!([asked]));
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        60
    );

    // Nothing was written: no change-log entry, the same list.
    assert_eq!(server.store.current_version().await.unwrap(), rv_before);
    let list: Value = server
        .http()
        .get(server.sessions_url(NS))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["metadata"]["resourceVersion"], rv_before.to_string());
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        counter(&server, "mcp_access_session_tokens_issued_total"),
        2
    );
}

#[tokio::test]
async fn a_token_never_outlives_the_max_ttl_or_its_session() {
    let server = TestServer::start().await;
    // Longer than the maximum lifetime by far: the cap, not the session, sets `exp`.
    let mut long = mk_session(NS, "long", SERVER_UID);
    long.spec.expires_at = Some(in_hours(24));
    create(&server, long).await;
    let mut short = mk_session(NS, "short", SERVER_UID);
    let ends = Timestamp::now()
        .checked_add(SignedDuration::from_secs(300))
        .unwrap();
    let ends = Timestamp::from_second(ends.as_second()).unwrap();
    short.spec.expires_at = Some(Time(ends));
    create(&server, short).await;
    let set = jwks(&server).await;
    let audience = "http://github.demo.svc:8086";

    let ask = token_request(json!({"expirationSeconds": 7200}));
    let (code, body) =
        status_of(server.request_token_as(ADMIN_TOKEN, NS, "long", &ask).await).await;
    assert_eq!(code, 201, "{body}");
    let claims = verify(&set, body["status"]["token"].as_str().unwrap(), audience);
    let max = TEST_TOKEN_MAX_TTL.as_secs() as i64;
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        max
    );
    assert_eq!(
        body["spec"]["expirationSeconds"], max,
        "the effective lifetime is echoed"
    );

    let (code, body) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "short", &ask)
            .await,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let claims = verify(&set, body["status"]["token"].as_str().unwrap(), audience);
    assert_eq!(claims["exp"].as_i64().unwrap(), ends.as_second());
    assert_eq!(
        body["status"]["expirationTimestamp"],
        ends.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
}

#[tokio::test]
async fn sessions_that_cannot_be_used_get_no_token() {
    let server = TestServer::start().await;
    let ask = token_request(json!({}));
    let refused =
        |reason: &str| format!("mcp_access_session_tokens_refused_total{{reason=\"{reason}\"}}");

    create(&server, mk_session(NS, "revoked", SERVER_UID)).await;
    revoke(&server.store, NS, "revoked", "manual").await;
    let (code, body) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "revoked", &ask)
            .await,
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Conflict");
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );

    // Pending enrollment: an Enrollment creates the session.
    let pending = mk_session(NS, "pending", SERVER_UID);
    let mut enrollment = apis::Enrollment {
        spec: pending.spec.clone(),
        ..Default::default()
    };
    enrollment.metadata = pending.metadata.clone();
    server
        .store
        .create_enrollment(enrollment, &support::store_ext::admin(), false)
        .await
        .expect("the enrollment is created");
    let (code, body) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "pending", &ask)
            .await,
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("pending enrollment"),
        "{body}"
    );

    // Past its expiresAt (whether or not the expiry task wrote Expired yet).
    let mut soon = mk_session(NS, "soon", SERVER_UID);
    soon.spec.expires_at = Some(Time(
        Timestamp::now()
            .checked_add(SignedDuration::from_secs(2))
            .unwrap(),
    ));
    create(&server, soon).await;
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let (code, body) =
        status_of(server.request_token_as(ADMIN_TOKEN, NS, "soon", &ask).await).await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "{body}"
    );

    // A fenced server generation: the fence alone refuses, even for an Active session.
    create(&server, mk_session(NS, "fenced", "srv-retired")).await;
    server
        .db
        .client()
        .await
        .execute(
            "INSERT INTO server_fences (server_uid, server_name, namespace, revocation_name, cluster_wide)
             VALUES ('srv-retired', 'github', 'elsewhere', 'retire-github', true)",
            &[],
        )
        .await
        .expect("a fence is installed");
    let (code, body) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "fenced", &ask)
            .await,
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("retired"),
        "{body}"
    );

    let (code, body) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "missing", &ask)
            .await,
    )
    .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["reason"], "NotFound");

    for reason in [
        "revoked",
        "pending_enrollment",
        "expired",
        "fenced",
        "not_found",
    ] {
        assert_eq!(counter(&server, &refused(reason)), 1, "{reason}");
    }
    assert_eq!(
        counter(&server, "mcp_access_session_tokens_issued_total"),
        0
    );
}

#[tokio::test]
async fn malformed_and_invalid_requests_are_refused_with_a_status() {
    let server = TestServer::start().await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;
    let post_raw = |body: &'static str| {
        server
            .http()
            .post(server.token_url(NS, "s"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for body in [
        "not json",
        r#"{"apiVersion":"v1","kind":"Pod"}"#,
        r#"{"spec":{"expirationSeconds":"ten"}}"#,
    ] {
        let (code, status) = status_of(post_raw(body).await.unwrap()).await;
        assert_eq!(code, 400, "{body}: {status}");
        assert_eq!(status["reason"], "BadRequest");
    }

    for (spec, field) in [
        (
            json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}),
            "spec.boundObjectRef",
        ),
        (
            json!({"audiences": ["mcp-runtime-gateway"]}),
            "spec.audiences[0]",
        ),
        (
            json!({"audiences": ["ftp://x.example"]}),
            "spec.audiences[0]",
        ),
        (
            json!({"audiences": ["https://a", "https://b", "https://c", "https://d", "https://e"]}),
            "spec.audiences",
        ),
        (json!({"expirationSeconds": 9}), "spec.expirationSeconds"),
    ] {
        let (code, status) = status_of(
            server
                .request_token_as(ADMIN_TOKEN, NS, "s", &token_request(spec.clone()))
                .await,
        )
        .await;
        assert_eq!(code, 422, "{spec}: {status}");
        assert_eq!(status["reason"], "Invalid");
        assert_eq!(status["details"]["kind"], "TokenRequest");
        assert_eq!(support::cause_fields(&status), [field], "{spec}");
    }
    assert_eq!(
        counter(
            &server,
            "mcp_access_session_tokens_refused_total{reason=\"invalid\"}"
        ),
        5
    );
    assert_eq!(
        counter(
            &server,
            "mcp_access_session_tokens_refused_total{reason=\"malformed\"}"
        ),
        3
    );
}

#[tokio::test]
async fn only_post_is_served_on_the_token_subresource() {
    let server = TestServer::start().await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;
    let http = server.http();
    let url = server.token_url(NS, "s");
    for method in ["GET", "PUT", "PATCH", "DELETE"] {
        let response = http
            .request(method.parse().unwrap(), &url)
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/merge-patch+json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let (code, status) = status_of(response).await;
        assert_eq!(code, 405, "{method}: {status}");
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "MethodNotAllowed");
    }
    // POST with a name stays refused on the object itself.
    let (code, status) = status_of(
        http.post(format!("{}/s", server.sessions_url(NS)))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 405, "{status}");
}

#[tokio::test]
async fn without_a_signing_key_the_subresource_is_unavailable() {
    let server = TestServer::start_with_tokens(TokenSetup::Disabled).await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;
    let (code, status) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "s", &token_request(json!({})))
            .await,
    )
    .await;
    assert_eq!(code, 503, "{status}");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("--session-token-signing-key-file"),
        "{status}"
    );
    assert!(jwks(&server).await.keys.is_empty());
    let response = server
        .http()
        .get(format!("{}/.well-known/openid-configuration", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
}

#[tokio::test]
async fn the_issuer_is_published_and_rotation_publishes_both_keys() {
    let old = SigningKey::generate().unwrap();
    let new = SigningKey::generate().unwrap();
    let (old_kid, new_kid) = (old.public.kid.clone(), new.public.kid.clone());
    let server =
        TestServer::start_with_tokens(TokenSetup::Keys(Box::new(new), vec![old.public.clone()]))
            .await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;

    let config: Value = server
        .http()
        .get(format!("{}/.well-known/openid-configuration", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(config["issuer"], TEST_ISSUER);
    assert_eq!(config["jwks_uri"], "/openid/v1/jwks");
    assert_eq!(
        config["id_token_signing_alg_values_supported"],
        json!(["ES256"])
    );

    let set = jwks(&server).await;
    let kids: Vec<&str> = set
        .keys
        .iter()
        .map(|k| k.common.key_id.as_deref().unwrap())
        .collect();
    assert_eq!(kids, [new_kid.as_str(), old_kid.as_str()]);
    let raw: Value = serde_json::to_value(&set).unwrap();
    for key in raw["keys"].as_array().unwrap() {
        assert_eq!(key["kty"], "EC");
        assert_eq!(key["crv"], "P-256");
        assert_eq!(key["alg"], "ES256");
        assert_eq!(key["use"], "sig");
    }

    let token = server.session_token(NS, "s").await;
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(
        header.kid.as_deref(),
        Some(new_kid.as_str()),
        "signed by the signing key"
    );
    verify(&set, &token, "http://github.demo.svc:8086");
    // Not by the old key: verifying with it fails.
    let old_jwk = set.find(&old_kid).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&["http://github.demo.svc:8086"]);
    assert!(jsonwebtoken::decode::<Value>(
        &token,
        &DecodingKey::from_jwk(old_jwk).unwrap(),
        &validation
    )
    .is_err());
}

#[tokio::test]
async fn a_dry_run_mints_nothing() {
    let server = TestServer::start().await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;
    let response = server
        .http()
        .post(format!("{}?dryRun=All", server.token_url(NS, "s")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&token_request(json!({"expirationSeconds": 120})))
        .send()
        .await
        .unwrap();
    let (code, body) = status_of(response).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"]["token"], "");
    assert_eq!(body["spec"]["expirationSeconds"], 120);
    assert!(body["status"]["expirationTimestamp"].is_string());
    assert_eq!(
        counter(&server, "mcp_access_session_tokens_issued_total"),
        0
    );
}

/// Allows everything but `create` on `accesssessions/token` for alice; records what it is
/// asked.
#[derive(Default)]
struct NoTokensForAlice {
    asked: Mutex<Vec<Attributes>>,
}

#[async_trait::async_trait]
impl Authorizer for NoTokensForAlice {
    async fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        self.asked.lock().unwrap().push(a.clone());
        if user.name == "alice" && a.subresource == "token" {
            Decision::Deny("alice may read sessions, not mint their tokens".into())
        } else {
            Decision::Allow
        }
    }
}

#[tokio::test]
async fn minting_is_authorized_as_create_on_the_token_subresource() {
    let authorizer = Arc::new(NoTokensForAlice::default());
    let server =
        TestServer::start_with_authorizer_and_tokens(authorizer.clone(), TokenSetup::Generated)
            .await;
    create(&server, mk_session(NS, "s", SERVER_UID)).await;

    let response = server
        .http()
        .get(format!("{}/s", server.sessions_url(NS)))
        .bearer_auth(USER_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "alice reads the session");
    let (code, status) = status_of(
        server
            .request_token_as(USER_TOKEN, NS, "s", &token_request(json!({})))
            .await,
    )
    .await;
    assert_eq!(code, 403, "{status}");
    assert_eq!(status["reason"], "Forbidden");
    let asked = authorizer.asked.lock().unwrap().clone();
    let token_ask = asked
        .iter()
        .find(|a| a.subresource == "token")
        .expect("the token request was authorized");
    assert_eq!(token_ask.verb, "create");
    assert_eq!(token_ask.resource, "accesssessions");
    assert_eq!(token_ask.api_group, "access.mcp-runtime.dev");
    assert_eq!(token_ask.namespace, NS);
    assert_eq!(token_ask.name, "s");

    let (code, _) = status_of(
        server
            .request_token_as(ADMIN_TOKEN, NS, "s", &token_request(json!({})))
            .await,
    )
    .await;
    assert_eq!(code, 201, "the admin may");
}

#[tokio::test]
async fn discovery_and_openapi_list_the_token_subresource() {
    let server = TestServer::start().await;
    let get = |path: &str, accept: &'static str| {
        server
            .http()
            .get(format!("{}{path}", server.url))
            .bearer_auth(ADMIN_TOKEN)
            .header("accept", accept)
            .send()
    };
    let list: Value = get("/apis/access.mcp-runtime.dev/v1alpha1", "application/json")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "accesssessions/token")
        .expect("accesssessions/token listed");
    assert_eq!(token["verbs"], json!(["create"]));
    assert_eq!(token["group"], "authentication.k8s.io");
    assert_eq!(token["kind"], "TokenRequest");

    let aggregated: Value = get(
        "/apis",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let sessions = &aggregated["items"][0]["versions"][0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resource"] == "accesssessions")
        .expect("accesssessions")
        .clone();
    assert_eq!(
        sessions["subresources"],
        json!([{"subresource": "token", "verbs": ["create"],
                "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}}])
    );

    let path =
        "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}/token";
    let v3: Value = get(
        "/openapi/v3/apis/access.mcp-runtime.dev/v1alpha1",
        "application/json",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let post = &v3["paths"][path]["post"];
    assert_eq!(post["x-kubernetes-action"], "post");
    assert_eq!(
        post["x-kubernetes-group-version-kind"]["kind"],
        "TokenRequest"
    );
    let schema = &v3["components"]["schemas"]["io.k8s.api.authentication.v1.TokenRequest"];
    assert!(schema["properties"]["spec"].is_object(), "{schema}");
    let v2: Value = get("/openapi/v2", "application/json")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v2["paths"][path]["post"].is_object());
    assert!(v2["definitions"]["io.k8s.api.authentication.v1.TokenRequestSpec"].is_object());

    // kubectl sees it too.
    let out = server
        .kubectl(&[
            "api-resources",
            "--api-group=access.mcp-runtime.dev",
            "-o",
            "wide",
        ])
        .await;
    assert!(out.success, "{}", out.stderr);
    assert!(out.stdout.contains("accesssessions"), "{}", out.stdout);
}

#[tokio::test]
async fn kubectl_create_raw_gets_a_token() {
    let server = TestServer::start().await;
    create(&server, mk_session(NS, "bot-github", SERVER_UID)).await;
    let request = server.dir.join("request.json");
    std::fs::write(
        &request,
        token_request(json!({"expirationSeconds": 300})).to_string(),
    )
    .unwrap();
    let path = format!(
        "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{NS}/accesssessions/bot-github/token"
    );
    let out = server
        .kubectl(&["create", "--raw", &path, "-f", request.to_str().unwrap()])
        .await;
    assert!(out.success, "{}", out.stderr);
    let body: Value = serde_json::from_str(&out.stdout).expect("kubectl prints the TokenRequest");
    assert_eq!(body["kind"], "TokenRequest");
    assert_eq!(body["spec"]["expirationSeconds"], 300);
    let claims = verify(
        &jwks(&server).await,
        body["status"]["token"].as_str().unwrap(),
        "http://github.demo.svc:8086",
    );
    assert_eq!(claims["sub"], "system:accesssession:demo:bot-github");

    // A refusal reaches the user as kubectl prints a Status.
    let out = server
        .kubectl(&[
            "create",
            "--raw",
            &path.replace("bot-github", "nobody"),
            "-f",
            request.to_str().unwrap(),
        ])
        .await;
    assert!(!out.success);
    assert!(
        out.stderr.contains("NotFound") || out.stderr.contains("not found"),
        "{}",
        out.stderr
    );
}

/// Runs `openssl` with `args` (a prerequisite of hack/test.sh).
fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The base64 lines of a PEM file: what must never appear in the server's output.
fn key_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_string)
        .collect()
}

#[test]
fn bad_key_configurations_stop_startup_naming_the_flag() {
    let bin = support::replica::apiserver_bin();
    let dir = support::replica::scratch_dir("mcp-access-token-keys");
    let path = |name: &str| dir.join(name);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let tokens = path("tokens.csv");
    std::fs::write(
        &tokens,
        "t0123456789abcdef,admin,admin,\"system:masters\"\n",
    )
    .unwrap();
    chmod(&tokens, 0o600);

    // A private key of `algorithm` (with `-pkeyopt` options) readable by the owner only.
    let genkey = |name: &str, algorithm: &str, options: &[&str]| {
        let out = s(&path(name));
        let mut args = vec!["genpkey", "-algorithm", algorithm];
        for option in options {
            args.extend(["-pkeyopt", option]);
        }
        args.extend(["-out", &out]);
        openssl(&args);
        chmod(&path(name), 0o600);
    };
    let public_of = |private: &str, public: &str| {
        openssl(&[
            "pkey",
            "-in",
            &s(&path(private)),
            "-pubout",
            "-out",
            &s(&path(public)),
        ]);
    };
    genkey("good.pem", "EC", &["ec_paramgen_curve:P-256"]);
    public_of("good.pem", "good.pub");
    std::fs::copy(path("good.pem"), path("open.pem")).unwrap();
    chmod(&path("open.pem"), 0o644);
    // SEC1 ("EC PRIVATE KEY"), not PKCS#8.
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        &s(&path("sec1.pem")),
    ]);
    chmod(&path("sec1.pem"), 0o600);
    genkey("p384.pem", "EC", &["ec_paramgen_curve:P-384"]);
    public_of("p384.pem", "p384.pub");
    genkey("ed.pem", "ED25519", &[]);
    std::fs::write(path("garbage.pem"), "not a key\n").unwrap();
    chmod(&path("garbage.pem"), 0o600);

    let base = [
        "--standalone".to_string(),
        "--token-auth-file".into(),
        s(&tokens),
        // Never reached: the keys are read before the database is.
        "--database-url".into(),
        "host=/nonexistent-mcp-access dbname=none".into(),
        "--secure-port".into(),
        "0".into(),
        "--metrics-port".into(),
        "0".into(),
    ];
    let issuer = ["--session-token-issuer", "https://mcp-access.test"];
    let signing = |file: &str| {
        vec![
            "--session-token-signing-key-file".to_string(),
            s(&path(file)),
        ]
    };
    let cases: Vec<(Vec<String>, &str, &str)> = vec![
        (
            signing("missing.pem"),
            "--session-token-signing-key-file",
            "cannot read",
        ),
        (
            signing("open.pem"),
            "--session-token-signing-key-file",
            "readable by others",
        ),
        (
            signing("sec1.pem"),
            "--session-token-signing-key-file",
            "PKCS#8",
        ),
        (
            signing("p384.pem"),
            "--session-token-signing-key-file",
            "P-256",
        ),
        (
            signing("ed.pem"),
            "--session-token-signing-key-file",
            "P-256",
        ),
        (
            signing("garbage.pem"),
            "--session-token-signing-key-file",
            "PRIVATE KEY",
        ),
        (
            [
                signing("good.pem"),
                vec![
                    "--session-token-verification-key-file".into(),
                    s(&path("good.pem")),
                ],
            ]
            .concat(),
            "--session-token-verification-key-file",
            "private key",
        ),
        (
            [
                signing("good.pem"),
                vec![
                    "--session-token-verification-key-file".into(),
                    s(&path("p384.pub")),
                ],
            ]
            .concat(),
            "--session-token-verification-key-file",
            "P-256",
        ),
    ];
    let run = |args: &[String]| {
        std::process::Command::new(&bin)
            .args(base.iter())
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("the apiserver runs")
    };
    for (mut args, flag, words) in cases {
        args.extend(issuer.iter().map(|a| a.to_string()));
        let out = run(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} must not start:\n{text}");
        assert!(text.contains(flag), "{args:?} names {flag}:\n{text}");
        assert!(text.contains(words), "{args:?} says {words:?}:\n{text}");
        for file in ["good.pem", "open.pem", "sec1.pem", "p384.pem", "ed.pem"] {
            for line in key_lines(&path(file)) {
                assert!(
                    !text.contains(&line),
                    "{args:?} printed key material of {file}"
                );
            }
        }
    }

    // Flag combinations refused before any file is read.
    let flag_cases: Vec<(Vec<String>, &str)> = vec![
        (signing("good.pem"), "--session-token-issuer"),
        (
            [
                signing("good.pem"),
                vec!["--session-token-issuer".into(), "".into()],
            ]
            .concat(),
            "--session-token-issuer",
        ),
        (
            [
                signing("good.pem"),
                vec!["--session-token-issuer".into(), "https://<issuer>".into()],
            ]
            .concat(),
            "--session-token-issuer",
        ),
        (
            [
                signing("good.pem"),
                issuer.iter().map(|a| a.to_string()).collect(),
                vec![
                    "--session-token-audience-template".into(),
                    "http://gateway.{namespace}.svc:8086".into(),
                ],
            ]
            .concat(),
            "--session-token-audience-template",
        ),
        (
            [
                signing("good.pem"),
                issuer.iter().map(|a| a.to_string()).collect(),
                vec!["--session-token-audience-template".into(), "".into()],
            ]
            .concat(),
            "--session-token-audience-template",
        ),
        (
            vec![
                "--session-token-verification-key-file".into(),
                s(&path("good.pub")),
            ],
            "--session-token-verification-key-file",
        ),
    ];
    for (args, flag) in flag_cases {
        let out = run(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} must not start:\n{text}");
        assert!(text.contains(flag), "{args:?} names {flag}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
