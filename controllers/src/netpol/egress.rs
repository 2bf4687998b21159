//! Layer L3 (DESIGN §6): proving an MCPServer's `spec.egressBindings` safe to open.
//!
//! A binding becomes an [`EgressAllow`] only when every address it would open is provably
//! public: an `ExactHost` CIDR that overlaps none of [`FORBIDDEN_RANGES`], an `ExactHost` DNS
//! name that is not a cluster-internal or special-use name and whose every A/AAAA answer is
//! public, or `PublicWeb` (0.0.0.0/0 and ::/0 on TCP 80/443 with all those ranges carved out).
//!
//! It fails closed: a malformed field, a forbidden range, a name that does not resolve within
//! the deadline, an NXDOMAIN, an empty answer or an answer with one private address among
//! public ones fail the whole binding, which then opens nothing. A pod that can reach
//! 10.0.0.0/8 or 169.254.169.254 through a "public" binding reaches the cluster and the cloud's
//! metadata service, so the public subset of a mixed answer is never allowed either. A failing
//! binding affects no other binding.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use apis::duration::GoDuration;
use apis::runtime::{EgressBinding, EgressBindingType, NetworkProtocol, PortRef, ResolvedEgress};
use futures::future::BoxFuture;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::{Name, ResolveError, TokioResolver};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use k8s_openapi::jiff::Timestamp;

use super::desired::{EgressAllow, IpBlock};

/// A range no egress binding may reach, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForbiddenRange {
    /// The range.
    pub net: IpNet,
    /// What the range is, as error messages name it ("private", "loopback", ...).
    pub what: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, what: &'static str) -> ForbiddenRange {
    ForbiddenRange {
        net: IpNet::V4(match Ipv4Net::new(Ipv4Addr::new(a, b, c, d), len) {
            Ok(net) => net,
            Err(_) => panic!("bad forbidden IPv4 range"),
        }),
        what,
    }
}

const fn v6(segs: [u16; 8], len: u8, what: &'static str) -> ForbiddenRange {
    let [a, b, c, d, e, f, g, h] = segs;
    ForbiddenRange {
        net: IpNet::V6(
            match Ipv6Net::new(Ipv6Addr::new(a, b, c, d, e, f, g, h), len) {
                Ok(net) => net,
                Err(_) => panic!("bad forbidden IPv6 range"),
            },
        ),
        what,
    }
}

/// Every range an egress binding may not overlap (and `PublicWeb` carves out): private,
/// shared, loopback, link-local (the cloud metadata service), documentation, benchmarking,
/// multicast and reserved space, and the IPv6 prefixes that embed IPv4 addresses (compatible,
/// mapped, SIIT-translated, NAT64, 6to4) and could otherwise smuggle a private IPv4
/// destination. Sources: the IANA
/// IPv4 and IPv6 special-purpose address registries (RFC 6890 and its updates).
#[rustfmt::skip] // a table: one range a line, aligned
pub const FORBIDDEN_RANGES: &[ForbiddenRange] = &[
    // IPv4
    v4(0, 0, 0, 0, 8,       "\"this network\""),            // RFC 791
    v4(10, 0, 0, 0, 8,      "private"),                     // RFC 1918
    v4(100, 64, 0, 0, 10,   "shared (CGNAT)"),              // RFC 6598
    v4(127, 0, 0, 0, 8,     "loopback"),                    // RFC 1122
    v4(169, 254, 0, 0, 16,  "link-local (cloud metadata)"), // RFC 3927; 169.254.169.254
    v4(172, 16, 0, 0, 12,   "private"),                     // RFC 1918
    v4(192, 0, 0, 0, 24,    "IETF protocol assignments"),   // RFC 6890
    v4(192, 0, 2, 0, 24,    "documentation"),               // RFC 5737 TEST-NET-1
    v4(192, 88, 99, 0, 24,  "6to4 relay anycast"),          // RFC 7526 (deprecated)
    v4(192, 168, 0, 0, 16,  "private"),                     // RFC 1918
    v4(198, 18, 0, 0, 15,   "benchmarking"),                // RFC 2544
    v4(198, 51, 100, 0, 24, "documentation"),               // RFC 5737 TEST-NET-2
    v4(203, 0, 113, 0, 24,  "documentation"),               // RFC 5737 TEST-NET-3
    v4(224, 0, 0, 0, 4,     "multicast"),                   // RFC 5771
    v4(240, 0, 0, 0, 4,     "reserved"),                    // RFC 1112; with 255.255.255.255
    // IPv6
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128,           "unspecified"),               // RFC 4291
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128,           "loopback"),                  // RFC 4291
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96,            "IPv4-compatible"),           // RFC 4291 (deprecated)
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96,       "IPv4-mapped"),               // RFC 4291
    v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96,       "IPv4-translated (SIIT)"),    // RFC 2765
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96,    "NAT64"),                     // RFC 6052
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48,    "local-use NAT64"),           // RFC 8215
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64,        "discard-only"),              // RFC 6666
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23,       "IETF protocol assignments"), // RFC 2928
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32,   "documentation"),             // RFC 3849
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16,       "6to4"),                      // RFC 3056
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20,       "documentation"),             // RFC 9637
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7,        "unique local"),              // RFC 4193
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10,       "link-local"),                // RFC 4291
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10,       "site-local"),                // RFC 3879 (deprecated)
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8,        "multicast"),                 // RFC 4291
];

/// Names that never name a public destination: (the pattern as errors show it, the name itself
/// or, with a leading dot, a suffix).
const FORBIDDEN_SUFFIXES: &[(&str, &str)] = &[
    ("localhost", "localhost"),
    ("*.localhost", ".localhost"),
    ("*.internal", ".internal"),
    ("*.svc", ".svc"),
    ("*.cluster.local", ".cluster.local"),
    ("*.local", ".local"),
];

/// The longest DNS name (without the trailing dot).
const MAX_HOST: usize = 253;
/// The ports of a `PublicWeb` binding.
const PUBLIC_WEB_PORTS: [i32; 2] = [80, 443];

