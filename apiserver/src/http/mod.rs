//! The Kubernetes-style HTTP API: routing, authentication and authorization of each request,
//! discovery and OpenAPI, and the REST verbs on every served resource.

mod error;
mod patch;
mod render;
mod request;
mod resource;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::resources::RESOURCES;
use apis::{AccessSession, Agent, Enrollment, Revocation};
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tracing::Instrument;

pub use error::{ApiError, ApiResult};
pub use request::Rendering;

use crate::admission::{NamespaceLifecycle, NamespaceRefusal};
use crate::auth::{
    Attributes, AuthenticationError, Authenticator, Authorizer, ConnectionInfo, Decision, UserInfo,
};
use crate::store::Store;
use apis::strategy::Strategy;
use request::Params;
use resource::ResourceRequest;

/// Routes a request on a resource to the handler of its kind.
macro_rules! serve_kinds {
    ($app:expr, $plural:expr, $verb:expr, $req:expr; $($kind:ty),+) => {
        match $plural.as_str() {
            $(p if p == <$kind as Strategy>::INFO.plural => $app.serve::<$kind>(&$verb, $req).await,)+
            _ => Err(ApiError::not_found_path()),
        }
    };
}

/// Largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Largest object stored, encoded as JSON: etcd's default request limit (1.5 MiB), which
/// bounds every object behind kube-apiserver. Every stored object is held by the change
/// feed and copied to every watcher, so this bounds memory per object.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

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

/// Limits and timeouts of the API listener, in the spirit of kube-apiserver's
/// `--max-requests-inflight` and its HTTP server settings.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests other than watches served at once; more get 429.
    pub max_requests_inflight: usize,
    /// Watches one user may hold open at once; more get 429.
    pub max_watches_per_user: usize,
    /// How long a client may take to send a request's headers (kube-apiserver: 32 s).
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight stays open (kube-apiserver: 90 s).
    pub idle_timeout: Duration,
    /// How long a connection may have output pending that the client does not read
    /// before it is dropped: a client that stops reading a watch otherwise pins the
    /// connection and its buffers forever.
    pub write_stall_timeout: Duration,
    /// Interval of HTTP/2 PING keepalives (a peer that stops answering is dropped).
    pub http2_keepalive_interval: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_requests_inflight: 400,
            max_watches_per_user: 100,
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            write_stall_timeout: Duration::from_secs(60),
            http2_keepalive_interval: Duration::from_secs(30),
        }
    }
}

/// Open watches per user, with a slot released when its watch ends.
#[derive(Default)]
struct WatchCounter {
    open: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One open watch of a user; dropping it frees the slot.
pub struct WatchSlot {
    counter: Arc<WatchCounter>,
    user: String,
}

impl WatchCounter {
    fn try_acquire(self: &Arc<Self>, user: &str, max: usize) -> Option<WatchSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(user.to_string()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(WatchSlot {
            counter: self.clone(),
            user: user.to_string(),
        })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.counter.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// The `verb` label: one of a fixed set, whatever the request said.
fn verb_label(verb: &str, method: &Method) -> &'static str {
    const VERBS: &[&str] = &[
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    if let Some(v) = VERBS.iter().find(|v| **v == verb) {
        return v;
    }
    if !verb.is_empty() {
        return "other";
    }
    // Before the request was understood (unauthenticated, unparsable): by method only.
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// The `resource` label: a served resource's plural, or `""` for none.
fn resource_label(resource: &str) -> &'static str {
    if resource.is_empty() {
        return "";
    }
    RESOURCES
        .iter()
        .find(|r| r.plural == resource)
        .map_or("other", |r| r.plural)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutoffLabels {
    resource: &'static str,
    /// The Status reason the watch ended with (`Expired`, `ServiceUnavailable`, …).
    reason: &'static str,
}

/// Upper bounds of the request latency buckets, in seconds (kube-apiserver's).
const LATENCY_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Metrics of the HTTP layer. Every label comes from a fixed set.
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    /// Until the response head: for a watch, until its stream starts.
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    watches: Gauge,
    watchers: Family<ResourceLabels, Gauge>,
    cutoffs: Family<CutoffLabels, Counter>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            watches: Gauge::default(),
            watchers: Family::default(),
            cutoffs: Family::default(),
        }
    }
}

impl HttpMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self::default();
        // The cut-offs the feed causes exist from the start, at zero.
        for info in RESOURCES.iter() {
            for reason in ["Expired", "ServiceUnavailable"] {
                let _ = metrics.cutoffs.get_or_create(&CutoffLabels {
                    resource: info.plural,
                    reason,
                });
            }
        }
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver");
        sub.register(
            "requests",
            "API requests by verb, resource and code",
            metrics.requests.clone(),
        );
        sub.register_with_unit(
            "request_duration",
            "Time to the response head of API requests by verb, resource and code (for a watch: until its stream starts)",
            prometheus_client::registry::Unit::Seconds,
            metrics.latency.clone(),
        );
        sub.register(
            "open_watches",
            "Watches currently streaming",
            metrics.watches.clone(),
        );
        sub.register(
            "watchers",
            "Watches currently streaming, by resource",
            metrics.watchers.clone(),
        );
        sub.register(
            "watch_cutoffs",
            "Watches the server ended with an error event (feed stalled or rotated, consumer too slow, store unavailable), by resource and reason",
            metrics.cutoffs.clone(),
        );
        Arc::new(metrics)
    }

    /// A watch on `resource` started streaming; the returned guard ends it.
    pub(crate) fn watch_started(self: &Arc<Self>, resource: &str) -> WatchGauge {
        let resource = resource_label(resource);
        self.watches.inc();
        self.watchers
            .get_or_create(&ResourceLabels { resource })
            .inc();
        WatchGauge {
            metrics: self.clone(),
            resource,
        }
    }

    /// The server ended a watch on `resource` with an error event of `reason`.
    pub(crate) fn watch_cut_off(&self, resource: &str, reason: &'static str) {
        self.cutoffs
            .get_or_create(&CutoffLabels {
                resource: resource_label(resource),
                reason,
            })
            .inc();
    }
}

