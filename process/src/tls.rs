//! Serving certificates: loaded from files (and reloaded when their bytes change) or, in
//! standalone mode without files, generated self-signed at start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

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
    load_pair(cert_path, key_path).map(|(loaded, _)| loaded)
}

/// Reads both files once and parses what was read: the bytes returned are exactly those the
/// key was built from (what the reloader compares later).
fn load_pair(cert_path: &Path, key_path: &Path) -> Result<(CertifiedKey, FileBytes), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| TlsError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    };
    let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
    let parse_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| parse_err(cert_path, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.display().to_string(),
        });
    }
    // Never include key material in messages: only the path and the parser's complaint.
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| parse_err(key_path, &e))?;
    let loaded = certified_key(certs, key, &key_path.display().to_string())?;
    Ok((loaded, (Some(cert_pem), Some(key_pem))))
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

/// The bytes of the certificate and key files (`None`: unreadable).
type FileBytes = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Serves the current certificate; reloads the files when their bytes change.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
    files: Option<(PathBuf, PathBuf)>,
    /// The bytes `current` was loaded from.
    loaded: FileBytes,
}

impl ReloadingCert {
    pub fn fixed(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
            files: None,
            loaded: (None, None),
        })
    }

    pub fn from_files(cert: PathBuf, key: PathBuf) -> Result<Arc<Self>, TlsError> {
        check_key_permissions(&key)?;
        let (current, loaded) = load_pair(&cert, &key)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(current)),
            files: Some((cert, key)),
            loaded,
        }))
    }

    /// Reads the files again every `every`, swapping in a new certificate when their bytes
    /// changed and both load. New TLS connections get it; open ones keep the one they
    /// negotiated. Bytes, not modification times, are compared: a Secret volume's symlink
    /// swap, a copy that keeps the old mtime or a coarse clock are all seen. A bad update
    /// (a half-written pair, a key that does not match) is logged once and the previous
    /// certificate kept until the files change again.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let Some((cert, key)) = self.files.clone() else {
            return std::future::pending().await;
        };
        let read = |p: &Path| std::fs::read(p).ok();
        let mut served: FileBytes = self.loaded.clone();
        let mut refused: Option<FileBytes> = None;
        loop {
            tokio::time::sleep(every).await;
            let now = (read(&cert), read(&key));
            if now == served || refused.as_ref() == Some(&now) {
                continue;
            }
            match check_key_permissions(&key).and_then(|()| load_pair(&cert, &key)) {
                Ok((loaded, bytes)) => {
                    *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
                    served = bytes;
                    refused = None;
                    tracing::info!(cert = %cert.display(), "reloaded serving certificate");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "serving certificate changed but cannot be loaded; keeping the old one");
                    refused = Some(now);
                }
            }
        }
    }

    /// The certificate chain new connections are served now (leaf first).
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .cert
            .clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        use std::os::unix::fs::PermissionsExt;
        let generated = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, generated.cert.pem()).unwrap();
        std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        (cert, key, generated.cert.der().to_vec())
    }

    async fn wait_for(cert: &ReloadingCert, der: &[u8]) -> bool {
        for _ in 0..200 {
            if cert.current_chain()[0].as_ref() == der {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn changed_files_are_served_and_a_bad_pair_keeps_the_old_one() {
        let dir = std::env::temp_dir().join(format!("tls-reload-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert_path, key_path, first) = write_pair(&dir, "first.example");
        let cert = ReloadingCert::from_files(cert_path.clone(), key_path.clone()).unwrap();
        let watcher = tokio::spawn(cert.clone().watch(Duration::from_millis(10)));
        assert_eq!(cert.current_chain()[0].as_ref(), first.as_slice());

        let (_, _, second) = write_pair(&dir, "second.example");
        assert!(wait_for(&cert, &second).await, "the new pair is served");

        // Half a rotation: a new certificate beside the old key does not load.
        let third = rcgen::generate_simple_self_signed(vec!["third.example".into()]).unwrap();
        std::fs::write(&cert_path, third.cert.pem()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(cert.current_chain()[0].as_ref(), second.as_slice());
        // The key arrives: the pair loads.
        std::fs::write(&key_path, third.signing_key.serialize_pem()).unwrap();
        assert!(
            wait_for(&cert, third.cert.der()).await,
            "the completed pair is served"
        );
        watcher.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
