//! The listeners: HTTP/1.1 and h2c (hyper-util auto), a header read timeout, bounded header
//! sizes, a connection cap (a semaphore taken before `accept`, so the excess waits in the
//! kernel's backlog), an idle timeout on connections with no request in flight, and a
//! graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use super::http::ResponseBody;

/// Largest request head (HTTP/1.1 read buffer, HTTP/2 header list).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Connection limits and timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long open connections may drain after shutdown starts.
    pub drain: Duration,
}

/// One connection's request accounting, for the idle timeout.
struct Activity {
    in_flight: AtomicUsize,
    last: std::sync::Mutex<Instant>,
}

struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        *self.0.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

/// Serves `handler` on `listener` until `shutdown` becomes true, then drains for at most
/// `limits.drain`. `handler` gets each request and a notifier that aborts its connection.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Incoming>, Arc<Notify>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let builder = Arc::new(builder);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped(&mut shutdown) => break,
        };
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let handler = handler.clone();
        let mut shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            let abort = Arc::new(Notify::new());
            let activity = Arc::new(Activity {
                in_flight: AtomicUsize::new(0),
                last: std::sync::Mutex::new(Instant::now()),
            });
            let service = {
                let abort = abort.clone();
                let activity = activity.clone();
                service_fn(move |req: Request<Incoming>| {
                    activity.in_flight.fetch_add(1, Ordering::AcqRel);
                    let guard = InFlight(activity.clone());
                    let response = handler(req, abort.clone());
                    async move {
                        let resp = response.await;
                        // In flight until the response body is done (a stream is activity).
                        let (parts, body) = resp.into_parts();
                        let body = http_body_util::BodyExt::boxed(GuardedBody { inner: body, _guard: guard });
                        Ok::<_, Infallible>(Response::from_parts(parts, body))
                    }
                })
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let mut tick = tokio::time::interval(Duration::from_secs(1).min(limits.idle_timeout));
            let mut draining = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = abort.notified() => break,
                    _ = stopped(&mut shutdown), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = tick.tick(), if !draining => {
                        let idle = activity.in_flight.load(Ordering::Acquire) == 0
                            && activity.last.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= limits.idle_timeout;
                        if idle {
                            draining = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        });
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
}

/// Resolves once shutdown starts (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A response body that keeps its request counted as in flight until it is dropped.
struct GuardedBody {
    inner: ResponseBody,
    _guard: InFlight,
}

impl hyper::body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = super::cut::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
