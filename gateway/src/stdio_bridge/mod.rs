//! The stdio bridge: MCP over a child process's stdin and stdout, served as Streamable HTTP on
//! loopback, so that a `transport: stdio` MCPServer sits behind `mcp-access-gateway` as every
//! HTTP server does (the gateway stays the Pod's only exposed port).
//!
//! One child process per MCP session:
//! - `POST` of an `initialize` request without `Mcp-Session-Id` spawns the command, assigns a
//!   fresh random session id (128 bits, hex) and answers the child's response with it;
//! - `POST` with that id writes the message to that child's stdin as one JSON line; a request
//!   is answered `application/json` with the child's response of the same JSON-RPC id, a
//!   notification or a response from the client with 202;
//! - what the child sends unasked (requests, notifications) goes to the session's `GET` SSE
//!   stream (one at a time; while none is open it waits in a bounded queue, then is dropped
//!   with a warning);
//! - `DELETE` with the id ends the child; a child that exits ends its session: its id is then
//!   unknown (404), as are the requests it left unanswered.
//!
//! Bounds: the request body (413 past it), the line a child may write, the number of live
//! sessions (503 past it) and the queue of unasked messages per session. Every path serves
//! MCP: the gateway forwards the client's path unchanged.

pub mod cli;
pub mod remote;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

/// The session header of the Streamable HTTP transport.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// What the bridge runs and its bounds.
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    /// The MCP server's command and its arguments (the first is the program).
    pub command: Vec<String>,
    /// Live sessions (children) at most; `initialize` past it gets 503.
    pub max_sessions: usize,
    /// Largest request body, in bytes; 413 past it.
    pub max_body_bytes: usize,
    /// Longest line a child may write, in bytes; a longer one ends its session.
    pub max_line_bytes: usize,
    /// Unasked messages a session holds while no GET stream reads them.
    pub queue: usize,
}

impl BridgeConfig {
    /// A bridge for `command` with the default bounds.
    pub fn new(command: Vec<String>) -> Self {
        BridgeConfig {
            command,
            max_sessions: 64,
            max_body_bytes: 4 << 20,
            max_line_bytes: 16 << 20,
            queue: 256,
        }
    }
}

/// Why the bridge cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("no command to run")]
    NoCommand,
    #[error("listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("serve: {0}")]
    Serve(std::io::Error),
    #[error("the remote client: {0}")]
    Client(String),
}

/// One session's shared half: what requests wait for, and where unasked messages go. The
/// child itself is owned by the session's task ([`run_session`]).
struct Session {
    /// Lines to the child's stdin (bounded: a child that stops reading pushes back).
    stdin: mpsc::Sender<Vec<u8>>,
    /// Requests in flight, by their JSON-RPC id (its JSON text).
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// Unasked messages: the sender is the child's, the receiver the GET stream's while one
    /// is open (taken by it, put back when it ends).
    unasked: mpsc::Sender<Value>,
    unasked_rx: Mutex<Option<mpsc::Receiver<Value>>>,
    /// Ends the child (DELETE).
    kill: Mutex<Option<oneshot::Sender<()>>>,
}

type Sessions = Arc<Mutex<HashMap<String, Arc<Session>>>>;

#[derive(Clone)]
struct Bridge {
    config: Arc<BridgeConfig>,
    sessions: Sessions,
}

/// Serves the bridge on `listener` until `shutdown` resolves; every child is killed when
/// the bridge ends (`kill_on_drop`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: BridgeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), BridgeError> {
    if config.command.is_empty() {
        return Err(BridgeError::NoCommand);
    }
    let bridge = Bridge {
        config: Arc::new(config),
        sessions: Arc::default(),
    };
    let sessions = bridge.sessions.clone();
    let app = axum::Router::new().fallback(handle).with_state(bridge);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(BridgeError::Serve);
    // Children end with their sessions' tasks; ask them now rather than at exit.
    let live: Vec<Arc<Session>> = lock(&sessions).drain().map(|(_, s)| s).collect();
    for session in live {
        session.end();
    }
    served
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps half-updated in a way that
    // matters more than serving on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Session {
    fn end(&self) {
        if let Some(kill) = lock(&self.kill).take() {
            let _ = kill.send(());
        }
    }
}

