//! The validated configuration: every fail-closed rule on the flags, checked without I/O.
//!
//! `Config::try_from(Cli)` refuses a configuration that would serve without
//! authentication, mix the modes, lack a serving certificate behind kube-apiserver, set a
//! limit or a duration to zero, or verify the database without a CA. What needs the file
//! system (token and key file permissions, reading the CA) is checked while wiring.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use apis::duration::GoDuration;
use k8s_openapi::jiff::SignedDuration;

use crate::cli::{AuthArgs, Cli, LogFormat, ServingArgs, StorageArgs, TokenArgs};
use crate::store::{parse_dsn, ConnectError, PgTls, SessionLimits, SslMode, StoreConfig};
use crate::tokens::TokenSettings;

/// A flag combination the server refuses to start with. The text names the flags.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--standalone needs --token-auth-file: refusing to serve without authentication")]
    StandaloneWithoutTokenFile,
    #[error("--token-auth-file is only for --standalone: behind kube-apiserver, tokens are checked with TokenReview")]
    TokenFileOutsideStandalone,
    #[error("--tls-cert-file and --tls-private-key-file are required outside standalone mode")]
    ServingCertificateRequired,
    #[error("--{0} must be greater than 0")]
    NotPositive(&'static str),
    /// Gateways are authenticated by kube-apiserver (TokenReview, the live owner chain).
    #[error("--sync-port needs kube-apiserver: the gateway sync listener is not available with --standalone")]
    SyncListenerInStandalone,
    /// The heartbeat and the reader prove liveness about once a second.
    #[error("--change-feed-staleness-bound must be at least 1s")]
    StalenessBoundBelowOneSecond,
    /// Zero would refuse every request (or every watch) of its kind.
    #[error("--{0} must be greater than 0")]
    ZeroLimit(&'static str),
    /// The DSN may carry a password: neither this nor its source includes it.
    #[error("--database-url")]
    Database(#[source] ConnectError),
    #[error("--session-token-signing-key-file needs --session-token-issuer: every token names its issuer")]
    SigningKeyWithoutIssuer,
    #[error("--session-token-verification-key-file without --session-token-signing-key-file: there is nothing to verify")]
    VerificationKeyWithoutSigningKey,
    #[error("--{flag} {value:?} {why}")]
    SessionToken {
        flag: &'static str,
        value: String,
        why: &'static str,
    },
}

/// Whether a configured value is a placeholder left for an operator to fill in.
fn is_placeholder(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    value.contains(['<', '>'])
        || value.contains("${")
        || [
            "changeme",
            "change-me",
            "change_me",
            "replace",
            "placeholder",
            "todo",
            "fixme",
            "example.invalid",
        ]
        .iter()
        .any(|word| lower.contains(word))
}

impl TryFrom<&TokenArgs> for TokenSettings {
    type Error = ConfigError;

    fn try_from(args: &TokenArgs) -> Result<Self, ConfigError> {
        let refuse = |flag, value: &str, why| ConfigError::SessionToken {
            flag,
            value: value.to_string(),
            why,
        };
        let template = args.session_token_audience_template.trim();
        let template_flag = "session-token-audience-template";
        if template.is_empty() {
            return Err(refuse(template_flag, template, "is empty"));
        }
        if !template.contains("{server}") {
            return Err(refuse(
                template_flag,
                template,
                "has no {server}: every server would share one audience",
            ));
        }
        if is_placeholder(&template.replace("{server}", "").replace("{namespace}", "")) {
            return Err(refuse(template_flag, template, "is a placeholder"));
        }
        if !apis::session_token::is_absolute_http_uri(&apis::session_token::render_audience(
            template,
            "server",
            "namespace",
        )) {
            return Err(refuse(
                template_flag,
                template,
                "does not make an absolute http or https URI",
            ));
        }
        let issuer = match args.session_token_issuer.as_deref().map(str::trim) {
            None => None,
            Some("") => {
                return Err(refuse("session-token-issuer", "", "is empty"));
            }
            Some(issuer) if is_placeholder(issuer) => {
                return Err(refuse("session-token-issuer", issuer, "is a placeholder"));
            }
            Some(issuer) if issuer.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                return Err(refuse(
                    "session-token-issuer",
                    issuer,
                    "contains whitespace",
                ));
            }
            Some(issuer) => Some(issuer.to_string()),
        };
        match &args.session_token_signing_key_file {
            Some(_) if issuer.is_none() => return Err(ConfigError::SigningKeyWithoutIssuer),
            None if !args.session_token_verification_key_file.is_empty() => {
                return Err(ConfigError::VerificationKeyWithoutSigningKey)
            }
            _ => {}
        }
        let max_ttl = positive("session-token-max-ttl", args.session_token_max_ttl)?.std();
        if max_ttl < Duration::from_secs(apis::session_token::MIN_EXPIRATION_SECONDS as u64) {
            return Err(refuse(
                "session-token-max-ttl",
                &format!("{}s", max_ttl.as_secs()),
                "is shorter than the shortest token (10s)",
            ));
        }
        Ok(Self {
            signing_key_file: args.session_token_signing_key_file.clone(),
            verification_key_files: args.session_token_verification_key_file.clone(),
            issuer,
            max_ttl,
            audience_template: template.to_string(),
        })
    }
}

/// Everything the process is configured with, validated.
#[derive(Debug)]
pub struct Config {
    pub auth: AuthMode,
    pub serving: Serving,
    pub storage: Storage,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// How long completed Enrollment records are kept.
    pub enrollment_retention: Duration,
    /// Session tokens (the key files are read while wiring).
    pub tokens: TokenSettings,
    pub log_format: LogFormat,
}

/// Who authenticates and authorizes requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// A static token file; every authenticated user is allowed (development only).
    Standalone { token_file: PathBuf },
    /// Behind kube-apiserver: front-proxy headers or TokenReview, then SubjectAccessReview.
    Delegated {
        kubeconfig: Option<PathBuf>,
        allow_ttl: Duration,
        deny_ttl: Duration,
        require_allowed_names: bool,
        /// How long a gateway's verified owner chain is reused, and how often an open
        /// gateway watch re-verifies it.
        gateway_reverify: Duration,
    },
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCert {
    /// PEM files, reloaded when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// Generated at startup (standalone only), written to `cert_dir` for clients to trust.
    SelfSigned {
        sans: Vec<String>,
        cert_dir: Option<PathBuf>,
    },
}

/// Listeners and their limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub api: SocketAddr,
    pub metrics: SocketAddr,
    /// The gateway sync listener, if on.
    pub sync: Option<SocketAddr>,
    pub cert: ServingCert,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
    pub max_watches_per_user: usize,
    /// Non-watch requests are answered 503 after this long.
    pub request_timeout: Duration,
    pub header_read_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// How often the serving certificate files are read again.
    pub tls_reload_interval: Duration,
    /// On SIGTERM: how long /readyz fails while requests are still served, before draining.
    pub shutdown_delay: Duration,
}

