//! Attacks on the revocation promise (issue "Hardening", items 1, 8, 10 and the sharper
//! tests of item 14), against a real PostgreSQL and, where a user would see it, through the
//! HTTP API and the real kubectl.
//!
//! - A session stays revoked while any live revocation covers it; withdrawing one restores
//!   only what no other covers; `revokedSessions` counts every covered session.
//! - A revocation is a standing lock: while it exists (and until its `spec.expiresAt`), no
//!   session it would cover may be issued, enrolled, completed or restored (409 naming it).
//! - A fence reaches no further than its creator's authority.
//! - An enrollment's owner is its creator by name *and* uid.
//! - A transaction whose second statement fails leaves nothing behind.

mod support;

use apiserver::store::Refusal;
use std::sync::Arc;
use std::time::Duration;
use support::StoreExt;

use apis::{
    AccessSession, Enrollment, EnrollmentPhase, Revocation, RevocationTarget, ServerRef,
    SessionPhase,
};
use apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use apiserver::store::{PgStore, Requester, RevokerAuthority, Store, StoreError};
use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::kubectl::{failed, ok};
use support::server::{TestServer, USER_TOKEN};
use support::*;

const NS: &str = "locks";
const SRV: &str = "srv-lock-1";
const ALICE: &str = "alice@example.com";

fn owner() -> Requester {
    Requester {
        name: "adapter".into(),
        uid: "adapter-uid-1".into(),
    }
}

fn mk_revocation(name: &str, target: RevocationTarget, cause: &str) -> Revocation {
    support::mk_revocation(NS, name, target, cause)
}

/// The three target kinds, each aimed at alice's session `s1` on `SRV`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TargetKind {
    Session,
    Server,
    Subject,
}

const KINDS: [TargetKind; 3] = [TargetKind::Session, TargetKind::Server, TargetKind::Subject];

impl TargetKind {
    fn target(self) -> RevocationTarget {
        match self {
            Self::Session => RevocationTarget {
                session: Some("s1".into()),
                ..Default::default()
            },
            Self::Server => RevocationTarget {
                server: Some(ServerRef {
                    name: "github".into(),
                    uid: SRV.into(),
                }),
                ..Default::default()
            },
            Self::Subject => RevocationTarget {
                subject: Some(ALICE.into()),
                ..Default::default()
            },
        }
    }

    /// Whether a *new* session of alice on `SRV` named `name` falls under this target
    /// (a session target covers its one session only; names are never reused).
    fn covers_new(self) -> bool {
        self != Self::Session
    }
}

fn alice_session(name: &str) -> AccessSession {
    mk_human_session(NS, name, SRV, ALICE)
}

fn enrollment_of(session: AccessSession) -> Enrollment {
    let mut e = Enrollment {
        spec: session.spec,
        ..Default::default()
    };
    e.metadata = session.metadata;
    e
}

async fn phase(store: &PgStore, name: &str) -> SessionPhase {
    store
        .get::<AccessSession>(NS, name)
        .await
        .expect("session exists")
        .phase()
}

