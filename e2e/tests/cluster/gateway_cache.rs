//! The gateway session cache end to end: the real `mcp-access-authz` sidecar (the library
//! inside it) on the sync listener, with a Pod-bound token of a live MCPServer chain, while
//! sessions change through kube-apiserver. What a proxy sees: 200, or 401 with the reason.
//!
//! What is under test here is the cache (cold, warm, stale, revocation, scope), so the sidecar
//! runs with `--trust-session-header` and checks name the session in `X-MCP-Session`; the
//! session-token check is proven by `gateway/tests/authz.rs` and `nginx_proxy.rs`.
//!
//! Needs `MCP_ACCESS_AUTHZ_BIN` (set by `hack/test.sh`).

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use e2e::gateway::GatewayChain;
use e2e::LocalCluster;
use serde_json::Value;

use super::{create_namespace, ok, session_yaml};

/// A running sidecar with its own token file; killed on drop.
pub(crate) struct Authz {
    child: Child,
    /// The check listener.
    base: String,
    /// The admin listener (`/readyz`, `/metrics`, the long-poll).
    admin: String,
    token_file: PathBuf,
    log: PathBuf,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Drop for Authz {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Authz {
    /// Starts `mcp-access-authz` against the cluster's sync listener with `token`.
    pub(crate) fn start(
        c: &LocalCluster,
        name: &str,
        token: &str,
        extra: &[&str],
    ) -> Result<Self, String> {
        let mut flags = vec!["--trust-session-header"];
        flags.extend_from_slice(extra);
        let e2e::gateway::SpawnedAuthz {
            child,
            port,
            admin_port,
            token_file,
            log,
        } = e2e::gateway::spawn_authz(c, name, token, &flags).map_err(|e| format!("{e:#}"))?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            token_file,
            log,
            rt,
            http,
        })
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The check for `ns/name`: (status, deny reason from the body, from the header).
    fn check(&self, ns: &str, name: &str) -> Result<(u16, String, String), String> {
        let request = self
            .http
            .post(format!("{}/mcp", self.base))
            .header("X-MCP-Session", format!("{ns}/{name}"));
        self.rt.block_on(async {
            let resp = request.send().await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let header = resp
                .headers()
                .get("x-mcp-deny-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            Ok((
                status,
                body["reason"].as_str().unwrap_or_default().to_string(),
                header,
            ))
        })
    }

    /// The deny reason for `ns/name`, or "allow"; the header must say what the body says.
    pub(crate) fn decision(&self, ns: &str, name: &str) -> Result<String, String> {
        let (status, body, header) = self.check(ns, name)?;
        match status {
            200 => Ok("allow".into()),
            401 if body == header && !body.is_empty() => Ok(body),
            _ => Err(format!(
                "unexpected check answer {status} {body:?} {header:?}"
            )),
        }
    }

    fn ready(&self) -> Result<bool, String> {
        let request = self.http.get(format!("{}/readyz", self.admin));
        // The request's timer needs the runtime: send inside it.
        Ok(self
            .rt
            .block_on(async { request.send().await })
            .map(|r| r.status() == 200)
            .unwrap_or(false))
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while !self.ready()? {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "mcp-access-authz exited ({status}): {}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("not ready within {limit:?}: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Polls the check until it answers `want`.
    fn wait_decision(
        &self,
        ns: &str,
        name: &str,
        want: &str,
        limit: Duration,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let got = self.decision(ns, name)?;
            if got == want {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "{ns}/{name}: {got}, not {want} within {limit:?}: {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Opens the long-poll for `ns/name`; the handle yields (status, reason).
    fn long_poll(
        &self,
        ns: &str,
        name: &str,
    ) -> std::thread::JoinHandle<Result<(u16, String), String>> {
        let url = format!("{}/v1/sessions/{ns}/{name}/revoked", self.admin);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let resp = reqwest::Client::new()
                    .get(url)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.map_err(|e| e.to_string())?;
                Ok((
                    status,
                    body["reason"].as_str().unwrap_or_default().to_string(),
                ))
            })
        })
    }