/// PostgreSQL and the change log; [`Storage::store_config`] reads the CA file.
#[derive(Debug)]
pub struct Storage {
    pub pg: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    /// The CA the server certificate must chain to: `--database-ca-file`, else the DSN's
    /// `sslrootcert`.
    pub ca_file: Option<PathBuf>,
    pub pool_size: usize,
    pub retained_events: u64,
    pub max_session_ttl: SignedDuration,
    pub pool_timeout: Duration,
    pub session: SessionLimits,
    pub staleness_bound: Duration,
    pub rotate_epoch: bool,
    pub failover_keeps_epoch: bool,
}

/// Port of the gateway sync listener behind kube-apiserver unless `--sync-port` says otherwise.
pub const DEFAULT_SYNC_PORT: u16 = 8085;

/// A duration flag that must be greater than zero (every one of them is a limit or an
/// interval: zero would disable the limit or spin).
fn positive(flag: &'static str, d: GoDuration) -> Result<GoDuration, ConfigError> {
    if d.is_zero() {
        return Err(ConfigError::NotPositive(flag));
    }
    Ok(d)
}

impl process::Flags for Cli {
    type Config = Config;
    type Error = ConfigError;

    fn log_format(&self) -> LogFormat {
        self.log_format
    }

    fn config(self) -> Result<Config, ConfigError> {
        Config::try_from(self)
    }
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    /// The rules in the order the server used to meet them, so a command line breaking
    /// several gets the same first complaint.
    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let auth = AuthMode::try_from(&cli.auth)?;
        let serving = Serving::try_from((&cli.serving, &auth))?;
        let storage = Storage::try_from(&cli.storage)?;
        let bookmark_interval = positive(
            "watch-bookmark-interval",
            cli.storage.watch_bookmark_interval,
        )?
        .std();
        let enrollment_retention =
            positive("enrollment-retention", cli.storage.enrollment_retention)?.std();
        for (flag, value) in [
            ("max-requests-inflight", cli.serving.max_requests_inflight),
            (
                "max-mutating-requests-inflight",
                cli.serving.max_mutating_requests_inflight,
            ),
            ("max-watches-per-user", cli.serving.max_watches_per_user),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroLimit(flag));
            }
        }
        Ok(Self {
            auth,
            serving,
            storage,
            bookmark_interval,
            enrollment_retention,
            tokens: TokenSettings::try_from(&cli.tokens)?,
            log_format: cli.log_format,
        })
    }
}