async fn handle(State(bridge): State<Bridge>, request: Request) -> Response {
    let session_id = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match (request.method().clone(), session_id) {
        (Method::POST, id) => post(&bridge, id, request).await,
        (Method::GET, Some(id)) => get(&bridge, &id),
        (Method::DELETE, Some(id)) => delete(&bridge, &id),
        (Method::GET | Method::DELETE, None) => error(
            StatusCode::BAD_REQUEST,
            "an Mcp-Session-Id header is required",
        ),
        _ => {
            let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "GET, POST or DELETE");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

/// A JSON-RPC error body without an id (the bridge's own refusals), with its HTTP status.
fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}});
    (status, axum::Json(body)).into_response()
}

fn unknown_session() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown or ended session: initialize again",
    )
}

async fn post(bridge: &Bridge, session_id: Option<String>, request: Request) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), bridge.config.max_body_bytes).await {
        Ok(body) => body,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        }
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "one JSON-RPC message (an object) per request",
            )
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, "the body is not JSON"),
    };
    let is_request = message.get("method").is_some() && message.get("id").is_some();
    let (id, session) = match session_id {
        Some(id) => match lock(&bridge.sessions).get(&id) {
            Some(session) => (id, session.clone()),
            None => return unknown_session(),
        },
        None => {
            if !is_request || message["method"] != "initialize" {
                return error(
                    StatusCode::BAD_REQUEST,
                    "without Mcp-Session-Id, only an initialize request",
                );
            }
            match start_session(bridge) {
                Ok(started) => started,
                Err(StartError::Full) => {
                    return error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many sessions: end one (DELETE) or retry later",
                    )
                }
                Err(StartError::Spawn) => {
                    return error(
                        StatusCode::BAD_GATEWAY,
                        "the MCP server could not be started",
                    )
                }
            }
        }
    };
    let mut line = match serde_json::to_vec(&message) {
        Ok(line) => line,
        Err(_) => return error(StatusCode::BAD_REQUEST, "the body is not JSON"),
    };
    line.push(b'\n');
    if !is_request {
        return match session.stdin.send(line).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(_) => unknown_session(),
        };
    }
    let key = message["id"].to_string();
    let (tx, rx) = oneshot::channel();
    {
        let mut pending = lock(&session.pending);
        if pending.contains_key(&key) {
            return error(
                StatusCode::CONFLICT,
                "a request with this id is already in flight",
            );
        }
        pending.insert(key.clone(), tx);
    }
    // Forgets the request if the client goes away first.
    let _forget = Forget {
        session: &session,
        key,
    };
    if session.stdin.send(line).await.is_err() {
        return unknown_session();
    }
    match rx.await {
        Ok(response) => {
            let mut r = axum::Json(response).into_response();
            if let Ok(v) = HeaderValue::from_str(&id) {
                r.headers_mut().insert(SESSION_HEADER, v);
            }
            r
        }
        // The child ended before answering: its session is gone.
        Err(_) => unknown_session(),
    }
}

struct Forget<'a> {
    session: &'a Session,
    key: String,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.session.pending).remove(&self.key);
    }
}

/// Why no session started.
enum StartError {
    /// `max_sessions` are live.
    Full,
    /// The command could not be run (logged).
    Spawn,
}

