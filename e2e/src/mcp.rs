//! MCP traffic through `mcp-access-gateway` with clients nobody here wrote: an upstream built
//! with the official MCP Python SDK (`e2e/mcp/upstream.py`), the gateway in front of it on the
//! local cluster's sync listener with a Pod-bound token, and the official SDK clients
//! (`e2e/mcp/client.py` in `legacy` and `2026-07-28` modes, `e2e/mcp/ts/client.cjs`), whose
//! JSON lines are read back here.
//!
//! Every port is the kernel's: the upstream and the gateway bind port 0 and say which port they
//! got (a line on stdout / stderr), so no port is ever picked here and bound again later.
//!
//! Needs `MCP_ACCESS_MCP_PYTHON`, `MCP_ACCESS_GATEWAY_BIN` and, for the TypeScript client,
//! `MCP_ACCESS_MCP_NODE_DIR` (all set by `hack/test.sh` through `hack/lib/mcp-sdk.sh`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::LocalCluster;

/// How long a started upstream or gateway gets to say where it listens, and the gateway to be
/// ready (its first sync) — a liveness bound for a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The API group/version path of MCP Access.
const GROUP_VERSION: &str = "/apis/access.mcp-runtime.dev/v1alpha1";

/// The official SDK client a scenario drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sdk {
    /// `mcp.Client(..., mode="legacy")`: the initialize handshake.
    PythonLegacy,
    /// `mcp.Client(..., mode="2026-07-28")`: no handshake, the 2026-07-28 protocol.
    Python2026,
    /// `mcp.Client(..., mode="legacy")` over the SDK's legacy HTTP+SSE transport
    /// (`sse_client`: `GET /sse`, messages posted to the URL of its `endpoint` event).
    PythonSse,
    /// `@modelcontextprotocol/sdk`'s `Client` over `StreamableHTTPClientTransport`.
    TypeScript,
}

impl Sdk {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Sdk::PythonLegacy => "python mode=legacy",
            Sdk::Python2026 => "python mode=2026-07-28",
            Sdk::PythonSse => "python HTTP+SSE",
            Sdk::TypeScript => "typescript",
        }
    }

    /// The SDKs this environment has: the Python ones always, TypeScript when
    /// `MCP_ACCESS_MCP_NODE_DIR` is set.
    pub fn available() -> Vec<Sdk> {
        let mut all = vec![Sdk::PythonLegacy, Sdk::Python2026, Sdk::PythonSse];
        if std::env::var_os("MCP_ACCESS_MCP_NODE_DIR").is_some() {
            all.push(Sdk::TypeScript);
        }
        all
    }

    fn command(self) -> Result<Command> {
        let dir = crate::repo_root().join("e2e/mcp");
        Ok(match self {
            Sdk::PythonLegacy | Sdk::Python2026 | Sdk::PythonSse => {
                let mut cmd = Command::new(python()?);
                cmd.arg(dir.join("client.py")).args([
                    "--mode",
                    if self == Sdk::Python2026 {
                        "2026-07-28"
                    } else {
                        "legacy"
                    },
                ]);
                if self == Sdk::PythonSse {
                    cmd.args(["--transport", "sse"]);
                }
                cmd
            }
            Sdk::TypeScript => {
                let mut cmd = Command::new("node");
                cmd.arg(dir.join("ts/client.cjs"));
                cmd
            }
        })
    }
}

/// The venv python holding the official MCP Python SDK.
pub fn python() -> Result<PathBuf> {
    std::env::var_os("MCP_ACCESS_MCP_PYTHON")
        .map(PathBuf::from)
        .context("MCP_ACCESS_MCP_PYTHON is not set: run through hack/test.sh")
}

/// A child process killed (and reaped) on drop.
pub struct Running {
    child: Child,
    /// Where its output goes.
    pub log: PathBuf,
}

