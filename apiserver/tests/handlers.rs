//! The HTTP handlers over the in-memory store: what a user sees per kind (status codes,
//! Status reasons and messages, bodies, Table rendering), driven through
//! `AppState::handle` without sockets and without PostgreSQL.

mod support;

use std::sync::Arc;

use apiserver::auth::{AllowAuthenticated, Attributes, Authorizer, Decision, TokenFile, UserInfo};
use apiserver::http::{AppState, HttpConfig, HttpMetrics};
use apiserver::store::MemoryStore;
use async_trait::async_trait;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// Everyone authenticated may do anything, except that only the admin may create at the
/// cluster scope: a revocation alice creates fences only her namespace.
struct NamespaceOnlyForUsers;

#[async_trait]
impl Authorizer for NamespaceOnlyForUsers {
    async fn authorize(&self, user: &UserInfo, attributes: &Attributes) -> Decision {
        if user.name != "admin"
            && attributes.resource_request
            && attributes.namespace.is_empty()
            && attributes.verb == "create"
        {
            return Decision::Deny("namespace authority only".into());
        }
        AllowAuthenticated.authorize(user, attributes).await
    }
}

struct Api {
    app: AppState<MemoryStore>,
}

/// One answer: status code, JSON body (Null when empty or not JSON), Warning headers.
struct Answer {
    code: StatusCode,
    body: Value,
    warnings: Vec<String>,
}

impl Answer {
    /// Asserts the answer is a Status with `code` and `reason` and returns its message.
    #[track_caller]
    fn status(&self, code: u16, reason: &str) -> String {
        assert_eq!(self.code.as_u16(), code, "body: {}", self.body);
        assert_eq!(self.body["kind"], "Status", "body: {}", self.body);
        assert_eq!(self.body["status"], "Failure", "body: {}", self.body);
        assert_eq!(self.body["code"], code, "body: {}", self.body);
        assert_eq!(self.body["reason"], reason, "body: {}", self.body);
        self.body["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    #[track_caller]
    fn ok(&self, code: u16) -> &Value {
        assert_eq!(self.code.as_u16(), code, "body: {}", self.body);
        &self.body
    }
}

fn ns_path(ns: &str, plural: &str) -> String {
    format!(
        "/apis/{}/{}/namespaces/{ns}/{plural}",
        apis::GROUP,
        apis::VERSION
    )
}

fn cluster_path(plural: &str) -> String {
    format!("/apis/{}/{}/{plural}", apis::GROUP, apis::VERSION)
}

impl Api {
    fn new() -> Self {
        Self::with_authorizer(Arc::new(AllowAuthenticated))
    }

    fn with_authorizer(authorizer: Arc<dyn Authorizer>) -> Self {
        let tokens = TokenFile::parse(
            &format!(
                "{ADMIN},admin,admin-uid,\"system:masters\"\n{ALICE},alice,alice-uid,\"devs\"\n{BOB},bob,bob-uid,\"devs\"\n"
            ),
            "test",
        )
        .expect("token file parses");
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let mut registry = Registry::default();
        let app = AppState::new(
            MemoryStore::new(),
            Arc::new(tokens),
            authorizer,
            HttpConfig::default(),
            HttpMetrics::register(&mut registry),
            shutdown,
        );
        Self { app }
    }

    async fn send(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
        content_type: &str,
        accept: Option<&str>,
    ) -> Answer {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"));
        if body.is_some() {
            builder = builder.header("content-type", content_type);
        }
        if let Some(accept) = accept {
            builder = builder.header("accept", accept);
        }
        let body = match body {
            Some(v) => Body::from(serde_json::to_vec(&v).expect("body encodes")),
            None => Body::empty(),
        };
        let response = self
            .app
            .clone()
            .handle(builder.body(body).expect("request builds"))
            .await;
        let code = response.status();
        let warnings = response
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body reads");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            code,
            body,
            warnings,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(ADMIN, Method::GET, path, None, "", None).await
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> Answer {
        self.send(
            token,
            Method::POST,
            path,
            Some(body),
            "application/json",
            None,
        )
        .await
    }

    async fn put(&self, path: &str, body: Value) -> Answer {
        self.send(
            ADMIN,
            Method::PUT,
            path,
            Some(body),
            "application/json",
            None,
        )
        .await
    }

    async fn patch(&self, token: &str, path: &str, patch_type: &str, body: Value) -> Answer {
        self.send(token, Method::PATCH, path, Some(body), patch_type, None)
            .await
    }

    async fn delete(&self, token: &str, path: &str) -> Answer {
        self.send(token, Method::DELETE, path, None, "", None).await
    }
}

fn in_hours(h: i64) -> String {
    serde_json::to_value(support::in_hours(h))
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

fn session(name: &str, server_uid: &str, labels: Value) -> Value {
    json!({
        "apiVersion": format!("{}/{}", apis::GROUP, apis::VERSION),
        "kind": "AccessSession",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "server": {"name": "github", "uid": server_uid},
            "teams": ["payments"],
            "expiresAt": in_hours(1),
        }
    })
}

fn human_session(name: &str, server_uid: &str, user: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "server": {"name": "github", "uid": server_uid},
            "subject": {"user": user},
            "expiresAt": in_hours(1),
        }
    })
}