/// Counts one streaming watch until dropped, however the watch ends.
pub(crate) struct WatchGauge {
    metrics: Arc<HttpMetrics>,
    resource: &'static str,
}

impl Drop for WatchGauge {
    fn drop(&mut self) {
        self.metrics.watches.dec();
        self.metrics
            .watchers
            .get_or_create(&ResourceLabels {
                resource: self.resource,
            })
            .dec();
    }
}

/// Records the authenticated user on the request's span: the user is known only once the
/// authenticator has answered, inside routing.
struct RecordUser(Arc<dyn Authenticator>);

#[async_trait::async_trait]
impl Authenticator for RecordUser {
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError> {
        let user = self.0.authenticate(request, connection).await;
        if let Ok(Some(user)) = &user {
            tracing::Span::current().record("user", user.name.as_str());
        }
        user
    }
}

/// The span of one request: what it addresses from its path, the rest recorded as it is
/// learned (user on authentication, verb, resource and code at the end).
fn request_span(request: &Request) -> tracing::Span {
    let path = request.uri().path();
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(request::percent_decode)
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (namespace, name) = match Target::parse(&segs) {
        Target::Resource {
            namespace, name, ..
        } => (namespace, name),
        _ => (None, None),
    };
    tracing::info_span!(
        "request",
        method = %request.method(),
        path,
        verb = tracing::field::Empty,
        resource = tracing::field::Empty,
        namespace = namespace.as_deref().unwrap_or_default(),
        name = name.as_deref().unwrap_or_default(),
        user = tracing::field::Empty,
        code = tracing::field::Empty,
    )
}

/// Discovery and OpenAPI documents, encoded once.
struct Documents {
    group_list: Bytes,
    group: Bytes,
    resource_list: Bytes,
    aggregated: Bytes,
    core_versions: Bytes,
    core_aggregated: Bytes,
    openapi_v2: Bytes,
    openapi_v3_root: Bytes,
    openapi_v3_group: Bytes,
    openapi_v3_hash: String,
    version: Bytes,
}

