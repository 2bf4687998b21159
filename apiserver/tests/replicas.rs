//! Several replicas of the real `mcp-access-apiserver` over one PostgreSQL database (the HA
//! deployment): writes through one are seen in order by watchers on the other, a revocation
//! through one reaches the other's watchers, a `kill -9` during concurrent writes loses no
//! acknowledged write and never opens a gap, a restart (rolling update) makes nobody relist,
//! and a restored dump is detected: every watcher relists.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::replica::{
    assert_committed_as_acknowledged, assert_follows_log, change_log, follow_until, rv_parts,
    Record, Replica, Shared, Writers,
};
use support::server::ADMIN_TOKEN;
use support::watch::Next;
use support::TestDb;

fn dsn_of(db: &TestDb) -> String {
    db.dsn().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_reach_watchers_on_b_in_order_and_so_does_a_revocation() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let a = Replica::start(&shared, "a", &dsn_of(&db), &[]).await;
    let b = Replica::start(&shared, "b", &dsn_of(&db), &[]).await;
    let client = shared.http();

    let from = b.list_rv(&client, "ha").await;
    let mut watch = b.watch(&client, "ha", &from).await.unwrap();
    // Four writers through A at once: the order B shows must be the commit order.
    let mut acked = Vec::new();
    let mut writers = Vec::new();
    for w in 0..4 {
        let (a_url, client) = (a.sessions_url("ha"), client.clone());
        writers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..25 {
                let name = format!("w{w}-{i}");
                let resp = client
                    .post(&a_url)
                    .bearer_auth(ADMIN_TOKEN)
                    .json(&support::replica::session_json(&name))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 201);
                let body: serde_json::Value = resp.json().await.unwrap();
                let rv = body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string();
                mine.push((rv_parts(&rv).1, name));
            }
            mine
        }));
    }
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    acked.sort();
    let mut record = Record::default();
    record
        .follow(&mut watch, Duration::from_secs(10), |r| {
            r.events.len() >= acked.len()
        })
        .await;
    let seen: Vec<(u64, String)> = record
        .events
        .iter()
        .map(|(kind, name, seq)| {
            assert_eq!(kind, "ADDED");
            (*seq, name.clone())
        })
        .collect();
    assert_eq!(
        seen, acked,
        "B's watcher saw A's writes out of order or incompletely"
    );

    // Revocation through A, seen by a watcher on B (the feed a gateway on B reads).
    let mut delays = Vec::new();
    for i in 0..20 {
        let name = format!("rev-{i}");
        let (status, created) = a.create_session(&client, "ha", &name).await.unwrap();
        assert_eq!(status, 201, "{created}");
        let rv = created["metadata"]["resourceVersion"].as_str().unwrap();
        let resp = client
            .get(format!(
                "{}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name={name}",
                b.sessions_url("ha")
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        let mut w = support::watch::WatchStream::lenient(resp);
        let started = Instant::now();
        let revoked = client
            .post(a.revocations_url("ha"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({
                "apiVersion": apis::API_VERSION, "kind": "Revocation",
                "metadata": {"name": format!("r-{i}")},
                "spec": {"target": {"session": name}, "cause": "manual"}
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(revoked.status(), 201);
        loop {
            match w.next(Duration::from_secs(5)).await {
                Next::Event(e) if e["object"]["status"]["phase"] == "Revoked" => break,
                Next::Event(_) => continue,
                other => panic!("no revocation on B: {other:?}"),
            }
        }
        delays.push(started.elapsed());
    }
    delays.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "revocation written through A, seen by a watcher on B (POST sent -> MODIFIED Revoked): \
         p50 {:.1} ms, max {:.1} ms over {} trials",
        ms(delays[delays.len() / 2]),
        ms(*delays.last().unwrap()),
        delays.len()
    );
    // Expected tens of milliseconds (one LISTEN wake-up and a fan-out); 2 s is over 20x.
    assert!(
        *delays.last().unwrap() < Duration::from_secs(2),
        "a revocation took {:?} to reach B",
        delays.last()
    );
}

/// 8 writers through A, A killed with `kill -9` in the middle. Every acknowledged write is
/// committed; every watcher on B sees exactly the change log, in order, once (or is told to
/// relist); nothing is half-applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_under_8_writers_loses_no_acknowledged_write_and_b_never_gaps() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let mut a = Replica::start(&shared, "a", &dsn_of(&db), &[]).await;
    let b = Replica::start(&shared, "b", &dsn_of(&db), &[]).await;
    let client = shared.http();

    let from = b.list_rv(&client, "kill").await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(b.watch(&client, "kill", &from).await.unwrap());
    }
    let watchers = follow_until(
        streams,
        "after-kill",
        Duration::from_secs(30),
        Duration::from_secs(90),
    );
    let urls = (0..8).map(|_| a.sessions_url("kill")).collect();
    let writers = Writers::start(&client, urls, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before_kill = writers.written().acked.len();
    a.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Requests the kill cut off are unanswered: their outcome is checked below.
    let written = writers.stop().await;
    assert!(before_kill > 20, "the writers hardly wrote: {before_kill}");
    assert!(
        written.refused.is_empty(),
        "writes answered otherwise than 201: {:?}",
        written.refused
    );

    // Every acknowledged write is committed, with the resourceVersion it was acknowledged at;
    // nothing is half-applied.
    let pg = db.client().await;
    assert_committed_as_acknowledged(&pg, "kill", rv_parts(&from).1, &written).await;

    // One more write through B after the writers stopped: watchers caught up to it are done.
    let (status, _) = b
        .create_session(&client, "kill", "after-kill")
        .await
        .unwrap();
    assert_eq!(status, 201);
    let log = change_log(&pg, rv_parts(&from).1).await;
    let mut relists = 0;
    for watcher in watchers {
        if assert_follows_log(&watcher.await.unwrap(), &log) {
            relists += 1;
        }
    }
    println!(
        "kill -9 of A under 8 writers: {} writes acknowledged ({before_kill} before the kill), \
         {} committed, {} in flight committed unacknowledged; watchers on B relisted: {relists}/4",
        written.acked.len(),
        log.len() - 1,
        log.len() - 1 - written.acked.len()
    );
}

/// A rolling update: each replica in turn is stopped (SIGTERM) and started again while 1,000
/// watches are open on the two. Watches on the other replica continue; watches on the
/// restarted one resume from their last resourceVersion. Nobody is told to relist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_1000_open_watches_makes_nobody_relist() {
    let db = TestDb::new().await;
    let shared = Shared::new();
    let mut replicas = [
        Replica::start(&shared, "a", &dsn_of(&db), &[]).await,
        Replica::start(&shared, "b", &dsn_of(&db), &[]).await,
    ];
    let client = shared.http();
    let (status, _) = replicas[0]
        .create_session(&client, "roll", "first")
        .await
        .unwrap();
    assert_eq!(status, 201);
    let from = replicas[0].list_rv(&client, "roll").await;

    const WATCHES: usize = 1000;
    let mut streams = Vec::new();
    for i in 0..WATCHES {
        let stream = replicas[i % 2].watch(&client, "roll", &from).await.unwrap();
        streams.push((i % 2, stream, Record::default()));
    }
    let mut relists = 0;
    let mut resumed = 0;
    for round in 0..2 {
        let restarted = round;
        // Everyone sees a write before the restart.
        let name = format!("before-{round}");
        let (status, _) = replicas[1 - restarted]
            .create_session(&client, "roll", &name)
            .await
            .unwrap();
        assert_eq!(status, 201);
        for (_, stream, record) in streams.iter_mut() {
            record
                .follow(stream, Duration::from_secs(10), |r| {
                    r.events.last().is_some_and(|(_, n, _)| *n == name)
                })
                .await;
            assert!(record.error.is_none(), "watch ended: {:?}", record.error);
        }
        replicas[restarted].terminate();
        let logged = replicas[restarted].log().len();
        replicas[restarted].launch(&shared, &[]).await;
        let log = replicas[restarted].log();
        assert!(
            log[logged..].contains("epoch kept") && !log[logged..].contains("epoch rotated"),
            "a restart rotated the epoch: {}",
            &log[logged..]
        );
        let name = format!("after-{round}");
        let (status, _) = replicas[1 - restarted]
            .create_session(&client, "roll", &name)
            .await
            .unwrap();
        assert_eq!(status, 201);
        for (on, stream, record) in streams.iter_mut() {
            record
                .follow(stream, Duration::from_secs(10), |r| {
                    r.events.last().is_some_and(|(_, n, _)| *n == name)
                })
                .await;
            if record.relisted() {
                relists += 1;
            }
            if *on == restarted && record.events.last().is_none_or(|(_, n, _)| *n != name) {
                // Its stream ended with the process: resume where it was, on the new process.
                assert!(
                    record.ended || record.error.is_some(),
                    "a watch on the stopped replica went on"
                );
                let mut again = match replicas[restarted]
                    .watch(&client, "roll", &record.last_rv)
                    .await
                {
                    Ok(s) => s,
                    Err((status, body)) => panic!("resume refused: {status} {body}"),
                };
                record.ended = false;
                record.error = None;
                resumed += 1;
                record
                    .follow(&mut again, Duration::from_secs(10), |r| {
                        r.events.last().is_some_and(|(_, n, _)| *n == name)
                    })
                    .await;
                if record.relisted() {
                    relists += 1;
                }
                *stream = again;
            }
            assert!(
                record.events.last().is_some_and(|(_, n, _)| *n == name),
                "a watcher missed {name}: {:?}",
                record.events.last()
            );
        }
    }
    // Every watcher saw each change exactly once, in order.
    let pg = db.client().await;
    let log = change_log(&pg, rv_parts(&from).1).await;
    for (_, _, record) in &streams {
        assert_eq!(record.events, log);
    }
    println!(
        "rolling restart of 2 replicas with {WATCHES} open watches: relists = {relists}, \
         watches resumed from their resourceVersion = {resumed}"
    );
    assert_eq!(relists, 0);
    assert!(
        resumed > 0,
        "no watch was resumed: the restarts ended no stream"
    );
    // Positive control of `relists == 0`: the same measurement counts a relist when one is
    // due, here a watch resumed across a restart that rotates the epoch.
    let rv = replicas[0].list_rv(&client, "roll").await;
    replicas[0].terminate();
    replicas[0].launch(&shared, &["--rotate-epoch"]).await;
    let mut stream = match replicas[0].watch(&client, "roll", &rv).await {
        Ok(s) => s,
        Err((status, body)) => panic!("the watch was refused: {status} {body}"),
    };
    let mut probe = Record::default();
    probe
        .follow(&mut stream, Duration::from_secs(10), Record::relisted)
        .await;
    assert!(
        probe.relisted(),
        "a rotated epoch did not count as a relist: {:?}",
        probe.error
    );
}

/// A dump of the database restored into a fresh database is another history: replicas started
/// on it rotate the epoch, and a watcher resuming from a resourceVersion of the old database
/// relists (even once the restored history has passed that sequence number).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_restored_into_a_fresh_database_makes_every_watcher_relist() {
    let live = TestDb::new().await;
    let shared = Shared::new();
    let mut a = Replica::start(&shared, "a", &dsn_of(&live), &[]).await;
    let mut b = Replica::start(&shared, "b", &dsn_of(&live), &[]).await;
    let client = shared.http();
    for i in 0..5 {
        let (status, _) = a
            .create_session(&client, "rst", &format!("kept-{i}"))
            .await
            .unwrap();
        assert_eq!(status, 201);
    }
    let dump = shared.dir.join("backup.dump");
    let out = std::process::Command::new(support::replica::pg_bin("pg_dump"))
        .args(["-Fc", "-f"])
        .arg(&dump)
        .arg("-d")
        .arg(live.dsn())
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_dump: {out:?}");
    for i in 0..10 {
        let (status, _) = b
            .create_session(&client, "rst", &format!("lost-{i}"))
            .await
            .unwrap();
        assert_eq!(status, 201);
    }
    let seen = a.list_rv(&client, "rst").await;
    a.terminate();
    b.terminate();

    let restored = TestDb::new().await;
    let out = std::process::Command::new(support::replica::pg_bin("pg_restore"))
        .args(["--no-owner", "-d"])
        .arg(restored.dsn())
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_restore: {out:?}");
    a.dsn = dsn_of(&restored);
    b.dsn = dsn_of(&restored);
    a.launch(&shared, &[]).await;
    b.launch(&shared, &[]).await;
    assert!(a.log().contains("epoch rotated") || b.log().contains("epoch rotated"));
    assert!(
        a.log().contains("a dump restored into a fresh database")
            || b.log().contains("a dump restored into a fresh database"),
        "{}",
        a.log()
    );
    // The restored history goes on past the sequence the watchers had seen.
    for i in 0..15 {
        let (status, _) = a
            .create_session(&client, "rst", &format!("new-{i}"))
            .await
            .unwrap();
        assert_eq!(status, 201);
    }
    for replica in [&a, &b] {
        let mut w = replica.watch(&client, "rst", &seen).await.unwrap();
        let mut record = Record::default();
        record
            .follow(&mut w, Duration::from_secs(10), |_| false)
            .await;
        assert!(
            record.relisted() && record.events.is_empty(),
            "a watcher resumed on the restored database: {record:?}"
        );
        let message = record.error.unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains("change history was reset"), "{message}");
        assert!(!message.contains("fell behind"), "{message}");
    }
}