fn covering_names(s: &AccessSession) -> Vec<String> {
    s.status
        .as_ref()
        .and_then(|st| st.revocation.as_ref())
        .map(|r| {
            r.covered_by
                .iter()
                .filter_map(|c| c.revocation_name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates a revocation in `NS` as a namespace revoker; returns its `revokedSessions`.
async fn revoke(store: &PgStore, name: &str, target: RevocationTarget, cause: &str) -> u32 {
    store
        .create_revocation(
            mk_revocation(name, target, cause),
            RevokerAuthority::Namespace,
            false,
        )
        .await
        .unwrap_or_else(|e| panic!("revocation {name}: {e}"))
        .object
        .status
        .map(|s| s.revoked_sessions)
        .unwrap_or_default()
}

async fn withdraw(store: &PgStore, name: &str) {
    store
        .delete_revocation(NS, name, true, &Default::default(), false)
        .await
        .unwrap_or_else(|e| panic!("withdrawing {name}: {e}"));
}

fn conflict_naming(result: Result<impl std::fmt::Debug, StoreError>, revocation: &str, what: &str) {
    match result {
        Err(ref e) if support::is_conflict(e) => assert!(
            e.to_string().contains(&format!("{revocation:?}")),
            "{what}: the conflict should name revocation {revocation}: {e}"
        ),
        other => panic!("{what}: expected 409 naming {revocation}, got {other:?}"),
    }
}

/// A restore of session `name` — the production path: withdrawing a revocation of it, here
/// one made for the attempt — is held by the revocations `holders`: the session stays
/// revoked, covered by exactly them. (Restores used to be a store shortcut answering 409
/// naming a standing revocation; a withdrawal instead shrinks the coverage and keeps the
/// session revoked, which is what the standing lock promises.)
async fn restore_held(store: &PgStore, name: &str, holders: &[&String], what: &str) {
    let s = support::try_restore(store, NS, name)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(s.phase(), SessionPhase::Revoked, "{what}");
    let want: Vec<String> = holders.iter().map(|h| h.to_string()).collect();
    assert_eq!(
        covering_names(&s),
        want,
        "{what}: held by the standing revocations"
    );
}

/// Every target kind × {existing, later issuance, enrollment, completion, restore} ×
/// {one revocation, two overlapping, withdrawal of either}.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_are_standing_locks_for_every_target_kind() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut round = 0;
    for first in KINDS {
        for second in KINDS {
            for withdraw_first in [true, false] {
                round += 1;
                // Fresh names per round: names are never reused.
                let ns_store = &store;
                let s1 = format!("s1-{round}");
                let pending = format!("pending-{round}");
                // Targets name "s1": rename to this round's session.
                // ... and a subject and server of its own, so earlier rounds are not covered.
                let user = format!("alice-{round}@example.com");
                let target = |kind: TargetKind| {
                    let mut t = kind.target();
                    if t.session.is_some() {
                        t.session = Some(s1.clone());
                    }
                    if let Some(server) = t.server.as_mut() {
                        server.uid = format!("{SRV}-{round}");
                    }
                    if t.subject.is_some() {
                        t.subject = Some(user.clone());
                    }
                    t
                };
                let mk = |name: &str| {
                    let mut s = mk_human_session(NS, name, &format!("{SRV}-{round}"), &user);
                    s.spec.server.name = "github".into();
                    s
                };
                let session = mk(&s1);
                ns_store
                    .create_session(session.clone(), false)
                    .await
                    .unwrap();
                let enrolling = mk(&pending);
                ns_store
                    .create_enrollment(enrollment_of(enrolling.clone()), &owner(), false)
                    .await
                    .unwrap();

                let (r1, r2) = (format!("r1-{round}"), format!("r2-{round}"));
                let one = revoke(ns_store, &r1, target(first), "manual").await;
                // Existing: revoked, and counted.
                assert_eq!(phase(ns_store, &s1).await, SessionPhase::Revoked);
                let expected_first = if first == TargetKind::Session { 1 } else { 2 };
                assert_eq!(
                    one, expected_first,
                    "{first:?}: the session and, for many-session targets, the pending one"
                );
                // One revocation alone already stands for its target.
                if first.covers_new() {
                    let alone = mk(&format!("alone-{round}"));
                    conflict_naming(
                        ns_store.create_session(alone.clone(), false).await,
                        &r1,
                        "issuance under one revocation",
                    );
                    conflict_naming(
                        ns_store
                            .create_enrollment(enrollment_of(alone), &owner(), false)
                            .await,
                        &r1,
                        "enrollment under one revocation",
                    );
                }
                // A restore (a withdrawal of another revocation of s1) leaves it revoked,
                // covered by r1.
                restore_held(ns_store, &s1, &[&r1], "restore under one revocation").await;
                let two = revoke(ns_store, &r2, target(second), "compromised").await;
                let expected_second = if second == TargetKind::Session { 1 } else { 2 };
                assert_eq!(
                    two,
                    expected_second,
                    "{first:?} then {second:?}: an overlapping revocation counts what it covers, revoked already or not"
                );
                let s = ns_store.get::<AccessSession>(NS, &s1).await.unwrap();
                assert_eq!(covering_names(&s), vec![r1.clone(), r2.clone()]);
                assert_eq!(
                    s.status
                        .as_ref()
                        .unwrap()
                        .revocation
                        .as_ref()
                        .unwrap()
                        .revocation_name,
                    Some(r1.clone()),
                    "the first revocation stays the one on record"
                );

                // Later issuance, enrollment and completion under a standing lock.
                let later = format!("later-{round}");
                let new = mk(&later);
                let blocker = [(first, &r1), (second, &r2)]
                    .into_iter()
                    .find(|(k, _)| k.covers_new())
                    .map(|(_, r)| r.clone());
                let issued = ns_store.create_session(new.clone(), false).await;
                let enrolled = ns_store
                    .create_enrollment(enrollment_of(new.clone()), &owner(), false)
                    .await;
                match &blocker {
                    Some(r) => {
                        conflict_naming(issued, r, "issuance");
                        conflict_naming(enrolled, r, "enrollment");
                    }
                    None => {
                        issued.expect("a session target does not cover other sessions");
                    }
                }
                let completion = ns_store
                    .complete_enrollment(NS, &pending, None, false)
                    .await;
                match (
                    &blocker,
                    first == TargetKind::Session && second == TargetKind::Session,
                ) {
                    (_, true) => {
                        completion.expect("session targets do not cover the pending session");
                    }
                    (Some(r), false) => conflict_naming(completion, r, "completion"),
                    (None, false) => unreachable!(),
                }
                // A restore is held while either stands.
                restore_held(ns_store, &s1, &[&r1, &r2], "restore under two revocations").await;

                // Withdraw either: still revoked, still refused.
                let (gone, stays) = if withdraw_first {
                    (&r1, &r2)
                } else {
                    (&r2, &r1)
                };
                withdraw(ns_store, gone).await;
                assert_eq!(
                    phase(ns_store, &s1).await,
                    SessionPhase::Revoked,
                    "{first:?}+{second:?}: withdrawing {gone} must not lift {stays}"
                );
                let s = ns_store.get::<AccessSession>(NS, &s1).await.unwrap();
                assert_eq!(covering_names(&s), vec![stays.clone()]);
                restore_held(
                    ns_store,
                    &s1,
                    &[stays],
                    "restore under the remaining revocation",
                )
                .await;
                // Withdraw the other: restored, and issuance is open again.
                withdraw(ns_store, stays).await;
                assert_eq!(phase(ns_store, &s1).await, SessionPhase::Active);
                let again = format!("again-{round}");
                ns_store
                    .create_session(mk(&again), false)
                    .await
                    .expect("no revocation stands any more");
            }
        }
    }
}

/// The issue's reproduction, as a user sees it through kubectl: s1; R1 (session, manual);
/// R2 (subject alice, compromised) reports `revokedSessions: 1`; deleting R1 leaves s1
/// revoked; a new session for alice a second later is 409 naming R2; both revocations stay
/// in the audit trail and the session lists both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_revocations_through_kubectl() {
    let server = TestServer::start().await;
    let session_yaml = |name: &str| {
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata: {{name: {name}}}\nspec:\n  server: {{name: github, uid: {SRV}}}\n  subject: {{user: {ALICE}}}\n  expiresAt: \"{}\"\n",
            in_hours(1).0.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
    };
    let revocation_yaml = |name: &str, target: &str, cause: &str| {
        format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {{name: {name}}}\nspec: {{target: {target}, cause: {cause}}}\n"
        )
    };
    let create = |manifest: String| {
        let server = &server;
        async move {
            server
                .kubectl_with(
                    &server.kubeconfig,
                    &["create", "-n", NS, "-f", "-", "-o", "json"],
                    Some(&manifest),
                )
                .await
        }
    };
    let out = create(session_yaml("s1")).await;
    ok(&out);
    let out = create(revocation_yaml("r1", "{session: s1}", "manual")).await;
    ok(&out);
    let out = create(revocation_yaml(
        "r2",
        &format!("{{subject: {ALICE}}}"),
        "compromised",
    ))
    .await;
    ok(&out);
    let r2: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(r2["status"]["revokedSessions"], 1, "{r2:#}");
    assert!(
        out.stderr.contains("already revoked"),
        "a Warning says the session was already revoked: {out:#?}"
    );

    let out = server.kubectl(&["delete", "rvk", "-n", NS, "r1"]).await;
    ok(&out);
    let out = server
        .kubectl(&["get", "acs", "-n", NS, "s1", "-o", "json"])
        .await;
    let s1: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(s1["status"]["phase"], "Revoked", "{s1:#}");
    assert_eq!(
        s1["status"]["revocation"]["coveredBy"],
        serde_json::json!([{"cause": "compromised", "revocationName": "r2"}]),
        "{s1:#}"
    );

    let out = create(session_yaml("s2")).await;
    failed(&out);
    assert!(
        out.stderr.contains("Error from server (Conflict)") && out.stderr.contains("\"r2\""),
        "409 naming r2: {out:#?}"
    );
    let out = server.kubectl(&["get", "rvk", "-n", NS]).await;
    assert!(out.stdout.contains("r2"), "{out:#?}");

    let out = server.kubectl(&["delete", "rvk", "-n", NS, "r2"]).await;
    ok(&out);
    let out = server
        .kubectl(&[
            "get",
            "acs",
            "-n",
            NS,
            "s1",
            "-o",
            "jsonpath={.status.phase}",
        ])
        .await;
    assert_eq!(out.stdout, "Active", "{out:#?}");
    assert!(create(session_yaml("s2")).await.success);
}

/// `spec.expiresAt` ends the standing lock: issuance is refused before and allowed after;
/// the sessions it revoked stay revoked until it is deleted. A fence cannot expire, and an
/// expiry in the past is invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_revocation_stops_refusing_at_its_expiry() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store
        .create_session(alice_session("old"), false)
        .await
        .unwrap();
    let expires = {
        let t = Timestamp::now() + SignedDuration::from_secs(2);
        Time(Timestamp::from_second(t.as_second()).unwrap())
    };
    let mut r = mk_revocation("short", TargetKind::Subject.target(), "compromised");
    r.spec.expires_at = Some(expires.clone());
    store
        .create_revocation(r, RevokerAuthority::Namespace, false)
        .await
        .unwrap();
    conflict_naming(
        store.create_session(alice_session("during"), false).await,
        "short",
        "issuance before expiry",
    );
    while Timestamp::now() <= expires.0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .create_session(alice_session("after"), false)
        .await
        .expect("the lock has expired");
    assert_eq!(phase(&store, "old").await, SessionPhase::Revoked);

    let mut past = mk_revocation("past", TargetKind::Subject.target(), "manual");
    past.spec.expires_at = Some(Time(Timestamp::now() - SignedDuration::from_secs(60)));
    assert!(matches!(
        store
            .create_revocation(past, RevokerAuthority::Namespace, false)
            .await,
        Err(StoreError::Invalid(_))
    ));
    let mut fence = mk_revocation("fence", TargetKind::Server.target(), "server_retired");
    fence.spec.expires_at = Some(in_hours(1));
    assert!(matches!(
        store
            .create_revocation(fence, RevokerAuthority::Cluster, false)
            .await,
        Err(StoreError::Invalid(_))
    ));
}

