//! The offline check of a session token: pure, the keys, issuer, audience and clock passed in
//! (docs/session-tokens.md, "What the gateway checks", steps 2 and 3).

use jsonwebtoken::{Algorithm, Validation};

use super::claims::SessionClaims;
use super::jwks::Keys;

/// Tolerated clock skew on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECONDS: u64 = 30;
/// Longest token read; anything longer is refused before it is parsed.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Why a token was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a compact JWS, a header other than `alg: ES256` with a kid, a bad signature, the
    /// wrong issuer or audience, not yet valid, or claims of the wrong shape.
    #[error("invalid token: {0}")]
    Invalid(&'static str),
    /// The header names a kid the key set does not hold (the caller may refresh and retry).
    #[error("invalid token: unknown kid")]
    UnknownKid,
    /// Past `exp` (with the leeway).
    #[error("token expired")]
    Expired,
    /// No key set was ever fetched: nothing can be verified.
    #[error("no session token keys are held")]
    KeysUnavailable,
}

impl TokenError {
    /// The deny reason on the wire: `token_invalid`, `token_expired`, or `cache_stale` when
    /// the gateway itself holds no keys (not the client's fault; minting again will not help).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid(_) | Self::UnknownKid => "token_invalid",
            Self::Expired => "token_expired",
            Self::KeysUnavailable => "cache_stale",
        }
    }
}

/// Verifies `token` against `keys`: ES256 only (the header's `alg` is checked before anything
/// else), a kid of `keys`, the signature, `iss == issuer`, `audience` among `aud`, `exp` in the
/// future and `nbf`/`iat` not in the future with [`LEEWAY_SECONDS`], and a well-formed private
/// claim. `now` is Unix seconds.
pub fn verify(
    token: &str,
    keys: &Keys,
    issuer: &str,
    audience: &str,
    now: i64,
) -> Result<SessionClaims, TokenError> {
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Invalid("empty or oversized"));
    }
    // `alg: none` and unknown algorithms fail to decode here.
    let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Invalid("header"))?;
    if header.alg != Algorithm::ES256 {
        return Err(TokenError::Invalid("algorithm"));
    }
    let kid = header.kid.ok_or(TokenError::Invalid("no kid"))?;
    let key = keys.get(&kid).ok_or(TokenError::UnknownKid)?;
    let mut validation = Validation::new(Algorithm::ES256);
    validation.algorithms = vec![Algorithm::ES256];
    // Times, issuer and audience are checked below against the `now` passed in, exactly.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let claims = jsonwebtoken::decode::<SessionClaims>(token, key, &validation)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenError::Invalid("signature"),
            _ => TokenError::Invalid("claims"),
        })?
        .claims;
    if claims.iss != issuer {
        return Err(TokenError::Invalid("issuer"));
    }
    if !claims.aud.iter().any(|a| a == audience) {
        return Err(TokenError::Invalid("audience"));
    }
    check_times(&claims, now)?;
    if !claims.well_formed() {
        return Err(TokenError::Invalid("private claim"));
    }
    Ok(claims)
}