impl Running {
    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a log, for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Copies `from` into `log` line by line in a thread, handing the address after `marker` on
/// the first line that carries it (and ends in `(<listener>)` when one is named) to the
/// returned channel.
fn watch_for_address(
    from: impl Read + Send + 'static,
    log: std::fs::File,
    marker: &'static str,
    listener: Option<&'static str>,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = log;
        let mut tx = Some(tx);
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            let _ = writeln!(log, "{line}");
            let named = |tail: &str| {
                listener.is_none_or(|name| tail.trim_end().ends_with(&format!("({name})")))
            };
            if let Some(at) = line.find(marker).filter(|at| named(&line[*at..])) {
                if let Some(tx) = tx.take() {
                    let addr = line[at + marker.len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .trim_matches(|c| c == '"' || c == ',')
                        .to_string();
                    let _ = tx.send(addr);
                }
            }
        }
    });
    rx
}

fn wait_address(
    rx: &mpsc::Receiver<String>,
    process: &mut Running,
    what: &str,
) -> Result<SocketAddr> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(addr) => {
                return addr
                    .parse()
                    .with_context(|| format!("{what} said it listens on {addr:?}"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!(
                    "{what} ended its output without a listening line; its log:\n{}",
                    tail(&process.log, 30)
                )
            }
        }
        if !process.alive() {
            bail!("{what} exited; its log:\n{}", tail(&process.log, 30));
        }
        if Instant::now() > deadline {
            bail!(
                "{what} did not say where it listens within {START_TIMEOUT:?}; its log:\n{}",
                tail(&process.log, 30)
            );
        }
    }
}

/// The upstream MCP server (`e2e/mcp/upstream.py`), Streamable HTTP at `/mcp`.
pub struct Upstream {
    pub process: Running,
    pub addr: SocketAddr,
}

