//! The `mcp-access-authz` binary end to end over HTTP, against the real apiserver binary and
//! session tokens minted by its `token` subresource: on the check listener every path and
//! method is the check (`/readyz` included), the bearer token and every deny reason with its
//! challenge, the identity of an allow, the opt-in trusted-header mode, and on the admin
//! listener `/readyz`, `/metrics`, the RFC 9728 document and the revocation long-poll; startup
//! refusals.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const SERVER_UID: &str = "0b6f8c1e-2222-4a2b-9c3d-000000000002";
const HOUR: Duration = Duration::from_secs(3600);
/// The resource URI of the sessions' server (`github` in `team-a`): the apiserver's default
/// token audience.
const PUBLIC_URL: &str = "http://github.team-a.svc:8086";
const METADATA: &str = "http://github.team-a.svc:8086/.well-known/oauth-protected-resource";

/// A running sidecar; killed on drop.
struct Sidecar {
    child: Child,
    /// The check listener.
    base: String,
    /// The admin listener.
    admin: String,
    dir: std::path::PathBuf,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn authz_command(args: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-access-authz"));
    cmd.args(args)
        .env_remove("SESSION_SYNC_STALE_WINDOW")
        .env_remove("GATEWAY_SYNC_URL")
        .env_remove("GATEWAY_SYNC_CA")
        .env_remove("GATEWAY_TOKEN_FILE")
        .env_remove("MCP_ACCESS_AUTHZ_PUBLIC_URL")
        .env_remove("MCP_ACCESS_AUTHZ_TRUST_SESSION_HEADER")
        .env_remove("MCP_ACCESS_AUTHZ_SESSION_HEADER")
        .env("RUST_LOG", "info");
    cmd
}

/// An apiserver that mints session tokens.
async fn apiserver(launch: bool) -> Apiserver {
    let dir = scratch_dir();
    let flags = session_token_flags(&dir);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut server = Apiserver::prepare(&flags).await;
    if launch {
        server.launch().await;
    }
    server
}

impl Sidecar {
    /// Token mode for [`PUBLIC_URL`].
    fn start(server: &Apiserver) -> Self {
        Self::start_with(server, &["--public-url", PUBLIC_URL])
    }

