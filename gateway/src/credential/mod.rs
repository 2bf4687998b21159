//! Session tokens on the gateway side (docs/session-tokens.md): the claims, the issuer's keys
//! taken from the sync listener, the pure offline check, and the final decision that joins a
//! verified token to the live session cache.
//!
//! Used by `mcp-access-gateway` and `mcp-access-authz` alike:
//!
//! ```no_run
//! # async fn demo(cache: gateway::SessionCache, config: gateway::CacheConfig) -> anyhow::Result<()> {
//! use gateway::credential::{admit, JwksSource, Verifier};
//! let source = std::sync::Arc::new(JwksSource::new(&config)?);
//! tokio::spawn(source.clone().run());
//! let verifier = Verifier::new(source, "http://github.demo.svc:8086");
//! let claims = match verifier.verify("eyJ...").await {
//!     Ok(c) => c,
//!     Err(e) => anyhow::bail!("401 {}", e.reason()),
//! };
//! let now = k8s_openapi::jiff::Timestamp::now();
//! let (decision, session) = cache.authorize_session(claims.namespace(), claims.name(), now).await;
//! if let Err(reason) = admit(&claims, decision, session.as_deref()) {
//!     anyhow::bail!("401 {}", reason.as_str());
//! }
//! # Ok(()) }
//! ```

pub mod claims;
pub mod jwks;
pub mod resource;
pub mod verify;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use apis::AccessSession;

pub use claims::{AccessClaim, ServerClaim, SessionClaims, SessionRef};
pub use jwks::{JwksSource, KeySet, Keys};
pub use verify::{verify, TokenError, LEEWAY_SECONDS, MAX_TOKEN_BYTES};

use crate::{Decision, DenyReason};

/// Every reason a request with (or without) a session token is refused; the wire spelling
/// ([`Reason::as_str`]) is the contract with clients, proxies and dashboards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No `Authorization: Bearer` header (RFC 6750: no `error=` in the challenge).
    TokenMissing,
    TokenInvalid,
    TokenExpired,
    SessionNotFound,
    SessionRevoked,
    SessionExpired,
    SessionPendingEnrollment,
    /// The session cache is not in sync (stale or never synced), or no token keys are held.
    CacheStale,
}

impl Reason {
    /// Every reason, for metrics that export zeros.
    pub const ALL: [Reason; 8] = [
        Reason::TokenMissing,
        Reason::TokenInvalid,
        Reason::TokenExpired,
        Reason::SessionNotFound,
        Reason::SessionRevoked,
        Reason::SessionExpired,
        Reason::SessionPendingEnrollment,
        Reason::CacheStale,
    ];

    /// The wire spelling, e.g. `session_revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TokenMissing => "token_missing",
            Self::TokenInvalid => "token_invalid",
            Self::TokenExpired => "token_expired",
            Self::SessionNotFound => "session_not_found",
            Self::SessionRevoked => "session_revoked",
            Self::SessionExpired => "session_expired",
            Self::SessionPendingEnrollment => "session_pending_enrollment",
            Self::CacheStale => "cache_stale",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<DenyReason> for Reason {
    fn from(r: DenyReason) -> Self {
        match r {
            DenyReason::SessionNotFound => Self::SessionNotFound,
            DenyReason::SessionRevoked => Self::SessionRevoked,
            DenyReason::SessionExpired => Self::SessionExpired,
            DenyReason::SessionPendingEnrollment => Self::SessionPendingEnrollment,
            DenyReason::SyncStale | DenyReason::SyncLagging | DenyReason::SyncNotReady => {
                Self::CacheStale
            }
        }
    }
}

impl From<&TokenError> for Reason {
    fn from(e: &TokenError) -> Self {
        match e {
            TokenError::Invalid(_) | TokenError::UnknownKid => Self::TokenInvalid,
            TokenError::Expired => Self::TokenExpired,
            TokenError::KeysUnavailable => Self::CacheStale,
        }
    }
}

/// The final decision for a verified token (step 4 of the contract): the cache's decision on
/// the session the token names, and the session object it was taken from.
///
/// In order: the cache not in sync → `cache_stale`; no such session, or one whose
/// `metadata.uid` differs from the claim (a deleted and recreated name) → `session_not_found`;
/// a session of another server generation than the token's → `token_invalid`; then the
/// session's own state (revoked, expired, pending enrollment).
pub fn admit(
    claims: &SessionClaims,
    decision: Decision,
    session: Option<&AccessSession>,
) -> Result<(), Reason> {
    if let Decision::Deny(
        r @ (DenyReason::SyncStale | DenyReason::SyncLagging | DenyReason::SyncNotReady),
    ) = decision
    {
        return Err(r.into());
    }
    let Some(session) = session else {
        return Err(decision
            .reason()
            .map_or(Reason::SessionNotFound, Reason::from));
    };
    if session.metadata.uid.as_deref() != Some(claims.access.session.uid.as_str()) {
        return Err(Reason::SessionNotFound);
    }
    if session.spec.server.uid != claims.access.server.uid {
        return Err(Reason::TokenInvalid);
    }
    match decision {
        Decision::Allow => Ok(()),
        Decision::Deny(r) => Err(r.into()),
    }
}

/// Verifies bearer tokens with the keys of a [`JwksSource`] for one audience (the gateway's
/// public URL).
#[derive(Clone, Debug)]
pub struct Verifier {
    source: Arc<JwksSource>,
    audience: String,
    verified: Arc<Mutex<Verified>>,
}

/// Most tokens remembered as verified; when full, all are forgotten at once (bounded memory,
/// and only tokens that passed verification ever enter, so a flood of garbage cannot evict).
const VERIFIED_CAPACITY: usize = 4096;

/// Tokens whose signature, issuer, audience and claims were verified under one key set: a
/// request repeating a token skips the signature check (the costliest step by far) but never
/// the time checks, and the live session is consulted on every request regardless. Forgotten
/// as a whole when the key set changes (rotation, a removed key).
#[derive(Debug, Default)]
struct Verified {
    under: Option<Arc<KeySet>>,
    tokens: HashMap<String, SessionClaims>,
}

impl Verified {
    /// The claims of `token` if it was verified under `set`.
    fn get(&mut self, token: &str, set: &Arc<KeySet>) -> Option<SessionClaims> {
        if !self.under.as_ref().is_some_and(|u| Arc::ptr_eq(u, set)) {
            self.under = Some(set.clone());
            self.tokens.clear();
            return None;
        }
        self.tokens.get(token).cloned()
    }