/// Why a binding opens nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("binding name {0:?} is used more than once")]
    DuplicateName(String),
    #[error("an ExactHost binding needs exactly one of cidr and host, not both")]
    BothCidrAndHost,
    #[error("an ExactHost binding needs one of cidr and host")]
    NoTarget,
    #[error("an ExactHost binding needs a port")]
    NoPort,
    #[error("port {0} is not between 1 and 65535")]
    PortOutOfRange(i32),
    #[error("a PublicWeb binding takes no {0} (it is any public address on TCP 80 and 443)")]
    PublicWebField(&'static str),
    #[error("cidr {0:?} is not a CIDR or an IP address")]
    MalformedCidr(String),
    #[error("cidr {cidr:?} has host bits set (the network is {network})")]
    HostBits { cidr: String, network: IpNet },
    #[error("cidr {cidr:?} overlaps the {what} range {range}")]
    ForbiddenCidr {
        cidr: String,
        range: IpNet,
        what: &'static str,
    },
    #[error("host {host:?} is not a valid DNS name: {reason}")]
    InvalidHost { host: String, reason: &'static str },
    #[error("host {0:?} is an IP address: use cidr")]
    IpLiteralHost(String),
    #[error("host {0:?} is a single label, not a public DNS name")]
    SingleLabelHost(String),
    #[error("host {host:?} matches {pattern}, which is never a public name")]
    ForbiddenHost { host: String, pattern: &'static str },
    #[error("host {host:?} resolved to {addr}, in the {what} range {range}")]
    ForbiddenAddress {
        host: String,
        addr: IpAddr,
        range: IpNet,
        what: &'static str,
    },
    #[error("resolving host {host:?} failed: {cause}")]
    Resolution { host: String, cause: ResolveFailure },
}

/// Why a name has no usable addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveFailure {
    #[error("no such domain (NXDOMAIN)")]
    NxDomain,
    #[error("no A or AAAA records")]
    NoAddresses,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Other(String),
}

/// One binding that opens nothing, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingFailure {
    /// The binding's name.
    pub binding: String,
    /// Why it opens nothing.
    pub error: BindingError,
}

/// The outcome of [`prove`]: each binding is either allowed or failed, never both. Every list
/// is sorted by binding name, so the policies built from it compare byte for byte.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressProof {
    /// The bindings proven safe, as the L3 policy opens them.
    pub allows: Vec<EgressAllow>,
    /// The addresses of the DNS-named bindings that were allowed (`status.resolvedEgressIPs`).
    pub resolved: Vec<ResolvedEgress>,
    /// The bindings that open nothing (condition `ExternalEgressReady=False`).
    pub failures: Vec<BindingFailure>,
}

/// Resolves a DNS name (already checked by [`check_host`]) to its A and AAAA addresses.
pub trait Resolve: Send + Sync {
    /// Every address of `host` (normalized: lowercase, no trailing dot, never searched in a
    /// domain list); an empty answer may be returned as `Ok(vec![])`.
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveFailure>>;
}

/// The first forbidden range `net` overlaps. Two prefixes overlap exactly when one contains the
/// other's network address.
pub fn forbidden_overlap(net: &IpNet) -> Option<&'static ForbiddenRange> {
    FORBIDDEN_RANGES
        .iter()
        .find(|r| r.net.contains(&net.network()) || net.contains(&r.net.network()))
}

/// An `ExactHost` CIDR: well-formed (a bare address is a /32 or /128), no host bits set, and
/// overlapping no forbidden range.
pub fn check_cidr(value: &str) -> Result<IpNet, BindingError> {
    let net = super::settings::parse_net(value)
        .ok_or_else(|| BindingError::MalformedCidr(value.into()))?;
    if net.network() != net.addr() {
        return Err(BindingError::HostBits {
            cidr: value.into(),
            network: net.trunc(),
        });
    }
    if let Some(r) = forbidden_overlap(&net) {
        return Err(BindingError::ForbiddenCidr {
            cidr: value.into(),
            range: r.net,
            what: r.what,
        });
    }
    Ok(net)
}

/// An `ExactHost` DNS name, normalized (lowercase, no trailing dot): RFC 1123 labels, at most
/// 253 characters, at least two labels, not an IP literal and not a cluster-internal or
/// special-use name.
pub fn check_host(value: &str) -> Result<String, BindingError> {
    let invalid = |reason| BindingError::InvalidHost {
        host: value.into(),
        reason,
    };
    let host = value.to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host);
    if host.parse::<IpAddr>().is_ok() {
        return Err(BindingError::IpLiteralHost(value.into()));
    }
    if host.is_empty() {
        return Err(invalid("it is empty"));
    }
    if host.len() > MAX_HOST {
        return Err(invalid("it is longer than 253 characters"));
    }
    for label in host.split('.') {
        if label.is_empty() {
            return Err(invalid("it has an empty label"));
        }
        if label.len() > 63 {
            return Err(invalid("a label is longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid("only letters, digits, '-' and '.' are allowed"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid("a label starts or ends with '-'"));
        }
    }
    // No top-level domain is all digits (RFC 3696 §2): "127.1" or "0x7f.1" is an address in
    // disguise that some resolvers would turn into 127.0.0.1.
    if host
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(BindingError::IpLiteralHost(value.into()));
    }
    for &(pattern, suffix) in FORBIDDEN_SUFFIXES {
        let hit = match suffix.strip_prefix('.') {
            Some(_) => host.ends_with(suffix),
            None => host == suffix,
        };
        if hit {
            return Err(BindingError::ForbiddenHost {
                host: value.into(),
                pattern,
            });
        }
    }
    if !host.contains('.') {
        return Err(BindingError::SingleLabelHost(value.into()));
    }
    Ok(host.to_string())
}

/// The allow of a `PublicWeb` binding: 0.0.0.0/0 and ::/0 with every forbidden range carved
/// out, on TCP 80 and 443.
pub fn public_web_allow(binding: &str) -> EgressAllow {
    let except = |v6: bool| {
        FORBIDDEN_RANGES
            .iter()
            .filter(|r| matches!(r.net, IpNet::V6(_)) == v6)
            .map(|r| r.net)
            .collect::<Vec<_>>()
    };
    EgressAllow {
        binding: binding.into(),
        blocks: vec![
            IpBlock {
                cidr: IpNet::V4(Ipv4Net::default()),
                except: except(false),
            },
            IpBlock {
                cidr: IpNet::V6(Ipv6Net::default()),
                except: except(true),
            },
        ],
        ports: PUBLIC_WEB_PORTS
            .iter()
            .map(|&port| PortRef {
                port,
                protocol: NetworkProtocol::Tcp,
            })
            .collect(),
    }
}

