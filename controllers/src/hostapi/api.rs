//! The endpoints and every answer. Each request: authenticate (the token, the rate limit of
//! the Host UID it names and the action, then the cached Host with that UID), then answer from
//! the watch caches ([`super::cache`]). The only live requests are the credential endpoint's:
//! a GET of the one Secret it hands out, after the grant was checked, and the TokenRequest of
//! the host's session; the grant is checked again after both. Every negative answer of one
//! kind is byte-identical.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::runtime::{Context, Host, MCPServer, SecretKeyRef, Transport};
use apis::types::{AccessSession, SessionPhase};
use base64::Engine;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{json, Value};

use super::cache::Caches;
use super::limit::{retry_after_seconds, RateLimiter};
use super::session::{self, Choice};
use super::settings::Settings;
use super::token::{HostIdentity, Refusal, Verifier};
use crate::host::grants;

pub const INVENTORY_PATH: &str = "/api/v2/hosts/self/mcpservers";
pub const CREDENTIAL_PATH: &str = "/api/v2/hosts/self/mcpservers/credential";
/// Unauthenticated: whether the caches have synced.
pub const HEALTH_PATH: &str = "/healthz";
/// The largest credential request body accepted.
pub const MAX_BODY: usize = 4096;
/// A request not answered by then is 503 (the Kubernetes API is too slow).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The lifetime asked for a session token (the aggregated API may clamp it further).
pub const SESSION_TOKEN_SECONDS: u32 = 600;
/// The legacy v1 prefix: gone, pointing at v2.
const LEGACY_PREFIX: &str = "/api/v1/mcpservers";

/// What a host asks for; each has its own rate-limit window.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    Inventory,
    Credential,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone)]
struct Metrics {
    requests: Family<RequestLabels, Counter>,
    refusals: Family<ReasonLabel, Counter>,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            refusals: Family::default(),
        };
        let sub = registry.sub_registry_with_prefix("mcp_controllers");
        sub.register(
            "host_api_requests",
            "Host API requests by endpoint (inventory, credential, healthz, legacy, other) and status code",
            metrics.requests.clone(),
        );
        sub.register(
            "host_api_token_refusals",
            "Host API requests answered 401, by reason",
            metrics.refusals.clone(),
        );
        for r in Refusal::ALL {
            let _ = metrics.refusals.get_or_create(&ReasonLabel {
                reason: r.as_str().into(),
            });
        }
        metrics
    }
}

/// Why a request is not answered 200. Each kind has exactly one body.
#[derive(Debug)]
pub enum Failure {
    Unauthorized(Refusal),
    RateLimited(Duration),
    NotFound(&'static str),
    BadRequest(&'static str),
    MethodNotAllowed(&'static str),
    /// A legacy v1 route.
    Gone,
    /// The newest session of the host for the server is revoked, by the named Revocation
    /// when the session says.
    SessionRevoked(Option<String>),
    /// No usable session yet: the controllers have not issued one (or only expired ones).
    SessionPending,
    Unavailable(String),
}

fn respond(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

impl Failure {
    pub fn response(&self) -> Response<Full<Bytes>> {
        match self {
            Failure::Unauthorized(_) => {
                let mut r = respond(StatusCode::UNAUTHORIZED, &json!({"error": "unauthorized"}));
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
                r
            }
            Failure::RateLimited(left) => {
                let mut r = respond(
                    StatusCode::TOO_MANY_REQUESTS,
                    &json!({"error": "rate_limited"}),
                );
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_seconds(*left)),
                );
                r
            }
            Failure::NotFound(_) => respond(StatusCode::NOT_FOUND, &json!({"error": "not_found"})),
            Failure::BadRequest(_) => {
                respond(StatusCode::BAD_REQUEST, &json!({"error": "bad_request"}))
            }
            Failure::MethodNotAllowed(allow) => {
                let mut r = respond(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &json!({"error": "method_not_allowed"}),
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
                r
            }
            Failure::Gone => respond(
                StatusCode::GONE,
                &json!({"error": "gone", "use": INVENTORY_PATH}),
            ),
            Failure::SessionRevoked(revocation) => respond(
                StatusCode::CONFLICT,
                &json!({"error": "session_revoked", "revocation": revocation}),
            ),
            Failure::SessionPending => {
                let mut r = respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"error": "session_pending"}),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            Failure::Unavailable(_) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error": "unavailable"}),
            ),
        }
    }
}

fn unavailable(what: &str, e: kube::Error) -> Failure {
    Failure::Unavailable(format!("{what}: {}", crate::metrics::kube_reason(&e)))
}

/// The body of a credential request.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRequest {
    pub server_name: String,
    #[serde(default)]
    pub server_namespace: Option<String>,
}

/// The gateway URL hosts reach a server at: the gateway's resource URI (its Service on the
/// gateway port, the `--public-url` the gateway runs with and the audience of session tokens)
/// with the transport's path. That port is the one the host egress and L2 policies open.
pub fn server_url(server: &MCPServer, gateway_port: u16) -> String {
    let path = match server.spec.transport {
        // A stdio server is served as Streamable HTTP by its bridge.
        Transport::StreamableHttp | Transport::Stdio => "mcp",
        Transport::Sse => "sse",
    };
    let base = crate::mcpserver::desired::public_url(
        &server.name_any(),
        &server.namespace().unwrap_or_default(),
        i32::from(gateway_port),
    );
    format!("{base}/{path}")
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::StreamableHttp | Transport::Stdio => "streamable-http",
        Transport::Sse => "sse",
    }
}

/// An opaque revision of a server's credential: changes when the server, the Secret or its
/// content (resourceVersion) or the key changes; says nothing about any of them.
pub fn credential_revision(
    server_uid: &str,
    secret_uid: &str,
    resource_version: &str,
    key: &str,
) -> String {
    let mut input = Vec::new();
    for part in [server_uid, secret_uid, resource_version, key] {
        input.extend_from_slice(part.as_bytes());
        input.push(0);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest.as_ref()[..16])
}

/// The revision of `server`'s credential from the metadata of `secret` (the Secret its
/// `hostCredential` names).
fn revision_of(
    server: &MCPServer,
    key: &str,
    secret: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    credential_revision(
        server.metadata.uid.as_deref().unwrap_or_default(),
        secret.uid.as_deref().unwrap_or_default(),
        secret.resource_version.as_deref().unwrap_or_default(),
        key,
    )
}

/// The Bearer token of `Authorization`, if any.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Where a request goes, by its path alone.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Inventory,
    Credential,
    Health,
    /// `GET /api/v1/mcpservers`, `/api/v1/mcpservers/context/<ref>`,
    /// `/api/v1/mcpservers/<name>/auth`: tombstones.
    Legacy,
    Unknown,
}

impl Route {
    fn of(path: &str) -> Self {
        match path {
            INVENTORY_PATH => Route::Inventory,
            CREDENTIAL_PATH => Route::Credential,
            HEALTH_PATH => Route::Health,
            LEGACY_PREFIX => Route::Legacy,
            _ => {
                let segment = |s: &str| !s.is_empty() && !s.contains('/');
                let legacy = path
                    .strip_prefix(LEGACY_PREFIX)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .is_some_and(|rest| {
                        rest.strip_prefix("context/").is_some_and(segment)
                            || rest.strip_suffix("/auth").is_some_and(segment)
                    });
                if legacy {
                    Route::Legacy
                } else {
                    Route::Unknown
                }
            }
        }
    }

