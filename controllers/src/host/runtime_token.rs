//! The runtime token of a Host (the Host Context Controller document's per-Host runtime-token
//! Secret): an RS256 host token for the Host API, kept by the Host operator in a Secret of the
//! Host's namespace and mounted into the host pod. It names the Host by namespace, name and
//! UID, so a Host deleted and re-created gets a new token and the old one is refused by the
//! Host API (its `host_uid` no longer matches). It is re-minted `refresh_before` ahead of its
//! expiry; the kubelet updates the mounted file in place.
//!
//! The signer is configured once, at startup, and fails closed: a key that is not an RSA
//! private key, a lifetime the Host API in this process would refuse, or a refresh window not
//! shorter than the lifetime stops startup naming the flag.

use std::path::Path;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

/// The file the token is mounted as, inside the host container.
pub const MOUNT: &str = "/var/run/secrets/mcp-host-runtime";
/// The key of the token in the Secret (and the file name under [`MOUNT`]).
pub const KEY: &str = "token";
/// Annotation: the UID of the Host the token names.
pub const HOST_UID_ANNOTATION: &str = "mcp-runtime.dev/host-uid";
/// Annotation: when the token expires (RFC 3339).
pub const EXPIRES_ANNOTATION: &str = "mcp-runtime.dev/token-expires-at";
/// The one capability the Host API accepts.
pub const CAPABILITY: &str = "mcp:credential:read";

/// Why the signer cannot be configured (startup stops, naming the flag).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignerError {
    #[error("--host-runtime-token-key-file {0}: cannot read it: {1}")]
    Unreadable(String, String),
    #[error("--host-runtime-token-key-file {0}: not an RSA private key in PEM (PKCS#8 or PKCS#1)")]
    NotRsaPrivate(String),
    #[error("--host-runtime-token-key-file needs the Host API on (--host-api-port, --host-token-issuer, --host-token-audience): its tokens carry the claims that API checks")]
    NoClaims,
    #[error("--host-runtime-token-refresh-before ({refresh:?}) must be shorter than --host-runtime-token-ttl ({ttl:?})")]
    RefreshNotShorter { refresh: Duration, ttl: Duration },
    #[error("--host-runtime-token-ttl ({ttl:?}) is longer than the Host API's --host-token-max-ttl ({max:?}): every runtime token would be refused")]
    LongerThanApiAccepts { ttl: Duration, max: Duration },
}

/// Mints runtime tokens.
#[derive(Clone)]
pub struct Signer {
    key: EncodingKey,
    issuer: String,
    audience: Vec<String>,
    pub ttl: Duration,
    pub refresh_before: Duration,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Loads the key and checks the settings. `api_max_ttl` is the Host API's
    /// `--host-token-max-ttl` when the API is served by this process.
    pub fn load(
        key_file: &Path,
        issuer: Option<&str>,
        audience: &[String],
        ttl: Duration,
        refresh_before: Duration,
        api_max_ttl: Option<Duration>,
    ) -> Result<Self, SignerError> {
        let shown = key_file.display().to_string();
        let pem = std::fs::read(key_file)
            .map_err(|e| SignerError::Unreadable(shown.clone(), e.kind().to_string()))?;
        let text = String::from_utf8_lossy(&pem);
        if !text.contains("PRIVATE KEY-----") {
            return Err(SignerError::NotRsaPrivate(shown));
        }
        let key = EncodingKey::from_rsa_pem(&pem)
            .map_err(|_| SignerError::NotRsaPrivate(shown.clone()))?;
        let issuer = issuer
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .ok_or(SignerError::NoClaims)?;
        if audience.is_empty() {
            return Err(SignerError::NoClaims);
        }
        if refresh_before >= ttl {
            return Err(SignerError::RefreshNotShorter {
                refresh: refresh_before,
                ttl,
            });
        }
        if let Some(max) = api_max_ttl.filter(|max| ttl > *max) {
            return Err(SignerError::LongerThanApiAccepts { ttl, max });
        }
        let signer = Signer {
            key,
            issuer: issuer.to_string(),
            audience: audience.to_vec(),
            ttl,
            refresh_before,
        };
        // A key jsonwebtoken accepts but ring cannot sign with fails here, not per Host.
        signer
            .mint(
                "startup-check",
                "startup-check",
                "startup-check",
                Timestamp::now(),
            )
            .map_err(|_| SignerError::NotRsaPrivate(shown))?;
        Ok(signer)
    }

