//! Flags (each with an environment fallback) and the wiring of the whole process.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, ValueEnum};
use k8s_openapi::jiff::SignedDuration;
use prometheus_client::registry::Registry;

use crate::admission::NamespaceLifecycle;
use crate::auth::{
    AllowAuthenticated, Authenticator, Authorizer, DelegatedAuthenticator, DelegatedOptions,
    SubjectAccessReviewer, TokenFile,
};
use crate::http::{AppState, HttpConfig, HttpMetrics, Limits};
use crate::server::{self, Health};
use crate::store::{parse_dsn, PgStore, PgTls, SessionLimits, StoreConfig};
use crate::tls::{self, ReloadingCert};

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
    /// Log format.
    #[arg(long, env = "MCP_ACCESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

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
    pub max_session_ttl: String,
    /// How long completed Enrollment records are kept (Go duration).
    #[arg(long, env = "MCP_ACCESS_ENROLLMENT_RETENTION", default_value = "24h")]
    pub enrollment_retention: String,
    /// Interval between watch bookmarks (Go duration).
    #[arg(long, env = "MCP_ACCESS_WATCH_BOOKMARK_INTERVAL", default_value = "5s")]
    pub watch_bookmark_interval: String,
    /// CA bundle (PEM) the PostgreSQL server certificate must chain to; used by
    /// sslmode=verify-ca and verify-full (and require, which then verifies the chain). Wins
    /// over the DSN's sslrootcert.
    #[arg(long, env = "MCP_ACCESS_DATABASE_CA_FILE")]
    pub database_ca_file: Option<PathBuf>,
    /// How long a request waits for a database connection or its turn to write before it is
    /// answered 503 (Go duration).
    #[arg(long, env = "MCP_ACCESS_DATABASE_POOL_TIMEOUT", default_value = "5s")]
    pub database_pool_timeout: String,
    /// Server-side statement timeout of every store connection (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_DATABASE_STATEMENT_TIMEOUT",
        default_value = "30s"
    )]
    pub database_statement_timeout: String,
    /// How long a write waits for a row lock (e.g. the sync-state lock) before it is
    /// answered 503 (Go duration).
    #[arg(long, env = "MCP_ACCESS_DATABASE_LOCK_TIMEOUT", default_value = "5s")]
    pub database_lock_timeout: String,
    /// How long a transaction may sit idle before the server ends it (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT",
        default_value = "30s"
    )]
    pub database_idle_in_transaction_timeout: String,
    /// How long the change feed may go without confirming the database head before every
    /// watch ends with 410 Gone, new watches get 503 and /readyz fails (Go duration).
    #[arg(
        long,
        env = "MCP_ACCESS_CHANGE_FEED_STALENESS_BOUND",
        default_value = "5s"
    )]
    pub change_feed_staleness_bound: String,
}