/// A namespace revoker's fence stays in its namespace; a cluster-wide revoker's reaches
/// every namespace and revokes the server's sessions there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_reach_no_further_than_their_creator() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for ns in ["team-a", "team-b"] {
        store
            .create_session(mk_session(ns, "s", "srv-shared"), false)
            .await
            .unwrap();
    }
    let fence = |ns: &str, name: &str, uid: &str| {
        let mut r = mk_revocation(
            name,
            RevocationTarget {
                server: Some(ServerRef {
                    name: "github".into(),
                    uid: uid.into(),
                }),
                ..Default::default()
            },
            "server_retired",
        );
        r.metadata.namespace = Some(ns.into());
        r
    };
    // Namespace authority: team-a only.
    let local = store
        .create_revocation(
            fence("team-a", "retire", "srv-shared"),
            RevokerAuthority::Namespace,
            false,
        )
        .await
        .unwrap()
        .object;
    assert!(!local.status.as_ref().unwrap().cluster_wide);
    assert_eq!(
        store
            .get::<AccessSession>("team-a", "s")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Revoked
    );
    assert_eq!(
        store
            .get::<AccessSession>("team-b", "s")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Active,
        "a namespace revoker cannot reach team-b"
    );
    assert!(matches!(
        store
            .create_session(mk_session("team-a", "s2", "srv-shared"), false)
            .await,
        Err(ref e) if support::is_conflict(e)
    ));
    store
        .create_session(mk_session("team-b", "s2", "srv-shared"), false)
        .await
        .expect("the fence does not apply in team-b");

    // Cluster authority: everywhere, existing sessions included.
    let global = store
        .create_revocation(
            fence("team-a", "retire-all", "srv-shared"),
            RevokerAuthority::Cluster,
            false,
        )
        .await
        .unwrap()
        .object;
    assert!(global.status.as_ref().unwrap().cluster_wide);
    // team-a/s (already revoked by the local fence), team-b/s and team-b/s2.
    assert_eq!(global.status.as_ref().unwrap().revoked_sessions, 3);
    for name in ["s", "s2"] {
        assert_eq!(
            store
                .get::<AccessSession>("team-b", name)
                .await
                .unwrap()
                .phase(),
            SessionPhase::Revoked
        );
    }
    assert!(matches!(
        store
            .create_session(mk_session("team-c", "s", "srv-shared"), false)
            .await,
        Err(ref e) if support::is_conflict(e)
    ));
}

