//! Server-side apply (`application/apply-patch+yaml`) and `managedFields`, as `kubectl apply
//! --server-side`, kube-rs `Patch::Apply` and a raw client see them: create, update, the
//! fields an apply prunes, conflicts named by manager, `--force-conflicts`, and every
//! malformed apply refused with a clear Status and nothing written.

mod support;

use std::sync::Arc;

use apis::{AccessSession, Agent, Revocation};
use apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use apiserver::store::Store;
use async_trait::async_trait;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use support::kubectl::*;
use support::server::{TestServer, ADMIN_TOKEN, USER_TOKEN};

const API_VERSION: &str = "access.mcp-runtime.dev/v1alpha1";

fn write_file(server: &TestServer, name: &str, text: &str) -> String {
    let path = server.dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn agent_manifest(name: &str, spec: &str, labels: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: Agent\nmetadata:\n  name: {name}\n{labels}spec:\n{spec}"
    )
}

/// `kubectl get -o json` with the managedFields it hides by default.
async fn get_json(server: &TestServer, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--show-managed-fields");
    let out = server.kubectl(&args).await;
    ok(&out);
    serde_json::from_str(&out.stdout).unwrap()
}

/// The managers of an object, as (manager, operation) pairs in stored order.
fn managers(object: &Value) -> Vec<(String, String)> {
    e2e::managed_field_managers(object)
}

