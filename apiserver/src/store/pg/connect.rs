//! Building PostgreSQL connections: the DSN's `sslmode`/`sslrootcert` (which tokio-postgres
//! does not fully understand), a rustls connector that honours them, and the timeouts and
//! keepalives every store connection carries.
//!
//! `sslmode` follows libpq: `disable` (plain), `prefer` (TLS if the server offers it, not
//! verified; the default), `require` (TLS, not verified, unless a CA is given: then, as libpq
//! does, the chain is verified), `verify-ca` (TLS, chain verified against the CA, any host
//! name), `verify-full` (TLS, chain and host name verified). The verifying modes need a CA:
//! without one, startup fails instead of silently trusting nothing or everything.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Why a database connection cannot be configured. Never carries the DSN (it may hold a
/// password).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the database URL is not a valid PostgreSQL connection string")]
    MalformedDsn,
    #[error("the database URL has an unknown sslmode {0:?} (disable, prefer, require, verify-ca or verify-full)")]
    UnknownSslMode(String),
    #[error("sslmode={0} verifies the server certificate and needs a CA (--database-ca-file or sslrootcert)")]
    MissingCa(&'static str),
    #[error("cannot read the database CA file {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("TLS setup for the database failed: {0}")]
    Tls(String),
}

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl FromStr for SslMode {
    type Err = ConnectError;
    fn from_str(s: &str) -> Result<Self, ConnectError> {
        Ok(match s {
            "disable" => Self::Disable,
            // `allow` tries plain first; TLS if offered is never weaker than that.
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(ConnectError::UnknownSslMode(other.to_string())),
        })
    }
}

/// A parsed DSN: what tokio-postgres understands, plus the TLS settings it does not.
#[derive(Debug)]
pub struct Dsn {
    pub pg: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    pub ssl_root_cert: Option<PathBuf>,
}

/// Parses a libpq key=value string or a `postgres://` URL, taking `sslmode` and
/// `sslrootcert` out before tokio-postgres (which knows only disable/prefer/require) reads
/// the rest.
pub fn parse_dsn(dsn: &str) -> Result<Dsn, ConnectError> {
    let trimmed = dsn.trim();
    let (rest, taken) =
        if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
            split_url(trimmed)
        } else {
            split_key_values(trimmed)?
        };
    let mut ssl_mode = SslMode::default();
    let mut ssl_root_cert = None;
    for (key, value) in taken {
        match key.as_str() {
            "sslmode" => ssl_mode = value.parse()?,
            _ => ssl_root_cert = Some(PathBuf::from(value)),
        }
    }
    let mut pg = tokio_postgres::Config::from_str(&rest).map_err(|_| ConnectError::MalformedDsn)?;
    pg.ssl_mode(match ssl_mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    Ok(Dsn {
        pg,
        ssl_mode,
        ssl_root_cert,
    })
}

const TAKEN: [&str; 2] = ["sslmode", "sslrootcert"];

/// Splits `key=value key='quoted value'` pairs, keeping every pair but ours verbatim.
fn split_key_values(s: &str) -> Result<(String, Vec<(String, String)>), ConnectError> {
    let mut rest = String::new();
    let mut taken = Vec::new();
    let mut chars = s.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            return Err(ConnectError::MalformedDsn);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(ConnectError::MalformedDsn),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err(ConnectError::MalformedDsn),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(ConnectError::MalformedDsn),
                    }
                } else {
                    value.push(c);
                }
            }
        }
        let end = chars.peek().map_or(s.len(), |(i, _)| *i);
        if TAKEN.contains(&key.as_str()) {
            taken.push((key, value));
        } else {
            rest.push_str(&s[start..end]);
            rest.push(' ');
        }
    }
    Ok((rest, taken))
}

/// Removes our parameters from a URL's query string.
fn split_url(s: &str) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = s.split_once('?') else {
        return (s.to_string(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key);
        if TAKEN.contains(&key.as_str()) {
            taken.push((key, percent_decode(value)));
        } else {
            kept.push(pair);
        }
    }
    if kept.is_empty() {
        (base.to_string(), taken)
    } else {
        (format!("{base}?{}", kept.join("&")), taken)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The TLS side of every store connection: a rustls connector set up for one `sslmode`.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<rustls::ClientConfig>,
    mode: SslMode,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("sslmode", &self.mode.as_str())
            .finish()
    }
}

