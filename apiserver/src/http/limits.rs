//! What one request and one user may take: body and object sizes, in-flight and watch limits,
//! listener timeouts, and the bounded body read.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header;

use super::error::{ApiError, ApiResult};
use super::patch;

/// Largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Largest object stored, encoded as JSON: etcd's default request limit (1.5 MiB), which
/// bounds every object behind kube-apiserver. Every stored object is held by the change
/// feed and copied to every watcher, so this bounds memory per object.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Limits and timeouts of the API listener, in the spirit of kube-apiserver's
/// `--max-requests-inflight` and its HTTP server settings.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests other than watches served at once; more get 429.
    pub max_requests_inflight: usize,
    /// Watches one user may hold open at once; more get 429.
    pub max_watches_per_user: usize,
    /// How long a client may take to send a request's headers (kube-apiserver: 32 s).
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight stays open (kube-apiserver: 90 s).
    pub idle_timeout: Duration,
    /// How long a connection may have output pending that the client does not read
    /// before it is dropped: a client that stops reading a watch otherwise pins the
    /// connection and its buffers forever.
    pub write_stall_timeout: Duration,
    /// Interval of HTTP/2 PING keepalives (a peer that stops answering is dropped).
    pub http2_keepalive_interval: Duration,
    /// How long a request other than a watch may take before it is answered 503: a database
    /// that stops answering without closing the connection ends no server-side timeout.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_requests_inflight: 400,
            max_watches_per_user: 100,
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            write_stall_timeout: Duration::from_secs(60),
            http2_keepalive_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// Open watches per user, with a slot released when its watch ends.
#[derive(Default)]
pub(crate) struct WatchCounter {
    open: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One open watch of a user; dropping it frees the slot.
pub struct WatchSlot {
    counter: Arc<WatchCounter>,
    user: String,
}

impl WatchCounter {
    pub(crate) fn try_acquire(self: &Arc<Self>, user: &str, max: usize) -> Option<WatchSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(user.to_string()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(WatchSlot {
            counter: self.clone(),
            user: user.to_string(),
        })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.counter.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// How much of an oversized body is still read (and discarded) before answering 413. Clients
/// built on hyper (kube-rs among them) write the whole body before reading the response: if
/// the server answers and closes the connection early they see a broken pipe, not the Status.
pub(crate) const MAX_DRAINED_BYTES: usize = 4 * MAX_BODY_BYTES;

/// How long a client may take to send a request body (kube-apiserver's default
/// `--request-timeout`).
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) async fn read_body(headers: &http::HeaderMap, body: Body) -> ApiResult<Bytes> {
    use futures::StreamExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_DRAINED_BYTES) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(MAX_BODY_BYTES));
    let mut total = 0usize;
    // A client sending its body slowly holds an in-flight slot: bound it as
    // kube-apiserver's request timeout does.
    let read = async {
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                return Err(ApiError::too_large(MAX_BODY_BYTES));
            };
            total += chunk.len();
            if total > MAX_DRAINED_BYTES {
                break;
            }
            if total <= MAX_BODY_BYTES {
                buf.extend_from_slice(&chunk);
            }
        }
        Ok(())
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .map_err(|_| ApiError::timeout("the request body was not received in time"))??;
    if total > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    // Checked before any parser or recursive walk sees the body: serde_json stops at 128
    // levels, but code walking a parsed Value recursively must never meet a deeper one.
    let depth = patch::json_text_depth(&buf);
    if depth > patch::MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "the request body is nested {depth} levels deep; at most {} are accepted",
            patch::MAX_DEPTH
        )));
    }
    Ok(buf.freeze())
}
