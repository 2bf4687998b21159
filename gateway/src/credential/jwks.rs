//! The token issuer's keys: JWK Set parsing (EC P-256, ES256 only) and [`JwksSource`], which
//! takes the JWK Set and the issuer from the sync listener the gateway already trusts (same
//! CA, same token file as its session cache), keeps them fresh and honours rotation.
//!
//! Contract:
//! - refreshed every 60 s (every few seconds until the first success);
//! - a token with an unknown `kid` may force a refresh, at most once per 5 s however many such
//!   tokens arrive (a flood of random kids costs one request per 5 s);
//! - a failed refresh keeps the last good set: keys are not dropped by an outage.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::DecodingKey;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::error::CacheError;

/// Path of the JWK Set on the sync listener.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// Path of the discovery document (the issuer) on the sync listener.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Regular refresh period.
pub const REFRESH_EVERY: Duration = Duration::from_secs(60);
/// Least time between two refreshes forced by unknown kids.
pub const UNKNOWN_KID_INTERVAL: Duration = Duration::from_secs(5);
/// Largest JWK Set or discovery document read.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// One fetch may take this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Verification keys by `kid`.
#[derive(Clone, Default)]
pub struct Keys {
    by_kid: BTreeMap<String, DecodingKey>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("kids", &self.kids()).finish()
    }
}

impl Keys {
    /// The key with this `kid`.
    pub fn get(&self, kid: &str) -> Option<&DecodingKey> {
        self.by_kid.get(kid)
    }

    /// The kids held, sorted.
    pub fn kids(&self) -> Vec<String> {
        self.by_kid.keys().cloned().collect()
    }

    /// No key.
    pub fn is_empty(&self) -> bool {
        self.by_kid.is_empty()
    }

    /// A set of one P-256 public key given as its 32-byte coordinates (tests, tools).
    pub fn from_p256(kid: &str, x: &[u8; 32], y: &[u8; 32]) -> Result<Self, JwksError> {
        let key =
            DecodingKey::from_ec_components(&URL_SAFE_NO_PAD.encode(x), &URL_SAFE_NO_PAD.encode(y))
                .map_err(|e| JwksError::Malformed(format!("key {kid:?}: {e}")))?;
        Ok(Self {
            by_kid: BTreeMap::from([(kid.to_string(), key)]),
        })
    }
}

/// Why a JWK Set or discovery document was not taken.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("malformed document: {0}")]
    Malformed(String),
    #[error("fetching {path} failed: {error}")]
    Fetch { path: &'static str, error: String },
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<RawKey>,
}

#[derive(Deserialize)]
struct RawKey {
    kty: String,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(rename = "use", default)]
    use_: Option<String>,
}

fn coordinate(kid: &str, name: &str, value: Option<&str>) -> Result<[u8; 32], JwksError> {
    let raw = value.ok_or_else(|| JwksError::Malformed(format!("key {kid:?} has no {name}")))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(raw)
        .map_err(|_| JwksError::Malformed(format!("key {kid:?}: {name} is not base64url")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| JwksError::Malformed(format!("key {kid:?}: {name} is not 32 bytes")))
}

/// Parses a JWK Set. Keys other than EC P-256 for signatures (another `kty`, `crv`, an `alg`
/// other than ES256, a `use` other than `sig`) are skipped: they can verify nothing here. An
/// EC P-256 key without a kid, with bad coordinates, or a kid given twice refuses the whole
/// set, so a half-understood set never replaces a good one.
pub fn parse_jwks(body: &[u8]) -> Result<Keys, JwksError> {
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(JwksError::Malformed("the JWK Set is too large".into()));
    }
    let set: RawSet =
        serde_json::from_slice(body).map_err(|e| JwksError::Malformed(format!("JWK Set: {e}")))?;
    let mut by_kid = BTreeMap::new();
    for key in set.keys {
        let usable = key.kty == "EC"
            && key.crv.as_deref() == Some("P-256")
            && key.alg.as_deref().is_none_or(|a| a == "ES256")
            && key.use_.as_deref().is_none_or(|u| u == "sig");
        if !usable {
            continue;
        }
        let kid = key
            .kid
            .filter(|k| !k.is_empty())
            .ok_or_else(|| JwksError::Malformed("an EC key has no kid".into()))?;
        let x = coordinate(&kid, "x", key.x.as_deref())?;
        let y = coordinate(&kid, "y", key.y.as_deref())?;
        let decoding =
            DecodingKey::from_ec_components(&URL_SAFE_NO_PAD.encode(x), &URL_SAFE_NO_PAD.encode(y))
                .map_err(|e| JwksError::Malformed(format!("key {kid:?}: {e}")))?;
        if by_kid.insert(kid.clone(), decoding).is_some() {
            return Err(JwksError::Malformed(format!("kid {kid:?} appears twice")));
        }
    }
    Ok(Keys { by_kid })
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

/// Reads the issuer from an OpenID discovery document.
pub fn parse_issuer(body: &[u8]) -> Result<String, JwksError> {
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(JwksError::Malformed(
            "the discovery document is too large".into(),
        ));
    }
    let doc: Discovery = serde_json::from_slice(body)
        .map_err(|e| JwksError::Malformed(format!("discovery document: {e}")))?;
    if doc.issuer.trim().is_empty() || doc.issuer.trim() != doc.issuer {
        return Err(JwksError::Malformed("the issuer is empty or padded".into()));
    }
    Ok(doc.issuer)
}

