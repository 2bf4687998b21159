//! The claims of a session token (docs/session-tokens.md), typed strictly: a claim of another
//! shape (a string `exp`, a negative or fractional time, an `aud` that is not an array, a
//! private claim without a session uid) fails to decode and the token is refused.

use serde::Deserialize;

/// The private claim's name.
pub const PRIVATE_CLAIM: &str = "access.mcp-runtime.dev";

/// The session a token points at.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct SessionRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The MCPServer generation the session is for.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ServerClaim {
    pub name: String,
    pub uid: String,
}

/// `access.mcp-runtime.dev`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct AccessClaim {
    pub session: SessionRef,
    pub server: ServerClaim,
    /// The agent the session names, when it names one.
    #[serde(default)]
    pub agent: Option<String>,
    /// The person the session names, when it names one.
    #[serde(default)]
    pub subject: Option<String>,
}

/// What a verified token says. Times are whole Unix seconds.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct SessionClaims {
    pub iss: String,
    /// `system:accesssession:<namespace>:<name>`.
    pub sub: String,
    /// Always an array in this contract.
    pub aud: Vec<String>,
    pub exp: u64,
    pub iat: u64,
    #[serde(default)]
    pub nbf: Option<u64>,
    pub jti: String,
    #[serde(rename = "access.mcp-runtime.dev")]
    pub access: AccessClaim,
}

impl SessionClaims {
    /// The session's namespace.
    pub fn namespace(&self) -> &str {
        &self.access.session.namespace
    }

    /// The session's name.
    pub fn name(&self) -> &str {
        &self.access.session.name
    }

    /// Whether the private claim is well formed and agrees with `sub`: Kubernetes names (they
    /// go into cache keys and request paths), non-empty UIDs, and `sub` naming the same
    /// session.
    pub(crate) fn well_formed(&self) -> bool {
        let s = &self.access.session;
        apis::validation::is_dns1123_label(&s.namespace)
            && apis::validation::is_dns1123_subdomain(&s.name)
            && !s.uid.is_empty()
            && !self.access.server.uid.is_empty()
            && !self.jti.is_empty()
            && self.sub == format!("system:accesssession:{}:{}", s.namespace, s.name)
    }
}
