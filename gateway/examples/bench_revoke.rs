//! Revoke-to-deny benchmark (run by `hack/bench-revoke.sh`, never by CI).
//!
//! Starts the local cluster once (etcd, kube-apiserver, kube-controller-manager, PostgreSQL and
//! MCP Access behind its APIService), creates an MCPServer with its gateway chain and a
//! Pod-bound token, starts the real `mcp-access-authz` sidecar on the sync listener, then for
//! each gateway count: `count - 1` further cache instances (the library, each with its own
//! list+watch) connect from worker processes of at most [`PER_WORKER`] caches each — this
//! process only drives the trials and never shares a runtime with a measured cache — and every
//! trial
//! 1. issues a session through kube-apiserver and waits until the sidecar and every worker's
//!    caches allow it (the workers then subscribe each cache to it),
//! 2. opens the sidecar's long-poll on it,
//! 3. creates a Revocation of it through kube-apiserver; the clock starts when that write
//!    returns,
//! 4. notes when the long-poll completed (subscription latency; it can complete before the
//!    write's response arrives, then it counts as 0), then asks the sidecar's check until it
//!    answers 401 `session_revoked` (deny latency; asked only once the long-poll completed, 1 ms
//!    apart: a tight loop of checks during the fan-out would take a core from the caches
//!    measured), and collects from each worker when its last cache denied (by the wall clock,
//!    which every process on this machine shares) and how many caches still allowed past the
//!    lag bound,
//! 5. reads the CPU time the apiserver, the sidecar and the workers spent from the write until
//!    the last cache denied (`/proc/PID/stat`), printed per cache per revocation with the floor
//!    it puts under the time until every cache denies on two cores.
//!
//! Prints p50/p99/max per gateway count, and last one line per count:
//! `revoke-to-deny gateways=N p50_ms=… p99_ms=… max_ms=… late=K`, from the completed write until
//! every cache denies (the sidecar included), K the caches that still allowed after the lag
//! bound (2 s) summed over the trials. Times are on this machine; nothing here gates anything.
//!
//! Usage: `bench_revoke [--trials N] [--gateways 1,500]`; needs `MCP_ACCESS_APISERVER_BIN`,
//! `MCP_ACCESS_AUTHZ_BIN`, and `KUBE_APISERVER`, `KUBE_CONTROLLER_MANAGER`, `ETCD` (from
//! `hack/build-kube.sh`). `bench_revoke --worker N SYNC_URL CA_FILE TOKEN_FILE` is a worker
//! (started by the bench itself): N caches, driven over stdin/stdout.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use apis::{
    AccessSession, AccessSessionSpec, Revocation, RevocationSpec, RevocationTarget, ServerRef,
};
use e2e::{Database, LocalCluster, Options};
use gateway::{CacheConfig, SessionCache, SyncTask};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

const NS: &str = "bench-revoke";
/// Load caches started at once.
const START_BATCH: usize = 250;
/// Caches per worker process.
const PER_WORKER: usize = 2500;
/// A cache that still allows a revoked session this long after the write is late.
const LAG_BOUND: Duration = gateway::config::DEFAULT_MAX_LAG;

/// Nanoseconds since the Unix epoch by the wall clock: comparable across this machine's
/// processes.
fn wall_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

struct Args {
    trials: usize,
    gateways: Vec<usize>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        trials: 200,
        gateways: vec![1, 500],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--trials" => args.trials = value.parse()?,
            "--gateways" => {
                args.gateways = value
                    .split(',')
                    .map(|v| v.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if args.gateways.contains(&0) {
        bail!("a gateway count must be at least 1 (the sidecar)");
    }
    Ok(args)
}

fn need(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run hack/bench-revoke.sh"))
}

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--worker") {
        return worker::main();
    }
    let args = parse_args()?;
    let max_gateways = args.gateways.iter().copied().max().unwrap_or(1);
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-bench-{}",
        uuid::Uuid::new_v4().simple()
    ));
    // Every cache instance holds one watch as the same service account.
    let cluster = LocalCluster::start(Options {
        dir: dir.clone(),
        apiserver_bin: PathBuf::from(need("MCP_ACCESS_APISERVER_BIN")?),
        database: Database::Local,
        apiserver_args: vec![
            format!("--max-watches-per-user={}", max_gateways * 2 + 100),
            format!("--max-requests-inflight={}", max_gateways * 2 + 400),
        ],
        node: false,
    })?;
    let result = bench(&cluster, &args);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The sidecar process; killed on drop.
struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(cluster: &LocalCluster, args: &Args) -> Result<()> {
    let out = cluster.kubectl(&["create", "namespace", NS]);
    if !out.success {
        bail!("create namespace: {}", out.stderr);
    }
    let chain = cluster.create_gateway_chain(NS, "bench")?;
    let token = cluster.gateway_token(&chain)?;
    let token_file = cluster.dir.join("bench-gateway.token");
    std::fs::write(&token_file, token)?;
    let log = std::fs::File::create(cluster.dir.join("logs/authz-bench.log"))?;
    let mut sidecar = Sidecar(
        Command::new(need("MCP_ACCESS_AUTHZ_BIN")?)
            .args(["--sync-url", &cluster.sync_url()])
            .arg("--ca-file")
            .arg(cluster.sync_ca())
            .arg("--token-file")
            .arg(&token_file)
            // Port 0: the process says which ports it bound.
            .args(["--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0"])
            // The cache's revoke-to-deny, by session name: no token needed for what is measured.
            .arg("--trust-session-header")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(Stdio::piped())
            .spawn()
            .context("start mcp-access-authz")?,
    );
    let stderr = sidecar.0.stderr.take().context("no stderr")?;
    let ports = e2e::listening::follow("mcp-access-authz", stderr, log)
        .ports(&["check", "admin"], e2e::listening::LISTEN_TIMEOUT)
        .map_err(anyhow::Error::msg)?;
    let (port, admin_port) = (ports[0], ports[1]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let sidecar_pid = Some(sidecar.0.id());
    let result = rt.block_on(run(
        cluster,
        args,
        &chain.server_uid,
        &token_file,
        (port, admin_port),
        sidecar_pid,
    ));
    drop(sidecar);
    result
}

/// The cores of the machine the bench was written for (and its figures are read against).
const CORES: usize = 2;

/// Clock ticks per second of `/proc/PID/stat`'s CPU times.
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// User plus system CPU time of a process so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command (which may hold spaces), from the 3rd on.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are the 14th and 15th fields: 12th and 13th after the command.
    field(11) + field(12)
}

/// The processes whose CPU a revocation costs: the apiserver that fans it out, and the
/// sidecar and the workers whose caches apply it.
struct Processes {
    apiserver: Option<u32>,
    sidecar: Option<u32>,
    workers: Vec<u32>,
}

impl Processes {
    fn cpu(&self) -> CpuTime {
        CpuTime {
            apiserver: self.apiserver.map_or(0, cpu_ticks),
            caches: self.sidecar.map_or(0, cpu_ticks)
                + self.workers.iter().map(|p| cpu_ticks(*p)).sum::<u64>(),
        }
    }
}

/// CPU time in clock ticks.
#[derive(Default, Clone, Copy)]
struct CpuTime {
    apiserver: u64,
    caches: u64,
}

impl CpuTime {
    /// What `processes` spent since this reading.
    fn since(&self, processes: &Processes) -> CpuTime {
        let now = processes.cpu();
        CpuTime {
            apiserver: now.apiserver.saturating_sub(self.apiserver),
            caches: now.caches.saturating_sub(self.caches),
        }
    }

    fn add(&mut self, other: &CpuTime) {
        self.apiserver += other.apiserver;
        self.caches += other.caches;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    format!(
        "p50 {:7.2} ms  p99 {:7.2} ms  max {:7.2} ms",
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN)
    )
}

