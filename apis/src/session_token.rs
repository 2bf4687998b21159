//! Session tokens (docs/session-tokens.md): the rules of the `token` subresource of
//! AccessSession as pure functions — which sessions may have a token, how long it lives, which
//! audience it names, what a `TokenRequest` may ask for — and the claims it carries. The
//! apiserver signs; gateways verify; both read the claims through [`SessionTokenClaims`].

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::types::{AccessSession, SessionPhase};
use crate::validation::FieldError;

/// `apiVersion` of the request and the answer (the ServiceAccount `token` subresource's).
pub const TOKEN_REQUEST_API_VERSION: &str = "authentication.k8s.io/v1";
/// Group of [`TOKEN_REQUEST_API_VERSION`].
pub const TOKEN_REQUEST_GROUP: &str = "authentication.k8s.io";
/// Version of [`TOKEN_REQUEST_API_VERSION`].
pub const TOKEN_REQUEST_VERSION: &str = "v1";
/// `kind` of the request and the answer.
pub const TOKEN_REQUEST_KIND: &str = "TokenRequest";
/// The subresource's name: `accesssessions/token`.
pub const TOKEN_SUBRESOURCE: &str = "token";
/// Lifetime asked for when `spec.expirationSeconds` is absent.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 600;
/// The shortest lifetime that may be asked for.
pub const MIN_EXPIRATION_SECONDS: i64 = 10;
/// At most this many `spec.audiences`.
pub const MAX_AUDIENCES: usize = 4;
/// The longest audience accepted (a URI, not a document).
const MAX_AUDIENCE_LEN: usize = 2048;
/// The key of the private claim.
pub const PRIVATE_CLAIM: &str = "access.mcp-runtime.dev";
/// The only signing algorithm.
pub const ALGORITHM: &str = "ES256";
/// The default `--session-token-audience-template`: the Service URL of a server's gateway.
pub const DEFAULT_AUDIENCE_TEMPLATE: &str = "http://{server}.{namespace}.svc:8086";

/// The `spec` of a `TokenRequest` as asked (every field optional; [`check_request`] decides).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequestSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audiences: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<i64>,
    /// Refused when present: a session token is bound to its session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_object_ref: Option<serde_json::Value>,
}

/// A `TokenRequest` body as sent; `metadata` and `status` are ignored, as kube ignores them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequestBody {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub spec: Option<TokenRequestSpec>,
}

/// Why a body is not a `TokenRequest` at all (400, not 422).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MalformedRequest {
    #[error("the body is not a TokenRequest: {0}")]
    Json(String),
    #[error("the body is a {0}, not an authentication.k8s.io/v1 TokenRequest")]
    WrongKind(String),
}

/// Parses a `TokenRequest` body: JSON, and `apiVersion`/`kind`, when given, those of
/// `authentication.k8s.io/v1` `TokenRequest`.
pub fn parse_request(body: &[u8]) -> Result<TokenRequestSpec, MalformedRequest> {
    let parsed: TokenRequestBody =
        serde_json::from_slice(body).map_err(|e| MalformedRequest::Json(e.to_string()))?;
    let api_version = parsed.api_version.as_deref().unwrap_or("");
    let kind = parsed.kind.as_deref().unwrap_or("");
    if (!api_version.is_empty() && api_version != TOKEN_REQUEST_API_VERSION)
        || (!kind.is_empty() && kind != TOKEN_REQUEST_KIND)
    {
        return Err(MalformedRequest::WrongKind(format!("{api_version} {kind}")));
    }
    Ok(parsed.spec.unwrap_or_default())
}

/// What a valid request asks for, defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenAsk {
    /// Empty: the server's resource URI.
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
}

