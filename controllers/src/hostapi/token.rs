//! Host tokens: RS256 JWTs from the configured issuer naming exactly one Host. This module
//! checks everything the token itself says; the live Host (its UID) is checked by the caller.

use std::collections::BTreeSet;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// The one capability a host token carries.
pub const CAPABILITY: &str = "mcp:credential:read";
/// Clock skew tolerated on `exp`, `nbf` and `iat`.
pub const LEEWAY_SECONDS: u64 = 30;

/// The Host a token names.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct HostRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// The claims, typed strictly: a claim of another shape (an `iss` array, a negative or
/// fractional time, an `nbf` string) fails to decode and the token is refused, where
/// jsonwebtoken alone would accept any matching `iss` element or skip an `nbf` it cannot read.
#[derive(Deserialize)]
struct Claims {
    #[allow(dead_code)] // decoded for its type; the value is checked by `Validation`
    iss: String,
    aud: Audience,
    iat: u64,
    exp: u64,
    #[allow(dead_code)] // decoded for its type; the value is checked by `Validation`
    nbf: Option<u64>,
    #[serde(rename = "hostRefs")]
    host_refs: Vec<HostRef>,
    host_uid: String,
    capabilities: Vec<String>,
}

/// What a valid token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIdentity {
    pub host: HostRef,
    pub uid: String,
}

/// Why a token was refused: logged and counted, never sent (every refusal is the same 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    /// Not a JWT, a bad signature, an algorithm other than RS256, a wrong issuer, expired,
    /// not yet valid, or claims of the wrong shape.
    Invalid,
    Audience,
    Lifetime,
    HostRefs,
    Capabilities,
    /// The Host named does not exist (live) or has another UID.
    Host,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Invalid => "invalid",
            Refusal::Audience => "audience",
            Refusal::Lifetime => "lifetime",
            Refusal::HostRefs => "host_refs",
            Refusal::Capabilities => "capabilities",
            Refusal::Host => "host",
        }
    }

    pub const ALL: [Refusal; 7] = [
        Refusal::Missing,
        Refusal::Invalid,
        Refusal::Audience,
        Refusal::Lifetime,
        Refusal::HostRefs,
        Refusal::Capabilities,
        Refusal::Host,
    ];
}

/// Verifies host tokens with the issuer's key.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
    audience: BTreeSet<String>,
    max_ttl: Duration,
}