/// Grants cluster-wide creation of revocations to everyone but alice, as a RoleBinding in
/// one namespace (instead of a ClusterRoleBinding) would.
struct NamespaceRevokerAlice;

#[async_trait]
impl Authorizer for NamespaceRevokerAlice {
    async fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.name == "alice"
            && a.resource_request
            && a.namespace.is_empty()
            && a.verb == "create"
        {
            Decision::Deny("alice revokes in her namespaces only".into())
        } else {
            Decision::Allow
        }
    }
}

/// Through the API: the fence's reach follows RBAC on "create revocations in every
/// namespace", asked of the authorizer for the creating user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_scope_follows_the_creators_rbac() {
    let server = TestServer::start_with_authorizer(Arc::new(NamespaceRevokerAlice)).await;
    for ns in ["team-a", "team-b"] {
        server
            .store
            .create_session(mk_session(ns, "s", "srv-x"), false)
            .await
            .unwrap();
    }
    let alice = server.kubeconfig_for(USER_TOKEN);
    let manifest = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {name: retire}\nspec: {target: {server: {name: github, uid: srv-x}}, cause: server_retired}\n";
    let out = server
        .kubectl_with(
            &alice,
            &[
                "create",
                "-n",
                "team-a",
                "-f",
                "-",
                "-o",
                "jsonpath={.status.clusterWide}",
            ],
            Some(manifest),
        )
        .await;
    ok(&out);
    assert_eq!(out.stdout, "", "alice's fence is not cluster-wide");
    assert_eq!(
        server
            .store
            .get::<AccessSession>("team-b", "s")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Active
    );
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &[
                "create",
                "-n",
                "team-a",
                "-f",
                "-",
                "-o",
                "jsonpath={.status.clusterWide}",
            ],
            Some(&manifest.replace("name: retire}", "name: retire-all}")),
        )
        .await;
    ok(&out);
    assert_eq!(out.stdout, "true");
    assert_eq!(
        server
            .store
            .get::<AccessSession>("team-b", "s")
            .await
            .unwrap()
            .phase(),
        SessionPhase::Revoked
    );
}

