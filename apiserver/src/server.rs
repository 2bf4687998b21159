//! Listeners: the TLS API listener (one task per connection, the verified client chain
//! attached to every request) and the plain-HTTP metrics and probe listener.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::auth::ConnectionInfo;
use crate::http::{AppState, Limits, SyncState};
use crate::store::Store;

/// How long a draining connection may take to finish its requests before it is dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Bounds of the pause after a failed `accept` (Go's net/http uses the same 5 ms .. 1 s).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Most concurrent HTTP/2 streams per connection (kube-apiserver's default).
const HTTP2_MAX_STREAMS: u32 = 250;

/// What a connection has been doing, shared by its I/O, its requests and its supervisor.
struct ConnState {
    started: Instant,
    /// Milliseconds since `started` of the last request's start or end (bytes that complete
    /// no request, such as pings or a trickled header block, do not count).
    last_activity: AtomicU64,
    /// Whether any request has reached the service.
    served: AtomicBool,
    /// Milliseconds since `started` + 1 of the first write the socket refused, 0 if none.
    write_blocked_since: AtomicU64,
    /// Requests whose response has not been fully sent.
    in_flight: AtomicUsize,
}

impl ConnState {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            last_activity: AtomicU64::new(0),
            served: AtomicBool::new(false),
            write_blocked_since: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
    fn touch(&self) {
        self.last_activity.store(self.now(), Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        Duration::from_millis(
            self.now()
                .saturating_sub(self.last_activity.load(Ordering::Relaxed)),
        )
    }
    fn write_stalled_for(&self) -> Duration {
        match self.write_blocked_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now().saturating_sub(since - 1)),
        }
    }
}

/// The connection's I/O, recording activity and refused writes in its [`ConnState`].
struct Tracked<T> {
    io: T,
    state: Arc<ConnState>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, data);
        self.record_write(&result);
        result
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.record_write(&result);
        result
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.record_write(&result);
        result
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T> Tracked<T> {
    fn record_write<R>(&self, result: &Poll<std::io::Result<R>>) {
        match result {
            Poll::Pending => {
                let since = self.state.now() + 1;
                let _ = self.state.write_blocked_since.compare_exchange(
                    0,
                    since,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            Poll::Ready(_) => {
                self.state.write_blocked_since.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// Decrements the connection's in-flight count when a response has been sent (its body
/// dropped), however that ends.
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// What a TLS listener serves: the API, or the gateway sync API.
pub trait Application: Clone + Send + Sync + 'static {
    fn limits(&self) -> &Limits;
    fn call(self, request: axum::extract::Request) -> impl Future<Output = Response> + Send;
}

impl<S: Store + Clone> Application for AppState<S> {
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn call(self, request: axum::extract::Request) -> impl Future<Output = Response> + Send {
        self.handle(request)
    }
}

impl<S: Store + Clone> Application for SyncState<S> {
    fn limits(&self) -> &Limits {
        SyncState::limits(self)
    }
    fn call(self, request: axum::extract::Request) -> impl Future<Output = Response> + Send {
        self.handle(request)
    }
}

/// Accepts TLS connections and serves the API until `shutdown` flips, then drains: the
/// listener is closed (new connections are refused), every open connection finishes the
/// requests it has in flight (a write completes and is answered; a watch ends with its
/// stream's clean end) and closes, each within [`DRAIN_TIMEOUT`]. Returns once every
/// connection has ended. Limits and timeouts come from `app.limits`.
pub async fn serve_api<A: Application>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: A,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    // Owned here so that draining can wait for them; finished ones are reaped as they end.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF_MIN;
                accepted
            }
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE), a connection reset before it was
                // accepted: the listener itself is fine. Ending here would end the process.
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot accept a connection");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let conn_shutdown = shutdown.clone();
        connections.spawn(serve_connection(tcp, peer, acceptor, app, conn_shutdown));
    }
    drop(listener);
    let open = connections.len();
    if open > 0 {
        tracing::info!(connections = open, "draining open connections");
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection<A: Application>(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    app: A,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let limits = app.limits().clone();
    let tls = match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let connection = ConnectionInfo {
        peer_certificates: tls
            .get_ref()
            .1
            .peer_certificates()
            .map(|certs| certs.iter().map(|c| c.as_ref().to_vec()).collect())
            .unwrap_or_default(),
    };
    let state = Arc::new(ConnState::new());
    let io = Tracked {
        io: tls,
        state: state.clone(),
    };
    let service_state = state.clone();
    let service =
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(connection.clone());
            let app = app.clone();
            service_state.in_flight.fetch_add(1, Ordering::Relaxed);
            service_state.served.store(true, Ordering::Relaxed);
            service_state.touch();
            let guard = InFlight(service_state.clone());
            // Boxed: hyper keeps the service future's slot for as long as the stream (an h2
            // stream's task) or the connection (HTTP/1's in-flight slot) lives, sized for the
            // largest state of the whole handler. A watch outlives its handler by hours: boxed,
            // that state is freed once the response head is out (docs/gateways.md, "Measured:
            // idle watches").
            Box::pin(async move {
                let response = app.call(request.map(Body::new)).await;
                // The request stays in flight until its body (a watch stream too) is dropped.
                let response = response.map(|body| {
                    Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
                        let _ = &guard;
                        frame
                    }))
                });
                Ok::<_, std::convert::Infallible>(response)
            })
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(HTTP2_MAX_STREAMS)
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_interval);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let check = (limits
        .idle_timeout
        .min(limits.write_stall_timeout)
        .min(limits.header_read_timeout)
        / 4)
    .clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut ticks = tokio::time::interval(check);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining: Option<Instant> = None;
    if *shutdown.borrow() {
        conn.as_mut().graceful_shutdown();
        draining = Some(Instant::now());
    }
    state.touch();
    // Returning drops the connection, closing the socket whatever state hyper is in.
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.changed(), if draining.is_none() => {
                conn.as_mut().graceful_shutdown();
                draining = Some(Instant::now());
            }
            _ = ticks.tick() => {
                if state.write_stalled_for() > limits.write_stall_timeout {
                    tracing::debug!(%peer, "dropping a connection whose client stopped reading");
                    return;
                }
                // hyper bounds the wait for an HTTP/1.1 head; this bounds HTTP/2's first
                // request (a preface and a header block trickled byte by byte).
                if !state.served.load(Ordering::Relaxed)
                    && state.started.elapsed() > limits.header_read_timeout
                {
                    tracing::debug!(%peer, "dropping a connection that sent no request in time");
                    return;
                }
                match draining {
                    Some(since) if since.elapsed() > DRAIN_TIMEOUT => return,
                    Some(_) => {}
                    None if state.in_flight.load(Ordering::Relaxed) == 0
                        && state.idle_for() > limits.idle_timeout =>
                    {
                        conn.as_mut().graceful_shutdown();
                        draining = Some(Instant::now());
                    }
                    None => {}
                }
            }
        }
    }
}

