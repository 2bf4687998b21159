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
/// multicast and reserved space, and the IPv6 prefixes that embed IPv4 addresses (mapped,
/// NAT64, 6to4) and could otherwise smuggle a private IPv4 destination. Sources: the IANA
/// IPv4 and IPv6 special-purpose address registries (RFC 6890 and its updates).
pub const FORBIDDEN_RANGES: &[ForbiddenRange] = &[
    // IPv4
    v4(0, 0, 0, 0, 8, "\"this network\""),   // RFC 791
    v4(10, 0, 0, 0, 8, "private"),           // RFC 1918
    v4(100, 64, 0, 0, 10, "shared (CGNAT)"), // RFC 6598
    v4(127, 0, 0, 0, 8, "loopback"),         // RFC 1122
    v4(169, 254, 0, 0, 16, "link-local (cloud metadata)"), // RFC 3927; 169.254.169.254
    v4(172, 16, 0, 0, 12, "private"),        // RFC 1918
    v4(192, 0, 0, 0, 24, "IETF protocol assignments"), // RFC 6890
    v4(192, 0, 2, 0, 24, "documentation"),   // RFC 5737 TEST-NET-1
    v4(192, 88, 99, 0, 24, "6to4 relay anycast"), // RFC 7526 (deprecated)
    v4(192, 168, 0, 0, 16, "private"),       // RFC 1918
    v4(198, 18, 0, 0, 15, "benchmarking"),   // RFC 2544
    v4(198, 51, 100, 0, 24, "documentation"), // RFC 5737 TEST-NET-2
    v4(203, 0, 113, 0, 24, "documentation"), // RFC 5737 TEST-NET-3
    v4(224, 0, 0, 0, 4, "multicast"),        // RFC 5771
    v4(240, 0, 0, 0, 4, "reserved"),         // RFC 1112; includes 255.255.255.255
    // IPv6
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"), // RFC 4291
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),    // RFC 4291
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped"), // RFC 4291
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "NAT64"), // RFC 6052
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64"), // RFC 8215
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"), // RFC 6666
    v6(
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "IETF protocol assignments",
    ), // RFC 2928
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"), // RFC 3849
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4"),    // RFC 3056
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"), // RFC 9637
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local"), // RFC 4193
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"), // RFC 4291
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"), // RFC 3879 (deprecated)
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"), // RFC 4291
];

/// Domains that never name a public destination: (the pattern as errors show it, the suffix).
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
    pub binding: String,
    pub error: BindingError,
}

/// The outcome of [`prove`]: each binding is either allowed or failed, never both. Every list
/// is sorted by binding name, so the policies built from it compare byte for byte.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressProof {
    pub allows: Vec<EgressAllow>,
    /// The addresses of the DNS-named bindings that were allowed (`status.resolvedEgressIPs`).
    pub resolved: Vec<ResolvedEgress>,
    pub failures: Vec<BindingFailure>,
}

/// Resolves a DNS name (already checked by [`check_host`]) to its A and AAAA addresses.
pub trait Resolve: Send + Sync {
    /// Every address of `host`; an empty answer may be returned as `Ok(vec![])`.
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
    let net = match value.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match value.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => return Err(BindingError::MalformedCidr(value.into())),
        },
    };
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
        if host == pattern || host.ends_with(suffix) {
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
    pub dns_server: Option<SocketAddr>,
    pub dns_timeout: Duration,
    pub refresh_interval: Duration,
}

/// An L3 setting that cannot be used: startup stops with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressSettingsError {
    #[error("--egress-dns-server {0:?} is not an `ip:port` or an IP address")]
    DnsServer(String),
    #[error("--egress-dns-server {0:?} is not a usable nameserver address")]
    UnusableDnsServer(String),
    #[error("{0} must be positive")]
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