/// Checks a request's fields (422 when any error is returned): no `boundObjectRef`, at most
/// [`MAX_AUDIENCES`] absolute `http`/`https` audiences, `expirationSeconds` at least
/// [`MIN_EXPIRATION_SECONDS`].
pub fn check_request(spec: &TokenRequestSpec) -> Result<TokenAsk, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.bound_object_ref.is_some() {
        errors.push(FieldError::forbidden(
            "spec.boundObjectRef",
            "a session token is bound to its session; boundObjectRef is not supported",
        ));
    }
    let audiences = spec.audiences.clone().unwrap_or_default();
    if audiences.len() > MAX_AUDIENCES {
        errors.push(FieldError::invalid(
            "spec.audiences",
            format!(
                "at most {MAX_AUDIENCES} audiences may be asked for, got {}",
                audiences.len()
            ),
        ));
    }
    for (i, audience) in audiences.iter().enumerate() {
        if !is_absolute_http_uri(audience) {
            errors.push(FieldError::invalid(
                format!("spec.audiences[{i}]"),
                format!("{audience:?} is not an absolute http or https URI"),
            ));
        }
    }
    let expiration_seconds = spec
        .expiration_seconds
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    if expiration_seconds < MIN_EXPIRATION_SECONDS {
        errors.push(FieldError::invalid(
            "spec.expirationSeconds",
            format!("may not specify a duration less than {MIN_EXPIRATION_SECONDS} seconds"),
        ));
    }
    if errors.is_empty() {
        Ok(TokenAsk {
            audiences,
            expiration_seconds,
        })
    } else {
        Err(errors)
    }
}

/// Whether `s` is an absolute `http` or `https` URI with a host: no whitespace or control
/// characters, no fragment.
pub fn is_absolute_http_uri(s: &str) -> bool {
    let rest = match s.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => rest,
        _ => return false,
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    s.len() <= MAX_AUDIENCE_LEN
        && !host.is_empty()
        && !host.starts_with(':')
        && !s.contains('#')
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Why a session may not have a token now (409).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotMintable {
    #[error("the session is revoked")]
    Revoked,
    #[error("the session has expired")]
    Expired,
    #[error("the session is pending enrollment")]
    PendingEnrollment,
    #[error("the session's server (uid {0}) is retired")]
    Fenced(String),
}

impl NotMintable {
    /// The `reason` label of the refusal metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Revoked => "revoked",
            Self::Expired => "expired",
            Self::PendingEnrollment => "pending_enrollment",
            Self::Fenced(_) => "fenced",
        }
    }
}

/// Whether `session` may have a token at `now`: `Active`, with a `spec.expiresAt` still
/// ahead (a session past it is expired whether or not the server wrote `Expired` yet), and
/// its server not `fenced`. Returns the session's `expiresAt`.
pub fn mintable(
    session: &AccessSession,
    now: Timestamp,
    fenced: bool,
) -> Result<Timestamp, NotMintable> {
    match session.phase() {
        SessionPhase::Active => {}
        SessionPhase::Revoked => return Err(NotMintable::Revoked),
        SessionPhase::Expired => return Err(NotMintable::Expired),
        SessionPhase::PendingEnrollment => return Err(NotMintable::PendingEnrollment),
    }
    let expires_at = match session.spec.expires_at.as_ref() {
        Some(t) if t.0 > now => t.0,
        _ => return Err(NotMintable::Expired),
    };
    if fenced {
        return Err(NotMintable::Fenced(session.spec.server.uid.clone()));
    }
    Ok(expires_at)
}

/// The token's `exp` (Unix seconds): the earliest of now + `expiration_seconds`, now +
/// `max_ttl_seconds` and the session's `expires_at`.
pub fn token_expiry(
    now: Timestamp,
    expiration_seconds: i64,
    max_ttl_seconds: i64,
    session_expires_at: Timestamp,
) -> i64 {
    let now = now.as_second();
    now.saturating_add(expiration_seconds)
        .min(now.saturating_add(max_ttl_seconds))
        .min(session_expires_at.as_second())
}

/// An audience template with `{server}` and `{namespace}` filled in.
pub fn render_audience(template: &str, server: &str, namespace: &str) -> String {
    template
        .replace("{server}", server)
        .replace("{namespace}", namespace)
}