fn entry<'a>(object: &'a Value, manager: &str) -> &'a Value {
    object["metadata"]["managedFields"]
        .as_array()
        .and_then(|entries| entries.iter().find(|e| e["manager"] == manager))
        .unwrap_or_else(|| panic!("no managedFields entry of {manager}: {object:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_server_side_creates_updates_prunes_conflicts_and_forces() {
    let server = TestServer::start().await;
    let spec_v1 = "  displayName: Billing bot\n  teams: [payments]\n  maxSessionTTL: 8h\n";
    let file = write_file(
        &server,
        "agent.yaml",
        &agent_manifest("ssa-bot", spec_v1, "  labels: {team: payments}\n"),
    );

    // Dry run: answered, nothing stored.
    let out = server
        .kubectl(&["apply", "--server-side", "--dry-run=server", "-f", &file])
        .await;
    ok(&out);
    failed_with(
        &server.kubectl(&["get", "agent", "ssa-bot"]).await,
        "NotFound",
        "ssa-bot",
    );

    // Create.
    let out = server
        .kubectl(&["apply", "--server-side", "-f", &file])
        .await;
    ok(&out);
    assert!(
        out.stdout
            .contains("agent.access.mcp-runtime.dev/ssa-bot serverside-applied"),
        "{out:#?}"
    );
    let created = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert_eq!(managers(&created), [("kubectl".into(), "Apply".into())]);
    let fields = &entry(&created, "kubectl")["fieldsV1"];
    assert_eq!(fields["f:spec"]["f:teams"], json!({}), "{fields:#}");
    assert_eq!(
        fields["f:metadata"]["f:labels"],
        json!({".": {}, "f:team": {}})
    );
    assert_eq!(entry(&created, "kubectl")["apiVersion"], API_VERSION);
    assert_eq!(entry(&created, "kubectl")["fieldsType"], "FieldsV1");
    assert!(entry(&created, "kubectl")["time"].is_string());

    // The same configuration again changes nothing, not even the resourceVersion.
    ok(&server
        .kubectl(&["apply", "--server-side", "-f", &file])
        .await);
    let again = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert_eq!(
        again["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    // An update by another manager takes the field it changes.
    ok(&server
        .kubectl(&[
            "patch",
            "agent",
            "ssa-bot",
            "--type=merge",
            "-p",
            r#"{"spec":{"teams":["ops"]}}"#,
        ])
        .await);
    let patched = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert_eq!(
        managers(&patched),
        [
            ("kubectl".into(), "Apply".into()),
            ("kubectl-patch".into(), "Update".into())
        ]
    );
    assert_eq!(
        entry(&patched, "kubectl-patch")["fieldsV1"],
        json!({"f:spec": {"f:teams": {}}})
    );
    assert!(entry(&patched, "kubectl")["fieldsV1"]["f:spec"]
        .get("f:teams")
        .is_none());

    // Applying the old teams conflicts with that manager; nothing changes.
    let out = server
        .kubectl(&["apply", "--server-side", "-f", &file])
        .await;
    failed(&out);
    assert!(
        out.stderr.contains(&format!(
            "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using {API_VERSION}: .spec.teams"
        )),
        "{out:#?}"
    );
    assert!(out.stderr.contains("--force-conflicts"), "{out:#?}");
    let unchanged = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert_eq!(unchanged["spec"]["teams"], json!(["ops"]));
    assert_eq!(
        unchanged["metadata"]["resourceVersion"],
        patched["metadata"]["resourceVersion"]
    );

    // Forced, the applier takes the field back; the updater owned nothing else.
    let out = server
        .kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &file])
        .await;
    ok(&out);
    let forced = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert_eq!(forced["spec"]["teams"], json!(["payments"]));
    assert_eq!(managers(&forced), [("kubectl".into(), "Apply".into())]);

    // A configuration that no longer sets a field removes it (and a label), unless another
    // manager owns it: the label `owner` set by `kubectl label` stays.
    ok(&server
        .kubectl(&["label", "agent", "ssa-bot", "owner=platform"])
        .await);
    let spec_v2 = "  teams: [payments]\n  maxSessionTTL: 8h\n";
    let file = write_file(
        &server,
        "agent-v2.yaml",
        &agent_manifest("ssa-bot", spec_v2, ""),
    );
    ok(&server
        .kubectl(&["apply", "--server-side", "-f", &file])
        .await);
    let pruned = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    assert!(pruned["spec"].get("displayName").is_none(), "{pruned:#}");
    assert_eq!(pruned["metadata"]["labels"], json!({"owner": "platform"}));
    assert_eq!(pruned["spec"]["teams"], json!(["payments"]));

    // Another applier setting the same value shares the field: no conflict.
    let file = write_file(
        &server,
        "agent-shared.yaml",
        &agent_manifest("ssa-bot", "  teams: [payments]\n", ""),
    );
    ok(&server
        .kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=gitops",
            "-f",
            &file,
        ])
        .await);
    let shared = get_json(&server, &["get", "agent", "ssa-bot", "-o", "json"]).await;
    for manager in ["kubectl", "gitops"] {
        assert_eq!(
            entry(&shared, manager)["fieldsV1"]["f:spec"]["f:teams"],
            json!({}),
            "{manager}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_patch_apply_creates_and_conflicts_by_manager() {
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let sessions: Api<AccessSession> = Api::namespaced(client.clone(), "ssa");
    let expires = support::in_hours(2).0.to_string();
    let session = json!({
        "apiVersion": API_VERSION, "kind": "AccessSession",
        "metadata": {"name": "alice-github", "labels": {"team": "payments"}},
        "spec": {"server": {"name": "github", "uid": "srv-ssa"},
                 "subject": {"user": "alice@example.com"}, "expiresAt": expires}
    });
    let created = sessions
        .patch(
            "alice-github",
            &PatchParams::apply("idp"),
            &Patch::Apply(&session),
        )
        .await
        .expect("apply creates the session");
    assert_eq!(
        serde_json::to_value(&created).unwrap()["status"]["phase"],
        "Active"
    );
    let entries = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].manager.as_deref(), Some("idp"));
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));

    // Another manager applying a different label value conflicts, naming the first.
    let relabel = json!({
        "apiVersion": API_VERSION, "kind": "AccessSession",
        "metadata": {"name": "alice-github", "labels": {"team": "ops"}}
    });
    let err = sessions
        .patch(
            "alice-github",
            &PatchParams::apply("ops-tool"),
            &Patch::Apply(&relabel),
        )
        .await
        .expect_err("conflicts with idp");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"idp\": .metadata.labels.team"
    );
    // Forced, the label changes hands; idp keeps the spec.
    let forced = sessions
        .patch(
            "alice-github",
            &PatchParams::apply("ops-tool").force(),
            &Patch::Apply(&relabel),
        )
        .await
        .expect("forced apply");
    assert_eq!(forced.metadata.labels.unwrap()["team"], "ops");
    let raw: Value = serde_json::to_value(&forced.metadata.managed_fields).unwrap();
    let idp = raw
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "idp")
        .unwrap();
    assert!(idp["fieldsV1"]["f:metadata"]["f:labels"]
        .get("f:team")
        .is_none());
    assert_eq!(idp["fieldsV1"]["f:spec"]["f:server"]["f:uid"], json!({}));

    // The spec is immutable through apply as through update: 422, nothing written.
    let moved = json!({
        "apiVersion": API_VERSION, "kind": "AccessSession",
        "metadata": {"name": "alice-github"},
        "spec": {"server": {"name": "gitlab", "uid": "srv-ssa"},
                 "subject": {"user": "alice@example.com"}, "expiresAt": expires}
    });
    let err = sessions
        .patch(
            "alice-github",
            &PatchParams::apply("idp").force(),
            &Patch::Apply(&moved),
        )
        .await
        .expect_err("immutable");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );

    // A Revocation applied into being revokes as a created one does.
    let revocations: Api<Revocation> = Api::namespaced(client.clone(), "ssa");
    let revocation = json!({
        "apiVersion": API_VERSION, "kind": "Revocation",
        "metadata": {"name": "pull-alice"},
        "spec": {"target": {"session": "alice-github"}, "cause": "compromised"}
    });
    revocations
        .patch(
            "pull-alice",
            &PatchParams::apply("secops"),
            &Patch::Apply(&revocation),
        )
        .await
        .expect("apply creates the revocation");
    let revoked = sessions.get("alice-github").await.unwrap();
    assert_eq!(
        serde_json::to_value(&revoked).unwrap()["status"]["phase"],
        "Revoked"
    );

    // A deleted session's name stays reserved for apply as for create.
    sessions
        .delete("alice-github", &Default::default())
        .await
        .expect("delete the session");
    let err = sessions
        .patch(
            "alice-github",
            &PatchParams::apply("idp"),
            &Patch::Apply(&session),
        )
        .await
        .expect_err("the name is reserved");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    // Cluster-scoped kinds too.
    let agents: Api<Agent> = Api::all(client);
    let agent = json!({"apiVersion": API_VERSION, "kind": "Agent",
                       "metadata": {"name": "rs-bot"}, "spec": {"teams": ["a"]}});
    let applied = agents
        .patch("rs-bot", &PatchParams::apply("rs"), &Patch::Apply(&agent))
        .await
        .unwrap();
    assert_eq!(applied.spec.teams, vec!["a".to_string()]);
}