/// A readiness condition beyond the process's own state (e.g. the change feed is current).
type ReadinessCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// Readiness as the probes see it: the process is serving and every check passes.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    shutting_down: AtomicBool,
    checks: Mutex<Vec<(&'static str, ReadinessCheck)>>,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Not ready from now on, for good: the process is shutting down.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Adds a named condition `/readyz` requires.
    pub fn add_check(&self, name: &'static str, check: impl Fn() -> bool + Send + Sync + 'static) {
        self.checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, Box::new(check)));
    }

    pub fn is_ready(&self) -> bool {
        self.failing().is_empty()
    }

    /// What keeps the process from being ready (empty when ready).
    pub fn failing(&self) -> Vec<&'static str> {
        let mut failing = Vec::new();
        if self.shutting_down.load(Ordering::SeqCst) {
            failing.push("shutting-down");
        }
        if !self.ready.load(Ordering::SeqCst) {
            failing.push("serving");
        }
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        failing.extend(
            checks
                .iter()
                .filter(|(_, check)| !check())
                .map(|(name, _)| *name),
        );
        failing
    }
}

/// Serves `/metrics`, `/livez` and `/readyz` over plain HTTP.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    health: Arc<Health>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let router = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move {
                    let mut text = String::new();
                    match prometheus_client::encoding::text::encode(&mut text, &registry) {
                        Ok(()) => (
                            StatusCode::OK,
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                            .into_response(),
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    }
                }
            }),
        )
        .route("/livez", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let health = health.clone();
                async move {
                    let failing = health.failing();
                    if failing.is_empty() {
                        (StatusCode::OK, "ok".to_string())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {}", failing.join(", ")),
                        )
                    }
                }
            }),
        );
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        })
        .await
}

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-apiserver";

/// Binds a TCP listener once (port 0: any free port), with the address in the error, and
/// announces the bound address on standard error as `listener` ([`process::announce_listener`]).
pub async fn bind(listener: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    process::bind_announced(BINARY, listener, addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}