impl PgTls {
    /// The connector for `mode`, trusting `ca` (PEM) when given.
    pub fn new(mode: SslMode, ca: Option<&Path>) -> Result<Self, ConnectError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, ca) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(ConnectError::MissingCa(mode.as_str()))
            }
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Arc::new(Unverified(provider.clone()))
            }
            (SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull, Some(ca)) => {
                let pem = std::fs::read(ca).map_err(|e| ConnectError::Ca {
                    path: ca.to_path_buf(),
                    message: e.to_string(),
                })?;
                let mut roots = rustls::RootCertStore::empty();
                let mut added = 0;
                for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
                    let cert: CertificateDer<'static> = cert.map_err(|e| ConnectError::Ca {
                        path: ca.to_path_buf(),
                        message: e.to_string(),
                    })?;
                    roots.add(cert).map_err(|e| ConnectError::Ca {
                        path: ca.to_path_buf(),
                        message: e.to_string(),
                    })?;
                    added += 1;
                }
                if added == 0 {
                    return Err(ConnectError::Ca {
                        path: ca.to_path_buf(),
                        message: "no certificate in it".into(),
                    });
                }
                let chain =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| ConnectError::Tls(e.to_string()))?;
                Arc::new(Verified {
                    chain,
                    check_name: mode == SslMode::VerifyFull,
                })
            }
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ConnectError::Tls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
            mode,
        })
    }

    pub fn mode(&self) -> SslMode {
        self.mode
    }
}

/// `require` without a CA and `prefer`: encrypted, the peer not authenticated (as libpq).
/// Handshake signatures are still checked, so the session keys belong to the presented key.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (chain only) and `verify-full` (chain and host name).
#[derive(Debug)]
struct Verified {
    chain: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Verified {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.chain.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // The name is checked after the chain: this error means the chain is valid.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<PgTlsConnect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(PgTlsConnect {
            config: self.config.clone(),
            name,
        })
    }
}

/// One TLS handshake towards one host.
pub struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(PgTlsStream(Box::new(tls)))
        })
    }
}

/// An established TLS stream. Channel binding is not offered: SCRAM runs without `-PLUS`.
pub struct PgTlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// Per-connection limits: how long a statement, a lock wait and an idle transaction may
/// last on the server, and how fast a dead peer is noticed.
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
    /// Bounds TCP connect plus startup.
    pub connect_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Keepalives and timeouts every connection carries, whatever its role: a half-open
/// connection (peer gone without a FIN) is noticed in seconds, not after hours.
pub fn with_transport_limits(
    pg: &tokio_postgres::Config,
    limits: &SessionLimits,
) -> tokio_postgres::Config {
    let mut pg = pg.clone();
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(limits.connect_timeout);
    }
    pg.keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(15));
    pg
}

/// The statements that set a session's server-side statement, lock and idle-transaction
/// timeouts, run on every connection before it is used (the pool's, the change feed's and
/// its heartbeat's). They are sent as `SET`, not as the startup packet's `options`: PgBouncer
/// refuses a startup `options` parameter (or, told to ignore it, drops the limits silently),
/// while a `SET` holds for the whole client session in its session pooling mode.
pub fn session_setup(limits: &SessionLimits) -> String {
    let ms = |d: Duration| d.as_millis().max(1);
    format!(
        "SET statement_timeout = {}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
        ms(limits.statement_timeout),
        ms(limits.lock_timeout),
        ms(limits.idle_in_transaction_timeout),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_dsn_loses_only_our_keys() {
        let dsn = parse_dsn(
            "host=db.example port=5433 sslmode=verify-full sslrootcert='/etc/ca dir/ca.pem' user=mcp password='p w\\'x'",
        )
        .unwrap();
        assert_eq!(dsn.ssl_mode, SslMode::VerifyFull);
        assert_eq!(dsn.ssl_root_cert, Some(PathBuf::from("/etc/ca dir/ca.pem")));
        assert_eq!(dsn.pg.get_user(), Some("mcp"));
        assert_eq!(dsn.pg.get_password(), Some(&b"p w'x"[..]));
        assert_eq!(dsn.pg.get_ports(), &[5433]);
    }

    #[test]
    fn url_dsn_loses_only_our_keys() {
        let dsn = parse_dsn(
            "postgres://mcp:secret@db.example:5433/access?sslmode=verify-ca&application_name=x&sslrootcert=%2Fca.pem",
        )
        .unwrap();
        assert_eq!(dsn.ssl_mode, SslMode::VerifyCa);
        assert_eq!(dsn.ssl_root_cert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(dsn.pg.get_dbname(), Some("access"));
        assert_eq!(dsn.pg.get_application_name(), Some("x"));
        let plain = parse_dsn("postgresql://u@h/d?sslmode=disable").unwrap();
        assert_eq!(plain.ssl_mode, SslMode::Disable);
        assert_eq!(parse_dsn("host=h").unwrap().ssl_mode, SslMode::Prefer);
    }

    #[test]
    fn bad_dsns_are_refused_without_echoing_them() {
        let err = parse_dsn("host=h sslmode=sometimes password=hunter2").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
        assert!(matches!(err, ConnectError::UnknownSslMode(_)));
        let err = parse_dsn("host=h password='hunter2").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn verifying_modes_need_a_ca() {
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            assert!(matches!(
                PgTls::new(mode, None),
                Err(ConnectError::MissingCa(_))
            ));
        }
        assert!(PgTls::new(SslMode::Require, None).is_ok());
    }

    #[test]
    fn session_limits_are_set_statements() {
        let setup = session_setup(&SessionLimits::default());
        assert_eq!(
            setup,
            "SET statement_timeout = 30000; SET lock_timeout = 5000; SET idle_in_transaction_session_timeout = 30000"
        );
    }
}