fn encode(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

impl Documents {
    fn build() -> Self {
        let v3 = encode(&apis::openapi::openapi_v3_group());
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            v3.hash(&mut h);
            format!("{:016X}", h.finish())
        };
        Self {
            group_list: encode(&apis::discovery::api_group_list()),
            group: encode(&apis::discovery::api_group()),
            resource_list: encode(&apis::discovery::api_resource_list()),
            aggregated: encode(&apis::discovery::aggregated_discovery()),
            core_versions: encode(&apis::discovery::empty_core_api_versions()),
            core_aggregated: encode(&apis::discovery::empty_aggregated_discovery()),
            openapi_v2: encode(&apis::openapi::openapi_v2()),
            openapi_v3_root: encode(&apis::openapi::openapi_v3_root(&hash)),
            openapi_v3_group: v3,
            openapi_v3_hash: hash,
            version: encode(&json!({
                "major": "1",
                "minor": "36",
                "gitVersion": concat!("v", env!("CARGO_PKG_VERSION"), "-mcp-access"),
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "",
                "goVersion": "",
                "compiler": "rustc",
                "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
            })),
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
    inflight: Arc<tokio::sync::Semaphore>,
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
            inflight: Arc::new(tokio::sync::Semaphore::new(
                Limits::default().max_requests_inflight,
            )),
            watches: Arc::default(),
            docs: Arc::new(Documents::build()),
        }
    }

    /// Sets the listener's limits and timeouts.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.inflight = Arc::new(tokio::sync::Semaphore::new(limits.max_requests_inflight));
        self.limits = limits;
        self
    }

    /// Refuses creation in namespaces that do not exist or are terminating.
    pub fn with_namespace_lifecycle(mut self, namespaces: Arc<NamespaceLifecycle>) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// Serves one request, in a span of its own.
    pub async fn handle(mut self, request: Request) -> Response {
        let span = request_span(&request);
        self.authenticator = Arc::new(RecordUser(self.authenticator.clone()));
        self.handle_in_span(request).instrument(span).await
    }

    async fn handle_in_span(self, request: Request) -> Response {
        let started = Instant::now();
        let method = request.method().clone();
        // Watches are long-running and capped per user instead (in `serve`).
        let long_running = request::Params::parse(request.uri().query())
            .and_then(|p| p.is_watch())
            .unwrap_or(false);
        let _permit = if long_running {
            None
        } else {
            match self.inflight.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let response = ApiError::too_many_requests(
                        "Too many requests, please try again later.",
                        1,
                    )
                    .into_response();
                    self.count(verb_label("", &method), "", &response, started);
                    return response;
                }
            }
        };
        let (verb, resource, response) = match self.route(request).await {
            Ok((verb, resource, response)) => (verb, resource, response),
            Err((verb, resource, e)) => (verb, resource, e.into_response()),
        };
        self.count(
            verb_label(&verb, &method),
            resource_label(&resource),
            &response,
            started,
        );
        response
    }

    /// Counts a request, times it and completes its span. Every label comes from a fixed
    /// set: a label taken from the request would let any client grow `/metrics` without
    /// bound.
    fn count(
        &self,
        verb: &'static str,
        resource: &'static str,
        response: &Response,
        started: Instant,
    ) {
        let code = response.status().as_u16();
        let span = tracing::Span::current();
        span.record("verb", verb);
        span.record("resource", resource);
        span.record("code", code);
        let labels = RequestLabels {
            verb: verb.to_string(),
            resource: resource.to_string(),
            code,
        };
        self.metrics.requests.get_or_create(&labels).inc();
        self.metrics
            .latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    async fn route(
        &self,
        request: Request,
    ) -> Result<(String, String, Response), (String, String, ApiError)> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let segments: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(request::percent_decode)
            .collect();
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
        let target = Target::parse(&segs);
        let attributes = target
            .attributes(&parts.method, &params, &path)
            .map_err(fail("", ""))?;
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

        let body = read_body(&parts.headers, body).await.map_err(&fail)?;
        let response = match target {
            Target::NonResource(doc) => self.document(doc, &parts.headers).map_err(&fail)?,
            Target::Resource {
                namespace,
                plural,
                name,
                subresource,
            } => {
                let req = ResourceRequest {
                    namespace: namespace.as_deref(),
                    name: name.as_deref(),
                    subresource: subresource.as_deref(),
                    params,
                    headers: &parts.headers,
                    body,
                    user: &user,
                    namespace_terminating: false,
                    cluster_authority: false,
                };
                // Every served kind, by its strategy: adding a kind adds it here.
                let result = serve_kinds!(self, plural, verb, req;
                    AccessSession, Agent, Enrollment, Revocation);
                result.map_err(&fail)?
            }
            Target::Unknown => return Err(fail(ApiError::not_found_path())),
        };
        Ok((verb, resource_label, response))
    }

    async fn serve<K: Strategy>(
        &self,
        verb: &str,
        req: ResourceRequest<'_>,
    ) -> ApiResult<Response> {
        if !K::INFO.verbs.contains(&verb) && req.subresource.is_none() {
            return Err(ApiError::method_not_allowed(
                &verb.to_uppercase(),
                K::INFO.plural,
            ));
        }
        if req.subresource.is_some() {
            return match verb {
                "get" => resource::get::<K, S>(&self.store, req).await,
                "patch" | "update" => resource::update_status::<K, S>(&self.store, verb, req).await,
                other => Err(ApiError::method_not_allowed(
                    &other.to_uppercase(),
                    &format!("{}/status", K::INFO.plural),
                )),
            };
        }
        if K::INFO.namespaced == req.namespace.is_none() && req.name.is_some() {
            return Err(ApiError::not_found_path());
        }
        if !K::INFO.namespaced && req.namespace.is_some() {
            return Err(ApiError::not_found_path());
        }
        if let Some(ns) = req.namespace {
            if !apis::validation::is_dns1123_label(ns) {
                return Err(ApiError::not_found_path());
            }
        }
        let fields = K::FIELDS;
        match verb {
            "get" => resource::get::<K, S>(&self.store, req).await,
            "list" => {
                let options = req.params.list_options(&K::INFO, fields)?;
                resource::list::<K, S>(&self.store, req, options).await
            }
            "watch" => {
                let options = req.params.list_options(&K::INFO, fields)?;
                let rendering = Rendering::from_headers(req.headers, req.params.include_object())?;
                let Some(slot) = self
                    .watches
                    .try_acquire(&req.user.name, self.limits.max_watches_per_user)
                else {
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
                    req.namespace.map(str::to_string),
                    options,
                    rendering,
                    slot,
                )
                .await
            }
            "create" => {
                if K::INFO.namespaced && req.namespace.is_none() {
                    return Err(ApiError::method_not_allowed("POST", K::INFO.plural));
                }
                if let (Some(lifecycle), Some(ns)) = (&self.namespaces, req.namespace) {
                    lifecycle
                        .check_create(ns)
                        .await
                        .map_err(|refusal| match refusal {
                            NamespaceRefusal::NotFound(ns) => ApiError::namespace_not_found(&ns),
                            NamespaceRefusal::Terminating(_) => {
                                ApiError::forbidden(refusal.to_string())
                            }
                            NamespaceRefusal::Unavailable(..) => {
                                tracing::warn!(error = %refusal, "namespace check failed");
                                ApiError::unavailable(
                                    "the namespace cannot be checked; retry later",
                                )
                            }
                        })?;
                }
                let mut req = req;
                if K::ASKS_CLUSTER_AUTHORITY {
                    // As RBAC sees "create this kind in every namespace": only a
                    // cluster-wide grant makes a revocation's fence reach beyond its namespace.
                    let everywhere = Attributes {
                        verb: "create".into(),
                        resource_request: true,
                        api_group: apis::GROUP.to_string(),
                        api_version: apis::VERSION.to_string(),
                        resource: K::INFO.plural.to_string(),
                        ..Default::default()
                    };
                    req.cluster_authority = matches!(
                        self.authorizer.authorize(req.user, &everywhere).await,
                        Decision::Allow
                    );
                }
                resource::create::<K, S>(&self.store, req).await
            }
            "update" => resource::update::<K, S>(&self.store, req).await,
            "patch" => resource::patch::<K, S>(&self.store, req).await,
            "delete" => resource::delete::<K, S>(&self.store, req).await,
            "deletecollection" => {
                // As kube-apiserver, which registers only list and watch on the
                // all-namespaces path of a namespaced resource.
                if K::INFO.namespaced && req.namespace.is_none() {
                    return Err(ApiError::method_not_allowed("DELETE", K::INFO.plural));
                }
                let options = req.params.list_options(&K::INFO, fields)?;
                let mut req = req;
                if let (Some(lifecycle), Some(ns)) = (&self.namespaces, req.namespace) {
                    req.namespace_terminating = matches!(
                        lifecycle.check_create(ns).await,
                        Err(NamespaceRefusal::Terminating(_))
                    );
                }
                resource::delete_collection::<K, S>(&self.store, req, options).await
            }
            other => Err(ApiError::method_not_allowed(
                &other.to_uppercase(),
                K::INFO.plural,
            )),
        }
    }

    fn document(&self, doc: Doc, headers: &http::HeaderMap) -> ApiResult<Response> {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let wants_aggregated = wants_aggregated_discovery(accept);
        if matches!(doc, Doc::OpenApiV2 | Doc::OpenApiV3 | Doc::OpenApiV3Group)
            && !accepts_json(accept)
        {
            return Err(ApiError::not_acceptable(accept));
        }
        let docs = &self.docs;
        let (bytes, content_type) = match doc {
            Doc::Apis if wants_aggregated => (
                docs.aggregated.clone(),
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            Doc::Api if wants_aggregated => (
                docs.core_aggregated.clone(),
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            Doc::Apis => (docs.group_list.clone(), "application/json"),
            Doc::Api => (docs.core_versions.clone(), "application/json"),
            Doc::Group => (docs.group.clone(), "application/json"),
            Doc::ResourceList => (docs.resource_list.clone(), "application/json"),
            Doc::OpenApiV2 => (docs.openapi_v2.clone(), "application/json"),
            Doc::OpenApiV3 => (docs.openapi_v3_root.clone(), "application/json"),
            Doc::OpenApiV3Group => (docs.openapi_v3_group.clone(), "application/json"),
            Doc::Version => (docs.version.clone(), "application/json"),
        };
        let mut response = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, content_type)],
            bytes,
        )
            .into_response();
        if matches!(doc, Doc::OpenApiV3Group) {
            if let Ok(etag) = http::HeaderValue::from_str(&format!("\"{}\"", docs.openapi_v3_hash))
            {
                response.headers_mut().insert(header::ETAG, etag);
            }
        }
        Ok(response)
    }
}