    fn metric(&self, name: &str) -> Result<f64, String> {
        let request = self.http.get(format!("{}/metrics", self.admin));
        let text = self
            .rt
            .block_on(async { request.send().await?.text().await })
            .map_err(|e| e.to_string())?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no {name} in /metrics"))
    }
}

fn chain(c: &LocalCluster, ns: &str, server: &str) -> Result<(GatewayChain, String), String> {
    let chain = c
        .create_gateway_chain(ns, server)
        .map_err(|e| format!("{e:#}"))?;
    let token = c.gateway_token(&chain).map_err(|e| format!("{e:#}"))?;
    Ok((chain, token))
}

fn create_session(c: &LocalCluster, ns: &str, name: &str, server_uid: &str) -> Result<(), String> {
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["create", "-n", ns, "-f", "-"],
            Some(&session_yaml(name, server_uid)),
        ),
        "create session",
    )
    .map(|_| ())
}

/// `kubectl create` of a Revocation of one session, through kube-apiserver.
fn revoke(c: &LocalCluster, ns: &str, session: &str) -> Result<(), String> {
    let manifest = format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: rvk-{session}\nspec:\n  target: {{session: {session}}}\n  cause: compromised\n"
    );
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["create", "-n", ns, "-f", "-"],
            Some(&manifest),
        ),
        "create revocation",
    )
    .map(|_| ())
}

