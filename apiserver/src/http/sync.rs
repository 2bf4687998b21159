//! The gateway sync listener (DESIGN §4): `get`, `list` and `watch` of access sessions and
//! tool policies at the API's own paths and in its wire format, so a stock informer or
//! kube-rs watcher works against it — but only for the objects of the caller's own
//! MCPServer, established from its Pod-bound token ([`GatewayAuthenticator`]).
//!
//! The scope is a field selector ANDed with whatever the request asks: the namespace and
//! `spec.server.uid` for sessions (one generation of the server), the namespace and
//! `spec.server.name` for tool policies (which hold for every generation). It applies in SQL
//! for lists, in the change feed's filter for watches, and is checked on every get. Another
//! server's objects do not exist here: a list or watch naming them is empty, a get is the
//! 404 of a missing object.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::selector::{FieldRequirement, FieldSelector};
use apis::strategy::Strategy;
use apis::{AccessSession, Kind, ToolPolicy};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use tracing::Instrument;

use super::documents::{Doc, Documents};
use super::error::{ApiError, ApiResult};
use super::observe::{request_span, RequestLog};
use super::request::{Params, Rendering};
use super::resource::{self, ResourceRequest};
use super::route::{self, ResourceRoute, Target, Verb};
use super::watch::{self, WatchGuard};
use super::AppState;
use crate::auth::{
    bearer_token, Freshness, GatewayAuthenticator, GatewayIdentity, GatewayRefusal, UserInfo,
};
use crate::store::Store;

/// Where the scope's fields live: the namespace, a session's server UID and a policy's
/// server name.
const NAMESPACE_PATH: &[&str] = &["metadata", "namespace"];
const SERVER_UID_PATH: &[&str] = &["spec", "server", "uid"];
const SERVER_NAME_PATH: &[&str] = &["spec", "server", "name"];

/// The sync listener's application: the API's store, limits and metrics, its own
/// authentication and documents.
pub struct SyncState<S> {
    app: AppState<S>,
    /// Where drift reports become Events on MCPServers (behind kube-apiserver only).
    drift: Option<crate::events::DriftEvents>,
    gateways: Arc<dyn GatewayAuthenticator>,
    /// How often an open watch re-verifies its gateway's owner chain.
    reverify: Duration,
    docs: Arc<Documents>,
}

impl<S: Clone> Clone for SyncState<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            drift: self.drift.clone(),
            gateways: self.gateways.clone(),
            reverify: self.reverify,
            docs: self.docs.clone(),
        }
    }
}

/// The objects of `plural` one gateway may see: sessions of its server's generation,
/// policies of its server's name, in its namespace.
fn scope(gateway: &GatewayIdentity, plural: &str) -> FieldSelector {
    let server = if plural == ToolPolicy::PLURAL {
        FieldRequirement {
            field: "spec.server.name".into(),
            path: SERVER_NAME_PATH,
            value: gateway.server_name.clone(),
            negated: false,
        }
    } else {
        FieldRequirement {
            field: "spec.server.uid".into(),
            path: SERVER_UID_PATH,
            value: gateway.server_uid.clone(),
            negated: false,
        }
    };
    FieldSelector(vec![
        FieldRequirement {
            field: "metadata.namespace".into(),
            path: NAMESPACE_PATH,
            value: gateway.namespace.clone(),
            negated: false,
        },
        server,
    ])
}

/// Whether the listener serves `plural`.
fn served(plural: &str) -> bool {
    plural == AccessSession::PLURAL || plural == ToolPolicy::PLURAL
}

impl<S: Store + Clone> SyncState<S> {
    /// Serves `app`'s sessions to gateways `gateways` lets in, re-verifying open watches
    /// every `reverify`.
    pub fn new(
        app: AppState<S>,
        gateways: Arc<dyn GatewayAuthenticator>,
        reverify: Duration,
    ) -> Self {
        Self {
            app,
            drift: None,
            gateways,
            reverify,
            docs: Arc::new(Documents::build_for(
                apis::resources::GATEWAY_SYNC_RESOURCES,
            )),
        }
    }