/// Whether `Accept` admits JSON (an absent header does). OpenAPI is served as JSON only; a
/// client asking only for protobuf gets 406 rather than bytes it cannot parse.
fn accepts_json(accept: &str) -> bool {
    accept.trim().is_empty()
        || accept.split(',').any(|m| {
            let mime = m.split(';').next().unwrap_or("").trim();
            matches!(mime, "application/json" | "application/*" | "*/*")
        })
}

/// Whether the first media type of `Accept` this server can answer is aggregated
/// discovery v2 (rather than the legacy documents).
fn wants_aggregated_discovery(accept: &str) -> bool {
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("");
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        match param("as") {
            Some("APIGroupDiscoveryList")
                if param("g") == Some("apidiscovery.k8s.io") && param("v") == Some("v2") =>
            {
                return true
            }
            Some(_) => continue,
            None if mime == "application/json" || mime == "*/*" || mime == "application/*" => {
                return false
            }
            None => continue,
        }
    }
    false
}

/// How much of an oversized body is still read (and discarded) before answering 413. Clients
/// built on hyper (kube-rs among them) write the whole body before reading the response: if
/// the server answers and closes the connection early they see a broken pipe, not the Status.
const MAX_DRAINED_BYTES: usize = 4 * MAX_BODY_BYTES;

