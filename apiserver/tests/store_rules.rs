//! Session and directory rules, tombstones, name reservations, preconditions and fences,
//! against a real PostgreSQL.

mod support;

use apis::rules::SessionRuleError;
use apis::rules::{CAUSE_AGENT_DEACTIVATED, CAUSE_SERVER_RETIRED};
use apis::selector::{FieldSelector, LabelSelector};
use apis::{AccessSession, Agent, Kind, Revocation, ServerRef, SessionPhase};
use apiserver::store::{
    apply_migrations, EventType, ListQuery, Preconditions, Refusal, RevokerAuthority, Store,
    StoreError,
};
use support::StoreExt;
use support::*;

#[tokio::test]
async fn migrations_are_recorded_and_idempotent() {
    let db = TestDb::new().await;
    // Two concurrent starts on an empty database: the advisory lock lets one migrate.
    let (a, b) = tokio::join!(PgStoreStart(&db), PgStoreStart(&db));
    a.unwrap();
    b.unwrap();
    let mut client = db.client().await;
    assert_eq!(apply_migrations(&mut client).await.unwrap(), 0);
    let rows = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, [1, 2, 3, 4], "each migration recorded once");
}

#[allow(non_snake_case)]
async fn PgStoreStart(db: &TestDb) -> Result<apiserver::store::PgStore, StoreError> {
    apiserver::store::PgStore::start(db.store_config()).await
}

#[tokio::test]
async fn human_and_team_sessions_skip_the_directory_and_agent_sessions_are_checked() {
    let db = TestDb::new().await;
    let store = db.store().await;

    // No agents exist at all: human-only and team-only sessions are still issued.
    let human = store
        .create_session(
            mk_human_session("ns", "alice-github", "srv-1", "alice@example.com"),
            false,
        )
        .await
        .unwrap();
    assert_eq!(human.object.phase(), SessionPhase::Active);
    assert!(human.object.metadata.uid.is_some());
    let team = store
        .create_session(mk_session("ns", "payments-github", "srv-1"), false)
        .await
        .unwrap();
    assert_eq!(team.object.spec.teams, vec!["payments".to_string()]);

    // An agent session needs the agent.
    let err = store
        .create_session(
            mk_agent_session("ns", "bot-1", "srv-1", "billing-bot", &[]),
            false,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Invalid(ref e) if e[0].field == "spec.agent.name"),
        "{err:?}"
    );

    let mut agent = mk_agent("billing-bot", &["payments", "billing"]);
    agent.spec.max_session_ttl = Some("2h".into());
    agent.spec.max_active_sessions = Some(2);
    let agent = store.create_agent(agent, false).await.unwrap().object;

    // Teams outside the agent's teams are refused.
    let err = store
        .create_session(
            mk_agent_session(
                "ns",
                "bot-1",
                "srv-1",
                "billing-bot",
                &["payments", "admin"],
            ),
            false,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(Refusal::Session(SessionRuleError::ScopeEscalation(_)))
        ) && err.to_string().contains("admin"),
        "{err:?}"
    );

    // Within them: issued, the agent uid bound, the TTL clamped with a warning.
    let mut long = mk_agent_session("ns", "bot-1", "srv-1", "billing-bot", &["payments"]);
    long.spec.expires_at = Some(in_hours(10));
    let issued = store.create_session(long, false).await.unwrap();
    assert_eq!(
        issued.object.spec.agent.as_ref().unwrap().uid,
        agent.metadata.uid
    );
    assert!(issued.object.spec.expires_at.as_ref().unwrap().0 <= in_hours(2).0);
    assert_eq!(issued.warnings.len(), 1, "{:?}", issued.warnings);
    let stored: AccessSession = store.get("ns", "bot-1").await.unwrap();
    assert_eq!(stored.spec.expires_at, issued.object.spec.expires_at);

    // maxActiveSessions = 2.
    store
        .create_session(
            mk_agent_session("ns", "bot-2", "srv-1", "billing-bot", &[]),
            false,
        )
        .await
        .unwrap();
    let err = store
        .create_session(
            mk_agent_session("ns", "bot-3", "srv-1", "billing-bot", &[]),
            false,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(Refusal::Session(SessionRuleError::QuotaExceeded { .. }))
        ),
        "{err:?}"
    );
    // A revoked session no longer counts.
    support::revoke(&store, "ns", "bot-2", "manual").await;
    store
        .create_session(
            mk_agent_session("ns", "bot-3", "srv-1", "billing-bot", &[]),
            false,
        )
        .await
        .unwrap();

    // Dry run validates but writes nothing.
    let before = store.current_version().await.unwrap();
    store
        .create_session(mk_session("ns", "dry", "srv-1"), true)
        .await
        .unwrap();
    assert_eq!(store.current_version().await.unwrap(), before);
    assert!(matches!(
        store.get::<AccessSession>("ns", "dry").await,
        Err(StoreError::NotFound)
    ));
    // Positive control: the same create for real moves the version and is found.
    store
        .create_session(mk_session("ns", "dry", "srv-1"), false)
        .await
        .unwrap();
    assert!(store.current_version().await.unwrap().seq > before.seq);
    store.get::<AccessSession>("ns", "dry").await.unwrap();
}