/// The `sub` of a session's tokens.
pub fn subject_of(namespace: &str, name: &str) -> String {
    format!("system:accesssession:{namespace}:{name}")
}

/// The claims of a session token, exactly as docs/session-tokens.md lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTokenClaims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "access.mcp-runtime.dev")]
    pub access: AccessClaim,
}

/// The private claim: which session, of which server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessClaim {
    pub session: SessionClaim,
    pub server: ServerClaim,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// The session a token points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The server generation the session is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerClaim {
    pub name: String,
    pub uid: String,
}

impl SessionTokenClaims {
    /// The claims of a token for `session`, issued by `issuer` at `now` for `audiences`,
    /// expiring at `exp`, with the token id `jti`.
    pub fn for_session(
        session: &AccessSession,
        issuer: &str,
        audiences: Vec<String>,
        now: Timestamp,
        exp: i64,
        jti: String,
    ) -> Self {
        let namespace = session.metadata.namespace.clone().unwrap_or_default();
        let name = session.metadata.name.clone().unwrap_or_default();
        Self {
            iss: issuer.to_string(),
            sub: subject_of(&namespace, &name),
            aud: audiences,
            exp,
            iat: now.as_second(),
            nbf: now.as_second(),
            jti,
            access: AccessClaim {
                session: SessionClaim {
                    namespace,
                    name,
                    uid: session.metadata.uid.clone().unwrap_or_default(),
                },
                server: ServerClaim {
                    name: session.spec.server.name.clone(),
                    uid: session.spec.server.uid.clone(),
                },
                agent: session.spec.agent.as_ref().map(|a| a.name.clone()),
                subject: session.spec.subject.as_ref().map(|s| s.user.clone()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AccessSessionStatus, AgentRef, ServerRef, Subject};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("a valid instant")
    }

    fn mk_session(phase: SessionPhase, expires_at: i64) -> AccessSession {
        let mut session = AccessSession::default();
        session.metadata.namespace = Some("demo".into());
        session.metadata.name = Some("bot-github".into());
        session.metadata.uid = Some("session-uid".into());
        session.spec.server = ServerRef {
            name: "github".into(),
            uid: "server-uid".into(),
        };
        session.spec.expires_at = Some(Time(at(expires_at)));
        session.status = Some(AccessSessionStatus {
            phase,
            ..Default::default()
        });
        session
    }

    #[test]
    fn only_active_unexpired_unfenced_sessions_are_mintable() {
        let now = at(1_000);
        let active = mk_session(SessionPhase::Active, 2_000);
        assert_eq!(mintable(&active, now, false), Ok(at(2_000)));
        assert_eq!(
            mintable(&active, now, true),
            Err(NotMintable::Fenced("server-uid".into()))
        );
        assert_eq!(
            mintable(&mk_session(SessionPhase::Revoked, 2_000), now, false),
            Err(NotMintable::Revoked)
        );
        assert_eq!(
            mintable(&mk_session(SessionPhase::Expired, 2_000), now, false),
            Err(NotMintable::Expired)
        );
        assert_eq!(
            mintable(
                &mk_session(SessionPhase::PendingEnrollment, 2_000),
                now,
                false
            ),
            Err(NotMintable::PendingEnrollment)
        );
        // Past expiresAt but not yet written Expired.
        assert_eq!(
            mintable(&mk_session(SessionPhase::Active, 1_000), now, false),
            Err(NotMintable::Expired)
        );
    }

    #[test]
    fn expiry_is_the_earliest_bound() {
        let now = at(1_000);
        assert_eq!(token_expiry(now, 600, 3600, at(10_000)), 1_600);
        assert_eq!(token_expiry(now, 7200, 3600, at(10_000)), 4_600);
        assert_eq!(token_expiry(now, 600, 3600, at(1_100)), 1_100);
    }

    #[test]
    fn requests_are_checked() {
        let ask = check_request(&TokenRequestSpec::default()).expect("an empty spec is valid");
        assert_eq!(ask.expiration_seconds, DEFAULT_EXPIRATION_SECONDS);
        assert!(ask.audiences.is_empty());

        let fields = |spec: TokenRequestSpec| -> Vec<String> {
            check_request(&spec)
                .expect_err("refused")
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        assert_eq!(
            fields(TokenRequestSpec {
                expiration_seconds: Some(9),
                ..Default::default()
            }),
            ["spec.expirationSeconds"]
        );
        assert_eq!(
            fields(TokenRequestSpec {
                bound_object_ref: Some(serde_json::json!({"kind": "Pod"})),
                ..Default::default()
            }),
            ["spec.boundObjectRef"]
        );
        assert_eq!(
            fields(TokenRequestSpec {
                audiences: Some(vec![
                    "mcp-runtime-gateway".into(),
                    "https://ok.example".into()
                ]),
                ..Default::default()
            }),
            ["spec.audiences[0]"]
        );
        assert_eq!(
            fields(TokenRequestSpec {
                audiences: Some(vec!["https://a.example".into(); 5]),
                ..Default::default()
            }),
            ["spec.audiences"]
        );
    }

    #[test]
    fn audiences_are_absolute_http_uris() {
        for good in [
            "http://github.demo.svc:8086",
            "https://mcp.example.com/github",
            "HTTPS://x",
        ] {
            assert!(is_absolute_http_uri(good), "{good}");
        }
        for bad in [
            "",
            "github",
            "ftp://x",
            "http://",
            "http:///path",
            "https://x/a b",
            "https://x/#frag",
            "//x",
            "http://:80",
        ] {
            assert!(!is_absolute_http_uri(bad), "{bad}");
        }
    }

    #[test]
    fn bodies_parse_strictly_by_kind() {
        let spec = parse_request(
            br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":60}}"#,
        )
        .expect("parses");
        assert_eq!(spec.expiration_seconds, Some(60));
        assert!(matches!(
            parse_request(br#"{"apiVersion":"v1","kind":"Pod"}"#),
            Err(MalformedRequest::WrongKind(_))
        ));
        assert!(matches!(
            parse_request(br#"{"spec":{"expirationSeconds":"ten"}}"#),
            Err(MalformedRequest::Json(_))
        ));
        assert!(matches!(
            parse_request(b"not json"),
            Err(MalformedRequest::Json(_))
        ));
    }

    #[test]
    fn claims_name_the_session_and_only_present_parties() {
        let mut session = mk_session(SessionPhase::Active, 5_000);
        let claims = SessionTokenClaims::for_session(
            &session,
            "iss",
            vec!["aud".into()],
            at(1_000),
            1_600,
            "j".into(),
        );
        let json = serde_json::to_value(&claims).expect("serializes");
        assert_eq!(json["sub"], "system:accesssession:demo:bot-github");
        assert_eq!(json["iat"], 1_000);
        assert_eq!(json["nbf"], 1_000);
        let private = &json[PRIVATE_CLAIM];
        assert_eq!(
            private,
            &serde_json::json!({
                "session": {"namespace": "demo", "name": "bot-github", "uid": "session-uid"},
                "server": {"name": "github", "uid": "server-uid"},
            })
        );
        session.spec.agent = Some(AgentRef {
            name: "billing-bot".into(),
            uid: Some("agent-uid".into()),
            calls_per_minute: None,
        });
        session.spec.subject = Some(Subject {
            user: "alice@example.com".into(),
        });
        let claims =
            SessionTokenClaims::for_session(&session, "iss", vec![], at(1_000), 1_600, "j".into());
        assert_eq!(claims.access.agent.as_deref(), Some("billing-bot"));
        assert_eq!(claims.access.subject.as_deref(), Some("alice@example.com"));
    }

    #[test]
    fn audience_templates_fill_server_and_namespace() {
        assert_eq!(
            render_audience(DEFAULT_AUDIENCE_TEMPLATE, "github", "demo"),
            "http://github.demo.svc:8086"
        );
    }
}