/// How long a client may take to send a request body (kube-apiserver's default
/// `--request-timeout`).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

async fn read_body(headers: &http::HeaderMap, body: Body) -> ApiResult<Bytes> {
    use futures::StreamExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_DRAINED_BYTES) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(MAX_BODY_BYTES));
    let mut total = 0usize;
    // A client sending its body slowly holds an in-flight slot: bound it as
    // kube-apiserver's request timeout does.
    let read = async {
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                return Err(ApiError::too_large(MAX_BODY_BYTES));
            };
            total += chunk.len();
            if total > MAX_DRAINED_BYTES {
                break;
            }
            if total <= MAX_BODY_BYTES {
                buf.extend_from_slice(&chunk);
            }
        }
        Ok(())
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .map_err(|_| ApiError::timeout("the request body was not received in time"))??;
    if total > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    // Checked before any parser or recursive walk sees the body: serde_json stops at 128
    // levels, but code walking a parsed Value recursively must never meet a deeper one.
    let depth = patch::json_text_depth(&buf);
    if depth > patch::MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "the request body is nested {depth} levels deep; at most {} are accepted",
            patch::MAX_DEPTH
        )));
    }
    Ok(buf.freeze())
}

/// A non-resource document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Doc {
    Api,
    Apis,
    Group,
    ResourceList,
    OpenApiV2,
    OpenApiV3,
    OpenApiV3Group,
    Version,
}

