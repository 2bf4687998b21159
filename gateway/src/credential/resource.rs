//! The protected resource as clients and proxies see it (RFC 9728, RFC 6750): where its
//! metadata document is, what the document says, the challenge of a 401, and the headers that
//! name a deny reason and the session's identity. One wire shape for `mcp-access-gateway` and
//! `mcp-access-authz`.

use serde_json::{json, Value};

/// RFC 9728's well-known path of a protected resource's metadata.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The response header carrying the deny reason.
pub const DENY_REASON_HEADER: &str = "x-mcp-deny-reason";
/// `<namespace>/<name>` of the AccessSession.
pub const SESSION_HEADER: &str = "x-mcp-access-session";
/// The AccessSession's uid.
pub const SESSION_UID_HEADER: &str = "x-mcp-access-session-uid";
/// The person the session names (absent when it names none).
pub const SUBJECT_HEADER: &str = "x-mcp-access-subject";
/// The agent the session names (absent when it names none).
pub const AGENT_HEADER: &str = "x-mcp-access-agent";
/// The reason of a request that carried no token: its challenge names no `error` (RFC 6750 §3.1).
pub const TOKEN_MISSING: &str = "token_missing";

/// `scheme://authority` and the path without a trailing `/` (empty for the root).
fn split_origin(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => {
            let (origin, path) = url.split_at(after_scheme + i);
            (origin, path.trim_end_matches('/'))
        }
        None => (url, ""),
    }
}

/// `<origin>/.well-known/oauth-protected-resource<path>` of `public_url` (RFC 9728 §3.1: the
/// path-suffixed form when the resource has a path).
pub fn metadata_url(public_url: &str) -> String {
    let (origin, path) = split_origin(public_url);
    format!("{origin}{METADATA_PATH}{path}")
}

/// The path part of [`metadata_url`], where the document is served.
pub fn metadata_path(public_url: &str) -> String {
    format!("{METADATA_PATH}{}", split_origin(public_url).1)
}

/// The metadata document: the resource, who issues its tokens, and the one bearer method read.
pub fn metadata_document(public_url: &str, authorization_servers: &[String]) -> Value {
    json!({
        "resource": public_url,
        "authorization_servers": authorization_servers,
        "bearer_methods_supported": ["header"],
    })
}

/// The `WWW-Authenticate` value of a 401 for `reason`.
pub fn challenge(public_url: &str, reason: &str) -> String {
    let metadata = metadata_url(public_url);
    if reason == TOKEN_MISSING {
        format!("Bearer resource_metadata=\"{metadata}\"")
    } else {
        format!(
            "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\", error_description=\"{reason}\""
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_follow_rfc_9728() {
        assert_eq!(split_origin("http://h:1"), ("http://h:1", ""));
        assert_eq!(split_origin("https://h/a/b/"), ("https://h", "/a/b"));
        assert_eq!(
            metadata_url("http://github.demo.svc:8086"),
            "http://github.demo.svc:8086/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            metadata_url("https://mcp.example/github/mcp"),
            "https://mcp.example/.well-known/oauth-protected-resource/github/mcp"
        );
        assert_eq!(
            metadata_path("https://mcp.example/github/mcp"),
            "/.well-known/oauth-protected-resource/github/mcp"
        );
        assert_eq!(
            metadata_path("http://github.demo.svc:8086"),
            "/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn a_missing_token_is_challenged_without_an_error_code() {
        assert_eq!(
            challenge("http://g:8086", TOKEN_MISSING),
            "Bearer resource_metadata=\"http://g:8086/.well-known/oauth-protected-resource\""
        );
        assert_eq!(
            challenge("http://g:8086", "session_revoked"),
            "Bearer resource_metadata=\"http://g:8086/.well-known/oauth-protected-resource\", error=\"invalid_token\", error_description=\"session_revoked\""
        );
    }
}