    /// The `endpoint` label of the request metrics.
    fn label(self) -> &'static str {
        match self {
            Route::Inventory => "inventory",
            Route::Credential => "credential",
            Route::Health => "healthz",
            Route::Legacy => "legacy",
            Route::Unknown => "other",
        }
    }
}

/// A credential value read under a checked grant.
struct Credential {
    value: String,
    revision: String,
}

/// A session token minted for the host.
struct SessionToken {
    token: String,
    expires_at: String,
}

pub struct HostApi {
    client: kube::Client,
    caches: Caches,
    verifier: Verifier,
    limiter: RateLimiter<(String, Action)>,
    gateway_port: u16,
    metrics: Metrics,
}

impl HostApi {
    pub fn new(
        client: kube::Client,
        caches: Caches,
        settings: &Settings,
        gateway_port: u16,
        registry: &mut Registry,
    ) -> Self {
        Self {
            client,
            caches,
            verifier: Verifier::new(
                &settings.public_key_der,
                &settings.issuer,
                &settings.audience,
                settings.max_ttl,
            ),
            limiter: RateLimiter::new(settings.rate_limit, settings.rate_window),
            gateway_port,
            metrics: Metrics::register(registry),
        }
    }

    /// Answers one request.
    pub async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let route = Route::of(request.uri().path());
        let endpoint = route.label();
        let method = request.method().clone();
        let result = match (route, &method) {
            (Route::Health, &Method::GET) => {
                let response = self.health();
                self.count(endpoint, &response);
                return response;
            }
            (Route::Inventory, &Method::GET) => self.timed(self.inventory(request.headers())).await,
            (Route::Credential, &Method::POST) => self.timed(self.credential(request)).await,
            (Route::Health | Route::Inventory, _) => Err(Failure::MethodNotAllowed("GET")),
            (Route::Credential, _) => Err(Failure::MethodNotAllowed("POST")),
            (Route::Legacy, _) => Err(Failure::Gone),
            (Route::Unknown, _) => Err(Failure::NotFound("unknown path")),
        };
        let response = match result {
            Ok(body) => respond(StatusCode::OK, &body),
            Err(failure) => {
                match &failure {
                    Failure::Unauthorized(reason) => {
                        tracing::info!(endpoint, reason = reason.as_str(), "host token refused");
                        self.metrics
                            .refusals
                            .get_or_create(&ReasonLabel {
                                reason: reason.as_str().into(),
                            })
                            .inc();
                    }
                    Failure::Unavailable(why) => {
                        tracing::warn!(endpoint, error = %why, "host API request failed")
                    }
                    Failure::NotFound(why) | Failure::BadRequest(why) => {
                        tracing::debug!(endpoint, why, "host API request refused")
                    }
                    Failure::SessionRevoked(revocation) => {
                        tracing::info!(endpoint, ?revocation, "host session revoked")
                    }
                    Failure::RateLimited(_)
                    | Failure::MethodNotAllowed(_)
                    | Failure::Gone
                    | Failure::SessionPending => {}
                }
                failure.response()
            }
        };
        self.count(endpoint, &response);
        response
    }

    fn count(&self, endpoint: &str, response: &Response<Full<Bytes>>) {
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                code: response.status().as_u16().to_string(),
            })
            .inc();
    }

    /// 200 once every cache has synced, 503 before.
    fn health(&self) -> Response<Full<Bytes>> {
        if self.caches.synced() {
            respond(StatusCode::OK, &json!({"status": "ok"}))
        } else {
            respond(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "unavailable"}),
            )
        }
    }

    async fn timed(
        &self,
        work: impl std::future::Future<Output = Result<Value, Failure>>,
    ) -> Result<Value, Failure> {
        tokio::time::timeout(REQUEST_TIMEOUT, work)
            .await
            .unwrap_or_else(|_| Err(Failure::Unavailable("request timed out".into())))
    }

    /// A valid token, then the rate limit of the UID it names for `action`, then that Host,
    /// cached, with that UID. Nothing is answered before the caches have synced.
    fn authenticate(
        &self,
        headers: &http::HeaderMap,
        action: Action,
    ) -> Result<(HostIdentity, Arc<Host>), Failure> {
        let token = bearer(headers).ok_or(Failure::Unauthorized(Refusal::Missing))?;
        let id = self
            .verifier
            .verify(token, Timestamp::now().as_second())
            .map_err(Failure::Unauthorized)?;
        self.limiter
            .check(&(id.uid.clone(), action), Instant::now())
            .map_err(Failure::RateLimited)?;
        if !self.caches.synced() {
            return Err(Failure::Unavailable("caches not synced yet".into()));
        }
        let host = self.host(&id).ok_or(Failure::Unauthorized(Refusal::Host))?;
        Ok((id, host))
    }

    /// The Host `id` names, if it exists with `id`'s UID.
    fn host(&self, id: &HostIdentity) -> Option<Arc<Host>> {
        self.caches
            .host(&id.host.namespace, &id.host.name)
            .filter(|h| h.metadata.uid.as_deref() == Some(id.uid.as_str()))
    }

    /// The Context the Host names, in its own namespace.
    fn context(&self, host: &Host) -> Option<Arc<Context>> {
        self.caches.context(
            &host.namespace().unwrap_or_default(),
            &host.spec.context_ref.name,
        )
    }

    /// Every server `context` grants, cached (missing ones left out).
    fn granted_servers(&self, context: &Context) -> Vec<Arc<MCPServer>> {
        grants::granted_refs(context)
            .into_iter()
            .filter_map(|(ns, name)| self.caches.server(&ns, &name))
            .collect()
    }

    /// The one server `wanted` names that the Host's Context grants, with that Context.
    fn granted_server(
        &self,
        host: &Host,
        wanted: &CredentialRequest,
    ) -> Result<(Arc<Context>, Arc<MCPServer>), Failure> {
        let not_found = Failure::NotFound;
        let context = self.context(host).ok_or(not_found("no context"))?;
        let candidates: Vec<(String, String)> = grants::granted_refs(&context)
            .into_iter()
            .filter(|(ns, name)| {
                *name == wanted.server_name
                    && wanted.server_namespace.as_ref().is_none_or(|w| w == ns)
            })
            .collect();
        let [(ns, name)] = <[(String, String); 1]>::try_from(candidates)
            .map_err(|_| not_found("not granted, or ambiguous"))?;
        let server = self
            .caches
            .server(&ns, &name)
            .ok_or(not_found("no server"))?;
        let labels = |ns: &str| self.caches.namespace_labels(ns);
        if grants::granted(host, &context, [server.as_ref()], labels).is_empty() {
            return Err(not_found("not granted or disabled"));
        }
        Ok((context, server))
    }

    /// The cached sessions of `host` for `server`: those carrying its UID label **and** naming
    /// its ServiceAccount as subject, as the Host operator issues them. A label alone is not
    /// trusted: whoever may issue sessions could label one of theirs with a Host's UID, and the
    /// host would then be handed a session it was never granted.
    fn sessions(&self, host: &Host, server: &MCPServer) -> Vec<Arc<AccessSession>> {
        let uid = host.metadata.uid.as_deref().unwrap_or_default();
        let subject =
            crate::host::sessions::subject(&host.namespace().unwrap_or_default(), &host.name_any());
        self.caches
            .host_sessions(&server.namespace().unwrap_or_default(), uid)
            .into_iter()
            .filter(|s| s.spec.subject.as_ref().is_some_and(|x| x.user == subject))
            .collect()
    }

    /// The credential revision of `server` from the cached Secret metadata: `None` without a
    /// hostCredential or when its Secret is not in the cache.
    fn cached_revision(&self, server: &MCPServer) -> Option<String> {
        let SecretKeyRef { name, key } = server.spec.host_credential.as_ref()?;
        let secret = self
            .caches
            .secret(&server.namespace().unwrap_or_default(), name)?;
        Some(revision_of(server, key, &secret.metadata))
    }

    /// The value of `server`'s hostCredential: a live GET of exactly that Secret. Call only
    /// for a server whose grant was just checked. A missing Secret or key, or a value that is
    /// not UTF-8, is 503 for this server alone.
    async fn read_credential(
        &self,
        server: &MCPServer,
        credential: &SecretKeyRef,
    ) -> Result<Credential, Failure> {
        let ns = server.namespace().unwrap_or_default();
        // A server's reference is whatever its author wrote: one that is not a Kubernetes
        // name names nothing, and never becomes part of a request path.
        if !kube_name(&ns, &credential.name) {
            return Err(Failure::Unavailable(
                "hostCredential names no Secret".into(),
            ));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let secret = api
            .get_opt(&credential.name)
            .await
            .map_err(|e| unavailable("get secret", e))?
            .ok_or_else(|| {
                Failure::Unavailable(format!("secret {ns}/{} missing", credential.name))
            })?;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&credential.key))
            .ok_or_else(|| {
                Failure::Unavailable(format!("secret {ns}/{} lacks its key", credential.name))
            })
            .and_then(|v| {
                String::from_utf8(v.0.clone()).map_err(|_| {
                    Failure::Unavailable(format!("secret {ns}/{}: key not UTF-8", credential.name))
                })
            })?;
        Ok(Credential {
            value,
            revision: revision_of(server, &credential.key, &secret.metadata),
        })
    }

    /// A token of `session` through its `token` subresource. A session the aggregated API
    /// refuses (no longer Active, or gone, since the cache saw it) is answered as it stands
    /// now: see [`HostApi::refused`].
    async fn mint(&self, session: &AccessSession) -> Result<SessionToken, Failure> {
        let ns = session.namespace().unwrap_or_default();
        let name = session.name_any();
        let api: Api<AccessSession> = Api::namespaced(self.client.clone(), &ns);
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": SESSION_TOKEN_SECONDS},
        });
        let answer: Value = match api
            .create_subresource("token", &name, &PostParams::default(), &request)
            .await
        {
            Ok(answer) => answer,
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                tracing::info!(ns, name, code = status.code, reason = %status.reason, "host session refused a token");
                return Err(Self::refused(&api, &name).await);
            }
            Err(e) => return Err(unavailable("session token", e)),
        };
        let field = |f: &str| {
            answer["status"][f]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match (field("token"), field("expirationTimestamp")) {
            (Some(token), Some(expires_at)) => Ok(SessionToken { token, expires_at }),
            _ => Err(Failure::Unavailable(
                "session token: an answer without a token".into(),
            )),
        }
    }

    /// Why the aggregated API refused a token of a session the cache still showed usable,
    /// from the session as it stands now (one GET, on this path only): revoked since, 409
    /// naming the Revocation, which is what the cache will say too once it has the change (a
    /// host told "pending" would retry a revoked session); gone, expired or unreadable,
    /// pending (503, retry): the operator replaces what it may.
    async fn refused(api: &Api<AccessSession>, name: &str) -> Failure {
        match api.get_opt(name).await {
            Ok(Some(now))
                if session::effective_phase(&now, Timestamp::now()) == SessionPhase::Revoked =>
            {
                Failure::SessionRevoked(session::revocation_name(&now).map(str::to_string))
            }
            Ok(_) => Failure::SessionPending,
            Err(e) => {
                tracing::warn!(name, error = %e, "cannot read a session that refused a token");
                Failure::SessionPending
            }
        }
    }

    async fn inventory(&self, headers: &http::HeaderMap) -> Result<Value, Failure> {
        let (_, host) = self.authenticate(headers, Action::Inventory)?;
        let now = Timestamp::now();
        let mut items = Vec::new();
        if let Some(context) = self.context(&host) {
            let servers = self.granted_servers(&context);
            let granted = grants::granted(
                &host,
                &context,
                servers.iter().map(Arc::as_ref),
                |ns: &str| self.caches.namespace_labels(ns),
            );
            for server in granted {
                let sessions = self.sessions(&host, server);
                let shown = match session::choose(
                    sessions.iter().map(Arc::as_ref),
                    server.metadata.uid.as_deref().unwrap_or_default(),
                    now,
                ) {
                    Choice::Usable(s) | Choice::Revoked(s) | Choice::Pending(Some(s)) => json!({
                        "namespace": s.namespace().unwrap_or_default(),
                        "name": s.name_any(),
                        "phase": session::effective_phase(s, now).as_str(),
                    }),
                    Choice::Pending(None) => Value::Null,
                };
                items.push(json!({
                    "name": server.name_any(),
                    "namespace": server.namespace().unwrap_or_default(),
                    "transport": transport_name(server.spec.transport),
                    "url": server_url(server, self.gateway_port),
                    "ready": grants::ready(server),
                    "credentialRevision": self.cached_revision(server),
                    "session": shown,
                }));
            }
        }
        Ok(json!({
            "host": {
                "namespace": host.namespace().unwrap_or_default(),
                "name": host.name_any(),
            },
            "items": items,
        }))
    }

    async fn credential<B>(&self, request: Request<B>) -> Result<Value, Failure>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let (parts, body) = request.into_parts();
        let (id, host) = self.authenticate(&parts.headers, Action::Credential)?;
        let wanted = parse_credential_request(&parts.headers, body).await?;

        // The grant, from the cached Host's Context, before anything is read.
        let (context, server) = self.granted_server(&host, &wanted)?;
        let server_uid = server.metadata.uid.clone().unwrap_or_default();
        let session = match session::choose(
            self.sessions(&host, &server).iter().map(Arc::as_ref),
            &server_uid,
            Timestamp::now(),
        ) {
            Choice::Usable(s) => s.clone(),
            Choice::Revoked(s) => {
                return Err(Failure::SessionRevoked(
                    session::revocation_name(s).map(str::to_string),
                ))
            }
            Choice::Pending(_) => return Err(Failure::SessionPending),
        };

        let credential = match &server.spec.host_credential {
            Some(r) => Some(self.read_credential(&server, r).await?),
            None => None,
        };
        let token = self.mint(&session).await?;

        // The grant again, from the caches as they are now: the same Host, Context and server
        // (UIDs), still granted and enabled, still naming the same Secret key.
        let host_again = self.host(&id).ok_or(Failure::NotFound("host gone"))?;
        let (context_again, server_again) = self.granted_server(&host_again, &wanted)?;
        let same = host_again.metadata.uid == host.metadata.uid
            && context_again.metadata.uid == context.metadata.uid
            && server_again.metadata.uid == server.metadata.uid
            && server_again.spec.host_credential == server.spec.host_credential;
        if !same {
            return Err(Failure::NotFound("grant changed during the request"));
        }
        let (value, revision) = credential.map(|c| (c.value, c.revision)).unzip();
        Ok(json!({
            "serverName": server.name_any(),
            "serverNamespace": server.namespace().unwrap_or_default(),
            "token": value,
            "credentialRevision": revision,
            "url": server_url(&server, self.gateway_port),
            "session": {
                "namespace": session.namespace().unwrap_or_default(),
                "name": session.name_any(),
                "token": token.token,
                "expiresAt": token.expires_at,
            },
        }))
    }
}