/// A ServiceAccount deleted and re-created under the same name gets a new uid: it does not
/// inherit the pending enrollments of the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_ownership_is_bound_to_the_uid() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let old = Requester {
        name: "system:serviceaccount:ns:adapter".into(),
        uid: "uid-old".into(),
    };
    let recreated = Requester {
        uid: "uid-new".into(),
        ..old.clone()
    };
    let written = store
        .create_enrollment(enrollment_of(alice_session("e1")), &old, false)
        .await
        .unwrap()
        .object;
    let status = written.status.unwrap();
    assert_eq!(status.owner_uid.as_deref(), Some("uid-old"));
    assert!(matches!(
        store
            .delete_enrollment(NS, "e1", Some(&recreated), &Default::default(), false)
            .await,
        Err(StoreError::Refused(Refusal::NotOwner(_)))
    ));
    assert_eq!(
        store.get::<Enrollment>(NS, "e1").await.unwrap().phase(),
        EnrollmentPhase::Pending
    );
    store
        .delete_enrollment(NS, "e1", Some(&old), &Default::default(), false)
        .await
        .expect("the owner, same name and uid, may withdraw");
}

/// The sequence, the change log's length and every stored session, as one comparable value.
async fn snapshot(client: &tokio_postgres::Client) -> (i64, i64, String) {
    let row = client
        .query_one(
            "SELECT (SELECT seq FROM sync_state), (SELECT count(*) FROM change_log),
                    (SELECT string_agg(body::text, '|' ORDER BY name) FROM objects WHERE resource = 'accesssessions')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// The second statement of a revocation's transaction fails (the revocation record, after
/// the sessions were revoked): sessions, change log and sequence are all unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_second_statement_rolls_back_the_first() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for name in ["a", "b"] {
        store
            .create_session(alice_session(name), false)
            .await
            .unwrap();
    }
    let client = db.client().await;
    let before = snapshot(&client).await;
    client
        .batch_execute(
            "CREATE FUNCTION refuse_revocations() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.resource = 'revocations' THEN RAISE EXCEPTION 'injected failure'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_revocations BEFORE INSERT ON objects
               FOR EACH ROW EXECUTE FUNCTION refuse_revocations();",
        )
        .await
        .unwrap();
    let result = store
        .create_revocation(
            mk_revocation("r", TargetKind::Subject.target(), "compromised"),
            RevokerAuthority::Namespace,
            false,
        )
        .await;
    assert!(
        result.is_err(),
        "the injected failure must surface: {result:?}"
    );
    assert_eq!(
        snapshot(&client).await,
        before,
        "nothing of the transaction remains"
    );
    for name in ["a", "b"] {
        assert_eq!(phase(&store, name).await, SessionPhase::Active);
    }
    client
        .batch_execute("DROP TRIGGER refuse_revocations ON objects")
        .await
        .unwrap();
    store
        .create_revocation(
            mk_revocation("r", TargetKind::Subject.target(), "compromised"),
            RevokerAuthority::Namespace,
            false,
        )
        .await
        .expect("works once the failure is gone");
    assert_eq!(phase(&store, "a").await, SessionPhase::Revoked);
    // Positive control of "nothing remains": the same snapshot sees the committed revocation.
    assert_ne!(
        snapshot(&client).await,
        before,
        "the snapshot sees a commit"
    );
}

