//! The sidecar's HTTP surface: two listeners, so that a path-forwarding proxy can never mistake
//! one of the sidecar's own endpoints for an allowed check.
//!
//! The check listener (`--listen`): every path and method is the auth check. 200 (empty, with
//! the session's identity in `X-MCP-Access-*` headers the proxy may forward), or 401 with
//! `{"reason": "..."}`, the reason in `X-MCP-Deny-Reason` and, in token mode, the RFC 6750
//! challenge in `WWW-Authenticate`. A proxy asking it for `/readyz` gets a check: 401 without a
//! token.
//!
//! - Token mode (the default): exactly one `Authorization: Bearer <session token>` (never a
//!   token in the query string), verified offline ([`crate::credential::Verifier`]), then the
//!   session it names decided in the live cache ([`crate::credential::admit`]). Reasons as
//!   docs/session-tokens.md: `token_missing`, `token_invalid`, `token_expired`,
//!   `session_not_found`, `session_revoked`, `session_expired`,
//!   `session_pending_enrollment`, `cache_stale`.
//! - Trusted-header mode (`--trust-session-header`): the session is named by a header the
//!   deployment's own authentication layer sets (`<namespace>/<name>`); besides the cache's
//!   reasons, `session_missing` and `session_malformed`.
//!
//! The admin listener (`--admin-listen`, loopback by default):
//! - `/readyz`: 200 once the cache holds a complete, fresh list; 503 otherwise.
//! - `/metrics`: Prometheus text.
//! - `GET /v1/sessions/{ns}/{name}/revoked`: held open until the session stops being usable,
//!   then 200 `{"reason": "..."}`.
//! - anything else: 404.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use apis::validation::{is_dns1123_label, is_dns1123_subdomain};

use crate::credential::{admit, Reason, SessionClaims, Verifier};
use crate::proxy::auth::{bearer, BearerError};
use crate::{Decision, SessionCache};

use crate::credential::resource::{self, metadata_path};
pub use crate::credential::resource::{
    AGENT_HEADER, DENY_REASON_HEADER, METADATA_PATH, SESSION_HEADER, SESSION_UID_HEADER,
    SUBJECT_HEADER,
};
/// Trusted-header mode: no session header on the request.
pub const SESSION_MISSING: &str = "session_missing";
/// Trusted-header mode: the session header is not one `<namespace>/<name>` value.
pub const SESSION_MALFORMED: &str = "session_malformed";

/// How a check learns which session a request uses.
#[derive(Clone, Debug)]
pub enum CheckMode {
    /// A session token in `Authorization: Bearer`, for the resource `public_url`.
    Token {
        verifier: Verifier,
        /// The resource URI tokens name in `aud` (the verifier's audience).
        public_url: String,
    },
    /// A header set by the deployment's own authentication layer (a name, not a credential).
    TrustedHeader { header: HeaderName },
}

/// What the handlers share.
#[derive(Clone)]
pub struct AuthzState {
    /// The session cache every check is answered from.
    pub cache: SessionCache,
    /// How the session is named.
    pub mode: Arc<CheckMode>,
    /// What `/metrics` encodes.
    pub registry: Arc<Registry>,
    pub metrics: AuthzMetrics,
    /// Becomes true when shutdown starts.
    pub shutdown: watch::Receiver<bool>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    /// `allow` or a deny reason (a fixed set; nothing from the request).
    result: &'static str,
}

/// Counters of the check endpoint.
#[derive(Clone, Debug, Default)]
pub struct AuthzMetrics {
    checks: Family<CheckLabels, Counter>,
}

impl AuthzMetrics {
    /// Registers the check counters in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "mcp_authz_checks",
            "Auth checks answered, by result (allow or the deny reason)",
            metrics.checks.clone(),
        );
        metrics
    }

    fn count(&self, result: &'static str) {
        self.checks.get_or_create(&CheckLabels { result }).inc();
    }
}

