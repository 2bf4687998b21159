//! PostgreSQL that survives its primary (issue 30): a 3-member Patroni cluster with etcd as its
//! store and synchronous replication (`hack/patroni.sh`), the store connected through a
//! multi-host URL with `target_session_attrs=read-write` as a role that only owns its database.
//! Under write load the primary's Patroni and PostgreSQL are killed with `kill -9`: every
//! acknowledged write is there after the failover (counted), the store reaches the new primary
//! by itself, and a watcher goes on without a gap and without a relist — with
//! `--failover-keeps-epoch` the new timeline is taken for a failover once the history is proven
//! to go on there.
//!
//! Needs (set by `hack/test.sh`): `ETCD` and `patroni` (`MCP_ACCESS_PATRONI_BIN`).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apis::AccessSession;
use apiserver::store::{ListAt, ListQuery, PgStore, Store, StoreConfig, StoreError};
use support::*;

const NS: &str = "ha";
const WRITERS: usize = 4;

/// The cluster `hack/patroni.sh` runs in a directory of its own; stopped when dropped.
struct Patroni {
    dir: PathBuf,
    /// Superuser, every member, the writable one.
    dsn: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../hack/patroni.sh")
}

/// `hack/patroni.sh COMMAND DIR`; its standard output, or a panic with its standard error.
fn patroni_sh(command: &str, dir: &Path) -> String {
    let out = Command::new(script())
        .arg(command)
        .arg(dir)
        .output()
        .expect("run hack/patroni.sh");
    assert!(
        out.status.success(),
        "hack/patroni.sh {command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Patroni {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("mcp-access-ha-{}", uuid::Uuid::new_v4()));
        let dsn = patroni_sh("start", &dir)
            .lines()
            .find_map(|l| l.strip_prefix("PATRONI_DSN="))
            .expect("PATRONI_DSN")
            .trim_matches('\'')
            .to_string();
        Self { dir, dsn }
    }

    /// `kill -9` of the leader's Patroni and PostgreSQL; its name.
    fn kill_primary(&self) -> String {
        patroni_sh("kill-primary", &self.dir).trim().to_string()
    }

    async fn superuser(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.dsn, tokio_postgres::NoTls)
            .await
            .expect("connect to the primary");
        tokio::spawn(conn);
        client
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).status();
        if std::thread::panicking() {
            for m in ["pg0", "pg1", "pg2"] {
                let log =
                    std::fs::read_to_string(self.dir.join(format!("{m}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                eprintln!("--- {m}.log (last lines) ---");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_primary_under_writes_loses_no_acknowledged_write_and_no_watcher_relists() {
    // The store's own account of the failover, shown when the test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("apiserver=info")
        .with_test_writer()
        .try_init();
    let cluster = Patroni::start();
    // A role that owns its database and nothing else (docs/operations.md, "PostgreSQL").
    let admin = cluster.superuser().await;
    for sql in [
        "CREATE ROLE mcp_access LOGIN",
        "CREATE DATABASE mcp_access OWNER mcp_access",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    let dsn = cluster
        .dsn
        .replace("user=postgres", "user=mcp_access")
        .replace("dbname=postgres", "dbname=mcp_access");
    let mut config = StoreConfig::new(tokio_postgres::Config::from_str(&dsn).unwrap());
    config.staleness_bound = Duration::from_secs(2);
    config.pool_timeout = Duration::from_secs(2);
    config.failover_keeps_epoch = true;
    let store = PgStore::start(config).await.expect("the store starts");
    let start = store.current_version().await.unwrap();
    let mut sub = store.subscribe(start).await.unwrap();

    // The watcher: every event in order, until the end of the test or cut off.
    let seen = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let ended = Arc::new(Mutex::new(None::<StoreError>));
    let watcher = {
        let (seen, ended) = (seen.clone(), ended.clone());
        tokio::spawn(async move {
            loop {
                match sub.next().await {
                    Ok(e) => seen.lock().unwrap().push((e.seq(), e.name.clone())),
                    Err(e) => {
                        *ended.lock().unwrap() = Some(e);
                        return;
                    }
                }
            }
        })
    };
    // The writers stop on this; the watcher reads on until the end.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    // Writers: each acknowledged name is recorded; failures during the failover are expected.
    let acked = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let failed = Arc::new(Mutex::new(0usize));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, acked, failed, stop) = (
                store.clone(),
                acked.clone(),
                failed.clone(),
                stop_rx.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0;
                while !*stop.borrow() {
                    let name = format!("w{w}-{n}");
                    n += 1;
                    let write = tokio::time::timeout(
                        Duration::from_secs(10),
                        store.create_session(mk_session(NS, &name, "srv-ha"), false),
                    )
                    .await;
                    match write {
                        Ok(Ok(_)) => acked.lock().unwrap().push((name, Instant::now())),
                        _ => {
                            *failed.lock().unwrap() += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = acked.lock().unwrap().len();
    assert!(before > 0, "no write went through before the failover");
    let killed = cluster.kill_primary();
    let killed_at = Instant::now();
    // Writes go through again, on the new primary, without anyone telling the store.
    let recovered = loop {
        let after_kill = acked
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| *at > killed_at + Duration::from_millis(500))
            .count();
        if after_kill >= 10 {
            break killed_at.elapsed();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(90),
            "writes never resumed after {killed} was killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send_replace(true);
    for w in writers {
        w.await.unwrap();
    }
    let acked: Vec<String> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    eprintln!(
        "killed {killed}: writes resumed {recovered:?} later; {} acknowledged ({before} before \
         the kill), {} failed during the failover",
        acked.len(),
        failed.lock().unwrap()
    );

    // Every acknowledged write is stored.
    let listed = store
        .list::<AccessSession>(&ListQuery {
            namespace: Some(NS.into()),
            labels: Default::default(),
            fields: Default::default(),
            limit: None,
            at: ListAt::Latest,
        })
        .await
        .unwrap();
    let stored: BTreeSet<String> = listed
        .items
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|n| !stored.contains(*n)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // The watcher saw every acknowledged write, in order, once, and was never cut off.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered: BTreeSet<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, n)| n.clone())
            .collect();
        let missing: Vec<&String> = acked.iter().filter(|n| !delivered.contains(*n)).collect();
        if missing.is_empty() {
            break;
        }
        if let Some(e) = ended.lock().unwrap().as_ref() {
            panic!("the watcher was cut off by the failover: {e}");
        }
        let last_seen = seen.lock().unwrap().last().map(|(seq, _)| *seq);
        if Instant::now() >= deadline {
            // Where the feed's connections are, as the primary sees them.
            let primary = cluster.superuser().await;
            for row in primary
                .query(
                    "SELECT application_name, state, backend_start::text, \
                     coalesce(query, '') FROM pg_stat_activity \
                     WHERE application_name LIKE 'mcp-access%'",
                    &[],
                )
                .await
                .unwrap()
            {
                eprintln!(
                    "primary: {} {:?} {} {}",
                    row.get::<_, String>(0),
                    row.get::<_, Option<String>>(1),
                    row.get::<_, String>(2),
                    row.get::<_, String>(3)
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "the watcher is missing {} acknowledged writes (first {:?}); it saw {} events up \
             to seq {last_seen:?}; the store is at {:?}, its feed live: {}",
            missing.len(),
            missing.first(),
            delivered.len(),
            store.current_version().await,
            store.change_feed_live()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seqs: Vec<u64> = seen.lock().unwrap().iter().map(|(s, _)| *s).collect();
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap in the watcher's events");
    }
    assert_eq!(
        store.current_version().await.unwrap().epoch,
        start.epoch,
        "the failover kept the epoch"
    );
    watcher.abort();
}