#[tokio::test]
async fn invalid_objects_are_refused_whole() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let before = store.current_version().await.unwrap();
    let mut bad = mk_session("ns", "Not_A_Name", "");
    bad.spec.teams.clear();
    bad.metadata.labels = Some([("-bad".to_string(), "x".to_string())].into());
    let err = store.create_session(bad, false).await.unwrap_err();
    let StoreError::Invalid(errors) = err else {
        panic!("{err:?}")
    };
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    for f in [
        "metadata.name",
        "metadata.labels",
        "spec.server.uid",
        "spec",
    ] {
        assert!(fields.contains(&f), "{fields:?} lacks {f}");
    }
    let mut no_ns = mk_session("ns", "x", "srv");
    no_ns.metadata.namespace = None;
    assert!(matches!(
        store.create_session(no_ns, false).await,
        Err(StoreError::Invalid(_))
    ));
    let mut past = mk_session("ns", "past", "srv");
    past.spec.expires_at = Some(in_hours(-1));
    assert!(matches!(
        store.create_session(past, false).await,
        Err(StoreError::Invalid(_))
    ));
    let mut agent = mk_agent("a", &[]);
    agent.spec.max_session_ttl = Some("eight hours".into());
    assert!(matches!(
        store.create_agent(agent, false).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(
        store.current_version().await.unwrap(),
        before,
        "nothing was written"
    );
}

#[tokio::test]
async fn updates_use_optimistic_concurrency_and_keep_authority_fields() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let created = store
        .create_session(mk_session("ns", "s", "srv-1"), false)
        .await
        .unwrap()
        .object;

    let mut labelled = created.clone();
    labelled.metadata.labels = Some([("team".to_string(), "payments".to_string())].into());
    labelled.status = None; // status is ignored on the main resource
    let updated = store.update_session(labelled, false).await.unwrap().object;
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(updated.status, created.status);
    assert_eq!(
        updated.metadata.generation,
        Some(1),
        "labels do not bump generation"
    );

    // Stale resourceVersion: 409.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    assert!(matches!(
        store.update_session(stale, false).await,
        Err(ref e) if support::is_conflict(e)
    ));

    // Authority fields are immutable; expiry may only be brought forward.
    let mut escalate = updated.clone();
    escalate.spec.teams.push("admin".into());
    assert!(matches!(
        store.update_session(escalate, false).await,
        Err(StoreError::Invalid(_))
    ));
    let mut extend = updated.clone();
    extend.spec.expires_at = Some(in_hours(5));
    let kept = store.update_session(extend, false).await.unwrap();
    assert_eq!(
        kept.object.spec.expires_at, updated.spec.expires_at,
        "expiry is never extended"
    );
    assert_eq!(kept.warnings.len(), 1, "{:?}", kept.warnings);
    let mut shorten = updated.clone();
    shorten.spec.expires_at = Some(
        in_hours(0)
            .0
            .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(10))
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
            .unwrap(),
    );
    let before_shorten = store.current_version().await.unwrap();
    let shortened = store.update_session(shorten, false).await.unwrap().object;
    assert_eq!(shortened.metadata.generation, Some(2));
    // The positive control of the no-op below: a real update moves the version.
    assert!(store.current_version().await.unwrap().seq > before_shorten.seq);

    // A no-op update writes nothing.
    let head = store.current_version().await.unwrap();
    store
        .update_session(shortened.clone(), false)
        .await
        .unwrap();
    assert_eq!(store.current_version().await.unwrap(), head);
}

