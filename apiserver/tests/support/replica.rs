//! Real `mcp-access-apiserver` processes (standalone mode) as replicas over one database, and
//! a PostgreSQL cluster of a test's own (for killing it, copying its files, or putting a
//! stalling proxy in front of it).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::server::ADMIN_TOKEN;
use super::watch::{Next, WatchStream};

pub fn apiserver_bin() -> String {
    std::env::var("MCP_ACCESS_APISERVER_BIN").expect(
        "MCP_ACCESS_APISERVER_BIN is not set: run through hack/test.sh, which builds the binary",
    )
}

/// The ports of `listeners` from a child's `mcp-access-apiserver listening on ...` lines on
/// `stderr` (taken from the child), copying every line of it to `log` meanwhile.
pub async fn announced_ports(
    stderr: std::process::ChildStderr,
    log: std::fs::File,
    listeners: &[&str],
    log_path: &Path,
) -> Vec<u16> {
    e2e::listening::follow("mcp-access-apiserver", stderr, log)
        .wait_ports(listeners, e2e::listening::LISTEN_TIMEOUT)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}",
                std::fs::read_to_string(log_path).unwrap_or_default()
            )
        })
}

pub fn scratch_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port the kernel just chose, for a third-party server that cannot report a port-0 bind
/// (postgres): the caller starts it there and retries with a fresh candidate when the start
/// fails with "address already in use". Never for our own binaries, which take port 0.
pub fn candidate_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What replicas over one database share: the token file and one serving certificate (so one
/// CA trusts every replica, as behind one Service).
pub struct Shared {
    pub dir: PathBuf,
    pub ca_pem: String,
}

impl Shared {
    pub fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = scratch_dir("mcp-access-replicas");
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        let ca_pem = cert.cert.pem();
        std::fs::write(dir.join("tls.crt"), &ca_pem).unwrap();
        let key_path = dir.join("tls.key");
        std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Self { dir, ca_pem }
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One apiserver process; restartable on the same ports. The first start asks for port 0 and
/// reads the ports bound from the process's stderr; a restart asks for those ports again,
/// as a Pod restarted behind its Service keeps its address (the one port reuse left: the
/// previous process held them until it ended).
pub struct Replica {
    pub name: String,
    pub dsn: String,
    pub port: u16,
    pub metrics_port: u16,
    pub extra: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    starts: usize,
}

impl Replica {
    /// Starts a replica over `dsn` (a libpq DSN) and waits until it is ready.
    pub async fn start(shared: &Shared, name: &str, dsn: &str, extra: &[&str]) -> Self {
        let mut replica = Self {
            name: name.into(),
            dsn: dsn.into(),
            port: 0,
            metrics_port: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            log: shared.dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        replica.launch(shared, &[]).await;
        replica
    }

    /// (Re)starts the process, with `once` added to its flags for this start only.
    pub async fn launch(&mut self, shared: &Shared, once: &[&str]) {
        assert!(self.child.is_none(), "{} already runs", self.name);
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut args: Vec<String> = [
            "--standalone",
            "--token-auth-file",
            &shared.dir.join("tokens.csv").display().to_string(),
            "--tls-cert-file",
            &shared.dir.join("tls.crt").display().to_string(),
            "--tls-private-key-file",
            &shared.dir.join("tls.key").display().to_string(),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &self.port.to_string(),
            "--metrics-port",
            &self.metrics_port.to_string(),
            "--database-pool-size",
            "8",
            "--watch-bookmark-interval",
            "1s",
            "--max-watches-per-user",
            "5000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(self.extra.iter().cloned());
        args.extend(once.iter().map(|s| s.to_string()));
        let mut child = Command::new(apiserver_bin())
            .args(&args)
            .env("MCP_ACCESS_DATABASE_URL", &self.dsn)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start mcp-access-apiserver");
        let stderr = child.stderr.take().expect("stderr is piped");
        self.child = Some(child);
        let ports = announced_ports(stderr, log, &["api", "metrics"], &self.log).await;
        (self.port, self.metrics_port) = (ports[0], ports[1]);
        self.wait_ready(Duration::from_secs(60)).await;
    }

    pub async fn wait_ready(&mut self, within: Duration) {
        let child = self.child.as_mut().expect("the replica runs");
        wait_ready(child, self.metrics_port, &self.name, &self.log, within).await;
    }

    /// The status of `/readyz` (0 when the listener does not answer).
    pub async fn readyz(&self) -> u16 {
        readyz_answer(self.metrics_port).await.0
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `kill -9`, as a node loss would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, the drain of a rolling update; waits for the exit.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal("-TERM", child.id());
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn sessions_url(&self, ns: &str) -> String {
        format!(
            "{}/apis/{}/namespaces/{ns}/accesssessions",
            self.url(),
            apis::API_VERSION
        )
    }

    pub fn revocations_url(&self, ns: &str) -> String {
        format!(
            "{}/apis/{}/namespaces/{ns}/revocations",
            self.url(),
            apis::API_VERSION
        )
    }

    /// Opens a watch of the sessions in `ns` from `rv`; `None` when the server answers
    /// otherwise than 200 (its status and body).
    pub async fn watch(
        &self,
        client: &reqwest::Client,
        ns: &str,
        rv: &str,
    ) -> Result<WatchStream, (u16, String)> {
        let resp = client
            .get(format!(
                "{}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true",
                self.sessions_url(ns)
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .map_err(|e| (0, e.to_string()))?;
        if resp.status() != 200 {
            let status = resp.status().as_u16();
            return Err((status, resp.text().await.unwrap_or_default()));
        }
        Ok(WatchStream::lenient(resp))
    }

    /// The resourceVersion of the sessions list in `ns`.
    pub async fn list_rv(&self, client: &reqwest::Client, ns: &str) -> String {
        let list: Value = client
            .get(self.sessions_url(ns))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// POSTs a team session; the response status and body.
    pub async fn create_session(
        &self,
        client: &reqwest::Client,
        ns: &str,
        name: &str,
    ) -> Result<(u16, Value), String> {
        let resp = client
            .post(self.sessions_url(ns))
            .bearer_auth(ADMIN_TOKEN)
            .json(&session_json(name))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

pub const SERVER_UID: &str = "0b6f6f6e-0000-4000-8000-000000000001";

pub fn session_json(name: &str) -> Value {
    let expires =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(2);
    let expires = k8s_openapi::jiff::Timestamp::from_second(expires.as_second()).unwrap();
    json!({
        "apiVersion": apis::API_VERSION,
        "kind": "AccessSession",
        "metadata": {"name": name},
        "spec": {
            "server": {"name": "github", "uid": SERVER_UID},
            "teams": ["payments"],
            "expiresAt": expires.to_string(),
        }
    })
}

/// `epoch` and `seq` of a resourceVersion string.
pub fn rv_parts(rv: &str) -> (u64, u64) {
    let v: u64 = rv.parse().expect("a resourceVersion is a decimal");
    (v >> 40, v & ((1 << 40) - 1))
}

/// One watcher's record: every event (type, name, seq), the last resourceVersion (events and
/// bookmarks) and how it ended.
#[derive(Debug, Default, Clone)]
pub struct Record {
    pub events: Vec<(String, String, u64)>,
    pub epoch: u64,
    pub last_rv: String,
    /// The `Status` of an ERROR event, if one ended the stream.
    pub error: Option<Value>,
    pub ended: bool,
}

impl Record {
    /// Reads `stream` until it ends, an ERROR arrives, `stop` says so, or nothing arrives for
    /// `idle`.
    pub async fn follow(
        &mut self,
        stream: &mut WatchStream,
        idle: Duration,
        stop: impl Fn(&Record) -> bool,
    ) {
        loop {
            if stop(self) {
                return;
            }
            match stream.next(idle).await {
                Next::Event(e) => self.take(&e),
                Next::End => {
                    self.ended = true;
                    return;
                }
                Next::Idle => return,
            }
            if self.error.is_some() {
                return;
            }
        }
    }

    pub fn take(&mut self, e: &Value) {
        let kind = e["type"].as_str().unwrap_or_default().to_string();
        if kind == "ERROR" {
            self.error = Some(e["object"].clone());
            return;
        }
        let rv = e["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (epoch, seq) = rv_parts(&rv);
        if self.epoch == 0 {
            self.epoch = epoch;
        }
        assert_eq!(
            epoch, self.epoch,
            "an event of another epoch without a 410 first: {e}"
        );
        if kind != "BOOKMARK" {
            let name = e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            self.events.push((kind, name, seq));
        }
        self.last_rv = rv;
    }

    /// Whether the stream was ended with 410 Expired.
    pub fn relisted(&self) -> bool {
        self.error
            .as_ref()
            .is_some_and(|s| s["code"] == 410 && s["reason"] == "Expired")
    }
}

/// A PostgreSQL cluster of this test's own on a free loopback port (trust auth, user
/// `postgres`), from the server binaries `hack/lib/postgres.sh` uses.
pub struct OwnPostgres {
    pub dir: PathBuf,
    pub port: u16,
}

pub fn pg_bin(name: &str) -> PathBuf {
    Path::new(&std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()))
        .join(name)
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// A command run as the `postgres` user when the test runs as root (initdb and postgres
/// refuse root).
pub fn as_pg(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl OwnPostgres {
    pub fn start() -> Self {
        let dir = scratch_dir("mcp-access-own-pg");
        if is_root() {
            let mut d = dir.clone();
            while d.pop() {
                let _ = Command::new("chmod").arg("o+x").arg(&d).status();
            }
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&dir)
                .status()
                .unwrap();
        }
        let out = as_pg(&pg_bin("initdb"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {out:?}");
        // postgres cannot report a port-0 bind: start on a port the kernel just chose and,
        // should another process take it first ("Address already in use"), on a fresh one.
        let mut pg = Self { dir, port: 0 };
        for _ in 0..5 {
            pg.port = candidate_port();
            let _ = std::fs::remove_file(pg.dir.join("postgres.log"));
            match pg.try_run() {
                Ok(()) => return pg,
                Err(e) if e.contains("already in use") => continue,
                Err(e) => panic!("postgres does not start: {e}"),
            }
        }
        panic!("postgres found every candidate port taken");
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Starts the server on its port (again, after a stop or a kill: a restart keeps its
    /// address, which its own previous process held).
    pub fn run(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let Err(e) = self.try_run() else { return };
            // After a kill -9 the old backends may hold the shared memory for a moment.
            assert!(Instant::now() < deadline, "postgres does not start: {e}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One `pg_ctl start` on its port: the failure's output and log when it fails.
    fn try_run(&self) -> Result<(), String> {
        let out = as_pg(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("postgres.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
                self.port,
                self.dir.display()
            ))
            .arg("start")
            .output()
            .unwrap();
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{out:?} {}",
            std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
        ))
    }

    /// A clean (fast) shutdown.
    pub fn stop(&self) {
        let _ = as_pg(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "stop"])
            .output();
    }

    /// `kill -9` of the postmaster and every backend.
    pub fn kill9(&self) {
        let Ok(pidfile) = std::fs::read_to_string(self.data().join("postmaster.pid")) else {
            return;
        };
        let Some(pid) = pidfile
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
        else {
            return;
        };
        let children = Command::new("pgrep")
            .args(["-P", &pid.to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        signal("-KILL", pid);
        for child in children.lines() {
            if let Ok(c) = child.trim().parse::<u32>() {
                signal("-KILL", c);
            }
        }
        // Gone once nothing answers on the port.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A libpq DSN of database `db` on this cluster, at `port` (a proxy's, or the cluster's).
    pub fn dsn(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    pub async fn client(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.dsn(db), tokio_postgres::NoTls)
            .await
            .expect("connect to the test's own PostgreSQL");
        tokio::spawn(conn);
        client
    }

    pub async fn create_database(&self, db: &str) {
        self.client("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
    }

    /// A file-level copy of the stopped cluster's data directory.
    pub fn copy_files(&self, to: &str) -> PathBuf {
        let target = self.dir.join(to);
        let ok = Command::new("cp")
            .arg("-a")
            .arg(self.data())
            .arg(&target)
            .status()
            .unwrap();
        assert!(ok.success());
        target
    }

    /// Puts a file-level copy back in place of the (stopped) cluster's data directory.
    pub fn restore_files(&self, from: &Path) {
        std::fs::remove_dir_all(self.data()).unwrap();
        let ok = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(self.data())
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The change log after `after` as (seq, event, name), in order.
pub async fn change_log(client: &tokio_postgres::Client, after: u64) -> Vec<(String, String, u64)> {
    client
        .query(
            "SELECT seq, event, name FROM change_log WHERE seq > $1 AND resource = 'accesssessions' ORDER BY seq",
            &[&(after as i64)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(1), r.get::<_, String>(2), r.get::<_, i64>(0) as u64))
        .collect()
}

/// Follows each stream in a task of its own until an event names `until`, nothing arrives
/// for `idle`, or `cap` passes; the tasks' records.
pub fn follow_until(
    streams: Vec<WatchStream>,
    until: &'static str,
    idle: Duration,
    cap: Duration,
) -> Vec<tokio::task::JoinHandle<Record>> {
    streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut record = Record::default();
                let done = |r: &Record| r.events.iter().any(|(_, n, _)| n == until);
                let _ = tokio::time::timeout(cap, record.follow(&mut stream, idle, done)).await;
                record
            })
        })
        .collect()
}

/// What concurrent writers were told.
#[derive(Debug, Default, Clone)]
pub struct Written {
    /// Name → the sequence of the resourceVersion a 201 acknowledged it at.
    pub acked: BTreeMap<String, u64>,
    /// When each acknowledgement arrived.
    pub acked_at: Vec<(Instant, String)>,
    /// Answers other than 201: (name, status, body).
    pub refused: Vec<(String, u16, String)>,
    /// Requests without an answer (the process died under them, or the timeout passed):
    /// their outcome is unknown.
    pub unanswered: Vec<String>,
}

/// Writers, each POSTing sessions `w<writer>-<i>` to its URL, one at a time, until stopped.
pub struct Writers {
    written: Arc<Mutex<Written>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    /// One writer per URL; each request gives up after `timeout`.
    pub fn start(client: &reqwest::Client, urls: Vec<String>, timeout: Duration) -> Self {
        let written = Arc::<Mutex<Written>>::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = urls
            .into_iter()
            .enumerate()
            .map(|(w, url)| {
                let (client, written, stop) = (client.clone(), written.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("w{w}-{i}");
                        i += 1;
                        let sent = client
                            .post(&url)
                            .bearer_auth(ADMIN_TOKEN)
                            .json(&session_json(&name))
                            .timeout(timeout)
                            .send()
                            .await;
                        let answer = match sent {
                            Ok(resp) => {
                                let code = resp.status().as_u16();
                                resp.text().await.map(|body| (code, body))
                            }
                            Err(e) => Err(e),
                        };
                        let acked = {
                            let mut written = written.lock().unwrap();
                            match answer {
                                Ok((201, body)) => {
                                    let v: Value = serde_json::from_str(&body).unwrap();
                                    let rv = v["metadata"]["resourceVersion"].as_str().unwrap();
                                    written.acked.insert(name.clone(), rv_parts(rv).1);
                                    written.acked_at.push((Instant::now(), name));
                                    true
                                }
                                Ok((code, body)) => {
                                    written.refused.push((name, code, body));
                                    false
                                }
                                Err(_) => {
                                    written.unanswered.push(name);
                                    false
                                }
                            }
                        };
                        if acked {
                            continue;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                })
            })
            .collect();
        Self {
            written,
            stop,
            tasks,
        }
    }

    /// What they were told so far.
    pub fn written(&self) -> Written {
        self.written.lock().unwrap().clone()
    }

    /// Stops them (each finishes its request in flight); what they were told.
    pub async fn stop(self) -> Written {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let written = self.written.lock().unwrap().clone();
        written
    }
}

/// Checks the database against what writers were told: every acknowledged write is in the
/// change log (after `after`) at the sequence it was acknowledged at, every logged change is
/// an ADDED whose object exists in `ns`, and no object lacks its change (nothing
/// half-applied). The log.
pub async fn assert_committed_as_acknowledged(
    db: &tokio_postgres::Client,
    ns: &str,
    after: u64,
    written: &Written,
) -> Vec<(String, String, u64)> {
    let log = change_log(db, after).await;
    let logged: BTreeMap<String, u64> = log
        .iter()
        .map(|(kind, name, seq)| {
            assert_eq!(kind, "ADDED", "{name}");
            (name.clone(), *seq)
        })
        .collect();
    for (name, seq) in &written.acked {
        assert_eq!(
            logged.get(name),
            Some(seq),
            "acknowledged write {name} is not in the log"
        );
    }
    let objects: BTreeSet<String> = db
        .query(
            "SELECT name FROM objects WHERE resource = 'accesssessions' AND namespace = $1",
            &[&ns],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        objects,
        logged.keys().cloned().collect::<BTreeSet<_>>(),
        "an object without its change, or a change without its object"
    );
    log
}

/// Checks a watcher's events against the change log: exactly its beginning, in order, once;
/// short of the whole log only when told to relist. Whether it was told to relist.
pub fn assert_follows_log(record: &Record, log: &[(String, String, u64)]) -> bool {
    let prefix = &log[..record.events.len().min(log.len())];
    assert_eq!(
        record.events, prefix,
        "a watcher saw other than the change log, in order, once"
    );
    assert!(
        record.events.len() == log.len() || record.relisted(),
        "a watcher stopped short of the log ({} of {}) without being told to relist: {:?}",
        record.events.len(),
        log.len(),
        record.error
    );
    record.relisted()
}

/// `/readyz` on the metrics port: its status and body, `(0, "")` when nothing answers.
pub async fn readyz_answer(metrics_port: u16) -> (u16, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    match client
        .get(format!("http://127.0.0.1:{metrics_port}/readyz"))
        .send()
        .await
    {
        Ok(resp) => (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        ),
        Err(_) => (0, String::new()),
    }
}

/// Waits until the apiserver `child` (named `name`, logging to `log`) answers 200 on
/// `/readyz`; panics with its log if it exits or is not ready `within`.
pub async fn wait_ready(
    child: &mut Child,
    metrics_port: u16,
    name: &str,
    log: &std::path::Path,
    within: Duration,
) {
    let log = || std::fs::read_to_string(log).unwrap_or_default();
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited ({status}): {}", log());
        }
        if readyz_answer(metrics_port).await.0 == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is not ready: {}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