/// The time checks of [`verify`] alone, for claims whose signature was verified before:
/// `exp` after `iat`, `iat` and `nbf` not in the future, `exp` not past, with
/// [`LEEWAY_SECONDS`]. `now` is Unix seconds.
pub fn check_times(claims: &SessionClaims, now: i64) -> Result<(), TokenError> {
    // Wide integers: no claim value can overflow a comparison into an acceptance.
    let (now, leeway) = (i128::from(now), i128::from(LEEWAY_SECONDS));
    let (exp, iat) = (i128::from(claims.exp), i128::from(claims.iat));
    if exp <= iat {
        return Err(TokenError::Invalid("exp not after iat"));
    }
    if iat > now + leeway || claims.nbf.is_some_and(|nbf| i128::from(nbf) > now + leeway) {
        return Err(TokenError::Invalid("not yet valid"));
    }
    if exp + leeway <= now {
        return Err(TokenError::Expired);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::{json, Value};

    pub(crate) const ISS: &str = "https://mcp-access.test";
    pub(crate) const AUD: &str = "http://github.demo.svc:8086";
    pub(crate) const NOW: i64 = 1_800_000_000;

    /// A P-256 key pair for tests: its encoding key and its public coordinates.
    pub(crate) struct TestKey {
        pub(crate) kid: String,
        pub(crate) pkcs8: Vec<u8>,
        pub(crate) x: [u8; 32],
        pub(crate) y: [u8; 32],
    }

    impl TestKey {
        pub(crate) fn new(kid: &str) -> Self {
            let rng = SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .unwrap()
                .as_ref()
                .to_vec();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng).unwrap();
            let public = pair.public_key().as_ref();
            Self {
                kid: kid.into(),
                x: public[1..33].try_into().unwrap(),
                y: public[33..65].try_into().unwrap(),
                pkcs8,
            }
        }

        pub(crate) fn keys(&self) -> Keys {
            Keys::from_p256(&self.kid, &self.x, &self.y).unwrap()
        }

        pub(crate) fn sign(&self, claims: &Value) -> String {
            let mut header = Header::new(Algorithm::ES256);
            header.kid = Some(self.kid.clone());
            jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&self.pkcs8)).unwrap()
        }
    }

    pub(crate) fn claims() -> Value {
        json!({
            "iss": ISS,
            "sub": "system:accesssession:demo:bot-github",
            "aud": [AUD],
            "exp": NOW + 600, "iat": NOW, "nbf": NOW,
            "jti": "6f1c1d2e-0000-4000-8000-000000000001",
            "access.mcp-runtime.dev": {
                "session": {"namespace": "demo", "name": "bot-github", "uid": "session-uid-1"},
                "server": {"name": "github", "uid": "server-uid-1"},
                "agent": "billing-bot",
                "subject": "alice@example.com"
            }
        })
    }

    fn with(mut base: Value, path: &[&str], value: Value) -> Value {
        let mut at = &mut base;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = value;
        base
    }

    fn without(mut base: Value, path: &[&str]) -> Value {
        let mut at = &mut base;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at.as_object_mut().unwrap().remove(path[path.len() - 1]);
        base
    }

    fn check(key: &TestKey, token: &str) -> Result<SessionClaims, TokenError> {
        verify(token, &key.keys(), ISS, AUD, NOW)
    }

    #[test]
    fn a_good_token_is_accepted() {
        let key = TestKey::new("k1");
        let c = check(&key, &key.sign(&claims())).unwrap();
        assert_eq!((c.namespace(), c.name()), ("demo", "bot-github"));
        assert_eq!(c.access.session.uid, "session-uid-1");
        assert_eq!(c.access.server.uid, "server-uid-1");
        assert_eq!(c.access.agent.as_deref(), Some("billing-bot"));
        assert_eq!(c.access.subject.as_deref(), Some("alice@example.com"));
        // agent and subject are optional; aud may name other resources too.
        let minimal = without(
            without(claims(), &["access.mcp-runtime.dev", "agent"]),
            &["access.mcp-runtime.dev", "subject"],
        );
        let minimal = with(minimal, &["aud"], json!(["https://other", AUD]));
        let c = check(&key, &key.sign(&minimal)).unwrap();
        assert_eq!(c.access.agent, None);
    }

    #[test]
    fn forged_signature_is_invalid() {
        let key = TestKey::new("k1");
        let other = TestKey::new("k1"); // same kid, another key
        assert_eq!(
            check(&key, &other.sign(&claims())),
            Err(TokenError::Invalid("signature"))
        );
        // A claim changed after signing.
        let token = key.sign(&claims());
        let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
        let changed = with(
            claims(),
            &["access.mcp-runtime.dev", "session", "name"],
            json!("admin"),
        );
        parts[1] = URL_SAFE_NO_PAD.encode(changed.to_string());
        assert_eq!(
            check(&key, &parts.join(".")),
            Err(TokenError::Invalid("signature"))
        );
    }

    fn unsigned(header: Value, claims: &Value, signature: &str) -> String {
        format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string()),
            signature
        )
    }

    #[test]
    fn alg_none_and_other_algorithms_are_invalid() {
        let key = TestKey::new("k1");
        for alg in ["none", "None", "NONE"] {
            let token = unsigned(
                json!({"alg": alg, "typ": "JWT", "kid": "k1"}),
                &claims(),
                "",
            );
            assert_eq!(
                check(&key, &token).unwrap_err().reason(),
                "token_invalid",
                "{alg}"
            );
        }
        // HS256 with the public key as the HMAC secret (the key-confusion attack).
        let mut public = vec![4u8];
        public.extend_from_slice(&key.x);
        public.extend_from_slice(&key.y);
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let hs =
            jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(&public)).unwrap();
        assert_eq!(check(&key, &hs), Err(TokenError::Invalid("algorithm")));
        let es384 = unsigned(json!({"alg": "ES384", "kid": "k1"}), &claims(), "AAAA");
        assert_eq!(check(&key, &es384), Err(TokenError::Invalid("algorithm")));
    }

    #[test]
    fn kid_must_be_known() {
        let key = TestKey::new("k1");
        let stranger = TestKey::new("k2");
        assert_eq!(
            check(&key, &stranger.sign(&claims())),
            Err(TokenError::UnknownKid)
        );
        assert_eq!(TokenError::UnknownKid.reason(), "token_invalid");
        let no_kid = jsonwebtoken::encode(
            &Header::new(Algorithm::ES256),
            &claims(),
            &EncodingKey::from_ec_der(&key.pkcs8),
        )
        .unwrap();
        assert_eq!(check(&key, &no_kid), Err(TokenError::Invalid("no kid")));
    }

    #[test]
    fn issuer_and_audience_are_exact() {
        let key = TestKey::new("k1");
        for (path, value, why) in [
            (&["iss"][..], json!("https://evil.test"), "issuer"),
            (&["iss"][..], json!(format!("{ISS}/")), "issuer"),
            (
                &["aud"][..],
                json!(["http://other.demo.svc:8086"]),
                "audience",
            ),
            (&["aud"][..], json!([]), "audience"),
            // aud is always an array in this contract; an array-valued iss is refused.
            (&["aud"][..], json!(AUD), "claims"),
            (&["iss"][..], json!([ISS]), "claims"),
        ] {
            let token = key.sign(&with(claims(), path, value.clone()));
            assert_eq!(
                check(&key, &token),
                Err(TokenError::Invalid(why)),
                "{path:?}={value}"
            );
        }
    }

    #[test]
    fn lifetimes_with_leeway() {
        let key = TestKey::new("k1");
        let at = |exp: i64, iat: i64, nbf: i64| {
            let c = with(
                with(with(claims(), &["exp"], json!(exp)), &["iat"], json!(iat)),
                &["nbf"],
                json!(nbf),
            );
            check(&key, &key.sign(&c))
        };
        assert!(
            at(NOW - 29, NOW - 600, NOW - 600).is_ok(),
            "within the leeway"
        );
        assert_eq!(at(NOW - 30, NOW - 600, NOW - 600), Err(TokenError::Expired));
        assert_eq!(TokenError::Expired.reason(), "token_expired");
        assert!(at(NOW + 600, NOW + 30, NOW + 30).is_ok());
        assert_eq!(
            at(NOW + 600, NOW, NOW + 31),
            Err(TokenError::Invalid("not yet valid"))
        );
        assert_eq!(
            at(NOW + 600, NOW + 31, NOW),
            Err(TokenError::Invalid("not yet valid"))
        );
        assert_eq!(
            at(NOW, NOW, NOW),
            Err(TokenError::Invalid("exp not after iat"))
        );
        for bad in [
            json!(-1),
            json!(1.5),
            json!("1800000600"),
            json!(u64::MAX as f64),
        ] {
            let token = key.sign(&with(claims(), &["exp"], bad.clone()));
            assert_eq!(
                check(&key, &token),
                Err(TokenError::Invalid("claims")),
                "exp={bad}"
            );
        }
        // Large values cannot overflow into an acceptance.
        let token = key.sign(&with(
            with(claims(), &["exp"], json!(u64::MAX)),
            &["iat"],
            json!(u64::MAX - 1),
        ));
        assert_eq!(
            check(&key, &token),
            Err(TokenError::Invalid("not yet valid"))
        );
    }

    #[test]
    fn the_private_claim_must_be_whole_and_consistent() {
        let key = TestKey::new("k1");
        let p = "access.mcp-runtime.dev";
        let cases: Vec<(Value, &str)> = vec![
            (without(claims(), &[p]), "claims"),
            (without(claims(), &[p, "session", "uid"]), "claims"),
            (without(claims(), &[p, "server"]), "claims"),
            (without(claims(), &["jti"]), "claims"),
            (without(claims(), &["exp"]), "claims"),
            (without(claims(), &["sub"]), "claims"),
            (
                with(claims(), &[p, "session", "uid"], json!("")),
                "private claim",
            ),
            (
                with(claims(), &[p, "server", "uid"], json!("")),
                "private claim",
            ),
            (
                with(claims(), &[p, "session", "namespace"], json!("Demo")),
                "private claim",
            ),
            (
                with(claims(), &[p, "session", "name"], json!("../x")),
                "private claim",
            ),
            (
                with(claims(), &["sub"], json!("system:accesssession:demo:other")),
                "private claim",
            ),
            (with(claims(), &[p, "agent"], json!(7)), "claims"),
        ];
        for (c, why) in cases {
            assert_eq!(
                check(&key, &key.sign(&c)),
                Err(TokenError::Invalid(why)),
                "{c}"
            );
        }
    }

    #[test]
    fn garbage_and_oversized_tokens_are_invalid() {
        let key = TestKey::new("k1");
        for garbage in [
            "",
            "a",
            "a.b",
            "a.b.c",
            "...",
            "é.é.é",
            "eyJ.eyJ.sig",
            "Bearer x",
        ] {
            assert_eq!(
                check(&key, garbage).unwrap_err().reason(),
                "token_invalid",
                "{garbage:?}"
            );
        }
        let padded = with(claims(), &["pad"], json!("x".repeat(MAX_TOKEN_BYTES)));
        assert_eq!(
            check(&key, &key.sign(&padded)),
            Err(TokenError::Invalid("empty or oversized"))
        );
    }
}