/// The check listener: every path, every method is a check.
pub fn check_router(state: AuthzState) -> Router {
    Router::new().fallback(check).with_state(state)
}

/// The admin listener: readiness, metrics, the revocation long-poll and, in token mode, the
/// RFC 9728 document the challenges point at; 404 for anything else.
pub fn admin_router(state: AuthzState) -> Router {
    let mut router = Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/sessions/{ns}/{name}/revoked", get(revoked));
    if let CheckMode::Token { public_url, .. } = state.mode.as_ref() {
        router = router.route(&metadata_path(public_url), get(resource_metadata));
    }
    router.fallback(any(not_found)).with_state(state)
}

async fn not_found() -> StatusCode {
    StatusCode::NOT_FOUND
}

async fn readyz(State(app): State<AuthzState>) -> Response {
    let status = app.cache.status();
    if status.ready {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the session cache holds no fresh complete list\n",
        )
            .into_response()
    }
}

async fn metrics(State(app): State<AuthzState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &app.registry) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The RFC 9728 document of the protected resource: its URI, the issuer of its tokens (once
/// the keys were fetched) and the one bearer method read.
async fn resource_metadata(State(app): State<AuthzState>) -> Response {
    let CheckMode::Token {
        verifier,
        public_url,
    } = app.mode.as_ref()
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let issuers: Vec<String> = verifier
        .source()
        .current()
        .map(|set| vec![set.issuer.clone()])
        .unwrap_or_default();
    Json(resource::metadata_document(public_url, &issuers)).into_response()
}

/// `<namespace>/<name>` as Kubernetes names them; anything else is malformed.
fn parse_session(value: &str) -> Option<(&str, &str)> {
    let (ns, name) = value.trim().split_once('/')?;
    (is_dns1123_label(ns) && is_dns1123_subdomain(name)).then_some((ns, name))
}

/// A 401 for `reason`; in token mode with the RFC 6750 challenge (no `error=` when no token
/// was sent at all).
fn deny(reason: &'static str, challenge_for: Option<&str>) -> Response {
    let mut resp = (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({ "reason": reason })),
    )
        .into_response();
    resp.headers_mut()
        .insert(DENY_REASON_HEADER, HeaderValue::from_static(reason));
    if let Some(public_url) = challenge_for {
        if let Ok(v) = HeaderValue::from_str(&resource::challenge(public_url, reason)) {
            resp.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, v);
        }
    }
    resp
}