impl TryFrom<&AuthArgs> for AuthMode {
    type Error = ConfigError;

    fn try_from(args: &AuthArgs) -> Result<Self, ConfigError> {
        if args.standalone {
            let Some(token_file) = &args.token_auth_file else {
                return Err(ConfigError::StandaloneWithoutTokenFile);
            };
            return Ok(Self::Standalone {
                token_file: token_file.clone(),
            });
        }
        if args.token_auth_file.is_some() {
            return Err(ConfigError::TokenFileOutsideStandalone);
        }
        Ok(Self::Delegated {
            kubeconfig: args.kubeconfig.clone(),
            allow_ttl: positive("authorization-allow-ttl", args.authorization_allow_ttl)?.std(),
            deny_ttl: positive("authorization-deny-ttl", args.authorization_deny_ttl)?.std(),
            require_allowed_names: args.requestheader_require_allowed_names,
            gateway_reverify: positive(
                "gateway-reverify-interval",
                args.gateway_reverify_interval,
            )?
            .std(),
        })
    }
}

impl TryFrom<(&ServingArgs, &AuthMode)> for Serving {
    type Error = ConfigError;

    fn try_from((args, auth): (&ServingArgs, &AuthMode)) -> Result<Self, ConfigError> {
        let cert = match (&args.tls_cert_file, &args.tls_private_key_file) {
            (Some(cert), Some(key)) => ServingCert::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            // A generated certificate nobody can pin: only where clients are told to trust
            // it (standalone). clap already refuses one file without the other.
            _ if matches!(auth, AuthMode::Delegated { .. }) => {
                return Err(ConfigError::ServingCertificateRequired)
            }
            _ => ServingCert::SelfSigned {
                sans: args.tls_san.clone(),
                cert_dir: args.cert_dir.clone(),
            },
        };
        let sync = match (args.sync_port, auth) {
            (Some(0), _) | (None, AuthMode::Standalone { .. }) => None,
            (Some(_), AuthMode::Standalone { .. }) => {
                return Err(ConfigError::SyncListenerInStandalone)
            }
            (port, AuthMode::Delegated { .. }) => Some(SocketAddr::new(
                args.bind_address,
                port.unwrap_or(DEFAULT_SYNC_PORT),
            )),
        };
        Ok(Self {
            api: SocketAddr::new(args.bind_address, args.secure_port),
            sync,
            metrics: SocketAddr::new(
                args.metrics_bind_address.unwrap_or(args.bind_address),
                args.metrics_port,
            ),
            cert,
            max_requests_inflight: args.max_requests_inflight,
            max_mutating_requests_inflight: args.max_mutating_requests_inflight,
            max_watches_per_user: args.max_watches_per_user,
            request_timeout: positive("request-timeout", args.request_timeout)?.std(),
            header_read_timeout: positive("header-read-timeout", args.header_read_timeout)?.std(),
            tls_handshake_timeout: positive("tls-handshake-timeout", args.tls_handshake_timeout)?
                .std(),
            tls_reload_interval: positive("tls-reload-interval", args.tls_reload_interval)?.std(),
            shutdown_delay: args.shutdown_delay.std(),
        })
    }
}

impl StorageArgs {
    /// The store settings these flags describe: DSN (with its sslmode), TLS, limits. Reads
    /// the CA file.
    pub fn store_config(&self) -> Result<StoreConfig, ConfigError> {
        Storage::try_from(self)?.store_config()
    }
}

impl TryFrom<&StorageArgs> for Storage {
    type Error = ConfigError;