/// One good JWK Set and the issuer that goes with it.
#[derive(Debug)]
pub struct KeySet {
    pub keys: Keys,
    pub issuer: String,
    /// When it was fetched (wall clock, for `/config/status`).
    pub fetched_at: SystemTime,
}

/// Where the fetches go: the sync listener, or a fixed set (tests).
enum Origin {
    Sync(kube::Client),
    Fixed,
}

/// The keys and issuer of the token issuer, kept fresh from the sync listener.
pub struct JwksSource {
    origin: Origin,
    current: RwLock<Option<Arc<KeySet>>>,
    /// Serializes refreshes; holds when the last one forced by an unknown kid ran.
    refreshing: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksSource")
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

impl JwksSource {
    /// A source on the sync listener of `config`, with its CA and token file. Fails closed
    /// like the session cache (plain HTTP, unreadable CA or token). Nothing is fetched until
    /// [`JwksSource::refresh`] or [`JwksSource::run`].
    pub fn new(config: &CacheConfig) -> Result<Self, CacheError> {
        Ok(Self {
            origin: Origin::Sync(crate::client::build(config)?),
            current: RwLock::new(None),
            refreshing: Mutex::new(None),
        })
    }

    /// A source that always holds `keys` and `issuer` and never fetches (tests).
    pub fn fixed(keys: Keys, issuer: impl Into<String>) -> Self {
        Self {
            origin: Origin::Fixed,
            current: RwLock::new(Some(Arc::new(KeySet {
                keys,
                issuer: issuer.into(),
                fetched_at: SystemTime::now(),
            }))),
            refreshing: Mutex::new(None),
        }
    }

    /// Replaces the set (a rotation, in tests).
    #[cfg(test)]
    pub(crate) fn replace_for_tests(&self, keys: Keys, issuer: impl Into<String>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(KeySet {
            keys,
            issuer: issuer.into(),
            fetched_at: SystemTime::now(),
        }));
    }

    /// The last good set, if any was ever fetched.
    pub fn current(&self) -> Option<Arc<KeySet>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn fetch(client: &kube::Client, path: &'static str) -> Result<Vec<u8>, JwksError> {
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(|e| JwksError::Fetch {
                path,
                error: e.to_string(),
            })?;
        match tokio::time::timeout(FETCH_TIMEOUT, client.request_text(request)).await {
            Ok(Ok(text)) => Ok(text.into_bytes()),
            Ok(Err(e)) => Err(JwksError::Fetch {
                path,
                error: e.to_string(),
            }),
            Err(_) => Err(JwksError::Fetch {
                path,
                error: format!("no answer within {FETCH_TIMEOUT:?}"),
            }),
        }
    }

    async fn fetch_set(client: &kube::Client) -> Result<KeySet, JwksError> {
        let issuer = parse_issuer(&Self::fetch(client, DISCOVERY_PATH).await?)?;
        let keys = parse_jwks(&Self::fetch(client, JWKS_PATH).await?)?;
        Ok(KeySet {
            keys,
            issuer,
            fetched_at: SystemTime::now(),
        })
    }

    async fn refresh_locked(&self) -> Result<(), JwksError> {
        let Origin::Sync(client) = &self.origin else {
            return Ok(());
        };
        let set = Self::fetch_set(client).await?;
        let changed = self
            .current()
            .is_none_or(|old| old.keys.kids() != set.keys.kids() || old.issuer != set.issuer);
        if changed {
            tracing::info!(kids = ?set.keys.kids(), issuer = %set.issuer, "session token keys loaded");
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(set));
        Ok(())
    }

    /// Fetches the issuer and the JWK Set now. On failure the last good set is kept.
    pub async fn refresh(&self) -> Result<(), JwksError> {
        let _guard = self.refreshing.lock().await;
        self.refresh_locked().await
    }

