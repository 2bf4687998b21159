//! PostgreSQL faults under real `mcp-access-apiserver` replicas, on a PostgreSQL cluster of the
//! test's own: `kill -9` of the database under load, a file-level copy of the database put
//! back under running replicas, and a connection that stalls (a proxy that stops forwarding).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::replica::{change_log, rv_parts, OwnPostgres, Record, Replica, Shared};
use support::server::ADMIN_TOKEN;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FAST: &[&str] = &[
    "--change-feed-staleness-bound",
    "2s",
    "--database-pool-timeout",
    "2s",
];

async fn until(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if check().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what} not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A failed write must be a `Status` of 500 or 503 (never a transport error, never a 2xx).
fn assert_status_failure(code: u16, body: &str) {
    assert!(
        code == 503 || code == 500,
        "a write failed with {code}: {body}"
    );
    let status: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert_eq!(status["kind"], "Status", "{body}");
    assert_eq!(status["code"], code, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_postgres_under_load_fails_cleanly_and_no_watcher_sees_a_gap() {
    let pg = OwnPostgres::start();
    pg.create_database("app").await;
    let shared = Shared::new();
    let a = Replica::start(&shared, "a", &pg.dsn("app"), FAST).await;
    let b = Replica::start(&shared, "b", &pg.dsn("app"), FAST).await;
    let client = shared.http();
    let from = a.list_rv(&client, "load").await;

    let mut watchers = Vec::new();
    for i in 0..6 {
        let replica = if i % 2 == 0 { &a } else { &b };
        let mut stream = replica.watch(&client, "load", &from).await.unwrap();
        watchers.push(tokio::spawn(async move {
            let mut record = Record::default();
            let done = |r: &Record| r.events.iter().any(|(_, n, _)| n == "after");
            let _ = tokio::time::timeout(
                Duration::from_secs(120),
                record.follow(&mut stream, Duration::from_secs(60), done),
            )
            .await;
            record
        }));
    }

    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let acked_at: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let failures = Arc::new(Mutex::new(Vec::<(u16, String)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let acked_at = acked_at.clone();
        let url = if w % 2 == 0 {
            a.sessions_url("load")
        } else {
            b.sessions_url("load")
        };
        let (client, acked, failures, stop) = (
            client.clone(),
            acked.clone(),
            failures.clone(),
            stop.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{i}");
                i += 1;
                let resp = client
                    .post(&url)
                    .bearer_auth(ADMIN_TOKEN)
                    .json(&support::replica::session_json(&name))
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .expect("the apiserver answers while its database is down");
                let code = resp.status().as_u16();
                let body = resp.text().await.unwrap();
                if code == 201 {
                    let v: Value = serde_json::from_str(&body).unwrap();
                    let rv = v["metadata"]["resourceVersion"].as_str().unwrap();
                    acked_at
                        .lock()
                        .unwrap()
                        .push((Instant::now(), name.clone()));
                    acked.lock().unwrap().insert(name, rv_parts(rv).1);
                } else {
                    failures.lock().unwrap().push((code, body));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = acked.lock().unwrap().len();
    pg.kill9();
    let killed = Instant::now();
    let not_ready = until(
        "both replicas not ready",
        Duration::from_secs(15),
        async || a.readyz().await != 200 && b.readyz().await != 200,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Responses to writes committed just before the kill may still arrive after it; a second
    // later nothing can be acknowledged.
    let settled = killed + Duration::from_secs(1);
    let acked_while_down: Vec<String> = acked_at
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at > settled)
        .map(|(_, name)| name.clone())
        .collect();
    pg.run();
    let restarted = Instant::now();
    let ready = until(
        "both replicas ready again",
        Duration::from_secs(30),
        async || a.readyz().await == 200 && b.readyz().await == 200,
    )
    .await;
    let down_for = restarted - killed;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let (status, _) = a.create_session(&client, "load", "after").await.unwrap();
    assert_eq!(status, 201);

    let failures = failures.lock().unwrap().clone();
    for (code, body) in &failures {
        assert_status_failure(*code, body);
    }
    let db = pg.client("app").await;
    let log = change_log(&db, rv_parts(&from).1).await;
    let logged: BTreeMap<String, u64> = log
        .iter()
        .map(|(_, name, seq)| (name.clone(), *seq))
        .collect();
    let acked = acked.lock().unwrap().clone();
    for (name, seq) in &acked {
        assert_eq!(
            logged.get(name),
            Some(seq),
            "acknowledged {name} is not in the log"
        );
    }
    let objects: BTreeSet<String> = db
        .query(
            "SELECT name FROM objects WHERE resource = 'accesssessions' AND namespace = 'load'",
            &[],
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
    let mut relisted = 0;
    let mut complete = 0;
    for watcher in watchers {
        let record = watcher.await.unwrap();
        let prefix = &log[..record.events.len().min(log.len())];
        assert_eq!(
            record.events, prefix,
            "a watcher's events differ from the change log"
        );
        if record.relisted() {
            relisted += 1;
        } else {
            assert_eq!(
                record.events.len(),
                log.len(),
                "a watcher stopped short without a 410"
            );
            complete += 1;
        }
    }
    let codes: BTreeMap<u16, usize> = failures.iter().fold(BTreeMap::new(), |mut m, (c, _)| {
        *m.entry(*c).or_default() += 1;
        m
    });
    println!(
        "kill -9 of PostgreSQL under 8 writers: not ready after {not_ready:?}; down {down_for:?}; \
         ready {ready:?} after the restart; {} writes acknowledged ({before} before the kill), {} \
         committed; failed writes by status {codes:?}; watchers: {complete} followed the whole \
         log, {relisted} told to relist (410), 0 gaps",
        acked.len(),
        logged.len()
    );
    assert!(
        acked_while_down.is_empty(),
        "writes acknowledged while the database was down: {acked_while_down:?}"
    );
    // A crash and restart of the same database is the same history: the epoch stays.
    for replica in [&a, &b] {
        let log = replica.log();
        assert!(
            !log.contains("the change history was reset") && !log.contains("the epoch changed"),
            "a restart of PostgreSQL rotated the epoch: {log}"
        );
    }
    let rv_after = a.list_rv(&client, "load").await;
    assert_eq!(
        rv_parts(&rv_after).0,
        rv_parts(&from).0,
        "the epoch changed"
    );
}

/// A file-level copy of the cluster taken earlier is put back while the replicas run. The
/// system identifier, timeline and OIDs are those of the live history; what gives it away is
/// what the running replicas remember. Every watcher relists, including one resuming from a
/// resourceVersion that the restored history has passed meanwhile. Then the same restore
/// with no replica running, which nothing in the database reveals: the operator's marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_level_copy_put_back_makes_every_watcher_relist() {
    let pg = OwnPostgres::start();
    pg.create_database("app").await;
    let shared = Shared::new();
    let mut a = Replica::start(&shared, "a", &pg.dsn("app"), FAST).await;
    let mut b = Replica::start(&shared, "b", &pg.dsn("app"), FAST).await;
    let client = shared.http();
    for i in 0..5 {
        assert_eq!(
            a.create_session(&client, "f", &format!("kept-{i}"))
                .await
                .unwrap()
                .0,
            201
        );
    }
    pg.stop();
    let copy = pg.copy_files("copy");
    pg.run();
    for replica in [&mut a, &mut b] {
        replica.wait_ready(Duration::from_secs(30)).await;
    }
    for i in 0..15 {
        assert_eq!(
            b.create_session(&client, "f", &format!("lost-{i}"))
                .await
                .unwrap()
                .0,
            201
        );
    }
    let seen = a.list_rv(&client, "f").await;
    let mut live = Vec::new();
    for replica in [&a, &b, &a, &b] {
        live.push(replica.watch(&client, "f", &seen).await.unwrap());
    }

    pg.stop();
    pg.restore_files(&copy);
    pg.run();
    // The restored history goes on at once, past the sequence the watchers saw. A write that
    // hangs counts as failed (and the deadline below still holds).
    let mut written = 0;
    let started = Instant::now();
    while written < 25 {
        let name = format!("new-{written}");
        let create = b.create_session(&client, "f", &name);
        if let Ok(Ok((201, _))) = tokio::time::timeout(Duration::from_secs(10), create).await {
            written += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "writes never resumed"
        );
    }
    for stream in live.iter_mut() {
        let mut record = Record::default();
        record
            .follow(stream, Duration::from_secs(15), |_| false)
            .await;
        assert!(
            record.events.iter().all(|(_, n, _)| !n.starts_with("new-")),
            "a watcher of the old history was fed the restored one: {record:?}"
        );
        assert!(
            record.relisted() || record.ended,
            "a watcher went on: {record:?}"
        );
    }
    let detected = [&a, &b].iter().any(|r| {
        let log = r.log();
        log.contains("the change history went back") || log.contains("is not the one this replica")
    });
    assert!(
        detected,
        "no replica noticed the restore: {}\n{}",
        a.log(),
        b.log()
    );
    for replica in [&a, &b] {
        let mut w = replica.watch(&client, "f", &seen).await.unwrap();
        let mut record = Record::default();
        record
            .follow(&mut w, Duration::from_secs(10), |_| false)
            .await;
        assert!(
            record.relisted() && record.events.is_empty(),
            "resumed: {record:?}"
        );
        let message = record.error.unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains("change history was reset"), "{message}");
    }

    // The same copy put back while no replica runs: the marker makes the next start rotate.
    let seen = a.list_rv(&client, "f").await;
    a.terminate();
    b.terminate();
    pg.stop();
    pg.restore_files(&copy);
    pg.run();
    pg.client("app")
        .await
        .batch_execute("UPDATE sync_state SET rotate_requested = true")
        .await
        .unwrap();
    a.launch(&shared, &[]).await;
    b.launch(&shared, &[]).await;
    assert!(
        a.log().contains("the database was marked restored"),
        "{}",
        a.log()
    );
    for i in 0..30 {
        assert_eq!(
            a.create_session(&client, "f", &format!("again-{i}"))
                .await
                .unwrap()
                .0,
            201
        );
    }
    let mut w = b.watch(&client, "f", &seen).await.unwrap();
    let mut record = Record::default();
    record
        .follow(&mut w, Duration::from_secs(10), |_| false)
        .await;
    assert!(
        record.relisted() && record.events.is_empty(),
        "resumed: {record:?}"
    );
    let marker: bool = pg
        .client("app")
        .await
        .query_one("SELECT rotate_requested FROM sync_state", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!marker, "the marker was not cleared by the rotation");
}

/// A loopback TCP proxy in front of PostgreSQL that can stop forwarding (both ways) while
/// keeping every connection open: the peer's kernel acknowledges what is sent, so neither
/// keepalives nor TCP_USER_TIMEOUT fire.
struct StallingProxy {
    port: u16,
    stalled: tokio::sync::watch::Sender<bool>,
}

impl StallingProxy {
    async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stalled, _) = tokio::sync::watch::channel(false);
        let stall = stalled.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, stall.subscribe()));
                tokio::spawn(pump(ur, dw, stall.subscribe()));
            }
        });
        Self { port, stalled }
    }

    fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while *stalled.borrow_and_update() {
            if stalled.changed().await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            n = from.read(&mut buf) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = stalled.changed() => continue,
        };
        // Read just before a stall: held until forwarding resumes.
        while *stalled.borrow_and_update() {
            if stalled.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_database_connection_ends_in_503_and_not_ready_not_a_hang() {
    let pg = OwnPostgres::start();
    pg.create_database("app").await;
    let proxy = StallingProxy::start(pg.port).await;
    let shared = Shared::new();
    let dsn = format!(
        "host=127.0.0.1 port={} user=postgres dbname=app",
        proxy.port
    );
    let a = Replica::start(
        &shared,
        "a",
        &dsn,
        &[
            "--change-feed-staleness-bound",
            "2s",
            "--database-pool-timeout",
            "2s",
            "--database-statement-timeout",
            "2s",
            "--request-timeout",
            "4s",
        ],
    )
    .await;
    let client = shared.http();
    assert_eq!(
        a.create_session(&client, "st", "before").await.unwrap().0,
        201
    );

    proxy.stall(true);
    let stalled = Instant::now();
    let not_ready = until("not ready", Duration::from_secs(15), async || {
        a.readyz().await != 200
    })
    .await;
    let mut answered = Vec::new();
    for (what, request) in [
        (
            "get",
            client.get(format!("{}/before", a.sessions_url("st"))),
        ),
        ("list", client.get(a.sessions_url("st"))),
        (
            "create",
            client
                .post(a.sessions_url("st"))
                .json(&support::replica::session_json("during")),
        ),
    ] {
        let started = Instant::now();
        let resp = request
            .bearer_auth(ADMIN_TOKEN)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what} hung or failed: {e}"));
        let took = started.elapsed();
        let code = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert_eq!(code, 503, "{what}: {body}");
        let status: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert!(took < Duration::from_secs(10), "{what} took {took:?}");
        answered.push(format!("{what} 503 after {took:?}"));
    }
    proxy.stall(false);
    let recovered = until("ready again", Duration::from_secs(60), async || {
        a.readyz().await == 200
    })
    .await;
    let resumed = until("writes again", Duration::from_secs(60), async || {
        matches!(
            a.create_session(
                &client,
                "st",
                &format!("after-{}", uuid::Uuid::new_v4().simple())
            )
            .await,
            Ok((201, _))
        )
    })
    .await;
    println!(
        "stalled database connection: not ready after {not_ready:?}; {}; stalled for {:?}; \
         ready {recovered:?} and writing {resumed:?} after forwarding resumed",
        answered.join(", "),
        stalled.elapsed() - recovered - resumed
    );
}