    fn try_from(args: &StorageArgs) -> Result<Self, ConfigError> {
        let dsn = parse_dsn(&args.database_url).map_err(ConfigError::Database)?;
        let ca_file = args.database_ca_file.clone().or(dsn.ssl_root_cert);
        if matches!(dsn.ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull) && ca_file.is_none() {
            return Err(ConfigError::Database(ConnectError::MissingCa(
                dsn.ssl_mode.as_str(),
            )));
        }
        let max_session_ttl = positive("max-session-ttl", args.max_session_ttl)?.signed();
        let pool_timeout = positive("database-pool-timeout", args.database_pool_timeout)?.std();
        let session = SessionLimits {
            statement_timeout: positive(
                "database-statement-timeout",
                args.database_statement_timeout,
            )?
            .std(),
            lock_timeout: positive("database-lock-timeout", args.database_lock_timeout)?.std(),
            idle_in_transaction_timeout: positive(
                "database-idle-in-transaction-timeout",
                args.database_idle_in_transaction_timeout,
            )?
            .std(),
            connect_timeout: pool_timeout,
        };
        let staleness_bound = positive(
            "change-feed-staleness-bound",
            args.change_feed_staleness_bound,
        )?
        .std();
        if staleness_bound < Duration::from_secs(1) {
            return Err(ConfigError::StalenessBoundBelowOneSecond);
        }
        Ok(Self {
            pg: dsn.pg,
            ssl_mode: dsn.ssl_mode,
            ca_file,
            pool_size: args.database_pool_size.max(2),
            retained_events: args.retained_events,
            max_session_ttl,
            pool_timeout,
            session,
            staleness_bound,
            rotate_epoch: args.rotate_epoch,
            failover_keeps_epoch: args.failover_keeps_epoch,
        })
    }
}