/// Spawns the command for a new session and registers it under a fresh id.
fn start_session(bridge: &Bridge) -> Result<(String, Arc<Session>), StartError> {
    let config = &bridge.config;
    if lock(&bridge.sessions).len() >= config.max_sessions {
        return Err(StartError::Full);
    }
    let mut child = Command::new(&config.command[0])
        .args(&config.command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // The child's log is the container's.
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            tracing::error!(command = %config.command[0], error = %e, "spawn");
            StartError::Spawn
        })?;
    let (stdin_tx, stdin_rx) = mpsc::channel(16);
    let (unasked_tx, unasked_rx) = mpsc::channel(config.queue);
    let (kill_tx, kill_rx) = oneshot::channel();
    let session = Arc::new(Session {
        stdin: stdin_tx,
        pending: Mutex::default(),
        unasked: unasked_tx,
        unasked_rx: Mutex::new(Some(unasked_rx)),
        kill: Mutex::new(Some(kill_tx)),
    });
    let id = format!("{:032x}", rand::random::<u128>());
    {
        let mut sessions = lock(&bridge.sessions);
        // Checked again under the lock that inserts: two initializes race for the last slot.
        if sessions.len() >= config.max_sessions {
            return Err(StartError::Full);
        }
        sessions.insert(id.clone(), session.clone());
    }
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        lock(&bridge.sessions).remove(&id);
        return Err(StartError::Spawn);
    };
    let sessions = bridge.sessions.clone();
    let max_line = config.max_line_bytes;
    let task_id = id.clone();
    let task_session = session.clone();
    let span = tracing::info_span!("session", id = %task_id);
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let ended = run_session(
                &task_session,
                child,
                stdin,
                stdout,
                stdin_rx,
                kill_rx,
                max_line,
            )
            .await;
            lock(&sessions).remove(&task_id);
            // Unanswered requests see their senders dropped: 404.
            lock(&task_session.pending).clear();
            tracing::info!(ended, "session ended");
        },
        span,
    ));
    tracing::info!(session = %id, "session started");
    Ok((id, session))
}

/// The session's one task: owns the child, feeds its stdin, routes its stdout, until the
/// child exits, a DELETE asks, or the child breaks the framing. Returns why it ended.
async fn run_session(
    session: &Session,
    mut child: Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    lines_in: mpsc::Receiver<Vec<u8>>,
    mut kill: oneshot::Receiver<()>,
    max_line: usize,
) -> &'static str {
    let mut stdout = BufReader::new(stdout);
    let mut line = Vec::new();
    // Writing apart from reading: a child blocked on a full stdout pipe must still be read
    // while a large request waits for room in its stdin pipe.
    let mut writer = tokio::spawn(write_lines(stdin, lines_in));
    let ended = loop {
        tokio::select! {
            _ = &mut kill => break "deleted",
            status = child.wait() => {
                tracing::info!(?status, "the MCP server exited");
                break "exited";
            }
            _ = &mut writer => break "stdin closed",
            read = read_line(&mut stdout, &mut line, max_line) => match read {
                Ok(0) => break "stdout closed",
                Ok(_) => route(session, &line),
                Err(e) => {
                    tracing::warn!(error = %e, "the MCP server's output");
                    break "bad output";
                }
            },
        }
    };
    writer.abort();
    // Ends it if it still runs (a DELETE, a closed pipe, a broken line).
    let _ = child.start_kill();
    let _ = child.wait().await;
    ended
}

/// Feeds the child's stdin until the session's sender is gone or the pipe breaks.
async fn write_lines(mut stdin: tokio::process::ChildStdin, mut lines: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = lines.recv().await {
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
}

/// One line of the child's stdout, its newline removed; Ok(0) at the end of the stream.
/// Cancel-safe enough for `select!`: a partial line stays in `line` for the next call.
async fn read_line(
    stdout: &mut BufReader<tokio::process::ChildStdout>,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    if line.last() == Some(&b'\n') {
        line.clear();
    }
    loop {
        let room = (max + 1).saturating_sub(line.len()) as u64;
        let n = (&mut *stdout).take(room).read_until(b'\n', line).await?;
        if line.last() == Some(&b'\n') {
            return Ok(line.len());
        }
        if n == 0 {
            return Ok(0);
        }
        if line.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line longer than {max} bytes"),
            ));
        }
    }
}

/// Sends one line of the child to whoever waits for it: a response to its request, anything
/// else to the GET stream. Lines that are not JSON (a chatty server) are logged and skipped.
fn route(session: &Session, line: &[u8]) {
    let text = line.trim_ascii();
    if text.is_empty() {
        return;
    }
    let message: Value = match serde_json::from_slice(text) {
        Ok(m) => m,
        Err(_) => {
            tracing::warn!("the MCP server wrote a line that is not JSON: skipped");
            return;
        }
    };
    let is_response = message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some());
    if is_response {
        if let Some(id) = message.get("id") {
            if let Some(waiter) = lock(&session.pending).remove(&id.to_string()) {
                let _ = waiter.send(message);
                return;
            }
        }
    }
    if let Err(e) = session.unasked.try_send(message) {
        tracing::warn!(error = %e, "no room for the MCP server's message: dropped");
    }
}

