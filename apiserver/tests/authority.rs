//! Enrollments and revocations (DESIGN §2): the real `kubectl` driving enrollment,
//! completion, withdrawal, revocation and agent lifecycle; races between completion,
//! revocation, issuance, deactivation and updates against the real PostgreSQL; what a watch
//! of the affected sessions sees; and garbage collection of completed enrollments.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use apis::rules::SessionRuleError;
use apis::selector::FieldSelector;
use apis::{
    AccessSession, Enrollment, EnrollmentPhase, Kind, Revocation, RevocationTarget, SessionPhase,
};
use apiserver::store::{
    EventType, ListQuery, PgStore, Refusal, Requester, ResourceVersion, RevokerAuthority, Store,
    StoreError,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};
use support::kubectl::*;
use support::server::{Output, TestServer, ADMIN_TOKEN, USER_TOKEN};
use support::StoreExt;
use support::*;

/// The columns `kubectl get revocations` prints.
const REVOCATION_COLUMNS: [&str; 7] = [
    "NAME",
    "TARGET",
    "CAUSE",
    "REVOKED",
    "DELIVERED",
    "DELIVERED-IN",
    "AGE",
];

const SERVER_UID: &str = "srv-uid-1";
/// Rounds of each race.
const ROUNDS: usize = 120;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An Enrollment manifest: an agent session (teams `[payments]`) when `agent` is given, else
/// a human session of alice@example.com.
fn enrollment_yaml(name: &str, server_uid: &str, agent: Option<&str>, expires: &str) -> String {
    let who = match agent {
        Some(a) => format!("  agent: {{name: {a}}}\n  teams: [payments]\n"),
        None => "  subject: {user: alice@example.com}\n".to_string(),
    };
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Enrollment\nmetadata:\n  name: {name}\nspec:\n  server: {{name: github, uid: {server_uid}}}\n{who}  expiresAt: \"{expires}\"\n"
    )
}

fn session_yaml(name: &str, server_uid: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\nspec:\n  server: {{name: github, uid: {server_uid}}}\n  subject: {{user: alice@example.com}}\n  expiresAt: \"{}\"\n",
        in_secs(1800)
    )
}

/// A Revocation manifest; `target` is a YAML flow mapping such as `{session: s1}`.
fn revocation_yaml(name: &str, target: &str, cause: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: {name}\nspec:\n  target: {target}\n  cause: {cause}\n  message: testing\n"
    )
}

fn agent_yaml(name: &str) -> String {
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: {name}\nspec:\n  teams: [payments]\n"
    )
}

/// `kubectl create -f -` with `manifest`, as the user of `kubeconfig`, in `ns`.
async fn create(server: &TestServer, kubeconfig: &Path, ns: &str, manifest: &str) -> Output {
    server
        .kubectl_with(kubeconfig, &["create", "-n", ns, "-f", "-"], Some(manifest))
        .await
}

/// The completion patch (or any status patch) through kubectl.
async fn patch_status(server: &TestServer, kubeconfig: &Path, name: &str, patch: &str) -> Output {
    server
        .kubectl_with(
            kubeconfig,
            &[
                "patch",
                "enrollment",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                patch,
            ],
            None,
        )
        .await
}

const COMPLETE: &str = r#"{"status":{"phase":"Completed"}}"#;

async fn session(server: &TestServer, ns: &str, name: &str) -> AccessSession {
    server
        .store
        .get::<AccessSession>(ns, name)
        .await
        .unwrap_or_else(|e| panic!("session {ns}/{name}: {e}"))
}

async fn enrollment(server: &TestServer, ns: &str, name: &str) -> Enrollment {
    server
        .store
        .get::<Enrollment>(ns, name)
        .await
        .unwrap_or_else(|e| panic!("enrollment {ns}/{name}: {e}"))
}

/// `(cause, revocationName)` of a revoked session, after checking phase and revocation agree.
fn revoked_by(s: &AccessSession) -> Option<(String, Option<String>)> {
    let status = s.status.as_ref().expect("sessions always have a status");
    match &status.revocation {
        Some(r) => {
            assert_eq!(status.phase, SessionPhase::Revoked, "{s:#?}");
            Some((r.cause.clone(), r.revocation_name.clone()))
        }
        None => {
            assert_ne!(status.phase, SessionPhase::Revoked, "{s:#?}");
            None
        }
    }
}

fn by(cause: &str, name: Option<&str>) -> Option<(String, Option<String>)> {
    Some((cause.to_string(), name.map(str::to_string)))
}

async fn assert_not_found<K: apis::strategy::Strategy + std::fmt::Debug>(
    server: &TestServer,
    ns: &str,
    name: &str,
) {
    match server.store.get::<K>(ns, name).await {
        Err(StoreError::NotFound) => {}
        other => panic!("{} {ns}/{name} should not exist: {other:?}", K::KIND),
    }
}

fn alice() -> Requester {
    Requester {
        name: "alice".into(),
        uid: "alice-uid".into(),
    }
}

fn mk_enrollment(ns: &str, name: &str, session: AccessSession) -> Enrollment {
    let mut e = Enrollment {
        spec: session.spec,
        ..Default::default()
    };
    e.metadata.namespace = Some(ns.into());
    e.metadata.name = Some(name.into());
    e
}

