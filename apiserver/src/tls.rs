//! Serving certificates: loaded from files (and reloaded when they change) or, in
//! standalone mode without files, generated self-signed at start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A serving certificate problem. Startup fails on it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: String },
    #[error("the private key in {path} is not usable: {message}")]
    Key { path: String, message: String },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("the serving key {path} is readable by others (mode {mode:04o}): make it readable by its owner (and group) only, e.g. chmod 600")]
    KeyPermissions { path: String, mode: u32 },
}

/// Refuses a serving key anyone on the host can read. Group read stays allowed: it is how
/// Kubernetes lets a non-root container read a Secret volume (`fsGroup`, mode 0440).
fn check_key_permissions(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| TlsError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o007 != 0 {
        return Err(TlsError::KeyPermissions {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads a certificate chain and key from PEM files.
pub fn load_certified_key(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, TlsError> {
    let read_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| read_err(cert_path, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(cert_path, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.display().to_string(),
        });
    }
    // Never include key material in messages: only the path and the parser's complaint.
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| read_err(key_path, &e))?;
    certified_key(certs, key, &key_path.display().to_string())
}

fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    key_name: &str,
) -> Result<CertifiedKey, TlsError> {
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: key_name.to_string(),
            message: e.to_string(),
        })?;
    let certified = CertifiedKey::new(certs, signing_key);
    certified.keys_match().map_err(|e| TlsError::Key {
        path: key_name.to_string(),
        message: format!("does not match the certificate: {e}"),
    })?;
    Ok(certified)
}

/// A self-signed serving certificate for `hosts` (DNS names or IP addresses).
/// Returns the key and the certificate PEM (for clients to trust).
pub fn self_signed(hosts: &[String]) -> Result<(CertifiedKey, String), TlsError> {
    let generated = rcgen::generate_simple_self_signed(hosts.to_vec())
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let cert_pem = generated.cert.pem();
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let certified = certified_key(vec![generated.cert.der().clone()], key, "generated key")?;
    Ok((certified, cert_pem))
}

/// Serves the current certificate; reloads the files when their modification time changes.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
    files: Option<(PathBuf, PathBuf)>,
}

impl ReloadingCert {
    pub fn fixed(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
            files: None,
        })
    }

    pub fn from_files(cert: PathBuf, key: PathBuf) -> Result<Arc<Self>, TlsError> {
        check_key_permissions(&key)?;
        let loaded = load_certified_key(&cert, &key)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(loaded)),
            files: Some((cert, key)),
        }))
    }

    /// Watches the files, swapping in a new certificate when both load. A bad update is
    /// logged and the previous certificate kept.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let Some((cert, key)) = self.files.clone() else {
            return std::future::pending().await;
        };
        let stamp = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut last: (Option<SystemTime>, Option<SystemTime>) = (stamp(&cert), stamp(&key));
        loop {
            tokio::time::sleep(every).await;
            let now = (stamp(&cert), stamp(&key));
            if now == last {
                continue;
            }
            match load_certified_key(&cert, &key) {
                Ok(loaded) => {
                    *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
                    last = now;
                    tracing::info!(cert = %cert.display(), "reloaded serving certificate");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "serving certificate changed but cannot be loaded; keeping the old one")
                }
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// A rustls server configuration serving `cert`, with `client_verifier` deciding on client
/// certificates (none requested when `None`).
pub fn server_config(
    cert: Arc<ReloadingCert>,
    client_verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
