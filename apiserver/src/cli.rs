//! Flags (each with an environment fallback), the wiring of the whole process and its lifecycle.

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use apis::duration::GoDuration;
use clap::{Args, Parser};
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;

use crate::admission::NamespaceLifecycle;
use crate::auth::{
    AllowAuthenticated, AuthCacheMetrics, Authenticator, Authorizer, DelegatedAuthenticator,
    DelegatedOptions, GatewayAuthenticator, PodChainAuthenticator, SubjectAccessReviewer,
    TokenFile,
};
use crate::config::{AuthMode, Config, ServingCert, Storage};
use crate::events;
use crate::expiry::{self, ExpiryConfig, ExpiryMetrics};
use crate::http::{AppState, HttpConfig, HttpMetrics, Limits, SyncState};
use crate::server::{self, Health};
use crate::store::{PgStore, Store, StoreConfig};
use crate::tasks::Tasks;
use crate::tls::{self, ReloadingCert};
use crate::tokens::{SessionTokens, TokenMetrics};

/// The MCP Access aggregated API server.
#[derive(Debug, Parser)]
#[command(name = "mcp-access-apiserver", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub tokens: TokenArgs,
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub use process::LogFormat;

/// PostgreSQL and the change log.
#[derive(Debug, Args)]
pub struct StorageArgs {
    /// PostgreSQL connection string (libpq key=value or postgres:// URL). Never logged.
    #[arg(long, env = "MCP_ACCESS_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Connections in the PostgreSQL pool.
    #[arg(long, env = "MCP_ACCESS_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: usize,
    /// Change-log events kept for watches and continue tokens.
    #[arg(long, env = "MCP_ACCESS_RETAINED_EVENTS", default_value_t = 100_000)]
    pub retained_events: u64,
    /// Server-wide maximum session lifetime (Go duration).
    #[arg(long, env = "MCP_ACCESS_MAX_SESSION_TTL", default_value = "24h")]
    pub max_session_ttl: GoDuration,
    /// How long completed Enrollment records are kept (Go duration).
    #[arg(long, env = "MCP_ACCESS_ENROLLMENT_RETENTION", default_value = "24h")]
    pub enrollment_retention: GoDuration,
    /// Interval between watch bookmarks (Go duration).
    #[arg(long, env = "MCP_ACCESS_WATCH_BOOKMARK_INTERVAL", default_value = "5s")]
    pub watch_bookmark_interval: GoDuration,
    /// CA bundle (PEM) the PostgreSQL server certificate must chain to; used by
    /// sslmode=verify-ca and verify-full (and require, which then verifies the chain). Wins
    /// over the DSN's sslrootcert.
    #[arg(long, env = "MCP_ACCESS_DATABASE_CA_FILE")]
    pub database_ca_file: Option<PathBuf>,
    /// How long a request waits for a database connection or its turn to write before it is
    /// answered 503 (Go duration).
    #[arg(long, env = "MCP_ACCESS_DATABASE_POOL_TIMEOUT", default_value = "5s")]
    pub database_pool_timeout: GoDuration,
    /// Server-side statement timeout of every store connection (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_DATABASE_STATEMENT_TIMEOUT",
        default_value = "30s"
    )]
    pub database_statement_timeout: GoDuration,
    /// How long a write waits for a row lock (e.g. the sync-state lock) before it is
    /// answered 503 (Go duration).
    #[arg(long, env = "MCP_ACCESS_DATABASE_LOCK_TIMEOUT", default_value = "5s")]
    pub database_lock_timeout: GoDuration,
    /// How long a transaction may sit idle before the server ends it (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT",
        default_value = "30s"
    )]
    pub database_idle_in_transaction_timeout: GoDuration,
    /// How long the change feed may go without confirming the database head before every
    /// watch ends with 410 Gone, new watches get 503 and /readyz fails (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_CHANGE_FEED_STALENESS_BOUND",
        default_value = "5s"
    )]
    pub change_feed_staleness_bound: GoDuration,
    /// Rotate the epoch at start even if the database is the one it was minted on: every
    /// watch and continue token then relists. For after restoring a file-level copy of the
    /// same cluster while no replica ran (docs/storage.md, "Epoch"); ordinary starts keep it.
    #[arg(long, env = "MCP_ACCESS_ROTATE_EPOCH")]
    pub rotate_epoch: bool,
}