/// A raw PATCH with the apply content type.
async fn apply_raw(server: &TestServer, path: &str, query: &str, body: &str) -> (u16, Value) {
    let resp = server
        .http()
        .patch(format!("{}{path}?{query}", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/apply-patch+yaml")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_applies_are_refused_and_write_nothing() {
    let server = TestServer::start().await;
    let path = "/apis/access.mcp-runtime.dev/v1alpha1/agents/raw-bot";
    let yaml = format!(
        "apiVersion: {API_VERSION}\nkind: Agent\nmetadata:\n  name: raw-bot\nspec:\n  teams:\n  - a\n"
    );
    let long_manager = format!("fieldManager={}", "m".repeat(129));
    let cases: Vec<(&str, String, u16, &str, &str)> = vec![
        ("", yaml.clone(), 422, "Invalid", "fieldManager"),
        (
            "fieldManager=m&force=maybe",
            yaml.clone(),
            400,
            "BadRequest",
            "force",
        ),
        (
            "fieldManager=m",
            "spec: [unclosed".into(),
            400,
            "BadRequest",
            "YAML",
        ),
        (
            "fieldManager=m",
            "- a\n- b\n".into(),
            400,
            "BadRequest",
            "object",
        ),
        (
            "fieldManager=m",
            "metadata: {name: raw-bot}\nspec: {teams: [a]}\n".into(),
            400,
            "BadRequest",
            "apiVersion",
        ),
        (
            "fieldManager=m",
            yaml.replace("kind: Agent", "kind: AccessSession"),
            400,
            "BadRequest",
            "kind",
        ),
        (
            "fieldManager=m",
            yaml.replace(
                "  name: raw-bot\n",
                "  name: raw-bot\n  managedFields: [{manager: x}]\n",
            ),
            400,
            "BadRequest",
            "managedFields",
        ),
        (
            "fieldManager=m",
            yaml.replace("  name: raw-bot\n", "  name: other-bot\n"),
            400,
            "BadRequest",
            "does not match",
        ),
        (
            "fieldManager=m",
            yaml.replace("  - a\n", "  - \"a\\0b\"\n"),
            400,
            "BadRequest",
            "NUL",
        ),
        (&long_manager, yaml.clone(), 422, "Invalid", "fieldManager"),
        (
            "fieldManager=m&fieldValidation=Strict",
            yaml.replace("  teams:\n", "  bogus: 1\n  teams:\n"),
            400,
            "BadRequest",
            "bogus",
        ),
    ];
    for (query, body, code, reason, text) in &cases {
        let (got, status) = apply_raw(&server, path, query, body).await;
        assert_eq!(
            (got, status["reason"].as_str().unwrap_or("")),
            (*code, *reason),
            "{query} {body:?}: {status:#}"
        );
        assert!(
            status["message"].as_str().unwrap_or("").contains(text),
            "{query} {body:?}: {status:#}"
        );
    }

    // A YAML alias bomb: refused, not expanded without bound.
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    let mut prev = 'a';
    for name in 'b'..='k' {
        bomb.push_str(&format!(
            "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
        prev = name;
    }
    let bomb = format!("apiVersion: {API_VERSION}\nkind: Agent\nmetadata: {{name: raw-bot}}\n{bomb}spec: {{teams: *k}}\n");
    let (got, status) = apply_raw(&server, path, "fieldManager=m", &bomb).await;
    assert!(
        got == 400 || got == 413,
        "alias bomb answered {got}: {status:#}"
    );

    // `force` belongs to apply only.
    let resp = server
        .http()
        .patch(format!("{}{path}?force=true", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"spec":{"teams":["b"]}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422);

    // Nothing of the above was written.
    let resp = server
        .http()
        .get(format!("{}{path}", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);

    // JSON is YAML: a JSON body applies; a stale resourceVersion in it is a precondition.
    let (got, created) = apply_raw(
        &server,
        path,
        "fieldManager=m",
        &json!({"apiVersion": API_VERSION, "kind": "Agent", "metadata": {"name": "raw-bot"},
                "spec": {"teams": ["a"]}})
        .to_string(),
    )
    .await;
    assert_eq!(got, 201, "{created:#}");
    let (got, status) = apply_raw(
        &server,
        path,
        "fieldManager=m",
        &json!({"apiVersion": API_VERSION, "kind": "Agent",
                "metadata": {"name": "raw-bot", "resourceVersion": "1"},
                "spec": {"teams": ["b"]}})
        .to_string(),
    )
    .await;
    assert_eq!(
        (got, status["reason"].as_str()),
        (409, Some("Conflict")),
        "{status:#}"
    );
    let (got, updated) = apply_raw(
        &server,
        path,
        "fieldManager=m",
        &json!({"apiVersion": API_VERSION, "kind": "Agent",
                "metadata": {"name": "raw-bot",
                             "resourceVersion": created["metadata"]["resourceVersion"]},
                "spec": {"teams": ["b"]}})
        .to_string(),
    )
    .await;
    assert_eq!(got, 200, "{updated:#}");
    assert_eq!(updated["spec"]["teams"], json!(["b"]));

    // An apply after a delete creates the object anew (agent names are not reserved).
    let deleted = server
        .http()
        .delete(format!("{}{path}", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 200);
    let (got, recreated) = apply_raw(&server, path, "fieldManager=m", &yaml).await;
    assert_eq!(got, 201, "{recreated:#}");
    assert_ne!(recreated["metadata"]["uid"], created["metadata"]["uid"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_record_their_manager_and_client_side_fields() {
    let server = TestServer::start().await;
    let file = write_file(
        &server,
        "agent.yaml",
        &agent_manifest("csa-bot", "  teams: [a]\n", ""),
    );
    // kubectl create records an Update by `kubectl-create`.
    ok(&server.kubectl(&["create", "-f", &file]).await);
    let created = get_json(&server, &["get", "agent", "csa-bot", "-o", "json"]).await;
    assert_eq!(
        managers(&created),
        [("kubectl-create".into(), "Update".into())]
    );
    // kubectl label records its own manager for the label only.
    ok(&server.kubectl(&["label", "agent", "csa-bot", "x=y"]).await);
    let labelled = get_json(&server, &["get", "agent", "csa-bot", "-o", "json"]).await;
    assert_eq!(
        entry(&labelled, "kubectl-label")["fieldsV1"],
        json!({"f:metadata": {"f:labels": {".": {}, "f:x": {}}}})
    );
    // kubectl replace sends the object back with its managedFields: the stored entries are
    // kept and the replacing manager takes what it changed.
    let mut replaced = labelled.clone();
    replaced["spec"]["teams"] = json!(["b"]);
    let file = write_file(&server, "replace.json", &replaced.to_string());
    ok(&server.kubectl(&["replace", "-f", &file]).await);
    let after = get_json(&server, &["get", "agent", "csa-bot", "-o", "json"]).await;
    assert_eq!(
        entry(&after, "kubectl-replace")["fieldsV1"],
        json!({"f:spec": {"f:teams": {}}})
    );
    assert!(entry(&after, "kubectl-create")["fieldsV1"]["f:spec"]
        .get("f:teams")
        .is_none());
    assert!(
        entry(&after, "kubectl-label")["fieldsV1"]["f:metadata"]["f:labels"]
            .get("f:x")
            .is_some()
    );
}

/// Alice may patch sessions but not create them, and may create revocations only in the
/// namespaces she is given (not cluster-wide): RBAC as a role with `patch` alone would grant.
struct PatchOnlyAlice;

#[async_trait]
impl Authorizer for PatchOnlyAlice {
    async fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        let alice = user.name == "alice" && a.resource_request && a.verb == "create";
        if alice && a.resource == "accesssessions" {
            Decision::Deny("alice patches sessions only".into())
        } else if alice && a.namespace.is_empty() {
            Decision::Deny("alice revokes in her namespaces only".into())
        } else {
            Decision::Allow
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_creates_is_authorized_as_a_create() {
    let server = TestServer::start_with_authorizer(Arc::new(PatchOnlyAlice)).await;
    let alice = server.kubeconfig_for(USER_TOKEN);
    // One expiry for every apply: a second apart, the same manifest would conflict on it.
    let expires_at = support::in_hours(1).0;
    let session = |labels: &str| {
        format!(
            "apiVersion: {API_VERSION}\nkind: AccessSession\nmetadata:\n  name: minted\n  namespace: team-a\n{labels}spec:\n  server: {{name: github, uid: srv-x}}\n  subject: {{user: mallory@example.com}}\n  expiresAt: \"{expires_at}\"\n"
        )
    };
    // `patch` alone does not mint a session.
    let out = server
        .kubectl_with(
            &alice,
            &["apply", "--server-side", "-f", "-"],
            Some(&session("")),
        )
        .await;
    failed_with(
        &out,
        "Forbidden",
        "cannot create resource \"accesssessions\"",
    );
    assert!(server
        .store
        .get::<AccessSession>("team-a", "minted")
        .await
        .is_err());
    // Created by someone who may, it is alice's to apply to.
    ok(&server
        .kubectl_with(
            &server.kubeconfig,
            &["apply", "--server-side", "-f", "-"],
            Some(&session("")),
        )
        .await);
    let out = server
        .kubectl_with(
            &alice,
            &["apply", "--server-side", "--field-manager=alice", "-f", "-"],
            Some(&session("  labels: {reviewed: \"yes\"}\n")),
        )
        .await;
    ok(&out);
    let labelled = get_json(
        &server,
        &["get", "acs", "minted", "-n", "team-a", "-o", "json"],
    )
    .await;
    assert_eq!(labelled["metadata"]["labels"], json!({"reviewed": "yes"}));

    // A fence created by apply reaches as far as its creator's RBAC, as one created by POST.
    let fence = |name: &str| {
        format!("apiVersion: {API_VERSION}\nkind: Revocation\nmetadata: {{name: {name}, namespace: team-a}}\nspec: {{target: {{server: {{name: github, uid: srv-x}}}}, cause: server_retired}}\n")
    };
    let out = server
        .kubectl_with(
            &alice,
            &[
                "apply",
                "--server-side",
                "-f",
                "-",
                "-o",
                "jsonpath={.status.clusterWide}",
            ],
            Some(&fence("alice-fence")),
        )
        .await;
    ok(&out);
    assert_eq!(out.stdout, "", "alice's fence is not cluster-wide");
    let out = server
        .kubectl_with(
            &server.kubeconfig,
            &[
                "apply",
                "--server-side",
                "-f",
                "-",
                "-o",
                "jsonpath={.status.clusterWide}",
            ],
            Some(&fence("admin-fence")),
        )
        .await;
    ok(&out);
    assert_eq!(out.stdout, "true", "the admin's fence is cluster-wide");
}
