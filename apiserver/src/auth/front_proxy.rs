//! Front-proxy authentication: request headers from a verified client certificate.
//!
//! kube-apiserver proxies a request with the user in `X-Remote-*` headers over a connection
//! whose client certificate chains to the request-header CA. Those headers are read only
//! when the certificate verifies against that CA and carries an allowed name (DESIGN §4);
//! the ConfigMap that publishes CA, names and headers is read at startup and followed.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{ConnectionInfo, UserInfo, AUTHENTICATED_GROUP};

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
    /// Chains found trusted under this configuration, so that a connection's every request
    /// does not verify its chain again (an RSA signature check each). A new configuration
    /// starts with none.
    trusted: Arc<Mutex<Vec<TrustedChain>>>,
}

/// Chains remembered as trusted at most: kube-apiserver presents one front-proxy certificate
/// (two across a rotation).
const TRUSTED_CHAINS: usize = 4;

/// A chain found trusted, and until when that holds.
struct TrustedChain {
    /// The leaf and intermediates exactly as presented.
    certificates: Vec<Vec<u8>>,
    /// The earliest `notAfter` among them: the verdict is not used from then on.
    until: UnixTime,
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
            trusted: Arc::default(),
        }))
    }

    /// True when any certificate the request-header CA signed may act as the front proxy
    /// (kube's meaning of an empty `requestheader-allowed-names`).
    pub fn allows_any_name(&self) -> bool {
        self.allowed_names.is_empty()
    }

    /// Whether the connection's client certificate is a trusted front proxy. A chain found
    /// trusted before under this configuration is trusted until its first certificate
    /// expires without being verified again; a chain found untrusted is never remembered.
    fn trusts(&self, connection: &ConnectionInfo) -> bool {
        self.trusts_at(connection, UnixTime::now())
    }

    fn trusts_at(&self, connection: &ConnectionInfo, now: UnixTime) -> bool {
        let chain = &connection.peer_certificates;
        if chain.is_empty() {
            return false;
        }
        let mut trusted = self.trusted.lock().unwrap_or_else(|p| p.into_inner());
        trusted.retain(|t| t.until.as_secs() > now.as_secs());
        if trusted.iter().any(|t| t.certificates == *chain) {
            return true;
        }
        drop(trusted);
        if !self.verify(chain, now) {
            return false;
        }
        // Remembered only when every certificate's validity can be read: the verifier
        // checked those same dates, so this only fails for a chain it would refuse.
        if let Some(until) = chain.iter().map(|c| not_after(c)).min().flatten() {
            let mut trusted = self.trusted.lock().unwrap_or_else(|p| p.into_inner());
            if trusted.len() >= TRUSTED_CHAINS {
                trusted.remove(0);
            }
            trusted.push(TrustedChain {
                certificates: chain.clone(),
                until,
            });
        }
        true
    }

    /// Verifies `chain` (leaf first) against the request-header CA and the allowed names.
    fn verify(&self, chain: &[Vec<u8>], now: UnixTime) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        let leaf = CertificateDer::from(leaf.as_slice());
        let intermediates: Vec<CertificateDer<'_>> = intermediates
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        if self
            .verifier
            .verify_client_cert(&leaf, &intermediates, now)
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

/// The common name of a DER certificate's subject, as kube-apiserver reads it: Go's
/// `pkix.Name.FillFromRDNSequence` assigns `CommonName` for every string-valued CN attribute
/// in order, so when a subject carries several the *last* one counts. Taking another one
/// would let a certificate named `CN=front-proxy-client, CN=other` be judged differently
/// here and in kube.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .filter_map(|attr| attr.as_str().ok())
        .last()?
        .to_string();
    Some(cn)
}

/// A DER certificate's `notAfter`, if it parses.
fn not_after(der: &[u8]) -> Option<UnixTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let secs = cert.validity().not_after.timestamp();
    Some(UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(secs).ok()?,
    )))
}

