//! The Host operator against the local cluster: `mcp-access-controllers` (its own service
//! account and the RBAC of deploy/controllers) turns a Host into its runtime objects, holds the
//! workload back until its Secret exists, fences its egress to exactly its Context's servers,
//! leaves the garbage collector to remove the runtime of a deleted Host, and sweeps orphans only
//! within its caps. The local cluster has no kubelet: what is checked is what kube-apiserver
//! holds and what kube-controller-manager does with it (Deployment status, garbage collection).

use std::time::Duration;

use e2e::LocalCluster;
use serde_json::{json, Value};

use super::controllers::{
    apply, events, get_json, in_ns, start, touch_writes_nothing, until, wait_condition,
};
use super::{create_namespace, ok};

const MANAGED_BY: &str = "mcp-runtime.dev/managed-by";
const HOST_LABEL: &str = "mcp-runtime.dev/host";

/// Every kind of child, as `kubectl get` names it, with the child's name for Host `agent`.
const CHILDREN: [(&str, &str); 7] = [
    ("serviceaccount", "agent-host"),
    ("role.rbac.authorization.k8s.io", "agent-host"),
    ("rolebinding.rbac.authorization.k8s.io", "agent-host"),
    ("persistentvolumeclaim", "agent-workspace"),
    ("networkpolicy", "agent-host-egress"),
    ("service", "agent"),
    ("deployment", "agent"),
];

/// `result`, with the last lines of the controllers' log when it is an error.
fn with_log<T>(result: Result<T, String>, controllers: &e2e::Controllers) -> Result<T, String> {
    result.map_err(|e| {
        let text = std::fs::read_to_string(&controllers.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n    ");
        format!("{e}\n    --- {} ---\n    {tail}", controllers.log.display())
    })
}

fn host(name: &str, context: &str, secret: Option<&str>) -> Value {
    let mut h = json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "Host",
        // The label its Context's hostSelector selects (`context` below).
        "metadata": {"name": name, "labels": {"agents": context}},
        "spec": {
            "contextRef": {"name": context},
            "image": "ghcr.io/acme/agent:1",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    });
    if let Some(s) = secret {
        h["spec"]["secretRef"] = json!({"name": s});
    }
    h
}

fn context(name: &str, servers: Value) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "Context",
        "metadata": {"name": name},
        "spec": {"mcpServers": servers, "hostSelector": {"matchLabels": {"agents": name}}},
    })
}

fn server(name: &str, port: i64) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name},
        "spec": {"image": "ghcr.io/acme/mcp:1", "port": port},
    })
}

fn get_host(c: &LocalCluster, ns: &str, name: &str) -> Result<Option<Value>, String> {
    get_json(c, &["get", "hosts.mcp-runtime.dev", name, "-n", ns])
}

fn wait_host_condition(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
) -> Result<Value, String> {
    until(
        Duration::from_secs(30),
        &format!("Host {ns}/{name} {type_}={status}"),
        || {
            let h = get_host(c, ns, name)?;
            Ok(h.and_then(|h| {
                let generation = h["metadata"]["generation"].clone();
                h["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| {
                        c["type"] == type_
                            && c["status"] == status
                            && c["observedGeneration"] == generation
                    })
                    .cloned()
            }))
        },
    )
}

fn wait_object(c: &LocalCluster, ns: &str, kind: &str, name: &str) -> Result<Value, String> {
    until(
        Duration::from_secs(30),
        &format!("{kind} {ns}/{name}"),
        || get_json(c, &["get", kind, name, "-n", ns]),
    )
}

/// The egress rules of the Host's policy, once `pred` holds for them.
fn wait_egress(
    c: &LocalCluster,
    ns: &str,
    what: &str,
    pred: impl Fn(&[Value]) -> bool,
) -> Result<Vec<Value>, String> {
    until(Duration::from_secs(30), what, || {
        let p = get_json(c, &["get", "networkpolicy", "agent-host-egress", "-n", ns])?;
        Ok(p.and_then(|p| {
            let rules = p["spec"]["egress"].as_array()?.clone();
            pred(&rules).then_some(rules)
        }))
    })
}

