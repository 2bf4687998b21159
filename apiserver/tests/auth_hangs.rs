//! Delegated authentication and authorization against a kube-apiserver that accepts the
//! connection, takes the request and never answers (a stuck proxy, an overloaded control
//! plane): docs/operations.md promises that "TokenReview and SubjectAccessReview errors or
//! timeouts (10 s) answer 503 with `Retry-After`, never 401/403". `attacks_auth.rs` covers a
//! refused connection, which fails at once; here the review must be cut by its own timeout,
//! and the server must keep answering everything that does not wait on that review.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::auth::{
    AllowAuthenticated, DelegatedAuthenticator, DelegatedOptions, SubjectAccessReviewer,
};
use serde_json::Value;
use support::server::{static_tokens, TestServer, ADMIN_TOKEN, USER_TOKEN};
use tokio::io::AsyncReadExt;

const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/default/accesssessions";

/// The documented review timeout (docs/operations.md), written out rather than taken from
/// the code, so the test fails if the code's bound drifts from the promise.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// How much later than [`REVIEW_TIMEOUT`] the 503 may come (scheduling on a loaded machine).
const SLACK: Duration = Duration::from_secs(5);

/// A kube client for an API server that accepts every connection, reads every request and
/// never answers. The listener and the connections live as long as the runtime.
async fn silent_kube() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = requests_seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                // Read (so the client's write completes) and never write anything back.
                let mut buf = [0u8; 4096];
                let mut counted = false;
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if !counted {
                        counted = true;
                        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            });
        }
    });
    // Plain HTTP: the request is delivered in full, so what hangs is the answer.
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), requests_seen)
}

/// Status code, `Retry-After` and the body of a GET, and how long the answer took.
async fn get_timed(
    http: reqwest::Client,
    url: String,
    token: Option<&'static str>,
) -> (u16, Option<String>, Value, Duration) {
    let started = Instant::now();
    let mut request = http.get(url);
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
    (code, retry_after, body, started.elapsed())
}

/// A 503 `ServiceUnavailable` Status with `Retry-After`, answered after the review timeout
/// (so it was the timeout that cut it, not a refused connection) and not much later.
fn assert_cut_by_review_timeout(what: &str, answer: &(u16, Option<String>, Value, Duration)) {
    let (code, retry_after, body, took) = answer;
    assert_eq!(*code, 503, "{what}: {code} {body}");
    assert_eq!(body["kind"], "Status", "{what}: {body}");
    assert_eq!(body["reason"], "ServiceUnavailable", "{what}: {body}");
    assert!(
        retry_after.as_deref().is_some_and(|v| !v.is_empty()),
        "{what}: no Retry-After"
    );
    assert!(
        *took >= REVIEW_TIMEOUT - Duration::from_millis(500),
        "{what}: answered after {took:?}, before the review could have timed out: the \
         fake kube-apiserver never answers, so something else failed"
    );
    assert!(
        *took <= REVIEW_TIMEOUT + SLACK,
        "{what}: answered after {took:?}; the documented bound is {REVIEW_TIMEOUT:?}"
    );
}

#[tokio::test]
async fn a_token_review_that_never_answers_is_503_within_the_review_timeout() {
    let (kube, seen) = silent_kube().await;
    let (authenticator, _handshake) =
        DelegatedAuthenticator::tokens_only(kube, DelegatedOptions::default());
    let s = TestServer::start_with_auth(authenticator, Arc::new(AllowAuthenticated)).await;
    let url = format!("{}{SESSIONS}", s.url);

    // Two clients with two tokens at once: the reviews wait side by side, not in a queue.
    let first = tokio::spawn(get_timed(s.http(), url.clone(), Some("token-one")));
    let second = tokio::spawn(get_timed(s.http(), url.clone(), Some("token-two")));
    // Meanwhile, what needs no review is answered at once, again and again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..3 {
        let (code, _, body, took) = get_timed(s.http(), url.clone(), None).await;
        assert_eq!(code, 401, "no credentials while reviews hang: {body}");
        assert!(
            took < Duration::from_secs(2),
            "took {took:?} while reviews hang"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let first = first.await.unwrap();
    let second = second.await.unwrap();
    assert_cut_by_review_timeout("TokenReview unanswered", &first);
    assert_cut_by_review_timeout("TokenReview unanswered, another token", &second);
    assert!(
        seen.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the TokenReviews never reached the silent kube-apiserver"
    );
    eprintln!(
        "TokenReview unanswered: 503 after {:?} and {:?}",
        first.3, second.3
    );
}

#[tokio::test]
async fn a_subject_access_review_that_never_answers_is_503_within_the_review_timeout() {
    let (kube, seen) = silent_kube().await;
    let reviewer =
        SubjectAccessReviewer::new(kube, Duration::from_secs(300), Duration::from_secs(300));
    let s = TestServer::start_with_auth(static_tokens(), Arc::new(reviewer)).await;
    let url = format!("{}{SESSIONS}", s.url);

    let waiting = tokio::spawn(get_timed(s.http(), url.clone(), Some(USER_TOKEN)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // system:masters needs no review: served at once while the user's review hangs.
    for _ in 0..3 {
        let (code, _, body, took) = get_timed(s.http(), url.clone(), Some(ADMIN_TOKEN)).await;
        assert_eq!(code, 200, "system:masters while a review hangs: {body}");
        assert!(
            took < Duration::from_secs(2),
            "took {took:?} while a review hangs"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let waiting = waiting.await.unwrap();
    assert_cut_by_review_timeout("SubjectAccessReview unanswered", &waiting);
    assert!(
        seen.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the SubjectAccessReview never reached the silent kube-apiserver"
    );
    // Not cached as a denial (deny TTL 5 minutes here): the next request waits again and is
    // 503 again, never 403.
    let again = get_timed(s.http(), url, Some(USER_TOKEN)).await;
    assert_cut_by_review_timeout("SubjectAccessReview unanswered, asked again", &again);
}