#[tokio::test]
async fn tombstones_carry_the_last_state_and_names_stay_reserved() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let start = store.current_version().await.unwrap();
    let mut s = mk_session("ns", "alice-github", "srv-1");
    s.metadata.labels = Some([("app".to_string(), "x".to_string())].into());
    let created = store.create_session(s, false).await.unwrap().object;
    let target = apis::RevocationTarget {
        session: Some("alice-github".into()),
        ..Default::default()
    };
    store
        .create_revocation(
            mk_revocation("ns", "r1", target, "manual"),
            RevokerAuthority::Namespace,
            false,
        )
        .await
        .unwrap();

    // Stale preconditions: 409, nothing deleted.
    let stale_uid = Preconditions {
        uid: Some(uuid::Uuid::new_v4().to_string()),
        ..Default::default()
    };
    let err = store
        .remove::<AccessSession>("ns", "alice-github", &stale_uid, false)
        .await
        .unwrap_err();
    assert!(
        support::conflict_message(&err).is_some_and(|m| m.contains("UID in precondition")),
        "{err:?}"
    );
    let stale_rv = Preconditions {
        resource_version: created.metadata.resource_version.clone(),
        ..Default::default()
    };
    assert!(matches!(
        store
            .remove::<AccessSession>("ns", "alice-github", &stale_rv, false)
            .await,
        Err(ref e) if support::is_conflict(e)
    ));

    let right = Preconditions {
        uid: created.metadata.uid.clone(),
        ..Default::default()
    };
    let last: AccessSession = store
        .remove("ns", "alice-github", &right, false)
        .await
        .unwrap();
    assert_eq!(last.phase(), SessionPhase::Revoked);
    assert!(matches!(
        store.get::<AccessSession>("ns", "alice-github").await,
        Err(StoreError::NotFound)
    ));

    // The DELETED event carries the last state. The feed up to the head holds the session's
    // three changes and, beside them, the ADDED of Revocation r1 (the revocation that revoked
    // it, written in the same transaction as the session's MODIFIED).
    let mut sub = store.subscribe(start).await.unwrap();
    let head = store.current_version().await.unwrap();
    let mut kinds = Vec::new();
    while sub.cursor() != head {
        let e = sub.next().await.unwrap();
        kinds.push((e.resource.clone(), e.event_type));
    }
    let session_kinds: Vec<EventType> = kinds
        .iter()
        .filter(|(resource, _)| resource == AccessSession::PLURAL)
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(
        session_kinds,
        [EventType::Added, EventType::Modified, EventType::Deleted]
    );
    assert_eq!(
        kinds.len(),
        4,
        "the session's changes and r1's ADDED: {kinds:?}"
    );
    assert_eq!(sub.cursor(), head);
    let mut sub = store.subscribe(start).await.unwrap();
    let deleted = loop {
        let e = sub.next().await.unwrap();
        if e.event_type == EventType::Deleted {
            break e;
        }
    };
    assert_eq!(deleted.object["status"]["revocation"]["cause"], "manual");
    assert_eq!(deleted.object["metadata"]["labels"]["app"], "x");
    assert_eq!(
        deleted.object["metadata"]["resourceVersion"],
        head.to_string()
    );

    // The name is reserved, also for the same server republished under a new UID.
    for uid in ["srv-1", "srv-2"] {
        let err = store
            .create_session(mk_session("ns", "alice-github", uid), false)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NameReserved), "{err:?}");
        assert!(err.to_string().contains("used before"), "{err}");
    }
    // Other namespaces are unaffected.
    store
        .create_session(mk_session("other", "alice-github", "srv-2"), false)
        .await
        .unwrap();
    // Reservations outlive the change log.
    db.client()
        .await
        .batch_execute("DELETE FROM change_log")
        .await
        .unwrap();
    assert!(matches!(
        store
            .create_session(mk_session("ns", "alice-github", "srv-3"), false)
            .await,
        Err(StoreError::NameReserved)
    ));
    // A live name is AlreadyExists.
    assert!(matches!(
        store
            .create_session(mk_session("other", "alice-github", "srv-2"), false)
            .await,
        Err(StoreError::AlreadyExists)
    ));
}