/// The server each egress rule opens, as `namespace/name:port`; DNS and the Host API by name.
fn routes(rules: &[Value]) -> Vec<String> {
    rules
        .iter()
        .map(|r| {
            let peer = &r["to"][0];
            let ns = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                .as_str()
                .unwrap_or("?");
            let pods = &peer["podSelector"]["matchLabels"];
            let ports: Vec<String> = r["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["protocol"].as_str().unwrap_or("?"), p["port"]))
                .collect();
            if let Some(server) = pods["mcp-runtime.dev/mcpserver"].as_str() {
                format!("server {ns}/{server} {}", ports.join(","))
            } else if pods["k8s-app"] == "kube-dns" {
                format!("dns {ns} {}", ports.join(","))
            } else if pods["app"] == "mcp-access-controllers" {
                format!("host-api {ns} {}", ports.join(","))
            } else {
                format!("other {r}")
            }
        })
        .collect()
}

/// Waits up to 30 s until Host `agent`'s Deployment is gone.
fn wait_no_deployment(c: &LocalCluster, ns: &str, what: &str) -> Result<(), String> {
    until(Duration::from_secs(30), what, || {
        Ok(get_json(c, &["get", "deployment", "agent", "-n", ns])?
            .is_none()
            .then_some(()))
    })
}

/// Waits up to 15 s for an Event of `type_` and `reason` regarding Host `name`.
fn wait_event(
    c: &LocalCluster,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> Result<(), String> {
    until(
        Duration::from_secs(15),
        &format!("the {reason} {type_} Event of Host {ns}/{name}"),
        || {
            let events = events_of(c, ns, name)?;
            Ok(events
                .contains(&(type_.to_string(), reason.to_string()))
                .then_some(()))
        },
    )
}

fn events_of(c: &LocalCluster, ns: &str, name: &str) -> Result<Vec<(String, String)>, String> {
    let out = ok(
        &c.kubectl(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]),
        "kubectl get events",
    )?;
    let list: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["kind"] == "Host" && e["regarding"]["name"] == name)
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// A Host whose Secret is missing gets its identity, claim, policy and Service but no
/// Deployment, `SecretResolved=False` and a `SecretMissing` Warning; creating the Secret
/// deploys it. Every child is labelled and owned by the Host; the Role names only the Host and
/// its Secret.
pub fn missing_secret_blocks_until_it_appears(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-secret";
    create_namespace(c, ns)?;
    let controllers = start(c, "hosts-secret", "hosts-secret", &[])?;
    let result = (|| {
        apply(c, &in_ns(context("dev", json!([])), ns))?;
        apply(c, &in_ns(host("agent", "dev", Some("agent-env")), ns))?;
        let cond = wait_host_condition(c, ns, "agent", "SecretResolved", "False")?;
        ensure!(cond["reason"] == "SecretNotFound", "reason: {cond}");
        wait_host_condition(c, ns, "agent", "Ready", "False")?;
        wait_host_condition(c, ns, "agent", "ContextResolved", "True")?;
        for (kind, name) in &CHILDREN[..6] {
            wait_object(c, ns, kind, name)?;
        }
        ensure!(
            get_json(c, &["get", "deployment", "agent", "-n", ns])?.is_none(),
            "a Deployment exists without the Secret"
        );
        wait_event(c, ns, "agent", "Warning", "SecretMissing")?;

        apply(
            c,
            &in_ns(
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "agent-env"},
                       "stringData": {"TOKEN": "t0ken"}}),
                ns,
            ),
        )?;
        let deployment = wait_object(c, ns, "deployment", "agent")?;
        wait_host_condition(c, ns, "agent", "SecretResolved", "True")?;
        wait_host_condition(c, ns, "agent", "Ready", "True")?;
        wait_event(c, ns, "agent", "Normal", "Deployed")?;

        let pod = &deployment["spec"]["template"];
        ensure!(
            pod["metadata"]["labels"][HOST_LABEL] == "agent",
            "pod labels: {}",
            pod["metadata"]["labels"]
        );
        ensure!(
            pod["metadata"]["labels"]["agents"] == "dev",
            "the Context's host selector is on the pods: {}",
            pod["metadata"]["labels"]
        );
        let spec = &pod["spec"];
        ensure!(spec["serviceAccountName"] == "agent-host", "{spec}");
        let container = &spec["containers"][0];
        ensure!(
            container["name"] == "host" && container["image"] == "ghcr.io/acme/agent:1",
            "{container}"
        );
        ensure!(
            container["resources"]["requests"]["cpu"] == "100m",
            "resources: {}",
            container["resources"]
        );
        let sc = &container["securityContext"];
        ensure!(
            sc["runAsNonRoot"] == true
                && sc["allowPrivilegeEscalation"] == false
                && sc["readOnlyRootFilesystem"] == true,
            "securityContext: {sc}"
        );
        let env: Vec<(String, String)> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["name"].as_str().unwrap_or_default().into(),
                    e["value"].as_str().unwrap_or_default().into(),
                )
            })
            .collect();
        ensure!(
            env.contains(&("MCP_HOST_NAME".into(), "agent".into()))
                && env.contains(&("MCP_HOST_NAMESPACE".into(), ns.into())),
            "env: {env:?}"
        );
        let mounts = container["volumeMounts"].to_string();
        let volumes = spec["volumes"].to_string();
        ensure!(
            mounts.contains("\"/workspace\"")
                && volumes.contains("\"claimName\":\"agent-workspace\""),
            "workspace: {mounts} {volumes}"
        );
        ensure!(
            volumes.contains("\"secretName\":\"agent-env\"")
                && container["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["name"] == "secret" && m["readOnly"] == true),
            "secret mounted read-only: {mounts} {volumes}"
        );

        let uid = get_host(c, ns, "agent")?.ok_or("no Host")?["metadata"]["uid"].clone();
        for (kind, name) in CHILDREN {
            let obj = wait_object(c, ns, kind, name)?;
            let meta = &obj["metadata"];
            ensure!(
                meta["labels"][MANAGED_BY] == "mcp-access-controllers"
                    && meta["labels"][HOST_LABEL] == "agent",
                "{kind} {name} labels: {}",
                meta["labels"]
            );
            ensure!(
                meta["labels"].get("mcp-runtime.dev/policy-type").is_none(),
                "{kind} {name} carries the NetworkPolicy controller's type label"
            );
            let owners = meta["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            ensure!(
                owners.len() == 1
                    && owners[0]["kind"] == "Host"
                    && owners[0]["name"] == "agent"
                    && owners[0]["uid"] == uid
                    && owners[0]["controller"] == true
                    && owners[0]["blockOwnerDeletion"] == true,
                "{kind} {name} owners: {owners:?}"
            );
        }
        let claim = wait_object(c, ns, "persistentvolumeclaim", "agent-workspace")?;
        ensure!(
            claim["spec"]["accessModes"] == json!(["ReadWriteOnce"])
                && claim["spec"]["resources"]["requests"]["storage"] == "1Gi",
            "claim: {}",
            claim["spec"]
        );
        let role = wait_object(c, ns, "role.rbac.authorization.k8s.io", "agent-host")?;
        ensure!(
            role["rules"]
                == json!([
                    {"apiGroups": ["mcp-runtime.dev"], "resources": ["hosts"], "resourceNames": ["agent"], "verbs": ["get", "watch"]},
                    {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["agent-env"], "verbs": ["get"]}
                ]),
            "role rules: {}",
            role["rules"]
        );
        // A reconcile with nothing changed writes nothing (each child's digest is current,
        // server-side defaults included).
        touch_writes_nothing(
            c,
            &controllers,
            "host",
            "hosts.mcp-runtime.dev",
            ns,
            "agent",
        )?;

        // What the Role means to kube-apiserver: the host's identity reads its own Host and
        // Secret, nothing else.
        let sa = format!("system:serviceaccount:{ns}:agent-host");
        for (verb, what, want) in [
            ("get", "hosts.mcp-runtime.dev/agent", "yes"),
            ("get", "hosts.mcp-runtime.dev/other", "no"),
            ("list", "hosts.mcp-runtime.dev", "no"),
            ("get", "secrets/agent-env", "yes"),
            ("get", "secrets/other-env", "no"),
            ("list", "secrets", "no"),
            ("get", "contexts.mcp-runtime.dev/dev", "no"),
        ] {
            let out = c.kubectl(&["auth", "can-i", verb, what, "-n", ns, "--as", &sa]);
            let got = out.stdout.trim();
            ensure!(got == want, "can-i {verb} {what}: {got} (want {want})");
        }

        // The Secret deleted: the workload goes, the rest stays.
        ok(
            &c.kubectl(&["delete", "secret", "agent-env", "-n", ns]),
            "delete secret",
        )?;
        wait_host_condition(c, ns, "agent", "SecretResolved", "False")?;
        wait_no_deployment(c, ns, "the Deployment removed")?;
        for (kind, name) in &CHILDREN[..6] {
            ensure!(
                get_json(c, &["get", kind, name, "-n", ns])?.is_some(),
                "{kind} {name} went with the Secret"
            );
        }
        Ok(())
    })();
    with_log(result, &controllers)
}

