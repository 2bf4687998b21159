//! Group commit: mutations queued behind each other share one transaction and one commit,
//! yet each keeps its own preconditions, its own result and its own gap-free sequence
//! numbers, in order; a refused or failing one does not fail its neighbours.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use apis::AccessSession;
use apiserver::store::{Preconditions, ResourceVersion, Store, StoreError};
use support::*;

/// What one writer asked for and what it was answered.
#[derive(Debug)]
enum Outcome {
    Created { key: String, rv: u64 },
    Deleted { key: String },
    Refused(StoreError),
    DryRun,
}

/// The change log's length, after checking its sequence numbers follow each other.
async fn gap_free_log(client: &tokio_postgres::Client) -> usize {
    let seqs: Vec<i64> = client
        .query("SELECT seq FROM change_log ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap in the change log: {pair:?}");
    }
    seqs.len()
}

fn seq_of(rv: Option<&str>) -> u64 {
    ResourceVersion::parse(rv.expect("a resourceVersion"))
        .expect("a resourceVersion this server minted")
        .seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_mutations_share_commits_and_keep_their_own_outcomes() {
    let db = TestDb::new().await;
    let store = db.store().await;
    // One session per writer that the refused mutations aim at.
    for w in 0..16 {
        store
            .create_session(mk_session("team-a", &format!("taken-{w}"), "srv-1"), false)
            .await
            .unwrap();
    }
    let (groups_before, mutations_before) = store.write_groups();

    // 16 writers, each a mix: new sessions (kept), a duplicate name (AlreadyExists), a dry
    // run (answered, never stored), a delete with a wrong uid precondition (refused), and a
    // delete of its own earlier session (kept). All run concurrently, so they are grouped.
    let mut writers = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..25 {
                let name = format!("w{w}-s{i}");
                let outcome = match i % 5 {
                    0 | 1 => {
                        let written = store
                            .create_session(mk_session("team-a", &name, "srv-1"), false)
                            .await
                            .expect("a new session is created");
                        Outcome::Created {
                            key: name,
                            rv: seq_of(written.object.metadata.resource_version.as_deref()),
                        }
                    }
                    2 => Outcome::Refused(
                        store
                            .create_session(
                                mk_session("team-a", &format!("taken-{w}"), "srv-1"),
                                false,
                            )
                            .await
                            .expect_err("the name is taken"),
                    ),
                    3 => {
                        let dry = store
                            .create_session(mk_session("team-a", &name, "srv-1"), true)
                            .await
                            .expect("a dry run is answered");
                        assert!(dry.object.metadata.resource_version.is_none());
                        // The wrong uid: refused, whatever its neighbours do.
                        match store
                            .remove::<AccessSession>(
                                "team-a",
                                &format!("taken-{w}"),
                                &Preconditions {
                                    uid: Some("00000000-0000-4000-8000-000000000000".into()),
                                    resource_version: None,
                                },
                                false,
                            )
                            .await
                        {
                            Err(e @ StoreError::UidPrecondition { .. }) => {
                                outcomes.push(Outcome::Refused(e))
                            }
                            other => panic!("a wrong uid precondition must be refused: {other:?}"),
                        }
                        Outcome::DryRun
                    }
                    _ => {
                        let victim = format!("w{w}-s{}", i - 4);
                        store
                            .remove::<AccessSession>(
                                "team-a",
                                &victim,
                                &Preconditions::default(),
                                false,
                            )
                            .await
                            .expect("its own session is deleted");
                        Outcome::Deleted { key: victim }
                    }
                };
                outcomes.push(outcome);
            }
            outcomes
        }));
    }
    let mut created = BTreeMap::new();
    let mut deleted = BTreeSet::new();
    let mut refusals = 0;
    for writer in writers {
        for outcome in writer.await.unwrap() {
            match outcome {
                Outcome::Created { key, rv } => {
                    assert!(created.insert(key, rv).is_none());
                }
                Outcome::Deleted { key } => {
                    assert!(deleted.insert(key));
                }
                Outcome::Refused(e) => {
                    assert!(
                        matches!(
                            e,
                            StoreError::AlreadyExists | StoreError::UidPrecondition { .. }
                        ),
                        "{e:?}"
                    );
                    refusals += 1;
                }
                Outcome::DryRun => {}
            }
        }
    }
    assert_eq!(refusals, 16 * 5 * 2);
    assert_eq!(created.len(), 16 * 10);
    assert_eq!(deleted.len(), 16 * 5);

    // Mutations were grouped: fewer groups than mutations.
    let (groups, mutations) = store.write_groups();
    let (groups, mutations) = (groups - groups_before, mutations - mutations_before);
    assert_eq!(
        mutations,
        16 * 25 + 16 * 5,
        "every mutation ran exactly once"
    );
    assert!(
        groups < mutations,
        "{mutations} concurrent mutations ran in {groups} groups: none was shared"
    );

    // The change log: one event per kept write, sequence numbers gap-free from the first
    // session on, each created session's event at the resourceVersion it was answered with.
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT seq, name, event FROM change_log WHERE resource = 'accesssessions' ORDER BY seq",
            &[],
        )
        .await
        .unwrap();
    let seqs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        seqs.len(),
        16 + 16 * 10 + 16 * 5,
        "one event per kept write"
    );
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap in the change log: {pair:?}");
    }
    let head: i64 = client
        .query_one("SELECT seq FROM sync_state WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(head, *seqs.last().unwrap(), "the head is the last event");
    for row in &rows {
        let (seq, name, event): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
        if let Some(rv) = created.get(&name) {
            if event == "ADDED" {
                assert_eq!(*rv, seq as u64, "{name} was answered another version");
            }
        }
        assert!(
            !name.starts_with("taken-") || event == "ADDED",
            "a refused mutation wrote {event} {name}"
        );
    }

    // What stands: every kept session, none deleted or dry-run.
    let stored: BTreeSet<String> = store
        .list::<AccessSession>(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.metadata.name.unwrap())
        .collect();
    for name in created.keys() {
        assert_eq!(stored.contains(name), !deleted.contains(name), "{name}");
    }
    assert_eq!(stored.len(), 16 + created.len() - deleted.len());
}

