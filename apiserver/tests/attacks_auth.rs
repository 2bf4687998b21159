//! Attacks on delegated authentication and authorization (issue 8, items 7 and 14d):
//! kube-apiserver unreachable must answer 503 with Retry-After — never 401/403, which
//! gateways read as "drop my authority" — and such outcomes are not cached.
//!
//! The server is the real HTTP stack over a real database; its TokenReview and
//! SubjectAccessReview go through a real kube client to a loopback port nobody listens on.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::auth::{
    AllowAuthenticated, DelegatedAuthenticator, DelegatedOptions, SubjectAccessReviewer,
};
use serde_json::Value;
use support::server::{static_tokens, TestServer, ADMIN_TOKEN, USER_TOKEN};

const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/default/accesssessions";

/// A client of a kube-apiserver that refuses every connection, and the socket that makes it
/// so: bound (no other process can take the port) and never listening, so the kernel answers
/// each connection with a reset. Keep the socket as long as the client.
fn unreachable_kube() -> (kube::Client, tokio::net::TcpSocket) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = held.local_addr().unwrap().port();
    let config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), held)
}

/// Status code, `Retry-After` and the Status body of a GET.
async fn get(s: &TestServer, token: Option<&str>, path: &str) -> (u16, Option<String>, Value) {
    let mut request = s.http().get(format!("{}{path}", s.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.json().await.unwrap_or(Value::Null);
    (code, retry_after, body)
}

fn assert_unavailable(what: &str, (code, retry_after, body): &(u16, Option<String>, Value)) {
    assert_eq!(*code, 503, "{what}: {code} {body}");
    assert_eq!(body["kind"], "Status", "{what}: {body}");
    assert_eq!(body["reason"], "ServiceUnavailable", "{what}: {body}");
    assert!(
        retry_after.as_deref().is_some_and(|v| !v.is_empty()),
        "{what}: no Retry-After"
    );
}

#[tokio::test]
async fn subject_access_review_outage_answers_503_not_403() {
    let (kube, _held) = unreachable_kube();
    let reviewer =
        SubjectAccessReviewer::new(kube, Duration::from_secs(300), Duration::from_secs(300));
    let s = TestServer::start_with_auth(static_tokens(), Arc::new(reviewer)).await;

    let started = Instant::now();
    let first = get(&s, Some(USER_TOKEN), SESSIONS).await;
    let elapsed = started.elapsed();
    assert_unavailable("SubjectAccessReview unreachable", &first);
    eprintln!("time to 503 with kube-apiserver unreachable: {elapsed:?}");
    // Expected: a refused connection, milliseconds; 5 s is a margin of far more than 5x.
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    // The failure was not cached as a denial (deny TTL is 5 minutes here): still 503.
    let again = get(&s, Some(USER_TOKEN), SESSIONS).await;
    assert_unavailable("SubjectAccessReview unreachable, asked again", &again);
    // Non-resource paths go through the same review.
    let discovery = get(
        &s,
        Some(USER_TOKEN),
        "/apis/access.mcp-runtime.dev/v1alpha1",
    )
    .await;
    assert_unavailable("discovery with SubjectAccessReview unreachable", &discovery);

    // The server itself is fine: system:masters needs no review, and no credentials is
    // still 401, not 503.
    let (code, _, body) = get(&s, Some(ADMIN_TOKEN), SESSIONS).await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = get(&s, None, SESSIONS).await;
    assert_eq!(code, 401, "{body}");
}

#[tokio::test]
async fn token_review_outage_answers_503_not_401() {
    let (kube, _held) = unreachable_kube();
    let (authenticator, _handshake) =
        DelegatedAuthenticator::tokens_only(kube, DelegatedOptions::default());
    let s = TestServer::start_with_auth(authenticator, Arc::new(AllowAuthenticated)).await;

    let started = Instant::now();
    let first = get(&s, Some("some-service-account-token"), SESSIONS).await;
    let elapsed = started.elapsed();
    assert_unavailable("TokenReview unreachable", &first);
    eprintln!("time to 503 with kube-apiserver unreachable: {elapsed:?}");
    // Expected: a refused connection, milliseconds; 5 s is a margin of far more than 5x.
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    // Not cached as a rejection either.
    let again = get(&s, Some("some-service-account-token"), SESSIONS).await;
    assert_unavailable("TokenReview unreachable, asked again", &again);

    // A request without credentials never reaches TokenReview: still 401.
    let (code, retry_after, body) = get(&s, None, SESSIONS).await;
    assert_eq!(code, 401, "{body}");
    assert_eq!(body["reason"], "Unauthorized", "{body}");
    assert!(retry_after.is_none());
}