/// The image allow-list MCPServers have holds for Hosts too: a Host whose image is outside it
/// (here a look-alike of the allowed prefix) gets `ImageAllowed=False`, `Ready=False`, an
/// `ImageNotAllowed` Warning and no Deployment; an allowed image deploys, and moving back out
/// of the list removes the Deployment.
pub fn image_allow_list_holds_back_a_disallowed_image(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-image";
    create_namespace(c, ns)?;
    let controllers = start(
        c,
        "hosts-image",
        "hosts-image",
        &["--image-allow-prefix=ghcr.io/acme"],
    )?;
    let with_image = |image: &str| {
        let mut h = in_ns(host("agent", "dev", None), ns);
        h["spec"]["image"] = json!(image);
        h
    };
    let result = (|| {
        apply(c, &in_ns(context("dev", json!([])), ns))?;
        apply(c, &with_image("ghcr.io/acme-evil/agent:1"))?;
        let cond = wait_host_condition(c, ns, "agent", "ImageAllowed", "False")?;
        ensure!(
            cond["reason"] == "ImageNotAllowed"
                && cond["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("ghcr.io/acme-evil/agent:1")),
            "{cond}"
        );
        let ready = wait_host_condition(c, ns, "agent", "Ready", "False")?;
        ensure!(ready["reason"] == "ImageNotAllowed", "{ready}");
        wait_event(c, ns, "agent", "Warning", "ImageNotAllowed")?;
        for (kind, name) in &CHILDREN[..6] {
            wait_object(c, ns, kind, name)?;
        }
        ensure!(
            get_json(c, &["get", "deployment", "agent", "-n", ns])?.is_none(),
            "a Deployment exists with a disallowed image"
        );

        apply(c, &with_image("ghcr.io/acme/agent:2"))?;
        let deployment = wait_object(c, ns, "deployment", "agent")?;
        let image = &deployment["spec"]["template"]["spec"]["containers"][0]["image"];
        ensure!(image == "ghcr.io/acme/agent:2", "image: {image}");
        let cond = wait_host_condition(c, ns, "agent", "ImageAllowed", "True")?;
        ensure!(cond["reason"] == "ImageAllowed", "{cond}");
        wait_host_condition(c, ns, "agent", "Ready", "True")?;

        apply(c, &with_image("docker.io/library/busybox:1"))?;
        wait_host_condition(c, ns, "agent", "ImageAllowed", "False")?;
        wait_no_deployment(c, ns, "the Deployment removed with the image refused")
    })();
    with_log(result, &controllers)
}

/// A child's name already held by a team's own object (a Service, a Role): the operators
/// leave it alone, with no owner reference that would hand it to the garbage collector, bind
/// nothing to it, and do not deploy. The Host says `Ready=False NameConflict` naming the objects, with a Warning;
/// once they are gone it deploys on its own. An MCPServer named after a team's Service is held
/// back the same way, and a Host named after an MCPServer leaves the server's objects alone.
pub fn a_name_held_by_another_object_is_left_alone(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-names";
    create_namespace(c, ns)?;
    let controllers = start(c, "hosts-names", "hosts-names", &[])?;
    let theirs = |kind: &str, name: &str| get_json(c, &["get", kind, name, "-n", ns]);
    let result = (|| {
        // Names a Service cannot have, and a size that is no quantity, are refused at the door
        // with the CRDs' messages, so no controller fails on them later.
        for (manifest, says) in [
            (
                in_ns(host("2025-agent", "dev", None), ns),
                "a Host's name must start with a letter",
            ),
            (
                in_ns(server("9lives", 8080), ns),
                "an MCPServer's name must start with a letter",
            ),
        ] {
            let out = c.kubectl_as(
                &c.kubeconfig,
                &["apply", "-f", "-"],
                Some(&manifest.to_string()),
            );
            ensure!(
                !out.success && out.stderr.contains(says) && out.stderr.contains("Invalid"),
                "{says}: {}",
                out.stderr
            );
        }
        let mut big = in_ns(host("sized", "dev", None), ns);
        big["spec"]["workspaceSize"] = json!("ten gigs");
        let out = c.kubectl_as(&c.kubeconfig, &["apply", "-f", "-"], Some(&big.to_string()));
        ensure!(
            !out.success && out.stderr.contains("spec.workspaceSize"),
            "a workspaceSize that is no quantity: {}",
            out.stderr
        );
        let service = |name: &str| {
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                   "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
        };
        apply(c, &service("agent"))?;
        apply(c, &service("web"))?;
        apply(
            c,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": "agent-host", "namespace": ns},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        )?;
        apply(c, &in_ns(context("dev", json!([])), ns))?;
        apply(c, &in_ns(host("agent", "dev", None), ns))?;
        let ready = wait_host_condition(c, ns, "agent", "Ready", "False")?;
        let message = ready["message"].as_str().unwrap_or_default();
        ensure!(
            ready["reason"] == "NameConflict"
                && message.contains("Role agent-host")
                && message.contains("Service agent"),
            "{ready}"
        );
        wait_event(c, ns, "agent", "Warning", "NameConflict")?;
        apply(c, &in_ns(server("web", 8080), ns))?;
        let ready = wait_condition(c, ns, "web", "Ready", "False")?;
        ensure!(
            ready["reason"] == "NameConflict"
                && ready["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Service web")),
            "MCPServer web: {ready}"
        );
        until(
            Duration::from_secs(15),
            "the MCPServer's NameConflict Warning",
            || Ok(events(c, ns, "web")?.contains("NameConflict").then_some(())),
        )?;
        // The Host's other children exist; the teams' objects are as they were.
        wait_object(c, ns, "serviceaccount", "agent-host")?;
        for (kind, name) in [
            ("service", "agent"),
            ("service", "web"),
            ("role.rbac.authorization.k8s.io", "agent-host"),
        ] {
            let obj = theirs(kind, name)?.ok_or(format!("{kind} {name} is gone"))?;
            let meta = &obj["metadata"];
            ensure!(
                meta.get("ownerReferences").is_none() && meta["labels"].get(MANAGED_BY).is_none(),
                "{kind} {name} was taken over: {meta}"
            );
            let managers = e2e::managed_field_managers(&obj);
            ensure!(
                managers
                    .iter()
                    .all(|(m, _)| !m.starts_with("mcp-access-controllers")),
                "{kind} {name} has our field manager: {managers:?}"
            );
        }
        let service = theirs("service", "agent")?.ok_or("no Service")?;
        ensure!(
            service["spec"]["selector"] == json!({"app": "web"}),
            "{}",
            service["spec"]
        );
        let role = theirs("role.rbac.authorization.k8s.io", "agent-host")?.ok_or("no Role")?;
        ensure!(
            role["rules"][0]["resources"] == json!(["configmaps"]),
            "{role}"
        );
        for name in ["agent", "web"] {
            ensure!(
                get_json(c, &["get", "deployment", name, "-n", ns])?.is_none(),
                "Deployment {name} exists beside a name conflict"
            );
        }
        // No binding hands the team's Role to the Host's ServiceAccount.
        ensure!(
            get_json(c, &["get", "rolebinding", "agent-host", "-n", ns])?.is_none(),
            "a RoleBinding agent-host binds a Role that is not the Host's"
        );

        // The teams' objects removed: the Host and the MCPServer deploy on their own (their
        // retry, within 10 s).
        ok(
            &c.kubectl(&["delete", "service", "agent", "web", "-n", ns]),
            "delete services",
        )?;
        ok(
            &c.kubectl(&["delete", "role", "agent-host", "-n", ns]),
            "delete role",
        )?;
        wait_object(c, ns, "deployment", "agent")?;
        wait_object(c, ns, "rolebinding", "agent-host")?;
        wait_host_condition(c, ns, "agent", "Ready", "True")?;
        wait_object(c, ns, "deployment", "web")?;

        // A Host named after that MCPServer: its Service and Deployment names are the
        // server's, which stay the server's alone.
        apply(c, &in_ns(host("web", "dev", None), ns))?;
        let ready = until(Duration::from_secs(30), "Host web NameConflict", || {
            let ready = wait_host_condition(c, ns, "web", "Ready", "False")?;
            Ok((ready["reason"] == "NameConflict").then_some(ready))
        })?;
        // The Deployment is not even tried once a conflict holds the host back.
        ensure!(
            ready["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Service web: ")),
            "{ready}"
        );
        for kind in ["service", "deployment"] {
            let obj = wait_object(c, ns, kind, "web")?;
            let owners = &obj["metadata"]["ownerReferences"];
            ensure!(
                owners.as_array().map(Vec::len) == Some(1) && owners[0]["kind"] == "MCPServer",
                "{kind} web owners: {owners}"
            );
        }
        Ok(())
    })();
    with_log(result, &controllers)
}

