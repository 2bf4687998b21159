//! The Kubernetes-style HTTP API: routing, authentication and authorization of each request,
//! discovery and OpenAPI, and the REST verbs on every served resource.

mod documents;
mod error;
mod limits;
mod observe;
mod patch;
mod render;
mod request;
mod resource;
mod route;
mod sync;
mod token;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::{AccessSession, Agent, Enrollment, Revocation, ToolPolicy};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use tracing::Instrument;

pub use error::{ApiError, ApiResult};
pub use limits::{Limits, WatchSlot, MAX_BODY_BYTES, MAX_OBJECT_BYTES};
pub use observe::{HttpMetrics, REQUEST_LOG_TARGET};
pub use request::Rendering;
pub use sync::SyncState;

use documents::{Doc, Documents};
use limits::{read_body, BodyPhase, InflightLimiter, RequestKind, WatchCounter};
use observe::{request_span, RecordUser, RequestLog};
use route::{Route, Target, Verb};

use crate::admission::{NamespaceLifecycle, NamespaceRefusal};
use crate::auth::{
    Attributes, AuthenticationError, Authenticator, Authorizer, ConnectionInfo, Decision,
};
use crate::store::Store;
use crate::tokens::SessionTokens;
use apis::strategy::Strategy;
use request::Params;
use resource::ResourceRequest;

/// Routes a request on a resource to the handler of its kind.
macro_rules! serve_kinds {
    ($app:expr, $plural:expr, $req:expr; $($kind:ty),+) => {
        match $plural {
            $(p if p == <$kind as Strategy>::INFO.plural => $app.serve::<$kind>($req).await,)+
            _ => Err(ApiError::not_found_path()),
        }
    };
}

/// A request's place in its in-flight pool, counted in the in-flight gauge while held.
struct InflightSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _counted: observe::InflightGauge,
}

/// A response whose body is streamed (a list served as it is read) keeps its in-flight
/// slot until the body ends: the work goes on after the handler returns.
fn hold_while_streaming(response: Response, permit: InflightSlot) -> Response {
    use axum::body::HttpBody as _;
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    response.map(|body| {
        axum::body::Body::from_stream(futures::StreamExt::map(
            body.into_data_stream(),
            move |frame| {
                let _held = &permit;
                frame
            },
        ))
    })
}

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// Everything a request handler needs.
pub struct AppState<S> {
    pub store: S,
    pub authenticator: Arc<dyn Authenticator>,
    pub authorizer: Arc<dyn Authorizer>,
    pub config: HttpConfig,
    pub metrics: Arc<HttpMetrics>,
    /// Flips to true on shutdown: open watches end cleanly.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Namespace lifecycle admission (behind kube-apiserver); none in standalone mode.
    pub namespaces: Option<Arc<NamespaceLifecycle>>,
    /// Limits and timeouts of the listener.
    pub limits: Limits,
    /// The signer of the `token` subresource and the JWKS it publishes.
    pub tokens: Arc<SessionTokens>,
    /// The gateway watches this replica serves and how far each has been delivered
    /// (revocation receipts).
    pub deliveries: Arc<crate::receipts::Deliveries>,
    inflight: InflightLimiter,
    watches: Arc<WatchCounter>,
    docs: Arc<Documents>,
}

impl<S: Clone> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            authenticator: self.authenticator.clone(),
            authorizer: self.authorizer.clone(),
            config: self.config.clone(),
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            namespaces: self.namespaces.clone(),
            limits: self.limits.clone(),
            tokens: self.tokens.clone(),
            deliveries: self.deliveries.clone(),
            inflight: self.inflight.clone(),
            watches: self.watches.clone(),
            docs: self.docs.clone(),
        }
    }
}

