//! Delegated authentication behind kube-apiserver (DESIGN §4):
//! - front-proxy request headers, trusted only on a connection whose client certificate
//!   verifies against the request-header CA with an allowed name, configured from
//!   `kube-system/extension-apiserver-authentication` and re-read when it changes;
//! - bearer tokens through TokenReview, cached briefly.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::cache::TtlCache;
use super::{
    bearer_token, AuthenticationError, Authenticator, ConnectionInfo, UserInfo, AUTHENTICATED_GROUP,
};

/// Namespace and name of the ConfigMap kube-apiserver publishes for extension servers.
pub const AUTH_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// Request-header authentication settings, as published in the ConfigMap.
#[derive(Clone)]
pub struct RequestHeaderConfig {
    verifier: Arc<dyn ClientCertVerifier>,
    allowed_names: Vec<String>,
    username_headers: Vec<String>,
    uid_headers: Vec<String>,
    group_headers: Vec<String>,
    extra_prefixes: Vec<String>,
}

/// The ConfigMap is missing a field or holds something unusable. Startup fails on it.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("extension-apiserver-authentication: {0}")]
    Invalid(String),
    #[error("cannot read kube-system/extension-apiserver-authentication: {0}")]
    Unavailable(String),
}

fn json_list(
    data: &std::collections::BTreeMap<String, String>,
    key: &str,
) -> Result<Vec<String>, AuthConfigError> {
    match data.get(key).map(|s| s.trim()) {
        None | Some("") | Some("null") => Ok(Vec::new()),
        Some(raw) => serde_json::from_str::<Option<Vec<String>>>(raw)
            .map(Option::unwrap_or_default)
            .map_err(|e| {
                AuthConfigError::Invalid(format!("{key} is not a JSON string array: {e}"))
            }),
    }
}

impl RequestHeaderConfig {
    /// Parses the ConfigMap's data. `Ok(None)` when it configures no request-header CA.
    pub fn from_configmap(
        data: &std::collections::BTreeMap<String, String>,
    ) -> Result<Option<Self>, AuthConfigError> {
        let Some(ca_pem) = data
            .get("requestheader-client-ca-file")
            .filter(|s| !s.trim().is_empty())
        else {
            return Ok(None);
        };
        let mut roots = RootCertStore::empty();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| AuthConfigError::Invalid(format!("requestheader-client-ca-file: {e}")))?;
        if certs.is_empty() {
            return Err(AuthConfigError::Invalid(
                "requestheader-client-ca-file holds no certificate".into(),
            ));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                AuthConfigError::Invalid(format!("requestheader-client-ca-file: {e}"))
            })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .map_err(|e| AuthConfigError::Invalid(format!("requestheader-client-ca-file: {e}")))?;
        let username_headers = json_list(data, "requestheader-username-headers")?;
        if username_headers.is_empty() {
            return Err(AuthConfigError::Invalid(
                "requestheader-username-headers is empty".into(),
            ));
        }
        Ok(Some(Self {
            verifier,
            allowed_names: json_list(data, "requestheader-allowed-names")?,
            username_headers,
            uid_headers: json_list(data, "requestheader-uid-headers")?,
            group_headers: json_list(data, "requestheader-group-headers")?,
            extra_prefixes: json_list(data, "requestheader-extra-headers-prefix")?,
        }))
    }

    /// Whether the connection's client certificate is a trusted front proxy.
    fn trusts(&self, connection: &ConnectionInfo) -> bool {
        let Some((leaf, intermediates)) = connection.peer_certificates.split_first() else {
            return false;
        };
        let leaf = CertificateDer::from(leaf.as_slice());
        let intermediates: Vec<CertificateDer<'_>> = intermediates
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        if self
            .verifier
            .verify_client_cert(&leaf, &intermediates, UnixTime::now())
            .is_err()
        {
            return false;
        }
        if self.allowed_names.is_empty() {
            return true;
        }
        match common_name(&leaf) {
            Some(cn) => self.allowed_names.contains(&cn),
            None => false,
        }
    }

    /// The user the proxy asserts, if it asserts one.
    fn user(&self, headers: &http::HeaderMap) -> Option<UserInfo> {
        let first = |names: &[String]| {
            names.iter().find_map(|n| {
                headers
                    .get_all(n.as_str())
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find(|v| !v.is_empty())
                    .map(str::to_string)
            })
        };
        let name = first(&self.username_headers)?;
        let uid = first(&self.uid_headers).unwrap_or_default();
        let mut groups: Vec<String> = self
            .group_headers
            .iter()
            .flat_map(|n| {
                headers
                    .get_all(n.as_str())
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(str::to_string)
            })
            .collect();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_string());
        }
        let mut extra: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (header, value) in headers {
            let header = header.as_str();
            for prefix in &self.extra_prefixes {
                let prefix = prefix.to_ascii_lowercase();
                if header.len() > prefix.len() && header.to_ascii_lowercase().starts_with(&prefix) {
                    let key = percent_decode(&header[prefix.len()..].to_ascii_lowercase());
                    if let Ok(v) = value.to_str() {
                        extra.entry(key).or_default().push(v.to_string());
                    }
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }
}

/// The common name of a DER certificate's subject.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some(cn)
}

