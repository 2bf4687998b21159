//! The egress proxy of a `remote` MCPServer: every request the gateway forwards (any path)
//! goes to the one remote URL, streamed both ways (an SSE response stays a stream). The
//! Pod's NetworkPolicy lets it reach that URL's host and port and nothing else (the
//! `remote` egress binding); the proxy adds no reach of its own: no redirect is followed,
//! and the client's path never changes the destination.
//!
//! What it strips: hop-by-hop headers both ways, `Host` (the remote's own is sent), and the
//! `X-MCP-Access-*` identity the gateway adds for an in-Pod server: who the caller is stays
//! inside the cluster.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};

use super::BridgeError;
use crate::proxy::upstream::strip_hop_by_hop;

/// Where the proxy sends everything.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// The remote MCP endpoint (`http://` or `https://`).
    pub url: reqwest::Url,
    /// Time to connect to the remote (502 after it).
    pub connect_timeout: Duration,
}

/// Parses `--remote`: an absolute `http(s)://` URL with a host and no credentials.
pub fn parse_remote(raw: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(raw).map_err(|e| format!("{raw:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{raw:?}: an http:// or https:// URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{raw:?}: no credentials in the URL"));
    }
    Ok(url)
}

#[derive(Clone)]
struct Proxy {
    client: reqwest::Client,
    url: reqwest::Url,
}

/// Serves the proxy on `listener` until `shutdown` resolves.
pub async fn serve_remote(
    listener: tokio::net::TcpListener,
    config: RemoteConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), BridgeError> {
    // reqwest's TLS is rustls with the process-wide provider: ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(config.connect_timeout)
        .build()
        .map_err(|e| BridgeError::Client(e.to_string()))?;
    let proxy = Proxy {
        client,
        url: config.url,
    };
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(BridgeError::Serve)
}

/// The request headers that go to the remote.
fn outbound_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    let identity: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-mcp-access-"))
        .cloned()
        .collect();
    for k in identity {
        headers.remove(k);
    }
    headers
}

async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let sent = proxy
        .client
        .request(parts.method, proxy.url.clone())
        .headers(outbound_headers(parts.headers))
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let upstream = match sent {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "the remote MCP server is unavailable");
            return (
                StatusCode::BAD_GATEWAY,
                "the remote MCP server is unavailable\n",
            )
                .into_response();
        }
    };
    let status = upstream.status();
    let mut headers = upstream.headers().clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    let mut response = Response::new(Body::from_stream(upstream.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_urls_are_http_with_a_host_and_no_credentials() {
        assert!(parse_remote("https://mcp.example.com/v1/mcp").is_ok());
        assert!(parse_remote("http://127.0.0.1:9000/mcp").is_ok());
        for bad in [
            "ftp://mcp.example.com/",
            "https://user:pw@mcp.example.com/",
            "mcp.example.com",
            "unix:/run/mcp.sock",
        ] {
            assert!(parse_remote(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn identity_and_hop_by_hop_headers_stay_home() {
        let mut h = HeaderMap::new();
        h.insert("x-mcp-access-subject", "alice".parse().unwrap());
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("host", "127.0.0.1:8080".parse().unwrap());
        h.insert("mcp-session-id", "abc".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        let out = outbound_headers(h);
        let mut names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["content-type", "mcp-session-id"]);
    }
}
