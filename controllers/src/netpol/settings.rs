//! Flags of the NetworkPolicy controller and their fail-closed validation: a setting that
//! would widen a policy (a malformed or broad CIDR, a bad cap) stops startup, naming the value;
//! it never becomes a permissive policy.

use std::net::IpAddr;

use apis::duration::GoDuration;
use ipnet::IpNet;

/// The broadest Kubernetes API CIDR accepted (IPv4): the API is a handful of addresses.
pub const MAX_API_PREFIX_V4: u8 = 24;
/// The broadest Kubernetes API CIDR accepted (IPv6).
pub const MAX_API_PREFIX_V6: u8 = 120;

/// Flags of the NetworkPolicy controller.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "netpol")]
pub struct Args {
    /// Namespaces that run MCP servers: each gets the L0 deny-all and the L1 infrastructure
    /// policies (repeat or comma-separate). None: no L0/L1 anywhere.
    #[arg(
        long = "runtime-namespace",
        env = "MCP_ACCESS_RUNTIME_NAMESPACES",
        value_delimiter = ','
    )]
    pub runtime_namespaces: Vec<String>,
    /// Fail closed: an MCPServer outside every `--runtime-namespace` (no L0 deny-all isolates
    /// it) is not deployed. Without it such a server is deployed, flagged
    /// `NetworkIsolated=False` with a Warning Event.
    #[arg(long, env = "MCP_ACCESS_REQUIRE_RUNTIME_NAMESPACE")]
    pub require_runtime_namespace: bool,
    /// Addresses of the Kubernetes API (the endpoints' IPs, as CIDRs no broader than /24 or
    /// /120) that pods labelled with `--kube-api-access-label` may reach.
    #[arg(
        long = "kube-api-cidr",
        env = "MCP_ACCESS_KUBE_API_CIDRS",
        value_delimiter = ','
    )]
    pub kube_api_cidrs: Vec<String>,
    /// Port of the Kubernetes API as the pods' packets carry it (after Service translation).
    #[arg(long, env = "MCP_ACCESS_KUBE_API_PORT", default_value_t = 443)]
    pub kube_api_port: u16,
    /// The opt-in label (`key=value`) of pods allowed to reach the Kubernetes API.
    #[arg(
        long,
        env = "MCP_ACCESS_KUBE_API_ACCESS_LABEL",
        default_value = "mcp-runtime.dev/kube-api-access=true"
    )]
    pub kube_api_access_label: String,
    /// Namespace of the cluster DNS pods.
    #[arg(long, env = "MCP_ACCESS_DNS_NAMESPACE", default_value = "kube-system")]
    pub dns_namespace: String,
    /// Label (`key=value`) of the cluster DNS pods.
    #[arg(
        long,
        env = "MCP_ACCESS_DNS_POD_LABEL",
        default_value = "k8s-app=kube-dns"
    )]
    pub dns_pod_label: String,
    /// The NodeLocal DNS cache address, if the cluster runs one (a single address).
    #[arg(long, env = "MCP_ACCESS_NODE_LOCAL_DNS_IP")]
    pub node_local_dns_ip: Option<String>,
    /// Namespace of the MCP Access apiserver (the gateways' sync path).
    #[arg(
        long,
        env = "MCP_ACCESS_APISERVER_NAMESPACE",
        default_value = "mcp-access"
    )]
    pub apiserver_namespace: String,
    /// Label (`key=value`) of the MCP Access apiserver pods.
    #[arg(
        long,
        env = "MCP_ACCESS_APISERVER_POD_LABEL",
        default_value = "app=mcp-access-apiserver"
    )]
    pub apiserver_pod_label: String,
    /// The apiserver's gateway sync port (its listener, not the Service port).
    #[arg(long, env = "MCP_ACCESS_APISERVER_SYNC_PORT", default_value_t = 8085)]
    pub apiserver_sync_port: u16,
    /// Most orphaned policies one sweep deletes; over it, none.
    #[arg(long, env = "MCP_ACCESS_ORPHAN_DELETE_MAX", default_value_t = 10)]
    pub orphan_delete_max: usize,
    /// Most orphaned policies one sweep deletes, in percent of the managed policies; over
    /// it, none.
    #[arg(
        long,
        env = "MCP_ACCESS_ORPHAN_DELETE_MAX_PERCENT",
        default_value_t = 20
    )]
    pub orphan_delete_max_percent: u8,
    /// How often every policy is recomputed and compared even without a change (an edit by
    /// hand is undone at the latest then; any watched change starts a pass at once).
    #[arg(long, env = "MCP_ACCESS_NETPOL_RESYNC_INTERVAL", default_value = "5m")]
    pub netpol_resync_interval: GoDuration,
}