/// Percent-decoding of header-name escapes (`%2F` → `/`); `+` stays as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..(i + 3).min(bytes.len())])
                .ok()
                .filter(|h| h.len() == 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The TLS handshake's client-certificate policy: certificates are optional (bearer-token
/// clients have none) and, when presented, must chain to the current request-header CA.
/// Swapped when the ConfigMap changes; the request-time check in `RequestHeaderConfig`
/// decides what a verified certificate may assert.
#[derive(Debug)]
pub struct SwappableClientVerifier {
    inner: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl SwappableClientVerifier {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: RwLock::new(None),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    fn set(&self, verifier: Option<Arc<dyn ClientCertVerifier>>) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = verifier;
    }

    fn current(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ClientCertVerifier for SwappableClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.current() {
            Some(v) => v.verify_client_cert(end_entity, intermediates, now),
            None => Err(rustls::Error::General(
                "client certificates are not accepted".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// How long TokenReview results are reused (kube's default for delegated servers).
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

/// Authentication by the front proxy's headers, then by TokenReview.
pub struct DelegatedAuthenticator {
    request_header: RwLock<Option<RequestHeaderConfig>>,
    handshake: Arc<SwappableClientVerifier>,
    token_reviews: Api<TokenReview>,
    /// Successful and failed reviews (errors are not cached).
    tokens: TtlCache<String, Option<UserInfo>>,
}

impl DelegatedAuthenticator {
    /// Reads the ConfigMap once (startup fails if it cannot) and returns the authenticator
    /// with the handshake verifier to install in the TLS configuration.
    pub async fn start(
        client: kube::Client,
    ) -> Result<(Arc<Self>, Arc<SwappableClientVerifier>), AuthConfigError> {
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), AUTH_CONFIGMAP.0);
        let cm = configmaps
            .get(AUTH_CONFIGMAP.1)
            .await
            .map_err(|e| AuthConfigError::Unavailable(e.to_string()))?;
        let handshake = SwappableClientVerifier::new();
        let me = Arc::new(Self {
            request_header: RwLock::new(None),
            handshake: handshake.clone(),
            token_reviews: Api::all(client),
            tokens: TtlCache::new(TOKEN_CACHE_TTL, 10_000),
        });
        me.apply(&cm)?;
        Ok((me, handshake))
    }

    fn apply(&self, cm: &ConfigMap) -> Result<(), AuthConfigError> {
        let data = cm.data.clone().unwrap_or_default();
        let config = RequestHeaderConfig::from_configmap(&data)?;
        self.handshake
            .set(config.as_ref().map(|c| c.verifier.clone()));
        *self
            .request_header
            .write()
            .unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// Follows the ConfigMap and applies every valid change; an invalid one is logged and the
    /// previous configuration kept.
    pub async fn follow_configmap(self: Arc<Self>, client: kube::Client) {
        let configmaps: Api<ConfigMap> = Api::namespaced(client, AUTH_CONFIGMAP.0);
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", AUTH_CONFIGMAP.1));
        let mut stream = watcher::watcher(configmaps, config).boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(cm)) | Ok(watcher::Event::InitApply(cm)) => {
                    match self.apply(&cm) {
                        Ok(()) => {
                            tracing::debug!("request-header authentication configuration applied")
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "ignoring invalid authentication configuration")
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watching the authentication ConfigMap failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn review(&self, token: &str) -> Result<Option<UserInfo>, AuthenticationError> {
        if let Some(cached) = self.tokens.get(&token.to_string()) {
            return Ok(cached);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let result = self
            .token_reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthenticationError::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = result.status.unwrap_or_default();
        let user = if status.authenticated == Some(true) {
            status.user.map(|u| {
                let mut groups = u.groups.unwrap_or_default();
                if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                    groups.push(AUTHENTICATED_GROUP.to_string());
                }
                UserInfo {
                    name: u.username.unwrap_or_default(),
                    uid: u.uid.unwrap_or_default(),
                    groups,
                    extra: u.extra.unwrap_or_default(),
                }
            })
        } else {
            None
        };
        self.tokens.insert(token.to_string(), user.clone());
        Ok(user)
    }
}

#[async_trait]
impl Authenticator for DelegatedAuthenticator {
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError> {
        let from_proxy = {
            let config = self
                .request_header
                .read()
                .unwrap_or_else(|p| p.into_inner());
            config
                .as_ref()
                .filter(|c| c.trusts(connection))
                .and_then(|c| c.user(&request.headers))
        };
        if let Some(user) = from_proxy {
            return Ok(Some(user));
        }
        // Headers from anyone else are never read. kube-apiserver strips Authorization before
        // proxying, so a bearer token here came from a direct client.
        match bearer_token(request) {
            Some(token) => match self.review(token).await? {
                Some(user) => Ok(Some(user)),
                None => Err(AuthenticationError::InvalidToken),
            },
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_configmap_and_header_extras() {
        let ca = rcgen::generate_simple_self_signed(vec!["front-proxy-ca".to_string()]).unwrap();
        let mut data = std::collections::BTreeMap::new();
        data.insert("requestheader-client-ca-file".to_string(), ca.cert.pem());
        data.insert(
            "requestheader-username-headers".to_string(),
            "[\"X-Remote-User\"]".to_string(),
        );
        data.insert(
            "requestheader-group-headers".to_string(),
            "[\"X-Remote-Group\"]".to_string(),
        );
        data.insert(
            "requestheader-extra-headers-prefix".to_string(),
            "[\"X-Remote-Extra-\"]".to_string(),
        );
        data.insert(
            "requestheader-allowed-names".to_string(),
            "null".to_string(),
        );
        let config = RequestHeaderConfig::from_configmap(&data).unwrap().unwrap();
        assert!(config.allowed_names.is_empty());
        let mut headers = http::HeaderMap::new();
        headers.insert("x-remote-user", "alice".parse().unwrap());
        headers.append("x-remote-group", "devs".parse().unwrap());
        headers.append("x-remote-group", "ops".parse().unwrap());
        headers.append(
            "X-Remote-Extra-Authentication.kubernetes.io%2fpod-name",
            "p1".parse().unwrap(),
        );
        let user = config.user(&headers).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["devs", "ops", AUTHENTICATED_GROUP]);
        assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], ["p1"]);
        // A connection without a verified proxy certificate is not trusted.
        assert!(!config.trusts(&ConnectionInfo::default()));
        data.insert(
            "requestheader-username-headers".to_string(),
            "[]".to_string(),
        );
        assert!(RequestHeaderConfig::from_configmap(&data).is_err());
        data.insert(
            "requestheader-username-headers".to_string(),
            "not json".to_string(),
        );
        assert!(RequestHeaderConfig::from_configmap(&data).is_err());
        data.remove("requestheader-client-ca-file");
        assert!(RequestHeaderConfig::from_configmap(&data)
            .unwrap()
            .is_none());
        assert_eq!(percent_decode("a%2fb%2Fc%zz%"), "a/b/c%zz%");
    }
}
