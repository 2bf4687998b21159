//! The validated configuration of `mcp-access-controllers`: the NetworkPolicy, egress and
//! Host API settings are checked before any I/O but reading the files a flag names, so a
//! setting that would widen a policy stops startup naming the value, whether or not the
//! cluster is reachable.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::cli::{Cli, LogFormat};
use crate::netpol::egress::{EgressArgs, EgressSettingsError};
use crate::netpol::settings::{NetpolSettings, RuntimeIsolation, SettingsError, SweepCaps};
use crate::{host, hostapi, leader, mcpserver, netpol, retire};

/// A setting the controllers refuse to start with. The text names the flag.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    NetworkPolicy(#[from] SettingsError),
    #[error(transparent)]
    Egress(#[from] EgressSettingsError),
    #[error(transparent)]
    HostApi(#[from] hostapi::settings::SettingError),
}

/// What the wiring builds the controllers from: each controller's flag group, with the
/// settings derived from them already validated.
#[derive(Debug)]
pub struct Config {
    pub mcpserver: mcpserver::Args,
    pub retire: retire::Args,
    pub netpol: netpol::settings::Args,
    pub egress: EgressArgs,
    pub host: host::Args,
    pub leader: leader::Args,
    /// The Host API's settings, `None` when it is off.
    pub host_api: Option<hostapi::Settings>,
    /// The NetworkPolicy settings the Host operator shares.
    pub netpol_settings: NetpolSettings,
    /// The caps of one orphan sweep.
    pub orphan_caps: SweepCaps,
    /// Where MCPServers are isolated, and whether one elsewhere is deployed.
    pub isolation: RuntimeIsolation,
    /// Address of `/metrics`, `/livez` and `/readyz`.
    pub metrics: SocketAddr,
    /// Kubeconfig for reaching kube-apiserver; `None`: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
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

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let (netpol_settings, orphan_caps) = cli.netpol.settings(cli.mcpserver.gateway_port)?;
        let isolation = cli.netpol.isolation(&netpol_settings);
        cli.egress.resolver()?;
        let host_api = cli.host_api.settings()?;
        Ok(Self {
            mcpserver: cli.mcpserver,
            retire: cli.retire,
            netpol: cli.netpol,
            egress: cli.egress,
            host: cli.host,
            leader: cli.leader,
            host_api,
            netpol_settings,
            orphan_caps,
            isolation,
            metrics: SocketAddr::from(([0, 0, 0, 0], cli.metrics_port)),
            kubeconfig: cli.kubeconfig,
        })
    }
}
