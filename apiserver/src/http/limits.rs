//! What one request and one user may take: body and object sizes, in-flight and watch limits,
//! listener timeouts, and the bounded body read.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, Method, Uri};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ApiResult};
use super::patch;

/// Largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Largest object stored, encoded as JSON: etcd's default request limit (1.5 MiB), which
/// bounds every object behind kube-apiserver. Every stored object is held by the change
/// feed and copied to every watcher, so this bounds memory per object.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Limits and timeouts of the API and gateway sync listeners, in the spirit of
/// kube-apiserver's `--max-requests-inflight`, `--max-mutating-requests-inflight` and its
/// HTTP server settings.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Non-mutating requests (get, list; not watches) served at once; more get 429.
    pub max_requests_inflight: usize,
    /// Mutating requests (create, update, patch, delete) served at once; more get 429.
    pub max_mutating_requests_inflight: usize,
    /// Watches one user may hold open at once; more get 429.
    pub max_watches_per_user: usize,
    /// How long a client may take to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long a client may take to send a request's headers. For HTTP/1.1 the clock also
    /// runs while a keep-alive connection waits for its next request (hyper starts it when
    /// it waits for a head); for HTTP/2 it bounds the wait for the first request.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight stays open (kube-apiserver: 90 s),
    /// counted from its last request: bytes that complete no request (pings, a trickled
    /// HTTP/2 header block) do not keep it open.
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
            max_mutating_requests_inflight: 200,
            max_watches_per_user: 100,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            write_stall_timeout: Duration::from_secs(60),
            http2_keepalive_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// Which in-flight pool a request counts against, as kube-apiserver classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// get, list and every other non-mutating method: `--max-requests-inflight`.
    ReadOnly,
    /// create, update, patch, delete: `--max-mutating-requests-inflight`.
    Mutating,
    /// A watch of a collection: not counted (it would hold its slot for its whole life),
    /// bounded per user by `--max-watches-per-user` instead.
    LongRunning,
}

impl RequestKind {
    /// The kind of a request, from its method and URI alone (before authentication).
    pub(crate) fn of(method: &Method, uri: &Uri) -> Self {
        match *method {
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE => Self::Mutating,
            Method::GET | Method::HEAD => {
                // Only what routing would serve as a watch: `?watch=1` on a single object
                // or a bad value of `watch` must not slip past the cap.
                let watch = super::request::Params::parse(uri.query())
                    .and_then(|p| p.is_watch())
                    .unwrap_or(false);
                let segments = super::route::segments(uri.path());
                let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
                let collection = matches!(
                    super::route::Target::parse(&segs),
                    super::route::Target::Resource {
                        name: None,
                        subresource: None,
                        ..
                    }
                );
                if watch && collection {
                    Self::LongRunning
                } else {
                    Self::ReadOnly
                }
            }
            _ => Self::ReadOnly,
        }
    }

    /// The `request_kind` label (kube-apiserver's spelling).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::ReadOnly => "readOnly",
            Self::Mutating => "mutating",
            Self::LongRunning => "watch",
        }
    }
}

/// The two in-flight pools of a listener pair (the API and the sync listener share them).
#[derive(Clone, Debug)]
pub(crate) struct InflightLimiter {
    read_only: Arc<Semaphore>,
    mutating: Arc<Semaphore>,
}

impl InflightLimiter {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            read_only: Arc::new(Semaphore::new(limits.max_requests_inflight)),
            mutating: Arc::new(Semaphore::new(limits.max_mutating_requests_inflight)),
        }
    }

    /// A place for a request of `kind` (none needed for a long-running one), or the 429
    /// kube-apiserver answers when its pool is full: `Retry-After: 1`, reason TooManyRequests.
    pub(crate) fn admit(&self, kind: RequestKind) -> ApiResult<Option<OwnedSemaphorePermit>> {
        let pool = match kind {
            RequestKind::ReadOnly => &self.read_only,
            RequestKind::Mutating => &self.mutating,
            RequestKind::LongRunning => return Ok(None),
        };
        pool.clone().try_acquire_owned().map(Some).map_err(|_| {
            ApiError::too_many_requests("Too many requests, please try again later.", 1)
        })
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

/// The answer to a body not received within its bound: 504 `Timeout`.
pub(crate) fn body_timed_out() -> ApiError {
    ApiError::timeout("the request body was not received in time")
}

/// Whether a request is receiving its body, so that the request timer, when it fires
/// first, still answers a stalled body as the body bound does and not as a storage outage.
#[derive(Debug, Default)]
pub(crate) struct BodyPhase(std::sync::atomic::AtomicBool);

impl BodyPhase {
    pub(crate) fn reading(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) async fn while_reading<T>(&self, read: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.store(true, Relaxed);
        let out = read.await;
        self.0.store(false, Relaxed);
        out
    }
}

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
        .map_err(|_| body_timed_out())??;
    if total > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    // Checked before any parser or recursive walk sees the body: serde_json stops at 128
    // levels, but code walking a parsed Value recursively must never meet a deeper one.
    let scan = patch::scan_json_text(&buf);
    if scan.depth > patch::MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "the request body is nested {} levels deep; at most {} are accepted",
            scan.depth,
            patch::MAX_DEPTH
        )));
    }
    // Refused before it is decoded: PostgreSQL could not store it, and a statement failing
    // in a write group would fail the group's other writes with it.
    if scan.nul {
        return Err(ApiError::bad_request(
            "the request body holds the NUL character (\\u0000) in a string; it cannot be stored",
        ));
    }
    Ok(buf.freeze())
}
