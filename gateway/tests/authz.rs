//! The `mcp-access-authz` binary end to end over HTTP, against the real apiserver binary:
//! the check on any path and method, header parsing, the 401 body and header, `/readyz`,
//! `/metrics`, the revocation long-poll, and startup refusals.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const SERVER_UID: &str = "0b6f8c1e-2222-4a2b-9c3d-000000000002";
const HOUR: Duration = Duration::from_secs(3600);

/// A running sidecar; killed on drop.
struct Sidecar {
    child: Child,
    base: String,
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
        .env("RUST_LOG", "info");
    cmd
}

impl Sidecar {
    fn start(server: &Apiserver, extra: &[&str]) -> Self {
        let dir = scratch_dir();
        std::fs::write(dir.join("token"), GATEWAY_TOKEN).unwrap();
        let port = free_port();
        let mut args: Vec<String> = vec![
            "--sync-url".into(),
            server.url.clone(),
            "--ca-file".into(),
            server.ca_file.display().to_string(),
            "--token-file".into(),
            dir.join("token").display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = std::fs::File::create(dir.join("authz.log")).unwrap();
        let child = authz_command(&args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start mcp-access-authz");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("authz.log")).unwrap_or_default()
    }

    async fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while reqwest::get(format!("{}/readyz", self.base)).await.is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("mcp-access-authz exited ({status}): {}", self.log());
            }
            assert!(Instant::now() < deadline, "not listening: {}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_ready(&mut self) {
        self.wait_listening().await;
        let base = self.base.clone();
        eventually(Duration::from_secs(10), "/readyz is 200", || {
            let base = base.clone();
            async move {
                reqwest::get(format!("{base}/readyz"))
                    .await
                    .map(|r| r.status() == 200)
                    .unwrap_or(false)
            }
        })
        .await;
    }
}

/// (status, reason from the JSON body, reason from the header)
async fn check(
    base: &str,
    method: reqwest::Method,
    path: &str,
    session: Option<&str>,
) -> (u16, Option<String>, Option<String>) {
    let mut req = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(s) = session {
        req = req.header("X-MCP-Session", s);
    }
    let resp = req.send().await.expect("the sidecar answers");
    let status = resp.status().as_u16();
    let header = resp
        .headers()
        .get("x-mcp-deny-reason")
        .map(|v| v.to_str().unwrap().to_string());
    let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    let reason = body["reason"].as_str().map(str::to_string);
    (status, reason, header)
}

fn denied(reason: &str) -> (u16, Option<String>, Option<String>) {
    (401, Some(reason.into()), Some(reason.into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_on_any_path_with_reasons_in_body_and_header() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "bob", SERVER_UID, HOUR)
        .await;
    server.revoke("team-a", "bob").await;
    let mut sidecar = Sidecar::start(&server, &[]);
    sidecar.wait_ready().await;
    let base = sidecar.base.clone();
    use reqwest::Method;

    // Envoy forwards the original path and method; nginx and Traefik call a fixed one.
    for (method, path) in [
        (Method::GET, "/"),
        (Method::GET, "/check"),
        (Method::POST, "/mcp"),
        (Method::DELETE, "/some/deep/path?x=1"),
        (Method::PUT, "/readyz-not-really"),
    ] {
        let (status, _, header) = check(&base, method.clone(), path, Some("team-a/alice")).await;
        assert_eq!((status, header), (200, None), "{method} {path}");
        assert_eq!(
            check(&base, method.clone(), path, Some("team-a/bob")).await,
            denied("session_revoked"),
            "{method} {path}"
        );
    }
    assert_eq!(
        check(&base, Method::GET, "/", Some("team-a/nobody")).await,
        denied("session_not_found")
    );
    assert_eq!(
        check(&base, Method::GET, "/", None).await,
        denied("session_missing")
    );
    for bad in [
        "alice",
        "team-a/",
        "/alice",
        "team-a/alice/x",
        "Team-A/alice",
        "team-a/../x",
    ] {
        assert_eq!(
            check(&base, Method::GET, "/", Some(bad)).await,
            denied("session_malformed"),
            "{bad:?}"
        );
    }
    // Two values of the header could be read differently by the proxy: refused.
    let resp = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("X-MCP-Session", "team-a/alice")
        .header("X-MCP-Session", "team-a/bob")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // Its own /v1 namespace is never a check that could answer 200.
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/anything"))
        .header("X-MCP-Session", "team-a/alice")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mcp_gateway_session_sync_age_seconds "),
        "{metrics}"
    );
    assert!(
        metrics.contains("mcp_authz_checks_total{result=\"session_revoked\"}"),
        "{metrics}"
    );
    assert!(
        !sidecar.log().contains(GATEWAY_TOKEN),
        "the token is never logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_session_header() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let mut sidecar = Sidecar::start(&server, &["--session-header", "X-Session-Ref"]);
    sidecar.wait_ready().await;
    let resp = reqwest::Client::new()
        .get(format!("{}/", sidecar.base))
        .header("X-Session-Ref", "team-a/alice")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        check(
            &sidecar.base,
            reqwest::Method::GET,
            "/",
            Some("team-a/alice")
        )
        .await,
        denied("session_missing"),
        "the default header is not read when another is configured"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_before_the_first_sync() {
    // The apiserver is not up yet: the sidecar listens but is not ready and denies.
    let mut server = Apiserver::prepare(&[]).await;
    let mut sidecar = Sidecar::start(&server, &[]);
    sidecar.wait_listening().await;
    let readyz = reqwest::get(format!("{}/readyz", sidecar.base))
        .await
        .unwrap();
    assert_eq!(readyz.status(), 503);
    assert_eq!(
        check(
            &sidecar.base,
            reqwest::Method::GET,
            "/",
            Some("team-a/alice")
        )
        .await,
        denied("sync_not_ready")
    );
    let metrics = reqwest::get(format!("{}/metrics", sidecar.base))
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
    sidecar.wait_ready().await;
    let base = sidecar.base.clone();
    eventually(Duration::from_secs(5), "alice is allowed", || {
        let base = base.clone();
        async move {
            check(&base, reqwest::Method::GET, "/", Some("team-a/alice"))
                .await
                .0
                == 200
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_poll_completes_when_the_session_is_revoked() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let mut sidecar = Sidecar::start(&server, &[]);
    sidecar.wait_ready().await;
    let url = format!("{}/v1/sessions/team-a/alice/revoked", sidecar.base);
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
    assert_eq!(
        check(
            &sidecar.base,
            reqwest::Method::GET,
            "/",
            Some("team-a/alice")
        )
        .await,
        denied("session_revoked")
    );

    // Already unusable, or malformed: answered at once.
    let resp = reqwest::get(format!(
        "{}/v1/sessions/team-a/nobody/revoked",
        sidecar.base
    ))
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["reason"],
        "session_not_found"
    );
    let resp = reqwest::get(format!("{}/v1/sessions/Team-A/x/revoked", sidecar.base))
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

fn refused(args: &[String]) -> String {
    let out = authz_command(args).output().expect("run mcp-access-authz");
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
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
            format!("127.0.0.1:{}", free_port()),
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
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_long_polls_and_exits_cleanly() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let mut sidecar = Sidecar::start(&server, &[]);
    sidecar.wait_ready().await;
    let url = format!("{}/v1/sessions/team-a/alice/revoked", sidecar.base);
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
