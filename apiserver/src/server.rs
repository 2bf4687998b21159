//! Listeners: the TLS API listener (one task per connection, the verified client chain
//! attached to every request) and the plain-HTTP metrics and probe listener.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use http::{header, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::auth::ConnectionInfo;
use crate::http::AppState;
use crate::store::Store;

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TLS connections and serves the API until `shutdown` flips.
pub async fn serve_api<S: Store + Clone>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: AppState<S>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = shutdown.changed() => return Ok(()),
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
            let service = hyper::service::service_fn(
                move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(connection.clone());
                    let app = app.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(app.handle(request.map(Body::new)).await)
                    }
                },
            );
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                _ = conn_shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
                }
            }
        });
    }
}

/// A readiness condition beyond the process's own state (e.g. the change feed is current).
type ReadinessCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// Readiness as the probes see it: the process is serving and every check passes.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    checks: Mutex<Vec<(&'static str, ReadinessCheck)>>,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
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
    registry: Arc<Mutex<Registry>>,
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
                    let encoded = {
                        let registry = registry.lock().unwrap_or_else(|p| p.into_inner());
                        prometheus_client::encoding::text::encode(&mut text, &registry)
                    };
                    match encoded {
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

/// Binds a TCP listener, with the address in the error.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}