impl Storage {
    /// The store settings, with the TLS connector (this reads the CA file).
    pub fn store_config(self) -> Result<StoreConfig, ConfigError> {
        let tls =
            PgTls::new(self.ssl_mode, self.ca_file.as_deref()).map_err(ConfigError::Database)?;
        let mut config = StoreConfig::new(self.pg);
        config.tls = Some(tls);
        config.pool_size = self.pool_size;
        config.retained_events = self.retained_events;
        config.max_session_ttl = self.max_session_ttl;
        config.pool_timeout = self.pool_timeout;
        config.session = self.session;
        config.staleness_bound = self.staleness_bound;
        config.rotate_epoch = self.rotate_epoch;
        config.failover_keeps_epoch = self.failover_keeps_epoch;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const DSN: &str = "host=127.0.0.1 port=5432 user=postgres";

    /// The configuration of a command line (with a DSN unless one is given).
    fn config(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["mcp-access-apiserver"];
        if !args.contains(&"--database-url") {
            argv.extend(["--database-url", DSN]);
        }
        argv.extend(args);
        Config::try_from(Cli::try_parse_from(argv).expect("flags parse"))
    }

    fn standalone(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut args = vec!["--standalone", "--token-auth-file", "/tokens.csv"];
        args.extend(extra);
        config(&args)
    }

    fn delegated(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut args = vec![
            "--tls-cert-file",
            "/tls.crt",
            "--tls-private-key-file",
            "/tls.key",
        ];
        args.extend(extra);
        config(&args)
    }

    fn message(result: Result<Config, ConfigError>) -> String {
        let err = result.expect_err("the configuration is refused");
        // As `main` prints it: the error and its causes.
        format!("{:#}", anyhow::Error::from(err))
    }

    #[test]
    fn standalone_needs_a_token_file() {
        let err = message(config(&["--standalone"]));
        assert_eq!(
            err,
            "--standalone needs --token-auth-file: refusing to serve without authentication"
        );
        let ok = standalone(&[]).unwrap();
        assert_eq!(
            ok.auth,
            AuthMode::Standalone {
                token_file: "/tokens.csv".into()
            }
        );
    }

    #[test]
    fn the_sync_listener_is_on_behind_kube_apiserver_and_refused_standalone() {
        let on = delegated(&[]).unwrap();
        assert_eq!(on.serving.sync.map(|a| a.port()), Some(DEFAULT_SYNC_PORT));
        let moved = delegated(&["--sync-port", "9085"]).unwrap();
        assert_eq!(moved.serving.sync.map(|a| a.port()), Some(9085));
        assert_eq!(delegated(&["--sync-port", "0"]).unwrap().serving.sync, None);
        assert_eq!(standalone(&[]).unwrap().serving.sync, None);
        assert_eq!(
            standalone(&["--sync-port", "0"]).unwrap().serving.sync,
            None
        );
        let err = message(standalone(&["--sync-port", "8085"]));
        assert!(err.starts_with("--sync-port needs kube-apiserver"), "{err}");
        let err = message(delegated(&["--gateway-reverify-interval", "0s"]));
        assert_eq!(err, "--gateway-reverify-interval must be greater than 0");
    }

    #[test]
    fn a_token_file_is_refused_outside_standalone() {
        let err = message(delegated(&["--token-auth-file", "/tokens.csv"]));
        assert!(
            err.starts_with("--token-auth-file is only for --standalone"),
            "{err}"
        );
    }

    #[test]
    fn delegated_mode_needs_serving_files() {
        let err = message(config(&[]));
        assert_eq!(
            err,
            "--tls-cert-file and --tls-private-key-file are required outside standalone mode"
        );
        // Standalone generates one.
        let ok = standalone(&["--cert-dir", "/certs"]).unwrap();
        assert!(matches!(
            ok.serving.cert,
            ServingCert::SelfSigned {
                cert_dir: Some(_),
                ..
            }
        ));
        let ok = delegated(&[]).unwrap();
        assert_eq!(
            ok.serving.cert,
            ServingCert::Files {
                cert: "/tls.crt".into(),
                key: "/tls.key".into()
            }
        );
    }

    #[test]
    fn one_serving_file_without_the_other_is_a_flag_error() {
        let err = Cli::try_parse_from([
            "mcp-access-apiserver",
            "--database-url",
            DSN,
            "--tls-cert-file",
            "/tls.crt",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn zero_limits_are_refused() {
        for flag in [
            "max-requests-inflight",
            "max-mutating-requests-inflight",
            "max-watches-per-user",
        ] {
            let err = message(standalone(&[&format!("--{flag}"), "0"]));
            assert_eq!(err, format!("--{flag} must be greater than 0"));
            // Negative or not a number: a flag error before any of this.
            for bad in ["-1", "many"] {
                let err = Cli::try_parse_from([
                    "mcp-access-apiserver",
                    "--database-url",
                    DSN,
                    &format!("--{flag}={bad}"),
                ])
                .unwrap_err();
                assert_eq!(
                    err.kind(),
                    clap::error::ErrorKind::ValueValidation,
                    "{flag}={bad}"
                );
            }
        }
        let ok = standalone(&[
            "--max-requests-inflight",
            "7",
            "--max-mutating-requests-inflight",
            "3",
        ])
        .unwrap();
        assert_eq!(ok.serving.max_requests_inflight, 7);
        assert_eq!(ok.serving.max_mutating_requests_inflight, 3);
        // kube-apiserver's defaults.
        let ok = standalone(&[]).unwrap();
        assert_eq!(
            (
                ok.serving.max_requests_inflight,
                ok.serving.max_mutating_requests_inflight
            ),
            (400, 200)
        );
    }

    #[test]
    fn listener_timeouts_default_to_ten_seconds_and_refuse_zero() {
        let ok = standalone(&[]).unwrap();
        assert_eq!(ok.serving.header_read_timeout, Duration::from_secs(10));
        assert_eq!(ok.serving.tls_handshake_timeout, Duration::from_secs(10));
        let ok = standalone(&[
            "--header-read-timeout",
            "2500ms",
            "--tls-handshake-timeout",
            "3s",
        ])
        .unwrap();
        assert_eq!(ok.serving.header_read_timeout, Duration::from_millis(2500));
        assert_eq!(ok.serving.tls_handshake_timeout, Duration::from_secs(3));
        for flag in ["header-read-timeout", "tls-handshake-timeout"] {
            let err = message(standalone(&[&format!("--{flag}"), "0s"]));
            assert_eq!(err, format!("--{flag} must be greater than 0"));
        }
    }

    #[test]
    fn zero_durations_are_refused() {
        for flag in [
            "max-session-ttl",
            "enrollment-retention",
            "watch-bookmark-interval",
            "database-pool-timeout",
            "database-statement-timeout",
            "database-lock-timeout",
            "database-idle-in-transaction-timeout",
            "change-feed-staleness-bound",
        ] {
            let err = message(standalone(&[&format!("--{flag}"), "0"]));
            assert_eq!(err, format!("--{flag} must be greater than 0"));
        }
        for flag in ["authorization-allow-ttl", "authorization-deny-ttl"] {
            let err = message(delegated(&[&format!("--{flag}"), "0s"]));
            assert_eq!(err, format!("--{flag} must be greater than 0"));
        }
    }

    #[test]
    fn a_malformed_duration_is_a_flag_error_at_parse_time() {
        for flag in [
            "--authorization-allow-ttl",
            "--watch-bookmark-interval",
            "--enrollment-retention",
            "--change-feed-staleness-bound",
            "--max-session-ttl",
        ] {
            let err = Cli::try_parse_from([
                "mcp-access-apiserver",
                "--database-url",
                DSN,
                flag,
                "5 minutes",
            ])
            .unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag}"
            );
            assert!(err.to_string().contains("invalid duration"), "{err}");
        }
    }

    #[test]
    fn durations_are_typed() {
        let ok = delegated(&[
            "--authorization-allow-ttl",
            "1m30s",
            "--authorization-deny-ttl",
            "500ms",
            "--watch-bookmark-interval",
            "1h",
            "--enrollment-retention",
            "10s",
            "--max-session-ttl",
            "8h",
        ])
        .unwrap();
        assert_eq!(
            ok.auth,
            AuthMode::Delegated {
                kubeconfig: None,
                allow_ttl: Duration::from_secs(90),
                deny_ttl: Duration::from_millis(500),
                require_allowed_names: false,
                gateway_reverify: Duration::from_secs(30),
            }
        );
        assert_eq!(ok.bookmark_interval, Duration::from_secs(3600));
        assert_eq!(ok.enrollment_retention, Duration::from_secs(10));
        assert_eq!(ok.storage.max_session_ttl, SignedDuration::from_hours(8));
    }

    #[test]
    fn the_staleness_bound_is_at_least_a_second() {
        let err = message(standalone(&["--change-feed-staleness-bound", "500ms"]));
        assert_eq!(err, "--change-feed-staleness-bound must be at least 1s");
        let ok = standalone(&["--change-feed-staleness-bound", "1s"]).unwrap();
        assert_eq!(ok.storage.staleness_bound, Duration::from_secs(1));
    }

    #[test]
    fn verifying_the_database_needs_a_ca() {
        for mode in ["verify-ca", "verify-full"] {
            let dsn = format!("{DSN} sslmode={mode}");
            let err = message(standalone(&["--database-url", &dsn]));
            assert!(err.starts_with("--database-url: "), "{err}");
            assert!(err.contains("needs a CA"), "{err}");
            // Either source of the CA will do.
            let ok = standalone(&["--database-url", &dsn, "--database-ca-file", "/ca.pem"]);
            assert_eq!(ok.unwrap().storage.ca_file, Some("/ca.pem".into()));
            let with_root = format!("{dsn} sslrootcert=/root.pem");
            let ok = standalone(&["--database-url", &with_root]).unwrap();
            assert_eq!(ok.storage.ca_file, Some("/root.pem".into()));
        }
        // The flag wins over the DSN's sslrootcert.
        let dsn = format!("{DSN} sslmode=require sslrootcert=/root.pem");
        let ok = standalone(&["--database-url", &dsn, "--database-ca-file", "/ca.pem"]);
        assert_eq!(ok.unwrap().storage.ca_file, Some("/ca.pem".into()));
        // require without a CA encrypts without verifying.
        let dsn = format!("{DSN} sslmode=require");
        assert!(standalone(&["--database-url", &dsn]).is_ok());
    }

    #[test]
    fn a_malformed_dsn_is_refused_without_echoing_it() {
        let dsn = "host=db password=hunter2 sslmode=sideways";
        let err = message(standalone(&["--database-url", dsn]));
        assert!(err.starts_with("--database-url: "), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        // Nor does the validated configuration, should anyone log it.
        let ok = standalone(&["--database-url", "host=db password=hunter2"]).unwrap();
        assert!(!format!("{ok:?}").contains("hunter2"));
    }

    #[test]
    fn the_pool_keeps_room_for_the_heartbeat() {
        let ok = standalone(&["--database-pool-size", "1"]).unwrap();
        assert_eq!(ok.storage.pool_size, 2);
    }

    #[test]
    fn the_metrics_listener_defaults_to_the_bind_address() {
        let ok = standalone(&["--bind-address", "127.0.0.1", "--metrics-port", "9999"]).unwrap();
        assert_eq!(ok.serving.metrics, "127.0.0.1:9999".parse().unwrap());
        let ok = standalone(&["--metrics-bind-address", "::1"]).unwrap();
        assert_eq!(ok.serving.metrics, "[::1]:9090".parse().unwrap());
        assert_eq!(ok.serving.api, "0.0.0.0:8443".parse().unwrap());
    }
}
