//! The Context status controller against the local cluster: `mcp-access-controllers` (its own
//! service account and the RBAC of deploy/controllers) writes where each server a Context names
//! stands, counts the Ready ones and sets `Ready`; `kubectl get contexts` (the real kubectl,
//! table output) shows it. The MCPServers get Ready the ordinary way: the same controllers
//! deploy them and kube-controller-manager observes their Deployments.

use std::time::Duration;

use e2e::LocalCluster;
use serde_json::{json, Value};

use super::controllers::{
    apply, get_json, in_ns, start, touch_writes_nothing, until, wait_condition,
};
use super::{create_namespace, ok};

/// `result`, with the last lines of the controllers' log when it is an error.
fn with_log<T>(result: Result<T, String>, controllers: &e2e::Controllers) -> Result<T, String> {
    result.map_err(|e| {
        let text = std::fs::read_to_string(&controllers.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n    ");
        format!("{e}\n    --- {} ---\n    {tail}", controllers.log.display())
    })
}

fn server(name: &str) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name},
        "spec": {"image": "ghcr.io/acme/mcp:1", "port": 8080},
    })
}

/// The Context once its status is for its generation and its `status.servers`, as
/// `namespace/name state`, are `want`.
fn wait_servers(c: &LocalCluster, ns: &str, name: &str, want: &[&str]) -> Result<Value, String> {
    let mut last = Value::Null;
    until(
        Duration::from_secs(45),
        &format!("Context {ns}/{name} servers {want:?}"),
        || {
            let Some(ctx) = get_json(c, &["get", "contexts.mcp-runtime.dev", name, "-n", ns])?
            else {
                return Ok(None);
            };
            last = ctx["status"].clone();
            if ctx["status"]["observedGeneration"] != ctx["metadata"]["generation"] {
                return Ok(None);
            }
            Ok((summary(&ctx) == want).then_some(ctx))
        },
    )
    .map_err(|e| format!("{e}; last status: {last}"))
}

fn summary(ctx: &Value) -> Vec<String> {
    ctx["status"]["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{}/{} {}",
                s["namespace"].as_str().unwrap_or("?"),
                s["name"].as_str().unwrap_or("?"),
                s["state"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn ready_condition(ctx: &Value) -> Value {
    ctx["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or(Value::Null)
}

/// The `READY` and `GRANTED` cells of `kubectl get contexts` (table output) for `name`.
fn table_row(c: &LocalCluster, ns: &str, name: &str) -> Result<(String, String), String> {
    let out = ok(
        &c.kubectl(&["get", "contexts.mcp-runtime.dev", "-n", ns]),
        "kubectl get contexts",
    )?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let column = |title: &str| {
        header
            .iter()
            .position(|h| *h == title)
            .ok_or(format!("no {title} column in:\n{out}"))
    };
    let (ready, granted) = (column("READY")?, column("GRANTED")?);
    let row: Vec<&str> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .ok_or(format!("no row {name} in:\n{out}"))?;
    // The SERVERS cell holds no blanks (kube-apiserver shows the first name), so cells line up.
    let cell = |i: usize| {
        row.get(i)
            .map(|s| s.to_string())
            .ok_or(format!("short row in:\n{out}"))
    };
    Ok((cell(ready)?, cell(granted)?))
}

/// Events regarding Context `name`: `(type, reason, note, occurrences)`.
type Events = Vec<(String, String, String, u64)>;

fn events_of(c: &LocalCluster, ns: &str, name: &str) -> Result<Events, String> {
    let out = ok(
        &c.kubectl(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]),
        "kubectl get events",
    )?;
    let list: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["kind"] == "Context" && e["regarding"]["name"] == name)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (
                s("type"),
                s("reason"),
                s("note"),
                e["series"]["count"].as_u64().unwrap_or(1),
            )
        })
        .collect())
}

/// How often an Event of `reason` whose note holds `note_has` occurred (series included).
fn occurrences(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    reason: &str,
    note_has: &str,
) -> Result<u64, String> {
    Ok(events_of(c, ns, name)?
        .iter()
        .filter(|(_, r, n, _)| r == reason && n.contains(note_has))
        .map(|(.., count)| count)
        .sum())
}