    /// A token for Host `namespace/name` with `uid`, and when it expires.
    pub fn mint(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        now: Timestamp,
    ) -> Result<(String, Timestamp), jsonwebtoken::errors::Error> {
        let iat = now.as_second();
        let exp = iat + self.ttl.as_secs() as i64;
        let claims = json!({
            "iss": self.issuer,
            "aud": self.audience,
            "iat": iat,
            "exp": exp,
            "hostRefs": [{"namespace": namespace, "name": name}],
            "host_uid": uid,
            "capabilities": [CAPABILITY],
        });
        let token = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)?;
        let expires = Timestamp::from_second(exp).unwrap_or(now);
        Ok((token, expires))
    }

    /// Whether the live Secret's token (its annotations) must be replaced: absent, for another
    /// Host UID (the Host was re-created), unreadable, or within `refresh_before` of expiry.
    pub fn due(
        &self,
        live: Option<&std::collections::BTreeMap<String, String>>,
        host_uid: &str,
        now: Timestamp,
    ) -> bool {
        let Some(annotations) = live else {
            return true;
        };
        if annotations.get(HOST_UID_ANNOTATION).map(String::as_str) != Some(host_uid) {
            return true;
        }
        match annotations
            .get(EXPIRES_ANNOTATION)
            .and_then(|e| e.parse::<Timestamp>().ok())
        {
            Some(expires) => {
                expires.as_second() - (self.refresh_before.as_secs() as i64) <= now.as_second()
            }
            None => true,
        }
    }

    /// When the token expiring at `expires` is due again.
    pub fn next_refresh(&self, expires: Timestamp, now: Timestamp) -> Duration {
        let left = expires.as_second() - self.refresh_before.as_secs() as i64 - now.as_second();
        Duration::from_secs(left.max(1) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A 2048-bit RSA key made for these tests only.
    fn key_file(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("key.pem");
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&path)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        path
    }

    fn tempdir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "runtime-token-{}-{}",
            std::process::id(),
            Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn minted_tokens_carry_exactly_the_claims_the_host_api_checks() {
        let dir = tempdir();
        let key = key_file(&dir);
        let aud = vec!["mcp-access-host-api".to_string()];
        let signer = Signer::load(
            &key,
            Some("issuer"),
            &aud,
            Duration::from_secs(3600),
            Duration::from_secs(900),
            Some(Duration::from_secs(3600)),
        )
        .unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let (token, expires) = signer.mint("team", "dev", "uid-1", now).unwrap();
        assert_eq!(expires.as_second(), 1_800_003_600);
        let payload = token.split('.').nth(1).unwrap();
        use base64::Engine;
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            claims,
            json!({"iss": "issuer", "aud": ["mcp-access-host-api"], "iat": 1_800_000_000i64,
                   "exp": 1_800_003_600i64, "hostRefs": [{"namespace": "team", "name": "dev"}],
                   "host_uid": "uid-1", "capabilities": ["mcp:credential:read"]})
        );
        let header = token.split('.').next().unwrap();
        let header: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(header)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], "RS256");

        // Due: absent, another uid, within the refresh window; not before.
        let live = |uid: &str, expires: i64| {
            BTreeMap::from([
                (HOST_UID_ANNOTATION.to_string(), uid.to_string()),
                (
                    EXPIRES_ANNOTATION.to_string(),
                    Timestamp::from_second(expires).unwrap().to_string(),
                ),
            ])
        };
        assert!(signer.due(None, "uid-1", now));
        assert!(signer.due(Some(&live("uid-0", 1_800_003_600)), "uid-1", now));
        assert!(!signer.due(Some(&live("uid-1", 1_800_003_600)), "uid-1", now));
        assert!(signer.due(Some(&live("uid-1", 1_800_000_900)), "uid-1", now));
        assert!(!signer.due(Some(&live("uid-1", 1_800_000_901)), "uid-1", now));
        assert!(signer.due(Some(&BTreeMap::new()), "uid-1", now));
        assert_eq!(signer.next_refresh(expires, now), Duration::from_secs(2700));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bad_settings_stop_startup() {
        let dir = tempdir();
        let key = key_file(&dir);
        let aud = vec!["a".to_string()];
        let hour = Duration::from_secs(3600);
        let quarter = Duration::from_secs(900);
        let load = |file: &Path, issuer: Option<&str>, aud: &[String], ttl, refresh, max| {
            Signer::load(file, issuer, aud, ttl, refresh, max).map(|_| ())
        };
        assert!(matches!(
            load(
                &dir.join("absent.pem"),
                Some("i"),
                &aud,
                hour,
                quarter,
                None
            ),
            Err(SignerError::Unreadable(..))
        ));
        let public = dir.join("pub.pem");
        let out = std::process::Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&key)
            .arg("-out")
            .arg(&public)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(matches!(
            load(&public, Some("i"), &aud, hour, quarter, None),
            Err(SignerError::NotRsaPrivate(_))
        ));
        let ec = dir.join("ec.pem");
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
            ])
            .arg(&ec)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(matches!(
            load(&ec, Some("i"), &aud, hour, quarter, None),
            Err(SignerError::NotRsaPrivate(_))
        ));
        assert_eq!(
            load(&key, None, &aud, hour, quarter, None),
            Err(SignerError::NoClaims)
        );
        assert_eq!(
            load(&key, Some("i"), &[], hour, quarter, None),
            Err(SignerError::NoClaims)
        );
        assert!(matches!(
            load(&key, Some("i"), &aud, quarter, quarter, None),
            Err(SignerError::RefreshNotShorter { .. })
        ));
        assert!(matches!(
            load(
                &key,
                Some("i"),
                &aud,
                hour,
                quarter,
                Some(Duration::from_secs(600))
            ),
            Err(SignerError::LongerThanApiAccepts { .. })
        ));
        assert!(load(&key, Some("i"), &aud, hour, quarter, Some(hour)).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