impl StorageArgs {
    /// The store settings these flags describe: DSN (with its sslmode), TLS, limits. Reads
    /// the CA file.
    pub fn store_config(&self) -> anyhow::Result<StoreConfig> {
        Ok(Storage::try_from(self)?.store_config()?)
    }
}

/// Listeners and certificates.
#[derive(Debug, Args)]
pub struct ServingArgs {
    /// Address of the API and metrics listeners.
    #[arg(long, env = "MCP_ACCESS_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// HTTPS port of the API.
    #[arg(long, env = "MCP_ACCESS_SECURE_PORT", default_value_t = 8443)]
    pub secure_port: u16,
    /// HTTPS port of the gateway sync listener: access sessions, read-only, each gateway
    /// scoped to its own MCPServer by its Pod-bound token. On (8085) behind
    /// kube-apiserver; 0 turns it off; refused with --standalone.
    #[arg(long, env = "MCP_ACCESS_SYNC_PORT")]
    pub sync_port: Option<u16>,
    /// Plain-HTTP port of /metrics, /livez and /readyz.
    #[arg(long, env = "MCP_ACCESS_METRICS_PORT", default_value_t = 9090)]
    pub metrics_port: u16,
    /// Address of the metrics listener, e.g. 127.0.0.1 to keep /metrics off the network
    /// (default: --bind-address).
    #[arg(long, env = "MCP_ACCESS_METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: Option<IpAddr>,
    /// Non-mutating requests (get, list; watches are not counted) served at once, on the API
    /// and sync listeners together; more are answered 429 with Retry-After.
    #[arg(long, env = "MCP_ACCESS_MAX_REQUESTS_INFLIGHT", default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Mutating requests (create, update, patch, delete) served at once; more are answered
    /// 429 with Retry-After.
    #[arg(
        long,
        env = "MCP_ACCESS_MAX_MUTATING_REQUESTS_INFLIGHT",
        default_value_t = 200
    )]
    pub max_mutating_requests_inflight: usize,
    /// How long a client may take to send a request's headers before its connection is
    /// closed; also how long an HTTP/1.1 keep-alive connection waits for its next request
    /// (Go duration).
    #[arg(long, env = "MCP_ACCESS_HEADER_READ_TIMEOUT", default_value = "10s")]
    pub header_read_timeout: GoDuration,
    /// How long a client may take to complete the TLS handshake (Go duration).
    #[arg(long, env = "MCP_ACCESS_TLS_HANDSHAKE_TIMEOUT", default_value = "10s")]
    pub tls_handshake_timeout: GoDuration,
    /// Watches one user may hold open at once; more are answered 429.
    #[arg(long, env = "MCP_ACCESS_MAX_WATCHES_PER_USER", default_value_t = 100)]
    pub max_watches_per_user: usize,
    /// How long a request other than a watch may take before it is answered 503 (Go
    /// duration): the client-side bound on a database that stops answering without closing
    /// the connection, which no server-side timeout can end. Keep it above
    /// --database-statement-timeout.
    #[arg(long, env = "MCP_ACCESS_REQUEST_TIMEOUT", default_value = "60s")]
    pub request_timeout: GoDuration,
    /// Serving certificate (PEM). Read again every --tls-reload-interval: a changed pair is
    /// served to new connections without a restart (open connections keep theirs).
    #[arg(
        long,
        env = "MCP_ACCESS_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(
        long,
        env = "MCP_ACCESS_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// Standalone only, without a certificate: where the generated self-signed certificate
    /// (apiserver.crt) is written for clients to trust.
    #[arg(long, env = "MCP_ACCESS_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Names and addresses the generated certificate is valid for.
    #[arg(
        long,
        env = "MCP_ACCESS_TLS_SAN",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1"
    )]
    pub tls_san: Vec<String>,
    /// How often the serving certificate and key files are read again (Go duration).
    #[arg(long, env = "MCP_ACCESS_TLS_RELOAD_INTERVAL", default_value = "10s")]
    pub tls_reload_interval: GoDuration,
    /// On SIGTERM, how long /readyz fails while every request is still served, before the
    /// listeners stop accepting and drain: time for Services and the aggregator to stop
    /// sending new requests here (Go duration; as kube-apiserver's --shutdown-delay-duration).
    #[arg(long, env = "MCP_ACCESS_SHUTDOWN_DELAY", default_value = "0s")]
    pub shutdown_delay: GoDuration,
}

