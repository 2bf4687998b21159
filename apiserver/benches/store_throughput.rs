//! Committed mutations per second through the store, beside pgbench on the same PostgreSQL.
//!
//! Every store mutation is serialized by the sync-state row lock (DESIGN §3); group commit
//! lets concurrent writers share one commit (one fsync), so 8 writers should reach a multiple
//! of one writer, and of a single pgbench client doing simple writes (`pgbench -N -c 1`).
//! All are measured in this one run, and the ratios are printed. Run through `hack/bench-store.sh`,
//! which starts a throwaway PostgreSQL and sets `MCP_BENCH_DATABASE_URL`.

use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::{AccessSession, AccessSessionSpec, ServerRef};
use apiserver::store::{Context, PgStore, Requester, Store, StoreConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

fn session(ns: &str, name: &str) -> AccessSession {
    let mut s = AccessSession {
        spec: AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: "srv-bench".into(),
            },
            teams: vec!["payments".into()],
            expires_at: Some(Time(Timestamp::now() + SignedDuration::from_hours(1))),
            ..Default::default()
        },
        ..Default::default()
    };
    s.metadata.namespace = Some(ns.into());
    s.metadata.name = Some(name.into());
    s
}

/// Runs `writers` tasks creating sessions for `secs` seconds; returns committed per second.
async fn store_rate(store: &PgStore, writers: usize, secs: u64, tag: &str) -> f64 {
    let committed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let committed = committed.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                store
                    .create(
                        session(&format!("{tag}-w{w}"), &format!("s-{i}")),
                        &Context::new(apiserver::store::now(), Requester::default()),
                        false,
                    )
                    .await
                    .expect("create");
                committed.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    committed.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn pgbench(config: &tokio_postgres::Config, db: &str, args: &[&str]) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or("postgres").to_string();
    let out = Command::new("pgbench")
        .args(["-h", &host, "-p", &port, "-U", &user])
        .args(args)
        .arg(db)
        .output()
        .expect("pgbench runs (it is on PATH with the PostgreSQL client)");
    assert!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pgbench_tps(config: &tokio_postgres::Config, db: &str, clients: usize, secs: u64) -> f64 {
    let clients = clients.to_string();
    let secs = secs.to_string();
    let out = pgbench(
        config,
        db,
        &["-N", "-n", "-c", &clients, "-j", &clients, "-T", &secs],
    );
    out.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("pgbench prints tps")
}

#[tokio::main]
async fn main() {
    let Ok(url) = std::env::var("MCP_BENCH_DATABASE_URL") else {
        eprintln!("MCP_BENCH_DATABASE_URL is not set; run hack/bench-store.sh");
        return;
    };
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let admin = tokio_postgres::Config::from_str(&url).expect("MCP_BENCH_DATABASE_URL parses");
    let (client, conn) = admin.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let db = format!("bench_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let mut config = admin.clone();
    config.dbname(&db);
    pgbench(&config, &db, &["-i", "-q", "-s", "1"]);

    let store = PgStore::start(StoreConfig::new(config.clone()))
        .await
        .expect("store");
    // Warm up connections and prepared statements.
    store_rate(&store, 8, 1, "warm").await;

    // The disk's fsync latency drifts a lot over seconds on shared machines, so the four
    // measurements are interleaved in short rounds and each is reported as its median.
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!("{rounds} interleaved rounds of {secs}s per measurement on one PostgreSQL (fsync on)");
    let (mut pg1, mut pg8, mut store1, mut store8) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        pg1.push(pgbench_tps(&config, &db, 1, secs));
        store1.push(store_rate(&store, 1, secs, &format!("one-{round}")).await);
        store8.push(store_rate(&store, 8, secs, &format!("eight-{round}")).await);
        pg8.push(pgbench_tps(&config, &db, 8, secs));
    }
    let (pg1, pg8, store1, store8) = (median(pg1), median(pg8), median(store1), median(store8));
    println!(
        "pgbench -N, 1 client:             {pg1:>9.0} TPS (ceiling for a serialized write path)"
    );
    println!("pgbench -N, 8 clients:            {pg8:>9.0} TPS");
    println!("store create_session, 1 writer:   {store1:>9.0} mutations/s  ratio to pgbench 1 client: {:.2}", store1 / pg1);
    println!("store create_session, 8 writers:  {store8:>9.0} mutations/s  ratio to pgbench 1 client: {:.2}", store8 / pg1);
    println!(
        "store 8 writers / 1 writer:       {:>9.2}x (group commit)",
        store8 / store1
    );
    let (groups, mutations) = store.write_groups();
    println!(
        "mean write group:                 {:>9.2} mutations per commit ({mutations} in {groups} groups)",
        mutations as f64 / groups.max(1) as f64
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