    /// Records the tool drift gateways report as Events through `events`.
    pub fn with_drift_events(mut self, events: crate::events::DriftEvents) -> Self {
        self.drift = Some(events);
        self
    }

    /// The listener's limits and timeouts (those of the API listener).
    pub fn limits(&self) -> &super::Limits {
        &self.app.limits
    }

    /// Serves one request, in a span of its own.
    pub async fn handle(self, request: Request) -> Response {
        let (span, log) = request_span(&request);
        let response = self
            .handle_in_span(request, log.clone())
            .instrument(span)
            .await;
        log.emit();
        response
    }

    async fn handle_in_span(self, request: Request, log: RequestLog) -> Response {
        let started = Instant::now();
        let method = request.method().clone();
        let _permit = match self.app.admit(&request, started, &log) {
            Ok(permit) => permit,
            Err(response) => return *response,
        };
        // The metric's resource label: policies when the path names them, else sessions.
        let plural = if route::segments(request.uri().path())
            .iter()
            .any(|s| s == ToolPolicy::PLURAL)
        {
            ToolPolicy::PLURAL
        } else {
            AccessSession::PLURAL
        };
        let (verb, response) = match self.route(request, &log).await {
            Ok((verb, response)) => (verb, response),
            Err((verb, e)) => (verb, e.into_response()),
        };
        self.app
            .metrics
            .count((&verb, &method), plural, &response, started, &log);
        response
    }

    async fn route(
        &self,
        request: Request,
        log: &RequestLog,
    ) -> Result<(String, Response), (String, ApiError)> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let segments = route::segments(&path);
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let fail = |verb: &str| {
            let verb = verb.to_string();
            move |e: ApiError| (verb.clone(), e)
        };
        if matches!(segs.as_slice(), ["livez"] | ["readyz"] | ["healthz"]) {
            return Ok(("get".into(), (StatusCode::OK, "ok").into_response()));
        }

        let token =
            bearer_token(&parts).ok_or_else(|| fail("")(refused(GatewayRefusal::NoToken)))?;
        let gateway = self
            .gateways
            .authenticate(token, Freshness::Cached)
            .await
            .map_err(|r| fail("")(refused(r)))?;
        log.set_user(&gateway.user);

