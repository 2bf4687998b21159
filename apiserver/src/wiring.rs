//! The wiring of the whole process and its lifecycle: flags (`cli.rs`) are validated into a
//! [`Config`] (`config.rs`), then every part is built from it and run until a signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;

use crate::admission::NamespaceLifecycle;
use crate::auth::{
    AllowAuthenticated, AuthCacheMetrics, Authenticator, Authorizer, DelegatedAuthenticator,
    DelegatedOptions, GatewayAuthenticator, PodChainAuthenticator, SubjectAccessReviewer,
    TokenFile,
};
use crate::cli::Cli;
use crate::config::{AuthMode, Config, ServingCert};
use crate::events;
use crate::expiry::{self, ExpiryConfig, ExpiryMetrics};
use crate::http::{AppState, HttpConfig, HttpMetrics, Limits, SyncState};
use crate::receipts::{self, ReceiptsConfig, ReceiptsMetrics};
use crate::server::{self, Health};
use crate::store::{PgStore, Store};
use crate::tasks::Tasks;
use crate::tls::{self, ReloadingCert};
use crate::tokens::{SessionTokens, TokenMetrics};

/// The authenticator, the authorizer and the TLS client-certificate policy of one mode.
type AuthParts = (
    Arc<dyn Authenticator>,
    Arc<dyn Authorizer>,
    Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
);

/// A long-lived task, built by the wiring and started by the lifecycle.
type Task = (&'static str, BoxFuture<'static, anyhow::Result<()>>);

/// Names of the tasks, as logs and the error that ends the process call them.
const API_LISTENER: &str = "API listener";
const METRICS_LISTENER: &str = "metrics listener";
const SYNC_LISTENER: &str = "gateway sync listener";

/// Entry point of the binary: every security-relevant setting is validated
/// ([`process::Flags`] for [`Cli`]) before anything is touched.
pub fn main() -> anyhow::Result<()> {
    process::main::<Cli, _>(run)
}

/// Runs the server until SIGINT/SIGTERM: the first signal drains (readiness false, watches
/// closed cleanly), a second one aborts.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let wired = wire(config).await?;
    lifecycle(wired).await
}

/// The process, built from its configuration: every part connected, nothing running yet
/// but the store.
struct Wired {
    store: PgStore,
    health: Arc<Health>,
    /// Flips first on shutdown: the API and sync listeners drain.
    shutdown: tokio::sync::watch::Sender<bool>,
    /// Flips once they have drained: the probes and /metrics stop last.
    metrics_stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<Task>,
    /// For the log line that says the server is up.
    serving: crate::config::Serving,
}

/// What only exists behind kube-apiserver: namespace lifecycle admission and gateway
/// authentication (with its re-verification period).
type KubeParts = Option<(
    Arc<NamespaceLifecycle>,
    Arc<dyn GatewayAuthenticator>,
    Duration,
    kube::Client,
)>;

/// Authentication, authorization and admission of one mode, with the tasks that keep them
/// current.
async fn wire_auth(
    auth: &AuthMode,
    cache_metrics: &AuthCacheMetrics,
    tasks: &mut Vec<Task>,
) -> anyhow::Result<(AuthParts, KubeParts)> {
    match auth {
        AuthMode::Standalone { token_file } => Ok((
            (
                Arc::new(TokenFile::load(token_file)?),
                Arc::new(AllowAuthenticated),
                None,
            ),
            None,
        )),
        AuthMode::Delegated {
            kubeconfig,
            allow_ttl,
            deny_ttl,
            require_allowed_names,
            gateway_reverify,
        } => {
            let client = process::kube_client(kubeconfig.as_deref()).await?;
            let options = DelegatedOptions {
                require_allowed_names: *require_allowed_names,
            };
            let (authenticator, verifier) =
                DelegatedAuthenticator::start(client.clone(), options, cache_metrics)
                    .await
                    .context("delegated authentication")?;
            tasks.push((
                "authentication ConfigMap follower",
                forever(authenticator.clone().follow_configmap(client.clone())),
            ));
            let (lifecycle, run) = NamespaceLifecycle::start(client.clone());
            tasks.push(("namespace lifecycle", forever(run)));
            let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = verifier;
            let gateways: Arc<dyn GatewayAuthenticator> = Arc::new(PodChainAuthenticator::new(
                client.clone(),
                *gateway_reverify,
            ));
            Ok((
                (
                    authenticator,
                    Arc::new(
                        SubjectAccessReviewer::new(client.clone(), *allow_ttl, *deny_ttl)
                            .with_cache_metrics(cache_metrics),
                    ),
                    Some(verifier),
                ),
                Some((lifecycle, gateways, *gateway_reverify, client)),
            ))
        }
    }
}

/// A task with no result: that it returns at all is what gets reported.
fn forever(
    task: impl Future<Output = ()> + Send + 'static,
) -> BoxFuture<'static, anyhow::Result<()>> {
    Box::pin(async move {
        task.await;
        Ok(())
    })
}