/// A mutation that fails inside the database (not refused by a rule but by a statement) fails
/// alone: its group's held writes were refused together, so the group runs again with each
/// mutation's writes sent in its own savepoint, and the mutations grouped with it commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_statement_fails_only_its_own_mutation() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let client = db.client().await;
    // A trigger that fails the insert of one name, as a constraint would.
    client
        .batch_execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.name = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON objects
               FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
        )
        .await
        .unwrap();
    // Another replica holds the sync-state lock: the first mutation waits for it in its own
    // group and every other one queues behind it, so the poisoned one shares the next group
    // with its neighbours however the machine schedules the tasks.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM sync_state WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let mut tries = Vec::new();
    for i in 0..24 {
        let store = store.clone();
        tries.push(tokio::spawn(async move {
            let name = if i == 12 {
                "poison".to_string()
            } else {
                format!("s-{i}")
            };
            (
                name.clone(),
                store
                    .create_session(mk_session("team-a", &name, "srv-1"), false)
                    .await,
            )
        }));
        if i == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    held.rollback().await.unwrap();
    let mut ok = BTreeSet::new();
    for t in tries {
        let (name, result) = t.await.unwrap();
        match result {
            Ok(_) => {
                ok.insert(name);
            }
            Err(StoreError::Internal(message)) => {
                assert_eq!(name, "poison");
                assert!(message.contains("poisoned row"), "{message}");
            }
            Err(e) => panic!("{name}: {e:?}"),
        }
    }
    assert_eq!(
        ok.len(),
        23,
        "every neighbour of the failing mutation committed"
    );
    assert!(
        store.write_group_reruns() >= 1,
        "the refused group ran again, each mutation in its own savepoint"
    );
    assert_eq!(gap_free_log(&client).await, 23);
}