/// Whether `namespace`/`name` are Kubernetes names (a DNS label and a DNS subdomain).
fn kube_name(namespace: &str, name: &str) -> bool {
    apis::validation::is_dns1123_label(namespace) && apis::validation::is_dns1123_subdomain(name)
}
/// A credential request body: `application/json`, at most [`MAX_BODY`] bytes, exactly the
/// fields of [`CredentialRequest`].
async fn parse_credential_request<B>(
    headers: &http::HeaderMap,
    body: B,
) -> Result<CredentialRequest, Failure>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json_type {
        return Err(Failure::BadRequest("content type"));
    }
    let declared_too_large = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY as u64);
    if declared_too_large {
        return Err(Failure::BadRequest("body too large"));
    }
    let bytes = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| Failure::BadRequest("body too large or unreadable"))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|_| Failure::BadRequest("malformed JSON"))
}
#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response<Full<Bytes>>) -> (StatusCode, http::HeaderMap, String) {
        let (parts, body) = r.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            parts.status,
            parts.headers,
            String::from_utf8(bytes.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn failure_bodies_and_headers() {
        let (status, headers, text) =
            body(Failure::Unauthorized(Refusal::Audience).response()).await;
        assert_eq!(status, 401);
        assert_eq!(text, r#"{"error":"unauthorized"}"#);
        assert_eq!(
            headers["www-authenticate"],
            "Bearer error=\"invalid_token\""
        );
        assert_eq!(headers["cache-control"], "no-store");
        assert_eq!(headers["content-type"], "application/json");
        // Every refusal reason is the same answer.
        let other = body(Failure::Unauthorized(Refusal::Host).response()).await;
        assert_eq!((other.0, other.2), (status, text));

        let (status, _, a) = body(Failure::NotFound("no server").response()).await;
        let (_, _, b) = body(Failure::NotFound("not granted").response()).await;
        assert_eq!(
            (status.as_u16(), a.as_str()),
            (404, r#"{"error":"not_found"}"#)
        );
        assert_eq!(a, b);

        let (status, headers, text) =
            body(Failure::RateLimited(Duration::from_millis(2500)).response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (429, r#"{"error":"rate_limited"}"#)
        );
        assert_eq!(headers["retry-after"], "3");

        let (status, headers, _) = body(Failure::MethodNotAllowed("GET").response()).await;
        assert_eq!(
            (status.as_u16(), &headers["allow"]),
            (405, &"GET".parse::<HeaderValue>().unwrap())
        );
        let (status, _, text) = body(Failure::BadRequest("x").response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (400, r#"{"error":"bad_request"}"#)
        );
        let (status, _, text) = body(Failure::Unavailable("x".into()).response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (503, r#"{"error":"unavailable"}"#)
        );
        let (status, _, text) = body(Failure::Gone.response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (
                410,
                r#"{"error":"gone","use":"/api/v2/hosts/self/mcpservers"}"#
            )
        );
        let (status, _, text) = body(Failure::SessionRevoked(Some("r1".into())).response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (409, r#"{"error":"session_revoked","revocation":"r1"}"#)
        );
        let (_, _, text) = body(Failure::SessionRevoked(None).response()).await;
        assert_eq!(text, r#"{"error":"session_revoked","revocation":null}"#);
        let (status, headers, text) = body(Failure::SessionPending.response()).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (503, r#"{"error":"session_pending"}"#)
        );
        assert_eq!(headers["retry-after"], "1");
    }

    #[tokio::test]
    async fn credential_request_bodies() {
        let headers = |ct: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            h
        };
        let parse = |h: http::HeaderMap, b: &str| {
            let b = Full::new(Bytes::from(b.to_string()));
            async move { parse_credential_request(&h, b).await }
        };
        let ok = parse(
            headers("application/json; charset=utf-8"),
            r#"{"serverName":"github"}"#,
        )
        .await
        .unwrap();
        assert_eq!(
            (ok.server_name.as_str(), ok.server_namespace),
            ("github", None)
        );
        let ok = parse(
            headers("application/json"),
            r#"{"serverName":"github","serverNamespace":"shared"}"#,
        )
        .await
        .unwrap();
        assert_eq!(ok.server_namespace.as_deref(), Some("shared"));
        for (ct, b) in [
            ("text/plain", r#"{"serverName":"github"}"#),
            ("application/json", "{"),
            ("application/json", r#"{"server":"github"}"#),
            ("application/json", r#"{"serverName":"github","extra":1}"#),
            ("application/json", r#"{"serverName":7}"#),
        ] {
            assert!(
                matches!(parse(headers(ct), b).await, Err(Failure::BadRequest(_))),
                "{ct} {b}"
            );
        }
        let big = format!(r#"{{"serverName":"{}"}}"#, "a".repeat(MAX_BODY));
        assert!(matches!(
            parse(headers("application/json"), &big).await,
            Err(Failure::BadRequest(_))
        ));
    }

    #[test]
    fn routes() {
        for (path, route) in [
            (INVENTORY_PATH, Route::Inventory),
            (CREDENTIAL_PATH, Route::Credential),
            (HEALTH_PATH, Route::Health),
            ("/api/v1/mcpservers", Route::Legacy),
            ("/api/v1/mcpservers/context/c1", Route::Legacy),
            ("/api/v1/mcpservers/github/auth", Route::Legacy),
            ("/api/v1/mcpservers/context/", Route::Unknown),
            ("/api/v1/mcpservers//auth", Route::Unknown),
            ("/api/v1/mcpservers/a/b/auth", Route::Unknown),
            ("/api/v1/mcpservers/github", Route::Unknown),
            ("/api/v1/mcpservers/", Route::Unknown),
            ("/healthz/", Route::Unknown),
            ("/", Route::Unknown),
        ] {
            assert_eq!(Route::of(path), route, "{path}");
        }
    }

    #[test]
    fn urls_revisions_and_bearer() {
        let mut s = MCPServer::new(
            "github",
            apis::runtime::MCPServerSpec {
                allowed_contexts: None,
                image: Some("img".into()),
                port: Some(8080),
                transport: Transport::StreamableHttp,
                env_secret: None,
                egress_bindings: vec![],
                network: None,
                host_credential: None,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some("team-a".into());
        // The gateway port, never spec.port (8080): the URL a token's audience names.
        assert_eq!(server_url(&s, 8086), "http://github.team-a.svc:8086/mcp");
        assert!(
            server_url(&s, 8086).starts_with(&crate::mcpserver::desired::public_url(
                "github", "team-a", 8086
            ))
        );
        s.spec.transport = Transport::Sse;
        assert_eq!(server_url(&s, 9000), "http://github.team-a.svc:9000/sse");

        let r = credential_revision("s", "sec", "12", "token");
        assert_eq!(r.len(), 22);
        assert_eq!(r, credential_revision("s", "sec", "12", "token"));
        assert_ne!(r, credential_revision("s", "sec", "13", "token"));
        assert_ne!(r, credential_revision("s", "sec2", "12", "token"));
        assert_ne!(r, credential_revision("s2", "sec", "12", "token"));
        assert_ne!(r, credential_revision("s", "sec", "12", "other"));
        // Separators: shifting bytes between parts changes the revision.
        assert_ne!(
            credential_revision("ab", "c", "1", "k"),
            credential_revision("a", "bc", "1", "k")
        );

        let mut h = http::HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}

/// The handler against caches filled by hand and a fake Kubernetes API for the live requests
/// (a tower service answering Secret GETs and TokenRequests, recording every request): what is
/// read live and when, every answer, fail-closed errors, and the rate limit as a host sees it.
#[cfg(test)]
mod kube_tests {
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Mutex;

    use super::*;
    use crate::host::sessions::{HOST_NAMESPACE_LABEL, HOST_UID_LABEL};
    use crate::hostapi::cache::testing::{mark_synced, relist};
    use crate::hostapi::cache::Writers;
    use crate::hostapi::settings::{load_public_key, tests::keys};
    use crate::hostapi::token::CAPABILITY;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use kube::core::PartialObjectMetaExt;

    const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces";

    type Change = Box<dyn FnOnce(&mut World) + Send>;

    struct World {
        /// What the caches hold: Hosts, Contexts, MCPServers, AccessSessions and Secrets (the
        /// caches see the Secrets' metadata; a live GET sees the whole object).
        objects: Vec<Value>,
        /// Live answers by path, instead of the default (the Secret in `objects`, a minted
        /// token).
        answers: HashMap<String, (u16, Value)>,
        /// Every live request, `METHOD path`, in order.
        log: Vec<String>,
        /// Every TokenRequest body received.
        token_requests: Vec<Value>,
        /// Applied right after a Secret is read.
        after_secret: Option<Change>,
        writers: Writers,
    }

    fn key(o: &Value) -> (Value, Value, Value) {
        (
            o["kind"].clone(),
            o["metadata"]["namespace"].clone(),
            o["metadata"]["name"].clone(),
        )
    }

    impl World {
        fn of_kind<K: serde::de::DeserializeOwned>(&self, kind: &str) -> Vec<K> {
            self.objects
                .iter()
                .filter(|o| o["kind"] == kind)
                .map(|o| serde_json::from_value(o.clone()).unwrap())
                .collect()
        }

        /// Every cache relisted from `objects`.
        fn resync(&mut self) {
            let hosts = self.of_kind("Host");
            let contexts = self.of_kind("Context");
            let servers = self.of_kind("MCPServer");
            let sessions = self.of_kind("AccessSession");
            let secrets = self
                .of_kind::<Secret>("Secret")
                .into_iter()
                .map(|s| s.metadata.into_response_partial::<Secret>())
                .collect();
            relist(&mut self.writers.hosts, hosts);
            relist(&mut self.writers.contexts, contexts);
            relist(&mut self.writers.servers, servers);
            relist(&mut self.writers.sessions, sessions);
            relist(&mut self.writers.secrets, secrets);
            let namespaces = self
                .of_kind::<k8s_openapi::api::core::v1::Namespace>("Namespace")
                .into_iter()
                .map(|n| n.metadata.into_response_partial())
                .collect();
            relist(&mut self.writers.namespaces, namespaces);
        }

        /// Creates or replaces `object` (same kind, namespace and name).
        fn put(&mut self, object: Value) {
            self.objects.retain(|o| key(o) != key(&object));
            self.objects.push(object);
            self.resync();
        }

        fn remove(&mut self, kind: &str, ns: &str, name: &str) {
            self.objects
                .retain(|o| key(o) != (json!(kind), json!(ns), json!(name)));
            self.resync();
        }
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "not found"})
    }

    fn kube_status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "code": code, "message": "no"})
    }

    fn client(world: Arc<Mutex<World>>) -> kube::Client {
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let world = world.clone();
            async move {
                let method = request.method().clone();
                let path = request.uri().path().to_string();
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let mut w = world.lock().unwrap();
                w.log.push(format!("{method} {path}"));
                let answer = w.answers.get(&path).cloned();
                let (status, body) = if let Some(token_of) = path.strip_suffix("/token") {
                    w.token_requests
                        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    let name = token_of.rsplit('/').next().unwrap_or_default();
                    answer.unwrap_or_else(|| {
                        (
                            201,
                            json!({"apiVersion": "authentication.k8s.io/v1",
                                   "kind": "TokenRequest",
                                   "spec": {"expirationSeconds": 600},
                                   "status": {"token": format!("jwt-of-{name}"),
                                              "expirationTimestamp": "2030-01-01T00:10:00Z"}}),
                        )
                    })
                } else {
                    answer.unwrap_or_else(|| {
                        let found = w.objects.iter().find(|o| {
                            o["kind"] == "Secret"
                                && path
                                    == secret_path(
                                        o["metadata"]["namespace"].as_str().unwrap(),
                                        o["metadata"]["name"].as_str().unwrap(),
                                    )
                        });
                        found.map_or((404, not_found()), |o| (200, o.clone()))
                    })
                };
                if path.contains("/secrets/") {
                    if let Some(change) = w.after_secret.take() {
                        change(&mut w);
                    }
                }
                let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn secret_path(ns: &str, name: &str) -> String {
        format!("/api/v1/namespaces/{ns}/secrets/{name}")
    }
    fn token_path(ns: &str, name: &str) -> String {
        format!("{SESSIONS}/{ns}/accesssessions/{name}/token")
    }

    fn host_object(name: &str, uid: &str, context: &str) -> Value {
        json!({"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
               "metadata": {"name": name, "namespace": "team", "uid": uid},
               "spec": {"contextRef": {"name": context}, "image": "img"}})
    }
    fn context_object(ns: &str, name: &str, servers: Value) -> Value {
        json!({"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Context",
               "metadata": {"name": name, "namespace": ns, "uid": format!("ctx-{ns}-{name}")},
               "spec": {"mcpServers": servers, "hostSelector": {}}})
    }
    fn server_object(ns: &str, name: &str, secret: Option<&str>) -> Value {
        let mut spec = json!({"image": "img", "port": 8080,
                              "allowedContexts": {"namespaces": {"from": "All"}}});
        if let Some(secret) = secret {
            spec["hostCredential"] = json!({"name": secret, "key": "token"});
        }
        json!({"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
               "metadata": {"name": name, "namespace": ns, "uid": format!("srv-{ns}-{name}"),
                            "generation": 1},
               "spec": spec,
               "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "R",
                          "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                          "observedGeneration": 1}]}})
    }
    fn secret_object(ns: &str, name: &str, value: &[u8]) -> Value {
        let data = base64::engine::general_purpose::STANDARD.encode(value);
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": ns, "uid": format!("sec-{ns}-{name}"),
                            "resourceVersion": "7"},
               "data": {"token": data}})
    }
    /// A host session of `host_uid` for server `ns/server`, created `age` seconds ago,
    /// expiring in `ttl` seconds (negative: expired), in `phase`.
    fn session_object(
        ns: &str,
        name: &str,
        host_uid: &str,
        server: &str,
        age: i64,
        ttl: i64,
        phase: &str,
    ) -> Value {
        let now = Timestamp::now().as_second();
        let at = |s: i64| Timestamp::from_second(s).unwrap().to_string();
        let mut s = json!({"apiVersion": "access.mcp-runtime.dev/v1alpha1", "kind": "AccessSession",
               "metadata": {"name": name, "namespace": ns, "uid": format!("ses-{name}"),
                            "creationTimestamp": at(now - age),
                            "labels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers",
                                       HOST_UID_LABEL: host_uid,
                                       HOST_NAMESPACE_LABEL: "team"}},
               "spec": {"server": {"name": server, "uid": format!("srv-{ns}-{server}")},
                        "subject": {"user": "system:serviceaccount:team:agent-host"},
                        "teams": ["hosts"], "expiresAt": at(now + ttl)},
               "status": {"phase": phase}});
        if phase == "Revoked" {
            s["status"]["revocation"] = json!({"revokedAt": at(now), "cause": "manual",
                                               "revocationName": format!("stop-{name}")});
        }
        s
    }

    /// Host team/agent (Context team/dev granting team/github, shared/jira and team/plain),
    /// a foreign server other/github, Secrets for the servers with a hostCredential, and an
    /// Active session of the host for each granted server.
    fn objects() -> Vec<Value> {
        vec![
            host_object("agent", "uid-agent", "dev"),
            context_object(
                "team",
                "dev",
                json!([{"name": "github"}, {"name": "jira", "namespace": "shared"},
                       {"name": "plain"}]),
            ),
            server_object("team", "github", Some("gh")),
            server_object("shared", "jira", Some("jira")),
            server_object("team", "plain", None),
            server_object("other", "github", Some("gh")),
            secret_object("team", "gh", b"gh-secret"),
            secret_object("shared", "jira", b"jira-secret"),
            secret_object("other", "gh", b"foreign-secret"),
            session_object(
                "team",
                "agent-github",
                "uid-agent",
                "github",
                60,
                3600,
                "Active",
            ),
            session_object(
                "shared",
                "agent-jira",
                "uid-agent",
                "jira",
                60,
                3600,
                "Active",
            ),
            session_object(
                "team",
                "agent-plain",
                "uid-agent",
                "plain",
                60,
                3600,
                "Active",
            ),
            // Another host's session for the same server is never this host's.
            session_object(
                "team",
                "else-github",
                "uid-else",
                "github",
                1,
                3600,
                "Revoked",
            ),
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "team", "labels": {"grants": "jira"}}}),
        ]
    }

    fn settings(rate_limit: u32) -> Settings {
        Settings {
            port: 1,
            tls_cert_file: "/unused".into(),
            tls_key_file: "/unused".into(),
            public_key_der: load_public_key(&keys().spki_pem).unwrap(),
            issuer: "https://issuer.mcp.internal".into(),
            audience: BTreeSet::from(["mcp-host-api".to_string()]),
            max_ttl: Duration::from_secs(600),
            rate_limit,
            rate_window: Duration::from_secs(60),
        }
    }

    /// The API over [`objects`], its caches synced unless `synced` is false.
    fn api_with(rate_limit: u32, synced: bool) -> (Arc<HostApi>, Arc<Mutex<World>>) {
        let (caches, writers) = Caches::new();
        let world = Arc::new(Mutex::new(World {
            objects: objects(),
            answers: HashMap::new(),
            log: Vec::new(),
            token_requests: Vec::new(),
            after_secret: None,
            writers,
        }));
        if synced {
            world.lock().unwrap().resync();
            mark_synced(&caches);
        }
        let api = HostApi::new(
            client(world.clone()),
            caches,
            &settings(rate_limit),
            8086,
            &mut Registry::default(),
        );
        (Arc::new(api), world)
    }

    fn api(rate_limit: u32) -> (Arc<HostApi>, Arc<Mutex<World>>) {
        api_with(rate_limit, true)
    }

    fn token(uid: &str) -> String {
        let now = Timestamp::now().as_second();
        let claims = json!({
            "iss": "https://issuer.mcp.internal", "aud": "mcp-host-api",
            "iat": now, "exp": now + 300,
            "hostRefs": [{"namespace": "team", "name": "agent"}],
            "host_uid": uid, "capabilities": [CAPABILITY],
        });
        let pem = std::fs::read(&keys().private_pem).unwrap();
        jsonwebtoken::encode(
            &Header::new(Algorithm::RS256),
            &claims,
            &EncodingKey::from_rsa_pem(&pem).unwrap(),
        )
        .unwrap()
    }

    async fn call(
        api: &Arc<HostApi>,
        method: &str,
        path: &str,
        token: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        api.clone()
            .handle(request.body(Full::new(Bytes::new())).unwrap())
            .await
    }

    async fn get(api: &Arc<HostApi>, token: &str) -> (u16, Value) {
        answer(call(api, "GET", INVENTORY_PATH, Some(token)).await).await
    }

    async fn post_raw(api: &Arc<HostApi>, token: &str, body: Value) -> Response<Full<Bytes>> {
        let request = Request::post(CREDENTIAL_PATH)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        api.clone().handle(request).await
    }

    async fn post(api: &Arc<HostApi>, token: &str, body: Value) -> (u16, Value) {
        answer(post_raw(api, token, body).await).await
    }

    async fn answer(r: Response<Full<Bytes>>) -> (u16, Value) {
        let status = r.status().as_u16();
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    fn take_log(world: &Arc<Mutex<World>>) -> Vec<String> {
        std::mem::take(&mut world.lock().unwrap().log)
    }

    #[tokio::test]
    async fn credential_reads_one_secret_after_the_grant_and_mints_the_session_token() {
        let (api, w) = api(100);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body,
            json!({
                "serverName": "github",
                "serverNamespace": "team",
                "token": "gh-secret",
                "credentialRevision": credential_revision("srv-team-github", "sec-team-gh", "7", "token"),
                "url": "http://github.team.svc:8086/mcp",
                "session": {"namespace": "team", "name": "agent-github",
                            "token": "jwt-of-agent-github",
                            "expiresAt": "2030-01-01T00:10:00Z"},
            })
        );
        // Live: exactly that Secret, then the session's TokenRequest; nothing else.
        assert_eq!(
            take_log(&w),
            [
                format!("GET {}", secret_path("team", "gh")),
                format!("POST {}", token_path("team", "agent-github")),
            ]
        );
        assert_eq!(
            w.lock().unwrap().token_requests,
            [
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 600}})
            ]
        );

        // Not granted (another namespace's server of the same name), a missing server, a
        // bare name granted nowhere: the same 404 and nothing read at all.
        let mut bodies = Vec::new();
        for request in [
            json!({"serverName": "github", "serverNamespace": "other"}),
            json!({"serverName": "absent"}),
            json!({"serverName": "jira", "serverNamespace": "team"}),
        ] {
            let r = post_raw(&api, &token("uid-agent"), request.clone()).await;
            let (parts, body) = r.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            assert_eq!(parts.status, 404, "{request}");
            assert_eq!(bytes, r#"{"error":"not_found"}"#, "{request}");
            bodies.push(format!("{:?}", parts.headers));
            assert_eq!(take_log(&w), Vec::<String>::new(), "{request}");
        }
        assert!(bodies.windows(2).all(|p| p[0] == p[1]), "{bodies:?}");
    }

    #[tokio::test]
    async fn a_granted_server_without_a_credential_answers_token_null() {
        let (api, w) = api(100);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "plain"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["token"], Value::Null);
        assert_eq!(body["credentialRevision"], Value::Null);
        assert_eq!(body["url"], "http://plain.team.svc:8086/mcp");
        assert_eq!(body["session"]["name"], "agent-plain");
        assert_eq!(body["session"]["token"], "jwt-of-agent-plain");
        // No Secret read at all: only the TokenRequest.
        assert_eq!(
            take_log(&w),
            [format!("POST {}", token_path("team", "agent-plain"))]
        );
    }

    #[tokio::test]
    async fn a_missing_or_unreadable_secret_affects_only_its_server() {
        let (api, w) = api(100);
        // github's Secret is gone; jira's holds a value that is not UTF-8; plain has none.
        w.lock().unwrap().remove("Secret", "team", "gh");
        w.lock()
            .unwrap()
            .put(secret_object("shared", "jira", &[0xff, 0xfe]));
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!(status, 200, "{body}");
        let items = body["items"].as_array().unwrap();
        assert_eq!(items.len(), 3, "{body}");
        assert!(items[0]["credentialRevision"].is_null(), "{body}");
        // The cache holds metadata only: a Secret present is a revision, whatever its value.
        assert!(items[1]["credentialRevision"].is_string(), "{body}");
        for (server, ns) in [("github", "team"), ("jira", "shared")] {
            let (status, body) = post(
                &api,
                &token("uid-agent"),
                json!({"serverName": server, "serverNamespace": ns}),
            )
            .await;
            assert_eq!((status, body), (503, json!({"error": "unavailable"})));
        }
        // kube-apiserver refusing the Secret read is 503 too, and for that server alone.
        w.lock()
            .unwrap()
            .put(secret_object("shared", "jira", b"jira-secret"));
        w.lock().unwrap().answers.insert(
            secret_path("shared", "jira"),
            (403, kube_status(403, "Forbidden")),
        );
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "jira"})).await;
        assert_eq!(status, 503);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "plain"})).await;
        assert_eq!(status, 200, "{body}");
        // None of it reached a TokenRequest for the refused servers.
        let log = take_log(&w);
        assert!(
            log.iter().filter(|l| l.ends_with("/token")).count() == 1,
            "{log:?}"
        );
    }

    #[tokio::test]
    async fn names_that_are_not_kubernetes_names_are_never_fetched() {
        let (api, w) = api(100);
        // A Context granting a path, and a server whose hostCredential names one.
        w.lock().unwrap().put(context_object(
            "team",
            "dev",
            json!([{"name": "../../../api/v1/namespaces/kube-system/secrets/x"},
                   {"name": "github"}]),
        ));
        w.lock()
            .unwrap()
            .put(server_object("team", "github", Some("../configmaps/x")));
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["items"][0]["credentialRevision"],
            Value::Null,
            "{body}"
        );
        let (status, _) = post(
            &api,
            &token("uid-agent"),
            json!({"serverName": "../../../api/v1/namespaces/kube-system/secrets/x"}),
        )
        .await;
        assert_eq!(status, 404);
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 503);
        let log = take_log(&w);
        assert!(log.is_empty(), "{log:?}");
    }

    #[tokio::test]
    async fn a_retiring_server_is_neither_listed_nor_handed_out() {
        let (api, w) = api(100);
        let mut retiring = server_object("team", "github", Some("gh"));
        retiring["status"]["conditions"] = json!([{"type": "Retiring", "status": "True",
            "reason": "Deleted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        w.lock().unwrap().put(retiring);
        let (_, body) = get(&api, &token("uid-agent")).await;
        let names: Vec<&str> = body["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect();
        assert_eq!(names, ["jira", "plain"]);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (404, json!({"error": "not_found"})));
        assert!(take_log(&w).is_empty());
    }

    #[tokio::test]
    async fn a_grant_revoked_while_the_secret_is_read_is_not_answered() {
        let changes: Vec<(&str, Change)> = vec![
            (
                "the grant removed",
                Box::new(|w: &mut World| {
                    w.put(context_object("team", "dev", json!([{"name": "plain"}])))
                }),
            ),
            (
                "the Host re-created (another UID)",
                Box::new(|w: &mut World| w.put(host_object("agent", "uid-new", "dev"))),
            ),
            (
                "the server deleted",
                Box::new(|w: &mut World| w.remove("MCPServer", "team", "github")),
            ),
            (
                "the server re-created (another UID)",
                Box::new(|w: &mut World| {
                    let mut s = server_object("team", "github", Some("gh"));
                    s["metadata"]["uid"] = json!("srv-new");
                    w.put(s)
                }),
            ),
            (
                "the hostCredential changed",
                Box::new(|w: &mut World| w.put(server_object("team", "github", Some("jira")))),
            ),
        ];
        for (what, change) in changes {
            let (api, w) = api(100);
            w.lock().unwrap().after_secret = Some(change);
            let (status, body) =
                post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
            assert_eq!(
                (status, body),
                (404, json!({"error": "not_found"})),
                "{what}"
            );
            assert!(
                take_log(&w).iter().any(|l| l.contains("/secrets/gh")),
                "{what}"
            );
        }
    }

    #[tokio::test]
    async fn inventory_answers_from_the_caches_alone() {
        let (api, w) = api(100);
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["host"], json!({"namespace": "team", "name": "agent"}));
        let items = body["items"].as_array().unwrap();
        let names: Vec<String> = items
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["namespace"].as_str().unwrap(),
                    i["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(names, ["team/github", "shared/jira", "team/plain"]);
        assert_eq!(
            items[0],
            json!({"name": "github", "namespace": "team", "transport": "streamable-http",
                   "url": "http://github.team.svc:8086/mcp", "ready": true,
                   "credentialRevision": credential_revision("srv-team-github", "sec-team-gh", "7", "token"),
                   "session": {"namespace": "team", "name": "agent-github", "phase": "Active"}})
        );
        assert!(items[2]["credentialRevision"].is_null());
        let text = body.to_string();
        assert!(
            !text.contains("gh-secret") && !text.contains("\"gh\"") && !text.contains("jwt-"),
            "{text}"
        );
        // Not one live request.
        assert_eq!(take_log(&w), Vec::<String>::new());

        // Sessions as the host sees them: a revoked one, an expired one, none.
        w.lock().unwrap().put(session_object(
            "team",
            "agent-github-2",
            "uid-agent",
            "github",
            1,
            3600,
            "Revoked",
        ));
        w.lock().unwrap().put(session_object(
            "shared",
            "agent-jira",
            "uid-agent",
            "jira",
            60,
            -5,
            "Active",
        ));
        w.lock()
            .unwrap()
            .remove("AccessSession", "team", "agent-plain");
        let (_, body) = get(&api, &token("uid-agent")).await;
        let sessions: Vec<&Value> = body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["session"])
            .collect();
        assert_eq!(
            sessions,
            [
                &json!({"namespace": "team", "name": "agent-github-2", "phase": "Revoked"}),
                &json!({"namespace": "shared", "name": "agent-jira", "phase": "Expired"}),
                &Value::Null,
            ]
        );
    }

    #[tokio::test]
    async fn a_server_of_another_namespace_needs_its_consent_by_namespace_labels() {
        let (api, w) = api(100);
        let mut jira = server_object("shared", "jira", Some("jira"));
        jira["spec"]["allowedContexts"] = json!({"namespaces": {"from": "Selector",
            "selector": {"matchLabels": {"grants": "jira"}}}});
        w.lock().unwrap().put(jira.clone());
        let names = |body: &Value| -> Vec<String> {
            body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap().to_string())
                .collect()
        };
        // The Context's namespace (team) carries the label jira's consent selects.
        let (_, body) = get(&api, &token("uid-agent")).await;
        assert_eq!(names(&body), ["github", "jira", "plain"]);
        // Without it, or without any consent, jira is neither listed nor handed out.
        for consent in [
            json!({"namespaces": {"from": "Selector",
                   "selector": {"matchLabels": {"grants": "other"}}}}),
            json!({"namespaces": {"from": "Same"}}),
            Value::Null,
        ] {
            jira["spec"]["allowedContexts"] = consent.clone();
            w.lock().unwrap().put(jira.clone());
            let (_, body) = get(&api, &token("uid-agent")).await;
            assert_eq!(names(&body), ["github", "plain"], "{consent}");
            let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "jira"})).await;
            assert_eq!(status, 404, "{consent}");
        }
        assert!(take_log(&w).is_empty());
    }

    #[tokio::test]
    async fn a_session_only_labelled_for_the_host_is_not_handed_out() {
        // Someone who may issue sessions labels one of theirs with the Host's UID (newer than
        // the host's own): it names another subject, so it is not the host's; the host's own
        // session is handed out.
        let (api, w) = api(100);
        let mut foreign =
            session_object("team", "planted", "uid-agent", "github", 1, 3600, "Active");
        foreign["spec"]["subject"]["user"] = json!("mallory@example.com");
        w.lock().unwrap().put(foreign);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["session"]["name"], "agent-github", "{body}");
    }

    #[tokio::test]
    async fn sessions_revoked_or_pending_are_answered_before_any_read() {
        let (api, w) = api(100);
        w.lock().unwrap().put(session_object(
            "team",
            "agent-github-2",
            "uid-agent",
            "github",
            1,
            3600,
            "Revoked",
        ));
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(
            (status, body),
            (
                409,
                json!({"error": "session_revoked", "revocation": "stop-agent-github-2"})
            )
        );
        // Revoked without a Revocation (an agent deactivation): null.
        let mut revoked = session_object(
            "team",
            "agent-github-2",
            "uid-agent",
            "github",
            1,
            3600,
            "Revoked",
        );
        revoked["status"]["revocation"]
            .as_object_mut()
            .unwrap()
            .remove("revocationName");
        w.lock().unwrap().put(revoked);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(
            (status, body),
            (409, json!({"error": "session_revoked", "revocation": null}))
        );

        // Only an expired session, or none: pending, retry in a second.
        w.lock().unwrap().put(session_object(
            "shared",
            "agent-jira",
            "uid-agent",
            "jira",
            60,
            -5,
            "Active",
        ));
        w.lock()
            .unwrap()
            .remove("AccessSession", "team", "agent-plain");
        for server in ["jira", "plain"] {
            let r = post_raw(&api, &token("uid-agent"), json!({"serverName": server})).await;
            assert_eq!(r.headers()[header::RETRY_AFTER], "1", "{server}");
            assert_eq!(
                answer(r).await,
                (503, json!({"error": "session_pending"})),
                "{server}"
            );
        }
        assert_eq!(take_log(&w), Vec::<String>::new());

        // The cache says Active, the aggregated API refuses a token: the session as it
        // stands now decides. Gone (or still Active): pending. Revoked since: 409 naming the
        // Revocation, before the cache has caught up. Another failure of the TokenRequest:
        // unavailable.
        let (api, w) = super::kube_tests::api(100);
        w.lock().unwrap().answers.insert(
            token_path("team", "agent-github"),
            (409, kube_status(409, "Conflict")),
        );
        take_log(&w);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (503, json!({"error": "session_pending"})));
        let session_path = format!("{SESSIONS}/team/accesssessions/agent-github");
        assert!(
            take_log(&w).contains(&format!("GET {session_path}")),
            "the refused session is read"
        );
        let revoked = session_object(
            "team",
            "agent-github",
            "uid-agent",
            "github",
            60,
            300,
            "Revoked",
        );
        w.lock()
            .unwrap()
            .answers
            .insert(session_path.clone(), (200, revoked));
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(
            (status, body),
            (
                409,
                json!({"error": "session_revoked", "revocation": "stop-agent-github"})
            )
        );
        w.lock()
            .unwrap()
            .answers
            .insert(session_path, (500, kube_status(500, "InternalError")));
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (503, json!({"error": "session_pending"})));
        w.lock().unwrap().answers.insert(
            token_path("team", "agent-github"),
            (500, kube_status(500, "InternalError")),
        );
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (503, json!({"error": "unavailable"})));
    }

    #[tokio::test]
    async fn nothing_is_answered_before_the_caches_sync_and_a_wrong_uid_is_401() {
        let (api, w) = api_with(100, false);
        let r = call(&api, "GET", HEALTH_PATH, None).await;
        assert_eq!(answer(r).await, (503, json!({"status": "unavailable"})));
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!((status, body), (503, json!({"error": "unavailable"})));
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "plain"})).await;
        assert_eq!(status, 503);
        // An invalid token is still 401: the token is checked first.
        assert_eq!(get(&api, "not-a-token").await.0, 401);

        let (api, _) = api_with(100, true);
        let r = call(&api, "GET", HEALTH_PATH, None).await;
        assert_eq!(answer(r).await, (200, json!({"status": "ok"})));
        let (status, body) = get(&api, &token("uid-other")).await;
        assert_eq!((status, body), (401, json!({"error": "unauthorized"})));
        let r = call(&api, "POST", HEALTH_PATH, None).await;
        assert_eq!(r.status(), 405);
        assert!(take_log(&w).is_empty());
    }

    #[tokio::test]
    async fn legacy_routes_are_gone_for_any_method_without_a_token() {
        let (api, w) = api(1);
        for (method, path) in [
            ("GET", "/api/v1/mcpservers"),
            ("GET", "/api/v1/mcpservers/context/ctx1"),
            ("POST", "/api/v1/mcpservers/context/ctx1"),
            ("GET", "/api/v1/mcpservers/github/auth"),
            ("DELETE", "/api/v1/mcpservers/github/auth"),
        ] {
            let r = call(&api, method, path, None).await;
            assert_eq!(
                answer(r).await,
                (
                    410,
                    json!({"error": "gone", "use": "/api/v2/hosts/self/mcpservers"})
                ),
                "{method} {path}"
            );
        }
        for path in [
            "/api/v1/mcpservers/github",
            "/api/v1/mcpservers/context/",
            "/api/v1/mcpservers/a/b/auth",
            "/api/v1/mcpserversx",
        ] {
            let r = call(&api, "GET", path, None).await;
            assert_eq!(r.status(), 404, "{path}");
        }
        assert!(take_log(&w).is_empty());
    }

    #[tokio::test]
    async fn the_rate_limit_counts_valid_tokens_per_uid_and_action() {
        let (api, _) = api(2);
        // Invalid tokens are refused before the limiter: they spend no host's window.
        for _ in 0..5 {
            assert_eq!(get(&api, "not-a-token").await.0, 401);
        }
        // A signed token of a UID no Host has: refused while its window lasts, then limited.
        for _ in 0..2 {
            assert_eq!(get(&api, &token("uid-wrong")).await.0, 401);
        }
        assert_eq!(get(&api, &token("uid-wrong")).await.0, 429);
        // Another UID's window is its own; each action has its own window.
        for _ in 0..2 {
            assert_eq!(get(&api, &token("uid-agent")).await.0, 200);
        }
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!((status, body), (429, json!({"error": "rate_limited"})));
        for _ in 0..2 {
            let (status, body) =
                post(&api, &token("uid-agent"), json!({"serverName": "plain"})).await;
            assert_eq!(status, 200, "{body}");
        }
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "plain"})).await;
        assert_eq!(status, 429);
        // /healthz is not limited.
        for _ in 0..5 {
            assert_eq!(call(&api, "GET", HEALTH_PATH, None).await.status(), 200);
        }
    }
}