    fn insert(&mut self, token: &str, set: &Arc<KeySet>, claims: &SessionClaims) {
        if !self.under.as_ref().is_some_and(|u| Arc::ptr_eq(u, set)) {
            return;
        }
        if self.tokens.len() >= VERIFIED_CAPACITY {
            self.tokens.clear();
        }
        self.tokens.insert(token.to_string(), claims.clone());
    }
}

impl Verifier {
    /// A verifier of tokens for `audience`.
    pub fn new(source: Arc<JwksSource>, audience: impl Into<String>) -> Self {
        Self {
            source,
            audience: audience.into(),
            verified: Arc::default(),
        }
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, Verified> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Verifies `bearer` against `set`, or takes it from the tokens already verified under
    /// `set` (re-checking the times).
    fn verify_under(
        &self,
        bearer: &str,
        set: &Arc<KeySet>,
        now: i64,
    ) -> Result<SessionClaims, TokenError> {
        if let Some(claims) = self.verified().get(bearer, set) {
            verify::check_times(&claims, now)?;
            return Ok(claims);
        }
        let claims = verify(bearer, &set.keys, &set.issuer, &self.audience, now)?;
        self.verified().insert(bearer, set, &claims);
        Ok(claims)
    }

    /// The key source.
    pub fn source(&self) -> &Arc<JwksSource> {
        &self.source
    }

    /// The audience a token must name.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Verifies `bearer` (the token alone, without the scheme) now. An unknown kid refreshes
    /// the keys (at most once per 5 s) and retries once.
    pub async fn verify(&self, bearer: &str) -> Result<SessionClaims, TokenError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.verify_at(bearer, now).await
    }