fn agent_session(name: &str, agent: &str, teams: &[&str]) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "server": {"name": "github", "uid": "srv-1"},
            "agent": {"name": agent},
            "teams": teams,
            "expiresAt": in_hours(1),
        }
    })
}

fn revocation(name: &str, target: Value, cause: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"target": target, "cause": cause}})
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn phase_of(body: &Value) -> String {
    body["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn sessions_create_get_list_update_delete_as_a_user_sees_them() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");

    let created = api
        .post(
            ADMIN,
            &sessions,
            session("s1", "srv-1", json!({"tier": "gold"})),
        )
        .await;
    let body = created.ok(201);
    assert_eq!(body["kind"], "AccessSession");
    assert_eq!(body["metadata"]["namespace"], "team-a");
    assert_eq!(phase_of(body), "Active");
    assert!(body["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty()));
    let rv1 = body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let again = api
        .post(ADMIN, &sessions, session("s1", "srv-1", json!({})))
        .await;
    let message = again.status(409, "AlreadyExists");
    assert_eq!(
        message,
        "accesssessions.access.mcp-runtime.dev \"s1\" already exists"
    );
    assert_eq!(again.body["details"]["name"], "s1");

    let got = api.get(&format!("{sessions}/s1")).await;
    assert_eq!(got.ok(200)["metadata"]["resourceVersion"], rv1.as_str());
    let missing = api.get(&format!("{sessions}/nope")).await;
    assert_eq!(
        missing.status(404, "NotFound"),
        "accesssessions.access.mcp-runtime.dev \"nope\" not found"
    );

    for (name, server, tier) in [("s2", "srv-2", "gold"), ("s3", "srv-1", "silver")] {
        api.post(
            ADMIN,
            &sessions,
            session(name, server, json!({"tier": tier})),
        )
        .await
        .ok(201);
    }
    api.post(
        ADMIN,
        &ns_path("team-b", "accesssessions"),
        session("s4", "srv-1", json!({"tier": "gold"})),
    )
    .await
    .ok(201);

    let list = api.get(&sessions).await;
    assert_eq!(list.ok(200)["kind"], "AccessSessionList");
    assert_eq!(names(&list.body), ["s1", "s2", "s3"]);
    let all = api.get(&cluster_path("accesssessions")).await;
    assert_eq!(names(all.ok(200)), ["s1", "s2", "s3", "s4"]);
    let gold = api
        .get(&format!("{sessions}?labelSelector=tier%3Dgold"))
        .await;
    assert_eq!(names(gold.ok(200)), ["s1", "s2"]);
    let not_gold = api
        .get(&format!("{sessions}?labelSelector=tier!%3Dgold"))
        .await;
    assert_eq!(names(not_gold.ok(200)), ["s3"]);
    let by_server = api
        .get(&format!(
            "{}?fieldSelector=spec.server.uid%3Dsrv-1",
            cluster_path("accesssessions")
        ))
        .await;
    assert_eq!(names(by_server.ok(200)), ["s1", "s3", "s4"]);
    let by_name = api
        .get(&format!("{sessions}?fieldSelector=metadata.name!%3Ds2"))
        .await;
    assert_eq!(names(by_name.ok(200)), ["s1", "s3"]);
    let unknown_field = api
        .get(&format!("{sessions}?fieldSelector=spec.teams%3Dx"))
        .await;
    unknown_field.status(400, "BadRequest");

    // Paging: limit and continue walk the list once, in order.
    let page1 = api.get(&format!("{sessions}?limit=2")).await;
    assert_eq!(names(page1.ok(200)), ["s1", "s2"]);
    let token = page1.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let page2 = api
        .get(&format!("{sessions}?limit=2&continue={token}"))
        .await;
    assert_eq!(names(page2.ok(200)), ["s3"]);
    assert!(page2.body["metadata"]["continue"]
        .as_str()
        .is_none_or(str::is_empty));

    // Update (PUT) of metadata; the stale resourceVersion is then refused.
    let mut current = api.get(&format!("{sessions}/s1")).await.body;
    current["metadata"]["labels"]["tier"] = json!("platinum");
    let updated = api.put(&format!("{sessions}/s1"), current.clone()).await;
    assert_eq!(updated.ok(200)["metadata"]["labels"]["tier"], "platinum");
    assert_ne!(updated.body["metadata"]["resourceVersion"], rv1.as_str());
    current["metadata"]["labels"]["tier"] = json!("bronze");
    let stale = api.put(&format!("{sessions}/s1"), current).await;
    assert_eq!(
        stale.status(409, "Conflict"),
        "Operation cannot be fulfilled on accesssessions.access.mcp-runtime.dev \"s1\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // An invalid label is refused 422 with its cause.
    let bad = api
        .patch(
            ADMIN,
            &format!("{sessions}/s1"),
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"bad key!": "x"}}}),
        )
        .await;
    let message = bad.status(422, "Invalid");
    assert!(message.starts_with("AccessSession.access.mcp-runtime.dev \"s1\" is invalid"));
    let causes = bad.body["details"]["causes"].as_array().unwrap();
    assert!(
        causes
            .iter()
            .any(|c| c["field"].as_str().unwrap_or_default().contains("labels")),
        "{causes:?}"
    );

    // Delete answers the last state; the name is reserved afterwards.
    let deleted = api.delete(ADMIN, &format!("{sessions}/s2")).await;
    deleted.ok(200);
    api.get(&format!("{sessions}/s2"))
        .await
        .status(404, "NotFound");
    let reuse = api
        .post(ADMIN, &sessions, session("s2", "srv-2", json!({})))
        .await;
    assert!(reuse
        .status(409, "AlreadyExists")
        .contains("names are never reused"));
    api.delete(ADMIN, &format!("{sessions}/s2"))
        .await
        .status(404, "NotFound");
}

