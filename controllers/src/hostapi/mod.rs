//! The Host API: host-scoped inventory and credentials over HTTPS with RS256 host tokens.
//!
//! - `GET /api/v2/hosts/self/mcpservers`: the enabled MCPServers the Host's Context grants
//!   (name, namespace, transport, gateway URL, ready, an opaque `credentialRevision`, the
//!   host's session for it);
//! - `POST /api/v2/hosts/self/mcpservers/credential` `{"serverName": ..}`: the value of one
//!   granted server's `hostCredential` Secret key (or null) and a token of the host's session
//!   for it, the grant checked before the Secret is read and again after;
//! - `GET /healthz`: whether the caches have synced; the legacy v1 routes answer 410.
//!
//! Served by every replica (not leader-gated), each from watch caches of its own
//! ([`cache`]); the per-Host rate limit is per replica too.

pub mod api;
pub mod cache;
pub mod limit;
pub mod session;
pub mod settings;
pub mod token;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use process::tls::{self, ReloadingCert};
use prometheus_client::registry::Registry;
use tokio_rustls::TlsAcceptor;

pub use settings::{Args, Settings};

/// How often the serving certificate files are read again.
const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// A TLS handshake or a request's headers must arrive within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most; further ones wait to be accepted.
const MAX_CONNECTIONS: usize = 1024;
/// Open connections from one address at most; further ones are closed at once. A host pod
/// has its own address, so one pod (or one client that connects and says little) cannot take
/// the slots above from the others.
const MAX_CONNECTIONS_PER_PEER: usize = 32;
/// A connection with no request in flight for this long is closed (the client reconnects):
/// idle connections must not hold the slots above.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a connection's supervisor looks at it.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// What a connection has been doing: requests in flight, and when one last started or ended.
struct ConnState {
    started: std::time::Instant,
    /// Milliseconds since `started` of the last request's start or end; `u64::MAX` before
    /// the first request.
    last_activity: std::sync::atomic::AtomicU64,
    in_flight: std::sync::atomic::AtomicUsize,
}

impl ConnState {
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
    fn touch(&self) {
        use std::sync::atomic::Ordering;
        self.last_activity.store(self.now(), Ordering::Relaxed);
    }
    /// Whether the connection should be closed now: no request within the handshake timeout
    /// (an HTTP/2 preface or an HTTP/1.1 head trickled, or nothing at all after the TLS
    /// handshake), or none in flight for [`IDLE_TIMEOUT`].
    fn expired(&self) -> bool {
        use std::sync::atomic::Ordering;
        let last = self.last_activity.load(Ordering::Relaxed);
        if last == u64::MAX {
            return self.started.elapsed() > HANDSHAKE_TIMEOUT;
        }
        self.in_flight.load(Ordering::Relaxed) == 0
            && Duration::from_millis(self.now().saturating_sub(last)) > IDLE_TIMEOUT
    }
}

/// Counts a request in flight until dropped (its response sent or abandoned).
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.touch();
    }
}

/// Connections open per peer address, each held by a [`PeerSlot`].
#[derive(Default)]
struct PeerSlots {
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection of a peer, counted until dropped.
struct PeerSlot {
    slots: Arc<PeerSlots>,
    peer: std::net::IpAddr,
}

impl PeerSlots {
    /// A slot for `peer`, or `None` when it already has [`MAX_CONNECTIONS_PER_PEER`].
    fn take(self: &Arc<Self>, peer: std::net::IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(peer).or_default();
        if *n >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            slots: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// The server of the settings [`Args::settings`] returned, served by every replica, or `None`
/// when the Host API is off.
pub async fn server(
    client: kube::Client,
    settings: Option<Settings>,
    gateway_port: u16,
    registry: &mut Registry,
) -> anyhow::Result<Option<impl Future<Output = anyhow::Result<()>>>> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    let cert = ReloadingCert::from_files(
        settings.tls_cert_file.clone(),
        settings.tls_key_file.clone(),
    )
    .context("--host-api-tls-cert-file / --host-api-tls-key-file")?;
    let tls_config = tls::server_config(cert.clone(), None)?;
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], settings.port));
    let listener = process::bind_announced(crate::BINARY, "host-api", addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--host-api-port)"))?;
    tracing::info!(
        addr = ?listener.local_addr().ok(),
        issuer = %settings.issuer,
        audience = ?settings.audience,
        max_ttl = ?settings.max_ttl,
        rate_limit = settings.rate_limit,
        rate_window = ?settings.rate_window,
        "serving the Host API"
    );
    let (caches, writers) = cache::Caches::new();
    let api = Arc::new(api::HostApi::new(
        client.clone(),
        caches.clone(),
        &settings,
        gateway_port,
        registry,
    ));
    Ok(Some(async move {
        tokio::select! {
            () = cert.watch(CERT_RELOAD_INTERVAL) => Ok(()),
            ended = cache::run(client, caches, writers) => ended,
            ended = serve(listener, tls_config, api) => ended,
        }
    }))
}

