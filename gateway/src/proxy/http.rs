//! The gateway's HTTP surface. Its own endpoints, never proxied:
//! - `/.well-known/oauth-protected-resource` and any path below it: the RFC 9728 document;
//! - `/readyz`: 200 when the session cache is in sync and token keys are held, else 503;
//! - `/metrics`: Prometheus text;
//! - `/config/status`: the sync state, the keys and the configuration, as JSON
//!   (the last three move to `--admin-listen` when it is given, and are 404 here then).
//!
//! Everything else: bearer token → offline verification → live session decision →
//! `Mcp-Session-Id` (or legacy HTTP+SSE `session_id`) binding → bounded body → routing-header check → upstream, the response
//! wrapped so it ends when the session stops being usable.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::auth::{bearer, BearerError};
use super::cut::{BoxError, CutBody, CutContext, OnEndpoint, ToolsFilter};
use super::legacy;
use super::mcp::{
    check_routing_headers, decide_calls, refusal, tools_list_ids, CallDecision, Posted,
    SESSION_ID_HEADER,
};
use super::metrics::{DenyLabels, ProxyMetrics, RequestLabels};
use super::session::{Bindings, Check};
use super::tools::ToolAccess;
use super::upstream::{upstream_headers, Upstream, UpstreamError};
use crate::credential::{admit, Reason, SessionClaims, Verifier};
use crate::policies::PolicyCache;
use crate::SessionCache;

use crate::credential::resource;
pub use crate::credential::resource::{DENY_REASON_HEADER, METADATA_PATH};

/// Response bodies of the gateway.
pub type ResponseBody = BoxBody<Bytes, BoxError>;

/// Everything a request needs; shared by every connection.
pub struct Gateway {
    /// `--audit-log`: one JSON line per tools/call decision.
    pub audit: Option<Arc<super::audit::Audit>>,
    pub cache: SessionCache,
    /// The server's ToolPolicies, compiled.
    pub policies: PolicyCache,
    /// Token buckets of `callsPerMinute` (sessions, policy rules).
    pub rates: super::rate::RateLimiter,
    pub verifier: Verifier,
    pub upstream: Upstream,
    pub bindings: Bindings,
    /// Open legacy HTTP+SSE streams and the answers they owe.
    pub legacy_streams: legacy::Streams,
    pub metrics: ProxyMetrics,
    pub registry: Registry,
    /// `--public-url`, without a trailing slash.
    pub public_url: String,
    /// `--authorization-server` values; empty: the token issuer.
    pub authorization_servers: Vec<String>,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
    /// `/readyz`, `/metrics` and `/config/status` are served on the admin listener instead.
    pub admin_elsewhere: bool,
}

fn full(body: impl Into<Bytes>) -> ResponseBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty response with `status`.
pub fn status_only(status: StatusCode) -> Response<ResponseBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