#[tokio::test]
async fn invalid_objects_are_refused_422_with_their_causes() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    let mut no_uid = session("s1", "", json!({}));
    no_uid["spec"]["teams"] = json!([]);
    let answer = api.post(ADMIN, &sessions, no_uid).await;
    let message = answer.status(422, "Invalid");
    assert!(message.starts_with("AccessSession.access.mcp-runtime.dev \"s1\" is invalid: "));
    let causes = answer.body["details"]["causes"].as_array().unwrap();
    let fields: Vec<&str> = causes.iter().filter_map(|c| c["field"].as_str()).collect();
    assert!(fields.contains(&"spec.server.uid"), "{causes:?}");
    assert!(causes.iter().all(|c| c["reason"].as_str().is_some()));
    assert_eq!(answer.body["details"]["kind"], "AccessSession");
    api.get(&format!("{sessions}/s1"))
        .await
        .status(404, "NotFound");

    let bad_name = api
        .post(ADMIN, &sessions, session("Not_A_Name", "srv-1", json!({})))
        .await;
    bad_name.status(422, "Invalid");

    // The agent a session names must exist: a field error, not a 404.
    let missing_agent = api
        .post(
            ADMIN,
            &sessions,
            agent_session("s2", "ghost", &["payments"]),
        )
        .await;
    let message = missing_agent.status(422, "Invalid");
    assert!(message.contains("spec.agent.name"), "{message}");

    let revocation_without_target = api
        .post(
            ADMIN,
            &ns_path("team-a", "revocations"),
            revocation("r1", json!({}), "compromised"),
        )
        .await;
    assert!(revocation_without_target
        .status(422, "Invalid")
        .contains("spec.target"));
}

#[tokio::test]
async fn patches_merge_json_and_strategic() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    api.post(ADMIN, &sessions, session("s1", "srv-1", json!({"a": "1"})))
        .await
        .ok(201);
    let path = format!("{sessions}/s1");

    let merged = api
        .patch(
            ADMIN,
            &path,
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"b": "2", "a": null}}}),
        )
        .await;
    assert_eq!(merged.ok(200)["metadata"]["labels"], json!({"b": "2"}));

    let json_patched = api
        .patch(
            ADMIN,
            &path,
            "application/json-patch+json",
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"note": "x"}}]),
        )
        .await;
    assert_eq!(json_patched.ok(200)["metadata"]["annotations"]["note"], "x");
    let failed_test = api
        .patch(
            ADMIN,
            &path,
            "application/json-patch+json",
            json!([{"op": "test", "path": "/metadata/labels/b", "value": "nope"}]),
        )
        .await;
    failed_test.status(422, "Invalid");

    let strategic = api
        .patch(
            ADMIN,
            &path,
            "application/strategic-merge-patch+json",
            json!({"metadata": {"labels": {"c": "3"}}}),
        )
        .await;
    assert_eq!(
        strategic.ok(200)["metadata"]["labels"],
        json!({"b": "2", "c": "3"})
    );

    // The server of a session is fixed at issuance.
    let server = api
        .patch(
            ADMIN,
            &path,
            "application/merge-patch+json",
            json!({"spec": {"server": {"uid": "srv-2"}}}),
        )
        .await;
    let message = server.status(422, "Invalid");
    assert!(
        message.ends_with("spec.server: field is immutable"),
        "{message}"
    );
    assert_eq!(server.body["details"]["causes"][0]["field"], "spec.server");
    assert_eq!(
        api.get(&path).await.body["spec"]["server"]["uid"],
        "srv-1",
        "a refused patch writes nothing"
    );

    let unsupported = api.patch(ADMIN, &path, "application/yaml", json!({})).await;
    unsupported.status(415, "UnsupportedMediaType");
    api.patch(
        ADMIN,
        &format!("{sessions}/nope"),
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await
    .status(404, "NotFound");
}