#[tokio::test]
async fn retirement_fences_the_server_uid() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for i in 0..5 {
        store
            .create_session(mk_session("ns", &format!("old-{i}"), "srv-old"), false)
            .await
            .unwrap();
    }
    store
        .create_session(mk_session("other-ns", "old-x", "srv-old"), false)
        .await
        .unwrap();
    store
        .create_session(mk_session("ns", "new-0", "srv-new"), false)
        .await
        .unwrap();
    let new_0 = support::revoke(&store, "ns", "new-0", "manual").await;

    // Retirement is a `server_retired` Revocation by a cluster-wide revoker: its fence and
    // its revocations reach every namespace (old-x in other-ns too).
    let server = ServerRef {
        name: "github".into(),
        uid: "srv-old".into(),
    };
    let retired = support::retire(&store, "ns", "github-retired", &server).await;
    let status = retired.object.status.unwrap();
    assert_eq!(status.revoked_sessions, 6);
    assert!(status.cluster_wide);
    assert!(retired.warnings.is_empty(), "none was revoked before");
    let s: AccessSession = store.get("ns", "old-3").await.unwrap();
    let revocation = s.status.unwrap().revocation.unwrap();
    assert_eq!(revocation.cause, CAUSE_SERVER_RETIRED);
    assert_eq!(
        revocation.revocation_name.as_deref(),
        Some("github-retired")
    );

    // Issuing for the fenced UID: 409.
    let err = store
        .create_session(mk_session("ns", "again", "srv-old"), false)
        .await
        .unwrap_err();
    assert!(
        support::conflict_message(&err).is_some_and(|m| m.contains("retired")),
        "{err:?}"
    );
    // Restoring one of its sessions: 409, still revoked. The production paths to a restore
    // are withdrawals: withdrawing the retirement is refused (fences are permanent), and
    // withdrawing another revocation of the session does not lift it.
    assert!(matches!(
        support::withdraw(&store, "ns", "github-retired").await,
        Err(ref e) if support::conflict_message(e).is_some_and(|m| m.contains("fences are permanent"))
    ));
    assert_eq!(
        support::try_restore(&store, "ns", "old-1")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Revoked
    );
    // Retiring again is idempotent: it revokes nothing new (every session it covers was
    // revoked already, and says so) and the first retirement stays the one on record.
    let again = support::retire(&store, "ns", "github-retired-again", &server).await;
    assert_eq!(again.object.status.unwrap().revoked_sessions, 6);
    assert!(
        again
            .warnings
            .iter()
            .any(|w| w.starts_with("6 of the sessions")),
        "{:?}",
        again.warnings
    );
    let s: AccessSession = store.get("ns", "old-3").await.unwrap();
    assert_eq!(
        s.status
            .unwrap()
            .revocation
            .unwrap()
            .revocation_name
            .as_deref(),
        Some("github-retired")
    );
    // Another server is unaffected: issuing and restoring (withdrawing its revocation) work.
    store
        .create_session(mk_session("ns", "new-1", "srv-new"), false)
        .await
        .unwrap();
    support::withdraw(&store, "ns", &new_0).await.unwrap();
    let restored: AccessSession = store.get("ns", "new-0").await.unwrap();
    assert_eq!(restored.phase(), SessionPhase::Active);
    assert!(restored.status.unwrap().revocation.is_none());

    // The namespace's teardown takes the fence's record (or the namespace could never be
    // deleted), restores nothing, and the fence stays: a namespace of that name made again
    // still refuses the retired UID.
    store
        .delete_revocation(
            "ns",
            "github-retired",
            false,
            &Preconditions::default(),
            false,
        )
        .await
        .expect("the namespace teardown removes the fence's record");
    assert!(store
        .get::<Revocation>("ns", "github-retired")
        .await
        .is_err());
    let s: AccessSession = store.get("ns", "old-1").await.unwrap();
    assert_eq!(s.phase(), SessionPhase::Revoked);
    let err = store
        .create_session(mk_session("ns", "after-teardown", "srv-old"), false)
        .await
        .unwrap_err();
    assert!(
        support::conflict_message(&err).is_some_and(|m| m.contains("retired")),
        "{err:?}"
    );
}

