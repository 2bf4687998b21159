//! The kube-rs client, configured as kubectl would be: `--kubeconfig` (one file), else
//! `$KUBECONFIG` (merged), else `~/.kube/config`; `--context`; the namespace from `-n`, else
//! the context's, else `default`.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::Connection;
use crate::error::{CliError, Result};

/// A client and the namespace commands act in.
pub struct Context {
    pub client: Client,
    pub namespace: String,
}

pub async fn connect(connection: &Connection) -> Result<Context> {
    let options = KubeConfigOptions {
        context: connection.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &connection.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| CliError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| CliError::Config(e.to_string()))?;
    let namespace = connection
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(CliError::from)?;
    Ok(Context { client, namespace })
}
