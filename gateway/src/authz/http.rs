//! The sidecar's HTTP surface.
//!
//! - `/readyz`: 200 once the cache holds a complete, fresh list; 503 otherwise.
//! - `/metrics`: Prometheus text.
//! - `GET /v1/sessions/{ns}/{name}/revoked`: held open until the session stops being usable,
//!   then 200 `{"reason": "..."}`.
//! - anything else, any method: the auth check. 200 (empty), or 401 with
//!   `{"reason": "..."}` and the reason in `X-MCP-Deny-Reason`. Besides the cache's reasons,
//!   `session_missing` (no session header) and `session_malformed` (not exactly one
//!   `<namespace>/<name>` value with a valid namespace and name).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use apis::validation::{is_dns1123_label, is_dns1123_subdomain};

use crate::{Decision, SessionCache};

/// The response header carrying the deny reason.
pub const DENY_REASON_HEADER: &str = "x-mcp-deny-reason";
/// No session header on the request.
pub const SESSION_MISSING: &str = "session_missing";
/// The session header is not one `<namespace>/<name>` value.
pub const SESSION_MALFORMED: &str = "session_malformed";

/// What the handlers share.
#[derive(Clone)]
pub struct AuthzState {
    /// The session cache every check is answered from.
    pub cache: SessionCache,
    /// The request header naming the session.
    pub session_header: HeaderName,
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
}

/// The sidecar's routes: its own endpoints, and the check on everything else.
pub fn router(state: AuthzState) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/sessions/{ns}/{name}/revoked", get(revoked))
        // The rest of /v1 is ours too: never answered as a check (which could say 200).
        .route("/v1", any(not_found))
        .route("/v1/{*rest}", any(not_found))
        .fallback(check)
        .with_state(state)
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

/// `<namespace>/<name>` as Kubernetes names them; anything else is malformed.
fn parse_session(value: &str) -> Option<(&str, &str)> {
    let (ns, name) = value.trim().split_once('/')?;
    (is_dns1123_label(ns) && is_dns1123_subdomain(name)).then_some((ns, name))
}

fn deny(reason: &'static str) -> Response {
    let mut resp = (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({ "reason": reason })),
    )
        .into_response();
    resp.headers_mut()
        .insert(DENY_REASON_HEADER, HeaderValue::from_static(reason));
    resp
}

async fn check(State(app): State<AuthzState>, headers: HeaderMap) -> Response {
    let mut values = headers.get_all(&app.session_header).iter();
    let reason = match (values.next(), values.next()) {
        (None, _) => SESSION_MISSING,
        // Two values could be read differently by the proxy and by us: refuse.
        (Some(_), Some(_)) => SESSION_MALFORMED,
        (Some(value), None) => match value.to_str().ok().and_then(parse_session) {
            None => SESSION_MALFORMED,
            Some((ns, name)) => {
                let now = k8s_openapi::jiff::Timestamp::now();
                match app.cache.authorize(ns, name, now).await {
                    Decision::Allow => {
                        app.metrics
                            .checks
                            .get_or_create(&CheckLabels { result: "allow" })
                            .inc();
                        return StatusCode::OK.into_response();
                    }
                    Decision::Deny(reason) => reason.as_str(),
                }
            }
        },
    };
    app.metrics
        .checks
        .get_or_create(&CheckLabels { result: reason })
        .inc();
    deny(reason)
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
    use super::parse_session;

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
}
