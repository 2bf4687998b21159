//! `mcp-access-stdio-bridge` against a real stdio MCP server of the official Python SDK
//! (e2e/mcp/stdio_server.py), driven by the SDK's Streamable HTTP client
//! (e2e/mcp/stdio_bridge_client.py) and by raw HTTP for what a well-behaved client never does.
//! Needs `MCP_ACCESS_MCP_PYTHON` (a Python with `mcp`), as the e2e scenarios do.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-access-stdio-bridge");

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/mcp")
}

fn python() -> PathBuf {
    e2e::mcp::python().expect("MCP_ACCESS_MCP_PYTHON: a Python with the official MCP SDK")
}

/// The bridge, running the Python stdio server, killed when dropped.
struct Bridge {
    child: Child,
    url: String,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_bridge(extra: &[&str]) -> Bridge {
    let mut child = Command::new(BIN)
        .arg("--listen=127.0.0.1:0")
        .args(extra)
        .arg("--")
        .arg(python())
        .arg(scripts().join("stdio_server.py"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the bridge");
    // `mcp-access-stdio-bridge listening on ADDR (streamable-http)`, then the rest of its
    // stderr (the Python servers' logs) drained so that no child blocks on it.
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr
        .read_line(&mut line)
        .expect("the bridge's first line");
    let addr = line
        .split_whitespace()
        .nth(3)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stderr.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    Bridge {
        child,
        url: format!("http://{addr}/mcp"),
    }
}

fn alive(pid: i64) -> bool {
    // A zombie still has /proc/PID; its state is Z. The bridge reaps its children.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

async fn gone(pid: i64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
}

fn call(id: i64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {}}})
}

struct Reply {
    status: u16,
    session: Option<String>,
    body: Value,
}

async fn post(url: &str, session: Option<&str>, body: &Value) -> Reply {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let res = req.send().await.expect("POST");
    let status = res.status().as_u16();
    let session = res
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = res.json().await.unwrap_or(Value::Null);
    Reply {
        status,
        session,
        body,
    }
}

/// A raw session: initialize, initialized; returns its id.
async fn open(url: &str) -> String {
    let init = post(url, None, &initialize()).await;
    assert_eq!(init.status, 200, "{}", init.body);
    assert_eq!(
        init.body["result"]["serverInfo"]["name"],
        "mcp-access-e2e-stdio"
    );
    let id = init.session.expect("a session id");
    assert_eq!(id.len(), 32, "128 random bits in hex: {id}");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(url, Some(&id), &note).await.status, 202);
    id
}