impl Verifier {
    pub fn new(
        public_key_pkcs1_der: &[u8],
        issuer: &str,
        audience: &BTreeSet<String>,
        max_ttl: Duration,
    ) -> Self {
        let mut validation = Validation::new(Algorithm::RS256);
        validation.algorithms = vec![Algorithm::RS256];
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[issuer]);
        // "Any of" here; the exact set is checked below.
        validation.set_audience(&audience.iter().collect::<Vec<_>>());
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        Self {
            key: DecodingKey::from_rsa_der(public_key_pkcs1_der),
            validation,
            audience: audience.clone(),
            max_ttl,
        }
    }

    /// Checks `token` at `now` (Unix seconds): signature (RS256 only), issuer, the exact
    /// audience set, `iat`/`exp` present with `exp - iat` within the maximum, one `hostRefs`
    /// entry, a `host_uid`, and exactly the capability [`CAPABILITY`].
    pub fn verify(&self, token: &str, now: i64) -> Result<HostIdentity, Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Invalid)?;
        if header.alg != Algorithm::RS256 {
            return Err(Refusal::Invalid);
        }
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidAudience => Refusal::Audience,
                _ => Refusal::Invalid,
            })?
            .claims;
        let aud: BTreeSet<String> = match claims.aud {
            Audience::One(a) => BTreeSet::from([a]),
            Audience::Many(a) => a.into_iter().collect(),
        };
        if aud != self.audience {
            return Err(Refusal::Audience);
        }
        // Wide integers: no claim value can overflow a comparison into an acceptance.
        let (iat, exp, now) = (
            i128::from(claims.iat),
            i128::from(claims.exp),
            i128::from(now),
        );
        let leeway = i128::from(LEEWAY_SECONDS);
        let max_ttl = i128::from(self.max_ttl.as_secs());
        if exp <= iat || exp - iat > max_ttl || iat > now + leeway || exp < now - leeway {
            return Err(Refusal::Lifetime);
        }
        let [host] = <[HostRef; 1]>::try_from(claims.host_refs).map_err(|_| Refusal::HostRefs)?;
        // Names that are not Kubernetes names never reach a request path.
        if !apis::validation::is_dns1123_label(&host.namespace)
            || !apis::validation::is_dns1123_subdomain(&host.name)
            || claims.host_uid.is_empty()
        {
            return Err(Refusal::HostRefs);
        }
        if claims.capabilities != [CAPABILITY] {
            return Err(Refusal::Capabilities);
        }
        Ok(HostIdentity {
            host,
            uid: claims.host_uid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostapi::settings::{load_public_key, tests::keys};
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{json, Value};

    /// jsonwebtoken checks `exp` against the real clock: the tests use it too.
    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn verifier() -> Verifier {
        let der = load_public_key(&keys().spki_pem).unwrap();
        Verifier::new(
            &der,
            "https://issuer.mcp.internal",
            &BTreeSet::from(["mcp-host-api".to_string(), "second".to_string()]),
            Duration::from_secs(600),
        )
    }

    fn claims() -> Value {
        let t = now();
        json!({
            "iss": "https://issuer.mcp.internal",
            "aud": ["second", "mcp-host-api"],
            "iat": t - 10,
            "exp": t + 290,
            "hostRefs": [{"namespace": "team-a", "name": "dev"}],
            "host_uid": "uid-1",
            "capabilities": [CAPABILITY],
        })
    }

    fn sign(claims: &Value) -> String {
        let pem = std::fs::read(&keys().private_pem).unwrap();
        jsonwebtoken::encode(
            &Header::new(Algorithm::RS256),
            claims,
            &EncodingKey::from_rsa_pem(&pem).unwrap(),
        )
        .unwrap()
    }

    fn with(change: impl FnOnce(&mut Value)) -> String {
        let mut c = claims();
        change(&mut c);
        sign(&c)
    }

    #[test]
    fn a_valid_token_names_its_host() {
        let id = verifier().verify(&sign(&claims()), now()).unwrap();
        assert_eq!(
            id,
            HostIdentity {
                host: HostRef {
                    namespace: "team-a".into(),
                    name: "dev".into()
                },
                uid: "uid-1".into()
            }
        );
    }

    #[test]
    fn token_matrix() {
        let t = now();
        let v = verifier();
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let alg_none = format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "JWT"})),
            b64(&claims())
        );
        let public_pem = std::fs::read(&keys().spki_pem).unwrap();
        let hs256 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(&public_pem),
        )
        .unwrap();
        let signed = sign(&claims());
        let (head, rest) = signed.split_once('.').unwrap();
        let _ = head;
        let forged_alg = format!("{}.{rest}", b64(&json!({"alg": "HS256", "typ": "JWT"})));
        let cases: Vec<(&str, String, Refusal)> = vec![
            ("empty", String::new(), Refusal::Invalid),
            ("garbage", "a.b.c".into(), Refusal::Invalid),
            ("alg none", alg_none, Refusal::Invalid),
            ("HS256 with the public key", hs256, Refusal::Invalid),
            (
                "RS256 signature under an HS256 header",
                forged_alg,
                Refusal::Invalid,
            ),
            (
                "wrong issuer",
                with(|c| c["iss"] = json!("https://other")),
                Refusal::Invalid,
            ),
            (
                "missing issuer",
                with(|c| {
                    c.as_object_mut().unwrap().remove("iss");
                }),
                Refusal::Invalid,
            ),
            (
                "wrong audience",
                with(|c| c["aud"] = json!(["other"])),
                Refusal::Audience,
            ),
            (
                "missing one audience",
                with(|c| c["aud"] = json!("mcp-host-api")),
                Refusal::Audience,
            ),
            (
                "extra audience",
                with(|c| c["aud"] = json!(["mcp-host-api", "second", "extra"])),
                Refusal::Audience,
            ),
            (
                "expired",
                with(|c| {
                    c["iat"] = json!(t - 400);
                    c["exp"] = json!(t - 31);
                }),
                Refusal::Invalid,
            ),
            (
                "ttl over the maximum",
                // Both from `t`: `claims()` reads the clock again, maybe a second later.
                with(|c| {
                    c["iat"] = json!(t - 10);
                    c["exp"] = json!(t - 10 + 601);
                }),
                Refusal::Lifetime,
            ),
            (
                "issued in the future",
                with(|c| {
                    c["iat"] = json!(t + 60);
                    c["exp"] = json!(t + 120);
                }),
                Refusal::Lifetime,
            ),
            (
                "missing iat",
                with(|c| {
                    c.as_object_mut().unwrap().remove("iat");
                }),
                Refusal::Invalid,
            ),
            (
                "two hostRefs",
                with(|c| {
                    c["hostRefs"] = json!([
                        {"namespace": "team-a", "name": "dev"},
                        {"namespace": "team-b", "name": "dev"}
                    ])
                }),
                Refusal::HostRefs,
            ),
            (
                "no hostRefs",
                with(|c| c["hostRefs"] = json!([])),
                Refusal::HostRefs,
            ),
            (
                "a host name that is a path",
                with(|c| c["hostRefs"] = json!([{"namespace": "team-a", "name": "../../x"}])),
                Refusal::HostRefs,
            ),
            (
                "a namespace that is not a DNS label",
                with(|c| c["hostRefs"] = json!([{"namespace": "Team.A", "name": "dev"}])),
                Refusal::HostRefs,
            ),
            (
                "empty host_uid",
                with(|c| c["host_uid"] = json!("")),
                Refusal::HostRefs,
            ),
            (
                "extra capability",
                with(|c| c["capabilities"] = json!([CAPABILITY, "mcp:admin"])),
                Refusal::Capabilities,
            ),
            (
                "missing capability",
                with(|c| c["capabilities"] = json!([])),
                Refusal::Capabilities,
            ),
            (
                "other capability",
                with(|c| c["capabilities"] = json!(["mcp:credential:write"])),
                Refusal::Capabilities,
            ),
            (
                "an issuer array holding the issuer",
                with(|c| c["iss"] = json!(["https://issuer.mcp.internal", "https://evil"])),
                Refusal::Invalid,
            ),
            (
                "an iat so far back that exp - iat overflows 64 bits",
                with(|c| c["iat"] = json!(i64::MIN)),
                Refusal::Invalid,
            ),
            (
                "an iat at the epoch with exp decades ahead",
                with(|c| {
                    c["iat"] = json!(0);
                    c["exp"] = json!(t + 86_400 * 365 * 30);
                }),
                Refusal::Lifetime,
            ),
            (
                "a fractional exp",
                with(|c| c["exp"] = json!(t as f64 + 100.5)),
                Refusal::Invalid,
            ),
            (
                "an nbf that is not a number",
                with(|c| c["nbf"] = json!("later")),
                Refusal::Invalid,
            ),
            (
                "not valid before a time still ahead",
                with(|c| c["nbf"] = json!(t + 200)),
                Refusal::Invalid,
            ),
        ];
        for (name, token, refusal) in cases {
            assert_eq!(v.verify(&token, t), Err(refusal), "{name}");
        }
        // Within the leeway, an expired token still passes; the exact ttl maximum too.
        let just = with(|c| {
            c["iat"] = json!(t - 620);
            c["exp"] = json!(t - 20);
        });
        assert!(v.verify(&just, t).is_ok());
    }
}
