//! What every MCP Access binary does at start: parse its flags and validate them into a
//! configuration ([`Flags`], [`main`]), set up logging in the format its flag asks for,
//! announce its listeners ([`bind_announced`]), reach kube-apiserver from a kubeconfig or the
//! in-cluster service account, and serve TLS with a certificate that reloads when its files
//! change ([`tls`]).
#![forbid(unsafe_code)]

pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;

/// Log format of a binary (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to standard output in `format`, filtered by `RUST_LOG` (default `info`). Text is
/// coloured only on a terminal: a file or a container log gets plain `key=value` fields.
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// A client of kube-apiserver: from `kubeconfig` when given, else the in-cluster service
/// account.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    // kube-rs's TLS uses the process-wide rustls provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
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

/// Prints the one line that says a listener is bound, to standard error:
/// `<binary> listening on <addr> (<listener>)`, with the address the socket really has, so a
/// script or test that asked for port 0 learns the port it got.
pub fn announce_listener(binary: &str, listener: &str, addr: SocketAddr) {
    eprintln!("{binary} listening on {addr} ({listener})");
}

/// Binds `addr` (port 0: any free port) once and announces it ([`announce_listener`]); the
/// caller serves from the listener returned, never binding the address again.
pub async fn bind_announced(
    binary: &str,
    listener: &str,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpListener> {
    let bound = tokio::net::TcpListener::bind(addr).await?;
    announce_listener(binary, listener, bound.local_addr()?);
    Ok(bound)
}

/// A binary's flags: parsed by clap, then validated into the configuration its wiring is
/// built from. Validation reads at most the files a flag names; a setting that would weaken
/// security is an error naming the flag (never echoing a token, key or password).
pub trait Flags: clap::Parser {
    /// What the wiring consumes.
    type Config;
    /// Why the flags make no configuration.
    type Error: Into<anyhow::Error>;

    /// The format of the process's logs.
    fn log_format(&self) -> LogFormat;

    /// Worker threads of the runtime: 0 (the default) one per core, 1 a single-threaded
    /// runtime (every task on this thread, no wake-up ever crosses threads: what a per-pod
    /// proxy wants, as linkerd2-proxy does on one core), N that many.
    fn worker_threads(&self) -> usize {
        0
    }

    /// Validates the flags.
    fn config(self) -> Result<Self::Config, Self::Error>;
}

/// The `main` of every binary: parses the flags `F` (clap prints a usage error and exits 2),
/// starts logging, validates the flags into a configuration before anything runs, then runs
/// `run` on a runtime with the worker threads the flags ask for. An error ends `main`: the
/// standard library prints it with its causes and the process exits 1.
pub fn main<F, Fut>(run: impl FnOnce(F::Config) -> Fut) -> anyhow::Result<()>
where
    F: Flags,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let flags = F::parse();
    init_tracing(flags.log_format());
    let threads = flags.worker_threads();
    let config = flags.config().map_err(Into::into)?;
    runtime(threads)?.block_on(run(config))
}

/// A runtime with `threads` worker threads (see [`Flags::worker_threads`]).
fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Resolves on SIGINT or SIGTERM (only SIGINT where SIGTERM cannot be watched).
pub async fn shutdown_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn port_zero_binds_a_real_port_once() {
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let bound = super::bind_announced("test", "api", any).await.unwrap();
        let addr = bound.local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        // The address is held by the listener returned: binding it again fails.
        assert!(tokio::net::TcpListener::bind(addr).await.is_err());
    }

    #[test]
    fn one_worker_thread_is_a_single_threaded_runtime() {
        let single = super::runtime(1).unwrap();
        assert_eq!(single.metrics().num_workers(), 1);
        let flavor = single.block_on(async { tokio::runtime::Handle::current().runtime_flavor() });
        assert_eq!(flavor, tokio::runtime::RuntimeFlavor::CurrentThread);
        let three = super::runtime(3).unwrap();
        assert_eq!(three.metrics().num_workers(), 3);
    }
}