/// Accepts TLS connections and serves HTTP/1.1 and HTTP/2 on them.
async fn serve(
    listener: tokio::net::TcpListener,
    tls_config: Arc<rustls::ServerConfig>,
    api: Arc<api::HostApi>,
) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(tls_config);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let peers = Arc::new(PeerSlots::default());
    loop {
        let slot = slots.clone().acquire_owned().await?;
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "Host API: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(peer_slot) = peers.take(peer.ip()) else {
            tracing::debug!(%peer, "Host API: over the connections of one address, closed");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "Host API: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let state = Arc::new(ConnState {
                started: std::time::Instant::now(),
                last_activity: std::sync::atomic::AtomicU64::new(u64::MAX),
                in_flight: std::sync::atomic::AtomicUsize::new(0),
            });
            let service_state = state.clone();
            let service = hyper::service::service_fn(move |request| {
                let api = api.clone();
                service_state
                    .in_flight
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                service_state.touch();
                // Answers are whole bodies: the request is done when the handler returns.
                let in_flight = InFlight(service_state.clone());
                async move {
                    let response = api.handle(request).await;
                    drop(in_flight);
                    Ok::<_, Infallible>(response)
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(IDLE_TIMEOUT / 2)
                .keep_alive_timeout(HANDSHAKE_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            tokio::pin!(conn);
            let mut ticks = tokio::time::interval(SUPERVISE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Returning drops the connection, closing the socket whatever state hyper is in.
            loop {
                tokio::select! {
                    ended = conn.as_mut() => {
                        if let Err(e) = ended {
                            tracing::debug!(%peer, error = %e, "Host API: connection ended with an error");
                        }
                        return;
                    }
                    _ = ticks.tick() => {
                        if state.expired() {
                            tracing::debug!(%peer, "Host API: closing an idle connection");
                            return;
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Instant;

    fn state(age: Duration, last: Option<Duration>, in_flight: usize) -> ConnState {
        let started = Instant::now() - age;
        let last = last.map_or(u64::MAX, |l| u64::try_from((age - l).as_millis()).unwrap());
        ConnState {
            started,
            last_activity: AtomicU64::new(last),
            in_flight: AtomicUsize::new(in_flight),
        }
    }

    #[test]
    fn one_address_holds_a_bounded_share_of_the_connections() {
        let peers = Arc::new(PeerSlots::default());
        let a: std::net::IpAddr = [10, 0, 0, 1].into();
        let b: std::net::IpAddr = [10, 0, 0, 2].into();
        let held: Vec<_> = (0..MAX_CONNECTIONS_PER_PEER)
            .map(|_| peers.take(a).expect("under the cap"))
            .collect();
        assert!(peers.take(a).is_none(), "one over the cap is refused");
        let other = peers.take(b).expect("another address has its own share");
        drop(held);
        drop(other);
        assert!(
            peers.open.lock().unwrap().is_empty(),
            "closed connections free their slots"
        );
        assert!(peers.take(a).is_some());
    }

    #[test]
    fn a_connection_without_requests_or_idle_is_closed() {
        let s = Duration::from_secs;
        // No request yet: allowed for the handshake timeout, then closed.
        assert!(!state(s(5), None, 0).expired());
        assert!(state(s(11), None, 0).expired());
        // Requests, then idle: closed after the idle timeout, not before.
        assert!(!state(s(100), Some(s(30)), 0).expired());
        assert!(state(s(100), Some(s(61)), 0).expired());
        // A request in flight keeps it open however long ago the last one started.
        let busy = state(s(100), Some(s(90)), 1);
        assert!(!busy.expired());
        let guard = InFlight(Arc::new(busy));
        let shared = guard.0.clone();
        drop(guard);
        assert_eq!(shared.in_flight.load(Ordering::Relaxed), 0);
        assert!(!shared.expired(), "the request's end counts as activity");
    }
}