#[tokio::test]
async fn agents_bound_scope_quota_active_count_and_deactivation() {
    let api = Api::new();
    let agents = cluster_path("agents");
    let created = api
        .post(
            ADMIN,
            &agents,
            json!({"metadata": {"name": "bot"}, "spec": {"teams": ["payments"], "maxActiveSessions": 1}}),
        )
        .await;
    assert_eq!(created.ok(201)["kind"], "Agent");
    api.post(
        ADMIN,
        &agents,
        json!({"metadata": {"name": "bot"}, "spec": {}}),
    )
    .await
    .status(409, "AlreadyExists");
    // Agents are cluster-scoped: no namespaced path.
    api.get(&format!("{}/bot", ns_path("team-a", "agents")))
        .await
        .status(404, "NotFound");

    let sessions = ns_path("team-a", "accesssessions");
    let escalation = api
        .post(
            ADMIN,
            &sessions,
            agent_session("s0", "bot", &["payments", "infra"]),
        )
        .await;
    let message = escalation.status(403, "ScopeEscalation");
    assert!(
        message.starts_with("accesssessions.access.mcp-runtime.dev \"s0\" is forbidden: "),
        "{message}"
    );
    assert!(message.contains("infra"), "{message}");

    let first = api
        .post(ADMIN, &sessions, agent_session("s1", "bot", &["payments"]))
        .await;
    let agent_uid = api.get(&format!("{agents}/bot")).await.body["metadata"]["uid"].clone();
    assert_eq!(first.ok(201)["spec"]["agent"]["uid"], agent_uid);
    assert_eq!(
        api.get(&format!("{agents}/bot")).await.body["status"]["activeSessions"],
        1
    );
    let quota = api
        .post(ADMIN, &sessions, agent_session("s2", "bot", &["payments"]))
        .await;
    let message = quota.status(403, "QuotaExceeded");
    assert!(message.contains("maxActiveSessions 1"), "{message}");

    // A list completes every agent's count too.
    api.post(
        ADMIN,
        &agents,
        json!({"metadata": {"name": "idle"}, "spec": {}}),
    )
    .await
    .ok(201);
    let list = api.get(&agents).await;
    let counts: Vec<(String, Value)> = list.ok(200)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["metadata"]["name"].as_str().unwrap().to_string(),
                a["status"]["activeSessions"].clone(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("bot".to_string(), json!(1)),
            ("idle".to_string(), json!(0))
        ]
    );

    // Deactivating revokes the bound sessions and refuses new ones.
    let deactivated = api
        .patch(
            ADMIN,
            &format!("{agents}/bot"),
            "application/merge-patch+json",
            json!({"spec": {"active": false}}),
        )
        .await;
    let body = deactivated.ok(200);
    assert!(body["status"]["deactivatedAt"].as_str().is_some());
    let s1 = api.get(&format!("{sessions}/s1")).await;
    assert_eq!(phase_of(&s1.body), "Revoked");
    assert_eq!(
        s1.body["status"]["revocation"]["cause"], "agent_deactivated",
        "{}",
        s1.body
    );
    assert_eq!(
        api.get(&format!("{agents}/bot")).await.body["status"]["activeSessions"],
        0
    );
    let inactive = api
        .post(ADMIN, &sessions, agent_session("s3", "bot", &["payments"]))
        .await;
    assert!(inactive
        .status(403, "Forbidden")
        .contains("agent \"bot\" is not active"));

    api.delete(ADMIN, &format!("{agents}/bot")).await.ok(200);
    api.get(&format!("{agents}/bot"))
        .await
        .status(404, "NotFound");
}

#[tokio::test]
async fn enrollments_pending_owner_completion_and_withdrawal() {
    let api = Api::new();
    let enrollments = ns_path("team-a", "enrollments");
    let sessions = ns_path("team-a", "accesssessions");
    let mut e1 = human_session("e1", "srv-1", "alice");
    e1["kind"] = json!("Enrollment");
    let created = api.post(ALICE, &enrollments, e1.clone()).await;
    let body = created.ok(201).clone();
    assert_eq!(body["status"]["phase"], "Pending");
    assert_eq!(body["status"]["owner"], "alice");
    assert_eq!(body["status"]["ownerUid"], "alice-uid");
    let session = api.get(&format!("{sessions}/e1")).await;
    assert_eq!(phase_of(session.ok(200)), "PendingEnrollment");
    assert_eq!(session.body["metadata"]["uid"], body["metadata"]["uid"]);
    api.post(ALICE, &enrollments, e1)
        .await
        .status(409, "AlreadyExists");

    // Only the owner withdraws a pending enrollment.
    let not_owner = api.delete(BOB, &format!("{enrollments}/e1")).await;
    let message = not_owner.status(403, "Forbidden");
    assert!(message.contains("only the owner \"alice\""), "{message}");
    api.get(&format!("{enrollments}/e1")).await.ok(200);

    // Completion through the status subresource activates the session.
    let status_path = format!("{enrollments}/e1/status");
    let unsupported = api
        .patch(
            ADMIN,
            &status_path,
            "application/merge-patch+json",
            json!({"status": {"phase": "Bogus"}}),
        )
        .await;
    let message = unsupported.status(422, "Invalid");
    assert!(message.contains("status.phase"), "{message}");
    let completed = api
        .patch(
            ADMIN,
            &status_path,
            "application/merge-patch+json",
            json!({"status": {"phase": "Completed"}}),
        )
        .await;
    assert_eq!(completed.ok(200)["status"]["phase"], "Completed");
    assert!(completed.body["status"]["completedAt"].as_str().is_some());
    let session = api.get(&format!("{sessions}/e1")).await;
    assert_eq!(phase_of(&session.body), "Active");
    assert!(session.body["status"]["enrollment"].is_null());
    assert_eq!(
        api.get(&status_path).await.ok(200)["status"]["phase"],
        "Completed"
    );
    // A completed record goes for anyone who may delete it; the session stays.
    api.delete(BOB, &format!("{enrollments}/e1")).await.ok(200);
    api.get(&format!("{sessions}/e1")).await.ok(200);

    // Sessions have no status subresource.
    api.patch(
        ADMIN,
        &format!("{sessions}/e1/status"),
        "application/merge-patch+json",
        json!({"status": {"phase": "Revoked"}}),
    )
    .await
    .status(404, "NotFound");
    assert_eq!(
        phase_of(&api.get(&format!("{sessions}/e1")).await.body),
        "Active"
    );

    // The owner withdraws a pending one: its session goes and the name stays reserved.
    let e2 = human_session("e2", "srv-1", "alice");
    api.post(ALICE, &enrollments, e2).await.ok(201);
    api.delete(ALICE, &format!("{enrollments}/e2"))
        .await
        .ok(200);
    api.get(&format!("{sessions}/e2"))
        .await
        .status(404, "NotFound");
    api.post(ADMIN, &sessions, human_session("e2", "srv-1", "alice"))
        .await
        .status(409, "AlreadyExists");
    api.post(ALICE, &enrollments, human_session("e2", "srv-1", "alice"))
        .await
        .status(409, "AlreadyExists");

    // Field selectors on owner and phase.
    api.post(BOB, &enrollments, human_session("e3", "srv-1", "bob"))
        .await
        .ok(201);
    api.post(ALICE, &enrollments, human_session("e4", "srv-1", "alice"))
        .await
        .ok(201);
    let alices = api
        .get(&format!("{enrollments}?fieldSelector=status.owner%3Dalice"))
        .await;
    assert_eq!(names(alices.ok(200)), ["e4"]);
}