/// What a path addresses.
#[derive(Debug)]
enum Target {
    NonResource(Doc),
    Resource {
        namespace: Option<String>,
        plural: String,
        name: Option<String>,
        /// `status` for `<name>/status`.
        subresource: Option<String>,
    },
    Unknown,
}

impl Target {
    fn parse(segs: &[&str]) -> Self {
        let (g, v) = (apis::GROUP, apis::VERSION);
        match segs {
            ["api"] => Self::NonResource(Doc::Api),
            ["apis"] => Self::NonResource(Doc::Apis),
            ["apis", group] if *group == g => Self::NonResource(Doc::Group),
            ["apis", group, version] if *group == g && *version == v => {
                Self::NonResource(Doc::ResourceList)
            }
            ["openapi", "v2"] => Self::NonResource(Doc::OpenApiV2),
            ["openapi", "v3"] => Self::NonResource(Doc::OpenApiV3),
            ["openapi", "v3", "apis", group, version] if *group == g && *version == v => {
                Self::NonResource(Doc::OpenApiV3Group)
            }
            ["version"] => Self::NonResource(Doc::Version),
            ["apis", group, version, rest @ ..] if *group == g && *version == v => match rest {
                ["namespaces", ns, plural] => Self::resource(Some(ns), plural, None, None),
                ["namespaces", ns, plural, name] => {
                    Self::resource(Some(ns), plural, Some(name), None)
                }
                ["namespaces", ns, plural, name, sub] => {
                    Self::resource(Some(ns), plural, Some(name), Some(sub))
                }
                [plural] => Self::resource(None, plural, None, None),
                [plural, name] => Self::resource(None, plural, Some(name), None),
                [plural, name, sub] => Self::resource(None, plural, Some(name), Some(sub)),
                _ => Self::Unknown,
            },
            _ => Self::Unknown,
        }
    }

    fn resource(
        namespace: Option<&str>,
        plural: &str,
        name: Option<&str>,
        subresource: Option<&str>,
    ) -> Self {
        let Some(info) = RESOURCES.iter().find(|r| r.plural == plural) else {
            return Self::Unknown;
        };
        if subresource.is_some_and(|sub| !info.subresources.contains(&sub)) {
            return Self::Unknown;
        }
        Self::Resource {
            namespace: namespace.map(str::to_string),
            plural: plural.to_string(),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        }
    }

    /// Authorization attributes, with Kubernetes' verb mapping.
    fn attributes(&self, method: &Method, params: &Params, path: &str) -> ApiResult<Attributes> {
        match self {
            Self::Resource {
                namespace,
                plural,
                name,
                subresource,
            } => {
                let watch = params.is_watch()?;
                let verb = match (method, name.is_some()) {
                    (&Method::GET | &Method::HEAD, true) => "get",
                    (&Method::GET | &Method::HEAD, false) if watch => "watch",
                    (&Method::GET | &Method::HEAD, false) => "list",
                    (&Method::POST, false) => "create",
                    (&Method::PUT, true) => "update",
                    (&Method::PATCH, true) => "patch",
                    (&Method::DELETE, true) => "delete",
                    (&Method::DELETE, false) => "deletecollection",
                    (m, _) => return Err(ApiError::method_not_allowed(m.as_str(), plural)),
                };
                // A list or watch pinned to one name is authorized as that name.
                let pinned = if name.is_none() {
                    params
                        .get("fieldSelector")
                        .and_then(|f| {
                            f.split(',').find_map(|t| {
                                let t = t.trim();
                                t.strip_prefix("metadata.name==")
                                    .or_else(|| t.strip_prefix("metadata.name="))
                            })
                        })
                        .map(str::to_string)
                } else {
                    None
                };
                Ok(Attributes {
                    verb: verb.to_string(),
                    resource_request: true,
                    namespace: namespace.clone().unwrap_or_default(),
                    api_group: apis::GROUP.to_string(),
                    api_version: apis::VERSION.to_string(),
                    resource: plural.clone(),
                    subresource: subresource.clone().unwrap_or_default(),
                    name: name.clone().or(pinned).unwrap_or_default(),
                    path: path.to_string(),
                })
            }
            Self::NonResource(_) | Self::Unknown => Ok(Attributes {
                verb: method.as_str().to_lowercase(),
                resource_request: false,
                path: path.to_string(),
                ..Default::default()
            }),
        }
    }
}
