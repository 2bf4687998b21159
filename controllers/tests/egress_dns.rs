//! The real hickory-backed resolver of layer L3 against a fake upstream on loopback: a tiny
//! UDP DNS responder written here (answers A/AAAA from a map, NXDOMAIN otherwise), or one that
//! never answers.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use apis::runtime::{EgressBinding, EgressBindingType, NetworkProtocol, PortRef, ResolvedEgress};
use controllers::netpol::desired::IpBlock;
use controllers::netpol::egress::{
    prove, BindingError, DnsResolver, EgressArgs, EgressProof, ResolveFailure,
};
use k8s_openapi::jiff::Timestamp;
use tokio::net::UdpSocket;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const RCODE_NXDOMAIN: u16 = 3;

/// Starts the fake upstream; `None` never answers.
async fn upstream(answers: Option<BTreeMap<&'static str, Vec<IpAddr>>>) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = socket.local_addr().expect("local addr");
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let Some(answers) = &answers else {
                continue;
            };
            if let Some(reply) = respond(&buf[..n], answers) {
                let _ = socket.send_to(&reply, peer).await;
            }
        }
    });
    addr
}

/// A response to one query (header and a single question), or `None` for garbage.
fn respond(query: &[u8], answers: &BTreeMap<&'static str, Vec<IpAddr>>) -> Option<Vec<u8>> {
    let qdcount = u16::from_be_bytes([*query.get(4)?, *query.get(5)?]);
    if query.len() < 12 || qdcount != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut i = 12;
    loop {
        let len = usize::from(*query.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question = query.get(12..i + 4)?;
    let name = labels.join(".");

    let (rcode, addrs): (u16, Vec<IpAddr>) = match answers.get(name.as_str()) {
        None => (RCODE_NXDOMAIN, vec![]),
        Some(addrs) => (
            0,
            addrs
                .iter()
                .copied()
                .filter(|a| match qtype {
                    TYPE_A => a.is_ipv4(),
                    TYPE_AAAA => a.is_ipv6(),
                    _ => false,
                })
                .collect(),
        ),
    };
    let rd = u16::from_be_bytes([query[2], query[3]]) & 0x0100;
    let flags: u16 = 0x8000 | rd | 0x0080 | rcode;
    let mut out = Vec::new();
    out.extend_from_slice(&query[..2]);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(addrs.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    for addr in addrs {
        out.extend_from_slice(&[0xc0, 0x0c]); // the name: a pointer to the question's
        let (rtype, rdata) = match addr {
            IpAddr::V4(a) => (TYPE_A, a.octets().to_vec()),
            IpAddr::V6(a) => (TYPE_AAAA, a.octets().to_vec()),
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes()); // IN
        out.extend_from_slice(&60u32.to_be_bytes());
        out.extend_from_slice(&u16::try_from(rdata.len()).ok()?.to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    Some(out)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn mk_host(name: &str, host: &str) -> EgressBinding {
    EgressBinding {
        name: name.into(),
        kind: EgressBindingType::ExactHost,
        cidr: None,
        host: Some(host.into()),
        port: Some(443),
        protocol: None,
    }
}

fn now() -> Timestamp {
    "2026-12-01T12:00:00Z".parse().expect("test timestamp")
}

fn answers() -> BTreeMap<&'static str, Vec<IpAddr>> {
    BTreeMap::from([
        (
            "api.example.com",
            vec![
                ip("140.82.112.4"),
                ip("2606:50c0:8000::64"),
                ip("140.82.112.3"),
            ],
        ),
        ("v4only.example.com", vec![ip("140.82.113.3")]),
        ("private.example.com", vec![ip("10.0.0.5")]),
        (
            "mixed.example.com",
            vec![ip("140.82.112.3"), ip("169.254.169.254")],
        ),
        ("nodata.example.com", vec![]),
    ])
}

async fn prove_with(server: SocketAddr, bindings: &[EgressBinding]) -> EgressProof {
    let args = EgressArgs {
        egress_dns_server: Some(server.to_string()),
        egress_dns_timeout: Duration::from_secs(2).into(),
        egress_refresh_interval: Duration::from_secs(300).into(),
    };
    let resolver = args.resolver().expect("resolver");
    prove(bindings, &resolver, Duration::from_secs(5), now()).await
}

#[tokio::test]
async fn a_public_answer_is_proven_with_sorted_addresses() {
    let server = upstream(Some(answers())).await;
    let proof = prove_with(
        server,
        &[
            mk_host("api", "API.example.com."),
            mk_host("v4only", "v4only.example.com"),
        ],
    )
    .await;
    assert_eq!(proof.failures, vec![]);
    assert_eq!(proof.allows.len(), 2);
    // No AAAA records (NODATA) is not a failure when A records exist.
    assert_eq!(
        proof.allows[1].blocks,
        vec![IpBlock {
            cidr: "140.82.113.3/32".parse().expect("cidr"),
            except: vec![]
        }]
    );
    assert_eq!(
        proof.allows[0].blocks,
        [
            "140.82.112.3/32",
            "140.82.112.4/32",
            "2606:50c0:8000::64/128"
        ]
        .iter()
        .map(|c| IpBlock {
            cidr: c.parse().expect("cidr"),
            except: vec![]
        })
        .collect::<Vec<_>>()
    );
    assert_eq!(
        proof.allows[0].ports,
        vec![PortRef {
            port: 443,
            protocol: NetworkProtocol::Tcp
        }]
    );
    assert_eq!(proof.resolved.len(), 2);
    assert_eq!(
        proof.resolved[..1],
        [ResolvedEgress {
            binding: "api".into(),
            host: "api.example.com".into(),
            ips: vec![
                "140.82.112.3".into(),
                "140.82.112.4".into(),
                "2606:50c0:8000::64".into()
            ],
            resolved_at: Some("2026-12-01T12:00:00Z".into()),
        }]
    );
}

#[tokio::test]
async fn private_mixed_nxdomain_and_empty_answers_fail_closed() {
    let server = upstream(Some(answers())).await;
    let proof = prove_with(
        server,
        &[
            mk_host("api", "api.example.com"),
            mk_host("private", "private.example.com"),
            mk_host("mixed", "mixed.example.com"),
            mk_host("gone", "gone.example.com"),
            mk_host("nodata", "nodata.example.com"),
        ],
    )
    .await;
    // The failures do not touch the good binding.
    assert_eq!(proof.allows.len(), 1);
    assert_eq!(proof.allows[0].binding, "api");
    assert_eq!(proof.resolved.len(), 1);
    let failures: BTreeMap<&str, &BindingError> = proof
        .failures
        .iter()
        .map(|f| (f.binding.as_str(), &f.error))
        .collect();
    assert_eq!(failures.len(), 4, "{failures:?}");
    assert_eq!(
        failures["private"],
        &BindingError::ForbiddenAddress {
            host: "private.example.com".into(),
            addr: ip("10.0.0.5"),
            range: "10.0.0.0/8".parse().expect("cidr"),
            what: "private",
        }
    );
    assert!(
        matches!(failures["mixed"], BindingError::ForbiddenAddress { addr, .. } if *addr == ip("169.254.169.254")),
        "{:?}",
        failures["mixed"]
    );
    assert_eq!(
        failures["gone"],
        &BindingError::Resolution {
            host: "gone.example.com".into(),
            cause: ResolveFailure::NxDomain
        }
    );
    assert_eq!(
        failures["nodata"],
        &BindingError::Resolution {
            host: "nodata.example.com".into(),
            cause: ResolveFailure::NoAddresses
        }
    );
}

fn assert_timed_out(proof: &EgressProof, elapsed: Duration, want: Duration) {
    // Expected `want` (500 ms); the upper bound is 5x that.
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < want * 5,
        "{elapsed:?}"
    );
    assert!(proof.allows.is_empty(), "{:?}", proof.allows);
    assert!(proof.resolved.is_empty());
    assert_eq!(
        proof.failures.iter().map(|f| &f.error).collect::<Vec<_>>(),
        vec![&BindingError::Resolution {
            host: "api.example.com".into(),
            cause: ResolveFailure::Timeout(want)
        }]
    );
}

#[tokio::test]
async fn a_hanging_upstream_is_cut_by_the_resolver_timeout() {
    let server = upstream(None).await;
    let timeout = Duration::from_millis(500);
    let resolver = DnsResolver::new(Some(server), timeout).expect("resolver");
    let start = Instant::now();
    let proof = prove(
        &[mk_host("api", "api.example.com")],
        &resolver,
        Duration::from_secs(10),
        now(),
    )
    .await;
    assert_timed_out(&proof, start.elapsed(), timeout);
}

#[tokio::test]
async fn a_hanging_upstream_is_cut_by_the_proof_deadline() {
    let server = upstream(None).await;
    let resolver = DnsResolver::new(Some(server), Duration::from_secs(10)).expect("resolver");
    let deadline = Duration::from_millis(500);
    let start = Instant::now();
    let proof = prove(
        &[mk_host("api", "api.example.com")],
        &resolver,
        deadline,
        now(),
    )
    .await;
    assert_timed_out(&proof, start.elapsed(), deadline);
}