#[tokio::test]
async fn deleting_or_deactivating_an_agent_revokes_its_sessions_for_good() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let agent = store
        .create_agent(mk_agent("bot", &["t"]), false)
        .await
        .unwrap()
        .object;
    store
        .create_session(mk_agent_session("ns", "a", "srv", "bot", &["t"]), false)
        .await
        .unwrap();
    store
        .create_session(mk_agent_session("ns2", "b", "srv", "bot", &[]), false)
        .await
        .unwrap();
    store
        .create_session(mk_session("ns", "unrelated", "srv"), false)
        .await
        .unwrap();

    let mut off = agent.clone();
    off.spec.active = false;
    let off = store.update_agent(off, false).await.unwrap().object;
    assert!(off.status.as_ref().unwrap().deactivated_at.is_some());
    for (ns, name) in [("ns", "a"), ("ns2", "b")] {
        let s: AccessSession = store.get(ns, name).await.unwrap();
        assert_eq!(
            s.status.unwrap().revocation.unwrap().cause,
            CAUSE_AGENT_DEACTIVATED
        );
    }
    assert_eq!(
        store
            .get::<AccessSession>("ns", "unrelated")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Active
    );
    // Inactive agents cannot be issued sessions, and their sessions cannot be restored.
    let err = store
        .create_session(mk_agent_session("ns", "c", "srv", "bot", &[]), false)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(Refusal::Session(SessionRuleError::AgentInactive(_)))
        ),
        "{err:?}"
    );
    // (A restore is a withdrawal; with the agent inactive it leaves the session revoked for
    // the deactivation.)
    let held = support::try_restore(&store, "ns", "a").await.unwrap();
    assert_eq!(held.phase(), SessionPhase::Revoked);
    assert_eq!(
        held.status.unwrap().revocation.unwrap().cause,
        CAUSE_AGENT_DEACTIVATED
    );

    // Delete and re-create the agent under the same name: old sessions stay revoked and
    // cannot be restored, because they bind the old uid.
    let gone: Agent = store
        .remove("", "bot", &Preconditions::default(), false)
        .await
        .unwrap();
    assert_eq!(gone.metadata.uid, agent.metadata.uid);
    let again = store
        .create_agent(mk_agent("bot", &["t"]), false)
        .await
        .unwrap()
        .object;
    assert_ne!(again.metadata.uid, agent.metadata.uid);
    assert_eq!(
        support::try_restore(&store, "ns", "a")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Revoked
    );
    let mut stale_ref = mk_agent_session("ns", "d", "srv", "bot", &[]);
    stale_ref.spec.agent.as_mut().unwrap().uid = agent.metadata.uid.clone();
    assert!(matches!(
        store.create_session(stale_ref, false).await,
        Err(ref e) if support::is_conflict(e)
    ));
    let fresh = store
        .create_session(mk_agent_session("ns", "e", "srv", "bot", &[]), false)
        .await
        .unwrap();
    assert_eq!(fresh.object.spec.agent.unwrap().uid, again.metadata.uid);
}