/// Revocation is final as kubectl sees it: `kubectl get -w --output-watch-events -o json`
/// records every session of 60 rounds of completion racing revocation (on two replicas);
/// per session the versions rise, it turns Revoked once, and never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocation_is_final_in_kubectls_watch() {
    use tokio::io::AsyncReadExt;
    const ROUNDS: usize = 60;
    let server = TestServer::start().await;
    let replica = PgStore::start(server.db.store_config()).await.unwrap();
    let mut watch = server.kubectl_spawn(&[
        "get",
        "acs",
        "-n",
        "race",
        "-w",
        "--output-watch-events",
        "-o",
        "json",
    ]);
    // The watch is open once kubectl has listed: give it a moment, then race.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..ROUNDS {
        let name = format!("e-{i}");
        let mut e = enrollment_of(mk_session("race", &name, "srv-1"));
        e.metadata.namespace = Some("race".into());
        server
            .store
            .create_enrollment(e, &owner(), false)
            .await
            .unwrap();
        let complete = {
            let (store, name) = (server.store.clone(), name.clone());
            tokio::spawn(async move { store.complete_enrollment("race", &name, None, false).await })
        };
        let revoke = {
            let (store, name) = (replica.clone(), name.clone());
            tokio::spawn(async move {
                let mut r = mk_revocation(
                    &format!("r-{i}"),
                    RevocationTarget {
                        session: Some(name),
                        ..Default::default()
                    },
                    "compromised",
                );
                r.metadata.namespace = Some("race".into());
                store
                    .create_revocation(r, RevokerAuthority::Namespace, false)
                    .await
            })
        };
        let _ = complete.await.unwrap();
        revoke
            .await
            .unwrap()
            .expect("the revocation always applies");
    }
    // A sentinel marks the end of the race in the stream.
    server
        .store
        .create_session(mk_session("race", "zz-end", "srv-2"), false)
        .await
        .unwrap();
    let mut stdout = watch.stdout.take().unwrap();
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let events: Vec<serde_json::Value> = loop {
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout_at(deadline, stdout.read(&mut chunk))
            .await
            .expect("kubectl delivers the race within 30 s")
            .unwrap();
        assert!(n > 0, "kubectl's watch ended early");
        buf.extend_from_slice(&chunk[..n]);
        let parsed: Vec<serde_json::Value> = serde_json::Deserializer::from_slice(&buf)
            .into_iter::<serde_json::Value>()
            .map_while(Result::ok)
            .collect();
        if parsed
            .iter()
            .any(|e| e["object"]["metadata"]["name"] == "zz-end")
        {
            break parsed;
        }
    };
    let _ = watch.kill().await;
    let mut state: std::collections::BTreeMap<String, (u64, bool, usize)> = Default::default();
    for e in &events {
        let name = e["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let rv: u64 = e["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let phase = e["object"]["status"]["phase"].as_str().unwrap_or("");
        let (last, revoked, turns) = state.entry(name.clone()).or_default();
        assert!(rv > *last, "{name}: versions go back ({rv} after {last})");
        *last = rv;
        if *revoked {
            assert_eq!(phase, "Revoked", "{name} came back as {phase}: {e:#}");
        } else if phase == "Revoked" {
            *revoked = true;
            *turns += 1;
        }
    }
    let revoked = state.values().filter(|(_, revoked, _)| *revoked).count();
    assert_eq!(
        revoked, ROUNDS,
        "every raced session ends revoked in the stream"
    );
    assert!(state.values().all(|(_, _, turns)| *turns <= 1));
}