#[tokio::test]
async fn revocations_refuse_issuance_and_withdrawal_restores() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    let revocations = ns_path("team-a", "revocations");
    api.post(ADMIN, &sessions, human_session("s1", "srv-1", "mallory"))
        .await
        .ok(201);
    api.post(ADMIN, &sessions, human_session("s2", "srv-1", "mallory"))
        .await
        .ok(201);
    api.post(ADMIN, &sessions, human_session("s3", "srv-1", "carol"))
        .await
        .ok(201);

    let created = api
        .post(
            ADMIN,
            &revocations,
            revocation("r-mallory", json!({"subject": "mallory"}), "compromised"),
        )
        .await;
    let body = created.ok(201);
    assert_eq!(body["status"]["revokedSessions"], 2);
    assert!(created.warnings.is_empty(), "{:?}", created.warnings);
    for name in ["s1", "s2"] {
        let s = api.get(&format!("{sessions}/{name}")).await.body;
        assert_eq!(phase_of(&s), "Revoked");
        assert_eq!(
            s["status"]["revocation"]["revocationName"], "r-mallory",
            "{s}"
        );
    }
    assert_eq!(
        phase_of(&api.get(&format!("{sessions}/s3")).await.body),
        "Active"
    );

    // A second revocation covering an already revoked session warns.
    let also = api
        .post(
            ADMIN,
            &revocations,
            revocation("r-s1", json!({"session": "s1"}), "compromised"),
        )
        .await;
    assert_eq!(also.ok(201)["status"]["revokedSessions"], 1);
    assert_eq!(also.warnings.len(), 1, "{:?}", also.warnings);
    assert!(also.warnings[0].contains("already revoked"));

    // The standing revocation refuses issuance for its subject, naming itself.
    let refused = api
        .post(ADMIN, &sessions, human_session("s4", "srv-1", "mallory"))
        .await;
    let message = refused.status(409, "Conflict");
    assert!(message.contains("revocation \"r-mallory\""), "{message}");

    // A revocation of an unknown session is invalid.
    api.post(
        ADMIN,
        &revocations,
        revocation("r-ghost", json!({"session": "ghost"}), "compromised"),
    )
    .await
    .status(422, "Invalid");

    // Withdrawal restores what nothing else covers.
    api.delete(ADMIN, &format!("{revocations}/r-mallory"))
        .await
        .ok(200);
    assert_eq!(
        phase_of(&api.get(&format!("{sessions}/s2")).await.body),
        "Active"
    );
    assert_eq!(
        phase_of(&api.get(&format!("{sessions}/s1")).await.body),
        "Revoked",
        "s1 is still covered by r-s1"
    );
    api.post(ADMIN, &sessions, human_session("s4", "srv-1", "mallory"))
        .await
        .ok(201);
    api.delete(ADMIN, &format!("{revocations}/r-s1"))
        .await
        .ok(200);
    assert_eq!(
        phase_of(&api.get(&format!("{sessions}/s1")).await.body),
        "Active"
    );
}