fn session_target(name: &str) -> RevocationTarget {
    RevocationTarget {
        session: Some(name.into()),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// A. Enrollment through kubectl
// ---------------------------------------------------------------------------------------------

/// `kubectl create` of an Enrollment (as alice) creates the pending session with the same
/// uid and alice as owner; `kubectl get enr` shows it; the completion patch activates the
/// session and removes only the pending metadata; a mismatching `metadata.uid` in the patch
/// is a failed precondition (409) and a matching one is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enroll_then_complete_activates_the_session() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    let agent = server
        .store
        .create_agent(mk_agent("billing-bot", &["payments"]), false)
        .await
        .unwrap()
        .object;

    let out = create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("e1", SERVER_UID, Some("billing-bot"), &in_secs(1800)),
    )
    .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "enrollment.access.mcp-runtime.dev/e1 created"
    );

    let e = enrollment(&server, "default", "e1").await;
    let status = e.status.clone().unwrap();
    assert_eq!(status.phase, EnrollmentPhase::Pending);
    assert_eq!(status.owner.as_deref(), Some("alice"));
    assert!(status.requested_at.is_some() && status.completed_at.is_none());
    let uid = e.metadata.uid.clone().unwrap();

    let s = session(&server, "default", "e1").await;
    assert_eq!(s.metadata.uid.as_deref(), Some(uid.as_str()), "same uid");
    let st = s.status.clone().unwrap();
    assert_eq!(st.phase, SessionPhase::PendingEnrollment);
    let pending = st.enrollment.clone().expect("status.enrollment");
    assert_eq!(pending.owner, "alice");
    assert_eq!(pending.state, "Pending");
    assert!(st.revocation.is_none());
    // The admitted spec: the agent uid is bound, and the enrollment shows the same spec.
    assert_eq!(
        s.spec.agent.as_ref().unwrap().uid,
        agent.metadata.uid,
        "agent uid bound at issuance"
    );
    assert_eq!(s.spec, e.spec);

    // The same through kubectl, as alice sees it.
    let out = server
        .kubectl_with(&alice, &["get", "acs", "e1", "-o", "json"], None)
        .await;
    ok(&out);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["metadata"]["uid"], json!(uid));
    assert_eq!(v["status"]["phase"], "PendingEnrollment");
    assert_eq!(v["status"]["enrollment"]["owner"], "alice");

    let out = server.kubectl_with(&alice, &["get", "enr"], None).await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(
        t.header,
        ["NAME", "SERVER", "AGENT", "OWNER", "PHASE", "AGE"],
        "{}",
        out.stdout
    );
    assert_eq!(t.names(), ["e1"]);
    assert_eq!(
        t.row("e1")[..5],
        ["e1", "github", "billing-bot", "alice", "Pending"]
    );
    assert!(is_age(&t.row("e1")[5]), "{t:?}");

    // A uid precondition that does not match: 409, nothing changes.
    let out = patch_status(
        &server,
        &alice,
        "e1",
        r#"{"metadata":{"uid":"00000000-0000-0000-0000-000000000000"},"status":{"phase":"Completed"}}"#,
    )
    .await;
    failed_with(&out, "Conflict", "Precondition failed");
    assert_eq!(
        session(&server, "default", "e1").await.phase(),
        SessionPhase::PendingEnrollment
    );
    assert_eq!(
        enrollment(&server, "default", "e1").await.phase(),
        EnrollmentPhase::Pending
    );

    // The matching uid as a precondition: completes.
    let out = patch_status(
        &server,
        &alice,
        "e1",
        &format!(r#"{{"metadata":{{"uid":"{uid}"}},"status":{{"phase":"Completed"}}}}"#),
    )
    .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "enrollment.access.mcp-runtime.dev/e1 patched"
    );
    let after = session(&server, "default", "e1").await;
    let st = after.status.clone().unwrap();
    assert_eq!(st.phase, SessionPhase::Active);
    assert!(st.enrollment.is_none(), "pending metadata removed: {st:?}");
    assert!(st.revocation.is_none());
    assert_eq!(after.spec, s.spec, "authorization fields stay as issued");
    assert_eq!(after.metadata.uid, s.metadata.uid);
    let e = enrollment(&server, "default", "e1").await;
    let status = e.status.unwrap();
    assert_eq!(status.phase, EnrollmentPhase::Completed);
    assert!(status.completed_at.is_some());
    assert_eq!(status.owner.as_deref(), Some("alice"));

    let out = server.kubectl(&["get", "enr", "e1"]).await;
    ok(&out);
    assert_eq!(Table::parse(&out.stdout).row("e1")[4], "Completed");
    let out = server.kubectl(&["get", "acs", "e1"]).await;
    ok(&out);
    assert_eq!(Table::parse(&out.stdout).row("e1")[4], "Active");
}

/// A completion patch may change `status.phase` to `Completed` and nothing else: a spec
/// change or another phase is 422 naming the field, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_patch_changing_anything_else_is_invalid() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    ok(&create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("e2", SERVER_UID, None, &in_secs(1800)),
    )
    .await);
    let before = session(&server, "default", "e2").await;

    let out = patch_status(
        &server,
        &alice,
        "e2",
        r#"{"spec":{"teams":["x"]},"status":{"phase":"Completed"}}"#,
    )
    .await;
    invalid(&out, "Enrollment", "e2", "spec.teams");
    let out = patch_status(
        &server,
        &alice,
        "e2",
        r#"{"spec":{"expiresAt":"2099-01-01T00:00:00Z"},"status":{"phase":"Completed"}}"#,
    )
    .await;
    invalid(&out, "Enrollment", "e2", "spec.expiresAt");
    let out = patch_status(
        &server,
        &alice,
        "e2",
        r#"{"status":{"phase":"Completed","owner":"mallory"}}"#,
    )
    .await;
    invalid(&out, "Enrollment", "e2", "status.owner");
    let out = patch_status(&server, &alice, "e2", r#"{"status":{"phase":"Pending"}}"#).await;
    invalid(&out, "Enrollment", "e2", "status.phase");
    let out = patch_status(&server, &alice, "e2", r#"{"status":{"phase":"Active"}}"#).await;
    invalid(&out, "Enrollment", "e2", "status.phase");

    // Through the main resource, status cannot be written at all (refused, or kept).
    let _ = server
        .kubectl_with(
            &alice,
            &["patch", "enrollment", "e2", "--type=merge", "-p", COMPLETE],
            None,
        )
        .await;

    assert_eq!(session(&server, "default", "e2").await, before);
    let e = enrollment(&server, "default", "e2").await;
    assert_eq!(e.phase(), EnrollmentPhase::Pending);
    assert_eq!(e.spec, before.spec);
    assert_eq!(e.status.unwrap().owner.as_deref(), Some("alice"));

    // The same over raw HTTP: the code is 422, the cause names the field.
    let resp = server
        .http()
        .patch(format!(
            "{}/apis/{}/namespaces/default/enrollments/e2/status",
            server.url,
            apis::API_VERSION
        ))
        .bearer_auth(USER_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"spec":{"teams":["x"]},"status":{"phase":"Completed"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["reason"], "Invalid", "{v}");
    let fields = cause_fields(&v);
    assert!(fields.contains(&"spec.teams"), "{v}");
}

/// The owner withdraws a pending enrollment: enrollment and session are gone and the name
/// stays reserved, for sessions and enrollments alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_by_the_owner_deletes_the_session_and_reserves_the_name() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    let manifest = enrollment_yaml("e3", SERVER_UID, None, &in_secs(1800));
    ok(&create(&server, &alice, "default", &manifest).await);
    assert_eq!(
        session(&server, "default", "e3").await.phase(),
        SessionPhase::PendingEnrollment
    );

    let out = server
        .kubectl_with(&alice, &["delete", "enrollment", "e3"], None)
        .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"enrollment.access.mcp-runtime.dev "e3" deleted"#
    );
    assert_not_found::<Enrollment>(&server, "default", "e3").await;
    assert_not_found::<AccessSession>(&server, "default", "e3").await;
    let out = server
        .kubectl_with(&alice, &["get", "acs", "e3"], None)
        .await;
    failed_with(&out, "NotFound", "e3");

    let out = create(&server, &alice, "default", &manifest).await;
    failed_with(&out, "AlreadyExists", "used before");
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &session_yaml("e3", SERVER_UID),
    )
    .await;
    failed_with(&out, "AlreadyExists", "used before");
    assert_not_found::<Enrollment>(&server, "default", "e3").await;
    assert_not_found::<AccessSession>(&server, "default", "e3").await;
}

/// Someone else (even the admin) cannot withdraw alice's pending enrollment (403, nothing
/// deleted); once completed, anyone may delete the record and the session stays Active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_by_someone_else_is_forbidden_and_completed_records_just_go() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    ok(&create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("e4", SERVER_UID, None, &in_secs(1800)),
    )
    .await);
    let uid = enrollment(&server, "default", "e4").await.metadata.uid;

    let out = server.kubectl(&["delete", "enrollment", "e4"]).await;
    failed_with(&out, "Forbidden", "only the owner");
    assert!(out.stderr.contains("alice"), "{out:#?}");
    assert_eq!(
        enrollment(&server, "default", "e4").await.phase(),
        EnrollmentPhase::Pending
    );
    assert_eq!(
        session(&server, "default", "e4").await.phase(),
        SessionPhase::PendingEnrollment
    );
    // The same over raw HTTP: 403.
    let resp = server
        .http()
        .delete(format!(
            "{}/apis/{}/namespaces/default/enrollments/e4",
            server.url,
            apis::API_VERSION
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    // Nor through deletecollection (`kubectl delete enr --all`).
    let out = server.kubectl(&["delete", "enr", "--all"]).await;
    failed_with(&out, "Forbidden", "only the owner");
    assert_eq!(
        session(&server, "default", "e4").await.phase(),
        SessionPhase::PendingEnrollment
    );
    assert_eq!(
        enrollment(&server, "default", "e4").await.phase(),
        EnrollmentPhase::Pending
    );

    // The admin completes it, then deletes the Completed record: the session stays.
    ok(&patch_status(&server, &server.kubeconfig, "e4", COMPLETE).await);
    let out = server.kubectl(&["delete", "enrollment", "e4"]).await;
    ok(&out);
    assert_not_found::<Enrollment>(&server, "default", "e4").await;
    let s = session(&server, "default", "e4").await;
    assert_eq!(s.phase(), SessionPhase::Active);
    assert_eq!(s.metadata.uid, uid);

    // The owner deleting a Completed record removes only the record too.
    ok(&create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("e5", SERVER_UID, None, &in_secs(1800)),
    )
    .await);
    ok(&patch_status(&server, &alice, "e5", COMPLETE).await);
    ok(&server
        .kubectl_with(&alice, &["delete", "enrollment", "e5"], None)
        .await);
    assert_not_found::<Enrollment>(&server, "default", "e5").await;
    assert_eq!(
        session(&server, "default", "e5").await.phase(),
        SessionPhase::Active
    );
}

