//! Flags, each with an environment fallback: what `config.rs` validates and `wiring.rs`
//! builds the process from.

use std::net::IpAddr;
use std::path::PathBuf;

use apis::duration::GoDuration;
use clap::{Args, Parser};

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
    /// A promoted standby keeps the epoch when the change history goes on there: set it where
    /// PostgreSQL replicates synchronously (Patroni `synchronous_mode`, CloudNativePG with
    /// synchronous replicas), so a failover makes no watcher relist. A running replica then
    /// takes a new WAL timeline for a failover, not a restore, once the database holds every
    /// change it handed out and the last one it fanned out is unchanged; otherwise (and at
    /// start) the epoch still rotates (docs/storage.md, "Epoch").
    #[arg(long, env = "MCP_ACCESS_FAILOVER_KEEPS_EPOCH")]
    pub failover_keeps_epoch: bool,
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