/// The host-side egress policy opens the Context's existing servers on their ports, the
/// cluster DNS and the Host API, nothing else; it follows a Context edit; a missing Context
/// opens no server and says so. The NetworkPolicy controller (running in the same process)
/// leaves the policy alone.
pub fn egress_follows_the_context(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-egress";
    let tools = "host-egress-tools";
    create_namespace(c, ns)?;
    create_namespace(c, tools)?;
    let controllers = start(c, "hosts-egress", "hosts-egress", &[])?;
    let result = (|| {
        apply(c, &in_ns(server("github", 8080), tools))?;
        apply(c, &in_ns(server("jira", 9000), ns))?;
        apply(c, &in_ns(server("slack", 7000), ns))?;
        apply(c, &in_ns(host("agent", "dev", None), ns))?;
        let cond = wait_host_condition(c, ns, "agent", "ContextResolved", "False")?;
        ensure!(cond["reason"] == "ContextNotFound", "{cond}");
        wait_host_condition(c, ns, "agent", "Ready", "False")?;
        let dns_and_api = vec![
            "dns kube-system UDP/53,TCP/53".to_string(),
            "host-api mcp-access TCP/8443".to_string(),
        ];
        let rules = wait_egress(c, ns, "the policy without a Context", |r| r.len() == 2)?;
        ensure!(routes(&rules) == dns_and_api, "{:?}", routes(&rules));

        apply(
            c,
            &in_ns(
                context(
                    "dev",
                    json!([{"name": "github", "namespace": tools}, {"name": "ghost"}]),
                ),
                ns,
            ),
        )?;
        // github lives in another namespace and has not consented: nothing opens.
        let cond = wait_host_condition(c, ns, "agent", "ContextResolved", "True")?;
        ensure!(
            cond["message"]
                .as_str()
                .is_some_and(|m| m.contains("grants 0 existing server(s)")),
            "a server of another namespace was granted without its consent: {cond}"
        );
        let rules = wait_egress(c, ns, "no route without consent", |r| r.len() == 2)?;
        ensure!(routes(&rules) == dns_and_api, "{:?}", routes(&rules));
        ok(
            &c.kubectl(&[
                "patch",
                "mcpserver",
                "github",
                "-n",
                tools,
                "--type=merge",
                "-p",
                r#"{"spec":{"allowedContexts":{"namespaces":{"from":"All"}}}}"#,
            ]),
            "github consents",
        )?;
        let rules = wait_egress(c, ns, "github opened", |r| r.len() == 3)?;
        // The gateway port (8086), never the server's spec.port (8080).
        let mut want = vec![format!("server {tools}/github TCP/8086")];
        want.extend(dns_and_api.clone());
        ensure!(routes(&rules) == want, "{:?}", routes(&rules));
        wait_host_condition(c, ns, "agent", "ContextResolved", "True")?;

        // The Context now grants jira (and still the missing ghost) instead of github.
        apply(
            c,
            &in_ns(
                context("dev", json!([{"name": "jira"}, {"name": "ghost"}])),
                ns,
            ),
        )?;
        let rules = wait_egress(c, ns, "jira instead of github", |r| {
            routes(r).iter().any(|s| s.contains("jira"))
        })?;
        let mut want = vec![format!("server {ns}/jira TCP/8086")];
        want.extend(dns_and_api.clone());
        ensure!(routes(&rules) == want, "{:?}", routes(&rules));

        // A granted server created later opens its route.
        apply(c, &in_ns(server("ghost", 6000), ns))?;
        let rules = wait_egress(c, ns, "ghost appears", |r| r.len() == 4)?;
        let mut want = vec![
            format!("server {ns}/ghost TCP/8086"),
            format!("server {ns}/jira TCP/8086"),
        ];
        want.extend(dns_and_api.clone());
        ensure!(routes(&rules) == want, "{:?}", routes(&rules));
        let policy = wait_object(c, ns, "networkpolicy", "agent-host-egress")?;
        ensure!(
            policy["spec"]["policyTypes"] == json!(["Egress"])
                && policy["spec"]["podSelector"]["matchLabels"][HOST_LABEL] == "agent",
            "{}",
            policy["spec"]
        );
        // Deleting the Context closes every server route again.
        ok(
            &c.kubectl(&["delete", "contexts.mcp-runtime.dev", "dev", "-n", ns]),
            "delete context",
        )?;
        let rules = wait_egress(c, ns, "routes closed", |r| r.len() == 2)?;
        ensure!(routes(&rules) == dns_and_api, "{:?}", routes(&rules));
        Ok(())
    })();
    for n in [ns, tools] {
        let _ = c.kubectl(&["delete", "mcpservers", "--all", "-n", n, "--timeout=60s"]);
    }
    with_log(result, &controllers)
}