    fn start_with(server: &Apiserver, extra: &[&str]) -> Self {
        let dir = scratch_dir();
        std::fs::write(dir.join("token"), GATEWAY_TOKEN).unwrap();
        let mut args: Vec<String> = vec![
            "--sync-url".into(),
            server.url.clone(),
            "--ca-file".into(),
            server.ca_file.display().to_string(),
            "--token-file".into(),
            dir.join("token").display().to_string(),
            // Port 0: the process says which ports it bound.
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = std::fs::File::create(dir.join("authz.log")).unwrap();
        let mut child = authz_command(&args)
            .stdout(log.try_clone().unwrap())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start mcp-access-authz");
        let stderr = child.stderr.take().expect("stderr is piped");
        let addrs = e2e::listening::follow("mcp-access-authz", stderr, log)
            .addrs(&["check", "admin"], e2e::listening::LISTEN_TIMEOUT)
            .unwrap_or_else(|e| {
                let text = std::fs::read_to_string(dir.join("authz.log")).unwrap_or_default();
                panic!("{e}\n{text}")
            });
        Self {
            child,
            base: format!("http://{}", addrs[0]),
            admin: format!("http://{}", addrs[1]),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("authz.log")).unwrap_or_default()
    }

    async fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while reqwest::get(format!("{}/readyz", self.admin))
            .await
            .is_err()
            || reqwest::get(format!("{}/", self.base)).await.is_err()
        {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("mcp-access-authz exited ({status}): {}", self.log());
            }
            assert!(Instant::now() < deadline, "not listening: {}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_ready(&mut self) {
        self.wait_listening().await;
        let admin = self.admin.clone();
        eventually(Duration::from_secs(10), "/readyz is 200", || {
            let admin = admin.clone();
            async move {
                reqwest::get(format!("{admin}/readyz"))
                    .await
                    .map(|r| r.status() == 200)
                    .unwrap_or(false)
            }
        })
        .await;
    }
}

/// One check's answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The reason of the JSON body and of the header, when they agree (else the test fails).
    reason: Option<String>,
    challenge: Option<String>,
    headers: reqwest::header::HeaderMap,
}

async fn ask(req: reqwest::RequestBuilder) -> Answer {
    let resp = req.send().await.expect("the sidecar answers");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let (header, challenge) = (text("x-mcp-deny-reason"), text("www-authenticate"));
    let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    let reason = body["reason"].as_str().map(str::to_string);
    assert_eq!(reason, header, "the body and the header give one reason");
    Answer {
        status,
        reason,
        challenge,
        headers,
    }
}

/// A check with `bearer` (if any) in `Authorization`.
async fn check(base: &str, method: reqwest::Method, path: &str, bearer: Option<&str>) -> Answer {
    let mut req = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(token) = bearer {
        req = req.bearer_auth(token);
    }
    ask(req).await
}

/// Asserts a 401 for `reason` with the challenge the contract gives it.
fn assert_denied(a: &Answer, reason: &str, what: &str) {
    assert_eq!(
        (a.status, a.reason.as_deref()),
        (401, Some(reason)),
        "{what}"
    );
    let want = if reason == "token_missing" {
        format!("Bearer resource_metadata=\"{METADATA}\"")
    } else {
        format!(
            "Bearer resource_metadata=\"{METADATA}\", error=\"invalid_token\", error_description=\"{reason}\""
        )
    };
    assert_eq!(a.challenge.as_deref(), Some(want.as_str()), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_takes_the_session_token_on_any_path() {
    let server = apiserver(true).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "bob", SERVER_UID, HOUR)
        .await;
    let alice = server.mint_token("team-a", "alice").await;
    let bob = server.mint_token("team-a", "bob").await;
    server.revoke("team-a", "bob").await;
    let mut sidecar = Sidecar::start(&server);
    sidecar.wait_ready().await;
    let base = sidecar.base.clone();
    use reqwest::Method;

    // Envoy forwards the original path and method; nginx and Traefik call a fixed one. The
    // sidecar's own paths are checks here too: a path-forwarding proxy asking for /readyz or
    // /metrics gets a check, never a 200 of an endpoint.
    for (method, path) in [
        (Method::GET, "/"),
        (Method::GET, "/check"),
        (Method::POST, "/mcp"),
        (Method::DELETE, "/some/deep/path?x=1"),
        (Method::GET, "/readyz"),
        (Method::GET, "/metrics"),
        (Method::GET, "/v1/sessions/team-a/alice/revoked"),
    ] {
        let what = format!("{method} {path}");
        let a = check(&base, method.clone(), path, Some(&alice)).await;
        assert_eq!((a.status, a.reason.as_deref()), (200, None), "{what}");
        assert_eq!(a.headers["x-mcp-access-session"], "team-a/alice", "{what}");
        assert!(
            a.headers
                .get("x-mcp-access-session-uid")
                .is_some_and(|v| !v.is_empty()),
            "{what}"
        );
        let a = check(&base, method.clone(), path, Some(&bob)).await;
        assert_denied(&a, "session_revoked", &what);
        let a = check(&base, method.clone(), path, None).await;
        assert_denied(&a, "token_missing", &what);
    }

    // A name is not a credential: the old header alone is token_missing, and next to
    // another session's token it changes nothing.
    let named = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("X-MCP-Session", "team-a/alice");
    assert_denied(&ask(named).await, "token_missing", "X-MCP-Session only");
    let named = reqwest::Client::new()
        .get(format!("{base}/"))
        .bearer_auth(&bob)
        .header("X-MCP-Session", "team-a/alice");
    assert_denied(
        &ask(named).await,
        "session_revoked",
        "bob's token naming alice",
    );

    // token_invalid: garbage, another scheme, two headers, a token in the query, a token for
    // another resource.
    assert_denied(
        &check(&base, Method::GET, "/", Some("not-a-jwt")).await,
        "token_invalid",
        "garbage",
    );
    let basic = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("Authorization", format!("Basic {alice}"));
    assert_denied(&ask(basic).await, "token_invalid", "another scheme");
    let two = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("Authorization", format!("Bearer {alice}"))
        .header("Authorization", format!("Bearer {alice}"));
    assert_denied(
        &ask(two).await,
        "token_invalid",
        "two Authorization headers",
    );
    assert_denied(
        &check(&base, Method::GET, &format!("/?access_token={alice}"), None).await,
        "token_invalid",
        "a token in the query",
    );
    let (status, body) = server
        .request_token(
            "team-a",
            "alice",
            json!({"audiences": ["http://other.team-a.svc:8086"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let elsewhere = body["status"]["token"].as_str().unwrap().to_string();
    assert_denied(
        &check(&base, Method::GET, "/", Some(&elsewhere)).await,
        "token_invalid",
        "a token for another resource",
    );

    // session_not_found: the session is deleted after its token was minted.
    server
        .create_session("team-a", "carol", SERVER_UID, HOUR)
        .await;
    let carol = server.mint_token("team-a", "carol").await;
    server.delete_session("team-a", "carol").await;
    let base2 = base.clone();
    let carol2 = carol.clone();
    eventually(Duration::from_secs(5), "carol is session_not_found", || {
        let (base, carol) = (base2.clone(), carol2.clone());
        async move {
            check(&base, Method::GET, "/", Some(&carol))
                .await
                .reason
                .as_deref()
                == Some("session_not_found")
        }
    })
    .await;

    // The admin listener: readiness, metrics, the RFC 9728 document; nothing else.
    let admin = &sidecar.admin;
    assert_eq!(
        reqwest::get(format!("{admin}/readyz"))
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = reqwest::get(format!("{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mcp_gateway_session_sync_age_seconds "),
        "{metrics}"
    );
    for result in ["allow", "session_revoked", "token_missing", "token_invalid"] {
        assert!(
            metrics.contains(&format!("mcp_authz_checks_total{{result=\"{result}\"}}")),
            "{result}: {metrics}"
        );
    }
    let doc: serde_json::Value =
        reqwest::get(format!("{admin}/.well-known/oauth-protected-resource"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(doc["resource"], PUBLIC_URL);
    assert_eq!(doc["authorization_servers"], json!([TOKEN_ISSUER]));
    let other = reqwest::Client::new()
        .get(format!("{admin}/check"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "the admin listener answers no check");

    let log = sidecar.log();
    for secret in [
        GATEWAY_TOKEN,
        alice.as_str(),
        bob.as_str(),
        elsewhere.as_str(),
    ] {
        assert!(!log.contains(secret), "a token is never logged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trusted_session_header_only_when_asked_for_and_loudly() {
    let server = apiserver(true).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "bob", SERVER_UID, HOUR)
        .await;
    server.revoke("team-a", "bob").await;
    let mut sidecar = Sidecar::start_with(&server, &["--trust-session-header"]);
    sidecar.wait_ready().await;
    let base = sidecar.base.clone();
    let named = |value: &str| {
        reqwest::Client::new()
            .post(format!("{base}/mcp"))
            .header("X-MCP-Session", value)
    };
    let a = ask(named("team-a/alice")).await;
    assert_eq!((a.status, a.reason), (200, None));
    assert_eq!(a.headers["x-mcp-access-session"], "team-a/alice");
    let a = ask(named("team-a/bob")).await;
    assert_eq!(
        (a.status, a.reason.as_deref(), a.challenge),
        (401, Some("session_revoked"), None)
    );
    let a = ask(named("team-a/nobody")).await;
    assert_eq!(
        (a.status, a.reason.as_deref()),
        (401, Some("session_not_found"))
    );
    let a = check(&base, reqwest::Method::GET, "/", None).await;
    assert_eq!(
        (a.status, a.reason.as_deref()),
        (401, Some("session_missing"))
    );
    for bad in [
        "alice",
        "team-a/",
        "/alice",
        "team-a/alice/x",
        "Team-A/alice",
        "team-a/../x",
    ] {
        let a = ask(named(bad)).await;
        assert_eq!(
            (a.status, a.reason.as_deref()),
            (401, Some("session_malformed")),
            "{bad:?}"
        );
    }
    // Two values could be read differently by the proxy and by us: refused.
    let two = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("X-MCP-Session", "team-a/alice")
        .header("X-MCP-Session", "team-a/bob");
    assert_eq!(ask(two).await.reason.as_deref(), Some("session_malformed"));
    let log = sidecar.log();
    assert!(
        log.contains("WARN") && log.contains("--trust-session-header is on"),
        "the mode is announced as a warning: {log}"
    );

    // Another header name: the default one is no longer read.
    let mut custom = Sidecar::start_with(
        &server,
        &[
            "--trust-session-header",
            "--session-header",
            "X-Session-Ref",
        ],
    );
    custom.wait_ready().await;
    let a = ask(reqwest::Client::new()
        .get(format!("{}/", custom.base))
        .header("X-Session-Ref", "team-a/alice"))
    .await;
    assert_eq!(a.status, 200);
    let a = ask(reqwest::Client::new()
        .get(format!("{}/", custom.base))
        .header("X-MCP-Session", "team-a/alice"))
    .await;
    assert_eq!(a.reason.as_deref(), Some("session_missing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_before_the_first_sync() {
    // The apiserver is not up yet: the sidecar listens but is not ready and denies: it holds
    // neither sessions nor the keys to verify a token.
    let mut server = apiserver(false).await;
    let mut sidecar = Sidecar::start(&server);
    sidecar.wait_listening().await;
    let readyz = reqwest::get(format!("{}/readyz", sidecar.admin))
        .await
        .unwrap();
    assert_eq!(readyz.status(), 503);
    assert_denied(
        &check(&sidecar.base, reqwest::Method::GET, "/", Some("a.b.c")).await,
        "cache_stale",
        "before the first sync",
    );
    let metrics = reqwest::get(format!("{}/metrics", sidecar.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mcp_gateway_session_sync_age_seconds -1"),
        "{metrics}"
    );

    server.launch().await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let alice = server.mint_token("team-a", "alice").await;
    sidecar.wait_ready().await;
    let base = sidecar.base.clone();
    eventually(Duration::from_secs(10), "alice is allowed", || {
        let (base, alice) = (base.clone(), alice.clone());
        async move {
            check(&base, reqwest::Method::GET, "/", Some(&alice))
                .await
                .status
                == 200
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_poll_completes_when_the_session_is_revoked() {
    let server = apiserver(true).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let alice = server.mint_token("team-a", "alice").await;
    let mut sidecar = Sidecar::start(&server);
    sidecar.wait_ready().await;
    let url = format!("{}/v1/sessions/team-a/alice/revoked", sidecar.admin);
    let poll = tokio::spawn(async move {
        let resp = reqwest::get(url).await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<serde_json::Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!poll.is_finished(), "held open while the session is usable");

    server.revoke("team-a", "alice").await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long-poll completes within 5 s of the revocation")
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["reason"], "session_revoked");
    assert_denied(
        &check(&sidecar.base, reqwest::Method::GET, "/", Some(&alice)).await,
        "session_revoked",
        "after the revocation",
    );

    // Already unusable, or malformed: answered at once.
    let resp = reqwest::get(format!(
        "{}/v1/sessions/team-a/nobody/revoked",
        sidecar.admin
    ))
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["reason"],
        "session_not_found"
    );
    let resp = reqwest::get(format!("{}/v1/sessions/Team-A/x/revoked", sidecar.admin))
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

/// The stderr of a start that must be refused; a process still running after 20 s (refusals
/// come before anything is bound, in milliseconds) started, and fails the test instead of
/// hanging it.
fn refused(args: &[String]) -> String {
    let mut child = authz_command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mcp-access-authz");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for mcp-access-authz") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("started with {args:?}: still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "started with {args:?}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_security_settings_stop_startup() {
    let server = Apiserver::prepare(&[]).await;
    let dir = scratch_dir();
    std::fs::write(dir.join("token"), GATEWAY_TOKEN).unwrap();
    let args = |url: &str, ca: &Path, token: &Path| -> Vec<String> {
        vec![
            "--sync-url".into(),
            url.into(),
            "--ca-file".into(),
            ca.display().to_string(),
            "--token-file".into(),
            token.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--public-url".into(),
            PUBLIC_URL.into(),
        ]
    };
    let token = dir.join("token");
    let err = refused(&args(
        &format!("http://127.0.0.1:{}", server.port),
        &server.ca_file,
        &token,
    ));
    assert!(err.contains("must use https"), "{err}");
    let err = refused(&args(&server.url, &dir.join("nope.crt"), &token));
    assert!(err.contains("cannot read the CA file"), "{err}");
    let err = refused(&args(&server.url, &server.ca_file, &dir.join("nope")));
    assert!(err.contains("cannot read the token file"), "{err}");
    let mut long = args(&server.url, &server.ca_file, &token);
    long.extend(["--stale-window".into(), "1h".into()]);
    let err = refused(&long);
    assert!(err.contains("may only be shortened"), "{err}");
    let out = authz_command(&args(&server.url, &server.ca_file, &token))
        .env("SESSION_SYNC_STALE_WINDOW", "soon")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a malformed SESSION_SYNC_STALE_WINDOW is refused"
    );

    // How a check names its session: a token for a resource, or (explicitly) a trusted
    // header, never neither, never both; a header name without the mode; one listener for
    // both the check and the admin endpoints; a public URL that cannot be an audience.
    let good = args(&server.url, &server.ca_file, &token);
    let without = |flag: &str| -> Vec<String> {
        let mut out = good.clone();
        let i = out.iter().position(|a| a == flag).unwrap();
        out.drain(i..i + 2);
        out
    };
    let err = refused(&without("--public-url"));
    assert!(err.contains("--public-url"), "{err}");
    let mut both = good.clone();
    both.push("--trust-session-header".into());
    let err = refused(&both);
    assert!(err.contains("cannot be used with"), "{err}");
    let mut header_only = without("--public-url");
    header_only.extend(["--session-header".into(), "X-Session".into()]);
    let mut with_public = good.clone();
    with_public.extend(["--session-header".into(), "X-Session".into()]);
    let err = refused(&with_public);
    assert!(
        err.contains("--session-header is only read with --trust-session-header"),
        "{err}"
    );
    let err = refused(&header_only);
    assert!(err.contains("--public-url"), "{err}");
    // One fixed address for both (two port-0 listeners are two ports, and allowed).
    let mut same = without("--admin-listen");
    let i = same.iter().position(|a| a == "--listen").unwrap() + 1;
    same[i] = "127.0.0.1:18086".into();
    same.extend(["--admin-listen".into(), "127.0.0.1:18086".into()]);
    let err = refused(&same);
    assert!(err.contains("must differ"), "{err}");
    for bad in ["github.team-a.svc:8086", "http://x/?q=1", "ftp://x"] {
        let mut url = without("--public-url");
        url.extend(["--public-url".into(), bad.into()]);
        let err = refused(&url);
        assert!(err.contains("--public-url"), "{bad}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_long_polls_and_exits_cleanly() {
    let server = apiserver(true).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let mut sidecar = Sidecar::start(&server);
    sidecar.wait_ready().await;
    let url = format!("{}/v1/sessions/team-a/alice/revoked", sidecar.admin);
    let client = reqwest::Client::new();
    let poll = tokio::spawn(async move {
        let resp = client.get(url).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<serde_json::Value>().await.unwrap())
    });
    // Time for the long-poll to reach the sidecar, on a loaded machine too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let term = Command::new("kill")
        .args(["-TERM", &sidecar.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long-poll is answered when shutdown starts")
        .unwrap();
    assert_eq!(
        (status, body["reason"].as_str()),
        (503, Some("shutting_down"))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let exit = loop {
        if let Some(status) = sidecar.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 5 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit}: {}", sidecar.log());
}
