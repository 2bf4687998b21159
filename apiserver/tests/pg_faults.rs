//! PostgreSQL faults under real `mcp-access-apiserver` replicas, on a PostgreSQL cluster of the
//! test's own: `kill -9` of the database under load, a file-level copy of the database put
//! back under running replicas, and a connection that stalls (a proxy that stops forwarding).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::replica::{
    assert_committed_as_acknowledged, assert_follows_log, follow_until, rv_parts, OwnPostgres,
    Record, Replica, Shared, Writers,
};
use support::server::ADMIN_TOKEN;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FAST: &[&str] = &[
    "--change-feed-staleness-bound",
    "2s",
    "--database-pool-timeout",
    "2s",
];

fn past(deadline: Instant) -> bool {
    Instant::now() > deadline
}

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

    let mut streams = Vec::new();
    for i in 0..6 {
        let replica = if i % 2 == 0 { &a } else { &b };
        streams.push(replica.watch(&client, "load", &from).await.unwrap());
    }
    let watchers = follow_until(
        streams,
        "after",
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    let urls = (0..8)
        .map(|w| [&a, &b][w % 2].sessions_url("load"))
        .collect();
    let writers = Writers::start(&client, urls, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = writers.written().acked.len();
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
    let acked_while_down: Vec<String> = writers
        .written()
        .acked_at
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
    let written = writers.stop().await;
    let (status, _) = a.create_session(&client, "load", "after").await.unwrap();
    assert_eq!(status, 201);

    assert!(
        written.unanswered.is_empty(),
        "the apiserver left writes unanswered while its database was down: {:?}",
        written.unanswered
    );
    for (_, code, body) in &written.refused {
        assert_status_failure(*code, body);
    }
    let db = pg.client("app").await;
    let log = assert_committed_as_acknowledged(&db, "load", rv_parts(&from).1, &written).await;
    let (mut relisted, mut complete) = (0, 0);
    for watcher in watchers {
        if assert_follows_log(&watcher.await.unwrap(), &log) {
            relisted += 1;
        } else {
            complete += 1;
        }
    }
    let codes: BTreeMap<u16, usize> =
        written
            .refused
            .iter()
            .fold(BTreeMap::new(), |mut m, (_, c, _)| {
                *m.entry(*c).or_default() += 1;
                m
            });
    println!(
        "kill -9 of PostgreSQL under 8 writers: not ready after {not_ready:?}; down {down_for:?}; \
         ready {ready:?} after the restart; {} writes acknowledged ({before} before the kill), {} \
         committed; failed writes by status {codes:?}; watchers: {complete} followed the whole \
         log, {relisted} told to relist (410), 0 gaps",
        written.acked.len(),
        log.len()
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
    // Bookmarks come every second: a watcher that went on would never fall idle, so each
    // follow below also ends at a deadline (and then fails its assertion).
    let deadline = Instant::now() + Duration::from_secs(30);
    for stream in live.iter_mut() {
        let mut record = Record::default();
        record
            .follow(stream, Duration::from_secs(15), |_| past(deadline))
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
    let deadline = Instant::now() + Duration::from_secs(30);
    for replica in [&a, &b] {
        let mut w = replica.watch(&client, "f", &seen).await.unwrap();
        let mut record = Record::default();
        record
            .follow(&mut w, Duration::from_secs(10), |_| past(deadline))
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
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut w = b.watch(&client, "f", &seen).await.unwrap();
    let mut record = Record::default();
    record
        .follow(&mut w, Duration::from_secs(10), |_| past(deadline))
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
        // Expected at most 4 s (--request-timeout); 20 s is 5x that.
        assert!(took < Duration::from_secs(20), "{what} took {took:?}");
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