/// A `key=value` pod label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub key: String,
    pub value: String,
}

/// What the builders need, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetpolSettings {
    pub runtime_namespaces: Vec<String>,
    pub kube_api_cidrs: Vec<IpNet>,
    pub kube_api_port: u16,
    pub kube_api_access_label: Label,
    pub dns_namespace: String,
    pub dns_pod_label: Label,
    pub node_local_dns: Option<IpNet>,
    pub apiserver_namespace: String,
    pub apiserver_pod_label: Label,
    pub apiserver_sync_port: u16,
    /// The port of every MCPServer's gateway (the workload settings' `--gateway-port`).
    pub gateway_port: u16,
}

/// Where MCP servers are isolated (an L0 deny-all in their namespace), and whether a server
/// elsewhere may be deployed at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeIsolation {
    pub runtime_namespaces: std::collections::BTreeSet<String>,
    /// `--require-runtime-namespace`: a server outside them is not deployed.
    pub required: bool,
}

impl RuntimeIsolation {
    /// Whether a server of `namespace` is isolated by the L0 deny-all.
    pub fn isolates(&self, namespace: &str) -> bool {
        self.runtime_namespaces.contains(namespace)
    }

    /// Whether a server of `namespace` may be deployed.
    pub fn deployable(&self, namespace: &str) -> bool {
        !self.required || self.isolates(namespace)
    }
}

/// The caps of one orphan sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepCaps {
    pub max: usize,
    pub max_percent: u8,
}

/// A setting that cannot be used: startup stops with this message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("--kube-api-cidr {0:?} is not a CIDR or an address")]
    MalformedCidr(String),
    #[error("--kube-api-cidr {0:?} has host bits set (the network is {1})")]
    HostBits(String, IpNet),
    #[error("--kube-api-cidr {0:?} is broader than /{1}: the Kubernetes API is a few addresses")]
    BroadCidr(String, u8),
    #[error("--node-local-dns-ip {0:?} is not a single IP address")]
    NodeLocalDns(String),
    #[error("{flag} {value:?} is not a `key=value` label")]
    Label { flag: &'static str, value: String },
    #[error("{flag} {value:?} is not a namespace name")]
    Namespace { flag: &'static str, value: String },
    #[error("--orphan-delete-max-percent {0} is over 100")]
    Percent(u8),
    #[error("{flag} must not be 0")]
    ZeroPort { flag: &'static str },
    #[error("--netpol-resync-interval is 0s: it must be positive")]
    ZeroResync,
    #[error(
        "--require-runtime-namespace without any --runtime-namespace would deploy no MCPServer"
    )]
    NoRuntimeNamespace,
}