/// A 200 naming the session (the proxy may pass these headers on to the server). Values that
/// are not valid header text are left out, never sent mangled.
fn allow(identity: &[(&'static str, &str)]) -> Response {
    let mut resp = StatusCode::OK.into_response();
    for (name, value) in identity {
        if let Ok(v) = HeaderValue::from_str(value) {
            resp.headers_mut().insert(*name, v);
        }
    }
    resp
}

async fn check(State(app): State<AuthzState>, uri: Uri, headers: HeaderMap) -> Response {
    let now = k8s_openapi::jiff::Timestamp::now();
    match app.mode.as_ref() {
        CheckMode::Token {
            verifier,
            public_url,
        } => match check_token(&app.cache, verifier, &headers, &uri, now).await {
            Ok(claims) => {
                app.metrics.count("allow");
                let access = &claims.access;
                let session = format!("{}/{}", access.session.namespace, access.session.name);
                let mut identity = vec![
                    (SESSION_HEADER, session.as_str()),
                    (SESSION_UID_HEADER, access.session.uid.as_str()),
                ];
                if let Some(subject) = access.subject.as_deref() {
                    identity.push((SUBJECT_HEADER, subject));
                }
                if let Some(agent) = access.agent.as_deref() {
                    identity.push((AGENT_HEADER, agent));
                }
                allow(&identity)
            }
            Err(reason) => {
                app.metrics.count(reason.as_str());
                deny(reason.as_str(), Some(public_url))
            }
        },
        CheckMode::TrustedHeader { header } => {
            match check_header(&app.cache, header, &headers, now).await {
                Ok(session) => {
                    app.metrics.count("allow");
                    allow(&[(SESSION_HEADER, &session)])
                }
                Err(reason) => {
                    app.metrics.count(reason);
                    deny(reason, None)
                }
            }
        }
    }
}

/// Token mode: the bearer token, verified, then its session decided live.
async fn check_token(
    cache: &SessionCache,
    verifier: &Verifier,
    headers: &HeaderMap,
    uri: &Uri,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<SessionClaims, Reason> {
    let token = bearer(headers, uri.query()).map_err(|e| match e {
        BearerError::Missing => Reason::TokenMissing,
        BearerError::Malformed => Reason::TokenInvalid,
    })?;
    let claims = verifier.verify(token).await.map_err(|e| Reason::from(&e))?;
    let (decision, session) = cache
        .authorize_session(claims.namespace(), claims.name(), now)
        .await;
    admit(&claims, decision, session.as_deref())?;
    Ok(claims)
}

/// Trusted-header mode: the one header value names the session.
async fn check_header(
    cache: &SessionCache,
    header: &HeaderName,
    headers: &HeaderMap,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<String, &'static str> {
    let mut values = headers.get_all(header).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(SESSION_MISSING),
        // Two values could be read differently by the proxy and by us: refuse.
        (Some(_), Some(_)) => return Err(SESSION_MALFORMED),
        (Some(value), None) => value,
    };
    let (ns, name) = value
        .to_str()
        .ok()
        .and_then(parse_session)
        .ok_or(SESSION_MALFORMED)?;
    match cache.authorize(ns, name, now).await {
        Decision::Allow => Ok(format!("{ns}/{name}")),
        Decision::Deny(reason) => Err(reason.as_str()),
    }
}

async fn revoked(
    State(app): State<AuthzState>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if !is_dns1123_label(&ns) || !is_dns1123_subdomain(&name) {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "reason": SESSION_MALFORMED })),
        )
            .into_response();
    }
    let mut shutdown = app.shutdown.clone();
    tokio::select! {
        reason = app.cache.subscribe(&ns, &name) => {
            (StatusCode::OK, Json(serde_json::json!({ "reason": reason.as_str() }))).into_response()
        }
        _ = shutdown.wait_for(|stopping| *stopping) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({ "reason": "shutting_down" }))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_header_forms() {
        assert_eq!(
            parse_session("team-a/alice-github"),
            Some(("team-a", "alice-github"))
        );
        assert_eq!(parse_session(" team-a/a.b "), Some(("team-a", "a.b")));
        for bad in [
            "",
            "team-a",
            "/a",
            "team-a/",
            "team-a/a/b",
            "Team-A/a",
            "team-a/A",
            "team.a/x",
            "team-a/../x",
            "team-a/%2e",
        ] {
            assert_eq!(parse_session(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn challenges_name_the_metadata_and_the_reason() {
        let url = "http://github.demo.svc:8086";
        let missing = deny(Reason::TokenMissing.as_str(), Some(url));
        assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            missing.headers()["www-authenticate"],
            "Bearer resource_metadata=\"http://github.demo.svc:8086/.well-known/oauth-protected-resource\""
        );
        let revoked = deny(Reason::SessionRevoked.as_str(), Some(url));
        assert_eq!(
            revoked.headers()["www-authenticate"],
            "Bearer resource_metadata=\"http://github.demo.svc:8086/.well-known/oauth-protected-resource\", error=\"invalid_token\", error_description=\"session_revoked\""
        );
        assert_eq!(revoked.headers()[DENY_REASON_HEADER], "session_revoked");
        // Trusted-header mode: no bearer challenge.
        let header = deny(SESSION_MISSING, None);
        assert!(header.headers().get("www-authenticate").is_none());
    }
}
