//! Session expiry (DESIGN §6) against real PostgreSQL: at `spec.expiresAt` a session turns
//! `Expired` within a second, as one change-log event that watches see; several replicas
//! sweeping one database expire it once; a revoked session stays `Revoked`.

mod support;

use std::time::Duration;

use apis::{AccessSession, Enrollment, SessionPhase};
use apiserver::expiry::{self, ExpiryConfig, ExpiryMetrics};
use apiserver::store::{PgStore, Store};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use support::server::{TestServer, ADMIN_TOKEN};
use support::watch::{Next, WatchStream};
use support::StoreExt;
use support::*;

const NS: &str = "team-a";

/// An instant `secs` from now, at whole seconds (as Kubernetes records times).
fn in_secs(secs: i64) -> Timestamp {
    let t = Timestamp::now() + SignedDuration::from_secs(secs);
    Timestamp::from_second(t.as_second()).unwrap()
}

/// Sleeps until `at` has passed, and a little more.
async fn sleep_past(at: Timestamp) {
    let left = at.as_millisecond() - Timestamp::now().as_millisecond();
    tokio::time::sleep(Duration::from_millis(left.max(0) as u64 + 200)).await;
}

fn expiring(name: &str, at: Timestamp) -> AccessSession {
    let mut s = mk_session(NS, name, "srv-1");
    s.spec.expires_at = Some(Time(at));
    s
}

/// Runs the production scheduler on `store` for the rest of the test.
fn run_scheduler(store: &PgStore) -> tokio::task::JoinHandle<()> {
    tokio::spawn(expiry::run(
        store.clone(),
        ExpiryConfig::default(),
        ExpiryMetrics::default(),
    ))
}

