//! The change log under concurrency: consistent paginated snapshots, gap-free ordered
//! delivery, retention and epoch expiry, slow subscribers, agent deactivation races.

mod support;

use apis::rules::SessionRuleError;
use apiserver::store::Refusal;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use support::StoreExt;

use apis::selector::FieldSelector;
use apis::{AccessSession, Kind, SessionPhase};
use apiserver::store::{
    ContinueToken, ListAt, ListQuery, PgStore, Preconditions, ResourceVersion, Store, StoreConfig,
    StoreError,
};
use support::*;

fn key(s: &AccessSession) -> String {
    format!(
        "{}/{}",
        s.metadata.namespace.as_deref().unwrap_or(""),
        s.metadata.name.as_deref().unwrap_or("")
    )
}

/// Everything a client sees of an object, resourceVersion included.
fn digest(items: &[AccessSession]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|s| (key(s), serde_json::to_string(s).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paginated_list_at_one_version_while_writes_land() {
    let db = TestDb::new().await;
    let store = db.store().await;
    // 3,001 sessions of one server across two namespaces, plus another server's sessions.
    let mut creates = Vec::new();
    for i in 0..3001 {
        let store = store.clone();
        let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
        creates.push(async move {
            store
                .create_session(mk_session(ns, &format!("s-{i:05}"), "srv-1"), false)
                .await
        });
        if creates.len() == 64 {
            for r in futures::future::join_all(creates.drain(..)).await {
                r.unwrap();
            }
        }
    }
    for r in futures::future::join_all(creates).await {
        r.unwrap();
    }
    for i in 0..50 {
        store
            .create_session(mk_session("team-a", &format!("other-{i}"), "srv-2"), false)
            .await
            .unwrap();
    }
    let fields = FieldSelector::parse("spec.server.uid=srv-1", AccessSession::FIELDS).unwrap();

    // The snapshot and its cursor, read in one REPEATABLE READ transaction.
    let snapshot = store
        .list::<AccessSession>(&ListQuery {
            fields: fields.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(snapshot.items.len(), 3001);
    assert!(snapshot.continue_token.is_none());
    let expected = digest(&snapshot.items);

    // 500 concurrent writes that touch the snapshot: revocations, deletions, label updates
    // of listed sessions, and new sessions of the same server.
    let writes_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..500usize {
        let store = store.clone();
        let done = writes_done.clone();
        writers.push(tokio::spawn(async move {
            let i = (w * 6) % 3001;
            let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
            let name = format!("s-{i:05}");
            match w % 4 {
                0 => {
                    support::revoke(&store, ns, &name, "manual").await;
                }
                1 => {
                    store
                        .remove::<AccessSession>(ns, &name, &Preconditions::default(), false)
                        .await
                        .unwrap();
                }
                2 => {
                    let mut s: AccessSession = store.get(ns, &name).await.unwrap();
                    s.metadata.labels = Some([("touched".to_string(), w.to_string())].into());
                    s.metadata.resource_version = None;
                    store.update_session(s, false).await.unwrap();
                }
                _ => {
                    store
                        .create_session(mk_session(ns, &format!("new-{w:04}"), "srv-1"), false)
                        .await
                        .unwrap();
                }
            }
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
    }

    // Page through at the snapshot's version while the writes land.
    let mut pages = Vec::new();
    let mut at = ListAt::Exact {
        rv: snapshot.resource_version,
        after: None,
    };
    loop {
        let page = store
            .list::<AccessSession>(&ListQuery {
                fields: fields.clone(),
                limit: Some(1000),
                at,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            page.resource_version, snapshot.resource_version,
            "every page repeats the list's version"
        );
        assert!(page.items.len() <= 1000);
        pages.push(page.items);
        let Some(token) = page.continue_token else {
            break;
        };
        let (token, rv) = ContinueToken::decode(&token).unwrap();
        at = ListAt::Exact {
            rv,
            after: Some((token.ns, token.name)),
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let landed_during = writes_done.load(std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(pages.len(), 4, "3,001 items in pages of 1,000");
    let paged: Vec<AccessSession> = pages.into_iter().flatten().collect();
    assert_eq!(paged.len(), 3001);
    assert_eq!(
        digest(&paged),
        expected,
        "pages hold exactly the snapshot's content"
    );
    assert!(landed_during > 0, "writes landed while paginating");

    // And the current state really did move on.
    let now = store
        .list::<AccessSession>(&ListQuery {
            fields,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_ne!(digest(&now.items), expected);
    assert_eq!(now.items.len(), 3001 - 125 + 125);
    assert!(
        now.items
            .iter()
            .filter(|s| s.phase() == SessionPhase::Revoked)
            .count()
            >= 125
    );
}

/// Collects `n` events from a subscription and checks they are gap-free and increasing.
async fn collect(store: &PgStore, from: ResourceVersion, n: usize) -> Vec<String> {
    let mut sub = store.subscribe(from).await.unwrap();
    let mut seen = Vec::with_capacity(n);
    let mut last = from.seq;
    while seen.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .expect("event within 60s")
            .unwrap();
        assert_eq!(
            event.seq(),
            last + 1,
            "sequence is gap-free and strictly increasing"
        );
        assert_eq!(
            event.object["metadata"]["resourceVersion"],
            event.rv.to_string()
        );
        last = event.seq();
        seen.push(event.rv.to_string());
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_every_mutation_arrives_once_in_order() {
    const WRITERS: usize = 8;
    const MUTATIONS: usize = 2000;
    let db = TestDb::new().await;
    let store = db.store().await;
    let start = store.current_version().await.unwrap();

    let live = tokio::spawn({
        let store = store.clone();
        async move { collect(&store, start, WRITERS * MUTATIONS).await }
    });
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            let mut committed = Vec::with_capacity(MUTATIONS);
            for i in 0..MUTATIONS / 2 {
                let created = store
                    .create_session(
                        mk_session(&format!("w{w}"), &format!("s-{i}"), "srv"),
                        false,
                    )
                    .await
                    .unwrap()
                    .object;
                committed.push(created.metadata.resource_version.clone().unwrap());
                let mut s = created;
                s.metadata.labels = Some([("n".to_string(), i.to_string())].into());
                let updated = store.update_session(s, false).await.unwrap().object;
                committed.push(updated.metadata.resource_version.unwrap());
            }
            committed
        }));
    }
    // A second subscriber starts from the old cursor once half the writes are in:
    // it replays from the log, then continues live.
    loop {
        let head = store.current_version().await.unwrap();
        if head.seq - start.seq >= (WRITERS * MUTATIONS / 2) as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replayed = tokio::spawn({
        let store = store.clone();
        async move { collect(&store, start, WRITERS * MUTATIONS).await }
    });
    let mut committed = HashSet::new();
    for w in writers {
        for rv in w.await.unwrap() {
            assert!(committed.insert(rv), "each mutation has its own version");
        }
    }
    for seen in [live.await.unwrap(), replayed.await.unwrap()] {
        assert_eq!(seen.len(), committed.len());
        let seen: HashSet<String> = seen.into_iter().collect();
        assert_eq!(
            seen, committed,
            "every committed mutation arrives exactly once"
        );
    }
}

#[tokio::test]
async fn old_foreign_and_future_cursors_are_expired() {
    let db = TestDb::new().await;
    let mut config = db.store_config();
    config.retained_events = 100;
    let store = PgStore::start(config.clone()).await.unwrap();
    let start = store.current_version().await.unwrap();
    let first = store
        .create_session(mk_session("ns", "s-0", "srv"), false)
        .await
        .unwrap()
        .object;
    let early =
        ResourceVersion::parse(first.metadata.resource_version.as_deref().unwrap()).unwrap();
    for i in 1..150 {
        store
            .create_session(mk_session("ns", &format!("s-{i}"), "srv"), false)
            .await
            .unwrap();
    }
    // Within retention: fine.
    store.subscribe(early).await.unwrap();
    let page = store
        .list::<AccessSession>(&ListQuery {
            limit: Some(10),
            at: ListAt::Exact {
                rv: early,
                after: None,
            },
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.items.len(),
        1,
        "the list at an old version shows the state then"
    );

    assert!(store.trim_log().await.unwrap() >= 50);
    let expired = |r: Result<_, StoreError>| matches!(r, Err(StoreError::Expired(_)));
    assert!(expired(store.subscribe(start).await.map(|_| ())));
    assert!(expired(store.subscribe(early).await.map(|_| ())));
    assert!(expired(
        store
            .list::<AccessSession>(&ListQuery {
                at: ListAt::Exact {
                    rv: early,
                    after: None
                },
                ..Default::default()
            })
            .await
            .map(|_| ())
    ));
    // Ahead of head.
    let head = store.current_version().await.unwrap();
    let ahead = ResourceVersion::new(head.epoch, head.seq + 10);
    assert!(expired(store.subscribe(ahead).await.map(|_| ())));
    assert!(expired(
        store
            .list::<AccessSession>(&ListQuery {
                at: ListAt::Exact {
                    rv: ahead,
                    after: None
                },
                ..Default::default()
            })
            .await
            .map(|_| ())
    ));
    // Garbled versions do not even parse.
    for garbled in ["", "abc", "-5", "007", "1"] {
        assert!(ResourceVersion::parse(garbled).is_err(), "{garbled}");
    }

    // A live subscriber, then a restart that rotates the epoch (as an operator does after a
    // restore; an ordinary restart keeps it): it is ended with Expired, and every cursor of
    // the old epoch is refused.
    let mut live = store.subscribe(head).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let watcher = tokio::spawn(async move {
        loop {
            let r = live.next().await;
            let done = r.is_err();
            tx.send(r.map(|e| e.rv)).await.unwrap();
            if done {
                return;
            }
        }
    });
    store
        .create_session(mk_session("ns", "before-restart", "srv"), false)
        .await
        .unwrap();
    assert!(rx.recv().await.unwrap().is_ok());
    let restarted = PgStore::start(StoreConfig {
        rotate_epoch: true,
        ..config
    })
    .await
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(ended, Err(StoreError::EpochChanged(_))),
        "{ended:?}"
    );
    watcher.await.unwrap();
    let new_head = restarted.current_version().await.unwrap();
    assert_ne!(new_head.epoch, head.epoch);
    assert_eq!(new_head.seq, head.seq + 1);
    let epoch_changed = |r: Result<_, StoreError>| matches!(r, Err(StoreError::EpochChanged(_)));
    assert!(epoch_changed(restarted.subscribe(head).await.map(|_| ())));
    assert!(epoch_changed(store.subscribe(head).await.map(|_| ())));
    restarted.subscribe(new_head).await.unwrap();
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_is_cut_off_not_skipped() {
    let db = TestDb::new().await;
    let mut config = db.store_config();
    config.watcher_buffer = 16;
    config.ring_capacity = 16;
    let store = PgStore::start(config).await.unwrap();
    let start = store.current_version().await.unwrap();
    let mut slow = store.subscribe(start).await.unwrap();
    let mut fast = store.subscribe(start).await.unwrap();
    store
        .create_session(mk_session("ns", "first", "srv"), false)
        .await
        .unwrap();
    // Both attach live with their first event.
    assert_eq!(slow.next().await.unwrap().name, "first");
    assert_eq!(fast.next().await.unwrap().name, "first");
    let fast_reader = tokio::spawn(async move {
        let mut n = 0;
        while n < 100 {
            fast.next().await.unwrap();
            n += 1;
        }
        n
    });
    for i in 0..100 {
        store
            .create_session(mk_session("ns", &format!("s-{i}"), "srv"), false)
            .await
            .unwrap();
    }
    assert_eq!(
        fast_reader.await.unwrap(),
        100,
        "a subscriber that keeps up gets everything"
    );
    let mut delivered = 0;
    let err = loop {
        match tokio::time::timeout(Duration::from_secs(10), slow.next())
            .await
            .unwrap()
        {
            Ok(e) => {
                assert_eq!(
                    e.name,
                    format!("s-{delivered}"),
                    "nothing skipped before the cut"
                );
                delivered += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, StoreError::Expired(_)), "{err:?}");
    assert!(
        delivered <= 16,
        "delivered {delivered} queued events, then Expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn issuance_racing_agent_deactivation_never_leaves_an_active_session() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for round in 0..100 {
        let agent_name = format!("bot-{round}");
        let agent = store
            .create_agent(mk_agent(&agent_name, &["t"]), false)
            .await
            .unwrap()
            .object;
        let mut tasks = Vec::new();
        for t in 0..32 {
            let store = store.clone();
            let agent_name = agent_name.clone();
            tasks.push(tokio::spawn(async move {
                let mut issued = Vec::new();
                for i in 0.. {
                    let s = mk_agent_session(
                        "ns",
                        &format!("r{round}-t{t}-{i}"),
                        "srv",
                        &agent_name,
                        &["t"],
                    );
                    match store.create_session(s, false).await {
                        Ok(written) => issued.push(key(&written.object)),
                        Err(StoreError::Refused(Refusal::Session(
                            SessionRuleError::AgentInactive(_),
                        ))) => return issued,
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
                unreachable!()
            }));
        }
        tokio::time::sleep(Duration::from_millis((round % 5) as u64)).await;
        let mut off = agent.clone();
        off.spec.active = false;
        off.metadata.resource_version = None;
        store.update_agent(off, false).await.unwrap();
        let mut issued = HashSet::new();
        for t in tasks {
            for name in t.await.unwrap() {
                assert!(issued.insert(name.clone()), "{name} issued twice");
            }
        }
        let fields = FieldSelector::parse(
            &format!("spec.agent.name={agent_name}"),
            AccessSession::FIELDS,
        )
        .unwrap();
        let sessions = store
            .list::<AccessSession>(&ListQuery {
                fields,
                ..Default::default()
            })
            .await
            .unwrap();
        let active: Vec<String> = sessions
            .items
            .iter()
            .filter(|s| s.phase() != SessionPhase::Revoked)
            .map(key)
            .collect();
        assert!(
            active.is_empty(),
            "round {round}: active sessions of a deactivated agent: {active:?}"
        );
        // Every session a caller was told was issued exists, and nothing else does.
        let listed: HashSet<String> = sessions.items.iter().map(key).collect();
        assert_eq!(
            listed.len(),
            sessions.items.len(),
            "round {round}: a session listed twice"
        );
        assert_eq!(
            listed, issued,
            "round {round}: issued sessions differ from listed ones"
        );
    }
}
