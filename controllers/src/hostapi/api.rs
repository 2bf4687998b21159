//! The two endpoints and every answer. Each request: authenticate (the token, the rate limit
//! of the Host UID it names, then the live Host with that UID), then live GETs (Context,
//! granted MCPServers, Secrets) through the kube client; nothing is cached, so a revoked grant
//! holds on the next request. Every negative answer of one kind is byte-identical.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::runtime::{Context, Host, MCPServer, SecretKeyRef, Transport};
use base64::Engine;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{json, Value};

use super::limit::{retry_after_seconds, RateLimiter};
use super::settings::Settings;
use super::token::{HostIdentity, Refusal, Verifier};
use crate::host::grants;

pub const INVENTORY_PATH: &str = "/api/v2/hosts/self/mcpservers";
pub const CREDENTIAL_PATH: &str = "/api/v2/hosts/self/mcpservers/credential";
/// The largest credential request body accepted.
pub const MAX_BODY: usize = 4096;
/// A request not answered by then is 503 (the Kubernetes API is too slow).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

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
            "Host API requests by endpoint (inventory, credential, other) and status code",
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

/// The Bearer token of `Authorization`, if any.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// A credential value read under a checked grant.
struct Credential {
    value: String,
    revision: String,
}

pub struct HostApi {
    client: kube::Client,
    verifier: Verifier,
    limiter: RateLimiter,
    gateway_port: u16,
    metrics: Metrics,
}

