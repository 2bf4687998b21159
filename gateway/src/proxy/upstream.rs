//! The upstream MCP server: an HTTP/1.1 client to `--upstream` (plain `http://`, expected on
//! loopback inside the pod: TLS to a container in the same network namespace adds nothing, so
//! `https://` is refused at startup). Hop-by-hop headers are stripped both ways; the client's
//! `Authorization` and any `X-MCP-Access-*` it sent never reach the upstream, which gets the
//! session's identity in [`SESSION_HEADER`] and its siblings instead.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::mcp::encode_header_value;
use crate::credential::SessionClaims;

pub use crate::credential::resource::{
    AGENT_HEADER, SESSION_HEADER, SESSION_UID_HEADER, SUBJECT_HEADER,
};
/// The prefix no client may send.
const IDENTITY_PREFIX: &str = "x-mcp-access-";

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Why the upstream gave no response head.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Refused, reset, or died before answering: 502.
    #[error("upstream unavailable: {0}")]
    Unavailable(String),
    /// No response head within the timeout: 504.
    #[error("upstream gave no response within {0:?}")]
    Timeout(Duration),
}

/// Where requests go and how long they may take.
#[derive(Clone, Debug)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    base: Uri,
    response_timeout: Duration,
}

/// Checks `--upstream`: an absolute `http://` URL with a host, no query or fragment.
pub fn parse_upstream(raw: &str) -> Result<Uri, String> {
    let uri: Uri = raw.parse().map_err(|e| format!("{raw:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{raw:?}: the upstream must be http:// (on loopback inside the pod)"
        ));
    }
    if uri.host().is_none() || uri.query().is_some() || raw.contains('#') {
        return Err(format!("{raw:?}: an absolute URL with a host and no query"));
    }
    Ok(uri)
}

/// Removes hop-by-hop headers (and those `Connection` names).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(http::header::TRANSFER_ENCODING);
}

/// The headers sent upstream: the client's minus hop-by-hop, credentials and any identity
/// header it made up; plus the session's identity.
pub fn upstream_headers(client: &HeaderMap, claims: &SessionClaims) -> HeaderMap {
    let mut headers = client.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(http::header::AUTHORIZATION);
    headers.remove(http::header::CONTENT_LENGTH);
    headers.remove(http::header::HOST);
    let forged: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with(IDENTITY_PREFIX))
        .cloned()
        .collect();
    for name in forged {
        headers.remove(name);
    }
    let mut put = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(&encode_header_value(value)) {
            headers.insert(name, v);
        }
    };
    put(
        SESSION_HEADER,
        &format!("{}/{}", claims.namespace(), claims.name()),
    );
    put(SESSION_UID_HEADER, &claims.access.session.uid);
    if let Some(subject) = &claims.access.subject {
        put(SUBJECT_HEADER, subject);
    }
    if let Some(agent) = &claims.access.agent {
        put(AGENT_HEADER, agent);
    }
    headers
}

impl Upstream {
    /// A client of `base` (checked by [`parse_upstream`]).
    pub fn new(base: Uri, connect_timeout: Duration, response_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            client,
            base,
            response_timeout,
        }
    }

    /// The upstream base URL.
    pub fn base(&self) -> &Uri {
        &self.base
    }

    /// The upstream URL of a request for `path_and_query` (appended to the base's path).
    fn target(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        let prefix = self.base.path().trim_end_matches('/');
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(
            format!("{prefix}{path_and_query}")
                .parse()
                .map_err(|e| UpstreamError::Unavailable(format!("bad target path: {e}")))?,
        );
        Uri::from_parts(parts).map_err(|e| UpstreamError::Unavailable(e.to_string()))
    }

    /// Sends a request; the response head must come within the response timeout.
    pub async fn send(
        &self,
        method: http::Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut request = Request::builder()
            .method(method)
            .uri(self.target(path_and_query)?)
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Unavailable(e.to_string()))?;
        *request.headers_mut() = headers;
        match tokio::time::timeout(self.response_timeout, self.client.request(request)).await {
            Err(_) => Err(UpstreamError::Timeout(self.response_timeout)),
            Ok(Err(e)) => Err(UpstreamError::Unavailable(e.to_string())),
            Ok(Ok(mut response)) => {
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::{AccessClaim, ServerClaim, SessionRef};

    fn claims(subject: Option<&str>) -> SessionClaims {
        SessionClaims {
            iss: "i".into(),
            sub: "system:accesssession:demo:s".into(),
            aud: vec!["a".into()],
            exp: 2,
            iat: 1,
            nbf: None,
            jti: "j".into(),
            access: AccessClaim {
                session: SessionRef {
                    namespace: "demo".into(),
                    name: "s".into(),
                    uid: "uid-1".into(),
                },
                server: ServerClaim {
                    name: "github".into(),
                    uid: "srv".into(),
                },
                agent: None,
                subject: subject.map(str::to_string),
            },
        }
    }

    #[test]
    fn credentials_and_forged_identity_never_pass() {
        let mut client = HeaderMap::new();
        client.insert("authorization", HeaderValue::from_static("Bearer secret"));
        client.insert("x-mcp-access-subject", HeaderValue::from_static("root"));
        client.insert("X-MCP-Access-Agent", HeaderValue::from_static("root"));
        client.insert("connection", HeaderValue::from_static("keep-alive, x-drop"));
        client.insert("x-drop", HeaderValue::from_static("1"));
        client.insert("te", HeaderValue::from_static("trailers"));
        client.insert("mcp-session-id", HeaderValue::from_static("m1"));
        client.insert(
            "accept",
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let out = upstream_headers(&client, &claims(Some("alice@example.com")));
        assert!(out.get("authorization").is_none());
        assert!(
            out.get("x-drop").is_none()
                && out.get("te").is_none()
                && out.get("connection").is_none()
        );
        assert_eq!(out["x-mcp-access-session"], "demo/s");
        assert_eq!(out["x-mcp-access-session-uid"], "uid-1");
        assert_eq!(out["x-mcp-access-subject"], "alice@example.com");
        assert!(
            out.get("x-mcp-access-agent").is_none(),
            "the forged one is gone, none is named"
        );
        assert_eq!(out["mcp-session-id"], "m1");
        assert_eq!(out["accept"], "application/json, text/event-stream");
        let out = upstream_headers(&HeaderMap::new(), &claims(Some("jürgen")));
        assert_eq!(out["x-mcp-access-subject"], "=?base64?asO8cmdlbg==?=");
    }

    #[test]
    fn upstream_urls() {
        assert!(parse_upstream("http://127.0.0.1:3000").is_ok());
        assert!(parse_upstream("http://127.0.0.1:3000/base").is_ok());
        for bad in [
            "https://127.0.0.1:3000",
            "127.0.0.1:3000",
            "/mcp",
            "http://h/?q=1",
            "ftp://h",
        ] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
        let u = Upstream::new(
            parse_upstream("http://127.0.0.1:3000/base/").unwrap(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert_eq!(
            u.target("/mcp?x=1").unwrap().to_string(),
            "http://127.0.0.1:3000/base/mcp?x=1"
        );
    }
}