impl Upstream {
    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Its origin, as the gateway's `--upstream`.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Starts `e2e/mcp/upstream.py` as `name`, logging to `DIR/logs/mcp-upstream-<name>.log`.
pub fn spawn_upstream(c: &LocalCluster, name: &str) -> Result<Upstream> {
    let logs = c.dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!("mcp-upstream-{name}.log"));
    let file = std::fs::File::create(&log)?;
    let mut child = Command::new(python()?)
        .arg(crate::repo_root().join("e2e/mcp/upstream.py"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(file.try_clone()?)
        .spawn()
        .context("cannot start e2e/mcp/upstream.py")?;
    let stdout: ChildStdout = child.stdout.take().context("no stdout")?;
    let rx = watch_for_address(stdout, file, "mcp-upstream listening on ", None);
    let mut process = Running { child, log };
    let addr = wait_address(&rx, &mut process, "the upstream MCP server")?;
    Ok(Upstream { process, addr })
}

/// A running `mcp-access-gateway`.
pub struct Gateway {
    pub process: Running,
    pub addr: SocketAddr,
    /// Its `--public-url`: the audience its tokens must name.
    pub public_url: String,
    /// Its sync-listener token file (rewrite it to rotate the token).
    pub token_file: PathBuf,
}

impl Gateway {
    /// Its MCP endpoint on loopback.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// A plain HTTP GET of `path`: (status, headers lowercased, body).
    pub fn get(&self, path: &str) -> Result<HttpReply> {
        http_request(self.addr, "GET", path, &[], None)
    }
}

/// The resource URI the controllers give a server's gateway (`--public-url`), which the
/// apiserver's default audience template names too.
pub fn public_url(namespace: &str, server: &str) -> String {
    format!("http://{server}.{namespace}.svc:8086")
}

/// Starts `mcp-access-gateway` (binary `MCP_ACCESS_GATEWAY_BIN`) as `name` with the Pod-bound
/// sync-listener `token`, in front of `upstream` (an origin such as `http://127.0.0.1:PORT`),
/// as `public_url`, on a port of 127.0.0.1 the kernel picks, with `extra` flags; waits for its
/// listening line and then for `/readyz` to answer 200 (its first sync of sessions).
pub fn spawn_gateway(
    c: &LocalCluster,
    name: &str,
    token: &str,
    upstream: &str,
    public_url: &str,
    extra: &[&str],
) -> Result<Gateway> {
    let bin = std::env::var("MCP_ACCESS_GATEWAY_BIN")
        .context("MCP_ACCESS_GATEWAY_BIN is not set: run through hack/test.sh")?;
    let dir = c.dir.join(format!("gateway-{name}"));
    std::fs::create_dir_all(&dir)?;
    let token_file = dir.join("token");
    std::fs::write(&token_file, token)?;
    std::fs::create_dir_all(c.dir.join("logs"))?;
    let log = c.dir.join(format!("logs/mcp-access-gateway-{name}.log"));
    let file = std::fs::File::create(&log)?;
    let mut child = Command::new(&bin)
        .args(["--sync-url", &c.sync_url()])
        .arg("--ca-file")
        .arg(c.sync_ca())
        .arg("--token-file")
        .arg(&token_file)
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", upstream])
        .args(["--public-url", public_url])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {bin}"))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let rx = watch_for_address(
        stderr,
        file,
        "mcp-access-gateway listening on ",
        Some("proxy"),
    );
    let mut process = Running { child, log };
    let addr = wait_address(&rx, &mut process, "mcp-access-gateway")?;
    let gateway = Gateway {
        process,
        addr,
        public_url: public_url.to_string(),
        token_file,
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match gateway.get("/readyz") {
            Ok(reply) if reply.status == 200 => return Ok(gateway),
            last => {
                if Instant::now() > deadline {
                    bail!(
                        "mcp-access-gateway at {addr} not ready within {START_TIMEOUT:?} (last: {last:?}); its log:\n{}",
                        tail(&gateway.process.log, 30)
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A plain HTTP/1.1 answer.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    /// The first header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to the end. For
/// the gateway's own endpoints and raw checks a client SDK would not make (a token in the
/// query string, two Authorization headers).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<HttpReply> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    if let Some(body) = body {
        request.push_str(body);
    }
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_http(&raw).with_context(|| format!("{method} {path} at {addr}"))
}

fn parse_http(raw: &[u8]) -> Result<HttpReply> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of the header block")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(HttpReply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// What one client run printed: its progress lines (with when each arrived here) and its
/// result line.
#[derive(Debug)]
pub struct ClientRun {
    pub progress: Vec<(Instant, Value)>,
    pub result: Value,
    /// When the result line arrived.
    pub ended: Instant,
}

impl ClientRun {
    /// The deny reason the client's HTTP error carried in its JSON body, if it got one.
    pub fn deny_reason(&self) -> Option<&str> {
        self.result["http"]["reason"].as_str()
    }
}

/// A running SDK client: its JSON lines arrive on a channel as they are printed.
pub struct ClientProcess {
    process: Running,
    lines: mpsc::Receiver<(Instant, Value)>,
    progress: Vec<(Instant, Value)>,
    sdk: Sdk,
}

/// Starts `sdk`'s client on `url` for `scenario` (`basic`, `count`, `prm`) with the bearer
/// `token` (none: no Authorization header) and `extra` arguments (`--count N --delay-ms D`).
pub fn spawn_client(
    c: &LocalCluster,
    sdk: Sdk,
    url: &str,
    token: Option<&str>,
    scenario: &str,
    extra: &[&str],
) -> Result<ClientProcess> {
    let dir = c.dir.join("mcp-clients");
    std::fs::create_dir_all(&dir)?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let log = dir.join(format!("{id}.log"));
    let mut cmd = sdk.command()?;
    // The legacy transport starts at the server's SSE endpoint, beside the MCP endpoint.
    let url = match (sdk, url.strip_suffix("/mcp")) {
        (Sdk::PythonSse, Some(base)) => format!("{base}/sse"),
        _ => url.to_string(),
    };
    cmd.args(["--url", &url, "--scenario", scenario])
        .args(extra);
    if let Some(token) = token {
        let file = dir.join(format!("{id}.token"));
        std::fs::write(&file, token)?;
        cmd.arg("--token-file").arg(file);
    }
    ClientProcess::spawn(cmd, sdk, log, None)
}

impl ClientProcess {
    /// Starts `cmd` (an SDK client, or one run elsewhere, e.g. in a Pod by `kubectl exec -i`),
    /// its stderr to `log`, `stdin` written to it and closed (nothing: no stdin), its stdout
    /// read line by line as JSON.
    pub fn spawn(mut cmd: Command, sdk: Sdk, log: PathBuf, stdin: Option<&str>) -> Result<Self> {
        let mut child = cmd
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot start the {} client", sdk.name()))?;
        if let Some(text) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().context("no stdin")?;
            pipe.write_all(text.as_bytes())?;
        }
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({"kind": "unparsed", "line": line}));
                if tx.send((Instant::now(), value)).is_err() {
                    return;
                }
            }
        });
        Ok(ClientProcess {
            process: Running { child, log },
            lines,
            progress: Vec::new(),
            sdk,
        })
    }

