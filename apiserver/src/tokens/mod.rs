//! Session tokens (docs/session-tokens.md): the signer behind the `token` subresource of
//! AccessSession, the JWK Set and OpenID discovery document gateways verify against, and
//! the count of what was minted and refused. The rules (who may have a token, its lifetime,
//! its claims) are pure functions in [`apis::session_token`]; this module holds the keys.

mod keys;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use apis::session_token::{SessionTokenClaims, ALGORITHM};
use apis::AccessSession;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;

pub use keys::{
    load_public, KeyError, KeySet, PublicKey, SigningKey, SIGNING_KEY_FLAG, VERIFICATION_KEY_FLAG,
};

/// Where the JWK Set is served, on the API and the gateway sync listeners.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// Where the OpenID discovery document is served.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// The validated session-token settings (`--session-token-*`), before the key files are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSettings {
    /// `None`: no tokens are issued (the subresource answers 503).
    pub signing_key_file: Option<PathBuf>,
    pub verification_key_files: Vec<PathBuf>,
    /// Required with a signing key.
    pub issuer: Option<String>,
    pub max_ttl: Duration,
    pub audience_template: String,
}

/// Why a token cannot be minted (beyond the session's own state, decided by the handler).
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("this apiserver issues no session tokens: it was started without --session-token-signing-key-file")]
    Disabled,
    #[error("signing the token failed")]
    Signing,
    #[error("encoding the token failed: {0}")]
    Encoding(#[from] serde_json::Error),
}

/// A token just minted.
#[derive(Clone, Debug)]
pub struct Minted {
    /// The compact JWS. Never logged.
    pub token: String,
    pub claims: SessionTokenClaims,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
}

/// Tokens minted and refused.
#[derive(Debug, Default)]
pub struct TokenMetrics {
    issued: Counter,
    refused: Family<RefusalLabels, Counter>,
}

/// Every `reason` of `mcp_access_session_tokens_refused_total`, present from the start.
pub const REFUSAL_REASONS: &[&str] = &[
    "not_found",
    "revoked",
    "expired",
    "pending_enrollment",
    "fenced",
    "malformed",
    "invalid",
    "disabled",
];

impl TokenMetrics {
    /// Registers `mcp_access_session_tokens_issued_total` and
    /// `mcp_access_session_tokens_refused_total{reason}`.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self::default();
        for reason in REFUSAL_REASONS {
            let _ = metrics.refused.get_or_create(&RefusalLabels { reason });
        }
        let sub = registry.sub_registry_with_prefix("mcp_access");
        sub.register(
            "session_tokens_issued",
            "Session tokens minted by the token subresource of AccessSession",
            metrics.issued.clone(),
        );
        sub.register(
            "session_tokens_refused",
            "Token requests refused, by reason (not_found, revoked, expired, pending_enrollment, fenced, malformed, invalid, disabled)",
            metrics.refused.clone(),
        );
        Arc::new(metrics)
    }

    pub(crate) fn issued(&self) {
        self.issued.inc();
    }

    pub(crate) fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&RefusalLabels { reason }).inc();
    }
}

/// The signer and the documents it publishes. Cheap to share.
pub struct SessionTokens {
    signer: Option<Signer>,
    max_ttl_seconds: i64,
    audience_template: String,
    jwks: Bytes,
    discovery: Option<Bytes>,
    pub metrics: Arc<TokenMetrics>,
}

struct Signer {
    key: SigningKey,
    issuer: String,
    /// The encoded JOSE header, the same for every token.
    header: String,
}

impl std::fmt::Debug for SessionTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTokens")
            .field(
                "kid",
                &self.signer.as_ref().map(|s| s.key.public.kid.clone()),
            )
            .field("issuer", &self.signer.as_ref().map(|s| s.issuer.clone()))
            .finish_non_exhaustive()
    }
}

