//! The HTTPS client of the session feed: kube-rs's stack, trusting only the configured CA, with
//! a layer that presents the token file's current content on every request.

use std::time::Duration;

use http::header::{HeaderValue, AUTHORIZATION};
use kube::client::{Body, ClientBuilder};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tower::util::MapRequestLayer;

use crate::config::CacheConfig;
use crate::error::CacheError;
use crate::token::TokenFile;

/// Validates the security settings and builds the client. Fails closed: plain HTTP, an
/// unreadable or empty CA file, or a missing or empty token file stop the caller.
pub(crate) fn build(config: &CacheConfig) -> Result<kube::Client, CacheError> {
    let url: http::Uri = config
        .sync_url
        .parse()
        .map_err(|e: http::uri::InvalidUri| {
            CacheError::InvalidUrl(config.sync_url.clone(), e.to_string())
        })?;
    if url.scheme_str() != Some("https") {
        return Err(CacheError::InsecureUrl(config.sync_url.clone()));
    }
    if url.host().is_none() {
        return Err(CacheError::InvalidUrl(
            config.sync_url.clone(),
            "no host".into(),
        ));
    }
    let pem = std::fs::read(&config.ca_file).map_err(|source| CacheError::CaFile {
        path: config.ca_file.clone(),
        source,
    })?;
    let roots: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .map(|c| c.as_ref().to_vec())
        .collect();
    if roots.is_empty() {
        return Err(CacheError::CaEmpty(config.ca_file.clone()));
    }
    let token = TokenFile::open(&config.token_file)?;

    // kube-rs's TLS setup uses the process-wide rustls provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut kube_config = kube::Config::new(url);
    kube_config.root_cert = Some(roots);
    kube_config.connect_timeout = Some(Duration::from_secs(5));
    // A watch is ended by the server at `timeoutSeconds`; reads may wait that long plus slack.
    kube_config.read_timeout = Some(config.watch_timeout + Duration::from_secs(30));
    let builder = ClientBuilder::try_from(kube_config).map_err(CacheError::Client)?;
    let authorize = MapRequestLayer::new(move |mut req: http::Request<Body>| {
        match token.read() {
            Ok(t) => match HeaderValue::from_str(&format!("Bearer {t}")) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    req.headers_mut().insert(AUTHORIZATION, value);
                }
                Err(_) => tracing::warn!(
                    path = %token.path().display(),
                    "the token file holds characters a header cannot carry; sending no token"
                ),
            },
            // Sent without credentials: the server's 401 then drops cached authority.
            Err(e) => tracing::warn!(error = %e, "cannot read the token; sending no token"),
        }
        req
    });
    Ok(builder.with_layer(&authorize).build())
}