/// Completion is refused (409) when the session was revoked, has expired, or its agent was
/// deactivated; the enrollment stays Pending and the session is not activated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_is_refused_for_revoked_expired_or_deactivated_sessions() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    server
        .store
        .create_agent(mk_agent("bot", &["payments"]), false)
        .await
        .unwrap();
    for name in ["revoked", "expired", "deactivated"] {
        let agent = (name == "deactivated").then_some("bot");
        ok(&create(
            &server,
            &alice,
            "default",
            &enrollment_yaml(name, SERVER_UID, agent, &in_secs(1800)),
        )
        .await);
    }

    // Revoked through a Revocation.
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r-revoked", "{session: revoked}", "compromised"),
    )
    .await);
    let s = session(&server, "default", "revoked").await;
    assert_eq!(revoked_by(&s), by("compromised", Some("r-revoked")));
    let out = patch_status(&server, &alice, "revoked", COMPLETE).await;
    failed_with(&out, "Conflict", "revoked");
    assert!(out.stderr.contains("compromised"), "{out:#?}");
    let s = session(&server, "default", "revoked").await;
    assert_eq!(s.phase(), SessionPhase::Revoked);
    assert!(s.status.unwrap().enrollment.is_some());
    assert_eq!(
        enrollment(&server, "default", "revoked").await.phase(),
        EnrollmentPhase::Pending
    );

    // Expired: expiresAt brought forward into the past through an update.
    let mut s = session(&server, "default", "expired").await;
    s.spec.expires_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::from_second(Timestamp::now().as_second() - 60).unwrap(),
    ));
    s.metadata.resource_version = None;
    server.store.update_session(s, false).await.unwrap();
    let out = patch_status(&server, &alice, "expired", COMPLETE).await;
    failed_with(&out, "Conflict", "expired");
    assert_eq!(
        session(&server, "default", "expired").await.phase(),
        SessionPhase::PendingEnrollment
    );
    assert_eq!(
        enrollment(&server, "default", "expired").await.phase(),
        EnrollmentPhase::Pending
    );

    // Agent deactivated.
    ok(&server
        .kubectl(&[
            "patch",
            "agent",
            "bot",
            "--type=merge",
            "-p",
            r#"{"spec":{"active":false}}"#,
        ])
        .await);
    let out = patch_status(&server, &alice, "deactivated", COMPLETE).await;
    failed_with(&out, "Conflict", "deactivated");
    let s = session(&server, "default", "deactivated").await;
    assert_eq!(revoked_by(&s), by("agent_deactivated", None));
    assert_eq!(
        enrollment(&server, "default", "deactivated").await.phase(),
        EnrollmentPhase::Pending
    );
}

// ---------------------------------------------------------------------------------------------
// A. Revocation through kubectl
// ---------------------------------------------------------------------------------------------

/// A single-session Revocation revokes its session (cause and name recorded), shows in
/// `kubectl get rvk`, and withdrawing it restores the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_session_revocation_and_withdrawal() {
    let server = TestServer::start().await;
    for name in ["s1", "s2"] {
        server
            .store
            .create_session(mk_session("default", name, SERVER_UID), false)
            .await
            .unwrap();
    }
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r1", "{session: s1}", "manual"),
    )
    .await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        "revocation.access.mcp-runtime.dev/r1 created"
    );
    let s1 = session(&server, "default", "s1").await;
    assert_eq!(revoked_by(&s1), by("manual", Some("r1")));
    assert!(s1.status.unwrap().revocation.unwrap().revoked_at.0 <= Timestamp::now());
    assert_eq!(revoked_by(&session(&server, "default", "s2").await), None);

    let out = server.kubectl(&["get", "rvk"]).await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(t.header, REVOCATION_COLUMNS, "{}", out.stdout);
    // No gateway watch is connected (this server has no sync listener): delivered to 0 of 0.
    assert_eq!(
        t.row("r1")[..6],
        ["r1", "session/s1", "manual", "1", "0/0", "<none>"]
    );
    let out = server.kubectl(&["get", "rvk", "r1", "-o", "json"]).await;
    ok(&out);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["status"]["revokedSessions"], 1);
    assert!(v["status"]["completedAt"].is_string(), "{v}");

    // Through the main resource neither target nor status can change (refused, or kept).
    let stored = server
        .store
        .get::<Revocation>("default", "r1")
        .await
        .unwrap();
    for patch in [
        r#"{"spec":{"target":{"session":"s2"}}}"#,
        r#"{"status":{"revokedSessions":5}}"#,
    ] {
        let _ = server
            .kubectl(&["patch", "rvk", "r1", "--type=merge", "-p", patch])
            .await;
    }
    let after = server
        .store
        .get::<Revocation>("default", "r1")
        .await
        .unwrap();
    assert_eq!(after.spec, stored.spec);
    assert_eq!(after.status, stored.status);
    assert_eq!(revoked_by(&session(&server, "default", "s2").await), None);

    // Same name again: AlreadyExists.
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r1", "{session: s2}", "manual"),
    )
    .await;
    failed_with(&out, "AlreadyExists", "r1");
    assert_eq!(revoked_by(&session(&server, "default", "s2").await), None);

    let out = server.kubectl(&["delete", "rvk", "r1"]).await;
    ok(&out);
    assert_eq!(
        out.stdout.trim(),
        r#"revocation.access.mcp-runtime.dev "r1" deleted"#
    );
    let s1 = session(&server, "default", "s1").await;
    assert_eq!(s1.phase(), SessionPhase::Active);
    assert_eq!(revoked_by(&s1), None);
    assert_not_found::<Revocation>(&server, "default", "r1").await;

    // Withdrawing a revocation that is not the one on record leaves the session revoked.
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("first", "{session: s2}", "compromised"),
    )
    .await);
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("second", "{session: s2}", "manual"),
    )
    .await);
    assert_eq!(
        server
            .store
            .get::<Revocation>("default", "second")
            .await
            .unwrap()
            .status
            .unwrap()
            .revoked_sessions,
        1,
        "it covers s2, already revoked"
    );
    ok(&server.kubectl(&["delete", "rvk", "second"]).await);
    assert_eq!(
        revoked_by(&session(&server, "default", "s2").await),
        by("compromised", Some("first"))
    );
}