        let params = Params::parse(parts.uri.query()).map_err(fail(""))?;
        // A pinned tool listed with another definition: recorded as an Event. Served here
        // only (it is not a subresource of the API).
        if let ["apis", group, version, "namespaces", namespace, plural, name, "drift"] =
            segs.as_slice()
        {
            if *group == apis::GROUP && *version == apis::VERSION && *plural == ToolPolicy::PLURAL {
                if parts.method != Method::POST {
                    return Err(fail("")(ApiError::method_not_allowed(
                        parts.method.as_str(),
                        "toolpolicies/drift",
                    )));
                }
                return self
                    .drift(&gateway, namespace, name, body)
                    .await
                    .map(|r| ("create".to_string(), r))
                    .map_err(fail("create"));
            }
        }
        let target = Target::parse(&segs);
        let (namespace, plural, name) = match target {
            Target::NonResource(doc) => {
                return match doc {
                    Doc::Api | Doc::Apis | Doc::Group | Doc::ResourceList | Doc::Version => self
                        .docs
                        .serve(doc, &parts.headers)
                        .map(|r| ("get".to_string(), r))
                        .map_err(fail("get")),
                    // The session-token keys and issuer, for any authenticated gateway.
                    Doc::Jwks if is_get(&parts.method) => {
                        Ok(("get".to_string(), super::documents::jwks(&self.app.tokens)))
                    }
                    Doc::OpenIdConfiguration if is_get(&parts.method) => {
                        super::documents::openid_configuration(&self.app.tokens)
                            .map(|r| ("get".to_string(), r))
                            .map_err(fail("get"))
                    }
                    Doc::Jwks | Doc::OpenIdConfiguration => {
                        Err(fail(&parts.method.as_str().to_lowercase())(
                            ApiError::method_not_allowed(parts.method.as_str(), &path),
                        ))
                    }
                    // The schemas describe the whole API; gateways need none of them.
                    _ => Err(fail("get")(ApiError::not_found_path())),
                };
            }
            Target::Resource {
                namespace,
                plural,
                name,
                subresource,
            } if served(&plural) && subresource.is_none() => (namespace, plural, name),
            Target::Resource { .. } | Target::Unknown => {
                return Err(fail("")(ApiError::not_found_path()))
            }
        };
        let verb = match (&parts.method, name.is_some()) {
            (&Method::GET | &Method::HEAD, true) => Verb::Get,
            (&Method::GET | &Method::HEAD, false) if params.is_watch().map_err(fail(""))? => {
                Verb::Watch
            }
            (&Method::GET | &Method::HEAD, false) => Verb::List,
            (method, _) => {
                return Err(fail(&method.as_str().to_lowercase())(
                    ApiError::method_not_allowed(method.as_str(), &plural),
                ))
            }
        };
        let fail = fail(verb.as_str());
        if let Some(ns) = namespace.as_deref() {
            if !apis::validation::is_dns1123_label(ns) {
                return Err(fail(ApiError::not_found_path()));
            }
        }
        tracing::debug!(
            gateway = %gateway.user, server = %gateway.server_name, verb = verb.as_str(), path = %path,
            "sync request"
        );
        let scope = scope(&gateway, &plural);
        // Only who the caller is reaches the handlers: no bound object can appear in a
        // Status message.
        let user = UserInfo {
            name: gateway.user.clone(),
            ..Default::default()
        };
        let route = ResourceRoute {
            verb,
            namespace,
            resource: plural.clone(),
            name,
            subresource: None,
        };
        let req = ResourceRequest {
            route: &route,
            params,
            headers: &parts.headers,
            body: bytes::Bytes::new(),
            user: &user,
            namespace_terminating: false,
            cluster_authority: false,
            apply_create: None,
            scope: Some(&scope),
        };
        let response = if plural == ToolPolicy::PLURAL {
            self.serve::<ToolPolicy>(verb, req, &gateway, token).await
        } else {
            self.serve::<AccessSession>(verb, req, &gateway, token)
                .await
        };
        response
            .map(|r| (verb.as_str().to_string(), r))
            .map_err(fail)
    }

    /// Serves a get, list or watch of `K` (the request carries the gateway's scope).
    async fn serve<K: Strategy>(
        &self,
        verb: Verb,
        req: ResourceRequest<'_>,
        gateway: &GatewayIdentity,
        token: &str,
    ) -> ApiResult<Response> {
        match verb {
            Verb::Get => resource::get::<K, S>(&self.app.store, req).await,
            Verb::List => {
                let options = req.params.list_options(&K::INFO, K::FIELDS)?;
                resource::list::<K, S>(&self.app.store, req, options).await
            }
            _ => self.watch::<K>(req, gateway, token).await,
        }
    }

    /// `POST .../namespaces/NS/toolpolicies/NAME/drift` `{"tool","pinned","observed"}`: the
    /// gateway saw its server list `tool` with the `observed` definition while the policy pins
    /// `pinned`. Checked against the stored policy (in the gateway's scope, pinning exactly
    /// that), then recorded as a Warning Event on the gateway's MCPServer. 202 when taken.
    async fn drift(
        &self,
        gateway: &GatewayIdentity,
        namespace: &str,
        name: &str,
        body: axum::body::Body,
    ) -> ApiResult<Response> {
        use http_body_util::BodyExt;
        const MAX_REPORT: usize = 4096;
        let bytes = http_body_util::Limited::new(body, MAX_REPORT)
            .collect()
            .await
            .map_err(|_| ApiError::too_large(MAX_REPORT))?
            .to_bytes();
        #[derive(serde::Deserialize)]
        struct Report {
            tool: String,
            pinned: String,
            observed: String,
        }
        let report: Report = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("a drift report: {e}")))?;
        if !apis::tool_policy::is_digest(&report.observed) {
            return Err(ApiError::bad_request(
                "observed: \"sha256:\" and 64 lowercase hex digits",
            ));
        }
        let missing =
            || ApiError::from_store(crate::store::StoreError::NotFound, &ToolPolicy::INFO, name);
        let policy: ToolPolicy = self
            .app
            .store
            .get(namespace, name)
            .await
            .map_err(|e| ApiError::from_store(e, &ToolPolicy::INFO, name))?;
        let in_scope =
            namespace == gateway.namespace && policy.spec.server.name == gateway.server_name;
        if !in_scope {
            return Err(missing());
        }
        let pins =
            policy.spec.tools.iter().any(|r| {
                r.name == report.tool && r.digest.as_deref() == Some(report.pinned.as_str())
            });
        if !pins {
            return Err(ApiError::bad_request(format!(
                "toolpolicy {name:?} does not pin tool {:?} at {}",
                report.tool, report.pinned
            )));
        }
        if let Some(events) = &self.drift {
            events.send(crate::events::ToolDrift {
                namespace: gateway.namespace.clone(),
                server_name: gateway.server_name.clone(),
                server_uid: gateway.server_uid.clone(),
                policy: name.to_string(),
                tool: report.tool,
                pinned: report.pinned,
                observed: report.observed,
            });
        }
        Ok((StatusCode::ACCEPTED, axum::Json(serde_json::json!({}))).into_response())
    }

    async fn watch<K: Strategy>(
        &self,
        req: ResourceRequest<'_>,
        gateway: &GatewayIdentity,
        token: &str,
    ) -> ApiResult<Response> {
        let mut options = req.params.list_options(&K::INFO, K::FIELDS)?;
        if let Some(scope) = req.scope {
            options.fields.0.extend(scope.0.iter().cloned());
        }
        let rendering = Rendering::from_headers(req.headers, req.params.include_object())?;
        // Counted per Pod: the replicas of one gateway share a service account.
        let Some(slot) = self
            .app
            .watches
            .try_acquire(&gateway.pod_uid, self.app.limits.max_watches_per_user)
        else {
            self.app.metrics.rejected(super::RequestKind::LongRunning);
            return Err(ApiError::too_many_requests(
                format!(
                    "Too many requests: at most {} watches per gateway pod are served at once",
                    self.app.limits.max_watches_per_user
                ),
                1,
            ));
        };
        let guard = WatchGuard {
            every: self.reverify,
            still_allowed: {
                let gateways = self.gateways.clone();
                let token = token.to_string();
                let server_uid = gateway.server_uid.clone();
                let unanswered = Arc::new(AtomicU32::new(0));
                Box::new(move || {
                    let gateways = gateways.clone();
                    let token = token.clone();
                    let server_uid = server_uid.clone();
                    let unanswered = unanswered.clone();
                    Box::pin(async move {
                        match gateways.authenticate(&token, Freshness::Live).await {
                            // The same server generation, or nothing.
                            Ok(now) => {
                                unanswered.store(0, Ordering::Relaxed);
                                now.server_uid == server_uid
                            }
                            // Not a verdict: one period of grace, then the watch ends (fail
                            // closed) and the gateway's relist meets the outage itself.
                            Err(GatewayRefusal::Unavailable(e)) => {
                                tracing::warn!(error = %e, "cannot re-verify a gateway watch");
                                unanswered.fetch_add(1, Ordering::Relaxed) < 1
                            }
                            Err(_) => false,
                        }
                    })
                })
            },
        };
        // Revocation delivery is tracked on session watches only.
        let deliveries = (K::PLURAL == AccessSession::PLURAL)
            .then(|| self.app.deliveries.register(&gateway.server_uid));
        watch::watch::<K, S>(
            &self.app,
            req.namespace().map(str::to_string),
            options,
            rendering,
            slot,
            Some(guard),
            deliveries,
        )
        .await
    }
}

fn is_get(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// The answer to a refused gateway: 401 with a reason that names no object, or 503 when
/// the authority could not be asked.
fn refused(refusal: GatewayRefusal) -> ApiError {
    match refusal {
        GatewayRefusal::Unavailable(e) => {
            tracing::warn!(error = %e, "gateway authentication unavailable");
            ApiError::unavailable("authentication is unavailable; retry later")
        }
        refusal => ApiError::unauthorized_because(format!("Unauthorized: {refusal}")),
    }
}