impl Args {
    /// The validated settings; `gateway_port` is the workload controller's.
    pub fn settings(
        &self,
        gateway_port: u16,
    ) -> Result<(NetpolSettings, SweepCaps), SettingsError> {
        let mut runtime_namespaces = Vec::new();
        for ns in &self.runtime_namespaces {
            let ns = ns.trim();
            if ns.is_empty() {
                continue;
            }
            if !is_dns_label(ns) {
                return Err(SettingsError::Namespace {
                    flag: "--runtime-namespace",
                    value: ns.into(),
                });
            }
            if !runtime_namespaces.iter().any(|n| n == ns) {
                runtime_namespaces.push(ns.to_string());
            }
        }
        // A namespace selector on a name no namespace can have would quietly cut DNS or the
        // sync path; a typo stops startup instead.
        for (flag, ns) in [
            ("--dns-namespace", &self.dns_namespace),
            ("--apiserver-namespace", &self.apiserver_namespace),
        ] {
            if !is_dns_label(ns) {
                return Err(SettingsError::Namespace {
                    flag,
                    value: ns.clone(),
                });
            }
        }
        let kube_api_cidrs = self
            .kube_api_cidrs
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .map(check_api_cidr)
            .collect::<Result<Vec<_>, _>>()?;
        let node_local_dns = match self.node_local_dns_ip.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(ip) => Some(IpNet::from(
                ip.parse::<IpAddr>()
                    .map_err(|_| SettingsError::NodeLocalDns(ip.into()))?,
            )),
        };
        for (flag, port) in [
            ("--kube-api-port", self.kube_api_port),
            ("--apiserver-sync-port", self.apiserver_sync_port),
            ("--gateway-port", gateway_port),
        ] {
            if port == 0 {
                return Err(SettingsError::ZeroPort { flag });
            }
        }
        if self.orphan_delete_max_percent > 100 {
            return Err(SettingsError::Percent(self.orphan_delete_max_percent));
        }
        if self.netpol_resync_interval.is_zero() {
            return Err(SettingsError::ZeroResync);
        }
        if self.require_runtime_namespace && runtime_namespaces.is_empty() {
            return Err(SettingsError::NoRuntimeNamespace);
        }
        Ok((
            NetpolSettings {
                runtime_namespaces,
                kube_api_cidrs,
                kube_api_port: self.kube_api_port,
                kube_api_access_label: label(
                    "--kube-api-access-label",
                    &self.kube_api_access_label,
                )?,
                dns_namespace: self.dns_namespace.clone(),
                dns_pod_label: label("--dns-pod-label", &self.dns_pod_label)?,
                node_local_dns,
                apiserver_namespace: self.apiserver_namespace.clone(),
                apiserver_pod_label: label("--apiserver-pod-label", &self.apiserver_pod_label)?,
                apiserver_sync_port: self.apiserver_sync_port,
                gateway_port,
            },
            SweepCaps {
                max: self.orphan_delete_max,
                max_percent: self.orphan_delete_max_percent,
            },
        ))
    }
}

impl Args {
    /// Where servers are isolated, from the validated runtime namespaces of `settings`.
    pub fn isolation(&self, settings: &NetpolSettings) -> RuntimeIsolation {
        RuntimeIsolation {
            runtime_namespaces: settings.runtime_namespaces.iter().cloned().collect(),
            required: self.require_runtime_namespace,
        }
    }
}

/// A Kubernetes API CIDR: well-formed (a bare address is a /32 or /128), no host bits set,
/// and no broader than [`MAX_API_PREFIX_V4`] / [`MAX_API_PREFIX_V6`].
pub fn check_api_cidr(value: &str) -> Result<IpNet, SettingsError> {
    let net = parse_net(value).ok_or_else(|| SettingsError::MalformedCidr(value.into()))?;
    // "10.0.0.7/8" is a typo or a trick; either way not what it looks like.
    if net.network() != net.addr() {
        return Err(SettingsError::HostBits(value.into(), net.trunc()));
    }
    let bound = match net {
        IpNet::V4(_) => MAX_API_PREFIX_V4,
        IpNet::V6(_) => MAX_API_PREFIX_V6,
    };
    if net.prefix_len() < bound {
        return Err(SettingsError::BroadCidr(value.into(), bound));
    }
    Ok(net)
}

/// A CIDR, or a bare address as its /32 or /128; nothing else (no trimming, no short forms).
pub fn parse_net(value: &str) -> Option<IpNet> {
    value
        .parse::<IpNet>()
        .ok()
        .or_else(|| value.parse::<IpAddr>().ok().map(IpNet::from))
}