/// The workspace grows with `spec.workspaceSize` and never shrinks. A claim can be resized only
/// once bound and only when its StorageClass allows expansion, so the scenario makes both here:
/// a default StorageClass that allows it (removed at the end) and a PersistentVolume for the
/// claim to bind (kube-controller-manager binds it; nothing is provisioned).
pub fn workspace_grows_and_never_shrinks(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-grow";
    create_namespace(c, ns)?;
    let class = "e2e-host-grow";
    let volume = "e2e-host-grow-pv";
    apply(
        c,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": class, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                "provisioner": "kubernetes.io/no-provisioner", "allowVolumeExpansion": true,
                "volumeBindingMode": "Immediate"}),
    )?;
    let result = start(c, "hosts-grow", "hosts-grow", &[]).and_then(|controllers| {
        with_log(
            grow_then_ask_less(c, ns, class, volume, &controllers),
            &controllers,
        )
    });
    // Later scenarios' claims must not get this class.
    let _ = c.kubectl(&["delete", "storageclass", class, "--ignore-not-found"]);
    let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    let _ = c.kubectl(&["delete", "pv", volume, "--wait=false"]);
    result
}

/// The claim of Host `agent` bound at 1Gi, grown to 2Gi, then kept at 2Gi when the Host asks
/// for 1Gi again, with no reconcile error; a growth the class no longer allows is refused and
/// said in the Host's status.
fn grow_then_ask_less(
    c: &LocalCluster,
    ns: &str,
    class: &str,
    volume: &str,
    controllers: &e2e::Controllers,
) -> Result<(), String> {
    let claim_size = |what: &str, want: &str| {
        until(Duration::from_secs(30), what, || {
            let claim = get_json(c, &["get", "pvc", "agent-workspace", "-n", ns])?;
            Ok(claim.filter(|claim| {
                claim["spec"]["resources"]["requests"]["storage"] == want
                    && claim["status"]["phase"] == "Bound"
            }))
        })
    };
    apply(
        c,
        &json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {"capacity": {"storage": "8Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": class, "hostPath": {"path": "/tmp/e2e-host-grow"},
                         "claimRef": {"namespace": ns, "name": "agent-workspace"}}}),
    )?;
    apply(c, &in_ns(context("dev", json!([])), ns))?;
    let mut h = in_ns(host("agent", "dev", None), ns);
    h["spec"]["workspaceSize"] = json!("1Gi");
    apply(c, &h)?;
    let claim = claim_size("the 1Gi claim, bound", "1Gi")?;
    ensure!(
        claim["spec"]["storageClassName"] == class,
        "the claim's class: {}",
        claim["spec"]
    );
    h["spec"]["workspaceSize"] = json!("2Gi");
    apply(c, &h)?;
    claim_size("the claim grown to 2Gi", "2Gi")?;
    // Asked to shrink: the claim keeps 2Gi (Kubernetes refuses a smaller request), and the Host
    // stays Ready rather than failing every reconcile.
    h["spec"]["workspaceSize"] = json!("1Gi");
    apply(c, &h)?;
    wait_host_condition(c, ns, "agent", "Ready", "True")?;
    let claim =
        get_json(c, &["get", "pvc", "agent-workspace", "-n", ns])?.ok_or("the claim is gone")?;
    ensure!(
        claim["spec"]["resources"]["requests"]["storage"] == "2Gi",
        "the claim shrank: {}",
        claim["spec"]
    );
    let errors = controllers
        .metric(
            "mcp_controllers_reconcile_errors_total",
            &["controller=\"host\""],
        )
        .map_err(|e| e.to_string())?;
    ensure!(errors == 0.0, "{errors} host reconcile errors");

    // The class stops allowing expansion and the Host asks for more: kube-apiserver refuses
    // the claim, and the Host says so (Ready=False ApplyRefused naming the claim, a Warning)
    // while its other objects stay applied. Asking for what the claim has clears it.
    ok(
        &c.kubectl(&[
            "patch",
            "storageclass",
            class,
            "--type=merge",
            "-p",
            r#"{"allowVolumeExpansion":false}"#,
        ]),
        "patch storageclass",
    )?;
    h["spec"]["workspaceSize"] = json!("3Gi");
    apply(c, &h)?;
    let ready = until(Duration::from_secs(30), "Ready=False ApplyRefused", || {
        let ready = wait_host_condition(c, ns, "agent", "Ready", "False")?;
        Ok((ready["reason"] == "ApplyRefused").then_some(ready))
    })?;
    ensure!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("PersistentVolumeClaim agent-workspace: ")),
        "{ready}"
    );
    wait_event(c, ns, "agent", "Warning", "ApplyRefused")?;
    let refused = controllers
        .metric(
            "mcp_controllers_reconcile_errors_total",
            &["controller=\"host\"", "reason=\"refused\""],
        )
        .map_err(|e| e.to_string())?;
    ensure!(refused.ge(&1.0), "refusals counted: {refused}");
    h["spec"]["workspaceSize"] = json!("2Gi");
    apply(c, &h)?;
    wait_host_condition(c, ns, "agent", "Ready", "True")?;
    Ok(())
}