/// The DELIVERED and DELIVERED-IN cells `kubectl get revocation` prints, once delivery is
/// no longer pending (or as they are after `within`).
fn delivered_row(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    within: Duration,
) -> Result<(String, String), String> {
    let deadline = Instant::now() + within;
    loop {
        let out = ok(
            &c.kubectl(&["get", "revocation", name, "-n", ns]),
            "get revocation",
        )?;
        let mut lines = out.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let row: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let cell = |column: &str| {
            header
                .iter()
                .position(|h| *h == column)
                .and_then(|i| row.get(i))
                .map(|c| c.to_string())
                .ok_or_else(|| format!("no {column} column in:\n{out}"))
        };
        let cells = (cell("DELIVERED")?, cell("DELIVERED-IN")?);
        if cells.1 != "<pending>" && cells.1 != "<none>" || Instant::now() > deadline {
            return Ok(cells);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn join_poll(
    poll: std::thread::JoinHandle<Result<(u16, String), String>>,
    limit: Duration,
) -> Result<(u16, String), String> {
    let deadline = Instant::now() + limit;
    while !poll.is_finished() {
        if Instant::now() > deadline {
            return Err(format!("the long-poll did not complete within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    poll.join()
        .map_err(|_| "the long-poll thread panicked".to_string())?
}

/// Revocation through kube-apiserver → the sidecar answers 401 `session_revoked` and the
/// long-poll completes; another server's session is not found; unknown names are not found.
pub fn revoke_to_deny_through_kube_apiserver(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gw-revoke";
    create_namespace(c, ns)?;
    let (alpha, token) = chain(c, ns, "alpha")?;
    let (beta, _) = chain(c, ns, "beta")?;
    create_session(c, ns, "alice", &alpha.server_uid)?;
    create_session(c, ns, "bob", &beta.server_uid)?;
    let mut authz = Authz::start(c, "revoke", &token, &[])?;
    authz.wait_ready(Duration::from_secs(30))?;
    let got = authz.decision(ns, "alice")?;
    ensure!(got == "allow", "alice before the revocation: {got}");
    let got = authz.decision(ns, "bob")?;
    ensure!(
        got == "session_not_found",
        "another server's session: {got}"
    );

    let poll = authz.long_poll(ns, "alice");
    std::thread::sleep(Duration::from_millis(300));
    ensure!(
        !poll.is_finished(),
        "the long-poll must wait while alice is usable"
    );
    revoke(c, ns, "alice")?;
    let took = authz.wait_decision(ns, "alice", "session_revoked", Duration::from_secs(5))?;
    let (status, reason) = join_poll(poll, Duration::from_secs(5))?;
    ensure!(
        status == 200 && reason == "session_revoked",
        "long-poll answered {status} {reason}"
    );
    eprintln!(
        "    revoke-to-deny observed {:.1} ms after kubectl returned",
        took.as_secs_f64() * 1e3
    );
    // The receipts: the one gateway watch of alpha (this sidecar's) has it; beta's sessions
    // were untouched, so beta is not among the servers.
    let row = delivered_row(c, ns, "rvk-alice", Duration::from_secs(10))?;
    ensure!(
        row.0 == "1/1" && row.1.ends_with('s'),
        "kubectl get revocation: DELIVERED {} DELIVERED-IN {}",
        row.0,
        row.1
    );
    let servers = ok(
        &c.kubectl(&[
            "get",
            "revocation",
            "rvk-alice",
            "-n",
            ns,
            "-o",
            "jsonpath={.status.delivery.servers[*].uid}",
        ]),
        "get revocation",
    )?;
    ensure!(
        servers.trim() == alpha.server_uid,
        "receipts for servers {servers:?}, want only alpha's {}",
        alpha.server_uid
    );
    eprintln!("    receipts: DELIVERED {} in {}", row.0, row.1);

    // A session issued now is allowed at once (the watch or get-on-miss), scoped all the same.
    create_session(c, ns, "carol", &alpha.server_uid)?;
    authz.wait_decision(ns, "carol", "allow", Duration::from_secs(5))?;
    create_session(c, ns, "dave", &beta.server_uid)?;
    let got = authz.decision(ns, "dave")?;
    ensure!(
        got == "session_not_found",
        "another server's new session: {got}"
    );
    Ok(())
}

/// Cold (deny before the first sync), warm (served across an outage), stale (denied after
/// the shortened window), then back in sync when the apiserver returns.
pub fn cold_warm_stale(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gw-stale";
    create_namespace(c, ns)?;
    let (alpha, token) = chain(c, ns, "alpha")?;
    create_session(c, ns, "alice", &alpha.server_uid)?;

    // Cold: a sidecar with a token file the kubelet has not written yet.
    // The window must exceed the listener's bookmark interval (5 s), or a healthy but quiet
    // feed would go stale between bookmarks; and by enough that the last bookmark's age at the
    // stop plus the stop itself never use it up (the "stale too early" check below).
    let mut authz = Authz::start(c, "stale", "placeholder", &["--stale-window", "12s"])?;
    std::thread::sleep(Duration::from_secs(1));
    ensure!(!authz.ready()?, "ready without a sync");
    let got = authz.decision(ns, "alice")?;
    ensure!(got == "sync_not_ready", "cold: {got}");
    ensure!(
        authz.metric("mcp_gateway_session_sync_age_seconds")? == -1.0,
        "sync age before the first sync"
    );
    std::fs::write(&authz.token_file, &token).map_err(|e| e.to_string())?;
    authz.wait_ready(Duration::from_secs(15))?;
    authz.wait_decision(ns, "alice", "allow", Duration::from_secs(5))?;

    // Warm: MCP Access stops; last-known-good is served within the window, then sync_stale.
    c.stop_apiserver();
    let stopped = Instant::now();
    let got = authz.decision(ns, "alice")?;
    let result = (|| {
        ensure!(got == "allow", "warm, right after the outage began: {got}");
        authz.wait_decision(ns, "alice", "sync_stale", Duration::from_secs(20))?;
        ensure!(
            stopped.elapsed() >= Duration::from_secs(2),
            "stale too early: {:?}",
            stopped.elapsed()
        );
        ensure!(!authz.ready()?, "ready while stale");
        Ok(())
    })();
    // Whatever happened, the next scenarios need MCP Access back.
    c.start_apiserver().map_err(|e| e.to_string())?;
    c.wait_available(Duration::from_secs(90))
        .map_err(|e| e.to_string())?;
    result?;
    authz.wait_ready(Duration::from_secs(30))?;
    authz.wait_decision(ns, "alice", "allow", Duration::from_secs(5))?;
    Ok(())
}

/// An apiserver restart with `--rotate-epoch`: the sidecar's watch resumes with an old
/// resourceVersion, gets 410, drops its snapshot and relists; sessions revoked and issued
/// around the restart converge, and the revoked one is never allowed after the relist.
pub fn apiserver_restart_relists_and_converges(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gw-restart";
    create_namespace(c, ns)?;
    let (alpha, token) = chain(c, ns, "alpha")?;
    create_session(c, ns, "alice", &alpha.server_uid)?;
    create_session(c, ns, "erin", &alpha.server_uid)?;
    let mut authz = Authz::start(c, "restart", &token, &[])?;
    authz.wait_ready(Duration::from_secs(30))?;
    let relists_before = authz.metric("mcp_gateway_session_relists_total")?;

    // An ordinary restart keeps the epoch (docs/storage.md); an operator's rotation is what
    // makes every watch relist.
    c.start_apiserver_with(&["--rotate-epoch"])
        .map_err(|e| e.to_string())?;
    c.wait_available(Duration::from_secs(90))
        .map_err(|e| e.to_string())?;
    revoke(c, ns, "alice")?;
    create_session(c, ns, "frank", &alpha.server_uid)?;
    authz.wait_decision(ns, "alice", "session_revoked", Duration::from_secs(15))?;
    authz.wait_decision(ns, "frank", "allow", Duration::from_secs(5))?;
    let got = authz.decision(ns, "erin")?;
    ensure!(got == "allow", "untouched session after the restart: {got}");
    // Never allowed again once denied.
    for _ in 0..20 {
        let got = authz.decision(ns, "alice")?;
        ensure!(got == "session_revoked", "alice after convergence: {got}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let relists = authz.metric("mcp_gateway_session_relists_total")?;
    let invalidations = authz.metric("mcp_gateway_session_invalidations_total")?;
    ensure!(
        relists > relists_before && invalidations >= 1.0,
        "the restart must force a relist after dropping the old snapshot: relists {relists_before} -> {relists}, invalidations {invalidations}"
    );
    Ok(())
}

/// The MCPServer is deleted and re-created under the same name (a new UID): the old
/// gateway's authority ends, and a gateway of the new generation never allows the old session.
pub fn retire_and_republish(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-gw-republish";
    create_namespace(c, ns)?;
    let (old, old_token) = chain(c, ns, "gamma")?;
    create_session(c, ns, "old-session", &old.server_uid)?;
    let mut authz = Authz::start(c, "republish", &old_token, &[])?;
    authz.wait_ready(Duration::from_secs(30))?;
    authz.wait_decision(ns, "old-session", "allow", Duration::from_secs(5))?;

    ok(
        &c.kubectl(&["delete", "mcpserver", "gamma", "-n", ns, "--wait=true"]),
        "delete the MCPServer",
    )?;
    // The old chain is broken: the sidecar's watch is ended within the re-verification
    // period, its next request is 401, and it stops allowing anything.
    let took = authz.wait_decision(ns, "old-session", "sync_not_ready", Duration::from_secs(20))?;
    eprintln!(
        "    old generation denied {:.1}s after the MCPServer was deleted",
        took.as_secs_f64()
    );

    // The old gateway Deployment goes with its owner (garbage collection) before the new one
    // of the same name is created.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = c.kubectl(&["get", "deployment", "gamma", "-n", ns]);
        if !out.success && out.stderr.contains("NotFound") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the old gateway Deployment was not collected: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Re-created under the same name: a new UID and a new gateway chain. The sidecar's token
    // file is rotated to the new Pod's token, as the kubelet of the new Pod would mount it.
    let (new, new_token) = chain(c, ns, "gamma")?;
    ensure!(
        new.server_uid != old.server_uid,
        "the re-created MCPServer has a new UID"
    );
    create_session(c, ns, "new-session", &new.server_uid)?;
    std::fs::write(&authz.token_file, &new_token).map_err(|e| e.to_string())?;
    authz.wait_decision(ns, "new-session", "allow", Duration::from_secs(20))?;
    for _ in 0..10 {
        let got = authz.decision(ns, "old-session")?;
        ensure!(
            got == "session_not_found" || got == "session_revoked",
            "the old generation's session under the new MCPServer: {got}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
