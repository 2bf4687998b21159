//! Session expiry and session Events end to end, through kube-apiserver: a session with a
//! 3-second TTL turns `Expired` within a second of its `expiresAt` as `kubectl get -w` sees
//! it, and the real `mcp-access-authz` answers `session_expired`; `kubectl events --for
//! accesssession/NAME` shows `TTLClamped`, `Revoked` (with its cause) and `Expired`.
//!
//! Needs `MCP_ACCESS_AUTHZ_BIN` (set by `hack/test.sh`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::LocalCluster;
use serde_json::Value;

use super::gateway_cache::Authz;
use super::{create_namespace, ok};

/// RFC 3339 (UTC, whole seconds) of `secs` since the Unix epoch.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn session_manifest(name: &str, server_uid: &str, expires_at: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\nspec:\n  server: {{name: alpha, uid: {server_uid}}}\n  teams: [payments]\n  expiresAt: \"{expires_at}\"\n"
    )
}

fn kubectl_create(c: &LocalCluster, ns: &str, manifest: &str) -> Result<String, String> {
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["create", "-n", ns, "-f", "-"],
            Some(manifest),
        ),
        "kubectl create",
    )
}

/// `kubectl get acs -n NS -w --output-watch-events`, line by line; killed on drop.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Watch {
    fn start(c: &LocalCluster, ns: &str) -> Result<Self, String> {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .args(["get", "acs", "-n", ns, "-w", "--output-watch-events"])
            .env("KUBECACHEDIR", c.dir.join("kube-cache"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "kubectl get -w printed nothing".to_string())?;
        if !first.contains("EVENT") {
            return Err(format!("watch header expected, got {first}"));
        }
        Ok(Self { child, lines })
    }

    /// Waits for a line with every one of `words`; returns when it arrived (Unix time).
    fn wait_for(&self, words: &[&str], limit: Duration) -> Result<Duration, String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                let at = unix_now();
                if words.iter().all(|w| line.contains(w)) {
                    return Ok(at);
                }
                seen.push(line);
            }
        }
        Err(format!(
            "no watch line with {words:?} within {limit:?}: {seen:?}"
        ))
    }
}

/// Waits until `mcp-access-authz` decides `want` ("allow" or a deny reason) for `ns/name`; a
/// sidecar not answering yet counts as not yet.
fn wait_decision(
    authz: &Authz,
    ns: &str,
    name: &str,
    want: &str,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let got = authz.decision(ns, name).unwrap_or_else(|e| e);
        if got == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{ns}/{name}: {got}, not {want} within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn phase(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    ok(
        &c.kubectl(&[
            "get",
            "acs",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.phase}",
        ]),
        "get phase",
    )
}

/// A 3-second session turns `Expired` within a second of `expiresAt`: `kubectl get -w`
/// through kube-apiserver shows the MODIFIED event, and the sidecar answers `session_expired`.
pub fn session_expires_within_a_second(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-expiry";
    create_namespace(c, ns)?;
    let chain = c
        .create_gateway_chain(ns, "alpha")
        .map_err(|e| format!("{e:#}"))?;
    let token = c.gateway_token(&chain).map_err(|e| format!("{e:#}"))?;
    let authz = Authz::start(c, "expiry", &token, &[])?;
    // `kubectl get -w` prints its header with the first object: one that outlives the test.
    kubectl_create(
        c,
        ns,
        &session_manifest("anchor", &chain.server_uid, "2099-01-01T00:00:00Z"),
    )?;
    let watch = Watch::start(c, ns)?;

    // Room for the create, its watch event and an allow on a loaded machine before it lapses.
    let expires_at = unix_now().as_secs() + 6;
    kubectl_create(
        c,
        ns,
        &session_manifest("brief", &chain.server_uid, &rfc3339(expires_at)),
    )?;
    watch.wait_for(&["ADDED", "brief", "Active"], Duration::from_secs(5))?;
    wait_decision(&authz, ns, "brief", "allow", Duration::from_secs(30))?;

    let seen = watch.wait_for(&["MODIFIED", "brief", "Expired"], Duration::from_secs(10))?;
    let late = seen.saturating_sub(Duration::from_secs(expires_at));
    eprintln!(
        "    kubectl get -w showed Expired {:.0} ms after expiresAt",
        late.as_secs_f64() * 1e3
    );
    // Expected ~50-100 ms past expiresAt (the timer fires at the instant; then the change log,
    // kube-apiserver's proxy and kubectl): the product's 1 s is over 5x.
    ensure!(
        seen >= Duration::from_secs(expires_at) && late < Duration::from_secs(1),
        "Expired seen {late:?} after expiresAt"
    );
    ensure!(
        phase(c, ns, "brief")? == "Expired",
        "stored phase is not Expired"
    );
    wait_decision(
        &authz,
        ns,
        "brief",
        "session_expired",
        Duration::from_secs(5),
    )?;
    Ok(())
}