/// The serving certificate: files (reloaded by a watcher task) or a generated one.
fn wire_cert(
    cert: &ServingCert,
    reload_every: Duration,
    tasks: &mut Vec<Task>,
) -> anyhow::Result<Arc<ReloadingCert>> {
    Ok(match cert {
        ServingCert::Files { cert, key } => {
            let cert = ReloadingCert::from_files(cert.clone(), key.clone())?;
            tasks.push((
                "certificate watcher",
                forever(cert.clone().watch(reload_every)),
            ));
            cert
        }
        ServingCert::SelfSigned { sans, cert_dir } => {
            let (key, pem) = tls::self_signed(sans)?;
            if let Some(dir) = cert_dir {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let path = dir.join("apiserver.crt");
                std::fs::write(&path, pem)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                tracing::info!(path = %path.display(), "wrote the self-signed serving certificate");
            }
            ReloadingCert::fixed(key)
        }
    })
}

/// Removes completed enrollments past retention, once a minute.
async fn collect_enrollments(store: PgStore, retention: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        match crate::store::collect_completed_enrollments(&store, retention, crate::store::now())
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                collected = n,
                "removed completed enrollments past retention"
            ),
            Err(e) => tracing::warn!(error = %e, "enrollment garbage collection failed"),
        }
    }
}

/// Builds every part from the configuration: credentials, certificates, listeners (bound,
/// so a taken port fails startup), the store, the HTTP application and its metrics.
async fn wire(config: Config) -> anyhow::Result<Wired> {
    let mut tasks: Vec<Task> = Vec::new();
    // Filled as the parts are built, read-only once serving starts.
    let mut registry = Registry::default();
    // The keys first: a bad key file stops startup before anything is touched.
    let tokens = Arc::new(
        SessionTokens::load(&config.tokens, TokenMetrics::register(&mut registry))
            .context("session tokens")?,
    );
    match tokens.issuer() {
        Some(issuer) => tracing::info!(issuer, "issuing session tokens"),
        None => {
            tracing::warn!("no --session-token-signing-key-file: the token subresource answers 503")
        }
    }
    let cache_metrics = AuthCacheMetrics::register(&mut registry);
    let ((authenticator, authorizer, client_verifier), kube_parts) =
        wire_auth(&config.auth, &cache_metrics, &mut tasks).await?;
    let cert = wire_cert(
        &config.serving.cert,
        config.serving.tls_reload_interval,
        &mut tasks,
    )?;
    let tls_config = tls::server_config(cert.clone(), client_verifier)?;
    // Gateways present bearer tokens, never client certificates.
    let sync_tls_config = tls::server_config(cert, None)?;
    let store_config = config.storage.store_config()?;
    let api_listener = server::bind("api", config.serving.api).await?;
    let metrics_listener = server::bind("metrics", config.serving.metrics).await?;
    let sync_listener = match config.serving.sync {
        Some(addr) => Some(server::bind("sync", addr).await?),
        None => None,
    };
    // The addresses really bound (port 0 asks for any free port), for the serving log line.
    let mut serving = config.serving.clone();
    serving.api = api_listener.local_addr()?;
    serving.metrics = metrics_listener.local_addr()?;
    if let Some(listener) = &sync_listener {
        serving.sync = Some(listener.local_addr()?);
    }

    let store = PgStore::start(store_config).await.context("storage")?;
    let metrics = HttpMetrics::register(&mut registry);
    store.change_feed_metrics().register(&mut registry);
    store.list_metrics().register(&mut registry);
    let expiry_metrics = ExpiryMetrics::register(&mut registry);
    let event_metrics = events::EventMetrics::register(&mut registry);
    let receipts_metrics = ReceiptsMetrics::register(&mut registry);
    let registry = Arc::new(registry);
    let health = Arc::new(Health::default());
    // Not ready while the change feed cannot vouch for being current: watches would end.
    health.add_check("change-feed", {
        let store = store.clone();
        move || store.change_feed_live()
    });
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    let (metrics_stop, metrics_stop_rx) = tokio::sync::watch::channel(false);
    let app = AppState::new(
        store.clone(),
        authenticator,
        authorizer,
        HttpConfig {
            bookmark_interval: config.bookmark_interval,
        },
        metrics,
        shutdown_rx.clone(),
    )
    .with_session_tokens(tokens)
    .with_limits(Limits {
        max_requests_inflight: config.serving.max_requests_inflight,
        max_mutating_requests_inflight: config.serving.max_mutating_requests_inflight,
        max_watches_per_user: config.serving.max_watches_per_user,
        request_timeout: config.serving.request_timeout,
        header_read_timeout: config.serving.header_read_timeout,
        tls_handshake_timeout: config.serving.tls_handshake_timeout,
        ..Limits::default()
    });
    let mut drift_events = None;
    let (app, gateways) = match kube_parts {
        Some((lifecycle, gateways, reverify, client)) => {
            // Tool drift gateways report becomes Events on MCPServers.
            let (events, task) = events::start_drift(client.clone(), events::instance_name());
            drift_events = Some(events);
            tasks.push(("tool drift event recorder", forever(task)));
            // Behind kube-apiserver, session transitions are reported as Events.
            tasks.push((
                "session event recorder",
                forever(events::start(
                    client,
                    &store.session_signals(),
                    events::instance_name(),
                    events::DEFAULT_QUEUE,
                    event_metrics,
                )),
            ));
            (
                app.with_namespace_lifecycle(lifecycle),
                Some((gateways, reverify)),
            )
        }
        None => (app, None),
    };
    if let (Some(listener), Some((gateways, reverify))) = (sync_listener, gateways) {
        let mut sync = SyncState::new(app.clone(), gateways, reverify);
        if let Some(events) = drift_events {
            sync = sync.with_drift_events(events);
        }
        // The gateway watches are served here: so are their revocation receipts.
        tasks.push((
            "revocation receipts",
            forever(receipts::run(
                store.clone(),
                app.deliveries.clone(),
                receipts::replica_name(),
                ReceiptsConfig::default(),
                receipts_metrics,
            )),
        ));
        let shutdown = shutdown_rx.clone();
        tasks.push((
            SYNC_LISTENER,
            Box::pin(async move {
                Ok(server::serve_api(listener, sync_tls_config, sync, shutdown).await?)
            }),
        ));
    }
    tasks.push((
        API_LISTENER,
        Box::pin({
            let shutdown = shutdown_rx.clone();
            async move { Ok(server::serve_api(api_listener, tls_config, app, shutdown).await?) }
        }),
    ));
    tasks.push((
        METRICS_LISTENER,
        Box::pin({
            let health = health.clone();
            async move {
                Ok(
                    server::serve_metrics(metrics_listener, registry, health, metrics_stop_rx)
                        .await?,
                )
            }
        }),
    ));
    tasks.push((
        "store",
        Box::pin({
            let ended = store.task_ended();
            async move { Err(anyhow::anyhow!(ended.await)) }
        }),
    ));
    tasks.push((
        "enrollment garbage collector",
        forever(collect_enrollments(
            store.clone(),
            config.enrollment_retention,
        )),
    ));
    tasks.push((
        "session expiry",
        forever(expiry::run(
            store.clone(),
            ExpiryConfig::default(),
            expiry_metrics,
        )),
    ));
    Ok(Wired {
        store,
        health,
        shutdown,
        metrics_stop,
        tasks,
        serving,
    })
}