/// An empty allowed-names list lets any certificate the request-header CA signed assert any
/// user. kube accepts that, so by default it is only a loud warning (at startup and on every
/// ConfigMap change); with `require_allowed_names` the configuration is refused.
fn check_allowed_names(
    config: &RequestHeaderConfig,
    options: &DelegatedOptions,
) -> Result<(), AuthConfigError> {
    if !config.allows_any_name() {
        return Ok(());
    }
    if options.require_allowed_names {
        return Err(AuthConfigError::Invalid(
            "requestheader-allowed-names is empty (any certificate signed by the request-header CA could assert any user) and --requestheader-require-allowed-names is set".into(),
        ));
    }
    tracing::warn!(
        "SECURITY: requestheader-allowed-names is empty: ANY client certificate signed by the request-header CA may act as the front proxy and assert any user in X-Remote-* headers; set --requestheader-allowed-names on kube-apiserver, and --requestheader-require-allowed-names here to refuse such a configuration"
    );
    Ok(())
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

/// Policy of delegated authentication.
#[derive(Clone, Debug, Default)]
pub struct DelegatedOptions {
    /// Refuse a request-header configuration whose allowed-names list is empty (which means
    /// "any certificate the request-header CA signed") instead of only warning about it.
    pub require_allowed_names: bool,
}

/// The current request-header configuration and the handshake verifier that follows it.
pub struct FrontProxy {
    request_header: RwLock<Option<RequestHeaderConfig>>,
    handshake: Arc<SwappableClientVerifier>,
    options: DelegatedOptions,
}

impl FrontProxy {
    /// Trusts no front proxy until a ConfigMap is applied.
    pub fn new(options: DelegatedOptions) -> Self {
        Self {
            request_header: RwLock::new(None),
            handshake: SwappableClientVerifier::new(),
            options,
        }
    }

    /// The verifier to install in the TLS configuration; it follows every applied ConfigMap.
    pub fn handshake(&self) -> Arc<SwappableClientVerifier> {
        self.handshake.clone()
    }

    /// Reads the ConfigMap once and applies it (startup fails if it cannot, or if it is
    /// refused by the options).
    pub async fn load(&self, client: kube::Client) -> Result<(), AuthConfigError> {
        let configmaps: Api<ConfigMap> = Api::namespaced(client, AUTH_CONFIGMAP.0);
        let cm = configmaps
            .get(AUTH_CONFIGMAP.1)
            .await
            .map_err(|e| AuthConfigError::Unavailable(e.to_string()))?;
        self.apply(&cm)
    }

    fn apply(&self, cm: &ConfigMap) -> Result<(), AuthConfigError> {
        let data = cm.data.clone().unwrap_or_default();
        let config = RequestHeaderConfig::from_configmap(&data)?;
        if let Some(config) = &config {
            check_allowed_names(config, &self.options)?;
        }
        self.handshake
            .set(config.as_ref().map(|c| c.verifier.clone()));
        *self
            .request_header
            .write()
            .unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// Follows the ConfigMap and applies every valid change; an invalid one is logged and the
    /// previous configuration kept. Returns only if the watch stream ends.
    pub async fn follow_configmap(&self, client: kube::Client) {
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

    /// The user a trusted front proxy asserts on this connection, if any. Headers from anyone
    /// else are never read.
    pub fn user(
        &self,
        request: &http::request::Parts,
        connection: &ConnectionInfo,
    ) -> Option<UserInfo> {
        let config = self
            .request_header
            .read()
            .unwrap_or_else(|p| p.into_inner());
        config
            .as_ref()
            .filter(|c| c.trusts(connection))
            .and_then(|c| c.user(&request.headers))
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

    /// A request-header CA, as `hack/cluster.sh` makes one.
    fn request_header_ca() -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "front-proxy-ca");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        (rcgen::Issuer::new(params, key), pem)
    }

    /// A client certificate whose subject carries two CN attributes, `first` then `last`
    /// (rcgen keeps one value per attribute type, so the second one goes in under the CN
    /// OID spelled as a custom type).
    fn two_cn_client_cert(
        issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
        first: &str,
        last: &str,
    ) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, first);
        params
            .distinguished_name
            .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 3]), last);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let der = params.signed_by(&key, issuer).unwrap().der().to_vec();
        // The test means nothing unless the subject really carries both, in this order.
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cns: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cns, [first, last]);
        der
    }

    /// A request-header ConfigMap's data: `ca_pem`, `X-Remote-User`, `allowed_names`.
    fn request_header_data(
        ca_pem: &str,
        allowed_names: &str,
    ) -> std::collections::BTreeMap<String, String> {
        [
            ("requestheader-client-ca-file", ca_pem),
            ("requestheader-username-headers", "[\"X-Remote-User\"]"),
            ("requestheader-allowed-names", allowed_names),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn config_with(ca_pem: &str, allowed_names: &str) -> RequestHeaderConfig {
        RequestHeaderConfig::from_configmap(&request_header_data(ca_pem, allowed_names))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_last_common_name_counts_as_in_go_pkix() {
        let (ca, _) = request_header_ca();
        let der = two_cn_client_cert(&ca, "front-proxy-client", "intruder");
        assert_eq!(common_name(&der).as_deref(), Some("intruder"));
        let der = two_cn_client_cert(&ca, "intruder", "front-proxy-client");
        assert_eq!(common_name(&der).as_deref(), Some("front-proxy-client"));
    }

    #[test]
    fn allowed_names_are_matched_against_the_cn_kube_sees() {
        let (ca, ca_pem) = request_header_ca();
        let config = config_with(&ca_pem, "[\"front-proxy-client\"]");
        let connection = |der: Vec<u8>| ConnectionInfo {
            peer_certificates: vec![der],
        };
        // kube-apiserver reads CN=intruder here: not an allowed proxy.
        let smuggled = two_cn_client_cert(&ca, "front-proxy-client", "intruder");
        assert!(!config.trusts(&connection(smuggled)));
        // kube-apiserver reads CN=front-proxy-client here: the same verdict as kube's.
        let allowed = two_cn_client_cert(&ca, "intruder", "front-proxy-client");
        assert!(config.trusts(&connection(allowed)));
        // A certificate from another CA is never trusted, whatever its name.
        let (other_ca, _) = request_header_ca();
        let foreign = two_cn_client_cert(&other_ca, "intruder", "front-proxy-client");
        assert!(!config.trusts(&connection(foreign)));
    }

    #[test]
    fn empty_allowed_names_warn_or_are_refused_on_request() {
        let (ca, ca_pem) = request_header_ca();
        let any = config_with(&ca_pem, "[]");
        assert!(any.allows_any_name());
        // Empty means any name signed by the CA, as in kube.
        let der = two_cn_client_cert(&ca, "anyone", "at-all");
        assert!(any.trusts(&ConnectionInfo {
            peer_certificates: vec![der],
        }));
        assert!(check_allowed_names(&any, &DelegatedOptions::default()).is_ok());
        let strict = DelegatedOptions {
            require_allowed_names: true,
        };
        let refused = check_allowed_names(&any, &strict).unwrap_err();
        assert!(refused
            .to_string()
            .contains("requestheader-allowed-names is empty"));
        let named = config_with(&ca_pem, "[\"front-proxy-client\"]");
        assert!(check_allowed_names(&named, &strict).is_ok());
    }

    /// A client certificate named `cn` signed by `issuer`, valid until `not_after`.
    fn client_cert_until(
        issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
        cn: &str,
        not_after: std::time::SystemTime,
    ) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = (std::time::SystemTime::now() - Duration::from_secs(60)).into();
        params.not_after = not_after.into();
        let key = rcgen::KeyPair::generate().unwrap();
        params.signed_by(&key, issuer).unwrap().der().to_vec()
    }

    fn remembered(config: &RequestHeaderConfig) -> usize {
        config.trusted.lock().unwrap().len()
    }

    #[test]
    fn a_trusted_chain_is_remembered_until_it_expires_and_a_refused_one_never() {
        let (ca, ca_pem) = request_header_ca();
        let config = config_with(&ca_pem, "[\"front-proxy-client\"]");
        let expires = std::time::SystemTime::now() + Duration::from_secs(3600);
        let proxy = ConnectionInfo {
            peer_certificates: vec![client_cert_until(&ca, "front-proxy-client", expires)],
        };
        assert!(config.trusts(&proxy));
        assert!(config.trusts(&proxy));
        assert_eq!(remembered(&config), 1, "one chain, verified once");

        // Refusals are not remembered: another CA's chain, a name not allowed.
        let (other_ca, _) = request_header_ca();
        let foreign = ConnectionInfo {
            peer_certificates: vec![client_cert_until(&other_ca, "front-proxy-client", expires)],
        };
        let unnamed = ConnectionInfo {
            peer_certificates: vec![client_cert_until(&ca, "intruder", expires)],
        };
        for _ in 0..2 {
            assert!(!config.trusts(&foreign));
            assert!(!config.trusts(&unnamed));
        }
        assert_eq!(remembered(&config), 1);

        // Past its notAfter the remembered verdict is dropped and the verifier refuses it.
        let later = UnixTime::since_unix_epoch(
            expires
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .saturating_add(Duration::from_secs(1)),
        );
        assert!(!config.trusts_at(&proxy, later));
        assert_eq!(remembered(&config), 0);

        // A certificate of the same bytes but one changed is another chain.
        let mut tampered = proxy.peer_certificates[0].clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(!config.trusts(&ConnectionInfo {
            peer_certificates: vec![tampered],
        }));
        assert!(config.trusts(&proxy));
        assert_eq!(remembered(&config), 1);
    }

    #[test]
    fn a_new_request_header_ca_forgets_every_remembered_chain() {
        let configmap = |ca_pem: &str| ConfigMap {
            data: Some(request_header_data(ca_pem, "[\"front-proxy-client\"]")),
            ..Default::default()
        };
        let (ca, ca_pem) = request_header_ca();
        let (_, rotated_pem) = request_header_ca();
        let front = FrontProxy::new(DelegatedOptions::default());
        front.apply(&configmap(&ca_pem)).unwrap();
        let expires = std::time::SystemTime::now() + Duration::from_secs(3600);
        let connection = ConnectionInfo {
            peer_certificates: vec![client_cert_until(&ca, "front-proxy-client", expires)],
        };
        let request = http::Request::builder()
            .header("X-Remote-User", "alice")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(front.user(&request, &connection).unwrap().name, "alice");
        assert_eq!(front.user(&request, &connection).unwrap().name, "alice");
        // The CA rotates to one that did not sign the proxy's certificate.
        front.apply(&configmap(&rotated_pem)).unwrap();
        assert!(front.user(&request, &connection).is_none());
    }
}