impl StorageArgs {
    /// The store settings these flags describe: DSN (with its sslmode), TLS, limits.
    pub fn store_config(&self) -> anyhow::Result<StoreConfig> {
        let std_duration = |flag: &str, value: &str| -> anyhow::Result<Duration> {
            go_duration(flag, value)?
                .try_into()
                .with_context(|| format!("--{flag}"))
        };
        // The DSN may carry a password: errors never include it.
        let dsn = parse_dsn(&self.database_url).context("--database-url")?;
        let ca = self
            .database_ca_file
            .as_ref()
            .or(dsn.ssl_root_cert.as_ref());
        let tls = PgTls::new(dsn.ssl_mode, ca.map(PathBuf::as_path)).context("--database-url")?;
        let mut config = StoreConfig::new(dsn.pg);
        config.tls = Some(tls);
        config.pool_size = self.database_pool_size.max(2);
        config.retained_events = self.retained_events;
        config.max_session_ttl = go_duration("max-session-ttl", &self.max_session_ttl)?;
        config.pool_timeout = std_duration("database-pool-timeout", &self.database_pool_timeout)?;
        config.session = SessionLimits {
            statement_timeout: std_duration(
                "database-statement-timeout",
                &self.database_statement_timeout,
            )?,
            lock_timeout: std_duration("database-lock-timeout", &self.database_lock_timeout)?,
            idle_in_transaction_timeout: std_duration(
                "database-idle-in-transaction-timeout",
                &self.database_idle_in_transaction_timeout,
            )?,
            connect_timeout: config.pool_timeout,
        };
        config.staleness_bound = std_duration(
            "change-feed-staleness-bound",
            &self.change_feed_staleness_bound,
        )?;
        // The heartbeat and the reader prove liveness about once a second.
        if config.staleness_bound < Duration::from_secs(1) {
            bail!("--change-feed-staleness-bound must be at least 1s");
        }
        Ok(config)
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
    /// Plain-HTTP port of /metrics, /livez and /readyz.
    #[arg(long, env = "MCP_ACCESS_METRICS_PORT", default_value_t = 9090)]
    pub metrics_port: u16,
    /// Address of the metrics listener, e.g. 127.0.0.1 to keep /metrics off the network
    /// (default: --bind-address).
    #[arg(long, env = "MCP_ACCESS_METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: Option<IpAddr>,
    /// Requests other than watches served at once; more are answered 429.
    #[arg(long, env = "MCP_ACCESS_MAX_REQUESTS_INFLIGHT", default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Watches one user may hold open at once; more are answered 429.
    #[arg(long, env = "MCP_ACCESS_MAX_WATCHES_PER_USER", default_value_t = 100)]
    pub max_watches_per_user: usize,
    /// Serving certificate (PEM). Reloaded when it changes.
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
    pub authorization_allow_ttl: String,
    /// How long a denied SubjectAccessReview is reused (Go duration).
    #[arg(long, env = "MCP_ACCESS_AUTHORIZATION_DENY_TTL", default_value = "10s")]
    pub authorization_deny_ttl: String,
    /// Refuse to start (and ignore ConfigMap changes) when kube-apiserver's
    /// requestheader-allowed-names is empty, which trusts any certificate the request-header
    /// CA signed as the front proxy. Without this flag that is only a loud warning.
    #[arg(long, env = "MCP_ACCESS_REQUESTHEADER_REQUIRE_ALLOWED_NAMES")]
    pub requestheader_require_allowed_names: bool,
    /// Serve the API directly with a static token file and allow every authenticated user
    /// (development only).
    #[arg(long, env = "MCP_ACCESS_STANDALONE")]
    pub standalone: bool,
    /// Static tokens (`token,user,uid,"group1,group2"` per line); standalone mode.
    #[arg(long, env = "MCP_ACCESS_TOKEN_AUTH_FILE")]
    pub token_auth_file: Option<PathBuf>,
}

fn go_duration(flag: &str, value: &str) -> anyhow::Result<SignedDuration> {
    let d =
        apis::duration::parse_go_duration(value).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))?;
    if d <= SignedDuration::ZERO {
        bail!("--{flag} must be greater than 0");
    }
    Ok(d)
}

/// The authenticator, the authorizer and the TLS client-certificate policy of one mode.
type AuthParts = (
    Arc<dyn Authenticator>,
    Arc<dyn Authorizer>,
    Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
);

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?
        }
        None => kube::Config::incluster().context("not in a cluster and no --kubeconfig given")?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Entry point of the binary.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(cli))
}