/// How long the API and sync listeners may take to drain after the shutdown delay (each
/// connection is bounded by the server's own drain timeout; this bounds the whole).
const DRAIN_LIMIT: Duration = Duration::from_secs(15);

/// Runs the wired parts: starts every task, serves until a signal or until a task ends
/// (which ends the process with an error naming it), then shuts down in order:
/// 1. `/readyz` fails at once, while every request is still served for `--shutdown-delay`
///    (endpoints and the aggregator stop routing here);
/// 2. the API and sync listeners close and drain: in-flight requests (writes too) complete,
///    open watches end with the clean end of their stream;
/// 3. the probes and `/metrics` stop, and the process exits 0.
///
/// A second signal at any point aborts: the process exits 1 at once.
async fn lifecycle(wired: Wired) -> anyhow::Result<()> {
    let Wired {
        store,
        health,
        shutdown,
        metrics_stop,
        tasks: built,
        serving,
    } = wired;
    let mut tasks = Tasks::default();
    for (name, task) in built {
        tasks.spawn(name, task);
    }
    health.set_ready(true);
    tracing::info!(
        port = serving.api.port(),
        metrics_port = serving.metrics.port(),
        sync_port = serving.sync.map(|a| a.port()),
        "serving"
    );

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        ended = tasks.first_end() => {
            tracing::error!(error = %ended, "a task that runs until shutdown ended; exiting");
            return Err(ended.into());
        }
    }
    let aborted = || anyhow::anyhow!("a second signal aborted the shutdown before it drained");
    health.set_shutting_down();
    tracing::info!(
        delay_ms = serving.shutdown_delay.as_millis() as u64,
        "shutting down: not ready; serving until the delay has passed, then draining (signal again to abort)"
    );
    tokio::select! {
        _ = tokio::time::sleep(serving.shutdown_delay) => {}
        _ = tokio::signal::ctrl_c() => return Err(aborted()),
        _ = terminate.recv() => return Err(aborted()),
        ended = tasks.first_end() => {
            tracing::error!(error = %ended, "a task that runs until shutdown ended; exiting");
            return Err(ended.into());
        }
    }
    tracing::info!("draining: listeners closed, finishing in-flight requests and ending watches");
    let _ = shutdown.send(true);
    tokio::select! {
        _ = tasks.drain(&[API_LISTENER, SYNC_LISTENER], DRAIN_LIMIT) => {}
        _ = tokio::signal::ctrl_c() => return Err(aborted()),
        _ = terminate.recv() => return Err(aborted()),
    }
    let _ = metrics_stop.send(true);
    tasks
        .drain(&[METRICS_LISTENER], Duration::from_secs(2))
        .await;
    drop(tasks);
    drop(store);
    tracing::info!("drained; exiting");
    Ok(())
}