#[tokio::test]
async fn failed_revocation_commits_nothing() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let agent = store
        .create_agent(mk_agent("bot", &[]), false)
        .await
        .unwrap()
        .object;
    for name in ["a", "b", "poison", "z"] {
        store
            .create_session(mk_agent_session("ns", name, "srv", "bot", &[]), false)
            .await
            .unwrap();
    }
    // Inject a failure in the middle of the bulk revocation: the row "poison" cannot be updated.
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.name = 'poison' THEN RAISE EXCEPTION 'injected failure'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE UPDATE ON objects FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
        )
        .await
        .unwrap();
    let head = store.current_version().await.unwrap();
    let log_rows: i64 = client
        .query_one("SELECT count(*) FROM change_log", &[])
        .await
        .unwrap()
        .get(0);

    let mut off = agent.clone();
    off.spec.active = false;
    let err = store.update_agent(off, false).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    let err = store
        .remove::<Agent>("", "bot", &Preconditions::default(), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");

    assert_eq!(store.current_version().await.unwrap(), head);
    let after: i64 = client
        .query_one("SELECT count(*) FROM change_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, log_rows);
    assert!(store.get::<Agent>("", "bot").await.unwrap().spec.active);
    let sessions = store
        .list::<AccessSession>(&ListQuery::default())
        .await
        .unwrap();
    assert!(sessions
        .items
        .iter()
        .all(|s| s.phase() == SessionPhase::Active));
    assert_eq!(sessions.items.len(), 4);
}

#[tokio::test]
async fn lists_filter_by_namespace_labels_and_fields() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for (ns, name, srv, env) in [
        ("a", "s1", "srv-1", "prod"),
        ("a", "s2", "srv-2", "prod"),
        ("a", "s3", "srv-1", "dev"),
        ("b", "s1", "srv-1", "prod"),
    ] {
        let mut s = mk_session(ns, name, srv);
        s.metadata.labels = Some([("env".to_string(), env.to_string())].into());
        store.create_session(s, false).await.unwrap();
    }
    support::revoke(&store, "b", "s1", "manual").await;
    let names = |l: Vec<AccessSession>| {
        l.iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap(),
                    s.metadata.name.as_deref().unwrap()
                )
            })
            .collect::<Vec<_>>()
    };
    let q = |ns: Option<&str>, labels: &str, fields: &str| ListQuery {
        namespace: ns.map(str::to_string),
        labels: LabelSelector::parse(labels).unwrap(),
        fields: FieldSelector::parse(fields, AccessSession::FIELDS).unwrap(),
        ..Default::default()
    };
    let all = store
        .list::<AccessSession>(&q(None, "", ""))
        .await
        .unwrap()
        .items;
    assert_eq!(names(all), ["a/s1", "a/s2", "a/s3", "b/s1"]);
    let l = store
        .list(&q(Some("a"), "env=prod", ""))
        .await
        .unwrap()
        .items;
    assert_eq!(names(l), ["a/s1", "a/s2"]);
    let l = store
        .list(&q(None, "env in (prod)", "spec.server.uid=srv-1"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(l), ["a/s1", "b/s1"]);
    let l = store
        .list(&q(None, "", "status.phase=Revoked"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(l), ["b/s1"]);
    let l = store
        .list(&q(None, "env!=prod", "status.phase!=Revoked"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(l), ["a/s3"]);
    let l = store
        .list(&q(Some("a"), "", "metadata.name=s2"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(l), ["a/s2"]);
    let l = store
        .list::<AccessSession>(&q(None, "", "spec.agent.name="))
        .await
        .unwrap()
        .items;
    assert_eq!(l.len(), 4, "a missing field reads as empty");
    let agents = store.list::<Agent>(&ListQuery::default()).await.unwrap();
    assert!(agents.items.is_empty());
}