async fn pid_of(url: &str, session: &str) -> i64 {
    let r = post(url, Some(session), &call(1, "pid")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["result"]["content"][0]["text"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", r.body))
}

#[tokio::test]
async fn the_sdk_client_gets_one_process_per_session() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bridge = spawn_bridge(&[]);
    let out = tokio::task::spawn_blocking({
        let url = bridge.url.clone();
        move || {
            Command::new(python())
                .arg(scripts().join("stdio_bridge_client.py"))
                .arg(format!("--url={url}"))
                .stderr(Stdio::inherit())
                .output()
                .expect("run the SDK client")
        }
    })
    .await
    .unwrap();
    let out: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(out["ok"], true, "{out:#}");
    let sessions = out["sessions"].as_array().unwrap();
    let mut pids = Vec::new();
    for (s, name) in sessions.iter().zip(["a", "b"]) {
        assert_eq!(s["server_name"], "mcp-access-e2e-stdio", "{s}");
        assert_eq!(
            s["tools"],
            json!(["count", "echo", "exit", "pid", "recall", "remember"]),
            "{s}"
        );
        assert_eq!(s["echo"], format!("hello from {name}"));
        // Each session kept its own value: two processes, not one shared.
        assert_eq!(s["recall"], name, "{out:#}");
        assert_eq!(s["count"], "counted 3");
        // Progress notifications are the server's unasked messages: the GET stream's.
        assert_eq!(s["progress"], json!([1.0, 2.0, 3.0]), "{s}");
        pids.push(s["pid"].as_i64().unwrap());
    }
    assert_ne!(pids[0], pids[1], "two sessions, two processes");
    // The SDK ended both sessions (DELETE): both children are gone.
    for pid in pids {
        assert!(gone(pid).await, "child {pid} outlived its session");
    }
}

#[tokio::test]
async fn sessions_end_with_delete_or_with_their_child() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bridge = spawn_bridge(&["--max-sessions=2", "--max-body-bytes=4096"]);
    let url = &bridge.url;

    // Without a session: only initialize; an unknown session: 404.
    let r = post(url, None, &call(1, "pid")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = post(
        url,
        Some("00000000000000000000000000000000"),
        &call(1, "pid"),
    )
    .await;
    assert_eq!(r.status, 404);

    // DELETE ends the child, and the id with it.
    let a = open(url).await;
    let pid = pid_of(url, &a).await;
    assert!(alive(pid));
    let client = reqwest::Client::new();
    let del = client
        .delete(url)
        .header("mcp-session-id", &a)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status().as_u16(), 200);
    assert!(gone(pid).await, "DELETE left child {pid} running");
    assert_eq!(post(url, Some(&a), &call(2, "pid")).await.status, 404);
    let again = client
        .delete(url)
        .header("mcp-session-id", &a)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 404);

    // A child that exits ends its session: the request it left unanswered, and every later
    // one, 404.
    let b = open(url).await;
    let pid = pid_of(url, &b).await;
    assert_eq!(post(url, Some(&b), &call(3, "exit")).await.status, 404);
    assert!(gone(pid).await);
    assert_eq!(post(url, Some(&b), &call(4, "pid")).await.status, 404);

    // Bounded: two sessions at most, then 503 until one ends; a large body, 413.
    let c = open(url).await;
    let d = open(url).await;
    assert_ne!(c, d);
    assert_ne!(pid_of(url, &c).await, pid_of(url, &d).await);
    let r = post(url, None, &initialize()).await;
    assert_eq!(r.status, 503, "{}", r.body);
    let big = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                     "params": {"name": "echo", "arguments": {"text": "x".repeat(8192)}}});
    assert_eq!(post(url, Some(&c), &big).await.status, 413);
    // The session survives a refused request.
    let small = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
                       "params": {"name": "echo", "arguments": {"text": "still here"}}});
    let r = post(url, Some(&c), &small).await;
    assert_eq!(r.body["result"]["content"][0]["text"], "still here");
    client
        .delete(url)
        .header("mcp-session-id", &d)
        .send()
        .await
        .unwrap();
    let e = open(url).await;
    assert!(pid_of(url, &e).await > 0);

    // GET needs a session; a second GET of one session is refused while the first is open.
    let get = client.get(url).send().await.unwrap();
    assert_eq!(get.status().as_u16(), 400);
    let first = client
        .get(url)
        .header("mcp-session-id", &e)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(
        first.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let second = client
        .get(url)
        .header("mcp-session-id", &e)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status().as_u16(), 409);
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `--remote`: the egress proxy of a `remote` MCPServer, in front of a loopback "remote"
/// (e2e/mcp/upstream.py, Streamable HTTP), driven by the SDK's client through any path.
#[tokio::test]
async fn the_remote_proxy_forwards_to_its_one_url() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut upstream = Command::new(python())
        .arg(scripts().join("upstream.py"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the remote");
    let mut line = String::new();
    BufReader::new(upstream.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _upstream = Killed(upstream);
    let remote = line.trim().rsplit(' ').next().unwrap().to_string();

    let mut proxy = Command::new(BIN)
        .arg("--listen=127.0.0.1:0")
        .arg(format!("--remote=http://{remote}/mcp"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the proxy");
    let mut line = String::new();
    BufReader::new(proxy.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _proxy = Killed(proxy);
    let addr = line.split_whitespace().nth(3).unwrap().to_string();

    // The client's path does not choose the destination: the URL does.
    let url = format!("http://{addr}/somewhere/else");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(scripts().join("client.py"))
            .arg(format!("--url={url}"))
            .arg("--scenario=basic")
            .stderr(Stdio::inherit())
            .output()
            .expect("run the SDK client")
    })
    .await
    .unwrap();
    let out: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(out["ok"], true, "{out:#}");
    assert_eq!(out["server_name"], "mcp-access-e2e-upstream");
    assert_eq!(out["echo"], "hello through the gateway");
    // The gateway's identity headers stay inside the cluster.
    assert_eq!(out["whoami"]["identity"], json!({}), "{out:#}");

    // The same, raw: an identity header the gateway would add never reaches the remote.
    let url = format!("http://{addr}/mcp");
    let init = reqwest::Client::new()
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("x-mcp-access-subject", "alice")
        .json(&initialize())
        .send()
        .await
        .unwrap();
    assert_eq!(init.status().as_u16(), 200);
    assert!(init.headers().contains_key("mcp-session-id"));

    // The remote gone: 502, not a hang.
    drop(_upstream);
    let r = post(&url, None, &initialize()).await;
    assert_eq!(r.status, 502);
}