/// Server and subject targets revoke every matching session in the Revocation's namespace
/// (not other namespaces, not other servers or subjects); multi-session revocations cannot
/// be withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_subject_revocations() {
    let server = TestServer::start().await;
    let store = &server.store;
    for (ns, name) in [("team-a", "a1"), ("team-a", "a2"), ("team-b", "b1")] {
        store
            .create_session(mk_session(ns, name, "srv-2"), false)
            .await
            .unwrap();
    }
    store
        .create_session(mk_session("team-a", "a3", "srv-3"), false)
        .await
        .unwrap();
    for (ns, name, user) in [
        ("team-a", "h1", "alice@example.com"),
        ("team-a", "h2", "alice@example.com"),
        ("team-a", "h3", "bob@example.com"),
        ("team-b", "h4", "alice@example.com"),
    ] {
        store
            .create_session(mk_human_session(ns, name, "srv-3", user), false)
            .await
            .unwrap();
    }

    ok(&create(
        &server,
        &server.kubeconfig,
        "team-a",
        &revocation_yaml(
            "by-server",
            "{server: {name: github, uid: srv-2}}",
            "compromised",
        ),
    )
    .await);
    for name in ["a1", "a2"] {
        assert_eq!(
            revoked_by(&session(&server, "team-a", name).await),
            by("compromised", Some("by-server"))
        );
    }
    assert_eq!(revoked_by(&session(&server, "team-a", "a3").await), None);
    assert_eq!(revoked_by(&session(&server, "team-b", "b1").await), None);

    ok(&create(
        &server,
        &server.kubeconfig,
        "team-a",
        &revocation_yaml("by-subject", "{subject: alice@example.com}", "manual"),
    )
    .await);
    for name in ["h1", "h2"] {
        assert_eq!(
            revoked_by(&session(&server, "team-a", name).await),
            by("manual", Some("by-subject"))
        );
    }
    assert_eq!(revoked_by(&session(&server, "team-a", "h3").await), None);
    assert_eq!(revoked_by(&session(&server, "team-b", "h4").await), None);

    let out = server.kubectl(&["get", "rvk", "-n", "team-a"]).await;
    ok(&out);
    let t = Table::parse(&out.stdout);
    assert_eq!(
        t.row("by-server")[..4],
        ["by-server", "server/github", "compromised", "2"]
    );
    assert_eq!(
        t.row("by-subject")[..4],
        ["by-subject", "subject/alice@example.com", "manual", "2"]
    );
    let out = server.kubectl(&["get", "rvk", "-A"]).await;
    ok(&out);
    assert_eq!(Table::parse(&out.stdout).rows.len(), 2, "{}", out.stdout);

    // While they stand, no new session for their targets; withdrawing restores what
    // no other revocation covers.
    let out = create(
        &server,
        &server.kubeconfig,
        "team-a",
        &session_yaml("h5", "srv-4"),
    )
    .await;
    failed_with(&out, "Conflict", "by-subject");
    for name in ["by-server", "by-subject"] {
        ok(&server
            .kubectl(&["delete", "rvk", "-n", "team-a", name])
            .await);
        assert_not_found::<Revocation>(&server, "team-a", name).await;
    }
    for name in ["a1", "a2", "h1", "h2"] {
        assert_eq!(revoked_by(&session(&server, "team-a", name).await), None);
    }
}

/// `cause: server_retired` installs the fence: issuing (session or enrollment) for that uid
/// is 409, and the fence cannot be withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_retired_installs_a_permanent_fence() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    for name in ["f1", "f2"] {
        server
            .store
            .create_session(mk_session("default", name, "srv-9"), false)
            .await
            .unwrap();
    }
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml(
            "retire",
            "{server: {name: github, uid: srv-9}}",
            "server_retired",
        ),
    )
    .await);
    for name in ["f1", "f2"] {
        assert_eq!(
            revoked_by(&session(&server, "default", name).await),
            by("server_retired", Some("retire"))
        );
    }
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &session_yaml("f3", "srv-9"),
    )
    .await;
    failed_with(&out, "Conflict", "retired");
    let out = create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("f4", "srv-9", None, &in_secs(600)),
    )
    .await;
    failed_with(&out, "Conflict", "retired");
    // The fence holds in every namespace.
    let out = create(
        &server,
        &server.kubeconfig,
        "other",
        &session_yaml("f5", "srv-9"),
    )
    .await;
    failed_with(&out, "Conflict", "retired");

    let out = server.kubectl(&["delete", "rvk", "retire"]).await;
    failed_with(&out, "Conflict", "fence");
    assert!(server
        .store
        .get::<Revocation>("default", "retire")
        .await
        .is_ok());

    // A session revocation of a fenced session: withdrawing it cannot restore the session.
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("again", "{session: f1}", "manual"),
    )
    .await);
    ok(&server.kubectl(&["delete", "rvk", "again"]).await);
    assert_eq!(
        revoked_by(&session(&server, "default", "f1").await),
        by("server_retired", Some("retire"))
    );
}

/// Invalid Revocations are 422 naming the field, and nothing is stored or revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_revocations_are_refused() {
    let server = TestServer::start().await;
    server
        .store
        .create_session(mk_session("default", "s1", SERVER_UID), false)
        .await
        .unwrap();
    let cases = [
        ("no-target", "{}", "manual", "spec.target"),
        (
            "two-targets",
            "{session: s1, subject: alice@example.com}",
            "manual",
            "spec.target",
        ),
        ("bad-cause", "{session: s1}", "\"Bad Cause\"", "spec.cause"),
        ("no-cause", "{session: s1}", "\"\"", "spec.cause"),
        (
            "retired-session",
            "{session: s1}",
            "server_retired",
            "spec.cause",
        ),
        (
            "server-no-uid",
            "{server: {name: github}}",
            "manual",
            "spec.target.server.uid",
        ),
        (
            "missing-session",
            "{session: nope}",
            "manual",
            "spec.target.session",
        ),
    ];
    for (name, target, cause, field) in cases {
        let out = create(
            &server,
            &server.kubeconfig,
            "default",
            &revocation_yaml(name, target, cause),
        )
        .await;
        invalid(&out, "Revocation", name, field);
        assert_not_found::<Revocation>(&server, "default", name).await;
    }
    assert_eq!(revoked_by(&session(&server, "default", "s1").await), None);
    let out = server.kubectl(&["get", "rvk"]).await;
    ok(&out);
    assert!(out.stderr.contains("No resources found"), "{out:#?}");
}

/// Withdrawing a single-session revocation while the session's agent is inactive lifts only
/// that revocation's cover: the deactivation still covers the session, which stays revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_while_the_agent_is_inactive_keeps_the_session_revoked() {
    let server = TestServer::start().await;
    server
        .store
        .create_agent(mk_agent("bot", &["payments"]), false)
        .await
        .unwrap();
    server
        .store
        .create_session(
            mk_agent_session("default", "g1", SERVER_UID, "bot", &["payments"]),
            false,
        )
        .await
        .unwrap();
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r-g1", "{session: g1}", "manual"),
    )
    .await);
    ok(&server
        .kubectl(&[
            "patch",
            "agent",
            "bot",
            "--type=merge",
            "-p",
            r#"{"spec":{"active":false}}"#,
        ])
        .await);
    // The first revocation stays the one on record.
    assert_eq!(
        revoked_by(&session(&server, "default", "g1").await),
        by("manual", Some("r-g1"))
    );
    // The deactivation covers g1 too: withdrawing r-g1 lifts only r-g1's cover.
    ok(&server.kubectl(&["delete", "rvk", "r-g1"]).await);
    assert_eq!(
        revoked_by(&session(&server, "default", "g1").await),
        by("manual", Some("r-g1"))
    );
    // Revoked for the deactivation alone, g1 cannot be restored while the agent is inactive.
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r-g1-again", "{session: g1}", "manual"),
    )
    .await);
    let out = server.kubectl(&["delete", "rvk", "r-g1-again"]).await;
    ok(&out);
    assert_eq!(
        revoked_by(&session(&server, "default", "g1").await),
        by("manual", Some("r-g1"))
    );
}