fn wait_event(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
    note_has: &str,
) -> Result<(), String> {
    until(
        Duration::from_secs(15),
        &format!("a {type_} {reason} Event of Context {ns}/{name} saying {note_has:?}"),
        || {
            Ok(events_of(c, ns, name)?
                .iter()
                .any(|(t, r, n, _)| t == type_ && r == reason && n.contains(note_has))
                .then_some(()))
        },
    )
}

/// A Context naming a Ready server of its namespace, a missing one and one of another
/// namespace that does not consent: `Ready=False` naming both, one granted, in the status and
/// in `kubectl get contexts`, with a `ServerUnavailable` Warning for each. Creating the missing
/// server, then consenting by a namespace selector and labelling the Context's namespace, turns
/// it `Ready` (a Normal `Ready` Event, once); a touch writes nothing; deleting a server turns it
/// back.
pub fn status_follows_servers_and_consent(c: &mut LocalCluster) -> Result<(), String> {
    let (ns, shared) = ("ctx-team", "ctx-shared");
    create_namespace(c, ns)?;
    create_namespace(c, shared)?;
    let controllers = start(c, "contexts", "contexts", &[])?;
    let result = (|| {
        apply(c, &in_ns(server("github"), ns))?;
        apply(c, &in_ns(server("jira"), shared))?;
        wait_condition(c, ns, "github", "Ready", "True")?;
        wait_condition(c, shared, "jira", "Ready", "True")?;
        apply(
            c,
            &in_ns(
                json!({
                    "apiVersion": "mcp-runtime.dev/v1alpha1",
                    "kind": "Context",
                    "metadata": {"name": "dev"},
                    "spec": {
                        "mcpServers": [
                            {"name": "github"},
                            {"name": "slack"},
                            {"name": "jira", "namespace": shared},
                        ],
                        "hostSelector": {"matchLabels": {"agents": "dev"}},
                    },
                }),
                ns,
            ),
        )?;
        let ctx = wait_servers(
            c,
            ns,
            "dev",
            &[
                "ctx-team/github Ready",
                "ctx-team/slack Missing",
                "ctx-shared/jira NotAllowed",
            ],
        )?;
        ensure!(ctx["status"]["readyServers"] == 1, "{}", ctx["status"]);
        let ready = ready_condition(&ctx);
        ensure!(
            ready["status"] == "False"
                && ready["reason"] == "ServersNotReady"
                && ready["observedGeneration"] == ctx["metadata"]["generation"]
                && ready["message"]
                    == "2 of 3 server(s) not Ready: ctx-team/slack Missing, ctx-shared/jira NotAllowed",
            "Ready: {ready}"
        );
        let message_of = |i: usize| ctx["status"]["servers"][i]["message"].clone();
        ensure!(
            message_of(0).is_null()
                && message_of(1) == "MCPServer ctx-team/slack not found"
                && message_of(2)
                    .as_str()
                    .is_some_and(|m| m.contains("does not admit Contexts of namespace ctx-team")),
            "messages: {}",
            ctx["status"]["servers"]
        );
        let row = table_row(c, ns, "dev")?;
        ensure!(row == ("False".into(), "1".into()), "table row: {row:?}");
        wait_event(
            c,
            ns,
            "dev",
            "Warning",
            "ServerUnavailable",
            "ctx-team/slack not found",
        )?;
        wait_event(
            c,
            ns,
            "dev",
            "Warning",
            "ServerUnavailable",
            "ctx-shared/jira does not admit",
        )?;
        let shown = ok(
            &c.kubectl(&["events", "-n", ns, "--for", "context.mcp-runtime.dev/dev"]),
            "kubectl events",
        )?;
        ensure!(
            shown.contains("ServerUnavailable"),
            "kubectl events:\n{shown}"
        );

        // The missing server appears and gets Ready: only the consent is missing now.
        apply(c, &in_ns(server("slack"), ns))?;
        wait_servers(
            c,
            ns,
            "dev",
            &[
                "ctx-team/github Ready",
                "ctx-team/slack Ready",
                "ctx-shared/jira NotAllowed",
            ],
        )?;
        // Consent by selector: the namespace does not carry the label yet, so still refused.
        let mut consenting = in_ns(server("jira"), shared);
        consenting["spec"]["allowedContexts"] = json!({"namespaces": {
            "from": "Selector",
            "selector": {"matchLabels": {"example.org/consent": "jira"}},
        }});
        apply(c, &consenting)?;
        until(
            Duration::from_secs(30),
            "jira Ready for its new generation",
            || {
                let s = get_json(c, &["get", "mcpserver", "jira", "-n", shared])?;
                Ok(s.filter(|s| {
                    s["metadata"]["generation"] == 2
                        && s["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c["type"] == "Ready"
                                    && c["status"] == "True"
                                    && c["observedGeneration"] == 2
                            })
                        })
                }))
            },
        )?;
        // Its change has woken the Context by now; the label below is then the only news.
        std::thread::sleep(Duration::from_secs(2));
        let ctx = wait_servers(
            c,
            ns,
            "dev",
            &[
                "ctx-team/github Ready",
                "ctx-team/slack Ready",
                "ctx-shared/jira NotAllowed",
            ],
        )?;
        ensure!(
            ready_condition(&ctx)["status"] == "False",
            "{}",
            ctx["status"]
        );
        let since = ready_condition(&ctx)["lastTransitionTime"].clone();
        // Labelling the Context's namespace is what consents.
        ok(
            &c.kubectl(&["label", "namespace", ns, "example.org/consent=jira"]),
            "label namespace",
        )?;
        let ctx = wait_servers(
            c,
            ns,
            "dev",
            &[
                "ctx-team/github Ready",
                "ctx-team/slack Ready",
                "ctx-shared/jira Ready",
            ],
        )?;
        let ready = ready_condition(&ctx);
        ensure!(
            ready["status"] == "True"
                && ready["reason"] == "AllServersReady"
                && ctx["status"]["readyServers"] == 3,
            "{}",
            ctx["status"]
        );
        ensure!(
            ready["lastTransitionTime"] != since || since.is_null(),
            "the transition time did not move: {ready}"
        );
        let row = table_row(c, ns, "dev")?;
        ensure!(row == ("True".into(), "3".into()), "table row: {row:?}");
        wait_event(c, ns, "dev", "Normal", "Ready", "all 3 server(s) are Ready")?;

        // A touch reconciles and writes nothing (no status, no Event).
        touch_writes_nothing(
            c,
            &controllers,
            "context",
            "contexts.mcp-runtime.dev",
            ns,
            "dev",
        )?;
        let readies = occurrences(c, ns, "dev", "Ready", "")?;
        ensure!(readies == 1, "{readies} Ready Events");

        // A server deleted: not Ready any more (Disabled while it retires, then Missing), and
        // a Warning again (a repeated Event may be a series on the first one: occurrences).
        let warned = occurrences(c, ns, "dev", "ServerUnavailable", "ctx-team/slack")?;
        ok(
            &c.kubectl(&["delete", "mcpserver", "slack", "-n", ns, "--wait=false"]),
            "delete mcpserver",
        )?;
        let ctx = until(
            Duration::from_secs(45),
            "Ready=False after the delete",
            || {
                let ctx = get_json(c, &["get", "contexts.mcp-runtime.dev", "dev", "-n", ns])?;
                Ok(ctx.filter(|ctx| ready_condition(ctx)["status"] == "False"))
            },
        )?;
        let state = ctx["status"]["servers"][1]["state"].clone();
        ensure!(
            state == "Disabled" || state == "Missing",
            "slack: {}",
            ctx["status"]["servers"]
        );
        ensure!(ctx["status"]["readyServers"] == 2, "{}", ctx["status"]);
        until(
            Duration::from_secs(15),
            "a new ServerUnavailable for slack",
            || {
                Ok(
                    (occurrences(c, ns, "dev", "ServerUnavailable", "ctx-team/slack")? > warned)
                        .then_some(()),
                )
            },
        )?;
        Ok(())
    })();
    with_log(result, &controllers)
}