/// Deleting a Host removes its runtime: kube-controller-manager's garbage collector follows
/// the owner references.
pub fn deleting_a_host_removes_its_runtime(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-gc";
    create_namespace(c, ns)?;
    let controllers = start(c, "hosts-gc", "hosts-gc", &[])?;
    let result = (|| {
        apply(c, &in_ns(host("agent", "dev", None), ns))?;
        for (kind, name) in CHILDREN {
            wait_object(c, ns, kind, name)?;
        }
        ok(
            &c.kubectl(&["delete", "hosts.mcp-runtime.dev", "agent", "-n", ns]),
            "delete host",
        )?;
        until(
            Duration::from_secs(90),
            "the runtime of the deleted Host gone",
            || {
                let mut left = Vec::new();
                for (kind, name) in CHILDREN {
                    if get_json(c, &["get", kind, name, "-n", ns])?.is_some() {
                        left.push(kind);
                    }
                }
                let pods = get_json(
                    c,
                    &[
                        "get",
                        "pods",
                        "-n",
                        ns,
                        "-l",
                        &format!("{HOST_LABEL}=agent"),
                    ],
                )?
                .map(|l| l["items"].as_array().map(Vec::len).unwrap_or(0))
                .unwrap_or(0);
                Ok((left.is_empty() && pods == 0).then_some(()))
            },
        )?;
        Ok(())
    })();
    with_log(result, &controllers)
}