    /// [`Verifier::verify`] at `now` (Unix seconds).
    pub async fn verify_at(&self, bearer: &str, now: i64) -> Result<SessionClaims, TokenError> {
        // Cheap refusals first, so garbage never triggers a key refresh.
        if bearer.is_empty() || bearer.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Invalid("empty or oversized"));
        }
        let set = match self.source.current() {
            Some(set) => set,
            None => {
                self.source.refresh_for_unknown_kid().await;
                self.source.current().ok_or(TokenError::KeysUnavailable)?
            }
        };
        match self.verify_under(bearer, &set, now) {
            Err(TokenError::UnknownKid) => {
                if !self.source.refresh_for_unknown_kid().await {
                    return Err(TokenError::UnknownKid);
                }
                let set = self.source.current().ok_or(TokenError::KeysUnavailable)?;
                self.verify_under(bearer, &set, now)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::verify::tests::{claims, TestKey, AUD, ISS, NOW};
    use super::*;
    use crate::decision::tests::mk_session;
    use apis::SessionPhase;

    fn verified() -> SessionClaims {
        let key = TestKey::new("k1");
        verify(&key.sign(&claims()), &key.keys(), ISS, AUD, NOW).unwrap()
    }

    fn session(phase: SessionPhase) -> AccessSession {
        let mut s = mk_session("demo", "bot-github", "server-uid-1", phase);
        s.metadata.uid = Some("session-uid-1".into());
        s
    }

    #[test]
    fn admit_follows_the_contract_order() {
        let c = verified();
        let active = session(SessionPhase::Active);
        assert_eq!(admit(&c, Decision::Allow, Some(&active)), Ok(()));
        for stale in [
            DenyReason::SyncStale,
            DenyReason::SyncLagging,
            DenyReason::SyncNotReady,
        ] {
            assert_eq!(
                admit(&c, Decision::Deny(stale), None),
                Err(Reason::CacheStale)
            );
        }
        assert_eq!(
            admit(&c, Decision::Deny(DenyReason::SessionNotFound), None),
            Err(Reason::SessionNotFound)
        );
        // A recreated session of the same name is another session.
        let mut recreated = session(SessionPhase::Revoked);
        recreated.metadata.uid = Some("session-uid-2".into());
        assert_eq!(
            admit(
                &c,
                Decision::Deny(DenyReason::SessionRevoked),
                Some(&recreated)
            ),
            Err(Reason::SessionNotFound)
        );
        let mut no_uid = session(SessionPhase::Active);
        no_uid.metadata.uid = None;
        assert_eq!(
            admit(&c, Decision::Allow, Some(&no_uid)),
            Err(Reason::SessionNotFound)
        );
        // Another server generation: the token does not belong here.
        let mut other_server = session(SessionPhase::Active);
        other_server.spec.server.uid = "server-uid-2".into();
        assert_eq!(
            admit(&c, Decision::Allow, Some(&other_server)),
            Err(Reason::TokenInvalid)
        );
        // The session's own state, and never an allow past a deny.
        let revoked = session(SessionPhase::Revoked);
        assert_eq!(
            admit(
                &c,
                Decision::Deny(DenyReason::SessionRevoked),
                Some(&revoked)
            ),
            Err(Reason::SessionRevoked)
        );
        assert_eq!(
            admit(
                &c,
                Decision::Deny(DenyReason::SessionExpired),
                Some(&active)
            ),
            Err(Reason::SessionExpired)
        );
        assert_eq!(
            admit(
                &c,
                Decision::Deny(DenyReason::SessionPendingEnrollment),
                Some(&active)
            ),
            Err(Reason::SessionPendingEnrollment)
        );
    }

    #[tokio::test]
    async fn verifier_uses_the_source_and_reports_reasons() {
        let key = TestKey::new("k1");
        let verifier = Verifier::new(Arc::new(JwksSource::fixed(key.keys(), ISS)), AUD);
        let c = verifier.verify_at(&key.sign(&claims()), NOW).await.unwrap();
        assert_eq!(c.name(), "bot-github");
        let stranger = TestKey::new("k2");
        let err = verifier
            .verify_at(&stranger.sign(&claims()), NOW)
            .await
            .unwrap_err();
        assert_eq!(err.reason(), "token_invalid");
        let err = verifier
            .verify_at(&key.sign(&claims()), NOW + 3600)
            .await
            .unwrap_err();
        assert_eq!(err.reason(), "token_expired");
        assert_eq!(Reason::from(&err), Reason::TokenExpired);
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(
            verifier.verify_at(&long, NOW).await.unwrap_err().reason(),
            "token_invalid"
        );
    }

    #[tokio::test]
    async fn a_repeated_token_skips_the_signature_but_not_the_clock_or_a_key_change() {
        let key = TestKey::new("k1");
        let source = Arc::new(JwksSource::fixed(key.keys(), ISS));
        let verifier = Verifier::new(source.clone(), AUD);
        let token = key.sign(&claims());
        assert!(verifier.verify_at(&token, NOW).await.is_ok());
        assert_eq!(
            verifier.verified().tokens.len(),
            1,
            "remembered once verified"
        );
        // A tampered copy is another string: verified on its own, and refused.
        let mut tampered = token.clone();
        tampered.pop();
        assert!(verifier.verify_at(&tampered, NOW).await.is_err());
        assert_eq!(
            verifier.verified().tokens.len(),
            1,
            "refused tokens are not remembered"
        );
        // The clock still rules a remembered token.
        let err = verifier.verify_at(&token, NOW + 3600).await.unwrap_err();
        assert_eq!(err, TokenError::Expired);
        // A new key set (rotation: k1 gone) forgets every remembered token.
        let next = TestKey::new("k2");
        source.replace_for_tests(next.keys(), ISS);
        assert_eq!(
            verifier.verify_at(&token, NOW).await.unwrap_err().reason(),
            "token_invalid"
        );
        assert!(verifier.verify_at(&next.sign(&claims()), NOW).await.is_ok());
    }

    #[test]
    fn reasons_are_spelled_as_the_contract() {
        let spelled: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            spelled,
            [
                "token_missing",
                "token_invalid",
                "token_expired",
                "session_not_found",
                "session_revoked",
                "session_expired",
                "session_pending_enrollment",
                "cache_stale"
            ]
        );
    }
}