/// Session tokens: the `token` subresource of AccessSession (docs/session-tokens.md).
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// PEM PKCS#8 EC P-256 private key that signs session tokens (ES256); mode 600. Without
    /// it the token subresource answers 503. Never logged.
    #[arg(long, env = "MCP_ACCESS_SESSION_TOKEN_SIGNING_KEY_FILE")]
    pub session_token_signing_key_file: Option<PathBuf>,
    /// PEM EC P-256 public key published in the JWKS beside the signing key's (e.g. the
    /// previous signing key during a rotation). Repeatable; the environment variable takes a
    /// comma-separated list.
    #[arg(
        long,
        env = "MCP_ACCESS_SESSION_TOKEN_VERIFICATION_KEY_FILE",
        value_delimiter = ','
    )]
    pub session_token_verification_key_file: Vec<PathBuf>,
    /// The `iss` of every session token; required with a signing key.
    #[arg(long, env = "MCP_ACCESS_SESSION_TOKEN_ISSUER")]
    pub session_token_issuer: Option<String>,
    /// Longest lifetime of a session token (Go duration); also never past the session's
    /// spec.expiresAt.
    #[arg(long, env = "MCP_ACCESS_SESSION_TOKEN_MAX_TTL", default_value = "1h")]
    pub session_token_max_ttl: GoDuration,
    /// The audience of a session token when the request names none: the server's resource
    /// URI, `{server}` and `{namespace}` filled in.
    #[arg(
        long,
        env = "MCP_ACCESS_SESSION_TOKEN_AUDIENCE_TEMPLATE",
        default_value = apis::session_token::DEFAULT_AUDIENCE_TEMPLATE
    )]
    pub session_token_audience_template: String,
}

/// Authentication and authorization.
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// Kubeconfig for reaching kube-apiserver (TokenReview, SubjectAccessReview, the
    /// authentication ConfigMap, namespaces). Without it: the in-cluster service account.
    #[arg(long, env = "MCP_ACCESS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How long an allowed SubjectAccessReview is reused (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_AUTHORIZATION_ALLOW_TTL",
        default_value = "10s"
    )]
    pub authorization_allow_ttl: GoDuration,
    /// How long a denied SubjectAccessReview is reused (Go duration).
    #[arg(long, env = "MCP_ACCESS_AUTHORIZATION_DENY_TTL", default_value = "10s")]
    pub authorization_deny_ttl: GoDuration,
    /// Refuse to start (and ignore ConfigMap changes) when kube-apiserver's
    /// requestheader-allowed-names is empty, which trusts any certificate the request-header
    /// CA signed as the front proxy. Without this flag that is only a loud warning.
    #[arg(long, env = "MCP_ACCESS_REQUESTHEADER_REQUIRE_ALLOWED_NAMES")]
    pub requestheader_require_allowed_names: bool,
    /// How long a gateway's verified owner chain (Pod, ReplicaSet, Deployment, MCPServer) is
    /// reused, and how often an open gateway watch re-verifies it (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_GATEWAY_REVERIFY_INTERVAL",
        default_value = "30s"
    )]
    pub gateway_reverify_interval: GoDuration,
    /// Serve the API directly with a static token file and allow every authenticated user
    /// (development only).
    #[arg(long, env = "MCP_ACCESS_STANDALONE")]
    pub standalone: bool,
    /// Static tokens (`token,user,uid,"group1,group2"` per line); standalone mode.
    #[arg(long, env = "MCP_ACCESS_TOKEN_AUTH_FILE")]
    pub token_auth_file: Option<PathBuf>,
}

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

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    process::init_tracing(cli.log_format);
    process::block_on(run(cli))
}

/// Runs the server until SIGINT/SIGTERM: the first signal drains (readiness false, watches
/// closed cleanly), a second one aborts. Every security-relevant setting is validated
/// before anything is touched.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::try_from(cli)?;
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
    let api_listener = server::bind(config.serving.api).await?;
    let metrics_listener = server::bind(config.serving.metrics).await?;
    let sync_listener = match config.serving.sync {
        Some(addr) => Some(server::bind(addr).await?),
        None => None,
    };

    let store = PgStore::start(store_config).await.context("storage")?;
    let metrics = HttpMetrics::register(&mut registry);
    store.change_feed_metrics().register(&mut registry);
    let expiry_metrics = ExpiryMetrics::register(&mut registry);
    let event_metrics = events::EventMetrics::register(&mut registry);
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
    let (app, gateways) = match kube_parts {
        Some((lifecycle, gateways, reverify, client)) => {
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
        let sync = SyncState::new(app.clone(), gateways, reverify);
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
        serving: config.serving,
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