fn json_response(status: StatusCode, body: &Value) -> Response<ResponseBody> {
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

impl Gateway {
    /// The URL of the RFC 9728 document for `--public-url` (the path-suffixed form when the
    /// resource has a path, RFC 9728 §3.1).
    pub fn metadata_url(&self) -> String {
        resource::metadata_url(&self.public_url)
    }

    /// A 401 for `reason`, with the RFC 6750 challenge.
    pub fn deny(&self, reason: Reason) -> Response<ResponseBody> {
        self.metrics
            .denials
            .get_or_create(&DenyLabels {
                reason: reason.as_str(),
            })
            .inc();
        let mut resp = json_response(
            StatusCode::UNAUTHORIZED,
            &json!({"error": "invalid_token", "reason": reason.as_str()}),
        );
        let challenge = resource::challenge(&self.public_url, reason.as_str());
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(WWW_AUTHENTICATE, v);
        }
        resp.headers_mut().insert(
            DENY_REASON_HEADER,
            HeaderValue::from_static(reason.as_str()),
        );
        resp
    }

    fn metadata(&self) -> Response<ResponseBody> {
        let servers = if self.authorization_servers.is_empty() {
            self.verifier
                .source()
                .current()
                .map(|s| vec![s.issuer.clone()])
                .unwrap_or_default()
        } else {
            self.authorization_servers.clone()
        };
        json_response(
            StatusCode::OK,
            &resource::metadata_document(&self.public_url, &servers),
        )
    }

    /// Whether the gateway can decide: the cache in sync, keys held and the server's tool
    /// policies listed.
    pub fn ready(&self) -> bool {
        self.cache.is_ready()
            && self.verifier.source().current().is_some()
            && self.policies.index().is_some()
    }

    fn readyz(&self) -> Response<ResponseBody> {
        if self.ready() {
            let mut r = Response::new(full("ok\n"));
            *r.status_mut() = StatusCode::OK;
            r
        } else {
            let mut r = Response::new(full(
                "not ready: the session cache is not in sync, no session token keys are held, or the tool policies are not listed yet\n",
            ));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r
        }
    }

    fn metrics_text(&self) -> Response<ResponseBody> {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            let mut r = Response::new(full(""));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        }
        let mut r = Response::new(full(text));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        r
    }

    fn config_status(&self) -> Response<ResponseBody> {
        let sync = self.cache.status();
        let keys = self.verifier.source().current();
        let unix = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        };
        json_response(
            StatusCode::OK,
            &json!({
                "sync": {
                    "ready": sync.ready,
                    "sessions": sync.sessions,
                    "resourceVersion": sync.resource_version,
                    "sync_age_seconds": sync.sync_age_seconds,
                    "stale_window_seconds": self.cache.stale_window().as_secs_f64(),
                },
                "jwks": {
                    "kids": keys.as_ref().map(|k| k.keys.kids()).unwrap_or_default(),
                    "last_refresh_unix": keys.as_ref().map(|k| unix(k.fetched_at)),
                    "issuer": keys.as_ref().map(|k| k.issuer.clone()),
                },
                "public_url": self.public_url,
                "upstream": self.upstream.base().to_string(),
                // In force: what each policy's generation is, as its resourceVersion says.
                "tool_policies": self.policies.index().map(|index| {
                    index
                        .policies()
                        .map(|(name, rv, mode)| json!({"name": name, "resourceVersion": rv, "mode": mode.as_str()}))
                        .collect::<Vec<_>>()
                }),
                // The definitions the server listed for pinned tools (what to pin).
                "tool_digests": self.policies.observed().all(),
                "mcp_session_bindings": self.bindings.len(),
                "legacy_sse_streams": self.legacy_streams.len(),
            }),
        )
    }

    /// The admin endpoints, wherever they are served; `None` for other paths.
    pub fn admin(&self, path: &str) -> Option<Response<ResponseBody>> {
        match path {
            "/readyz" => Some(self.readyz()),
            "/metrics" => Some(self.metrics_text()),
            "/config/status" => Some(self.config_status()),
            _ => None,
        }
    }

    /// Answers one request of the main listener; `abort` aborts its connection.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        abort: Arc<Notify>,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let resp = self.route(req, abort).await;
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                code: resp.status().as_u16(),
                method: ProxyMetrics::method_label(&method),
            })
            .inc();
        // The path only: a query could carry anything, headers carry the token.
        tracing::debug!(%method, %path, status = resp.status().as_u16(), reason = resp.headers().get(DENY_REASON_HEADER).and_then(|v| v.to_str().ok()), "request");
        resp
    }

    async fn route(
        self: &Arc<Self>,
        req: Request<Incoming>,
        abort: Arc<Notify>,
    ) -> Response<ResponseBody> {
        let path = req.uri().path();
        if path == METADATA_PATH || path.starts_with(&format!("{METADATA_PATH}/")) {
            return self.metadata();
        }
        if matches!(path, "/readyz" | "/metrics" | "/config/status") {
            if self.admin_elsewhere {
                return json_response(StatusCode::NOT_FOUND, &json!({"error": "not_found"}));
            }
            if let Some(resp) = self.admin(path) {
                return resp;
            }
        }
        self.proxy(req, abort).await
    }

    /// Steps 1–4 of the token contract: the claims of an admitted request and what its
    /// session may do with tools (its grant, and the server's policies as they apply to it),
    /// or the reason.
    async fn authenticate(
        &self,
        req: &Request<Incoming>,
    ) -> Result<(SessionClaims, ToolAccess), Reason> {
        let token = bearer(req.headers(), req.uri().query()).map_err(|e| match e {
            BearerError::Missing => Reason::TokenMissing,
            BearerError::Malformed => Reason::TokenInvalid,
        })?;
        let claims = self
            .verifier
            .verify(token)
            .await
            .map_err(|e| Reason::from(&e))?;
        let now = k8s_openapi::jiff::Timestamp::now();
        let (decision, session) = self
            .cache
            .authorize_session(claims.namespace(), claims.name(), now)
            .await;
        admit(&claims, decision, session.as_deref())?;
        let session = session.ok_or(Reason::SessionNotFound)?;
        Ok((
            claims,
            ToolAccess::new(&session, self.policies.index(), self.policies.observed()),
        ))
    }

    async fn proxy(
        self: &Arc<Self>,
        req: Request<Incoming>,
        abort: Arc<Notify>,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let (claims, access) = match self.authenticate(&req).await {
            Ok(c) => c,
            Err(reason) => return self.deny(reason),
        };
        let session_uid = claims.access.session.uid.clone();
        let mcp_session = match single_value(req.headers(), SESSION_ID_HEADER) {
            Ok(v) => v,
            Err(()) => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "invalid_request", "reason": "mcp_session_id_malformed"}),
                )
            }
        };
        let legacy_session = match legacy::session_param(req.uri().query()) {
            Ok(id) => id.map(legacy::binding_key),
            Err(legacy::MalformedSessionId) => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "invalid_request", "reason": "legacy_session_id_malformed"}),
                )
            }
        };
        for id in mcp_session.iter().chain(legacy_session.iter()) {
            match self.bindings.check(id, &session_uid, Instant::now()) {
                Check::Pass => {}
                Check::OtherSession => {
                    return json_response(
                        StatusCode::NOT_FOUND,
                        &json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "Session not found"}}),
                    )
                }
                Check::Cut(reason) => return self.deny(reason),
            }
        }
        let too_large = || {
            json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &json!({"error": "payload_too_large", "max_body_bytes": self.max_body_bytes}),
            )
        };
        let declared = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return too_large();
        }
        let (parts, body) = req.into_parts();
        let body = match tokio::time::timeout(
            self.body_timeout,
            Limited::new(body, self.max_body_bytes).collect(),
        )
        .await
        {
            Err(_) => {
                return json_response(
                    StatusCode::REQUEST_TIMEOUT,
                    &json!({"error": "request_timeout"}),
                )
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
            Ok(Err(_)) => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "body_unreadable"}),
                )
            }
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        let mut ids = Vec::new();
        let mut list_ids = Vec::new();
        // MCP posts its messages; a body on another method is not read here, so for a session
        // whose calls are checked it is not forwarded either (a server that took it would run
        // what no check saw).
        if parts.method != http::Method::POST && !body.is_empty() && access.restricted() {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "invalid_request", "reason": "body_on_non_post"}),
            );
        }
        if parts.method == http::Method::POST {
            let posted = Posted::parse(&body);
            if let Err(mismatch) = check_routing_headers(&parts.headers, &posted) {
                return json_response(StatusCode::BAD_REQUEST, &mismatch.body());
            }
            // A session whose calls are checked may only post what the gateway reads as the
            // server will: a body it cannot parse as JSON-RPC might still parse upstream, and
            // one with a repeated key might be read with the other value (parser differences
            // that would carry a call, or an argument, past the check).
            if access.restricted()
                && ((posted.messages.is_empty() && !body.is_empty())
                    || super::mcp::has_duplicate_keys(&body))
            {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error: the body is not JSON-RPC the gateway can read (or repeats a key)"}}),
                );
            }
            // Decided once: the refusal and the audit lines read the same decisions.
            let mut calls = decide_calls(&posted, |tool, arguments| access.decide(tool, arguments));
            // Rate limits draw on what would be forwarded: a refused body spends nothing.
            let limited = if calls.iter().all(CallDecision::granted) {
                self.rate_limit(&session_uid, &access, &mut calls).err()
            } else {
                None
            };
            if let Some(audit) = &self.audit {
                audit_calls(audit, &claims, &calls, started.elapsed());
            }
            self.metrics.count_calls(&calls);
            if let Some(wait) = limited {
                let secs = super::rate::retry_after_secs(wait);
                tracing::info!(
                    session = %claims.name(),
                    namespace = %claims.namespace(),
                    retry_after = secs,
                    "tools/call rate limited"
                );
                let body = refusal(&posted, &calls).unwrap_or(Value::Null);
                let mut resp = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
                return resp;
            }
            // The session's tool grant: a refused call never reaches the upstream. Streamable
            // HTTP gets the JSON-RPC errors as the POST's response (the session goes on); a
            // legacy POST gets 202 and its errors on its SSE stream (403 with them when that
            // stream is not open here).
            if let Some(refusal) = refusal(&posted, &calls) {
                let first = calls.iter().find_map(|c| c.outcome.refused.as_ref());
                tracing::info!(
                    session = %claims.name(),
                    namespace = %claims.namespace(),
                    reason = first.map_or("", |r| r.reason),
                    policy = first.and_then(|r| r.policy.as_deref()).unwrap_or(""),
                    "tools/call refused"
                );
                // Legacy HTTP+SSE: answers travel on the GET stream, so the errors go there and
                // the POST is accepted, as the server would have done.
                if let Some(key) = &legacy_session {
                    let messages = match &refusal {
                        Value::Array(batch) => batch.clone(),
                        one => vec![one.clone()],
                    };
                    if self.legacy_streams.inject(key, &messages) {
                        return status_only(StatusCode::ACCEPTED);
                    }
                    return json_response(StatusCode::FORBIDDEN, &refusal);
                }
                return json_response(StatusCode::OK, &refusal);
            }
            ids = posted.request_ids();
            list_ids = tools_list_ids(&posted);
        }
        // A legacy stream learns which of its answers are to tools/list before the request
        // is forwarded (the answer may travel before the POST's own response).
        if let (Some(key), true) = (&legacy_session, access.filters_lists()) {
            self.legacy_streams.owe_lists(key, &list_ids);
        }
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let headers = upstream_headers(&parts.headers, &claims);
        let response = match self
            .upstream
            .send(parts.method.clone(), &path_and_query, headers, body)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, path = %parts.uri.path(), "upstream request failed");
                let (status, error) = match e {
                    UpstreamError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
                    UpstreamError::Unavailable(_) => {
                        (StatusCode::BAD_GATEWAY, "upstream_unavailable")
                    }
                };
                return json_response(status, &json!({"error": error}));
            }
        };
        let (mut head, upstream_body) = response.into_parts();
        if let Ok(Some(assigned)) = single_value(&head.headers, SESSION_ID_HEADER) {
            self.bindings.bind(&assigned, &session_uid, Instant::now());
        }
        if parts.method == http::Method::DELETE && head.status.is_success() {
            if let Some(id) = &mcp_session {
                self.bindings.forget(id);
            }
        }
        let sse = head
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        // A session with a tool list, or under policies, sees only the tools it may call in
        // answers to tools/list.
        let is_get = parts.method == http::Method::GET;
        let tools_filter = (access.filters_lists() && (!list_ids.is_empty() || (is_get && sse)))
            .then(|| ToolsFilter::new(list_ids, access.lister()));
        if sse || tools_filter.is_some() {
            // The cut may append an event and the filter drops tools: the length is no
            // longer the upstream's.
            head.headers.remove(http::header::CONTENT_LENGTH);
        }
        let gateway = Arc::clone(self);
        let on_cut_uid = session_uid.clone();
        if let (Some(key), true) = (&legacy_session, head.status.is_success()) {
            self.legacy_streams.owe(key, &ids);
        }
        let on_endpoint = (parts.method == http::Method::GET).then(|| {
            let gateway = Arc::clone(self);
            let uid = session_uid.clone();
            Arc::new(move |id: &str| {
                let key = legacy::binding_key(id);
                gateway.bindings.bind(&key, &uid, Instant::now());
                gateway.legacy_streams.open(key)
            }) as OnEndpoint
        });
        let ctx = CutContext {
            metrics: self.metrics.clone(),
            abort_connection: abort,
            on_cut: Arc::new(move |reason| gateway.bindings.cut(&on_cut_uid, reason)),
            on_endpoint,
        };
        let until = {
            let cache = self.cache.clone();
            let (ns, name) = (claims.namespace().to_string(), claims.name().to_string());
            async move { Reason::from(cache.subscribe(&ns, &name).await) }
        };
        let body = CutBody::new(
            upstream_body,
            sse,
            self.max_body_bytes,
            ids,
            tools_filter,
            until,
            ctx,
        );
        Response::from_parts(head, body.boxed())
    }
}