/// What a binding was checked to be, before any name is resolved.
enum Checked {
    Allow(EgressAllow),
    Host { host: String, port: PortRef },
}

fn check_binding(b: &EgressBinding) -> Result<Checked, BindingError> {
    match b.kind {
        EgressBindingType::PublicWeb => {
            for (field, given) in [
                ("cidr", b.cidr.is_some()),
                ("host", b.host.is_some()),
                ("port", b.port.is_some()),
                ("protocol", b.protocol.is_some()),
            ] {
                if given {
                    return Err(BindingError::PublicWebField(field));
                }
            }
            Ok(Checked::Allow(public_web_allow(&b.name)))
        }
        EgressBindingType::ExactHost => {
            let port = match b.port {
                None => return Err(BindingError::NoPort),
                Some(p) if !(1..=65535).contains(&p) => {
                    return Err(BindingError::PortOutOfRange(p))
                }
                Some(p) => PortRef {
                    port: p,
                    protocol: b.protocol.unwrap_or_default(),
                },
            };
            match (&b.cidr, &b.host) {
                (Some(_), Some(_)) => Err(BindingError::BothCidrAndHost),
                (None, None) => Err(BindingError::NoTarget),
                (Some(cidr), None) => Ok(Checked::Allow(EgressAllow {
                    binding: b.name.clone(),
                    blocks: vec![IpBlock {
                        cidr: check_cidr(cidr)?,
                        except: Vec::new(),
                    }],
                    ports: vec![port],
                })),
                (None, Some(host)) => Ok(Checked::Host {
                    host: check_host(host)?,
                    port,
                }),
            }
        }
    }
}

/// Every address public, at least one, or the binding fails: the sorted, deduplicated list.
fn check_answer(host: &str, addrs: Vec<IpAddr>) -> Result<Vec<IpAddr>, BindingError> {
    let addrs: BTreeSet<IpAddr> = addrs.into_iter().collect();
    if addrs.is_empty() {
        return Err(BindingError::Resolution {
            host: host.into(),
            cause: ResolveFailure::NoAddresses,
        });
    }
    for &addr in &addrs {
        if let Some(r) = forbidden_overlap(&IpNet::from(addr)) {
            return Err(BindingError::ForbiddenAddress {
                host: host.into(),
                addr,
                range: r.net,
                what: r.what,
            });
        }
    }
    Ok(addrs.into_iter().collect())
}

/// Proves each binding: allowed (with the addresses of a DNS-named one) or failed. Names are
/// resolved concurrently, each lookup cut at `deadline`; `now` stamps `resolvedAt`.
pub async fn prove(
    bindings: &[EgressBinding],
    resolver: &dyn Resolve,
    deadline: Duration,
    now: Timestamp,
) -> EgressProof {
    let mut proof = EgressProof::default();
    let mut by_name: BTreeMap<&str, Vec<&EgressBinding>> = BTreeMap::new();
    for b in bindings {
        by_name.entry(b.name.as_str()).or_default().push(b);
    }
    let resolved_at = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut lookups = Vec::new();
    for (name, group) in by_name {
        let fail = |error| BindingFailure {
            binding: name.into(),
            error,
        };
        // Two bindings of one name are ambiguous in `resolvedEgressIPs`; neither is opened.
        let [b] = group.as_slice() else {
            proof
                .failures
                .push(fail(BindingError::DuplicateName(name.into())));
            continue;
        };
        match check_binding(b) {
            Err(e) => proof.failures.push(fail(e)),
            Ok(Checked::Allow(allow)) => proof.allows.push(allow),
            Ok(Checked::Host { host, port }) => lookups.push(async move {
                let answer = match tokio::time::timeout(deadline, resolver.resolve(&host)).await {
                    Err(_) => Err(ResolveFailure::Timeout(deadline)),
                    Ok(answer) => answer,
                };
                let result = answer
                    .map_err(|cause| BindingError::Resolution {
                        host: host.clone(),
                        cause,
                    })
                    .and_then(|addrs| check_answer(&host, addrs));
                (name, host, port, result)
            }),
        }
    }
    for (name, host, port, result) in futures::future::join_all(lookups).await {
        match result {
            Err(error) => proof.failures.push(BindingFailure {
                binding: name.into(),
                error,
            }),
            Ok(addrs) => {
                proof.allows.push(EgressAllow {
                    binding: name.into(),
                    blocks: addrs
                        .iter()
                        .map(|&a| IpBlock {
                            cidr: IpNet::from(a),
                            except: Vec::new(),
                        })
                        .collect(),
                    ports: vec![port],
                });
                proof.resolved.push(ResolvedEgress {
                    binding: name.into(),
                    host,
                    ips: addrs.iter().map(IpAddr::to_string).collect(),
                    resolved_at: Some(resolved_at.clone()),
                });
            }
        }
    }
    proof.allows.sort_by(|a, b| a.binding.cmp(&b.binding));
    proof.resolved.sort_by(|a, b| a.binding.cmp(&b.binding));
    proof.failures.sort_by(|a, b| a.binding.cmp(&b.binding));
    proof
}

/// The resolver and refresh flags of layer L3.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "egress")]
pub struct EgressArgs {
    /// The nameserver (`ip:port`, or `ip` for port 53) egress hostnames are resolved with over
    /// UDP; the system's /etc/resolv.conf when absent.
    #[arg(long, env = "MCP_ACCESS_EGRESS_DNS_SERVER")]
    pub egress_dns_server: Option<String>,
    /// How long one egress hostname lookup (A and AAAA) may take before its binding fails.
    #[arg(long, env = "MCP_ACCESS_EGRESS_DNS_TIMEOUT", default_value = "2s")]
    pub egress_dns_timeout: GoDuration,
    /// How often egress hostnames are resolved again.
    #[arg(long, env = "MCP_ACCESS_EGRESS_REFRESH_INTERVAL", default_value = "5m")]
    pub egress_refresh_interval: GoDuration,
}

/// The L3 resolver settings, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressSettings {
    /// The nameserver to ask; /etc/resolv.conf's when `None`.
    pub dns_server: Option<SocketAddr>,
    /// The bound of one hostname lookup.
    pub dns_timeout: Duration,
    /// How often hostnames are resolved again.
    pub refresh_interval: Duration,
}