fn get(bridge: &Bridge, id: &str) -> Response {
    let Some(session) = lock(&bridge.sessions).get(id).cloned() else {
        return unknown_session();
    };
    let Some(rx) = lock(&session.unasked_rx).take() else {
        return error(
            StatusCode::CONFLICT,
            "this session's stream is already open",
        );
    };
    // The receiver goes back to the session when the stream ends (the client left), so a
    // later GET resumes where this one stopped.
    let stream = futures::stream::unfold(
        ReturnOnDrop {
            rx: Some(rx),
            session: session.clone(),
        },
        |mut held| async move {
            let message = held.rx.as_mut()?.recv().await?;
            let event = format!("event: message\ndata: {message}\n\n");
            Some((Ok::<_, std::convert::Infallible>(Bytes::from(event)), held))
        },
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(SESSION_HEADER, v);
    }
    (headers, Body::from_stream(stream)).into_response()
}

struct ReturnOnDrop {
    rx: Option<mpsc::Receiver<Value>>,
    session: Arc<Session>,
}

impl Drop for ReturnOnDrop {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            *lock(&self.session.unasked_rx) = Some(rx);
        }
    }
}

fn delete(bridge: &Bridge, id: &str) -> Response {
    let Some(session) = lock(&bridge.sessions).remove(id) else {
        return unknown_session();
    };
    session.end();
    StatusCode::OK.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(script: &str, max: usize) -> Vec<std::io::Result<Vec<u8>>> {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = Vec::new();
        let mut got = Vec::new();
        loop {
            match read_line(&mut out, &mut line, max).await {
                Ok(0) => break,
                Ok(_) => got.push(Ok(line.clone())),
                Err(e) => {
                    got.push(Err(e));
                    break;
                }
            }
        }
        let _ = child.wait().await;
        got
    }

    #[tokio::test]
    async fn lines_are_read_whole_and_bounded() {
        let got = lines_of("printf 'a\\nbb\\n'", 8).await;
        let got: Vec<Vec<u8>> = got.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [b"a\n".to_vec(), b"bb\n".to_vec()]);
        let got = lines_of("printf '0123456789\\n'", 8).await;
        assert!(matches!(&got[..], [Err(e)] if e.kind() == std::io::ErrorKind::InvalidData));
        // Exactly at the bound (plus its newline) is fine.
        let got = lines_of("printf '01234567\\n'", 8).await;
        assert_eq!(got.len(), 1);
        assert!(got[0].is_ok());
    }

    fn session() -> (Session, mpsc::Receiver<Value>) {
        let (stdin, _) = mpsc::channel(1);
        let (unasked, rx) = mpsc::channel(1);
        let session = Session {
            stdin,
            pending: Mutex::default(),
            unasked,
            unasked_rx: Mutex::new(None),
            kill: Mutex::new(None),
        };
        (session, rx)
    }

    #[tokio::test]
    async fn responses_go_to_their_request_and_the_rest_to_the_stream() {
        let (session, mut unasked) = session();
        let (tx, rx) = oneshot::channel();
        lock(&session.pending).insert("7".into(), tx);
        route(&session, br#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
        assert_eq!(rx.await.unwrap()["id"], 7);
        // A request of the server with the same id as none in flight, and a notification.
        route(&session, br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert_eq!(unasked.recv().await.unwrap()["method"], "ping");
        // Not JSON: skipped; a full queue drops (the receiver holds one).
        route(&session, b"hello\n");
        route(&session, br#"{"jsonrpc":"2.0","method":"a"}"#);
        route(&session, br#"{"jsonrpc":"2.0","method":"b"}"#);
        assert_eq!(unasked.recv().await.unwrap()["method"], "a");
        assert!(unasked.try_recv().is_err());
        // A string id is not the number of the same digits.
        let (tx, mut rx) = oneshot::channel();
        lock(&session.pending).insert("\"7\"".into(), tx);
        route(&session, br#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
        assert!(rx.try_recv().is_err());
    }
}