/// A caller that goes away while its mutation is still queued (its client disconnected, its
/// request timed out) withdraws it: it never runs after the caller stopped waiting. One that
/// waited past the queue bound is answered 503 and never runs either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_withdrawn_or_timed_out_mutation_never_runs() {
    let db = TestDb::new().await;
    let mut config = db.store_config();
    config.pool_timeout = std::time::Duration::from_millis(800);
    let store = apiserver::store::PgStore::start(config).await.unwrap();
    store
        .create_session(mk_session("team-a", "warm", "srv-1"), false)
        .await
        .unwrap();
    // Another replica holds the sync-state lock: the writer's group waits behind it.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM sync_state WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let first = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .create_session(mk_session("team-a", "first", "srv-1"), false)
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // Queued behind the blocked group: dropped after 100 ms.
    let dropped = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        store.create_session(mk_session("team-a", "dropped", "srv-1"), false),
    )
    .await;
    assert!(dropped.is_err(), "the mutation cannot have run yet");
    // Queued until the bound: answered 503.
    let late = store
        .create_session(mk_session("team-a", "late", "srv-1"), false)
        .await;
    assert!(
        matches!(late, Err(StoreError::Unavailable(ref m)) if m.contains("no turn to write")),
        "{late:?}"
    );
    held.rollback().await.unwrap();
    first
        .await
        .unwrap()
        .expect("the group behind the lock commits");
    // Whatever the writer runs next, neither withdrawn mutation is among it.
    store
        .create_session(mk_session("team-a", "after", "srv-1"), false)
        .await
        .unwrap();
    for (name, present) in [
        ("first", true),
        ("dropped", false),
        ("late", false),
        ("after", true),
    ] {
        let got = store.get::<AccessSession>("team-a", name).await;
        assert_eq!(got.is_ok(), present, "{name}: {got:?}");
    }
}