impl HostApi {
    pub fn new(
        client: kube::Client,
        settings: &Settings,
        gateway_port: u16,
        registry: &mut Registry,
    ) -> Self {
        Self {
            client,
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
        let path = request.uri().path();
        let endpoint = match path {
            INVENTORY_PATH => "inventory",
            CREDENTIAL_PATH => "credential",
            _ => "other",
        };
        let method = request.method().clone();
        let result = match (endpoint, &method) {
            ("inventory", &Method::GET) => self.timed(self.inventory(request.headers())).await,
            ("credential", &Method::POST) => self.timed(self.credential(request)).await,
            ("inventory", _) => Err(Failure::MethodNotAllowed("GET")),
            ("credential", _) => Err(Failure::MethodNotAllowed("POST")),
            _ => Err(Failure::NotFound("unknown path")),
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
                        tracing::warn!(endpoint, error = %why, "host API request failed: Kubernetes API")
                    }
                    Failure::NotFound(why) | Failure::BadRequest(why) => {
                        tracing::debug!(endpoint, why, "host API request refused")
                    }
                    Failure::RateLimited(_) | Failure::MethodNotAllowed(_) => {}
                }
                failure.response()
            }
        };
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                code: response.status().as_u16().to_string(),
            })
            .inc();
        response
    }

    async fn timed(
        &self,
        work: impl std::future::Future<Output = Result<Value, Failure>>,
    ) -> Result<Value, Failure> {
        tokio::time::timeout(REQUEST_TIMEOUT, work)
            .await
            .unwrap_or_else(|_| Err(Failure::Unavailable("request timed out".into())))
    }

    /// A valid token, then the rate limit of the UID it names, then that Host, live, with that
    /// UID. The limit comes before any Kubernetes read: a token of a deleted Host, or a host
    /// over its limit, costs kube-apiserver nothing.
    async fn authenticate(
        &self,
        headers: &http::HeaderMap,
    ) -> Result<(HostIdentity, Host), Failure> {
        let token = bearer(headers).ok_or(Failure::Unauthorized(Refusal::Missing))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let id = self
            .verifier
            .verify(token, now)
            .map_err(Failure::Unauthorized)?;
        self.limiter
            .check(&id.uid, Instant::now())
            .map_err(Failure::RateLimited)?;
        let host = self
            .host(&id)
            .await?
            .ok_or(Failure::Unauthorized(Refusal::Host))?;
        Ok((id, host))
    }

    /// The Host `id` names, if it exists with `id`'s UID.
    async fn host(&self, id: &HostIdentity) -> Result<Option<Host>, Failure> {
        let api: Api<Host> = Api::namespaced(self.client.clone(), &id.host.namespace);
        let host = api
            .get_opt(&id.host.name)
            .await
            .map_err(|e| unavailable("get host", e))?;
        Ok(host.filter(|h| h.metadata.uid.as_deref() == Some(id.uid.as_str())))
    }

    /// The Context the live Host names, in its own namespace.
    async fn context(&self, host: &Host) -> Result<Option<Context>, Failure> {
        let ns = host.namespace().unwrap_or_default();
        if !kube_name(&ns, &host.spec.context_ref.name) {
            return Ok(None);
        }
        let api: Api<Context> = Api::namespaced(self.client.clone(), &ns);
        api.get_opt(&host.spec.context_ref.name)
            .await
            .map_err(|e| unavailable("get context", e))
    }

    async fn server(&self, ns: &str, name: &str) -> Result<Option<MCPServer>, Failure> {
        // A Context's reference is whatever its author wrote: one that is not a Kubernetes
        // name names nothing, and never becomes part of a request path.
        if !kube_name(ns, name) {
            return Ok(None);
        }
        let api: Api<MCPServer> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name)
            .await
            .map_err(|e| unavailable("get mcpserver", e))
    }

    /// The server's host credential: its Secret's key, UTF-8. `None` when the server has no
    /// hostCredential or the Secret or key is missing (or not UTF-8). Call only for a server
    /// whose grant was just checked.
    async fn read_credential(&self, server: &MCPServer) -> Result<Option<Credential>, Failure> {
        let Some(SecretKeyRef { name, key }) = server.spec.host_credential.as_ref() else {
            return Ok(None);
        };
        let ns = server.namespace().unwrap_or_default();
        if !kube_name(&ns, name) {
            return Ok(None);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let Some(secret) = api
            .get_opt(name)
            .await
            .map_err(|e| unavailable("get secret", e))?
        else {
            return Ok(None);
        };
        let Some(value) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
        else {
            return Ok(None);
        };
        let revision = credential_revision(
            server.metadata.uid.as_deref().unwrap_or_default(),
            secret.metadata.uid.as_deref().unwrap_or_default(),
            secret
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default(),
            key,
        );
        Ok(Some(Credential { value, revision }))
    }

    /// Every server `context` grants, live (missing ones left out).
    async fn granted_servers(&self, context: &Context) -> Result<Vec<MCPServer>, Failure> {
        let mut servers = Vec::new();
        for (ns, name) in grants::granted_refs(context) {
            if let Some(s) = self.server(&ns, &name).await? {
                servers.push(s);
            }
        }
        Ok(servers)
    }

    async fn inventory(&self, headers: &http::HeaderMap) -> Result<Value, Failure> {
        let (_, host) = self.authenticate(headers).await?;
        let mut items = Vec::new();
        if let Some(context) = self.context(&host).await? {
            let servers = self.granted_servers(&context).await?;
            for server in grants::granted(&host, &context, &servers) {
                let revision = self.read_credential(server).await?.map(|c| c.revision);
                items.push(json!({
                    "name": server.name_any(),
                    "namespace": server.namespace().unwrap_or_default(),
                    "transport": transport_name(server.spec.transport),
                    "url": server_url(server, self.gateway_port),
                    "ready": grants::ready(server),
                    "credentialRevision": revision,
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
        let (id, host) = self.authenticate(&parts.headers).await?;
        let wanted = parse_credential_request(&parts.headers, body).await?;

        // The grant, from the live Host's Context, before any Secret is read.
        let not_found = Failure::NotFound;
        let context = self.context(&host).await?.ok_or(not_found("no context"))?;
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
            .server(&ns, &name)
            .await?
            .ok_or(not_found("no server"))?;
        if grants::granted(&host, &context, [&server]).is_empty() {
            return Err(not_found("not granted or disabled"));
        }
        let Some(credential_ref) = server.spec.host_credential.clone() else {
            return Err(not_found("no hostCredential"));
        };

        let credential = self
            .read_credential(&server)
            .await?
            .ok_or(not_found("no secret or key"))?;

        // The grant again, from fresh reads: the same Host, Context and server (UIDs), still
        // granted and enabled, still naming the same Secret key.
        let host_again = self.host(&id).await?.ok_or(not_found("host gone"))?;
        let context_again = self
            .context(&host_again)
            .await?
            .ok_or(not_found("context gone"))?;
        let server_again = self
            .server(&ns, &name)
            .await?
            .ok_or(not_found("server gone"))?;
        let same = host_again.metadata.uid == host.metadata.uid
            && context_again.metadata.uid == context.metadata.uid
            && server_again.metadata.uid == server.metadata.uid
            && server_again.spec.host_credential.as_ref() == Some(&credential_ref)
            && !grants::granted(&host_again, &context_again, [&server_again]).is_empty();
        if !same {
            return Err(not_found("grant changed during the request"));
        }
        Ok(json!({
            "serverName": name,
            "serverNamespace": ns,
            "credential": credential.value,
            "credentialRevision": credential.revision,
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

/// The handler against a fake Kubernetes API (a tower service answering GETs from a map and
/// recording every path asked for): the order of reads, fail-closed errors, and the rate limit
/// as a host sees them.
#[cfg(test)]
mod kube_tests {
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Mutex;

    use super::*;
    use crate::hostapi::settings::{load_public_key, tests::keys};
    use crate::hostapi::token::CAPABILITY;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    const HOSTS: &str = "/apis/mcp-runtime.dev/v1alpha1/namespaces";

    #[derive(Default)]
    struct World {
        /// Path → (status, body).
        objects: HashMap<String, (u16, Value)>,
        /// Every path GET, in order.
        log: Vec<String>,
        /// Applied right after the Secret is read: (path, new object or `None` to delete).
        after_secret: Option<(String, Option<Value>)>,
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "not found"})
    }

    fn client(world: Arc<Mutex<World>>) -> kube::Client {
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let world = world.clone();
            async move {
                let path = request.uri().path().to_string();
                let mut w = world.lock().unwrap();
                w.log.push(path.clone());
                let (status, body) = w.objects.get(&path).cloned().unwrap_or((404, not_found()));
                if path.contains("/secrets/") {
                    if let Some((changed, object)) = w.after_secret.take() {
                        match object {
                            Some(o) => w.objects.insert(changed, (200, o)),
                            None => w.objects.remove(&changed),
                        };
                    }
                }
                let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn host_path(name: &str) -> String {
        format!("{HOSTS}/team/hosts/{name}")
    }
    fn context_path(ns: &str, name: &str) -> String {
        format!("{HOSTS}/{ns}/contexts/{name}")
    }
    fn server_path(ns: &str, name: &str) -> String {
        format!("{HOSTS}/{ns}/mcpservers/{name}")
    }
    fn secret_path(ns: &str, name: &str) -> String {
        format!("/api/v1/namespaces/{ns}/secrets/{name}")
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
        let mut spec = json!({"image": "img", "port": 8080});
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
               "metadata": {"name": name, "namespace": ns, "uid": "sec-uid",
                            "resourceVersion": "7"},
               "data": {"token": data}})
    }

    /// Host team/agent (Context team/dev granting team/github, shared/jira and team/plain),
    /// a foreign server other/github, Secrets for the servers with a hostCredential.
    fn world() -> Arc<Mutex<World>> {
        let mut w = World::default();
        let mut put = |path: String, v: Value| {
            w.objects.insert(path, (200, v));
        };
        put(host_path("agent"), host_object("agent", "uid-agent", "dev"));
        put(
            context_path("team", "dev"),
            context_object(
                "team",
                "dev",
                json!([{"name": "github"}, {"name": "jira", "namespace": "shared"},
                       {"name": "plain"}]),
            ),
        );
        put(
            server_path("team", "github"),
            server_object("team", "github", Some("gh")),
        );
        put(
            server_path("shared", "jira"),
            server_object("shared", "jira", Some("jira")),
        );
        put(
            server_path("team", "plain"),
            server_object("team", "plain", None),
        );
        put(
            server_path("other", "github"),
            server_object("other", "github", Some("gh")),
        );
        put(
            secret_path("team", "gh"),
            secret_object("team", "gh", b"gh-secret"),
        );
        put(
            secret_path("shared", "jira"),
            secret_object("shared", "jira", b"jira-secret"),
        );
        put(
            secret_path("other", "gh"),
            secret_object("other", "gh", b"foreign-secret"),
        );
        Arc::new(Mutex::new(w))
    }

    fn api(world: Arc<Mutex<World>>, rate_limit: u32) -> Arc<HostApi> {
        let settings = Settings {
            port: 1,
            tls_cert_file: "/unused".into(),
            tls_key_file: "/unused".into(),
            public_key_der: load_public_key(&keys().spki_pem).unwrap(),
            issuer: "https://issuer.mcp.internal".into(),
            audience: BTreeSet::from(["mcp-host-api".to_string()]),
            max_ttl: Duration::from_secs(600),
            rate_limit,
            rate_window: Duration::from_secs(60),
        };
        Arc::new(HostApi::new(
            client(world),
            &settings,
            8086,
            &mut Registry::default(),
        ))
    }

    fn token(uid: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
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

    async fn get(api: &Arc<HostApi>, token: &str) -> (u16, Value) {
        let request = Request::get(INVENTORY_PATH)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        answer(api.clone().handle(request).await).await
    }

    async fn post(api: &Arc<HostApi>, token: &str, body: Value) -> (u16, Value) {
        let request = Request::post(CREDENTIAL_PATH)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        answer(api.clone().handle(request).await).await
    }

    async fn answer(r: Response<Full<Bytes>>) -> (u16, Value) {
        let status = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    fn take_log(world: &Arc<Mutex<World>>) -> Vec<String> {
        std::mem::take(&mut world.lock().unwrap().log)
    }

    #[tokio::test]
    async fn credential_reads_the_grant_before_the_secret_and_again_after() {
        let w = world();
        let api = api(w.clone(), 100);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["credential"], "gh-secret");
        assert_eq!(body["serverNamespace"], "team");
        assert_eq!(
            take_log(&w),
            [
                host_path("agent"),
                context_path("team", "dev"),
                server_path("team", "github"),
                secret_path("team", "gh"),
                host_path("agent"),
                context_path("team", "dev"),
                server_path("team", "github"),
            ]
        );

        // Not granted (another namespace's server of the same name), no hostCredential, a
        // missing server: 404 and no Secret read at all.
        for request in [
            json!({"serverName": "github", "serverNamespace": "other"}),
            json!({"serverName": "plain"}),
            json!({"serverName": "absent"}),
        ] {
            let (status, body) = post(&api, &token("uid-agent"), request.clone()).await;
            assert_eq!(
                (status, body),
                (404, json!({"error": "not_found"})),
                "{request}"
            );
            let log = take_log(&w);
            assert!(
                log.iter().all(|p| !p.contains("/secrets/")),
                "{request}: {log:?}"
            );
        }
    }

    #[tokio::test]
    async fn names_that_are_not_kubernetes_names_are_never_fetched() {
        let w = world();
        let api = api(w.clone(), 100);
        // A Context granting a path, and a server whose hostCredential names one.
        w.lock().unwrap().objects.insert(
            context_path("team", "dev"),
            (
                200,
                context_object(
                    "team",
                    "dev",
                    json!([{"name": "../../../api/v1/namespaces/kube-system/secrets/x"},
                           {"name": "github"}]),
                ),
            ),
        );
        w.lock().unwrap().objects.insert(
            server_path("team", "github"),
            (
                200,
                server_object("team", "github", Some("../configmaps/x")),
            ),
        );
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["items"][0]["credentialRevision"],
            Value::Null,
            "{body}"
        );
        for name in ["../../../api/v1/namespaces/kube-system/secrets/x", "github"] {
            let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": name})).await;
            assert_eq!(
                (status, body),
                (404, json!({"error": "not_found"})),
                "{name}"
            );
        }
        let log = take_log(&w);
        assert!(log.iter().all(|p| !p.contains("..")), "{log:?}");
    }

    #[tokio::test]
    async fn a_retiring_server_is_neither_listed_nor_handed_out() {
        let w = world();
        let api = api(w.clone(), 100);
        let mut retiring = server_object("team", "github", Some("gh"));
        retiring["status"]["conditions"] = json!([{"type": "Retiring", "status": "True",
            "reason": "Deleted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        w.lock()
            .unwrap()
            .objects
            .insert(server_path("team", "github"), (200, retiring));
        let (_, body) = get(&api, &token("uid-agent")).await;
        let names: Vec<&str> = body["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect();
        assert_eq!(names, ["jira", "plain"]);
        take_log(&w);
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (404, json!({"error": "not_found"})));
        assert!(take_log(&w).iter().all(|p| !p.contains("/secrets/")));
    }

    #[tokio::test]
    async fn a_grant_revoked_while_the_secret_is_read_is_not_answered() {
        let w = world();
        let api = api(w.clone(), 100);
        w.lock().unwrap().after_secret = Some((
            context_path("team", "dev"),
            Some(context_object("team", "dev", json!([{"name": "plain"}]))),
        ));
        let (status, body) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!((status, body), (404, json!({"error": "not_found"})));
        // The Host re-created during the read (another UID): not answered either.
        let w = world();
        let api = super::kube_tests::api(w.clone(), 100);
        w.lock().unwrap().after_secret = Some((
            host_path("agent"),
            Some(host_object("agent", "uid-new", "dev")),
        ));
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 404);
        // The server deleted during the read.
        let w = world();
        let api = super::kube_tests::api(w.clone(), 100);
        w.lock().unwrap().after_secret = Some((server_path("team", "github"), None));
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 404);
    }

    #[tokio::test]
    async fn inventory_lists_granted_servers_of_the_live_context() {
        let w = world();
        let api = api(w.clone(), 100);
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
        assert_eq!(items[0]["url"], "http://github.team.svc:8086/mcp");
        assert_eq!(items[0]["transport"], "streamable-http");
        assert_eq!(items[0]["ready"], true);
        assert_eq!(
            items[0]["credentialRevision"],
            credential_revision("srv-team-github", "sec-uid", "7", "token")
        );
        assert!(items[2]["credentialRevision"].is_null());
        let text = body.to_string();
        assert!(
            !text.contains("gh-secret") && !text.contains("\"gh\""),
            "{text}"
        );
        // The foreign server's Secret is never read.
        assert!(!take_log(&w).contains(&secret_path("other", "gh")));

        // A non-UTF-8 credential is no credential.
        w.lock().unwrap().objects.insert(
            secret_path("team", "gh"),
            (200, secret_object("team", "gh", &[0xff, 0xfe])),
        );
        let (_, body) = get(&api, &token("uid-agent")).await;
        assert!(body["items"][0]["credentialRevision"].is_null());
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 404);
    }

    #[tokio::test]
    async fn kube_api_errors_fail_closed_and_a_wrong_uid_is_401() {
        let w = world();
        let api = api(w.clone(), 100);
        let (status, body) = get(&api, &token("uid-other")).await;
        assert_eq!((status, body), (401, json!({"error": "unauthorized"})));
        let forbidden = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "Forbidden", "code": 403, "message": "no"});
        w.lock()
            .unwrap()
            .objects
            .insert(context_path("team", "dev"), (403, forbidden.clone()));
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!((status, body), (503, json!({"error": "unavailable"})));
        let (status, _) = post(&api, &token("uid-agent"), json!({"serverName": "github"})).await;
        assert_eq!(status, 503);
        w.lock()
            .unwrap()
            .objects
            .insert(host_path("agent"), (500, forbidden));
        let (status, _) = get(&api, &token("uid-agent")).await;
        assert_eq!(status, 503);
    }

    #[tokio::test]
    async fn the_rate_limit_counts_valid_tokens_per_uid_before_any_read() {
        let w = world();
        let api = api(w.clone(), 2);
        // Invalid tokens are refused before the limiter: they spend no host's window.
        for _ in 0..5 {
            assert_eq!(get(&api, "not-a-token").await.0, 401);
        }
        // A signed token of a UID no Host has: refused after a Host read while its window
        // lasts, then limited without any read of kube-apiserver.
        for _ in 0..2 {
            assert_eq!(get(&api, &token("uid-wrong")).await.0, 401);
        }
        let reads = w.lock().unwrap().log.len();
        assert_eq!(get(&api, &token("uid-wrong")).await.0, 429);
        assert_eq!(
            w.lock().unwrap().log.len(),
            reads,
            "a limited request read nothing"
        );
        // Another UID's window is its own.
        assert_eq!(get(&api, &token("uid-agent")).await.0, 200);
        assert_eq!(
            post(&api, &token("uid-agent"), json!({"serverName": "github"}))
                .await
                .0,
            200
        );
        let (status, body) = get(&api, &token("uid-agent")).await;
        assert_eq!((status, body), (429, json!({"error": "rate_limited"})));
    }
}