    /// A refresh asked for by a token whose kid is unknown: runs unless one ran within
    /// [`UNKNOWN_KID_INTERVAL`]. Concurrent callers wait for the one in flight and share it.
    /// Returns whether a refresh ran and succeeded.
    pub async fn refresh_for_unknown_kid(&self) -> bool {
        let mut last = self.refreshing.lock().await;
        if last.is_some_and(|at| at.elapsed() < UNKNOWN_KID_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        match self.refresh_locked().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "session token key refresh (unknown kid) failed; keeping the last good set");
                false
            }
        }
    }

    /// Refreshes forever: every [`REFRESH_EVERY`], sooner (1 s doubling) while no set was ever
    /// fetched or the last attempt failed.
    pub async fn run(self: Arc<Self>) {
        let mut retry = Duration::from_secs(1);
        loop {
            let wait = match self.refresh().await {
                Ok(()) => {
                    retry = Duration::from_secs(1);
                    REFRESH_EVERY
                }
                Err(e) => {
                    tracing::warn!(error = %e, "session token key refresh failed; keeping the last good set");
                    let wait = retry;
                    retry = (retry * 2).min(REFRESH_EVERY);
                    wait
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn ec_key(kid: &str) -> serde_json::Value {
        serde_json::json!({"kty":"EC","crv":"P-256","x":b64(&[1;32]),"y":b64(&[2;32]),"kid":kid,"alg":"ES256","use":"sig"})
    }

    #[test]
    fn parses_ec_p256_keys_and_skips_the_rest() {
        let set = serde_json::json!({"keys":[
            ec_key("a"),
            {"kty":"RSA","n":"xx","e":"AQAB","kid":"rsa"},
            {"kty":"EC","crv":"P-384","x":b64(&[1;48]),"y":b64(&[2;48]),"kid":"p384"},
            {"kty":"EC","crv":"P-256","x":b64(&[1;32]),"y":b64(&[2;32]),"kid":"enc","use":"enc"},
            {"kty":"EC","crv":"P-256","x":b64(&[1;32]),"y":b64(&[2;32]),"kid":"es512","alg":"ES512"},
            {"kty":"EC","crv":"P-256","x":b64(&[3;32]),"y":b64(&[4;32]),"kid":"b"},
        ]});
        let keys = parse_jwks(set.to_string().as_bytes()).unwrap();
        assert_eq!(keys.kids(), vec!["a".to_string(), "b".to_string()]);
        assert!(keys.get("rsa").is_none());
    }

    #[test]
    fn refuses_malformed_sets() {
        let bad_x = serde_json::json!({"keys":[{"kty":"EC","crv":"P-256","x":b64(&[1;31]),"y":b64(&[2;32]),"kid":"a"}]});
        let no_kid = serde_json::json!({"keys":[{"kty":"EC","crv":"P-256","x":b64(&[1;32]),"y":b64(&[2;32])}]});
        let not_b64 = serde_json::json!({"keys":[{"kty":"EC","crv":"P-256","x":"!!","y":b64(&[2;32]),"kid":"a"}]});
        let twice = serde_json::json!({"keys":[ec_key("a"), ec_key("a")]});
        for bad in [bad_x, no_kid, not_b64, twice] {
            assert!(parse_jwks(bad.to_string().as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_jwks(b"not json").is_err());
        assert!(parse_jwks(b"{\"keys\":{}}").is_err());
        let huge = vec![b' '; MAX_DOCUMENT_BYTES + 1];
        assert!(parse_jwks(&huge).is_err());
        assert!(parse_jwks(b"{\"keys\":[]}").unwrap().is_empty());
    }

    #[test]
    fn issuer_from_discovery() {
        assert_eq!(
            parse_issuer(br#"{"issuer":"https://mcp-access.example","jwks_uri":"x"}"#).unwrap(),
            "https://mcp-access.example"
        );
        assert!(parse_issuer(br#"{"issuer":""}"#).is_err());
        assert!(parse_issuer(br#"{"issuer":" a"}"#).is_err());
        assert!(parse_issuer(br#"{"jwks_uri":"x"}"#).is_err());
        assert!(parse_issuer(br#"{"issuer":["a"]}"#).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_kid_refreshes_are_rate_limited() {
        let source = JwksSource::fixed(Keys::default(), "iss");
        assert!(source.refresh_for_unknown_kid().await, "the first one runs");
        assert!(
            !source.refresh_for_unknown_kid().await,
            "within 5 s: skipped"
        );
        tokio::time::advance(UNKNOWN_KID_INTERVAL).await;
        assert!(
            source.refresh_for_unknown_kid().await,
            "after 5 s: runs again"
        );
    }
}