/// Orphans (labelled for a Host that does not exist) are swept at start: over the cap the
/// grants (the egress NetworkPolicy, the Role) are deleted all the same, none of the inert
/// rest is, and the metric says how many were held back; within the caps they go too. An
/// object without our managed-by label, and a live Host's runtime, are never touched.
pub fn orphan_sweep_respects_the_caps(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "host-sweep";
    create_namespace(c, ns)?;
    let labels = json!({MANAGED_BY: "mcp-access-controllers", HOST_LABEL: "ghost"});
    let orphans = [
        (
            "serviceaccount",
            "ghost-host",
            json!({"apiVersion": "v1", "kind": "ServiceAccount"}),
        ),
        (
            "service",
            "ghost",
            json!({"apiVersion": "v1", "kind": "Service",
            "spec": {"selector": {HOST_LABEL: "ghost"}, "ports": [{"port": 8080}]}}),
        ),
        (
            "role.rbac.authorization.k8s.io",
            "ghost-host",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": []}),
        ),
        (
            "networkpolicy",
            "ghost-host-egress",
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "spec": {"podSelector": {"matchLabels": {HOST_LABEL: "ghost"}}, "policyTypes": ["Egress"]}}),
        ),
    ];
    for (_, name, body) in &orphans {
        let mut body = body.clone();
        body["metadata"] = json!({"name": name, "namespace": ns, "labels": labels});
        apply(c, &body)?;
    }
    // A lookalike: the host label without managed-by.
    apply(
        c,
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "ghost-lookalike", "namespace": ns, "labels": {HOST_LABEL: "ghost"}}}),
    )?;
    // The session of a Host that no longer exists (deleted while the controllers were down,
    // its finalizer removed by hand): swept whatever the caps, since deleting a session only
    // narrows access. Its lookalike without managed-by stays.
    let session = |name: &str, labels: Value| {
        json!({"apiVersion": "access.mcp-runtime.dev/v1alpha1", "kind": "AccessSession",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"server": {"name": "github", "uid": "7d4c0d2e-0000-4000-8000-00000000abcd"},
                        "subject": {"user": format!("system:serviceaccount:{ns}:ghost-host")},
                        "teams": ["payments"], "expiresAt": "2099-01-01T00:00:00Z"}})
    };
    let ghost_uid = "0b5e55ed-0000-4000-8000-00000000dead";
    apply(
        c,
        &session(
            "ghost-github",
            json!({MANAGED_BY: "mcp-access-controllers", HOST_LABEL: "ghost",
                   "mcp-runtime.dev/host-uid": ghost_uid, "mcp-runtime.dev/host-namespace": ns}),
        ),
    )?;
    apply(
        c,
        &session(
            "ghost-lookalike",
            json!({"mcp-runtime.dev/host-uid": ghost_uid}),
        ),
    )?;
    let present = |c: &LocalCluster| -> Result<usize, String> {
        let mut n = 0;
        for (kind, name, _) in &orphans {
            if get_json(c, &["get", kind, name, "-n", ns])?.is_some() {
                n += 1;
            }
        }
        Ok(n)
    };

    {
        let controllers = start(
            c,
            "hosts-sweep-1",
            "hosts-sweep",
            &["--orphan-delete-max=1"],
        )?;
        let result = (|| {
            let held = until(Duration::from_secs(30), "the sweep over the cap", || {
                let v = controllers
                    .metric("mcp_controllers_host_orphans_over_cap", &[])
                    .map_err(|e| e.to_string())?;
                Ok((v >= 2.0).then_some(v))
            })?;
            // At least the two inert ones (ServiceAccount, Service): the sweep covers every
            // namespace, and an earlier scenario's namespace may still be going (its children
            // briefly without a Host).
            ensure!(held.ge(&2.0), "orphans held back: {held}");
            let sweeps = controllers
                .metric("mcp_controllers_host_sweeps_withheld_total", &[])
                .map_err(|e| e.to_string())?;
            ensure!(sweeps.ge(&1.0), "withheld sweeps: {sweeps}");
            // A live Host's runtime appears meanwhile and is no orphan.
            apply(c, &in_ns(host("agent", "dev", None), ns))?;
            for (kind, name) in CHILDREN {
                wait_object(c, ns, kind, name)?;
            }
            std::thread::sleep(Duration::from_secs(2));
            // Over the cap the grants go all the same (the egress allow, the Role): only the
            // inert objects are held back.
            let left = present(c)?;
            ensure!(
                left == 2,
                "over the cap only the ServiceAccount and the Service stay: {left} of 4 left"
            );
            for (kind, name) in [
                ("networkpolicy", "ghost-host-egress"),
                ("role.rbac.authorization.k8s.io", "ghost-host"),
            ] {
                ensure!(
                    get_json(c, &["get", kind, name, "-n", ns])?.is_none(),
                    "the orphaned grant {kind} {name} was held back"
                );
            }
            until(
                Duration::from_secs(30),
                "the orphaned session swept",
                || {
                    Ok(
                        get_json(c, &["get", "accesssession", "ghost-github", "-n", ns])?
                            .is_none()
                            .then_some(()),
                    )
                },
            )?;
            ensure!(
                get_json(c, &["get", "accesssession", "ghost-lookalike", "-n", ns])?.is_some(),
                "a session without managed-by was swept"
            );
            let deleted = controllers
                .metric("mcp_controllers_host_orphans_deleted_total", &[])
                .map_err(|e| e.to_string())?;
            ensure!(deleted.ge(&2.0), "deleted: {deleted}");
            Ok(())
        })();
        with_log(result, &controllers)?;
    }

    let controllers = start(
        c,
        "hosts-sweep-2",
        "hosts-sweep",
        &["--orphan-delete-max=10", "--orphan-delete-max-percent=100"],
    )?;
    let result = (|| {
        until(Duration::from_secs(30), "the orphans swept", || {
            Ok((present(c)? == 0).then_some(()))
        })?;
        let deleted = controllers
            .metric("mcp_controllers_host_orphans_deleted_total", &[])
            .map_err(|e| e.to_string())?;
        ensure!(deleted.ge(&2.0), "deleted: {deleted}");
        let over = controllers
            .metric("mcp_controllers_host_orphans_over_cap", &[])
            .map_err(|e| e.to_string())?;
        ensure!(over == 0.0, "over cap: {over}");
        ensure!(
            get_json(c, &["get", "serviceaccount", "ghost-lookalike", "-n", ns])?.is_some(),
            "the lookalike without managed-by was deleted"
        );
        for (kind, name) in CHILDREN {
            ensure!(
                get_json(c, &["get", kind, name, "-n", ns])?.is_some(),
                "the live Host's {kind} {name} was deleted"
            );
        }
        Ok(())
    })();
    let _ = c.kubectl(&["delete", "hosts.mcp-runtime.dev", "--all", "-n", ns]);
    with_log(result, &controllers)
}