/// A mutation decided after a neighbour in its group changed its facts reads them again,
/// after that neighbour's held writes: sessions created for a server in the same group as its
/// retirement are revoked with the rest when they come before it, refused when they come
/// after, and never left active. A session of another server in the group is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_after_a_retirement_in_their_group_see_its_fence() {
    use apis::{ServerRef, SessionPhase};
    let db = TestDb::new().await;
    let store = db.store().await;
    store
        .create_session(mk_session("ns", "warm", "srv-other"), false)
        .await
        .unwrap();
    let (groups_before, _) = store.write_groups();
    // Another replica holds the sync-state lock: the first mutation waits for it in its own
    // group, and every one queued behind it forms the next group, in queue order.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM sync_state WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(30));
    let spawn_create = |name: String, server: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .create_session(mk_session("ns", &name, server), false)
                .await
                .map(|w| w.object)
        })
    };
    let first = spawn_create("first".into(), "srv-other");
    pause().await;
    let mut before = Vec::new();
    for i in 0..4 {
        before.push(spawn_create(format!("before-{i}"), "srv-x"));
        pause().await;
    }
    let retirement = {
        let store = store.clone();
        tokio::spawn(async move {
            let server = ServerRef {
                name: "github".into(),
                uid: "srv-x".into(),
            };
            support::retire(&store, "ns", "retire-x", &server).await
        })
    };
    pause().await;
    let mut after = Vec::new();
    for i in 0..4 {
        after.push(spawn_create(format!("after-{i}"), "srv-x"));
        pause().await;
    }
    let other = spawn_create("other".into(), "srv-other");
    pause().await;
    held.rollback().await.unwrap();

    first.await.unwrap().unwrap();
    for t in before {
        t.await.unwrap().expect("created before the retirement");
    }
    let retired = retirement.await.unwrap();
    assert_eq!(retired.object.status.unwrap().revoked_sessions, 4);
    for t in after {
        let err = t.await.unwrap().expect_err("created after the retirement");
        assert!(
            support::conflict_message(&err).is_some_and(|m| m.contains("retired")),
            "{err:?}"
        );
    }
    let other = other.await.unwrap().unwrap();
    assert_eq!(other.phase(), SessionPhase::Active);
    let (groups_after, _) = store.write_groups();
    assert_eq!(
        groups_after - groups_before,
        2,
        "the mutations behind the first formed one group"
    );
    for i in 0..4 {
        let s: AccessSession = store.get("ns", &format!("before-{i}")).await.unwrap();
        assert_eq!(s.phase(), SessionPhase::Revoked, "before-{i}");
        let missing = store
            .get::<AccessSession>("ns", &format!("after-{i}"))
            .await;
        assert!(matches!(missing, Err(StoreError::NotFound)), "{missing:?}");
    }
    // Gap-free: the refused creates left no sequence number behind.
    gap_free_log(&db.client().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_in_a_group_covers_what_came_before_it_and_refuses_what_comes_after() {
    use apis::{RevocationTarget, SessionPhase};
    use apiserver::store::RevokerAuthority;
    const ALICE: &str = "alice@example.com";
    const BOB: &str = "bob@example.com";
    let db = TestDb::new().await;
    let store = db.store().await;
    let (groups_before, _) = store.write_groups();
    // Another replica holds the sync-state lock: the first mutation waits for it in its own
    // group, and every one queued behind it forms the next group, in queue order.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM sync_state WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(30));
    let spawn_create = |name: &'static str, user: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .create_session(mk_human_session("ns", name, "srv-1", user), false)
                .await
                .map(|w| w.object)
        })
    };
    let spawn_revoke = || {
        let store = store.clone();
        tokio::spawn(async move {
            let target = RevocationTarget {
                subject: Some(ALICE.into()),
                ..Default::default()
            };
            store
                .create_revocation(
                    mk_revocation("ns", "alice-out", target, "manual"),
                    RevokerAuthority::Namespace,
                    false,
                )
                .await
                .map(|w| w.object)
        })
    };
    let spawn_withdraw = || {
        let store = store.clone();
        tokio::spawn(async move { withdraw(&store, "ns", "alice-out").await })
    };

    let first = spawn_create("first", BOB);
    pause().await;
    // The group: alice's session, a revocation of alice, her next session (refused by the
    // revocation written just before it in the same transaction), bob's (untouched), the
    // revocation withdrawn (her first session restored), and her session after that.
    let before = spawn_create("alice-before", ALICE);
    pause().await;
    let revocation = spawn_revoke();
    pause().await;
    let under = spawn_create("alice-under", ALICE);
    pause().await;
    let bob = spawn_create("bob", BOB);
    pause().await;
    let withdrawn = spawn_withdraw();
    pause().await;
    let after = spawn_create("alice-after", ALICE);
    pause().await;
    held.rollback().await.unwrap();

    first.await.unwrap().unwrap();
    let before = before
        .await
        .unwrap()
        .expect("created before the revocation");
    assert_eq!(before.phase(), SessionPhase::Active, "answered as created");
    let revocation = revocation.await.unwrap().expect("the revocation");
    assert_eq!(
        revocation.status.unwrap().revoked_sessions,
        1,
        "it revoked the session written before it in its group, and only that one"
    );
    let refused = under
        .await
        .unwrap()
        .expect_err("created under the revocation");
    assert!(
        conflict_message(&refused).is_some_and(|m| m.contains("alice-out")),
        "{refused:?}"
    );
    assert_eq!(bob.await.unwrap().unwrap().phase(), SessionPhase::Active);
    withdrawn.await.unwrap().expect("the revocation withdrawn");
    assert_eq!(
        after
            .await
            .unwrap()
            .expect("created after the withdrawal")
            .phase(),
        SessionPhase::Active
    );
    let (groups_after, _) = store.write_groups();
    assert_eq!(
        groups_after - groups_before,
        2,
        "the mutations behind the first formed one group"
    );

    // What stands: alice's first session restored, the refused one never written.
    let phase = |name: &'static str| {
        let store = store.clone();
        async move {
            store
                .get::<AccessSession>("ns", name)
                .await
                .map(|s| s.phase())
        }
    };
    assert_eq!(phase("alice-before").await.unwrap(), SessionPhase::Active);
    assert!(matches!(
        phase("alice-under").await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(phase("alice-after").await.unwrap(), SessionPhase::Active);
    // The log tells alice's first session's story in order: created, revoked, restored.
    let client = db.client().await;
    let story: Vec<String> = client
        .query(
            "SELECT event, coalesce(object->'status'->>'phase', '') FROM change_log \
             WHERE resource = 'accesssessions' AND name = 'alice-before' ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    assert_eq!(
        story,
        ["ADDED Active", "MODIFIED Revoked", "MODIFIED Active"]
    );
    gap_free_log(&client).await;
}