/// Change-log events of one session, in order.
async fn change_events(db: &TestDb, name: &str) -> Vec<(String, Option<String>)> {
    db.client()
        .await
        .query(
            "SELECT event, object #>> '{status,phase}' FROM change_log
              WHERE resource = 'accesssessions' AND namespace = $1 AND name = $2 ORDER BY seq",
            &[&NS, &name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn assert_within_a_second_of(seen: Timestamp, expires_at: Timestamp) {
    let late = seen.duration_since(expires_at);
    eprintln!("seen Expired {late:?} after expiresAt");
    assert!(
        late >= SignedDuration::ZERO && late < SignedDuration::from_secs(1),
        "expired {late:?} after expiresAt {expires_at} (seen at {seen})"
    );
}

#[tokio::test]
async fn a_session_turns_expired_within_a_second_of_expires_at_as_one_change_event() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let _scheduler = run_scheduler(&store);
    // A later session is scheduled first: the new, earlier one must wake the scheduler.
    store
        .create_session(expiring("later", in_secs(3600)), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut feed = store
        .subscribe(store.current_version().await.unwrap())
        .await
        .unwrap();
    let expires_at = in_secs(3);
    let created = store
        .create_session(expiring("short", expires_at), false)
        .await
        .unwrap()
        .object;
    assert_eq!(created.phase(), SessionPhase::Active);

    let added = tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .expect("the ADDED event")
        .unwrap();
    assert_eq!(added.object["status"]["phase"], "Active");
    let event = tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .expect("an event within 10 s")
        .unwrap();
    let seen = Timestamp::now();
    assert_eq!(event.name, "short");
    assert_eq!(
        event.object["status"]["phase"], "Expired",
        "{}",
        event.object
    );
    let condition = &event.object["status"]["conditions"][0];
    assert_eq!(condition["type"], "Expired");
    assert_eq!(condition["reason"], "ExpiresAtReached");
    assert_within_a_second_of(seen, expires_at);

    let stored: AccessSession = store.get(NS, "short").await.unwrap();
    assert_eq!(stored.phase(), SessionPhase::Expired);
    assert_eq!(
        stored.metadata.resource_version.as_deref(),
        event.object["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(
        change_events(&db, "short").await,
        vec![
            ("ADDED".to_string(), Some("Active".to_string())),
            ("MODIFIED".to_string(), Some("Expired".to_string())),
        ]
    );
    // The other session is untouched and next in line.
    let later: AccessSession = store.get(NS, "later").await.unwrap();
    assert_eq!(later.phase(), SessionPhase::Active);
    assert_eq!(
        store.next_session_expiry().await.unwrap(),
        later.spec.expires_at.map(|t| t.0)
    );
}

#[tokio::test]
async fn two_replicas_sweeping_one_database_expire_a_session_once() {
    let db = TestDb::new().await;
    let a = db.store().await;
    let b = db.store().await;
    let expires_at = in_secs(1);
    a.create_session(expiring("s1", expires_at), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let now = Timestamp::now();
    assert!(now >= expires_at);
    let (from_a, from_b) = tokio::join!(a.expire_sessions(now), b.expire_sessions(now));
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(
        from_a.len() + from_b.len(),
        1,
        "exactly one replica expires it: {from_a:?} {from_b:?}"
    );
    assert!(a
        .expire_sessions(Timestamp::now())
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .expire_sessions(Timestamp::now())
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        change_events(&db, "s1").await,
        vec![
            ("ADDED".to_string(), Some("Active".to_string())),
            ("MODIFIED".to_string(), Some("Expired".to_string())),
        ]
    );
    assert_eq!(a.next_session_expiry().await.unwrap(), None);
}

#[tokio::test]
async fn revoked_sessions_stay_revoked_and_pending_ones_expire() {
    let db = TestDb::new().await;
    let store = db.store().await;
    // Far enough ahead that the enrollment, three writes later, is still created before it
    // (a whole second: with one, the writes could straddle it and the create be refused).
    let expires_at = in_secs(3);
    store
        .create_session(expiring("revoked", expires_at), false)
        .await
        .unwrap();
    revoke(&store, NS, "revoked", "compromised").await;
    let pending = expiring("pending", expires_at);
    let mut enrollment = Enrollment {
        spec: pending.spec,
        ..Default::default()
    };
    enrollment.metadata = pending.metadata;
    store
        .create_enrollment(enrollment, &support::store_ext::admin(), false)
        .await
        .unwrap();
    let pending: AccessSession = store.get(NS, "pending").await.unwrap();
    assert_eq!(pending.phase(), SessionPhase::PendingEnrollment);
    // Only the pending one can still expire.
    assert_eq!(store.next_session_expiry().await.unwrap(), Some(expires_at));

    sleep_past(expires_at).await;
    let expired = store.expire_sessions(Timestamp::now()).await.unwrap();
    let names: Vec<_> = expired
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, vec!["pending".to_string()]);
    let revoked: AccessSession = store.get(NS, "revoked").await.unwrap();
    assert_eq!(revoked.phase(), SessionPhase::Revoked);
    assert_eq!(
        revoked.status.unwrap().revocation.unwrap().cause,
        "compromised"
    );
    let pending: AccessSession = store.get(NS, "pending").await.unwrap();
    assert_eq!(pending.phase(), SessionPhase::Expired);
    // Its enrollment can no longer be completed.
    assert!(store
        .complete_enrollment(NS, "pending", None, false)
        .await
        .is_err());
}

#[tokio::test]
async fn a_watch_sees_modified_with_phase_expired() {
    let server = TestServer::start().await;
    let _scheduler = run_scheduler(&server.store);
    let url = format!("{}?watch=true", server.sessions_url(NS));
    let resp = server
        .http()
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let mut watch = WatchStream::strict(resp);
    let expires_at = in_secs(3);
    let mut body = session_body(NS, "short-lived");
    body["spec"]["expiresAt"] =
        Value::String(expires_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    let resp = server.post_session(NS, &body).await;
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());

    let mut phases = Vec::new();
    loop {
        match watch.next(Duration::from_secs(10)).await {
            Next::Event(e) => {
                let phase = e["object"]["status"]["phase"].as_str().unwrap_or_default();
                phases.push(format!("{} {phase}", e["type"].as_str().unwrap()));
                if phase == "Expired" {
                    assert_within_a_second_of(Timestamp::now(), expires_at);
                    break;
                }
            }
            other => panic!("no Expired event: {other:?} after {phases:?}"),
        }
    }
    assert_eq!(phases, vec!["ADDED Active", "MODIFIED Expired"]);
}

/// Session Events are derived from what each committed write did, reported once, by the
/// replica that wrote (a second replica on the same database, which sees every change in its
/// feed, reports nothing); a dry run reports nothing.
#[tokio::test]
async fn session_events_are_reported_by_the_writing_replica_only() {
    use apis::rules::SessionTransition;
    use apiserver::store::SessionEvent;
    use std::sync::{Arc, Mutex};

    fn collect(store: &PgStore) -> Arc<Mutex<Vec<SessionEvent>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        assert!(store
            .session_signals()
            .set_emitter(move |e| sink.lock().unwrap().push(e)));
        seen
    }
    let db = TestDb::new().await;
    let store = db.store().await;
    let other = db.store().await;
    let (seen, seen_by_other) = (collect(&store), collect(&other));

    // Over the server's 24 h maximum: clamped.
    let mut long = mk_session(NS, "long", "srv-1");
    long.spec.expires_at = Some(in_hours(48));
    store.create_session(long.clone(), true).await.unwrap();
    let long = store.create_session(long, false).await.unwrap().object;
    let revocation = revoke(&store, NS, "long", "compromised").await;
    // A second revocation covering it is no new transition.
    revoke(&store, NS, "long", "manual").await;
    let short = store
        .create_session(expiring("short", in_secs(1)), false)
        .await
        .unwrap()
        .object;
    let pending = mk_session(NS, "enrolled", "srv-1");
    let mut enrollment = Enrollment {
        spec: pending.spec,
        ..Default::default()
    };
    enrollment.metadata = pending.metadata;
    store
        .create_enrollment(enrollment, &support::store_ext::admin(), false)
        .await
        .unwrap();
    store
        .complete_enrollment(NS, "enrolled", None, false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        store.expire_sessions(Timestamp::now()).await.unwrap().len(),
        1
    );

    let seen = seen.lock().unwrap().clone();
    let summary: Vec<(&str, &str)> = seen
        .iter()
        .map(|e| (e.name.as_str(), e.transition.reason()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("long", "TTLClamped"),
            ("long", "Revoked"),
            ("enrolled", "EnrollmentCompleted"),
            ("short", "Expired"),
        ]
    );
    assert_eq!(seen[0].uid, long.metadata.uid.clone().unwrap());
    assert!(matches!(
        &seen[1].transition,
        SessionTransition::Revoked { cause, revocation: Some(name) }
            if cause == "compromised" && *name == revocation
    ));
    assert_eq!(
        seen[3].transition,
        SessionTransition::Expired {
            expires_at: short.spec.expires_at.unwrap().0
        }
    );
    assert!(seen_by_other.lock().unwrap().is_empty());
}

/// Creates the Enrollment of `session` (the session is then `PendingEnrollment`).
async fn enroll(store: &impl Store, session: &AccessSession) {
    let mut enrollment = Enrollment {
        spec: session.spec.clone(),
        ..Default::default()
    };
    enrollment.metadata = session.metadata.clone();
    store
        .create_enrollment(enrollment, &support::store_ext::admin(), false)
        .await
        .unwrap();
}

/// The SQL that narrows the due sessions and the next expiry (and its index) agrees with the
/// typed rules the memory store applies directly, over every phase and around the instant.
#[tokio::test]
async fn sql_and_rules_agree_on_due_sessions_and_the_next_expiry() {
    use apiserver::store::MemoryStore;

    let db = TestDb::new().await;
    let pg = db.store().await;
    let memory = MemoryStore::new();
    let base = in_secs(3600);
    for (name, offset) in [("a", 0), ("b", 1), ("c", 2), ("revoked", -5), ("d", 7200)] {
        let session = expiring(name, base + SignedDuration::from_secs(offset));
        pg.create_session(session.clone(), false).await.unwrap();
        memory.create_session(session, false).await.unwrap();
    }
    revoke(&pg, NS, "revoked", "manual").await;
    revoke(&memory, NS, "revoked", "manual").await;
    let pending = expiring("pending", base - SignedDuration::from_secs(1));
    enroll(&pg, &pending).await;
    enroll(&memory, &pending).await;
    let names = |expired: Vec<AccessSession>| {
        let mut n: Vec<String> = expired
            .into_iter()
            .map(|s| s.metadata.name.unwrap())
            .collect();
        n.sort();
        n
    };
    let expected_next = Some(base - SignedDuration::from_secs(1));
    assert_eq!(pg.next_session_expiry().await.unwrap(), expected_next);
    assert_eq!(memory.next_session_expiry().await.unwrap(), expected_next);
    // Sub-second instants: `a` is due at its second, `b` one second later.
    for (at, want) in [
        (base - SignedDuration::from_millis(1500), vec![]),
        (base - SignedDuration::from_millis(500), vec!["pending"]),
        (base + SignedDuration::from_millis(999), vec!["a"]),
        (base + SignedDuration::from_secs(2), vec!["b", "c"]),
        (base + SignedDuration::from_secs(3), vec![]),
    ] {
        let from_pg = names(pg.expire_sessions(at).await.unwrap());
        let from_memory = names(memory.expire_sessions(at).await.unwrap());
        assert_eq!(from_pg, want, "at {at}");
        assert_eq!(from_memory, want, "at {at}");
    }
    let expected_next = Some(base + SignedDuration::from_secs(7200));
    assert_eq!(pg.next_session_expiry().await.unwrap(), expected_next);
    assert_eq!(memory.next_session_expiry().await.unwrap(), expected_next);
}

/// The largest "Actual Rows" of any node of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan.
fn most_rows(plan: &Value) -> u64 {
    let here = plan["Actual Rows"].as_u64().unwrap_or(0);
    let below = plan["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(most_rows).max().unwrap_or(0))
        .unwrap_or(0);
    here.max(below)
}

/// The scheduler reads the next expiry after every session write: it must read one index
/// entry however many sessions there are, including before the table was ever analyzed
/// (a `min(…)` read every one of them: 2 ms per write at 5,000 sessions).
#[tokio::test]
async fn the_next_expiry_reads_one_index_entry_however_many_sessions_there_are() {
    let db = TestDb::new().await;
    let pg = db.store().await;
    let base = in_secs(3600);
    for i in 0..400 {
        let at = base + SignedDuration::from_secs(i % 50);
        pg.create_session(expiring(&format!("s-{i:03}"), at), false)
            .await
            .unwrap();
    }
    let client = db.client().await;
    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        apiserver::store::NEXT_SESSION_EXPIRY_SQL
    );
    let plan: Value = client.query_one(&explain, &[]).await.unwrap().get(0);
    let plan = &plan[0]["Plan"];
    assert!(
        most_rows(plan) <= 1,
        "the next-expiry read went through more than one row: {plan:#}"
    );
    assert_eq!(pg.next_session_expiry().await.unwrap(), Some(base));
}