/// An L3 setting that cannot be used: startup stops with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressSettingsError {
    #[error("--egress-dns-server {0:?} is not an `ip:port` or an IP address")]
    DnsServer(String),
    #[error("--egress-dns-server {0:?} is not a usable nameserver address")]
    UnusableDnsServer(String),
    // Every zero duration ("0", "0s", "0m") is the same value, so it is named as 0s.
    #[error("{0} is 0s: it must be positive")]
    Zero(&'static str),
    #[error("--egress-dns-timeout ({timeout:?}) must be shorter than --egress-refresh-interval ({interval:?})")]
    TimeoutOverInterval {
        timeout: Duration,
        interval: Duration,
    },
    #[error("the system resolver configuration cannot be read: {0}")]
    SystemConfig(String),
}

impl EgressArgs {
    /// The validated settings.
    pub fn settings(&self) -> Result<EgressSettings, EgressSettingsError> {
        let dns_server = match self.egress_dns_server.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(s) => {
                let addr = s
                    .parse::<SocketAddr>()
                    .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .map_err(|_| EgressSettingsError::DnsServer(s.into()))?;
                if addr.port() == 0 || addr.ip().is_unspecified() || addr.ip().is_multicast() {
                    return Err(EgressSettingsError::UnusableDnsServer(s.into()));
                }
                Some(addr)
            }
        };
        let dns_timeout = self.egress_dns_timeout.std();
        let refresh_interval = self.egress_refresh_interval.std();
        if dns_timeout.is_zero() {
            return Err(EgressSettingsError::Zero("--egress-dns-timeout"));
        }
        if refresh_interval.is_zero() {
            return Err(EgressSettingsError::Zero("--egress-refresh-interval"));
        }
        if dns_timeout >= refresh_interval {
            return Err(EgressSettingsError::TimeoutOverInterval {
                timeout: dns_timeout,
                interval: refresh_interval,
            });
        }
        Ok(EgressSettings {
            dns_server,
            dns_timeout,
            refresh_interval,
        })
    }

    /// The real resolver these flags describe.
    pub fn resolver(&self) -> Result<DnsResolver, EgressSettingsError> {
        let s = self.settings()?;
        DnsResolver::new(s.dns_server, s.dns_timeout)
    }
}

/// The real [`Resolve`]: hickory over UDP to one nameserver or the system's, A and AAAA in
/// parallel, never the hosts file or search domains, cut at its timeout.
#[derive(Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
    timeout: Duration,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl DnsResolver {
    /// A resolver asking `server` (or /etc/resolv.conf's nameservers), each lookup bounded by
    /// `timeout`.
    pub fn new(server: Option<SocketAddr>, timeout: Duration) -> Result<Self, EgressSettingsError> {
        let provider = TokioConnectionProvider::default();
        let mut builder = match server {
            Some(addr) => {
                let mut config = ResolverConfig::new();
                config.add_name_server(NameServerConfig::new(addr, Protocol::Udp));
                TokioResolver::builder_with_config(config, provider)
            }
            None => TokioResolver::builder(provider)
                .map_err(|e| EgressSettingsError::SystemConfig(e.to_string()))?,
        };
        let opts = builder.options_mut();
        // One attempt of at most the whole budget: hickory cannot retry past the deadline (the
        // outer timeout in `resolve` holds even if several nameservers are configured).
        opts.timeout = timeout;
        opts.attempts = 1;
        opts.try_tcp_on_error = false;
        // /etc/hosts is not DNS and not ours to trust for a policy decision.
        opts.use_hosts_file = ResolveHosts::Never;
        // Names are queried fully qualified; a pod's `ndots:5` search list must never turn
        // "api.example.com" into "api.example.com.<ns>.svc.cluster.local".
        opts.ndots = 0;
        Ok(Self {
            inner: builder.build(),
            timeout,
        })
    }

    async fn lookup_all(&self, name: Name) -> Result<Vec<IpAddr>, ResolveFailure> {
        let (a, aaaa) = tokio::join!(
            self.inner.lookup(name.clone(), RecordType::A),
            self.inner.lookup(name, RecordType::AAAA),
        );
        let mut out = Vec::new();
        for answer in [a, aaaa] {
            match answer {
                Ok(lookup) => out.extend(lookup.iter().filter_map(|rdata| match rdata {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })),
                Err(e) => match failure(&e, self.timeout) {
                    // The name exists without records of this family: the other may have some.
                    None => {}
                    Some(failure) => return Err(failure),
                },
            }
        }
        Ok(out)
    }
}

/// What a hickory error means for a binding; `None` for "no records of this type" (NOERROR).
fn failure(e: &ResolveError, timeout: Duration) -> Option<ResolveFailure> {
    let Some(proto) = e.proto() else {
        return Some(ResolveFailure::Other(e.to_string()));
    };
    match proto.kind() {
        ProtoErrorKind::NoRecordsFound { response_code, .. } => match *response_code {
            ResponseCode::NoError => None,
            ResponseCode::NXDomain => Some(ResolveFailure::NxDomain),
            code => Some(ResolveFailure::Other(format!("the server answered {code}"))),
        },
        ProtoErrorKind::Timeout => Some(ResolveFailure::Timeout(timeout)),
        _ => Some(ResolveFailure::Other(e.to_string())),
    }
}

impl Resolve for DnsResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveFailure>> {
        Box::pin(async move {
            let name = Name::from_ascii(format!("{host}."))
                .map_err(|e| ResolveFailure::Other(e.to_string()))?;
            match tokio::time::timeout(self.timeout, self.lookup_all(name)).await {
                Err(_) => Err(ResolveFailure::Timeout(self.timeout)),
                Ok(result) => result,
            }
        })
    }
}

/// A fixed table of answers, for tests and fixtures: a name absent from it is NXDOMAIN.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    /// Normalized host → its answer.
    pub answers: BTreeMap<String, Result<Vec<IpAddr>, ResolveFailure>>,
}

impl StaticResolver {
    /// Answers `host` with `addrs`.
    pub fn with(mut self, host: &str, addrs: &[IpAddr]) -> Self {
        self.answers.insert(host.into(), Ok(addrs.to_vec()));
        self
    }