impl<S: Store + Clone> AppState<S> {
    pub fn new(
        store: S,
        authenticator: Arc<dyn Authenticator>,
        authorizer: Arc<dyn Authorizer>,
        config: HttpConfig,
        metrics: Arc<HttpMetrics>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            store,
            authenticator,
            authorizer,
            config,
            metrics,
            shutdown,
            namespaces: None,
            limits: Limits::default(),
            // Until `with_session_tokens`: no signing key, the subresource answers 503.
            tokens: Arc::new(SessionTokens::disabled(Arc::default())),
            deliveries: Arc::default(),
            inflight: InflightLimiter::new(&Limits::default()),
            watches: Arc::default(),
            docs: Arc::new(Documents::build()),
        }
    }

    /// Sets the listener's limits and timeouts.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.inflight = InflightLimiter::new(&limits);
        self.limits = limits;
        self
    }

    /// Issues session tokens with `tokens` (and publishes its JWKS).
    pub fn with_session_tokens(mut self, tokens: Arc<SessionTokens>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Refuses creation in namespaces that do not exist or are terminating.
    pub fn with_namespace_lifecycle(mut self, namespaces: Arc<NamespaceLifecycle>) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// Serves one request, in a span of its own.
    pub async fn handle(mut self, request: Request) -> Response {
        let (span, log) = request_span(&request);
        self.authenticator = Arc::new(RecordUser {
            inner: self.authenticator.clone(),
            log: log.clone(),
        });
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
        // Watches are long-running: capped per user instead (in `serve`), never timed out.
        let long_running = matches!(
            RequestKind::of(request.method(), request.uri()),
            RequestKind::LongRunning
        );
        let _permit = match self.admit(&request, started, &log) {
            Ok(permit) => permit,
            Err(response) => return *response,
        };
        let routed = if long_running {
            self.route(request, &BodyPhase::default()).await
        } else {
            // Dropping the request's future gives back its connection, its write turn and its
            // permit; what it had sent may still commit (the answer says so).
            let limit = self.limits.request_timeout;
            let body = BodyPhase::default();
            tokio::time::timeout(limit, self.route(request, &body))
                .await
                .unwrap_or_else(|_| {
                    // The client's fault, not the storage's: the body bound's answer, whichever
                    // of the two timers fired first (both are 60 s by default).
                    if body.reading() {
                        return Err((String::new(), String::new(), limits::body_timed_out()));
                    }
                    tracing::warn!(limit_ms = limit.as_millis() as u64, "request timed out");
                    Err((
                        String::new(),
                        String::new(),
                        ApiError::unavailable(format!(
                            "the request did not complete within {limit:?} (storage not \
                             answering?); a write may or may not have been applied; retry"
                        )),
                    ))
                })
        };
        let (verb, resource, response) = match routed {
            Ok((verb, resource, response)) => (verb, resource, response),
            Err((verb, resource, e)) => (verb, resource, e.into_response()),
        };
        self.metrics
            .count((&verb, &method), &resource, &response, started, &log);
        match _permit {
            Some(permit) => hold_while_streaming(response, permit),
            None => response,
        }
    }

    /// A place in the request's in-flight pool, or the 429 (counted) that refuses it.
    fn admit(
        &self,
        request: &Request,
        started: Instant,
        log: &RequestLog,
    ) -> Result<Option<InflightSlot>, Box<Response>> {
        let kind = RequestKind::of(request.method(), request.uri());
        let admitted = self.inflight.admit(kind).map(|permit| {
            permit.map(|permit| InflightSlot {
                _permit: permit,
                _counted: self.metrics.inflight_started(kind),
            })
        });
        admitted.map_err(|e| {
            self.metrics.rejected(kind);
            let response = e.into_response();
            self.metrics
                .count(("", request.method()), "", &response, started, log);
            Box::new(response)
        })
    }

    async fn route(
        &self,
        request: Request,
        body_phase: &BodyPhase,
    ) -> Result<(String, String, Response), (String, String, ApiError)> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let segments = route::segments(&path);
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let fail = |verb: &str, resource: &str| {
            let (verb, resource) = (verb.to_string(), resource.to_string());
            move |e: ApiError| (verb.clone(), resource.clone(), e)
        };

        if matches!(segs.as_slice(), ["livez"] | ["readyz"] | ["healthz"]) {
            return Ok((
                "get".into(),
                String::new(),
                (StatusCode::OK, "ok").into_response(),
            ));
        }

        let connection = parts
            .extensions
            .get::<ConnectionInfo>()
            .cloned()
            .unwrap_or_default();
        let user = match self.authenticator.authenticate(&parts, &connection).await {
            Ok(Some(user)) => user,
            Ok(None) | Err(AuthenticationError::InvalidToken) => {
                return Err(fail("", "")(ApiError::unauthorized()))
            }
            // Not a verdict on the credentials: 401 would make callers drop them.
            Err(AuthenticationError::Unavailable(m)) => {
                tracing::warn!(error = %m, "authentication unavailable");
                return Err(fail("", "")(ApiError::unavailable(
                    "authentication is unavailable; retry later",
                )));
            }
        };
        let params = Params::parse(parts.uri.query()).map_err(fail("", ""))?;
        let route = Target::parse(&segs)
            .route(&parts.method, &params)
            .map_err(fail("", ""))?;
        let attributes = route.attributes(&parts.method, &params, &path);
        let verb = attributes.verb.clone();
        let resource_label = attributes.resource.clone();
        let fail = fail(&verb, &resource_label);
        match self.authorizer.authorize(&user, &attributes).await {
            Decision::Allow => {}
            Decision::Deny(reason) => {
                return Err(fail(ApiError::forbidden(
                    attributes.forbidden_message(&user, &reason),
                )))
            }
            // Not a denial: 403 would make callers drop their authority.
            Decision::Unavailable(m) => {
                tracing::warn!(error = %m, "authorization unavailable");
                return Err(fail(ApiError::unavailable(
                    "authorization is unavailable; retry later",
                )));
            }
        }
        tracing::debug!(user = %user.name, verb = %verb, path = %path, "request");

        let body = body_phase
            .while_reading(read_body(&parts.headers, body))
            .await
            .map_err(&fail)?;
        let response = match route {
            Route::NonResource(Doc::Jwks | Doc::OpenIdConfiguration)
                if !matches!(parts.method, http::Method::GET | http::Method::HEAD) =>
            {
                return Err(fail(ApiError::method_not_allowed(
                    parts.method.as_str(),
                    &path,
                )))
            }
            Route::NonResource(Doc::Jwks) => documents::jwks(&self.tokens),
            Route::NonResource(Doc::OpenIdConfiguration) => {
                documents::openid_configuration(&self.tokens).map_err(&fail)?
            }
            Route::NonResource(doc) => self.docs.serve(doc, &parts.headers).map_err(&fail)?,
            Route::Resource(route) => {
                let req = ResourceRequest {
                    route: &route,
                    params,
                    headers: &parts.headers,
                    body,
                    user: &user,
                    namespace_terminating: false,
                    cluster_authority: false,
                    apply_create: None,
                    scope: None,
                };
                // Every served kind, by its strategy: adding a kind adds it here.
                let result = serve_kinds!(self, route.resource.as_str(), req;
                    AccessSession, Agent, Enrollment, Revocation, ToolPolicy);
                result.map_err(&fail)?
            }
            Route::Unknown => return Err(fail(ApiError::not_found_path())),
        };
        Ok((verb, resource_label, response))
    }

    /// Whether `namespace` is being deleted: its deletes are then the namespace's teardown
    /// (the namespace controller's), not withdrawals by the caller.
    async fn terminating(&self, namespace: Option<&str>) -> bool {
        match (&self.namespaces, namespace) {
            (Some(lifecycle), Some(ns)) => matches!(
                lifecycle.check_create(ns).await,
                Err(NamespaceRefusal::Terminating(_))
            ),
            _ => false,
        }
    }

    /// What a create of `K` in the request's namespace must pass: the namespace exists and
    /// is not terminating. Answers whether the caller may create `K` in every namespace
    /// (asked only by kinds whose authority reaches that far, see
    /// [`Strategy::ASKS_CLUSTER_AUTHORITY`]).
    async fn admit_create<K: Strategy>(&self, req: &ResourceRequest<'_>) -> ApiResult<bool> {
        if let (Some(lifecycle), Some(ns)) = (&self.namespaces, req.namespace()) {
            lifecycle
                .check_create(ns)
                .await
                .map_err(|refusal| match refusal {
                    NamespaceRefusal::NotFound(ns) => ApiError::namespace_not_found(&ns),
                    NamespaceRefusal::Terminating(_) => ApiError::forbidden(refusal.to_string()),
                    NamespaceRefusal::Unavailable(..) => {
                        tracing::warn!(error = %refusal, "namespace check failed");
                        ApiError::unavailable("the namespace cannot be checked; retry later")
                    }
                })?;
        }
        if !K::ASKS_CLUSTER_AUTHORITY {
            return Ok(false);
        }
        // As RBAC sees "create this kind in every namespace": only a cluster-wide grant
        // makes a revocation's fence reach beyond its namespace.
        let everywhere = Attributes {
            verb: "create".into(),
            resource_request: true,
            api_group: apis::GROUP.to_string(),
            api_version: apis::VERSION.to_string(),
            resource: K::INFO.plural.to_string(),
            ..Default::default()
        };
        Ok(matches!(
            self.authorizer.authorize(req.user, &everywhere).await,
            Decision::Allow
        ))
    }

    /// Whether a server-side apply may create its object: the caller is authorized to
    /// `create` it (the request itself was authorized as `patch`) and [`Self::admit_create`]
    /// admits it.
    async fn apply_create<K: Strategy>(&self, req: &ResourceRequest<'_>) -> ApiResult<bool> {
        let attributes = Attributes {
            verb: "create".into(),
            resource_request: true,
            namespace: req.namespace().unwrap_or_default().to_string(),
            api_group: apis::GROUP.to_string(),
            api_version: apis::VERSION.to_string(),
            resource: K::INFO.plural.to_string(),
            ..Default::default()
        };
        match self.authorizer.authorize(req.user, &attributes).await {
            Decision::Allow => {}
            Decision::Deny(reason) => {
                return Err(ApiError::forbidden(
                    attributes.forbidden_message(req.user, &reason),
                ))
            }
            Decision::Unavailable(m) => {
                tracing::warn!(error = %m, "authorization unavailable");
                return Err(ApiError::unavailable(
                    "authorization is unavailable; retry later",
                ));
            }
        }
        self.admit_create::<K>(req).await
    }

    /// Serves a routed request on `K` by its verb.
    async fn serve<K: Strategy>(&self, req: ResourceRequest<'_>) -> ApiResult<Response> {
        let verb = req.route.verb;
        if !K::INFO.verbs.contains(&verb.as_str()) && req.subresource().is_none() {
            return Err(ApiError::method_not_allowed(&verb.upper(), K::INFO.plural));
        }
        if req.subresource() == Some(apis::session_token::TOKEN_SUBRESOURCE) {
            // Only `create` reaches here (the route refuses every other method with 405).
            return match verb {
                Verb::Create if K::INFO.plural == apis::resources::ACCESS_SESSIONS.plural => {
                    token::create::<S>(&self.store, &self.tokens, req).await
                }
                other => Err(ApiError::method_not_allowed(
                    &other.upper(),
                    &format!("{}/token", K::INFO.plural),
                )),
            };
        }
        if req.subresource().is_some() {
            return match verb {
                Verb::Get => resource::get::<K, S>(&self.store, req).await,
                Verb::Patch | Verb::Update => {
                    resource::update_status::<K, S>(&self.store, req).await
                }
                other => Err(ApiError::method_not_allowed(
                    &other.upper(),
                    &format!("{}/status", K::INFO.plural),
                )),
            };
        }
        if K::INFO.namespaced == req.namespace().is_none() && req.name().is_some() {
            return Err(ApiError::not_found_path());
        }
        if !K::INFO.namespaced && req.namespace().is_some() {
            return Err(ApiError::not_found_path());
        }
        if let Some(ns) = req.namespace() {
            if !apis::validation::is_dns1123_label(ns) {
                return Err(ApiError::not_found_path());
            }
        }
        let fields = K::FIELDS;
        match verb {
            Verb::Get => resource::get::<K, S>(&self.store, req).await,
            Verb::List => {
                let options = req.params.list_options(&K::INFO, fields)?;
                resource::list::<K, S>(&self.store, req, options).await
            }
            Verb::Watch => {
                let options = req.params.list_options(&K::INFO, fields)?;
                let rendering = Rendering::from_headers(req.headers, req.params.include_object())?;
                let Some(slot) = self
                    .watches
                    .try_acquire(&req.user.name, self.limits.max_watches_per_user)
                else {
                    self.metrics.rejected(RequestKind::LongRunning);
                    return Err(ApiError::too_many_requests(
                        format!(
                            "Too many requests: at most {} watches per user are served at once",
                            self.limits.max_watches_per_user
                        ),
                        1,
                    ));
                };
                watch::watch::<K, S>(
                    self,
                    req.namespace().map(str::to_string),
                    options,
                    rendering,
                    slot,
                    None,
                    None,
                )
                .await
            }
            Verb::Create => {
                if K::INFO.namespaced && req.namespace().is_none() {
                    return Err(ApiError::method_not_allowed("POST", K::INFO.plural));
                }
                let mut req = req;
                req.cluster_authority = self.admit_create::<K>(&req).await?;
                resource::create::<K, S>(&self.store, req).await
            }
            Verb::Update => resource::update::<K, S>(&self.store, req).await,
            Verb::Patch => {
                let mut req = req;
                // A server-side apply creates what does not exist: as a create, it needs
                // `create` on the resource (RBAC granting `patch` alone must not mint
                // sessions) and a live namespace; decided now, used only if it creates.
                if resource::is_apply(&req) {
                    req.apply_create = Some(self.apply_create::<K>(&req).await);
                }
                resource::patch::<K, S>(&self.store, req).await
            }
            Verb::Delete => {
                let mut req = req;
                req.namespace_terminating = self.terminating(req.namespace()).await;
                resource::delete::<K, S>(&self.store, req).await
            }
            Verb::DeleteCollection => {
                // As kube-apiserver, which registers only list and watch on the
                // all-namespaces path of a namespaced resource.
                if K::INFO.namespaced && req.namespace().is_none() {
                    return Err(ApiError::method_not_allowed("DELETE", K::INFO.plural));
                }
                let options = req.params.list_options(&K::INFO, fields)?;
                let mut req = req;
                req.namespace_terminating = self.terminating(req.namespace()).await;
                resource::delete_collection::<K, S>(&self.store, req, options).await
            }
        }
    }
}