#[tokio::test]
async fn fences_are_permanent_and_reach_as_far_as_the_creator_authority() {
    let api = Api::with_authorizer(Arc::new(NamespaceOnlyForUsers));
    let a = ns_path("team-a", "accesssessions");
    let b = ns_path("team-b", "accesssessions");
    for (path, name) in [(&a, "s1"), (&b, "s2")] {
        api.post(ADMIN, path, session(name, "srv-old", json!({})))
            .await
            .ok(201);
    }
    // Alice's fence reaches her namespace only.
    let local = api
        .post(
            ALICE,
            &ns_path("team-a", "revocations"),
            revocation(
                "retire",
                json!({"server": {"name": "github", "uid": "srv-old"}}),
                "server_retired",
            ),
        )
        .await;
    assert_eq!(
        local.ok(201)["status"]["clusterWide"].as_bool(),
        None,
        "{}",
        local.body
    );
    assert_eq!(local.body["status"]["revokedSessions"], 1);
    assert_eq!(phase_of(&api.get(&format!("{b}/s2")).await.body), "Active");
    let fenced = api
        .post(ADMIN, &a, session("s3", "srv-old", json!({})))
        .await;
    assert!(fenced
        .status(409, "Conflict")
        .contains("server uid \"srv-old\" was retired"));
    api.post(ADMIN, &b, session("s4", "srv-old", json!({})))
        .await
        .ok(201);

    // The admin's reaches every namespace.
    let global = api
        .post(
            ADMIN,
            &ns_path("team-c", "revocations"),
            revocation(
                "retire-all",
                json!({"server": {"name": "github", "uid": "srv-old"}}),
                "server_retired",
            ),
        )
        .await;
    assert_eq!(global.ok(201)["status"]["clusterWide"], true);
    assert_eq!(global.body["status"]["revokedSessions"], 3);
    assert_eq!(phase_of(&api.get(&format!("{b}/s2")).await.body), "Revoked");
    api.post(ADMIN, &b, session("s5", "srv-old", json!({})))
        .await
        .status(409, "Conflict");

    let permanent = api
        .delete(
            ADMIN,
            &format!("{}/retire", ns_path("team-a", "revocations")),
        )
        .await;
    assert_eq!(
        permanent.status(409, "Conflict"),
        "revocation \"retire\" fences a retired server generation; fences are permanent"
    );
    api.get(&format!("{}/retire", ns_path("team-a", "revocations")))
        .await
        .ok(200);
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    let dry = api
        .post(
            ADMIN,
            &format!("{sessions}?dryRun=All"),
            session("s1", "srv-1", json!({})),
        )
        .await;
    assert_eq!(dry.ok(201)["metadata"]["name"], "s1");
    api.get(&format!("{sessions}/s1"))
        .await
        .status(404, "NotFound");
    api.post(
        ADMIN,
        &format!("{sessions}?dryRun=Bogus"),
        session("s1", "srv-1", json!({})),
    )
    .await
    .status(400, "BadRequest");

    api.post(ADMIN, &sessions, session("s1", "srv-1", json!({})))
        .await
        .ok(201);
    let before = api.get(&format!("{sessions}/s1")).await.body;
    api.patch(
        ADMIN,
        &format!("{sessions}/s1?dryRun=All"),
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await
    .ok(200);
    let dry_revocation = api
        .post(
            ADMIN,
            &format!("{}?dryRun=All", ns_path("team-a", "revocations")),
            revocation(
                "r",
                json!({"server": {"name": "github", "uid": "srv-1"}}),
                "server_retired",
            ),
        )
        .await;
    assert_eq!(dry_revocation.ok(201)["status"]["revokedSessions"], 1);
    api.delete(ADMIN, &format!("{sessions}/s1?dryRun=All"))
        .await
        .ok(200);
    assert_eq!(api.get(&format!("{sessions}/s1")).await.body, before);
    // Not even the fence was installed.
    api.post(ADMIN, &sessions, session("s2", "srv-1", json!({})))
        .await
        .ok(201);
    let list = api.get(&ns_path("team-a", "revocations")).await;
    assert_eq!(names(list.ok(200)), Vec::<String>::new());
}

#[tokio::test]
async fn deletecollection_deletes_what_the_selector_selects() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    for (name, tier) in [("s1", "gold"), ("s2", "silver"), ("s3", "gold")] {
        api.post(
            ADMIN,
            &sessions,
            session(name, "srv-1", json!({"tier": tier})),
        )
        .await
        .ok(201);
    }
    let deleted = api
        .delete(ADMIN, &format!("{sessions}?labelSelector=tier%3Dgold"))
        .await;
    deleted.ok(200);
    assert_eq!(names(&api.get(&sessions).await.body), ["s2"]);
    // Their names are reserved like any deleted session's.
    api.post(ADMIN, &sessions, session("s1", "srv-1", json!({})))
        .await
        .status(409, "AlreadyExists");
    // Not on the all-namespaces path.
    let all = api.delete(ADMIN, &cluster_path("accesssessions")).await;
    all.status(405, "MethodNotAllowed");
    assert_eq!(names(&api.get(&sessions).await.body), ["s2"]);
}

