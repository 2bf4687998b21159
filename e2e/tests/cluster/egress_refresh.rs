//! A DNS-derived egress allow when its name stops resolving, against the local cluster:
//! docs/controllers.md ("External egress (L3)") promises that a host binding is resolved
//! again every `--egress-refresh-interval` within `--egress-dns-timeout`, that a timeout,
//! NXDOMAIN or any failed answer fails the binding, and that "a failure on refresh withdraws
//! that binding's allow at once". So the L3 policy stops allowing the addresses proven before
//! (fail closed: a name that no longer resolves may now point anywhere), the condition says
//! why, and the allow comes back when the name resolves again. Each failure mode — SERVFAIL,
//! NXDOMAIN, no answer at all — is tried in turn on one MCPServer.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::LocalCluster;
use serde_json::{json, Value};

use super::controllers::{apply, get_json, in_ns, start, until, wait_condition};
use super::{create_namespace, ok};

const NS: &str = "egr-a";
const SERVER: &str = "fetcher";
const HOST: &str = "api.example.com";
const ADDRESS: [u8; 4] = [140, 82, 112, 3];
const CIDR: &str = "140.82.112.3/32";
const POLICY: &str = "mcp-l3-egress.fetcher";
const MANAGED: &str = "mcp-runtime.dev/managed-by=mcp-access-controllers";
/// The controllers' flags of this scenario.
const REFRESH: Duration = Duration::from_secs(3);
const DNS_TIMEOUT: Duration = Duration::from_secs(1);
/// A pass, the write and kubectl's read on a loaded machine.
const SLACK: Duration = Duration::from_secs(10);

/// What the DNS server does with a query for [`HOST`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// A: [`ADDRESS`] with a TTL of one second (so no resolver cache outlives a refresh);
    /// AAAA: an empty NOERROR answer.
    Answer = 0,
    ServFail = 1,
    NxDomain = 2,
    /// Never answers (an upstream that hangs).
    Silent = 3,
}

/// A DNS server on 127.0.0.1 (UDP) whose behaviour the scenario switches. Stops when dropped.
struct SwitchableDns {
    addr: std::net::SocketAddr,
    mode: Arc<AtomicU8>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl SwitchableDns {
    fn start() -> Result<Self, String> {
        let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let addr = socket.local_addr().map_err(|e| e.to_string())?;
        let mode = Arc::new(AtomicU8::new(Mode::Answer as u8));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, stopped) = (mode.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(reply) = reply(&buf[..n], m.load(Ordering::Relaxed)) {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        });
        Ok(Self { addr, mode, stop })
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

impl Drop for SwitchableDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The answer to one query in `mode`, or `None` to stay silent.
fn reply(query: &[u8], mode: u8) -> Option<Vec<u8>> {
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    let known = labels.join(".") == HOST;
    let (rcode, answers): (u8, u16) = match mode {
        m if m == Mode::Silent as u8 => return None,
        m if m == Mode::ServFail as u8 => (2, 0),
        m if m == Mode::NxDomain as u8 || !known => (3, 0),
        _ => (0, u16::from(qtype == 1)),
    };
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(query.get(0..2)?);
    // QR, RD, RA and the response code.
    reply.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1]);
    reply.extend_from_slice(&answers.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if answers == 1 {
        // The question's name by pointer, type A, class IN, TTL 1, four bytes.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
        reply.extend_from_slice(&ADDRESS);
    }
    Some(reply)
}

/// Whether the server's L3 policy allows [`CIDR`] now (`None`: no L3 policy at all).
fn allowed(c: &LocalCluster) -> Result<bool, String> {
    let Some(policy) = get_json(c, &["get", "networkpolicy", POLICY, "-n", NS])? else {
        return Ok(false);
    };
    Ok(policy["spec"]["egress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["to"].as_array().cloned().unwrap_or_default())
        .any(|peer| peer["ipBlock"]["cidr"] == CIDR))
}

fn server() -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": SERVER, "namespace": NS},
        "spec": {"image": "ghcr.io/acme/mcp:1", "port": 8080, "egressBindings": [
            {"name": "api", "type": "ExactHost", "host": HOST, "port": 443},
        ]},
    })
}

/// The allow is withdrawn within a refresh (plus the lookup's own timeout) of each failure
/// mode, `ExternalEgressReady` turns False naming the binding, and both come back when the
/// name resolves again.
pub fn a_failed_refresh_withdraws_the_allow_until_the_name_resolves(
    c: &mut LocalCluster,
) -> Result<(), String> {
    create_namespace(c, NS)?;
    let dns_server = SwitchableDns::start()?;
    let dns = format!("--egress-dns-server={}", dns_server.addr);
    let refresh = format!("--egress-refresh-interval={}s", REFRESH.as_secs());
    let timeout = format!("--egress-dns-timeout={}s", DNS_TIMEOUT.as_secs());
    let runtime = format!("--runtime-namespace={NS}");
    let mut controllers = start(
        c,
        "egress-refresh",
        "egress-refresh",
        &[
            &runtime,
            "--kube-api-cidr=10.96.0.1/32",
            &dns,
            &timeout,
            &refresh,
        ],
    )?;
    let result = (|| {
        apply(c, &in_ns(server(), NS))?;
        wait_condition(c, NS, SERVER, "ExternalEgressReady", "True")?;
        until(Duration::from_secs(30), "the first L3 allow", || {
            Ok(allowed(c)?.then_some(()))
        })?;

        let bound = REFRESH + DNS_TIMEOUT + SLACK;
        for mode in [Mode::ServFail, Mode::NxDomain, Mode::Silent] {
            dns_server.set(mode);
            let failed = Instant::now();
            until(
                bound,
                &format!("{mode:?}: the allow of {CIDR} withdrawn"),
                || Ok((!allowed(c)?).then_some(())),
            )?;
            let withdrawn = failed.elapsed();
            let condition = wait_condition(c, NS, SERVER, "ExternalEgressReady", "False")?;
            ensure!(
                condition["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("api"),
                "{mode:?}: the condition does not name the binding: {condition}"
            );
            // It stays withdrawn while the name does not resolve: no refresh brings it back.
            std::thread::sleep(REFRESH);
            ensure!(
                !allowed(c)?,
                "{mode:?}: the allow came back while the name fails"
            );

            dns_server.set(Mode::Answer);
            let recovered = Instant::now();
            until(
                bound,
                &format!("after {mode:?}: the allow of {CIDR} restored"),
                || Ok(allowed(c)?.then_some(())),
            )?;
            let restored = recovered.elapsed();
            wait_condition(c, NS, SERVER, "ExternalEgressReady", "True")?;
            eprintln!(
                "egress refresh, {mode:?}: withdrawn after {withdrawn:?}, restored {restored:?} after the name resolved again (refresh {REFRESH:?})"
            );
        }
        Ok(())
    })();
    let result = result.map_err(|e| {
        let text = std::fs::read_to_string(&controllers.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n    ");
        format!("{e}\n    --- {} ---\n    {tail}", controllers.log.display())
    });
    let _ = c.kubectl(&["delete", "mcpserver", SERVER, "-n", NS, "--timeout=60s"]);
    controllers.stop();
    let _ = ok(
        &c.kubectl(&["delete", "networkpolicy", "-n", NS, "-l", MANAGED]),
        "delete the managed policies",
    );
    drop(dns_server);
    result
}
