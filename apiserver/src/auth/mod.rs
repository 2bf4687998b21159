//! Who is calling (authentication) and whether they may (authorization).
//!
//! The HTTP layer asks an [`Authenticator`] and an [`Authorizer`]; standalone mode plugs in a
//! static token file and an allow-all-authenticated authorizer. Behind kube-apiserver,
//! [`DelegatedAuthenticator`] tries [`front_proxy`] headers, then [`token_review`].

mod cache;
mod front_proxy;
mod gateway;
mod sar;
mod token_file;
mod token_review;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

pub use cache::AuthCacheMetrics;
pub use front_proxy::{
    common_name, AuthConfigError, DelegatedOptions, FrontProxy, RequestHeaderConfig,
    SwappableClientVerifier, AUTH_CONFIGMAP,
};
pub use gateway::{
    Freshness, GatewayAuthenticator, GatewayIdentity, GatewayRefusal, PodChainAuthenticator,
    GATEWAY_AUDIENCE,
};
pub use sar::{SubjectAccessReviewer, MASTERS_GROUP};
pub use token_file::{TokenFile, TokenFileError};
pub use token_review::TokenReviewer;

/// An authenticated user, as Kubernetes' `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// How long a TokenReview or SubjectAccessReview may take before the request is answered
/// 503 (the default client timeout of kube's delegated authentication and authorization).
pub const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Group every authenticated user belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// What is known about the connection a request arrived on.
#[derive(Clone, Debug, Default)]
pub struct ConnectionInfo {
    /// DER of the client certificate chain the TLS handshake verified, leaf first.
    pub peer_certificates: Vec<Vec<u8>>,
}

/// Establishes who made a request.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// `Ok(None)` when the request carries no credentials this authenticator understands;
    /// an error when it carries credentials that are invalid.
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError>;
}

/// Invalid credentials, or the authority that checks them is unreachable.
#[derive(Debug, thiserror::Error)]
pub enum AuthenticationError {
    #[error("invalid bearer token")]
    InvalidToken,
    #[error("authentication unavailable: {0}")]
    Unavailable(String),
}

/// The attributes of a request an authorizer decides on (`authorizer.Attributes`).
#[derive(Clone, Debug, Default)]
pub struct Attributes {
    pub verb: String,
    /// True for requests to a resource; false for non-resource paths (discovery, OpenAPI).
    pub resource_request: bool,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub path: String,
}

impl Attributes {
    /// Kubernetes' message for a denied request.
    pub fn forbidden_message(&self, user: &UserInfo, reason: &str) -> String {
        let mut message = if self.resource_request {
            let resource = if self.subresource.is_empty() {
                self.resource.clone()
            } else {
                format!("{}/{}", self.resource, self.subresource)
            };
            let mut m = format!("{}.{} ", self.resource, self.api_group);
            if !self.name.is_empty() {
                m.push_str(&format!("{:?} ", self.name));
            }
            m.push_str(&format!(
                "is forbidden: User {:?} cannot {} resource {:?} in API group {:?}",
                user.name, self.verb, resource, self.api_group
            ));
            if self.namespace.is_empty() {
                m.push_str(" at the cluster scope");
            } else {
                m.push_str(&format!(" in the namespace {:?}", self.namespace));
            }
            m
        } else {
            format!(
                "forbidden: User {:?} cannot {} path {:?}",
                user.name,
                self.verb.to_lowercase(),
                self.path
            )
        };
        if !reason.is_empty() {
            message.push_str(": ");
            message.push_str(reason);
        }
        message
    }
}

/// An authorization decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the reason the authorizer gave (may be empty).
    Deny(String),
    /// No decision could be made (the authority is unreachable, failed or timed out). Never
    /// cached, and answered 503: a 401/403 would tell callers to drop their authority.
    Unavailable(String),
}

/// Decides whether a user may perform a request.
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    async fn authorize(&self, user: &UserInfo, attributes: &Attributes) -> Decision;
}

/// Delegated authentication behind kube-apiserver (DESIGN §4): the front proxy's headers
/// when the connection carries its verified certificate, else a bearer token through
/// TokenReview.
pub struct DelegatedAuthenticator {
    front_proxy: FrontProxy,
    tokens: TokenReviewer,
}

impl DelegatedAuthenticator {
    /// Reads the ConfigMap once (startup fails if it cannot, or if it is refused by
    /// `options`) and returns the authenticator with the handshake verifier to install in
    /// the TLS configuration.
    pub async fn start(
        client: kube::Client,
        options: DelegatedOptions,
        cache_metrics: &AuthCacheMetrics,
    ) -> Result<(Arc<Self>, Arc<SwappableClientVerifier>), AuthConfigError> {
        let front_proxy = FrontProxy::new(options);
        let handshake = front_proxy.handshake();
        front_proxy.load(client.clone()).await?;
        let me = Arc::new(Self {
            front_proxy,
            tokens: TokenReviewer::new(client).with_cache_metrics(cache_metrics),
        });
        Ok((me, handshake))
    }

    /// An authenticator that trusts no front proxy until a ConfigMap is applied: bearer
    /// tokens only, through TokenReview.
    pub fn tokens_only(
        client: kube::Client,
        options: DelegatedOptions,
    ) -> (Arc<Self>, Arc<SwappableClientVerifier>) {
        let front_proxy = FrontProxy::new(options);
        let handshake = front_proxy.handshake();
        let me = Arc::new(Self {
            front_proxy,
            tokens: TokenReviewer::new(client),
        });
        (me, handshake)
    }

    /// Follows the authentication ConfigMap (see [`FrontProxy::follow_configmap`]).
    pub async fn follow_configmap(self: Arc<Self>, client: kube::Client) {
        self.front_proxy.follow_configmap(client).await
    }
}

#[async_trait]
impl Authenticator for DelegatedAuthenticator {
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError> {
        if let Some(user) = self.front_proxy.user(request, connection) {
            return Ok(Some(user));
        }
        // kube-apiserver strips Authorization before proxying, so a bearer token here came
        // from a direct client.
        match bearer_token(request) {
            Some(token) => match self.tokens.review(token).await? {
                Some(user) => Ok(Some(user)),
                None => Err(AuthenticationError::InvalidToken),
            },
            None => Ok(None),
        }
    }
}

/// Allows every authenticated request (standalone mode).
pub struct AllowAuthenticated;

#[async_trait]
impl Authorizer for AllowAuthenticated {
    async fn authorize(&self, user: &UserInfo, _attributes: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            Decision::Allow
        } else {
            Decision::Deny("not authenticated".into())
        }
    }
}

/// SHA-256 of a credential, used as a cache key so no credential is kept in memory as one.
pub(crate) type Digest = [u8; 32];

pub(crate) fn sha256(data: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, data).as_ref());
    out
}

/// The bearer token of a request, if any.
pub fn bearer_token(request: &http::request::Parts) -> Option<&str> {
    let value = request
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}