/// Deactivating an agent revokes all its sessions (cause agent_deactivated) and nothing
/// else; deleting it does too, and re-creating it under the same name restores nothing: old
/// sessions stay revoked and withdrawing their revocation is 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_deactivation_and_recreation() {
    let server = TestServer::start().await;
    let store = &server.store;
    for agent in ["bot-a", "bot-b"] {
        ok(&create(&server, &server.kubeconfig, "default", &agent_yaml(agent)).await);
    }
    for (name, agent) in [
        ("k1", "bot-a"),
        ("k2", "bot-a"),
        ("m1", "bot-b"),
        ("m2", "bot-b"),
    ] {
        store
            .create_session(
                mk_agent_session("default", name, SERVER_UID, agent, &["payments"]),
                false,
            )
            .await
            .unwrap();
    }
    store
        .create_session(
            mk_agent_session("other", "k3", SERVER_UID, "bot-a", &["payments"]),
            false,
        )
        .await
        .unwrap();
    store
        .create_session(mk_session("default", "plain", SERVER_UID), false)
        .await
        .unwrap();

    let out = server
        .kubectl(&[
            "patch",
            "agent",
            "bot-a",
            "--type=merge",
            "-p",
            r#"{"spec":{"active":false}}"#,
        ])
        .await;
    ok(&out);
    for (ns, name) in [("default", "k1"), ("default", "k2"), ("other", "k3")] {
        assert_eq!(
            revoked_by(&session(&server, ns, name).await),
            by("agent_deactivated", None),
            "{ns}/{name}"
        );
    }
    for name in ["m1", "m2", "plain"] {
        assert_eq!(revoked_by(&session(&server, "default", name).await), None);
    }
    let out = server
        .kubectl(&["get", "agent", "bot-a", "-o", "json"])
        .await;
    ok(&out);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v["status"]["deactivatedAt"].is_string(), "{v}");
    assert_eq!(v["status"]["activeSessions"], 0, "{v}");
    // An inactive agent gets no new sessions.
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &enrollment_yaml("k4", SERVER_UID, Some("bot-a"), &in_secs(600)),
    )
    .await;
    failed_with(&out, "Forbidden", "not active");

    // Delete and re-create bot-b, with m1 revoked by a Revocation before.
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r-m1", "{session: m1}", "manual"),
    )
    .await);
    let old_uid = store
        .get::<apis::Agent>("", "bot-b")
        .await
        .unwrap()
        .metadata
        .uid;
    ok(&server.kubectl(&["delete", "agent", "bot-b"]).await);
    assert_eq!(
        revoked_by(&session(&server, "default", "m2").await),
        by("agent_deactivated", None)
    );
    ok(&create(&server, &server.kubeconfig, "default", &agent_yaml("bot-b")).await);
    let new_uid = store
        .get::<apis::Agent>("", "bot-b")
        .await
        .unwrap()
        .metadata
        .uid;
    assert_ne!(old_uid, new_uid);
    assert_eq!(
        revoked_by(&session(&server, "default", "m1").await),
        by("manual", Some("r-m1"))
    );
    assert_eq!(
        revoked_by(&session(&server, "default", "m2").await),
        by("agent_deactivated", None)
    );
    // Withdrawing r-m1 lifts only its own cover: the agent's deletion still covers m1.
    ok(&server.kubectl(&["delete", "rvk", "r-m1"]).await);
    let m1 = session(&server, "default", "m1").await;
    assert_eq!(revoked_by(&m1), by("manual", Some("r-m1")));
    assert_eq!(
        m1.status.unwrap().revocation.unwrap().covered_by,
        vec![apis::CoveringRevocation {
            cause: "agent_deactivated".into(),
            revocation_name: None
        }]
    );
    // The re-created agent issues new sessions bound to its new uid.
    let out = create(
        &server,
        &server.kubeconfig,
        "default",
        &enrollment_yaml("m3", SERVER_UID, Some("bot-b"), &in_secs(600)),
    )
    .await;
    ok(&out);
    let m3 = session(&server, "default", "m3").await;
    assert_eq!(m3.spec.agent.unwrap().uid, new_uid);
    assert_eq!(m3.status.unwrap().phase, SessionPhase::PendingEnrollment);
}

