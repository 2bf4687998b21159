//! Revoke-to-deny benchmark (run by `hack/bench-revoke.sh`, never by CI).
//!
//! Starts the local cluster once (etcd, kube-apiserver, kube-controller-manager, PostgreSQL and
//! MCP Access behind its APIService), creates an MCPServer with its gateway chain and a
//! Pod-bound token, starts the real `mcp-access-authz` sidecar on the sync listener, then for
//! each gateway count: `count - 1` further cache instances (the library, in this process,
//! each with its own list+watch) connect, and every trial
//! 1. issues a session through kube-apiserver and waits until the sidecar allows it,
//! 2. opens the sidecar's long-poll on it,
//! 3. creates a Revocation of it through kube-apiserver; the clock starts when that write
//!    returns,
//! 4. polls the sidecar's check until it answers 401 `session_revoked` (deny latency) and
//!    notes when the long-poll completed (subscription latency; it can complete before the
//!    write's response arrives, then it counts as 0).
//!
//! Prints p50/p99/max per gateway count. Times are on this machine, ratios between the two
//! counts are the point; nothing here gates anything.
//!
//! Usage: `bench_revoke [--trials N] [--gateways 1,500]`; needs `MCP_ACCESS_APISERVER_BIN`,
//! `MCP_ACCESS_AUTHZ_BIN`, and `KUBE_APISERVER`, `KUBE_CONTROLLER_MANAGER`, `ETCD` (from
//! `hack/build-kube.sh`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    let result = rt.block_on(run(
        cluster,
        args,
        &chain.server_uid,
        &token_file,
        (port, admin_port),
    ));
    drop(sidecar);
    result
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

    let mut load: Vec<(SessionCache, SyncTask)> = Vec::new();
    let mut results = Vec::new();
    for &gateways in &args.gateways {
        // Bring the in-process instances to `gateways - 1`, all synced.
        load.truncate(gateways - 1);
        let started = Instant::now();
        // In batches, each synced before the next starts: thousands of first lists at once
        // would all miss the apiserver's verified-chain cache together (one token here) and
        // flood kube-apiserver with the same TokenReview, which no fleet of gateways with
        // a token each would do.
        while load.len() < gateways - 1 {
            let batch = (gateways - 1 - load.len()).min(START_BATCH);
            for _ in 0..batch {
                let config = CacheConfig::new(cluster.sync_url(), cluster.sync_ca(), token_file);
                load.push(SessionCache::start(config)?);
            }
            for (cache, _) in &load[load.len() - batch..] {
                tokio::time::timeout(Duration::from_secs(120), cache.ready())
                    .await
                    .context("a load cache did not sync within 120 s")?;
            }
        }
        eprintln!(
            "{gateways} gateway(s) connected ({} in-process caches synced in {:.1}s)",
            load.len(),
            started.elapsed().as_secs_f64()
        );

        let mut deny = Vec::with_capacity(args.trials);
        let mut subscription = Vec::with_capacity(args.trials);
        let mut all_deny = Vec::with_capacity(args.trials);
        let mut late = Vec::new();
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
            revocations
                .create(&PostParams::default(), &revocation)
                .await?;
            let written = Instant::now();
            loop {
                let resp = check().await?;
                if resp.status() == 401
                    && resp
                        .headers()
                        .get("x-mcp-deny-reason")
                        .is_some_and(|v| v == "session_revoked")
                {
                    deny.push(written.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                if written.elapsed() > Duration::from_secs(10) {
                    bail!("{name}: not denied within 10 s of the revocation");
                }
            }
            // Every load cache must deny it too: the time until the last one does.
            if !load.is_empty() {
                loop {
                    let now = Timestamp::now();
                    let mut allowing = 0;
                    for (cache, _) in &load {
                        if cache.authorize(NS, &name, now).await.is_allow() {
                            allowing += 1;
                        }
                    }
                    if allowing == 0 {
                        all_deny.push(written.elapsed().as_secs_f64() * 1e3);
                        break;
                    }
                    if written.elapsed() > Duration::from_secs(10) {
                        // Reported, not fatal: how often and how many is the finding.
                        eprintln!("{name}: {allowing} load caches still allow it 10 s after the revocation");
                        late.push(allowing);
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
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
        }
        results.push((gateways, deny, subscription, all_deny, late));
    }

    println!();
    println!(
        "revoke-to-deny through kube-apiserver, {} trials per row, measured from the completed write",
        args.trials
    );
    for (gateways, deny, subscription, all_deny, late) in results {
        println!(
            "gateways {gateways:>4}  deny (sidecar 401 session_revoked): {}",
            summary(deny)
        );
        println!(
            "                subscription (long-poll completes):    {}",
            summary(subscription)
        );
        if !all_deny.is_empty() {
            println!(
                "                every in-process cache denies:         {}",
                summary(all_deny)
            );
        }
        if !late.is_empty() {
            println!(
                "                trials where some caches still allowed after 10 s: {} (most caches at once: {})",
                late.len(),
                late.iter().max().copied().unwrap_or(0)
            );
        }
    }
    Ok(())
}