/// Runs the server until SIGINT/SIGTERM: the first signal drains (readiness false, watches
/// closed cleanly), a second one aborts.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // Validate every security-relevant setting before touching anything.
    let mut background: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut namespaces = None;
    let (authenticator, authorizer, client_verifier): AuthParts = if cli.auth.standalone {
        let Some(path) = &cli.auth.token_auth_file else {
            bail!("--standalone needs --token-auth-file: refusing to serve without authentication");
        };
        (
            Arc::new(TokenFile::load(path)?),
            Arc::new(AllowAuthenticated),
            None,
        )
    } else {
        if cli.auth.token_auth_file.is_some() {
            bail!("--token-auth-file is only for --standalone: behind kube-apiserver, tokens are checked with TokenReview");
        }
        if cli.serving.tls_cert_file.is_none() {
            bail!(
                "--tls-cert-file and --tls-private-key-file are required outside standalone mode"
            );
        }
        let allow_ttl: Duration =
            go_duration("authorization-allow-ttl", &cli.auth.authorization_allow_ttl)?
                .try_into()?;
        let deny_ttl: Duration =
            go_duration("authorization-deny-ttl", &cli.auth.authorization_deny_ttl)?.try_into()?;
        let client = kube_client(cli.auth.kubeconfig.as_deref()).await?;
        let options = DelegatedOptions {
            require_allowed_names: cli.auth.requestheader_require_allowed_names,
        };
        let (authenticator, verifier) = DelegatedAuthenticator::start(client.clone(), options)
            .await
            .context("delegated authentication")?;
        background.push(tokio::spawn(
            authenticator.clone().follow_configmap(client.clone()),
        ));
        let (lifecycle, run) = NamespaceLifecycle::start(client.clone());
        background.push(tokio::spawn(run));
        namespaces = Some(lifecycle);
        let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = verifier;
        (
            authenticator,
            Arc::new(SubjectAccessReviewer::new(client, allow_ttl, deny_ttl)),
            Some(verifier),
        )
    };
    let cert = match (
        &cli.serving.tls_cert_file,
        &cli.serving.tls_private_key_file,
    ) {
        (Some(cert), Some(key)) => ReloadingCert::from_files(cert.clone(), key.clone())?,
        _ => {
            let (key, pem) = tls::self_signed(&cli.serving.tls_san)?;
            if let Some(dir) = &cli.serving.cert_dir {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let path = dir.join("apiserver.crt");
                std::fs::write(&path, pem)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                tracing::info!(path = %path.display(), "wrote the self-signed serving certificate");
            }
            ReloadingCert::fixed(key)
        }
    };
    let tls_config = tls::server_config(cert.clone(), client_verifier)?;
    let store_config = cli.storage.store_config()?;
    let bookmark_interval: Duration = go_duration(
        "watch-bookmark-interval",
        &cli.storage.watch_bookmark_interval,
    )?
    .try_into()
    .context("--watch-bookmark-interval")?;

    let enrollment_retention: Duration =
        go_duration("enrollment-retention", &cli.storage.enrollment_retention)?
            .try_into()
            .context("--enrollment-retention")?;
    let api_listener = server::bind(SocketAddr::new(
        cli.serving.bind_address,
        cli.serving.secure_port,
    ))
    .await?;
    let metrics_listener = server::bind(SocketAddr::new(
        cli.serving
            .metrics_bind_address
            .unwrap_or(cli.serving.bind_address),
        cli.serving.metrics_port,
    ))
    .await?;

    let store = PgStore::start(store_config).await.context("storage")?;
    let mut registry = Registry::default();
    let metrics = HttpMetrics::register(&mut registry);
    let registry = Arc::new(Mutex::new(registry));
    let health = Arc::new(Health::default());
    // Not ready while the change feed cannot vouch for being current: watches would end.
    health.add_check("change-feed", {
        let store = store.clone();
        move || store.change_feed_live()
    });
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let app = AppState::new(
        store.clone(),
        authenticator,
        authorizer,
        HttpConfig { bookmark_interval },
        metrics,
        shutdown_rx.clone(),
    );
    if cli.serving.max_requests_inflight == 0 || cli.serving.max_watches_per_user == 0 {
        bail!("--max-requests-inflight and --max-watches-per-user must be greater than 0");
    }
    let app = app.with_limits(Limits {
        max_requests_inflight: cli.serving.max_requests_inflight,
        max_watches_per_user: cli.serving.max_watches_per_user,
        ..Limits::default()
    });
    let app = match namespaces {
        Some(lifecycle) => app.with_namespace_lifecycle(lifecycle),
        None => app,
    };

    let mut api = tokio::spawn(server::serve_api(
        api_listener,
        tls_config,
        app,
        shutdown_rx.clone(),
    ));
    let mut metrics_server = tokio::spawn(server::serve_metrics(
        metrics_listener,
        registry,
        health.clone(),
        shutdown_rx.clone(),
    ));
    let mut cert_watch = tokio::spawn(cert.watch(Duration::from_secs(10)));
    background.push(tokio::spawn({
        let store = store.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                match crate::store::collect_completed_enrollments(
                    &store,
                    enrollment_retention,
                    crate::store::now(),
                )
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
    }));
    let mut background = futures::future::select_all(
        background
            .into_iter()
            .chain([tokio::spawn(std::future::pending())]),
    );
    health.set_ready(true);
    tracing::info!(
        port = cli.serving.secure_port,
        metrics_port = cli.serving.metrics_port,
        "serving"
    );

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result: anyhow::Result<()> = tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminate.recv() => Ok(()),
        r = &mut api => Err(anyhow::anyhow!("API listener ended: {r:?}")),
        r = &mut metrics_server => Err(anyhow::anyhow!("metrics listener ended: {r:?}")),
        r = &mut cert_watch => Err(anyhow::anyhow!("certificate watcher ended: {r:?}")),
        (r, _, _) = &mut background => Err(anyhow::anyhow!("a background task ended: {r:?}")),
    };
    result?;
    tracing::info!("shutting down: draining (signal again to abort)");
    health.set_ready(false);
    let _ = shutdown_tx.send(true);
    tokio::select! {
        _ = async { let _ = api.await; let _ = metrics_server.await; } => {}
        _ = tokio::time::sleep(Duration::from_secs(15)) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    drop(store);
    Ok(())
}