/// Warnings where the server changed the request, and the read-side views: `get enr,rvk`
/// tables and `explain`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clamp_warning_tables_and_explain() {
    let server = TestServer::start().await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    let mut agent = mk_agent("billing-bot", &["payments"]);
    agent.spec.max_session_ttl = Some("1h".into());
    server.store.create_agent(agent, false).await.unwrap();

    let requested = in_secs(5 * 3600);
    let out = create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("clamped", SERVER_UID, Some("billing-bot"), &requested),
    )
    .await;
    ok(&out);
    let warning = out
        .stderr
        .lines()
        .find(|l| l.starts_with("Warning: "))
        .unwrap_or_else(|| panic!("no warning: {out:#?}"));
    assert!(warning.contains("clamped"), "{warning}");
    assert!(warning.contains(&requested), "{warning}");
    let e = enrollment(&server, "default", "clamped").await;
    let expires = e.spec.expires_at.clone().unwrap().0;
    assert!(
        expires <= Timestamp::now() + SignedDuration::from_hours(1),
        "{expires}"
    );
    assert_eq!(session(&server, "default", "clamped").await.spec, e.spec);
    // Within the limit: no warning.
    let out = create(
        &server,
        &alice,
        "default",
        &enrollment_yaml("short", SERVER_UID, Some("billing-bot"), &in_secs(600)),
    )
    .await;
    ok(&out);
    assert!(!out.stderr.contains("Warning"), "{out:#?}");

    server
        .store
        .create_session(mk_session("default", "s1", SERVER_UID), false)
        .await
        .unwrap();
    ok(&create(
        &server,
        &server.kubeconfig,
        "default",
        &revocation_yaml("r1", "{session: s1}", "manual"),
    )
    .await);
    let out = server.kubectl(&["get", "enr,rvk"]).await;
    ok(&out);
    let sections: Vec<&str> = out
        .stdout
        .split("\n\n")
        .filter(|s| !s.trim().is_empty())
        .collect();
    assert_eq!(sections.len(), 2, "{}", out.stdout);
    let enr = Table::parse(sections[0]);
    assert_eq!(
        enr.header,
        ["NAME", "SERVER", "AGENT", "OWNER", "PHASE", "AGE"]
    );
    assert_eq!(
        enr.names(),
        [
            "enrollment.access.mcp-runtime.dev/clamped",
            "enrollment.access.mcp-runtime.dev/short"
        ]
    );
    assert_eq!(
        enr.row("enrollment.access.mcp-runtime.dev/short")[1..5],
        ["github", "billing-bot", "alice", "Pending"]
    );
    let rvk = Table::parse(sections[1]);
    assert_eq!(rvk.header, REVOCATION_COLUMNS);
    assert_eq!(
        rvk.row("revocation.access.mcp-runtime.dev/r1")[1..4],
        ["session/s1", "manual", "1"]
    );
    let out = server.kubectl(&["get", "rvk", "-o", "wide"]).await;
    ok(&out);
    let wide = Table::parse(&out.stdout);
    assert_eq!(wide.row("r1")[wide.column("MESSAGE")], "testing");

    let out = server.kubectl(&["explain", "enrollment.spec"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &[
            "KIND: Enrollment",
            "VERSION: v1alpha1",
            "server <ServerRef> -required-",
            "expiresAt <string>",
            "teams <[]string>",
        ],
    );
    let out = server.kubectl(&["explain", "revocation.spec.target"]).await;
    ok(&out);
    assert_lines(
        &out.stdout,
        &[
            "KIND: Revocation",
            "session <string>",
            "One session in this namespace.",
            "server <ServerRef>",
            "subject <string>",
        ],
    );
    let out = server.kubectl(&["explain", "enr.status.phase"]).await;
    ok(&out);
    assert!(
        out.stdout
            .contains("Pending until completed through the status subresource."),
        "{}",
        out.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// B. Races against the real PostgreSQL
//
// Each race runs one side through a second store on the same database, as two apiserver
// replicas would: only the sync-state row lock orders them.
// ---------------------------------------------------------------------------------------------

/// Records the change feed while a race runs, then checks that revocation is final in the
/// event stream: per session, strictly increasing resourceVersions, at most one event that
/// turns it Revoked, and no Active or PendingEnrollment event after that.
struct FinalityRecorder {
    events: Arc<std::sync::Mutex<Vec<Arc<apiserver::store::Event>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FinalityRecorder {
    async fn start(store: &PgStore) -> Self {
        let from = store.current_version().await.unwrap();
        let mut sub = store.subscribe(from).await.unwrap();
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = events.clone();
        let task = tokio::spawn(async move {
            loop {
                match sub.next().await {
                    Ok(event) => sink.lock().unwrap().push(event),
                    Err(e) => panic!("the recording watch lost events: {e}"),
                }
            }
        });
        Self { events, task }
    }

    /// Waits until every committed change was recorded, checks the stream and returns how
    /// many sessions were revoked in it.
    async fn finish(self, store: &PgStore) -> usize {
        let head = store.current_version().await.unwrap().seq;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let last = self.events.lock().unwrap().last().map(|e| e.seq());
            if last >= Some(head) {
                break;
            }
            assert!(!self.task.is_finished(), "the recording watch ended early");
            assert!(
                tokio::time::Instant::now() < deadline,
                "the recording watch stalled at {last:?} of {head}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.task.abort();
        let events = self.events.lock().unwrap().clone();
        let mut last_seq = 0;
        let mut sessions: BTreeMap<(String, String), (bool, usize)> = BTreeMap::new();
        for e in &events {
            assert!(
                e.seq() > last_seq,
                "versions go back: {} after {last_seq}",
                e.seq()
            );
            last_seq = e.seq();
            if e.resource != AccessSession::PLURAL || e.event_type == EventType::Deleted {
                continue;
            }
            let phase = e.object["status"]["phase"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let before = e
                .before
                .as_ref()
                .and_then(|b| b["status"]["phase"].as_str())
                .unwrap_or("")
                .to_string();
            let (revoked, transitions) = sessions
                .entry((e.namespace.clone(), e.name.clone()))
                .or_default();
            if *revoked {
                assert_eq!(
                    phase,
                    "Revoked",
                    "{}/{} came back as {phase} after it was revoked (seq {})",
                    e.namespace,
                    e.name,
                    e.seq()
                );
            }
            if phase == "Revoked" {
                if before != "Revoked" {
                    *transitions += 1;
                }
                *revoked = true;
            }
        }
        for ((ns, name), (_, transitions)) in &sessions {
            assert!(
                *transitions <= 1,
                "{ns}/{name} was revoked {transitions} times in the stream"
            );
        }
        sessions.values().filter(|(revoked, _)| *revoked).count()
    }
}

/// Waits for every racer, then yields `yields` times: varying the yields between racers
/// and rounds varies which one reaches the database first.
async fn start_line(barrier: &tokio::sync::Barrier, yields: usize) {
    barrier.wait().await;
    for _ in 0..yields {
        tokio::task::yield_now().await;
    }
}

/// Completion racing a single-session revocation: the revocation is never lost and the
/// session is never Active while revoked. Whichever commits first, the session ends Revoked
/// (by that revocation); completion either succeeded first (pending metadata gone, enrollment
/// Completed) or was refused because of the revocation (enrollment still Pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_completion_vs_revocation() {
    let db = TestDb::new().await;
    let store = db.store().await;
    // A second store on the same database, as a second apiserver replica: the racers do
    // not share the in-process write queue, only PostgreSQL orders them.
    let replica = db.store().await;
    let recorder = FinalityRecorder::start(&store).await;
    let (mut completed_first, mut revoked_first) = (0, 0);
    for i in 0..ROUNDS {
        let name = format!("e-{i}");
        store
            .create_enrollment(
                mk_enrollment("race", &name, mk_session("race", &name, "srv-1")),
                &alice(),
                false,
            )
            .await
            .unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let complete = {
            let (store, barrier, name) = (store.clone(), barrier.clone(), name.clone());
            tokio::spawn(async move {
                start_line(&barrier, i % 4).await;
                store.complete_enrollment("race", &name, None, false).await
            })
        };
        let revoke = {
            let (store, barrier, name) = (replica.clone(), barrier.clone(), name.clone());
            tokio::spawn(async move {
                start_line(&barrier, (i / 4) % 4).await;
                store
                    .create_revocation(
                        mk_revocation(
                            "race",
                            &format!("r-{i}"),
                            session_target(&name),
                            "compromised",
                        ),
                        RevokerAuthority::Namespace,
                        false,
                    )
                    .await
            })
        };
        let (completion, revocation) = (complete.await.unwrap(), revoke.await.unwrap());
        let revocation = revocation.expect("the revocation always applies");
        assert_eq!(revocation.object.status.unwrap().revoked_sessions, 1);

        let s: AccessSession = store.get("race", &name).await.unwrap();
        let status = s.status.clone().unwrap();
        assert_eq!(status.phase, SessionPhase::Revoked, "round {i}: {s:#?}");
        let r = status.revocation.as_ref().expect("status.revocation");
        assert_eq!(r.cause, "compromised");
        assert_eq!(
            r.revocation_name.as_deref(),
            Some(format!("r-{i}").as_str())
        );
        let e: Enrollment = store.get("race", &name).await.unwrap();
        match completion {
            Ok(done) => {
                completed_first += 1;
                assert_eq!(done.phase(), EnrollmentPhase::Completed);
                assert_eq!(e.phase(), EnrollmentPhase::Completed);
                assert!(status.enrollment.is_none(), "round {i}: {s:#?}");
            }
            Err(StoreError::Refused(m @ Refusal::Completion { .. })) => {
                revoked_first += 1;
                assert!(m.to_string().contains("revoked"), "round {i}: {m}");
                assert_eq!(e.phase(), EnrollmentPhase::Pending);
                assert!(status.enrollment.is_some(), "round {i}: {s:#?}");
            }
            Err(other) => panic!("round {i}: completion failed unexpectedly: {other:?}"),
        }
    }
    assert_eq!(recorder.finish(&store).await, ROUNDS);
    eprintln!("completion first: {completed_first}, revocation first: {revoked_first}");
    assert_eq!(completed_first + revoked_first, ROUNDS);
    assert!(
        completed_first > 0 && revoked_first > 0,
        "the race never went both ways: completion first {completed_first}, revocation first {revoked_first}"
    );
}

/// Enrollments racing the deactivation of their agent: afterwards no session of the agent is
/// Active or PendingEnrollment. Every enrollment either was refused (403 AgentInactive) or
/// exists with a session revoked as agent_deactivated, and none can be completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_enrollment_vs_agent_deactivation() {
    const PER_ROUND: usize = 3;
    let db = TestDb::new().await;
    let store = db.store().await;
    // A second store on the same database, as a second apiserver replica: the racers do
    // not share the in-process write queue, only PostgreSQL orders them.
    let replica = db.store().await;
    let recorder = FinalityRecorder::start(&store).await;
    let (mut issued, mut refused) = (0, 0);
    for i in 0..ROUNDS {
        let agent_name = format!("bot-{i}");
        let agent = store
            .create_agent(mk_agent(&agent_name, &["payments"]), false)
            .await
            .unwrap()
            .object;
        let barrier = Arc::new(tokio::sync::Barrier::new(PER_ROUND + 1));
        let mut enrollments = Vec::new();
        for j in 0..PER_ROUND {
            let (store, barrier, agent_name) = (store.clone(), barrier.clone(), agent_name.clone());
            enrollments.push(tokio::spawn(async move {
                let name = format!("e-{i}-{j}");
                let session = mk_agent_session("race", &name, "srv-1", &agent_name, &["payments"]);
                start_line(&barrier, (i + j) % 4).await;
                store
                    .create_enrollment(mk_enrollment("race", &name, session), &alice(), false)
                    .await
            }));
        }
        let deactivate = {
            let (store, barrier) = (replica.clone(), barrier.clone());
            let mut agent = agent.clone();
            agent.spec.active = false;
            agent.metadata.resource_version = None;
            tokio::spawn(async move {
                start_line(&barrier, (i / 4) % 4).await;
                store.update_agent(agent, false).await
            })
        };
        let mut names = Vec::new();
        for (j, handle) in enrollments.into_iter().enumerate() {
            match handle.await.unwrap() {
                Ok(_) => {
                    issued += 1;
                    names.push(format!("e-{i}-{j}"));
                }
                Err(StoreError::Refused(Refusal::Session(SessionRuleError::AgentInactive(_)))) => {
                    refused += 1
                }
                Err(other) => panic!("round {i}: enrollment failed unexpectedly: {other:?}"),
            }
        }
        deactivate.await.unwrap().expect("deactivation succeeds");

        let listed = store
            .list::<AccessSession>(&ListQuery {
                namespace: Some("race".into()),
                fields: FieldSelector::parse(
                    &format!("spec.agent.name={agent_name}"),
                    AccessSession::FIELDS,
                )
                .unwrap(),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut listed_names: Vec<String> = listed
            .items
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        listed_names.sort();
        assert_eq!(listed_names, names, "round {i}");
        for s in &listed.items {
            assert!(
                !matches!(
                    s.phase(),
                    SessionPhase::Active | SessionPhase::PendingEnrollment
                ),
                "round {i}: {s:#?}"
            );
            assert_eq!(revoked_by(s), by("agent_deactivated", None), "round {i}");
            assert_eq!(s.spec.agent.as_ref().unwrap().uid, agent.metadata.uid);
        }
        if let Some(name) = names.first() {
            assert!(matches!(
                store.complete_enrollment("race", name, None, false).await,
                Err(StoreError::Refused(Refusal::Completion { .. }))
            ));
        }
    }
    assert_eq!(recorder.finish(&store).await, issued);
    eprintln!("enrollments issued before deactivation: {issued}, refused after: {refused}");
    assert_eq!(issued + refused, ROUNDS * PER_ROUND);
    assert!(
        issued > 0 && refused > 0,
        "the race never went both ways: issued {issued}, refused {refused}"
    );
}

/// A label update (no resourceVersion) racing a revocation of the same session: neither is
/// lost. The session ends Revoked by that revocation and carries the new label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_revocation_vs_update() {
    let db = TestDb::new().await;
    let store = db.store().await;
    // A second store on the same database, as a second apiserver replica: the racers do
    // not share the in-process write queue, only PostgreSQL orders them.
    let replica = db.store().await;
    let recorder = FinalityRecorder::start(&store).await;
    let (mut update_first, mut revocation_first) = (0, 0);
    for i in 0..ROUNDS {
        let name = format!("u-{i}");
        let created = store
            .create_session(mk_session("race", &name, "srv-1"), false)
            .await
            .unwrap()
            .object;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let update = {
            let (store, barrier) = (store.clone(), barrier.clone());
            let mut s = created.clone();
            s.metadata.labels = Some(BTreeMap::from([("round".to_string(), i.to_string())]));
            s.metadata.resource_version = None;
            tokio::spawn(async move {
                start_line(&barrier, i % 4).await;
                store.update_session(s, false).await
            })
        };
        let revoke = {
            let (store, barrier, name) = (replica.clone(), barrier.clone(), name.clone());
            tokio::spawn(async move {
                start_line(&barrier, (i / 4) % 4).await;
                store
                    .create_revocation(
                        mk_revocation("race", &format!("r-{i}"), session_target(&name), "manual"),
                        RevokerAuthority::Namespace,
                        false,
                    )
                    .await
            })
        };
        let updated = update.await.unwrap().expect("update succeeds").object;
        let revocation = revoke.await.unwrap().expect("revocation succeeds");
        assert_eq!(revocation.object.status.unwrap().revoked_sessions, 1);
        // The update answers with the state it wrote: revoked if the revocation came first.
        match revoked_by(&updated) {
            None => update_first += 1,
            Some(r) => {
                assert_eq!(r, by("manual", Some(format!("r-{i}").as_str())).unwrap());
                revocation_first += 1;
            }
        }
        let s: AccessSession = store.get("race", &name).await.unwrap();
        assert_eq!(
            revoked_by(&s),
            by("manual", Some(format!("r-{i}").as_str())),
            "round {i}: the revocation was lost: {s:#?}"
        );
        assert_eq!(
            s.metadata.labels.as_ref().and_then(|l| l.get("round")),
            Some(&i.to_string()),
            "round {i}: the update was lost"
        );
        assert_eq!(s.spec, created.spec);
    }
    assert_eq!(recorder.finish(&store).await, ROUNDS);
    eprintln!("update first: {update_first}, revocation first: {revocation_first}");
    assert!(
        update_first > 0 && revocation_first > 0,
        "the race never went both ways: update first {update_first}, revocation first {revocation_first}"
    );
}

// ---------------------------------------------------------------------------------------------
// C. Watch
// ---------------------------------------------------------------------------------------------

/// A raw watch response, one JSON event per line.
struct RawWatch {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl RawWatch {
    async fn event(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return serde_json::from_slice(&line[..line.len() - 1]).unwrap_or_else(|e| {
                    panic!("bad watch line ({e}): {}", String::from_utf8_lossy(&line))
                });
            }
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                other => panic!("watch ended or stalled: {other:?}"),
            }
        }
    }
}

fn rv_of_value(v: &Value) -> ResourceVersion {
    ResourceVersion::parse(v["metadata"]["resourceVersion"].as_str().unwrap()).unwrap()
}

fn event_rv(e: &Value) -> ResourceVersion {
    ResourceVersion::parse(e["object"]["metadata"]["resourceVersion"].as_str().unwrap()).unwrap()
}

/// Every revocation reaches a watch of the affected sessions as exactly one MODIFIED event
/// per session, carrying `status.revocation`, in commit order; a revocation that changes
/// nothing emits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_appear_once_per_session_in_commit_order() {
    let server = TestServer::start().await;
    for i in 0..10 {
        let server_uid = if i < 7 { "srv-a" } else { "srv-b" };
        server
            .store
            .create_session(mk_session("w", &format!("w{i}"), server_uid), false)
            .await
            .unwrap();
    }
    // Another namespace's session of the same server is not revoked and not on this watch.
    server
        .store
        .create_session(mk_session("elsewhere", "x0", "srv-a"), false)
        .await
        .unwrap();
    let base = format!("{}/apis/{}/namespaces/w", server.url, apis::API_VERSION);
    let list: Value = server
        .http()
        .get(format!("{base}/accesssessions"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 10);
    let from = list["metadata"]["resourceVersion"].as_str().unwrap();
    let resp = server
        .http()
        .get(format!(
            "{base}/accesssessions?watch=1&resourceVersion={from}"
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut watch = RawWatch {
        resp,
        buf: Vec::new(),
    };

    let post_revocation = |body: Value| {
        let request = server
            .http()
            .post(format!("{base}/revocations"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body);
        async move {
            let resp = request.send().await.unwrap();
            assert_eq!(resp.status(), 201);
            resp.json::<Value>().await.unwrap()
        }
    };
    let revocation = |name: &str, target: Value| {
        json!({
            "apiVersion": apis::API_VERSION, "kind": "Revocation",
            "metadata": {"name": name},
            "spec": {"target": target, "cause": "compromised"},
        })
    };
    let ra = post_revocation(revocation(
        "by-server",
        json!({"server": {"name": "github", "uid": "srv-a"}}),
    ))
    .await;
    assert_eq!(ra["status"]["revokedSessions"], 7);
    let rb = post_revocation(revocation("one", json!({"session": "w8"}))).await;
    assert_eq!(rb["status"]["revokedSessions"], 1);
    // Already revoked: it covers w0 too (one MODIFIED that lists it, still Revoked, the
    // first revocation still on record), and counts it.
    let rc = post_revocation(revocation("again", json!({"session": "w0"}))).await;
    assert_eq!(rc["status"]["revokedSessions"], 1);
    // A sentinel: everything the revocations emitted precedes its ADDED.
    server
        .store
        .create_session(mk_session("w", "zz-sentinel", "srv-b"), false)
        .await
        .unwrap();

    let mut events = Vec::new();
    loop {
        let e = watch.event().await;
        let done = e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "zz-sentinel";
        events.push(e);
        if done {
            break;
        }
    }
    let rvs: Vec<ResourceVersion> = events.iter().map(event_rv).collect();
    assert!(
        rvs.windows(2).all(|w| w[0] < w[1]),
        "resourceVersions not strictly increasing: {rvs:?}"
    );
    let (coverage, modified): (Vec<Value>, Vec<Value>) =
        events[..events.len() - 1].iter().cloned().partition(|e| {
            e["object"]["metadata"]["name"] == "w0"
                && e["object"]["status"]["revocation"]["coveredBy"]
                    .as_array()
                    .is_some_and(|c| c.len() == 2)
        });
    assert_eq!(coverage.len(), 1, "{events:#?}");
    assert_eq!(
        coverage[0]["object"]["status"]["revocation"]["coveredBy"][1]["revocationName"],
        "again"
    );
    assert_eq!(
        coverage[0]["object"]["status"]["revocation"]["revocationName"],
        "by-server"
    );
    assert!(event_rv(&coverage[0]) > rv_of_value(&rb));
    let rvs: Vec<ResourceVersion> = modified.iter().map(event_rv).collect();
    let mut seen = BTreeSet::new();
    for e in &modified {
        assert_eq!(e["type"], "MODIFIED", "{e}");
        let name = e["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            seen.insert(name.clone()),
            "{name} modified twice: {events:#?}"
        );
        let status = &e["object"]["status"];
        assert_eq!(status["phase"], "Revoked", "{e}");
        let want = if name == "w8" { "one" } else { "by-server" };
        assert_eq!(status["revocation"]["revocationName"], want, "{e}");
        assert_eq!(status["revocation"]["cause"], "compromised", "{e}");
        assert!(status["revocation"]["revokedAt"].is_string(), "{e}");
    }
    let expected: BTreeSet<String> = ["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w8"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(seen, expected);
    // Commit order: the server-wide revocation's events, then its record, then the
    // single-session revocation's event, then its record.
    let rv_of = |v: &Value| {
        ResourceVersion::parse(v["metadata"]["resourceVersion"].as_str().unwrap()).unwrap()
    };
    let (ra_rv, rb_rv) = (rv_of(&ra), rv_of(&rb));
    for (e, rv) in modified.iter().zip(&rvs) {
        if e["object"]["metadata"]["name"] == "w8" {
            assert!(
                ra_rv < *rv && *rv < rb_rv,
                "{rv:?} not between {ra_rv:?} and {rb_rv:?}"
            );
        } else {
            assert!(*rv < ra_rv, "{rv:?} not before {ra_rv:?}");
        }
    }
    assert_eq!(modified.last().unwrap()["object"]["metadata"]["name"], "w8");
    // The other namespace was not touched.
    assert_eq!(revoked_by(&session(&server, "elsewhere", "x0").await), None);
}

// ---------------------------------------------------------------------------------------------
// D. Garbage collection of completed enrollments
// ---------------------------------------------------------------------------------------------

/// Completed enrollments are collected once past the retention, with a DELETED event each;
/// pending ones and every session stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_enrollments_are_collected() {
    let db = TestDb::new().await;
    let store: PgStore = db.store().await;
    for name in ["g1", "g2", "g3"] {
        store
            .create_enrollment(
                mk_enrollment("gc", name, mk_session("gc", name, "srv-1")),
                &alice(),
                false,
            )
            .await
            .unwrap();
    }
    for name in ["g1", "g3"] {
        store
            .complete_enrollment("gc", name, None, false)
            .await
            .unwrap();
    }
    // Within the retention: nothing goes.
    assert_eq!(
        store
            .collect_completed_enrollments(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );

    let from = store.current_version().await.unwrap();
    let mut sub = store.subscribe(from).await.unwrap();
    assert_eq!(
        store
            .collect_completed_enrollments(Duration::ZERO)
            .await
            .unwrap(),
        2
    );
    store
        .create_session(mk_session("gc", "sentinel", "srv-1"), false)
        .await
        .unwrap();
    let mut deleted = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("event within 10s")
            .unwrap();
        if e.name == "sentinel" {
            assert_eq!(e.event_type, EventType::Added);
            break;
        }
        assert_eq!(e.event_type, EventType::Deleted, "{e:?}");
        assert_eq!(e.resource, "enrollments", "{e:?}");
        assert_eq!(e.object["status"]["phase"], "Completed", "{e:?}");
        deleted.push(e.name.clone());
    }
    assert_eq!(deleted, ["g1", "g3"]);

    let left = store
        .list::<Enrollment>(&ListQuery {
            namespace: Some("gc".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let left: Vec<_> = left
        .items
        .iter()
        .map(|e| (e.metadata.name.clone().unwrap(), e.phase()))
        .collect();
    assert_eq!(left, [("g2".to_string(), EnrollmentPhase::Pending)]);
    for (name, phase) in [
        ("g1", SessionPhase::Active),
        ("g2", SessionPhase::PendingEnrollment),
        ("g3", SessionPhase::Active),
    ] {
        let s: AccessSession = store.get("gc", name).await.unwrap();
        assert_eq!(s.phase(), phase, "{name}");
    }
    assert_eq!(
        store
            .collect_completed_enrollments(Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    // A collected record's name still belongs to its live session.
    assert!(matches!(
        store
            .create_enrollment(
                mk_enrollment("gc", "g1", mk_session("gc", "g1", "srv-1")),
                &alice(),
                false,
            )
            .await,
        Err(StoreError::AlreadyExists)
    ));
}