impl Gateway {
    /// Takes the body's calls from their buckets: the session's `callsPerMinute`, its agent's
    /// (shared by all the agent's sessions) and the `callsPerMinute` of each matching rule of
    /// an enforcing policy, all or none. Past one,
    /// every call of the body is marked `rate_limited` and the wait is returned. The rules of
    /// monitor-mode policies draw on buckets of their own and only record what they would
    /// have refused.
    fn rate_limit(
        &self,
        session_uid: &str,
        access: &ToolAccess,
        calls: &mut [CallDecision],
    ) -> Result<(), std::time::Duration> {
        use super::rate::BucketKey;
        use apis::tool_policy::{Finding, PolicyReason};
        use apis::PolicyMode;
        let mut enforced: Vec<(BucketKey, u32, u32)> = Vec::new();
        let mut monitored: Vec<(BucketKey, u32, u32)> = Vec::new();
        let add = |wants: &mut Vec<(BucketKey, u32, u32)>, key: BucketKey, per_minute| match wants
            .iter_mut()
            .find(|(k, _, _)| *k == key)
        {
            Some((_, _, n)) => *n += 1,
            None => wants.push((key, per_minute, 1)),
        };
        for call in calls.iter() {
            if let Some(per_minute) = access.calls_per_minute {
                add(
                    &mut enforced,
                    BucketKey::Session(session_uid.to_string()),
                    per_minute,
                );
            }
            if let Some((agent, per_minute)) = &access.agent_limit {
                add(&mut enforced, BucketKey::Agent(agent.clone()), *per_minute);
            }
            for limit in &call.outcome.limits {
                let key = BucketKey::Rule {
                    session: session_uid.to_string(),
                    policy: limit.policy.clone(),
                    rule: limit.rule.clone(),
                };
                match limit.mode {
                    PolicyMode::Enforce => add(&mut enforced, key, limit.calls_per_minute),
                    PolicyMode::Monitor => add(&mut monitored, key, limit.calls_per_minute),
                }
            }
        }
        let now = Instant::now();
        if let Err(wait) = self.rates.take(&enforced, now) {
            let secs = super::rate::retry_after_secs(wait);
            for call in calls.iter_mut() {
                call.outcome.refused = Some(super::mcp::Refused {
                    reason: super::mcp::RATE_LIMITED_REASON,
                    code: super::mcp::RATE_LIMITED,
                    message: format!(
                        "this session's calls per minute are spent; retry after {secs} s"
                    ),
                    policy: None,
                });
            }
            return Err(wait);
        }
        if self.rates.take(&monitored, now).is_err() {
            for call in calls.iter_mut() {
                let over: Vec<Finding> = call
                    .outcome
                    .limits
                    .iter()
                    .filter(|l| l.mode == PolicyMode::Monitor)
                    .map(|l| Finding {
                        reason: PolicyReason::RateLimited,
                        policy: l.policy.clone(),
                        mode: PolicyMode::Monitor,
                        message: format!("calls per minute of rule {:?} spent", l.rule),
                    })
                    .collect();
                call.outcome.monitored.extend(over);
            }
        }
        Ok(())
    }
}