    /// Waits for the next progress line (the stream is open and flowing).
    pub fn next_progress(&mut self, timeout: Duration) -> Result<(Instant, Value)> {
        match self.lines.recv_timeout(timeout) {
            Ok((at, v)) if v["kind"] == "progress" => {
                self.progress.push((at, v.clone()));
                Ok((at, v))
            }
            Ok((_, v)) => bail!(
                "the {} client printed {v} before any progress; its stderr:\n{}",
                self.sdk.name(),
                tail(&self.process.log, 20)
            ),
            Err(_) => bail!(
                "no progress from the {} client within {timeout:?}; its stderr:\n{}",
                self.sdk.name(),
                tail(&self.process.log, 20)
            ),
        }
    }

    /// Waits for the result line (progress lines before it are kept).
    pub fn finish(mut self, timeout: Duration) -> Result<ClientRun> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok((at, v)) if v["kind"] == "result" => {
                    return Ok(ClientRun {
                        progress: self.progress,
                        result: v,
                        ended: at,
                    })
                }
                Ok((at, v)) => self.progress.push((at, v)),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!(
                    "the {} client exited without a result; its stderr:\n{}",
                    self.sdk.name(),
                    tail(&self.process.log, 30)
                ),
            }
        }
        bail!(
            "the {} client printed no result within {timeout:?}; its stderr:\n{}",
            self.sdk.name(),
            tail(&self.process.log, 30)
        )
    }
}

/// Runs `sdk`'s client to the end (see [`spawn_client`]).
pub fn run_client(
    c: &LocalCluster,
    sdk: Sdk,
    url: &str,
    token: Option<&str>,
    scenario: &str,
    extra: &[&str],
) -> Result<ClientRun> {
    spawn_client(c, sdk, url, token, scenario, extra)?.finish(Duration::from_secs(120))
}

/// Mints a session token through kube-apiserver, as a user would:
/// `kubectl create --raw .../namespaces/NS/accesssessions/NAME/token` with a `TokenRequest`
/// whose spec is `spec` (e.g. `{"expirationSeconds": 600}`). The whole answer on success.
pub fn request_session_token(
    c: &LocalCluster,
    namespace: &str,
    session: &str,
    spec: &Value,
) -> Result<Value> {
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": spec,
    });
    let path = format!("{GROUP_VERSION}/namespaces/{namespace}/accesssessions/{session}/token");
    let out = c.kubectl_as(
        &c.kubeconfig,
        &["create", "--raw", &path, "-f", "-"],
        Some(&body.to_string()),
    );
    if !out.success {
        bail!("POST {path} failed: {}{}", out.stdout, out.stderr);
    }
    serde_json::from_str(&out.stdout).with_context(|| format!("POST {path}: not JSON"))
}

/// The token of [`request_session_token`] with a lifetime of `seconds`.
pub fn session_token_for(
    c: &LocalCluster,
    namespace: &str,
    session: &str,
    seconds: u64,
) -> Result<String> {
    let answer = request_session_token(
        c,
        namespace,
        session,
        &serde_json::json!({"expirationSeconds": seconds}),
    )?;
    answer["status"]["token"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("TokenRequest answer without status.token: {answer}"))
}