fn label(flag: &'static str, value: &str) -> Result<Label, SettingsError> {
    let bad = || SettingsError::Label {
        flag,
        value: value.into(),
    };
    let (key, val) = value.split_once('=').ok_or_else(bad)?;
    let (key, val) = (key.trim(), val.trim());
    let key_ok = !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    let val_ok = val.len() <= 63
        && val
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !key_ok || !val_ok {
        return Err(bad());
    }
    Ok(Label {
        key: key.into(),
        value: val.into(),
    })
}

/// An RFC 1123 label (what a namespace name is).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_cidrs_are_narrow_and_well_formed() {
        for ok in [
            "10.96.0.1",
            "10.96.0.1/32",
            "172.18.0.0/24",
            "fd00::1",
            "fd00::/120",
        ] {
            assert!(check_api_cidr(ok).is_ok(), "{ok}");
        }
        for (bad, want) in [
            (
                "10.96.0.0/23",
                SettingsError::BroadCidr("10.96.0.0/23".into(), 24),
            ),
            (
                "0.0.0.0/0",
                SettingsError::BroadCidr("0.0.0.0/0".into(), 24),
            ),
            (
                "fd00::/119",
                SettingsError::BroadCidr("fd00::/119".into(), 120),
            ),
            ("::/0", SettingsError::BroadCidr("::/0".into(), 120)),
            (
                "10.96.0.7/24",
                SettingsError::HostBits("10.96.0.7/24".into(), "10.96.0.0/24".parse().unwrap()),
            ),
            (
                "10.96.0/24",
                SettingsError::MalformedCidr("10.96.0/24".into()),
            ),
            (
                "10.96.0.1/33",
                SettingsError::MalformedCidr("10.96.0.1/33".into()),
            ),
            (
                "kubernetes",
                SettingsError::MalformedCidr("kubernetes".into()),
            ),
            (
                "10.96.0.1 ",
                SettingsError::MalformedCidr("10.96.0.1 ".into()),
            ),
        ] {
            assert_eq!(check_api_cidr(bad), Err(want), "{bad}");
        }
    }

    #[test]
    fn labels_and_namespaces_are_checked() {
        assert_eq!(
            label("--dns-pod-label", "k8s-app=kube-dns").unwrap(),
            Label {
                key: "k8s-app".into(),
                value: "kube-dns".into()
            }
        );
        for bad in ["kube-dns", "=x", "a=b c", "a=b=c"] {
            assert!(label("--dns-pod-label", bad).is_err(), "{bad}");
        }
        assert!(is_dns_label("team-a"));
        for bad in ["Team", "-a", "a_b", "", "a.b"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    fn parse(args: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            netpol: Args,
        }
        let argv = std::iter::once("test").chain(args.iter().copied());
        <Flags as clap::Parser>::try_parse_from(argv)
            .expect("the flags parse")
            .netpol
    }

    #[test]
    fn requiring_a_runtime_namespace_needs_one() {
        assert_eq!(
            parse(&["--require-runtime-namespace"]).settings(8086),
            Err(SettingsError::NoRuntimeNamespace)
        );
        let args = parse(&[
            "--require-runtime-namespace",
            "--runtime-namespace=tools,,ops",
        ]);
        let (settings, _) = args.settings(8086).unwrap();
        let isolation = args.isolation(&settings);
        assert!(isolation.required);
        assert!(isolation.isolates("tools") && isolation.deployable("ops"));
        assert!(!isolation.isolates("default") && !isolation.deployable("default"));
        let open = parse(&["--runtime-namespace=tools"]);
        let isolation = open.isolation(&open.settings(8086).unwrap().0);
        assert!(!isolation.isolates("default") && isolation.deployable("default"));
    }

    #[test]
    fn namespaces_of_every_flag_are_checked() {
        assert!(parse(&[]).settings(8086).is_ok());
        for (flag, value) in [
            ("--runtime-namespace", "Team_A"),
            ("--dns-namespace", "Kube_System"),
            ("--dns-namespace", ""),
            ("--apiserver-namespace", "mcp access"),
        ] {
            assert_eq!(
                parse(&[flag, value]).settings(8086),
                Err(SettingsError::Namespace {
                    flag,
                    value: value.into()
                }),
                "{flag} {value:?}"
            );
        }
    }
}