    /// Answers `host` with a failure.
    pub fn failing(mut self, host: &str, failure: ResolveFailure) -> Self {
        self.answers.insert(host.into(), Err(failure));
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveFailure>> {
        let answer = self
            .answers
            .get(host)
            .cloned()
            .unwrap_or(Err(ResolveFailure::NxDomain));
        Box::pin(async move { answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn forbidden(cidr: &str, range: &str, what: &'static str) -> BindingError {
        BindingError::ForbiddenCidr {
            cidr: cidr.into(),
            range: net(range),
            what,
        }
    }

    fn mk_host(name: &str, host: &str, port: i32) -> EgressBinding {
        EgressBinding {
            name: name.into(),
            kind: EgressBindingType::ExactHost,
            cidr: None,
            host: Some(host.into()),
            port: Some(port),
            protocol: None,
        }
    }

    fn mk_cidr(name: &str, cidr: &str, port: i32) -> EgressBinding {
        EgressBinding {
            cidr: Some(cidr.into()),
            host: None,
            ..mk_host(name, "", port)
        }
    }

    fn mk_web(name: &str) -> EgressBinding {
        EgressBinding {
            name: name.into(),
            kind: EgressBindingType::PublicWeb,
            cidr: None,
            host: None,
            port: None,
            protocol: None,
        }
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00.25Z".parse().expect("test timestamp")
    }

    const DEADLINE: Duration = Duration::from_secs(1);

    #[test]
    fn every_forbidden_cidr_class_is_rejected() {
        let cases: &[(&str, BindingError)] = &[
            (
                "0.0.0.0/8",
                forbidden("0.0.0.0/8", "0.0.0.0/8", "\"this network\""),
            ),
            (
                "10.1.0.0/16",
                forbidden("10.1.0.0/16", "10.0.0.0/8", "private"),
            ),
            (
                "100.64.1.1",
                forbidden("100.64.1.1", "100.64.0.0/10", "shared (CGNAT)"),
            ),
            (
                "127.0.0.1/32",
                forbidden("127.0.0.1/32", "127.0.0.0/8", "loopback"),
            ),
            (
                "169.254.169.254/32",
                forbidden(
                    "169.254.169.254/32",
                    "169.254.0.0/16",
                    "link-local (cloud metadata)",
                ),
            ),
            (
                "172.31.0.0/16",
                forbidden("172.31.0.0/16", "172.16.0.0/12", "private"),
            ),
            (
                "192.0.0.8/32",
                forbidden("192.0.0.8/32", "192.0.0.0/24", "IETF protocol assignments"),
            ),
            (
                "192.0.2.1",
                forbidden("192.0.2.1", "192.0.2.0/24", "documentation"),
            ),
            (
                "192.88.99.1",
                forbidden("192.88.99.1", "192.88.99.0/24", "6to4 relay anycast"),
            ),
            (
                "192.168.1.0/24",
                forbidden("192.168.1.0/24", "192.168.0.0/16", "private"),
            ),
            (
                "198.19.0.0/16",
                forbidden("198.19.0.0/16", "198.18.0.0/15", "benchmarking"),
            ),
            (
                "198.51.100.7",
                forbidden("198.51.100.7", "198.51.100.0/24", "documentation"),
            ),
            (
                "203.0.113.0/25",
                forbidden("203.0.113.0/25", "203.0.113.0/24", "documentation"),
            ),
            (
                "239.1.1.1",
                forbidden("239.1.1.1", "224.0.0.0/4", "multicast"),
            ),
            (
                "255.255.255.255/32",
                forbidden("255.255.255.255/32", "240.0.0.0/4", "reserved"),
            ),
            // Overlap, not containment: broad CIDRs that contain a forbidden range.
            (
                "0.0.0.0/0",
                forbidden("0.0.0.0/0", "0.0.0.0/8", "\"this network\""),
            ),
            ("8.0.0.0/6", forbidden("8.0.0.0/6", "10.0.0.0/8", "private")),
            (
                "168.0.0.0/6",
                forbidden(
                    "168.0.0.0/6",
                    "169.254.0.0/16",
                    "link-local (cloud metadata)",
                ),
            ),
            // IPv6
            ("::/128", forbidden("::/128", "::/128", "unspecified")),
            ("::1", forbidden("::1", "::1/128", "loopback")),
            (
                "::ffff:10.0.0.1/128",
                forbidden("::ffff:10.0.0.1/128", "::ffff:0:0/96", "IPv4-mapped"),
            ),
            (
                "::10.0.0.1/128",
                forbidden("::10.0.0.1/128", "::/96", "IPv4-compatible"),
            ),
            (
                "::ffff:0:a00:1/128",
                forbidden(
                    "::ffff:0:a00:1/128",
                    "::ffff:0:0:0/96",
                    "IPv4-translated (SIIT)",
                ),
            ),
            (
                "64:ff9b::a00:1/128",
                forbidden("64:ff9b::a00:1/128", "64:ff9b::/96", "NAT64"),
            ),
            (
                "64:ff9b:1::/64",
                forbidden("64:ff9b:1::/64", "64:ff9b:1::/48", "local-use NAT64"),
            ),
            ("100::1", forbidden("100::1", "100::/64", "discard-only")),
            (
                "2001::/32",
                forbidden("2001::/32", "2001::/23", "IETF protocol assignments"),
            ),
            (
                "2001:db8::1",
                forbidden("2001:db8::1", "2001:db8::/32", "documentation"),
            ),
            (
                "2002:a00:1::/48",
                forbidden("2002:a00:1::/48", "2002::/16", "6to4"),
            ),
            (
                "3fff:1::/32",
                forbidden("3fff:1::/32", "3fff::/20", "documentation"),
            ),
            (
                "fd00::/8",
                forbidden("fd00::/8", "fc00::/7", "unique local"),
            ),
            ("fe80::1", forbidden("fe80::1", "fe80::/10", "link-local")),
            (
                "fec0::/16",
                forbidden("fec0::/16", "fec0::/10", "site-local"),
            ),
            ("ff02::1", forbidden("ff02::1", "ff00::/8", "multicast")),
            ("::/0", forbidden("::/0", "::/128", "unspecified")),
            (
                "2000::/3",
                forbidden("2000::/3", "2001::/23", "IETF protocol assignments"),
            ),
            // Malformed and host bits.
            (
                "1.2.3.4/24",
                BindingError::HostBits {
                    cidr: "1.2.3.4/24".into(),
                    network: net("1.2.3.0/24"),
                },
            ),
            (
                "2606:4700::1/32",
                BindingError::HostBits {
                    cidr: "2606:4700::1/32".into(),
                    network: net("2606:4700::/32"),
                },
            ),
            (
                "1.2.3.0/33",
                BindingError::MalformedCidr("1.2.3.0/33".into()),
            ),
            ("1.2.3/24", BindingError::MalformedCidr("1.2.3/24".into())),
            (
                "api.github.com",
                BindingError::MalformedCidr("api.github.com".into()),
            ),
            (" 1.2.3.4", BindingError::MalformedCidr(" 1.2.3.4".into())),
            ("", BindingError::MalformedCidr("".into())),
        ];
        for (cidr, want) in cases {
            assert_eq!(check_cidr(cidr).as_ref(), Err(want), "{cidr}");
        }
        // Every range of the table is hit by at least one case above.
        for r in FORBIDDEN_RANGES {
            assert!(
                cases.iter().any(|(_, e)| matches!(e, BindingError::ForbiddenCidr { range, .. } if *range == r.net)),
                "no case for {}",
                r.net
            );
        }
    }

    #[test]
    fn public_cidrs_are_accepted() {
        for (cidr, want) in [
            ("140.82.112.3/32", "140.82.112.3/32"),
            ("140.82.112.3", "140.82.112.3/32"),
            ("140.82.112.0/20", "140.82.112.0/20"),
            ("8.8.8.8/32", "8.8.8.8/32"),
            // Just outside 10/8 and 172.16/12 on either side.
            ("11.0.0.0/8", "11.0.0.0/8"),
            ("172.32.0.0/11", "172.32.0.0/11"),
            ("2606:4700::/32", "2606:4700::/32"),
            ("2a00:1450:4001::1", "2a00:1450:4001::1/128"),
        ] {
            assert_eq!(check_cidr(cidr), Ok(net(want)), "{cidr}");
        }
    }

    #[test]
    fn every_forbidden_host_class_is_rejected() {
        let invalid = |host: &str, reason| BindingError::InvalidHost {
            host: host.into(),
            reason,
        };
        let pattern = |host: &str, pattern| BindingError::ForbiddenHost {
            host: host.into(),
            pattern,
        };
        let long = format!("{}.com", vec!["a".repeat(63); 4].join("."));
        for (host, want) in [
            ("localhost", pattern("localhost", "localhost")),
            ("LocalHost.", pattern("LocalHost.", "localhost")),
            ("api.localhost", pattern("api.localhost", "*.localhost")),
            (
                "metadata.google.internal",
                pattern("metadata.google.internal", "*.internal"),
            ),
            (
                "db.corp.internal.",
                pattern("db.corp.internal.", "*.internal"),
            ),
            (
                "kubernetes.default.svc",
                pattern("kubernetes.default.svc", "*.svc"),
            ),
            (
                "kubernetes.default.svc.cluster.local",
                pattern("kubernetes.default.svc.cluster.local", "*.cluster.local"),
            ),
            ("printer.local", pattern("printer.local", "*.local")),
            ("github", BindingError::SingleLabelHost("github".into())),
            ("github.", BindingError::SingleLabelHost("github.".into())),
            ("10.0.0.1", BindingError::IpLiteralHost("10.0.0.1".into())),
            (
                "140.82.112.3",
                BindingError::IpLiteralHost("140.82.112.3".into()),
            ),
            ("::1", BindingError::IpLiteralHost("::1".into())),
            (
                "2606:4700::1111",
                BindingError::IpLiteralHost("2606:4700::1111".into()),
            ),
            ("127.1", BindingError::IpLiteralHost("127.1".into())),
            ("0x7f.1", BindingError::IpLiteralHost("0x7f.1".into())),
            (&long, invalid(&long, "it is longer than 253 characters")),
            ("", invalid("", "it is empty")),
            (".", invalid(".", "it is empty")),
            ("a..com", invalid("a..com", "it has an empty label")),
            (
                ".example.com",
                invalid(".example.com", "it has an empty label"),
            ),
            (
                "example.com..",
                invalid("example.com..", "it has an empty label"),
            ),
            (
                &format!("{}.com", "a".repeat(64)),
                invalid(
                    &format!("{}.com", "a".repeat(64)),
                    "a label is longer than 63 characters",
                ),
            ),
            (
                "api_1.example.com",
                invalid(
                    "api_1.example.com",
                    "only letters, digits, '-' and '.' are allowed",
                ),
            ),
            (
                "*.example.com",
                invalid(
                    "*.example.com",
                    "only letters, digits, '-' and '.' are allowed",
                ),
            ),
            (
                "api.example.com:443",
                invalid(
                    "api.example.com:443",
                    "only letters, digits, '-' and '.' are allowed",
                ),
            ),
            (
                "[::1]",
                invalid("[::1]", "only letters, digits, '-' and '.' are allowed"),
            ),
            (
                "exa mple.com",
                invalid(
                    "exa mple.com",
                    "only letters, digits, '-' and '.' are allowed",
                ),
            ),
            (
                "bücher.de",
                invalid("bücher.de", "only letters, digits, '-' and '.' are allowed"),
            ),
            (
                "-api.example.com",
                invalid("-api.example.com", "a label starts or ends with '-'"),
            ),
            (
                "api-.example.com",
                invalid("api-.example.com", "a label starts or ends with '-'"),
            ),
        ] {
            assert_eq!(check_host(host), Err(want), "{host}");
        }
    }

    #[test]
    fn public_hosts_are_accepted_and_normalized() {
        let max = format!(
            "{}.{}.com",
            vec!["a".repeat(63); 3].join("."),
            "a".repeat(57)
        );
        assert_eq!(max.len(), MAX_HOST);
        for (host, want) in [
            ("api.github.com", "api.github.com"),
            ("API.GitHub.com.", "api.github.com"),
            ("xn--bcher-kva.de", "xn--bcher-kva.de"),
            ("1password.com", "1password.com"),
            ("s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com"),
            // Only the exact suffixes are refused.
            ("localhost.example.com", "localhost.example.com"),
            ("foo.mylocalhost", "foo.mylocalhost"),
            ("my-internal.com", "my-internal.com"),
            ("internal.example.com", "internal.example.com"),
            ("svc.example.com", "svc.example.com"),
            (max.as_str(), max.as_str()),
        ] {
            assert_eq!(check_host(host).as_deref(), Ok(want), "{host}");
        }
    }

    #[test]
    fn public_web_carves_out_every_forbidden_range() {
        let allow = public_web_allow("web");
        assert_eq!(allow.binding, "web");
        assert_eq!(
            allow.ports,
            vec![
                PortRef {
                    port: 80,
                    protocol: NetworkProtocol::Tcp
                },
                PortRef {
                    port: 443,
                    protocol: NetworkProtocol::Tcp
                },
            ]
        );
        let [v4, v6] = allow.blocks.as_slice() else {
            panic!("two blocks expected: {:?}", allow.blocks);
        };
        assert_eq!(v4.cidr, net("0.0.0.0/0"));
        assert_eq!(v6.cidr, net("::/0"));
        let want_v4: Vec<IpNet> = FORBIDDEN_RANGES
            .iter()
            .map(|r| r.net)
            .filter(|n| matches!(n, IpNet::V4(_)))
            .collect();
        let want_v6: Vec<IpNet> = FORBIDDEN_RANGES
            .iter()
            .map(|r| r.net)
            .filter(|n| matches!(n, IpNet::V6(_)))
            .collect();
        assert_eq!(v4.except, want_v4);
        assert_eq!(v6.except, want_v6);
        assert_eq!(v4.except.len(), 15);
        assert_eq!(v6.except.len(), 16);
        for e in v4.except.iter().chain(&v6.except) {
            assert!(
                e.prefix_len() > 0,
                "NetworkPolicy needs except strictly inside cidr: {e}"
            );
        }
        for b in [v4, v6] {
            for e in &b.except {
                assert!(b.cidr.contains(e), "{e} not inside {}", b.cidr);
            }
        }
        let carved = |addr: &str| {
            let addr = ip(addr);
            allow
                .blocks
                .iter()
                .any(|b| b.cidr.contains(&addr) && b.except.iter().any(|e| e.contains(&addr)))
        };
        for inside in [
            "169.254.169.254",
            "10.1.2.3",
            "192.168.0.1",
            "127.0.0.1",
            "100.100.100.200",
            "::1",
            "::ffff:10.0.0.1",
            "fd00:ec2::254",
            "fe80::1",
        ] {
            assert!(carved(inside), "{inside} should be carved out");
        }
        for outside in ["8.8.8.8", "140.82.112.3", "1.1.1.1", "2606:4700:4700::1111"] {
            assert!(!carved(outside), "{outside} should be allowed");
        }
    }

    #[test]
    fn binding_shapes_are_checked() {
        let web_with = |f: fn(&mut EgressBinding)| {
            let mut b = mk_web("w");
            f(&mut b);
            check_binding(&b).err()
        };
        assert_eq!(
            web_with(|b| b.cidr = Some("1.1.1.1/32".into())),
            Some(BindingError::PublicWebField("cidr"))
        );
        assert_eq!(
            web_with(|b| b.host = Some("a.example.com".into())),
            Some(BindingError::PublicWebField("host"))
        );
        assert_eq!(
            web_with(|b| b.port = Some(443)),
            Some(BindingError::PublicWebField("port"))
        );
        assert_eq!(
            web_with(|b| b.protocol = Some(NetworkProtocol::Tcp)),
            Some(BindingError::PublicWebField("protocol"))
        );

        let both = EgressBinding {
            cidr: Some("1.1.1.1/32".into()),
            ..mk_host("b", "one.one.one.one", 443)
        };
        assert_eq!(
            check_binding(&both).err(),
            Some(BindingError::BothCidrAndHost)
        );
        let neither = EgressBinding {
            host: None,
            ..mk_host("b", "x", 443)
        };
        assert_eq!(check_binding(&neither).err(), Some(BindingError::NoTarget));
        let no_port = EgressBinding {
            port: None,
            ..mk_cidr("b", "1.1.1.1/32", 1)
        };
        assert_eq!(check_binding(&no_port).err(), Some(BindingError::NoPort));
        for p in [0, -1, 65536] {
            assert_eq!(
                check_binding(&mk_cidr("b", "1.1.1.1/32", p)).err(),
                Some(BindingError::PortOutOfRange(p))
            );
        }
    }

    #[tokio::test]
    async fn prove_allows_cidrs_hosts_and_public_web_and_fails_the_rest_alone() {
        let resolver = StaticResolver::default()
            .with(
                "api.github.com",
                &[
                    ip("140.82.112.6"),
                    ip("2606:50c0:8000::64"),
                    ip("140.82.112.5"),
                    ip("140.82.112.6"),
                ],
            )
            .with("mixed.example.com", &[ip("93.184.215.14"), ip("10.0.0.5")])
            .with("mapped.example.com", &[ip("::ffff:169.254.169.254")])
            .with("empty.example.com", &[])
            .failing("slow.example.com", ResolveFailure::Timeout(DEADLINE));
        let bindings = vec![
            mk_host("github", "API.GitHub.com.", 443),
            mk_host("mixed", "mixed.example.com", 443),
            mk_host("mapped", "mapped.example.com", 443),
            mk_host("empty", "empty.example.com", 443),
            mk_host("slow", "slow.example.com", 443),
            mk_host("gone", "nx.example.com", 443),
            EgressBinding {
                protocol: Some(NetworkProtocol::Udp),
                ..mk_cidr("ntp", "162.159.200.1/32", 123)
            },
            mk_cidr("private", "10.0.0.0/8", 443),
            mk_web("web"),
        ];
        let proof = prove(&bindings, &resolver, DEADLINE, now()).await;

        let allowed: Vec<&str> = proof.allows.iter().map(|a| a.binding.as_str()).collect();
        assert_eq!(allowed, ["github", "ntp", "web"]);
        let github = &proof.allows[0];
        assert_eq!(
            github.blocks,
            [
                "140.82.112.5/32",
                "140.82.112.6/32",
                "2606:50c0:8000::64/128"
            ]
            .iter()
            .map(|c| IpBlock {
                cidr: net(c),
                except: vec![]
            })
            .collect::<Vec<_>>()
        );
        assert_eq!(
            github.ports,
            vec![PortRef {
                port: 443,
                protocol: NetworkProtocol::Tcp
            }]
        );
        assert_eq!(
            proof.allows[1].ports,
            vec![PortRef {
                port: 123,
                protocol: NetworkProtocol::Udp
            }]
        );
        assert_eq!(proof.allows[2], public_web_allow("web"));
        assert_eq!(
            proof.resolved,
            vec![ResolvedEgress {
                binding: "github".into(),
                host: "api.github.com".into(),
                ips: vec![
                    "140.82.112.5".into(),
                    "140.82.112.6".into(),
                    "2606:50c0:8000::64".into()
                ],
                resolved_at: Some("2026-12-01T12:00:00Z".into()),
            }]
        );

        let failures: BTreeMap<&str, &BindingError> = proof
            .failures
            .iter()
            .map(|f| (f.binding.as_str(), &f.error))
            .collect();
        assert_eq!(failures.len(), 6, "{failures:?}");
        assert_eq!(
            failures["mixed"],
            &BindingError::ForbiddenAddress {
                host: "mixed.example.com".into(),
                addr: ip("10.0.0.5"),
                range: net("10.0.0.0/8"),
                what: "private",
            }
        );
        assert_eq!(
            failures["mixed"].to_string(),
            "host \"mixed.example.com\" resolved to 10.0.0.5, in the private range 10.0.0.0/8"
        );
        assert!(matches!(
            failures["mapped"],
            BindingError::ForbiddenAddress {
                what: "IPv4-mapped",
                ..
            }
        ));
        assert_eq!(
            failures["empty"],
            &BindingError::Resolution {
                host: "empty.example.com".into(),
                cause: ResolveFailure::NoAddresses
            }
        );
        assert_eq!(
            failures["slow"],
            &BindingError::Resolution {
                host: "slow.example.com".into(),
                cause: ResolveFailure::Timeout(DEADLINE)
            }
        );
        assert_eq!(
            failures["gone"],
            &BindingError::Resolution {
                host: "nx.example.com".into(),
                cause: ResolveFailure::NxDomain
            }
        );
        assert_eq!(
            failures["private"],
            &forbidden("10.0.0.0/8", "10.0.0.0/8", "private")
        );
        assert_eq!(
            failures["private"].to_string(),
            "cidr \"10.0.0.0/8\" overlaps the private range 10.0.0.0/8"
        );
    }

    #[tokio::test]
    async fn duplicate_names_open_nothing() {
        let bindings = vec![
            mk_cidr("api", "140.82.112.3/32", 443),
            mk_cidr("api", "140.82.112.4/32", 443),
            mk_cidr("other", "140.82.112.5/32", 443),
        ];
        let proof = prove(&bindings, &StaticResolver::default(), DEADLINE, now()).await;
        assert_eq!(proof.allows.len(), 1);
        assert_eq!(proof.allows[0].binding, "other");
        assert_eq!(
            proof.failures,
            vec![BindingFailure {
                binding: "api".into(),
                error: BindingError::DuplicateName("api".into())
            }]
        );
    }

    /// A resolver that never answers: `prove` cuts it at the deadline by itself.
    struct Hang;

    impl Resolve for Hang {
        fn resolve<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveFailure>> {
            Box::pin(futures::future::pending())
        }
    }

    #[tokio::test]
    async fn a_hanging_resolver_is_cut_at_the_deadline() {
        let start = std::time::Instant::now();
        let proof = prove(
            &[
                mk_host("a", "a.example.com", 443),
                mk_host("b", "b.example.com", 443),
                mk_web("web"),
            ],
            &Hang,
            Duration::from_millis(500),
            now(),
        )
        .await;
        // Concurrent: two hanging lookups cost one deadline, not two.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(900),
            "{elapsed:?}"
        );
        assert_eq!(proof.allows, vec![public_web_allow("web")]);
        assert!(proof.resolved.is_empty());
        assert_eq!(proof.failures.len(), 2);
        for f in &proof.failures {
            assert!(
                matches!(&f.error, BindingError::Resolution { cause: ResolveFailure::Timeout(d), .. } if *d == Duration::from_millis(500)),
                "{f:?}"
            );
        }
    }

    #[test]
    fn settings_fail_closed() {
        let args = |server: Option<&str>, timeout: &str, interval: &str| EgressArgs {
            egress_dns_server: server.map(Into::into),
            egress_dns_timeout: timeout.parse().expect("test duration"),
            egress_refresh_interval: interval.parse().expect("test duration"),
        };
        assert_eq!(
            args(None, "2s", "5m").settings(),
            Ok(EgressSettings {
                dns_server: None,
                dns_timeout: Duration::from_secs(2),
                refresh_interval: Duration::from_secs(300)
            })
        );
        assert_eq!(
            args(Some("10.96.0.10"), "500ms", "1m")
                .settings()
                .map(|s| s.dns_server),
            Ok(Some("10.96.0.10:53".parse().expect("addr")))
        );
        assert_eq!(
            args(Some("[fd00::a]:5353"), "2s", "5m")
                .settings()
                .map(|s| s.dns_server),
            Ok(Some("[fd00::a]:5353".parse().expect("addr")))
        );
        assert_eq!(
            args(Some("kube-dns"), "2s", "5m").settings(),
            Err(EgressSettingsError::DnsServer("kube-dns".into()))
        );
        assert_eq!(
            args(Some("1.1.1.1:0"), "2s", "5m").settings(),
            Err(EgressSettingsError::UnusableDnsServer("1.1.1.1:0".into()))
        );
        assert_eq!(
            args(Some("0.0.0.0:53"), "2s", "5m").settings(),
            Err(EgressSettingsError::UnusableDnsServer("0.0.0.0:53".into()))
        );
        assert_eq!(
            args(None, "0", "5m").settings(),
            Err(EgressSettingsError::Zero("--egress-dns-timeout"))
        );
        assert_eq!(
            EgressSettingsError::Zero("--egress-dns-timeout").to_string(),
            "--egress-dns-timeout is 0s: it must be positive"
        );
        assert_eq!(
            args(None, "2s", "0s").settings(),
            Err(EgressSettingsError::Zero("--egress-refresh-interval"))
        );
        assert!(matches!(
            args(None, "5m", "5m").settings(),
            Err(EgressSettingsError::TimeoutOverInterval { .. })
        ));
        assert!(args(Some("nope"), "2s", "5m").resolver().is_err());
    }

    #[test]
    fn flags_parse_from_the_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            egress: EgressArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--egress-dns-server=127.0.0.1:5353",
            "--egress-dns-timeout=1500ms",
            "--egress-refresh-interval=1m30s",
        ])
        .expect("flags parse");
        assert_eq!(
            cli.egress.settings(),
            Ok(EgressSettings {
                dns_server: Some("127.0.0.1:5353".parse().expect("addr")),
                dns_timeout: Duration::from_millis(1500),
                refresh_interval: Duration::from_secs(90),
            })
        );
        assert!(Cli::try_parse_from(["x", "--egress-dns-timeout=-1s"]).is_err());
    }
}