impl SessionTokens {
    /// No signing key: the subresource answers 503, the JWKS is empty.
    pub fn disabled(metrics: Arc<TokenMetrics>) -> Self {
        Self {
            signer: None,
            max_ttl_seconds: 0,
            audience_template: apis::session_token::DEFAULT_AUDIENCE_TEMPLATE.into(),
            jwks: Bytes::from_static(br#"{"keys":[]}"#),
            discovery: None,
            metrics,
        }
    }

    /// Reads the key files of `settings` (fail closed: any problem is an error naming the
    /// flag).
    pub fn load(settings: &TokenSettings, metrics: Arc<TokenMetrics>) -> Result<Self, KeyError> {
        let Some(signing) = settings.signing_key_file.as_deref() else {
            // Verification keys without a signing key publish nothing: refused by the
            // configuration before this is called.
            return Ok(Self::disabled(metrics));
        };
        let keys = KeySet::load(signing, &settings.verification_key_files)?;
        let issuer = settings.issuer.clone().unwrap_or_default();
        Ok(Self::from_keys(
            keys.signing,
            keys.published,
            issuer,
            settings.max_ttl,
            settings.audience_template.clone(),
            metrics,
        ))
    }

    /// A signer of `key` for `issuer`, publishing `published` (the signing key's public half
    /// among them).
    pub fn from_keys(
        key: SigningKey,
        published: Vec<PublicKey>,
        issuer: String,
        max_ttl: Duration,
        audience_template: String,
        metrics: Arc<TokenMetrics>,
    ) -> Self {
        let header = URL_SAFE_NO_PAD
            .encode(json!({"alg": ALGORITHM, "typ": "JWT", "kid": key.public.kid}).to_string());
        let jwks = json!({"keys": published.iter().map(PublicKey::jwk).collect::<Vec<_>>()});
        // Relative: served on two listeners at different addresses, the document names the
        // JWKS on whichever listener it was fetched from.
        let discovery = json!({
            "issuer": issuer,
            "jwks_uri": JWKS_PATH,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [ALGORITHM],
        });
        Self {
            signer: Some(Signer {
                key,
                issuer,
                header,
            }),
            max_ttl_seconds: i64::try_from(max_ttl.as_secs()).unwrap_or(i64::MAX),
            audience_template,
            jwks: Bytes::from(jwks.to_string()),
            discovery: Some(Bytes::from(discovery.to_string())),
            metrics,
        }
    }

    /// Whether tokens are issued.
    pub fn enabled(&self) -> bool {
        self.signer.is_some()
    }

    /// The `iss` of every token, if tokens are issued.
    pub fn issuer(&self) -> Option<&str> {
        self.signer.as_ref().map(|s| s.issuer.as_str())
    }

    /// `--session-token-max-ttl`, in seconds.
    pub fn max_ttl_seconds(&self) -> i64 {
        self.max_ttl_seconds
    }

    /// The default audience of a session's tokens: its server's resource URI.
    pub fn default_audience(&self, session: &AccessSession) -> String {
        apis::session_token::render_audience(
            &self.audience_template,
            &session.spec.server.name,
            session.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    /// The JWK Set (`{"keys":[...]}`), encoded.
    pub fn jwks(&self) -> Bytes {
        self.jwks.clone()
    }

    /// The OpenID discovery document, encoded; `None` without a signing key.
    pub fn discovery(&self) -> Option<Bytes> {
        self.discovery.clone()
    }

    /// Mints a token for `session`, valid from `now` until `exp`, for `audiences`.
    pub fn mint(
        &self,
        session: &AccessSession,
        audiences: Vec<String>,
        now: Timestamp,
        exp: i64,
    ) -> Result<Minted, MintError> {
        let signer = self.signer.as_ref().ok_or(MintError::Disabled)?;
        let claims = SessionTokenClaims::for_session(
            session,
            &signer.issuer,
            audiences,
            now,
            exp,
            uuid::Uuid::new_v4().to_string(),
        );
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?);
        let signing_input = format!("{}.{payload}", signer.header);
        let signature = signer
            .key
            .sign(signing_input.as_bytes())
            .map_err(|_| MintError::Signing)?;
        Ok(Minted {
            token: format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)),
            claims,
        })
    }
}