/// One audit line per `tools/call` of a body: allowed when the grant and the policies allow
/// it (and, in a batch, when no other call of the batch is refused, since a batch is held back
/// whole).
fn audit_calls(
    audit: &super::audit::Audit,
    claims: &SessionClaims,
    calls: &[CallDecision],
    latency: std::time::Duration,
) {
    let whole_body_refused = calls.iter().any(|c| !c.granted());
    for call in calls {
        audit.decision(claims, call, whole_body_refused, latency);
    }
}

/// The one value of a header (`Ok(None)` when absent; `Err` when given twice or not text).
fn single_value(headers: &http::HeaderMap, name: &str) -> Result<Option<String>, ()> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(()),
        (Some(v), None) => v.to_str().map(|s| Some(s.to_string())).map_err(|_| ()),
    }
}

/// Checks `--public-url`: an absolute http(s) URL with a host, no query or fragment; returned
/// without a trailing slash.
pub fn parse_public_url(raw: &str) -> Result<String, String> {
    let uri: http::Uri = raw.parse().map_err(|e| format!("{raw:?}: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!("{raw:?}: an absolute http:// or https:// URL"));
    }
    if uri.query().is_some() || raw.contains('#') || raw.contains('"') || raw.contains('@') {
        return Err(format!("{raw:?}: no query, fragment, quote or userinfo"));
    }
    Ok(raw.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls_and_metadata_paths() {
        assert_eq!(
            parse_public_url("http://github.demo.svc:8086/").unwrap(),
            "http://github.demo.svc:8086"
        );
        assert_eq!(
            parse_public_url("https://mcp.example/github/mcp").unwrap(),
            "https://mcp.example/github/mcp"
        );
        for bad in [
            "github.demo.svc",
            "/mcp",
            "ftp://x",
            "http://x/?a=1",
            "http://x/#f",
            "http://u@x/",
            "",
            "http://x/\"a",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
    }
}