async fn run(
    cluster: &LocalCluster,
    args: &Args,
    server_uid: &str,
    token_file: &std::path::Path,
    (port, admin_port): (u16, u16),
    sidecar_pid: Option<u32>,
) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let sessions: Api<AccessSession> = Api::namespaced(client.clone(), NS);
    let revocations: Api<Revocation> = Api::namespaced(client, NS);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let admin = format!("http://127.0.0.1:{admin_port}");

    let deadline = Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("{admin}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        if Instant::now() > deadline {
            bail!("the sidecar did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut results = Vec::new();
    for &gateways in &args.gateways {
        let started = Instant::now();
        let mut workers = Vec::new();
        let mut left = gateways - 1;
        // One worker at a time, each syncing in batches: thousands of first lists at once
        // would all miss the apiserver's verified-chain cache together (one token here) and
        // flood kube-apiserver with the same TokenReview, which no fleet of gateways with a
        // token each would do.
        while left > 0 {
            let n = left.min(PER_WORKER);
            workers.push(worker::Worker::start(n, cluster, token_file).await?);
            left -= n;
        }
        eprintln!(
            "{gateways} gateway(s) connected ({} caches in {} worker process(es), synced in {:.1}s)",
            gateways - 1,
            workers.len(),
            started.elapsed().as_secs_f64()
        );

        let mut deny = Vec::with_capacity(args.trials);
        let mut subscription = Vec::with_capacity(args.trials);
        let mut all_deny = Vec::with_capacity(args.trials);
        let mut late = 0usize;
        let processes = Processes {
            apiserver: cluster.apiserver_pid(),
            sidecar: sidecar_pid,
            workers: workers.iter().filter_map(|w| w.pid()).collect(),
        };
        let mut cpu = CpuTime::default();
        for trial in 0..args.trials {
            let name = format!("s-{gateways}-{trial}");
            let session = AccessSession {
                api_version: apis::API_VERSION.into(),
                kind: "AccessSession".into(),
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(NS.into()),
                    ..Default::default()
                },
                spec: AccessSessionSpec {
                    server: ServerRef {
                        name: "bench".into(),
                        uid: server_uid.into(),
                    },
                    teams: vec!["bench".into()],
                    expires_at: Some(Time(Timestamp::now() + SignedDuration::from_hours(1))),
                    ..Default::default()
                },
                status: None,
            };
            sessions.create(&PostParams::default(), &session).await?;
            let check = || {
                http.post(format!("{base}/mcp"))
                    .header("X-MCP-Session", format!("{NS}/{name}"))
                    .send()
            };
            let wait_start = Instant::now();
            while check().await?.status() != 200 {
                if wait_start.elapsed() > Duration::from_secs(10) {
                    bail!("{name} was never allowed");
                }
            }
            for w in &mut workers {
                w.send(&format!("ARM {name}")).await?;
            }
            for w in &mut workers {
                w.expect(&format!("ARMED {name}")).await?;
            }
            let poll_url = format!("{admin}/v1/sessions/{NS}/{name}/revoked");
            let poll_client = http.clone();
            let poll = tokio::spawn(async move {
                let resp = poll_client.get(poll_url).send().await?;
                let done = Instant::now();
                let body: serde_json::Value = resp.json().await?;
                anyhow::Ok((
                    done,
                    body["reason"].as_str().unwrap_or_default().to_string(),
                ))
            });
            // Let the long-poll reach the sidecar before the revocation.
            tokio::time::sleep(Duration::from_millis(20)).await;

            let revocation = Revocation {
                api_version: apis::API_VERSION.into(),
                kind: "Revocation".into(),
                metadata: ObjectMeta {
                    name: Some(format!("rvk-{name}")),
                    namespace: Some(NS.into()),
                    ..Default::default()
                },
                spec: RevocationSpec {
                    target: RevocationTarget {
                        session: Some(name.clone()),
                        ..Default::default()
                    },
                    cause: "compromised".into(),
                    ..Default::default()
                },
                status: None,
            };
            let cpu_before = processes.cpu();
            revocations
                .create(&PostParams::default(), &revocation)
                .await?;
            let written = Instant::now();
            let written_wall = wall_nanos();
            for w in &mut workers {
                w.send(&format!("WRITTEN {name} {written_wall}")).await?;
            }
            // The sidecar's long-poll completes when its cache applied the revocation; its
            // check is asked only then, not in a loop while the fan-out runs (a tight loop of
            // checks would take one of the two cores from the caches being measured).
            let (done, reason) = tokio::time::timeout(Duration::from_secs(10), poll)
                .await
                .context("the long-poll did not complete")???;
            if reason != "session_revoked" {
                bail!("{name}: the long-poll answered {reason}");
            }
            subscription.push(
                done.checked_duration_since(written)
                    .unwrap_or_default()
                    .as_secs_f64()
                    * 1e3,
            );
            let sidecar_denied;
            loop {
                let resp = check().await?;
                if resp.status() == 401
                    && resp
                        .headers()
                        .get("x-mcp-deny-reason")
                        .is_some_and(|v| v == "session_revoked")
                {
                    sidecar_denied = written.elapsed().as_secs_f64() * 1e3;
                    deny.push(sidecar_denied);
                    break;
                }
                if written.elapsed() > Duration::from_secs(10) {
                    bail!("{name}: not denied within 10 s of the revocation");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if sidecar_denied > LAG_BOUND.as_secs_f64() * 1e3 {
                late += 1;
            }
            // Every cache must deny it too: the time until the last one does.
            let mut last_ms = sidecar_denied;
            for w in &mut workers {
                let (last_wall, late_here) = w.denied(&name).await?;
                let ms = last_wall.saturating_sub(written_wall) as f64 / 1e6;
                last_ms = last_ms.max(ms);
                if late_here > 0 {
                    // Reported, not fatal: how often and how many is the finding.
                    eprintln!("{name}: {late_here} caches still allowed it after the lag bound");
                    late += late_here;
                }
            }
            all_deny.push(last_ms);
            cpu.add(&cpu_before.since(&processes));
        }
        results.push((gateways, deny, subscription, all_deny, late, cpu));
        for w in workers {
            w.stop().await;
        }
    }

    println!();
    println!(
        "revoke-to-deny through kube-apiserver, {} trials per row, measured from the completed write",
        args.trials
    );
    let mut last_lines = Vec::new();
    for (gateways, deny, subscription, mut all_deny, late, cpu) in results {
        println!(
            "gateways {gateways:>5}  deny (sidecar 401 session_revoked): {}",
            summary(deny)
        );
        println!(
            "                 subscription (long-poll completes):    {}",
            summary(subscription)
        );
        println!(
            "                 every cache denies:                    {}",
            summary(all_deny.clone())
        );
        // CPU per cache and revocation, from the write until the last cache denied: what
        // the two cores must spend on every cache, whatever the scheduling. Spent across
        // `CORES` cores at best, it is a floor under the time until every cache denies.
        let deliveries = (args.trials * gateways) as f64;
        let per = |ticks: u64| ticks as f64 * 1e6 / ticks_per_second() / deliveries;
        let (api_us, caches_us) = (per(cpu.apiserver), per(cpu.caches));
        println!(
            "                 CPU per cache per revocation:          apiserver {api_us:.1} µs, caches {caches_us:.1} µs; \
             {gateways} caches on {CORES} cores: at least {:.1} ms",
            (api_us + caches_us) * gateways as f64 / CORES as f64 / 1e3
        );
        all_deny.sort_by(f64::total_cmp);
        last_lines.push(format!(
            "revoke-to-deny gateways={gateways} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} late={late}",
            percentile(&all_deny, 50.0),
            percentile(&all_deny, 99.0),
            all_deny.last().copied().unwrap_or(f64::NAN)
        ));
    }
    for line in last_lines {
        println!("{line}");
    }
    Ok(())
}

/// The worker processes that hold the load caches, and their side of the protocol.
mod worker {
    use std::collections::HashMap;

    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
    use tokio::process::{ChildStdin, ChildStdout};

    /// A worker process as the bench drives it.
    pub struct Worker {
        child: tokio::process::Child,
        stdin: ChildStdin,
        lines: Lines<BufReader<ChildStdout>>,
    }

    impl Worker {
        /// Starts a worker with `n` caches and waits until all of them are synced.
        pub async fn start(
            n: usize,
            cluster: &LocalCluster,
            token_file: &std::path::Path,
        ) -> Result<Self> {
            let mut child = tokio::process::Command::new(std::env::current_exe()?)
                .arg("--worker")
                .arg(n.to_string())
                .arg(cluster.sync_url())
                .arg(cluster.sync_ca())
                .arg(token_file)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("start a worker")?;
            let stdin = child.stdin.take().context("no stdin")?;
            let stdout = child.stdout.take().context("no stdout")?;
            let mut worker = Self {
                child,
                stdin,
                lines: BufReader::new(stdout).lines(),
            };
            worker.expect("READY").await?;
            Ok(worker)
        }

        pub fn pid(&self) -> Option<u32> {
            self.child.id()
        }

        pub async fn send(&mut self, line: &str) -> Result<()> {
            self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
            self.stdin.flush().await?;
            Ok(())
        }

        async fn line(&mut self) -> Result<String> {
            let line = tokio::time::timeout(Duration::from_secs(300), self.lines.next_line())
                .await
                .context("a worker said nothing for 300 s")??;
            line.context("a worker exited")
        }

        pub async fn expect(&mut self, want: &str) -> Result<()> {
            let line = self.line().await?;
            if line != want {
                bail!("a worker said {line:?}, not {want:?}");
            }
            Ok(())
        }

        /// When the worker's last cache denied `name` (wall-clock nanoseconds) and how many
        /// of its caches still allowed it after the lag bound.
        pub async fn denied(&mut self, name: &str) -> Result<(u128, usize)> {
            let line = self.line().await?;
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some("DENIED"), Some(n), Some(at), Some(late)) if n == name => {
                    Ok((at.parse()?, late.parse()?))
                }
                _ => bail!("a worker said {line:?}, not DENIED {name}"),
            }
        }

        pub async fn stop(mut self) {
            drop(self.stdin);
            let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
            let _ = self.child.kill().await;
        }
    }

    /// `bench_revoke --worker N SYNC_URL CA_FILE TOKEN_FILE`: N caches in this process; on
    /// stdin `ARM name` (answered `ARMED name` once every cache allows it and watches it) and
    /// `WRITTEN name nanos` (answered `DENIED name last_nanos late`).
    pub fn main() -> Result<()> {
        let args: Vec<String> = std::env::args().skip(2).collect();
        let [n, sync_url, ca, token] = args.as_slice() else {
            bail!("usage: bench_revoke --worker N SYNC_URL CA_FILE TOKEN_FILE");
        };
        let n: usize = n.parse()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        rt.block_on(serve(n, sync_url, ca, token))
    }

    async fn serve(n: usize, sync_url: &str, ca: &str, token: &str) -> Result<()> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut caches: Vec<(SessionCache, SyncTask)> = Vec::with_capacity(n);
        while caches.len() < n {
            let batch = (n - caches.len()).min(START_BATCH);
            for _ in 0..batch {
                let mut config = CacheConfig::new(sync_url, ca, token);
                // What is measured arrives by the watch: a miss while waiting for it must not
                // become one GET per cache per trial.
                config.miss_concurrency = 0;
                caches.push(SessionCache::start(config)?);
            }
            for (cache, _) in &caches[caches.len() - batch..] {
                tokio::time::timeout(Duration::from_secs(120), cache.ready())
                    .await
                    .context("a load cache did not sync within 120 s")?;
            }
        }
        let mut out = tokio::io::stdout();
        out.write_all(b"READY\n").await?;
        out.flush().await?;
        let mut armed: HashMap<String, Vec<tokio::task::JoinHandle<u128>>> = HashMap::new();
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let parts: Vec<&str> = line.split(' ').collect();
            let reply = match parts.as_slice() {
                ["ARM", name] => {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    for (cache, _) in &caches {
                        while !cache.authorize(NS, name, Timestamp::now()).await.is_allow() {
                            if Instant::now() > deadline {
                                bail!("{name} was not allowed by every cache within 30 s");
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                    let watches = caches
                        .iter()
                        .map(|(cache, _)| {
                            let denied = cache.subscribe(NS, name);
                            tokio::spawn(async move {
                                denied.await;
                                wall_nanos()
                            })
                        })
                        .collect();
                    armed.insert(name.to_string(), watches);
                    format!("ARMED {name}")
                }
                ["WRITTEN", name, written] => {
                    let written: u128 = written.parse()?;
                    let bound = written + LAG_BOUND.as_nanos();
                    let watches = armed.remove(*name).context("WRITTEN before ARM")?;
                    let (mut last, mut late) = (0u128, 0usize);
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    for watch in watches {
                        match tokio::time::timeout_at(deadline, watch).await {
                            Ok(Ok(at)) => {
                                last = last.max(at);
                                if at > bound {
                                    late += 1;
                                }
                            }
                            _ => {
                                late += 1;
                                last = last.max(wall_nanos());
                            }
                        }
                    }
                    format!("DENIED {name} {last} {late}")
                }
                _ => bail!("unknown command {line:?}"),
            };
            out.write_all(format!("{reply}\n").as_bytes()).await?;
            out.flush().await?;
        }
        Ok(())
    }
}