#[tokio::test]
async fn tables_render_columns_and_rows() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    api.post(ADMIN, &sessions, session("s1", "srv-1", json!({})))
        .await
        .ok(201);
    api.post(ADMIN, &sessions, human_session("s2", "srv-1", "carol"))
        .await
        .ok(201);
    let table = api
        .send(ADMIN, Method::GET, &sessions, None, "", Some(TABLE))
        .await;
    let body = table.ok(200);
    assert_eq!(body["kind"], "Table");
    assert_eq!(body["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns.first(), Some(&"Name"), "{columns:?}");
    let rows = body["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["cells"][0], "s1");
    assert_eq!(rows[0]["cells"].as_array().unwrap().len(), columns.len());
    let one = api
        .send(
            ADMIN,
            Method::GET,
            &format!("{}/s2", sessions),
            None,
            "",
            Some(TABLE),
        )
        .await;
    assert_eq!(one.ok(200)["rows"][0]["cells"][0], "s2");
    let agents_table = api
        .send(
            ADMIN,
            Method::GET,
            &cluster_path("agents"),
            None,
            "",
            Some(TABLE),
        )
        .await;
    assert_eq!(agents_table.ok(200)["kind"], "Table");
    let bad_accept = api
        .send(
            ADMIN,
            Method::GET,
            &sessions,
            None,
            "",
            Some("application/yaml"),
        )
        .await;
    bad_accept.status(406, "NotAcceptable");
}

#[tokio::test]
async fn watch_over_memory_is_served_and_auth_still_applies() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    // The memory store serves watches (tests/watch_memory.rs); this one ends at once, as
    // this harness keeps no shutdown sender alive.
    let watch = api
        .get(&format!("{sessions}?watch=true&timeoutSeconds=1"))
        .await;
    assert_eq!(watch.code, StatusCode::OK, "body: {}", watch.body);
    let anonymous = api
        .send(
            "wrong-token-0000000000",
            Method::GET,
            &sessions,
            None,
            "",
            None,
        )
        .await;
    anonymous.status(401, "Unauthorized");
    let unknown = api
        .get(&format!(
            "/apis/{}/{}/namespaces/a/widgets",
            apis::GROUP,
            apis::VERSION
        ))
        .await;
    unknown.status(404, "NotFound");
}

/// Builds an object of a kind from a name.
type Build = fn(&str) -> Value;

#[tokio::test]
async fn every_kind_serves_get_list_patch_update_delete() {
    let api = Api::new();
    let kinds: [(&str, String, Build); 4] = [
        ("AccessSession", ns_path("team-a", "accesssessions"), |n| {
            session(n, "srv-1", json!({}))
        }),
        (
            "Agent",
            cluster_path("agents"),
            |n| json!({"metadata": {"name": n}, "spec": {"teams": ["payments"]}}),
        ),
        ("Enrollment", ns_path("team-a", "enrollments"), |n| {
            let mut e = human_session(n, "srv-1", "alice");
            e["metadata"]["name"] = json!(format!("e-{n}"));
            e
        }),
        ("Revocation", ns_path("team-b", "revocations"), |n| {
            revocation(n, json!({"subject": "nobody"}), "compromised")
        }),
    ];
    for (kind, collection, object) in kinds {
        let created: Vec<String> = ["k1", "k2", "k3"]
            .iter()
            .map(|n| {
                let o = object(n);
                o["metadata"]["name"].as_str().unwrap().to_string()
            })
            .collect();
        for n in ["k1", "k2", "k3"] {
            let answer = api.post(ADMIN, &collection, object(n)).await;
            assert_eq!(answer.ok(201)["kind"], kind);
        }
        let (first, second) = (&created[0], &created[1]);
        let path = format!("{collection}/{first}");
        assert_eq!(api.get(&path).await.ok(200)["kind"], kind);
        api.post(ADMIN, &collection, object("k1"))
            .await
            .status(409, "AlreadyExists");

        // Labels through a merge patch and a PUT, then a label-selected list.
        let patched = api
            .patch(
                ADMIN,
                &path,
                "application/merge-patch+json",
                json!({"metadata": {"labels": {"pick": "yes"}}}),
            )
            .await;
        assert_eq!(patched.ok(200)["metadata"]["labels"]["pick"], "yes");
        let mut current = api.get(&format!("{collection}/{second}")).await.body;
        current["metadata"]["labels"] = json!({"pick": "yes"});
        api.put(&format!("{collection}/{second}"), current.clone())
            .await
            .ok(200);
        api.put(&format!("{collection}/{second}"), current)
            .await
            .status(409, "Conflict");
        let picked = api
            .get(&format!("{collection}?labelSelector=pick%3Dyes"))
            .await;
        assert_eq!(
            names(picked.ok(200)),
            [first.clone(), second.clone()],
            "{kind}"
        );
        assert_eq!(picked.body["kind"], format!("{kind}List"));

        // Get, delete and deletecollection as the admin.
        api.delete(ADMIN, &path).await.ok(200);
        api.get(&path).await.status(404, "NotFound");
        let collection_delete = api
            .delete(ADMIN, &format!("{collection}?labelSelector=pick%3Dyes"))
            .await;
        if kind == "Revocation" {
            // Revocations are withdrawn one by one (each withdrawal decides what it restores).
            assert_eq!(
                collection_delete.status(405, "MethodNotAllowed"),
                "the server does not allow this method on the requested resource (DELETECOLLECTION revocations)"
            );
            api.delete(ADMIN, &format!("{collection}/{second}"))
                .await
                .ok(200);
        } else {
            collection_delete.ok(200);
        }
        assert_eq!(
            names(&api.get(&collection).await.body),
            [created[2].clone()],
            "{kind}"
        );
    }
}

#[tokio::test]
async fn paging_reads_one_snapshot_while_writes_go_on() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    for name in ["s1", "s2", "s3"] {
        api.post(ADMIN, &sessions, session(name, "srv-1", json!({})))
            .await
            .ok(201);
    }
    let page1 = api.get(&format!("{sessions}?limit=2")).await;
    assert_eq!(names(page1.ok(200)), ["s1", "s2"]);
    let rv = page1.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let token = page1.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    // Writes between the pages: the rest of the list is still the snapshot's.
    api.delete(ADMIN, &format!("{sessions}/s3")).await.ok(200);
    api.post(ADMIN, &sessions, session("s4", "srv-1", json!({})))
        .await
        .ok(201);
    api.patch(
        ADMIN,
        &format!("{sessions}/s1"),
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"changed": "yes"}}}),
    )
    .await
    .ok(200);
    let page2 = api
        .get(&format!("{sessions}?limit=2&continue={token}"))
        .await;
    assert_eq!(names(page2.ok(200)), ["s3"]);
    assert_eq!(page2.body["metadata"]["resourceVersion"], rv.as_str());

    // An exact resourceVersion reads that state too; the current one is newer.
    let exact = api
        .get(&format!(
            "{sessions}?resourceVersion={rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(names(exact.ok(200)), ["s1", "s2", "s3"]);
    assert!(exact.body["items"][0]["metadata"]["labels"]["changed"].is_null());
    assert_eq!(names(&api.get(&sessions).await.body), ["s1", "s2", "s4"]);
    // A version never handed out is not served.
    let future: u64 = rv.parse::<u64>().unwrap() + 1000;
    let future = api
        .get(&format!(
            "{sessions}?resourceVersion={future}&resourceVersionMatch=Exact"
        ))
        .await;
    future.status(410, "Expired");
}

#[tokio::test]
async fn refusals_name_their_reason_and_write_nothing() {
    let api = Api::new();
    let sessions = ns_path("team-a", "accesssessions");
    let revocations = ns_path("team-a", "revocations");
    let enrollments = ns_path("team-a", "enrollments");
    api.post(
        ADMIN,
        &cluster_path("agents"),
        json!({"metadata": {"name": "bot"}, "spec": {"teams": ["payments"]}}),
    )
    .await
    .ok(201);
    api.post(ADMIN, &sessions, agent_session("s1", "bot", &["payments"]))
        .await
        .ok(201);
    api.post(
        ADMIN,
        &revocations,
        revocation("r1", json!({"session": "s1"}), "compromised"),
    )
    .await
    .ok(201);
    api.patch(
        ADMIN,
        &format!("{}/bot", cluster_path("agents")),
        "application/merge-patch+json",
        json!({"spec": {"active": false}}),
    )
    .await
    .ok(200);
    // Withdrawing the revocation restores nothing: the deactivation covers the session too.
    api.delete(ADMIN, &format!("{revocations}/r1"))
        .await
        .ok(200);
    let s1 = api.get(&format!("{sessions}/s1")).await.body;
    assert_eq!(phase_of(&s1), "Revoked");
    assert_eq!(
        s1["status"]["revocation"]["coveredBy"],
        json!([{"cause": "agent_deactivated"}]),
        "{s1}"
    );

    // A revoked pending session cannot be completed.
    api.post(ALICE, &enrollments, human_session("e1", "srv-1", "alice"))
        .await
        .ok(201);
    api.post(
        ADMIN,
        &revocations,
        revocation("r2", json!({"session": "e1"}), "compromised"),
    )
    .await
    .ok(201);
    let completion = api
        .patch(
            ADMIN,
            &format!("{enrollments}/e1/status"),
            "application/merge-patch+json",
            json!({"status": {"phase": "Completed"}}),
        )
        .await;
    let message = completion.status(409, "Conflict");
    assert!(
        message.starts_with("cannot complete enrollment \"e1\": the session was revoked"),
        "{message}"
    );
    assert!(message.contains("revocation \"r2\""), "{message}");
    assert_eq!(
        api.get(&format!("{enrollments}/e1")).await.body["status"]["phase"],
        "Pending"
    );

    // Delete preconditions.
    let stored = api.get(&format!("{sessions}/s1")).await.body;
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();
    let wrong_uid = api
        .send(
            ADMIN,
            Method::DELETE,
            &format!("{sessions}/s1"),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-it"}})),
            "application/json",
            None,
        )
        .await;
    assert_eq!(
        wrong_uid.status(409, "Conflict"),
        format!("Precondition failed: UID in precondition: not-it, UID in object meta: {uid}")
    );
    let stale = api
        .send(
            ADMIN,
            Method::DELETE,
            &format!("{sessions}/s1"),
            Some(json!({"preconditions": {"resourceVersion": "1"}})),
            "application/json",
            None,
        )
        .await;
    stale.status(409, "Conflict");
    api.get(&format!("{sessions}/s1")).await.ok(200);
    let matching = api
        .send(
            ADMIN,
            Method::DELETE,
            &format!("{sessions}/s1"),
            Some(json!({"preconditions": {"uid": uid, "resourceVersion": stored["metadata"]["resourceVersion"]}})),
            "application/json",
            None,
        )
        .await;
    matching.ok(200);

    // A namespaced kind is not created at the cluster scope.
    api.post(
        ADMIN,
        &cluster_path("accesssessions"),
        session("s9", "srv-1", json!({})),
    )
    .await
    .status(405, "MethodNotAllowed");
}