/// The events of `accesssession/NAME`, as `kubectl events --for` prints them.
fn events_for(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    ok(
        &c.kubectl(&[
            "events",
            "--for",
            &format!("accesssession/{name}"),
            "-n",
            ns,
        ]),
        "kubectl events",
    )
}

fn wait_events(c: &LocalCluster, ns: &str, name: &str, words: &[&str]) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = events_for(c, ns, name)?;
        if words.iter().all(|w| text.contains(w)) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            return Err(format!("kubectl events for {name} lack {words:?}:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An over-long TTL (clamped), a revocation, an expiry: `kubectl events --for` shows
/// `TTLClamped`, `Revoked` with the cause, and `Expired`, reported by the apiserver.
pub fn session_events_through_kubectl_events(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-session-events";
    create_namespace(c, ns)?;
    // Far beyond the server's maximum session lifetime.
    let created = kubectl_create(
        c,
        ns,
        &session_manifest("long", "srv-ev", "2099-01-01T00:00:00Z"),
    )?;
    ensure!(created.contains("long"), "{created}");
    let revocation = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: rvk-long\nspec:\n  target: {session: long}\n  cause: compromised\n";
    kubectl_create(c, ns, revocation)?;
    // A whole second at least between the read of the clock and the server's check.
    let expires_at = unix_now().as_secs() + 4;
    kubectl_create(
        c,
        ns,
        &session_manifest("brief", "srv-ev", &rfc3339(expires_at)),
    )?;

    let long = wait_events(c, ns, "long", &["TTLClamped", "Revoked", "compromised"])?;
    ensure!(
        long.contains("rvk-long") && !long.contains("Expired"),
        "{long}"
    );
    let brief = wait_events(c, ns, "brief", &["Expired"])?;
    ensure!(
        !brief.contains("TTLClamped") && !brief.contains("Revoked"),
        "{brief}"
    );
    // The Events are the apiserver's, regarding the session (uid included).
    let listed: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]),
        "get events",
    )?)
    .map_err(|e| e.to_string())?;
    let uid = ok(
        &c.kubectl(&[
            "get",
            "acs",
            "long",
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ]),
        "get uid",
    )?;
    let revoked = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["reason"] == "Revoked")
        .ok_or_else(|| format!("no Revoked event: {listed}"))?;
    ensure!(
        revoked["reportingController"] == "mcp-access-apiserver"
            && revoked["regarding"]["kind"] == "AccessSession"
            && revoked["regarding"]["apiVersion"] == "access.mcp-runtime.dev/v1alpha1"
            && revoked["regarding"]["uid"] == uid.as_str()
            && revoked["type"] == "Warning",
        "{revoked}"
    );
    let described = ok(
        &c.kubectl(&["describe", "acs", "long", "-n", ns]),
        "kubectl describe",
    )?;
    ensure!(
        described.contains("TTLClamped") && described.contains("Revoked"),
        "kubectl describe shows no events:\n{described}"
    );
    Ok(())
}