/// Issue 33 item 2: binding a Context is authorized by kube-apiserver itself (the
/// ValidatingAdmissionPolicy of deploy/crds). A user who may create Hosts but may not `use` a
/// Context is refused (403 naming the verb) and nothing is stored; `use` on one Context by
/// name admits that one only; re-pointing an existing Host is checked again; an update that
/// keeps the Context (a label, the controllers' finalizer) needs nothing more.
pub fn binding_a_context_needs_use(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "hosts-use";
    create_namespace(c, ns)?;
    let user = "dana@example.com";
    // Dana may write Hosts in the namespace (the kubectl `edit`-like part), nothing about
    // Contexts yet.
    let rbac = json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "host-writer", "namespace": ns},
             "rules": [{"apiGroups": ["mcp-runtime.dev"], "resources": ["hosts"],
                        "verbs": ["get", "list", "create", "update", "patch", "delete"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "host-writer", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "host-writer"},
             "subjects": [{"kind": "User", "name": user}]},
        ]
    });
    apply(c, &rbac)?;
    for name in ["dev", "prod"] {
        apply(c, &in_ns(context(name, json!([])), ns))?;
    }
    let as_dana = |args: &[&str], stdin: Option<&str>| {
        let mut full: Vec<&str> = args.to_vec();
        full.extend(["--as", user]);
        c.kubectl_as(&c.kubeconfig, &full, stdin)
    };
    let manifest = |name: &str, context: &str| in_ns(host(name, context, None), ns).to_string();

    let out = as_dana(&["create", "-f", "-"], Some(&manifest("agent", "dev")));
    ensure!(
        !out.success
            && out.stderr.contains("Forbidden")
            && out.stderr.contains("may not use Context dev")
            && out
                .stderr
                .contains("the RBAC verb use on contexts.mcp-runtime.dev"),
        "creating a Host without `use`: {} {}",
        out.stdout,
        out.stderr
    );
    ensure!(
        get_json(c, &["get", "host", "agent", "-n", ns])?.is_none(),
        "a refused Host was stored"
    );

    // `use` on Context dev only (the shipped ClusterRole's verb, narrowed by resourceNames).
    apply(
        c,
        &json!({
            "apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "use-dev", "namespace": ns},
                 "rules": [{"apiGroups": ["mcp-runtime.dev"], "resources": ["contexts"],
                            "resourceNames": ["dev"], "verbs": ["use"]}]},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "use-dev", "namespace": ns},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-dev"},
                 "subjects": [{"kind": "User", "name": user}]},
            ]
        }),
    )?;
    // RBAC is eventually consistent in kube-apiserver's authorizer cache: retry briefly.
    until(Duration::from_secs(20), "create with use on dev", || {
        let out = as_dana(&["create", "-f", "-"], Some(&manifest("agent", "dev")));
        Ok(out.success.then_some(()))
    })?;
    let out = as_dana(&["create", "-f", "-"], Some(&manifest("other", "prod")));
    ensure!(
        !out.success && out.stderr.contains("may not use Context prod"),
        "a Host naming a Context dana may not use: {}",
        out.stderr
    );
    // Re-pointing the Host at prod is checked like a create.
    let out = as_dana(
        &[
            "patch",
            "host",
            "agent",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"contextRef":{"name":"prod"}}}"#,
        ],
        None,
    );
    ensure!(
        !out.success && out.stderr.contains("may not use Context prod"),
        "re-pointing a Host: {}",
        out.stderr
    );
    // An update that keeps the Context needs nothing more.
    let out = as_dana(&["label", "host", "agent", "-n", ns, "team=payments"], None);
    ensure!(out.success, "labelling the Host: {}", out.stderr);
    // The shipped role grants exactly the verb.
    let role = get_json(c, &["get", "clusterrole", "mcp-access-context-user"])?
        .ok_or("ClusterRole mcp-access-context-user is not installed")?;
    ensure!(
        role["rules"]
            == json!([{"apiGroups": ["mcp-runtime.dev"], "resources": ["contexts"], "verbs": ["use"]}]),
        "mcp-access-context-user: {}",
        role["rules"]
    );
    Ok(())
}
