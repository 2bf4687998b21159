//! `mcp-access-gateway` with MCP clients nobody here wrote (issue 28, item 5), through the local
//! cluster: the upstream is an `MCPServer` of the official Python SDK (`e2e/mcp/upstream.py`),
//! the clients are the official SDKs' (`mcp.Client` in `mode="legacy"` and `mode="2026-07-28"`,
//! and the TypeScript SDK's `Client` when `MCP_ACCESS_MCP_NODE_DIR` is set), and the session
//! tokens are minted by the `token` subresource through kube-apiserver
//! (`kubectl create --raw .../accesssessions/NAME/token`).
//!
//! The gateway runs as a local process with the sync-listener token of a real Pod: the
//! controllers (`mcp-access-controllers`, a Lease per scenario) make the MCPServer's Deployment,
//! kube-controller-manager its ReplicaSet and Pod (Pending: there is no kubelet), and
//! `kubectl create token --bound-object-kind Pod` binds the token to that Pod. Its
//! `--public-url` is what the controllers give it, `http://<server>.<ns>.svc:8086`, which is
//! also the audience the apiserver's default template puts in session tokens.
//!
//! What is asserted is what the SDK clients saw: their results, their progress callbacks, the
//! error a cut stream delivered, and for a refusal the HTTP status, `WWW-Authenticate` as the
//! SDKs' own challenge parsers read it, `X-MCP-Deny-Reason` and the JSON body's reason.

use std::time::{Duration, Instant};

use base64::Engine;
use e2e::gateway::GATEWAY_AUDIENCE;
use e2e::mcp::{self, ClientRun, Gateway, Sdk, Upstream};
use e2e::{Controllers, LocalCluster};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::{create_namespace, ok};

/// The issue's bound on revocation → the open stream's end, at the client. Expected ~100 ms
/// (docs/performance.md: revoke-to-deny p99 53 ms, a 500-stream cut p99 103 ms): over 5x.
const CUT_BOUND: Duration = Duration::from_secs(1);
/// How long the controllers and kube-controller-manager get to make a server's Pod.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// The gateway's leeway on `exp` (docs/session-tokens.md).
const LEEWAY: Duration = Duration::from_secs(30);
/// The resource metadata path of RFC 9728.
const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// The controllers, the server's workload, the upstream and the gateway of one scenario.
struct Served {
    ns: String,
    server: String,
    server_uid: String,
    upstream: Upstream,
    gateway: Gateway,
    /// Stopped when the scenario ends.
    _controllers: Controllers,
}

fn e<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |err| format!("{what}: {err:#}")
}

fn mcpserver_manifest(ns: &str, name: &str) -> String {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"image": "registry.invalid/mcp/upstream:1", "port": 8080},
    })
    .to_string()
}

fn jsonpath(c: &LocalCluster, ns: &str, what: &[&str], path: &str) -> Result<String, String> {
    let jp = format!("jsonpath={path}");
    let mut args = vec!["get", "-n", ns];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", &jp]);
    ok(&c.kubectl(&args), &format!("get {what:?} {path}"))
}

/// Creates MCPServer `name` and waits for the Pod of the Deployment the controllers make for it
/// (name = the MCPServer's); returns (server uid, pod name, pod uid).
fn create_server(
    c: &LocalCluster,
    ns: &str,
    name: &str,
) -> Result<(String, String, String), String> {
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["apply", "-f", "-"],
            Some(&mcpserver_manifest(ns, name)),
        ),
        "create the MCPServer",
    )?;
    let server_uid = jsonpath(c, ns, &["mcpserver", name], "{.metadata.uid}")?;
    let deadline = Instant::now() + WORKLOAD_TIMEOUT;
    let deployment_uid = loop {
        let out = c.kubectl(&[
            "get",
            "deployment",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.uid} {.metadata.ownerReferences[0].uid}",
        ]);
        let text = out.stdout.trim().to_string();
        if let Some((uid, owner)) = text.split_once(' ') {
            if owner == server_uid {
                break uid.to_string();
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no Deployment {ns}/{name} owned by MCPServer {server_uid} within {WORKLOAD_TIMEOUT:?}: {text:?} {}",
                out.stderr
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let (_, rs_uid) = c
        .wait_owned(ns, "replicasets", &deployment_uid)
        .map_err(e("the ReplicaSet"))?;
    let (pod, pod_uid) = c.wait_owned(ns, "pods", &rs_uid).map_err(e("the Pod"))?;
    Ok((server_uid, pod, pod_uid))
}

/// The sync-listener token of `server`'s gateway Pod (service account `<server>-gateway`).
fn pod_token(
    c: &LocalCluster,
    ns: &str,
    server: &str,
    pod: &(String, String),
) -> Result<String, String> {
    c.service_account_token(
        ns,
        &format!("{server}-gateway"),
        Some(GATEWAY_AUDIENCE),
        Some((&pod.0, &pod.1)),
    )
    .map_err(e("the gateway's Pod-bound token"))
}

fn start_gateway(
    c: &LocalCluster,
    ns: &str,
    server: &str,
    name: &str,
    pod: &(String, String),
    upstream: &Upstream,
) -> Result<Gateway, String> {
    let token = pod_token(c, ns, server, pod)?;
    mcp::spawn_gateway(
        c,
        name,
        &token,
        &upstream.origin(),
        &mcp::public_url(ns, server),
        &[],
    )
    .map_err(e("mcp-access-gateway"))
}

impl Served {
    fn start(c: &LocalCluster, ns: &str, server: &str) -> Result<Self, String> {
        let bin = super::controllers::controllers_bin()?;
        let lease = format!("--lease-name=e2e-{ns}");
        let controllers = c
            .start_controllers(&bin, ns, &[&lease, "--retire-max-backoff-seconds=2"])
            .map_err(e("mcp-access-controllers"))?;
        create_namespace(c, ns)?;
        let (server_uid, pod, pod_uid) = create_server(c, ns, server)?;
        let upstream = mcp::spawn_upstream(c, ns).map_err(e("the SDK upstream"))?;
        let gateway = start_gateway(c, ns, server, ns, &(pod, pod_uid), &upstream)?;
        Ok(Self {
            ns: ns.into(),
            server: server.into(),
            server_uid,
            upstream,
            gateway,
            _controllers: controllers,
        })
    }

    /// Issues AccessSession `name` for this server (for `server_uid` when given), expiring at
    /// `expires` (RFC 3339).
    fn issue(
        &self,
        c: &LocalCluster,
        name: &str,
        server: Option<(&str, &str)>,
        expires: &str,
    ) -> Result<(), String> {
        self.issue_with_tools(c, name, server, expires, None)
    }

    /// [`Served::issue`] with `spec.tools` when given.
    fn issue_with_tools(
        &self,
        c: &LocalCluster,
        name: &str,
        server: Option<(&str, &str)>,
        expires: &str,
        tools: Option<&[&str]>,
    ) -> Result<(), String> {
        self.issue_for(c, name, server, expires, tools, &["payments"])
    }

    /// [`Served::issue_with_tools`] for `teams`.
    fn issue_for(
        &self,
        c: &LocalCluster,
        name: &str,
        server: Option<(&str, &str)>,
        expires: &str,
        tools: Option<&[&str]>,
        teams: &[&str],
    ) -> Result<(), String> {
        let (server_name, uid) = server.unwrap_or((&self.server, &self.server_uid));
        let mut manifest = json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "AccessSession",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "server": {"name": server_name, "uid": uid},
                "teams": teams,
                "subject": {"user": "alice@example.com"},
                "expiresAt": expires,
            },
        });
        if let Some(tools) = tools {
            manifest["spec"]["tools"] = json!(tools);
        }
        ok(
            &c.kubectl_as(
                &c.kubeconfig,
                &["create", "-f", "-"],
                Some(&manifest.to_string()),
            ),
            &format!("issue session {name}"),
        )
        .map(|_| ())
    }

    fn token(&self, c: &LocalCluster, session: &str, seconds: u64) -> Result<String, String> {
        mcp::session_token_for(c, &self.ns, session, seconds).map_err(e("the session token"))
    }

    fn revoke(&self, c: &LocalCluster, session: &str) -> Result<(), String> {
        let manifest = format!(
            "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata: {{name: rvk-{session}, namespace: {}}}\nspec: {{target: {{session: {session}}}, cause: compromised}}\n",
            self.ns
        );
        ok(
            &c.kubectl_as(&c.kubeconfig, &["create", "-f", "-"], Some(&manifest)),
            "kubectl create revocation",
        )
        .map(|_| ())
    }

    fn prm_url(&self) -> String {
        format!("{}{PRM_PATH}", self.gateway.public_url)
    }

    fn context(&self) -> String {
        format!(
            "gateway log:\n{}\nupstream log:\n{}",
            mcp::tail(&self.gateway.process.log, 15),
            mcp::tail(&self.upstream.process.log, 5)
        )
    }
}

fn far_future() -> String {
    "2099-01-01T00:00:00Z".into()
}

fn in_seconds(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() + seconds)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| far_future())
}

fn run(
    c: &LocalCluster,
    s: &Served,
    sdk: Sdk,
    token: Option<&str>,
    scenario: &str,
    extra: &[&str],
) -> Result<ClientRun, String> {
    mcp::run_client(c, sdk, &s.gateway.url(), token, scenario, extra)
        .map_err(|err| format!("{}: {err:#}\n{}", sdk.name(), s.context()))
}

/// The SDK was refused with exactly 401 `reason`, said in every place it is said.
fn expect_denied(
    s: &Served,
    sdk: Sdk,
    run: &ClientRun,
    reason: &str,
    what: &str,
) -> Result<(), String> {
    let r = &run.result;
    let http = &r["http"];
    let fail = |detail: String| {
        Err(format!(
            "{what} ({}): {detail}; the client said {r}",
            sdk.name()
        ))
    };
    if r["ok"] != false {
        return fail("the client succeeded".into());
    }
    if http["status"] != 401 {
        return fail(format!("status {}, not 401", http["status"]));
    }
    if http["reason"] != reason || http["deny_reason_header"] != reason {
        return fail(format!(
            "body reason {} and X-MCP-Deny-Reason {}, not {reason}",
            http["reason"], http["deny_reason_header"]
        ));
    }
    if http["resource_metadata"] != s.prm_url().as_str() {
        return fail(format!(
            "the SDK read resource_metadata {} from WWW-Authenticate, not {}",
            http["resource_metadata"],
            s.prm_url()
        ));
    }
    let (want_error, want_description) = if reason == "token_missing" {
        (Value::Null, None)
    } else {
        (json!("invalid_token"), Some(reason))
    };
    if http["error"] != want_error {
        return fail(format!(
            "WWW-Authenticate error={}, want {want_error}",
            http["error"]
        ));
    }
    // Only the Python SDK's parser is asked for error_description.
    if let (Some(want), Some(got)) = (want_description, http.get("error_description")) {
        if got != want {
            return fail(format!(
                "WWW-Authenticate error_description={got}, want {want}"
            ));
        }
    }
    Ok(())
}

/// Initialize (or the 2026-07-28 adoption), tools/list, tools/call and a long-running tool's
/// progress, through the gateway, with every SDK client; the upstream sees the session's
/// identity and never the token; the RFC 9728 document as the SDK's OAuth discovery reads it.
pub fn sdk_clients_initialize_list_and_call(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-basic", "tools")?;
    s.issue(c, "s1", None, &far_future())?;
    let session_uid = jsonpath(c, &s.ns, &["accesssession", "s1"], "{.metadata.uid}")?;
    let token = s.token(c, "s1", 600)?;

    // Direct to the upstream the SDK works (the baseline the gateway must preserve).
    let direct = mcp::run_client(c, Sdk::PythonLegacy, &s.upstream.url(), None, "basic", &[])
        .map_err(e("direct to the upstream"))?;
    ensure!(
        direct.result["ok"] == true,
        "the SDK client fails even without the gateway: {}",
        direct.result
    );

    for sdk in Sdk::available() {
        let basic = run(c, &s, sdk, Some(&token), "basic", &[])?;
        let r = &basic.result;
        ensure!(
            r["ok"] == true,
            "{} through the gateway: {r}\n{}",
            sdk.name(),
            s.context()
        );
        let want_version = if sdk == Sdk::Python2026 {
            "2026-07-28"
        } else {
            "2025-11-25"
        };
        ensure!(
            r["protocol_version"] == want_version,
            "{}: protocol version {}, want {want_version}",
            sdk.name(),
            r["protocol_version"]
        );
        ensure!(
            r["tools"] == json!(["count", "echo", "whoami"]),
            "{}: tools/list gave {}",
            sdk.name(),
            r["tools"]
        );
        ensure!(
            r["echo"] == "hello through the gateway" && r["echo_is_error"] == false,
            "{}: tools/call echo gave {} (is_error {})",
            sdk.name(),
            r["echo"],
            r["echo_is_error"]
        );
        let who = &r["whoami"];
        ensure!(
            who["headers_seen"] == true && who["authorization_present"] == false,
            "{}: the upstream saw Authorization (or no headers at all): {who}",
            sdk.name()
        );
        let identity = &who["identity"];
        ensure!(
            identity["x-mcp-access-session"] == format!("{}/s1", s.ns)
                && identity["x-mcp-access-session-uid"] == session_uid.as_str()
                && identity["x-mcp-access-subject"] == "alice@example.com",
            "{}: the upstream's identity headers are {identity}, want session {}/s1 uid {session_uid} subject alice@example.com",
            sdk.name(),
            s.ns
        );

        let counted = run(
            c,
            &s,
            sdk,
            Some(&token),
            "count",
            &["--count", "5", "--delay-ms", "50"],
        )?;
        let r = &counted.result;
        ensure!(
            r["ok"] == true && r["count"] == "counted 5",
            "{}: the long-running tool through the gateway: {r}\n{}",
            sdk.name(),
            s.context()
        );
        let steps: Vec<f64> = counted
            .progress
            .iter()
            .filter_map(|(_, p)| p["progress"].as_f64())
            .collect();
        ensure!(
            steps == [1.0, 2.0, 3.0, 4.0, 5.0],
            "{}: progress notifications {steps:?}, want 1..=5 in order",
            sdk.name()
        );
        // Streamed, not buffered: the progress lines arrived over the tool's run, before the end.
        let first = counted
            .progress
            .first()
            .map(|(at, _)| *at)
            .unwrap_or(counted.ended);
        ensure!(
            counted.ended.duration_since(first) >= Duration::from_millis(150),
            "{}: the progress arrived only {:?} before the result: the stream was buffered",
            sdk.name(),
            counted.ended.duration_since(first)
        );
    }

    // RFC 9728, found the way the SDK's OAuth client looks for it and parsed by its model.
    let prm = run(c, &s, Sdk::PythonLegacy, None, "prm", &[])?;
    let r = &prm.result;
    ensure!(
        r["ok"] == true,
        "the SDK found no protected resource metadata: {r}\n{}",
        s.context()
    );
    ensure!(
        r["probe_status"] == 401,
        "the unauthenticated probe answered {}",
        r["probe_status"]
    );
    ensure!(
        r["challenge_resource_metadata"] == s.prm_url().as_str(),
        "the challenge names {}, want {}",
        r["challenge_resource_metadata"],
        s.prm_url()
    );
    let resource = r["metadata"]["resource"].as_str().unwrap_or_default();
    ensure!(
        resource.trim_end_matches('/') == s.gateway.public_url,
        "the document's resource is {resource:?}, want {}: {}",
        s.gateway.public_url,
        r["metadata"]
    );
    ensure!(
        r["metadata"]["bearer_methods_supported"] == json!(["header"]),
        "bearer_methods_supported: {}",
        r["metadata"]
    );
    Ok(())
}

/// Tool grants through the official SDKs (issue 31): a session granted `echo` only is shown
/// only `echo` by tools/list, calls it, and its call of `count` fails in the SDK with the
/// gateway's JSON-RPC error (-32030, `tool_not_granted`, the tool named) — the upstream, which
/// would have counted, never saw it.
pub fn sdk_clients_see_and_call_only_granted_tools(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-granted", "tools")?;
    s.issue_with_tools(c, "narrow", None, &far_future(), Some(&["echo"]))?;
    let token = s.token(c, "narrow", 600)?;
    for sdk in Sdk::available() {
        let r = run(c, &s, sdk, Some(&token), "tools", &[])?.result;
        ensure!(
            r["ok"] == true,
            "{} through the gateway: {r}\n{}",
            sdk.name(),
            s.context()
        );
        ensure!(
            r["tools"] == json!(["echo"]),
            "{}: tools/list gave {}, want only the granted echo",
            sdk.name(),
            r["tools"]
        );
        ensure!(
            r["echo"] == "granted",
            "{}: the granted call gave {}",
            sdk.name(),
            r["echo"]
        );
        let error = &r["count"]["error"];
        ensure!(
            error["code"] == -32030
                && error["data"]["reason"] == "tool_not_granted"
                && error["data"]["tool"] == "count",
            "{}: the call of a tool not granted gave {}, want the gateway's -32030 tool_not_granted",
            sdk.name(),
            r["count"]
        );
    }
    Ok(())
}

/// Applies ToolPolicy `guard` for the scenario's server with `kubectl apply` and waits until
/// the gateway holds that version (its `/config/status` names the resourceVersion in force).
fn apply_policy(
    c: &LocalCluster,
    s: &Served,
    mode: &str,
    echo_values: &[&str],
) -> Result<(), String> {
    let manifest = json!({
        "apiVersion": "access.mcp-runtime.dev/v1alpha1",
        "kind": "ToolPolicy",
        "metadata": {"name": "guard", "namespace": s.ns},
        "spec": {
            "server": {"name": s.server},
            "mode": mode,
            "destructiveCallers": {"teams": ["sre"]},
            "tools": [
                {"name": "count", "sideEffect": "destructive"},
                {"name": "echo", "sideEffect": "read",
                 "arguments": [{"name": "text", "values": echo_values}]},
                {"name": "who*", "sideEffect": "read"},
            ],
        },
    });
    apply_and_wait(c, s, &manifest)
}

/// Applies a ToolPolicy manifest with `kubectl apply` and waits until the gateway holds that
/// version (its `/config/status` names the resourceVersion in force).
fn apply_and_wait(c: &LocalCluster, s: &Served, manifest: &Value) -> Result<(), String> {
    let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["apply", "-f", "-"],
            Some(&manifest.to_string()),
        ),
        "kubectl apply toolpolicy",
    )?;
    let rv = ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &[
                "get",
                "toolpolicy",
                name,
                "-n",
                &s.ns,
                "-o",
                "jsonpath={.metadata.resourceVersion}",
            ],
            None,
        ),
        "kubectl get toolpolicy",
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = s
            .gateway
            .get("/config/status")
            .map_err(e("/config/status"))?
            .json();
        let held = status["tool_policies"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == name && p["resourceVersion"] == rv.trim());
        if held {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the gateway does not hold toolpolicy {name} at {rv} within 10 s: {status}\n{}",
            s.context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error a `tools` run recorded for `call` (`echo_error` or `count.error`).
fn call_error<'a>(r: &'a Value, call: &str) -> &'a Value {
    match call {
        "echo" => &r["echo_error"],
        _ => &r["count"]["error"],
    }
}

/// ToolPolicies through the official SDKs (issue 31): under an enforcing policy that marks
/// `count` destructive (callable by team `sre`) and allows `echo` only with listed text, a
/// `payments` session is not shown `count` and its call is refused with -32031
/// `destructive_not_allowed`, while an `sre` session sees and calls it; an `echo` whose text is
/// not listed is refused with -32032 `argument_not_allowed`; in monitor mode the `payments`
/// session's call of `count` is forwarded and counted as monitored; a pinned `echo` whose
/// definition differs is hidden and refused, and reported as an Event on the MCPServer.
pub fn sdk_clients_under_tool_policies(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-policies", "policed")?;
    s.issue_for(c, "payments", None, &far_future(), None, &["payments"])?;
    s.issue_for(c, "oncall", None, &far_future(), None, &["sre"])?;
    let payments = s.token(c, "payments", 600)?;
    let oncall = s.token(c, "oncall", 600)?;
    apply_policy(c, &s, "enforce", &["granted"])?;
    for sdk in Sdk::available() {
        let r = run(c, &s, sdk, Some(&payments), "tools", &[])?.result;
        ensure!(r["ok"] == true, "{}: {r}\n{}", sdk.name(), s.context());
        ensure!(
            r["tools"] == json!(["echo", "whoami"]),
            "{}: payments was listed {}, want count left out (destructive)",
            sdk.name(),
            r["tools"]
        );
        ensure!(r["echo"] == "granted", "{}: echo gave {r}", sdk.name());
        let error = call_error(&r, "count");
        ensure!(
            error["code"] == -32031
                && error["data"]["reason"] == "destructive_not_allowed"
                && error["data"]["policy"] == "guard",
            "{}: payments' count gave {r}, want -32031 destructive_not_allowed from guard",
            sdk.name()
        );
        let r = run(c, &s, sdk, Some(&oncall), "tools", &[])?.result;
        ensure!(
            r["ok"] == true && r["tools"] == json!(["count", "echo", "whoami"]),
            "{}: oncall gave {r}",
            sdk.name()
        );
        ensure!(
            r["count"]["result"] == "counted 1",
            "{}: oncall's count gave {r}, want it forwarded",
            sdk.name()
        );
    }
    // An argument outside the listed values.
    apply_policy(c, &s, "enforce", &["something-else"])?;
    for sdk in Sdk::available() {
        let r = run(c, &s, sdk, Some(&oncall), "tools", &[])?.result;
        let error = call_error(&r, "echo");
        ensure!(
            error["code"] == -32032 && error["data"]["reason"] == "argument_not_allowed",
            "{}: echo with an unlisted text gave {r}, want -32032 argument_not_allowed",
            sdk.name()
        );
        ensure!(
            r["count"]["result"] == "counted 1",
            "{}: the refused echo held back the next call: {r}",
            sdk.name()
        );
    }
    // Monitor mode forwards what it would refuse, and counts it.
    apply_policy(c, &s, "monitor", &["something-else"])?;
    let monitored = |s: &Served| -> Result<f64, String> {
        let text = s.gateway.get("/metrics").map_err(e("/metrics"))?.body;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("mcp_gateway_calls_monitored_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    };
    let before = monitored(&s)?;
    let sdks = Sdk::available();
    for sdk in &sdks {
        let r = run(c, &s, *sdk, Some(&payments), "tools", &[])?.result;
        ensure!(
            r["ok"] == true
                && r["tools"] == json!(["count", "echo", "whoami"])
                && r["echo"] == "granted"
                && r["count"]["result"] == "counted 1",
            "{}: in monitor mode payments gave {r}, want everything forwarded",
            sdk.name()
        );
    }
    let after = monitored(&s)?;
    // Each run: echo's text and count's destructiveness.
    ensure!(
        after - before == 2.0 * sdks.len() as f64,
        "mcp_gateway_calls_monitored_total grew by {}, want {}",
        after - before,
        2 * sdks.len()
    );

    // A pin the server's echo does not match (as after a "rug pull"): once a list shows the
    // definition, echo is hidden and its calls refused (-32035), and the MCPServer gets an
    // Event naming the definition seen.
    let pin = format!("sha256:{}", "0".repeat(64));
    apply_and_wait(
        c,
        &s,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "ToolPolicy",
            "metadata": {"name": "pins", "namespace": s.ns},
            "spec": {
                "server": {"name": s.server},
                "tools": [{"name": "echo", "sideEffect": "read", "digest": pin}],
            },
        }),
    )?;
    for sdk in &sdks {
        let r = run(c, &s, *sdk, Some(&oncall), "tools", &[])?.result;
        let error = call_error(&r, "echo");
        ensure!(
            !r["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t == "echo")
                && error["code"] == -32035
                && error["data"]["reason"] == "tool_changed"
                && error["data"]["policy"] == "pins",
            "{}: with echo's pin unmatched gave {r}, want it hidden and refused with -32035",
            sdk.name()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = ok(
            &c.kubectl(&["get", "events", "-n", &s.ns, "-o", "json"]),
            "kubectl get events",
        )?;
        let events: Value = serde_json::from_str(&events).map_err(|e| e.to_string())?;
        let found = events["items"].as_array().into_iter().flatten().find(|e| {
            e["reason"] == "ToolDefinitionChanged" && e["involvedObject"]["kind"] == "MCPServer"
        });
        if let Some(event) = found {
            let note = event["message"].as_str().unwrap_or_default();
            ensure!(
                event["involvedObject"]["name"] == s.server.as_str()
                    && event["involvedObject"]["uid"] == s.server_uid.as_str()
                    && note.contains("\"echo\"")
                    && note.contains(&pin),
                "the drift Event: {event}"
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no ToolDefinitionChanged Event on MCPServer {} within 20 s: {events}\n{}",
            s.server,
            s.context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(part: &str) -> Result<Value, String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|err| format!("a token segment is not base64url: {err}"))?;
    serde_json::from_slice(&bytes).map_err(|err| format!("a token segment is not JSON: {err}"))
}

/// The same header (kid) and claims, signed by a key of our own.
fn resigned(c: &LocalCluster, token: &str) -> Result<String, String> {
    let parts: Vec<&str> = token.split('.').collect();
    ensure!(
        parts.len() == 3,
        "the session token has {} segments",
        parts.len()
    );
    let header = unb64(parts[0])?;
    let claims = unb64(parts[1])?;
    let key = c.dir.join("mcp-foreign-key.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&key)
        .output()
        .map_err(|err| format!("cannot run openssl: {err}"))?;
    ensure!(
        made.status.success(),
        "openssl genpkey: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let pem = std::fs::read(&key).map_err(|err| err.to_string())?;
    let key = jsonwebtoken::EncodingKey::from_ec_pem(&pem).map_err(|err| err.to_string())?;
    let mut forged = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    forged.kid = header["kid"].as_str().map(str::to_string);
    jsonwebtoken::encode(&forged, &claims, &key).map_err(|err| err.to_string())
}

/// `alg: none` with the same kid and claims, no signature.
fn alg_none(token: &str) -> Result<String, String> {
    let parts: Vec<&str> = token.split('.').collect();
    ensure!(
        parts.len() == 3,
        "the session token has {} segments",
        parts.len()
    );
    let mut header = unb64(parts[0])?;
    header["alg"] = json!("none");
    Ok(format!(
        "{}.{}.",
        b64(header.to_string().as_bytes()),
        parts[1]
    ))
}

/// Each deny reason, as the SDK clients see it: 401, `WWW-Authenticate` with
/// `resource_metadata` and `error="invalid_token"` (none for a missing token), the reason in
/// `error_description`, `X-MCP-Deny-Reason` and the body. The clients take turns.
pub fn denies_with_each_reason(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-deny", "tools")?;
    let sdks = Sdk::available();
    let mut turn = 0usize;
    let mut next = || {
        turn += 1;
        sdks[(turn - 1) % sdks.len()]
    };
    s.issue(c, "long", None, &far_future())?;
    // token_expired needs a token whose exp is past the leeway: minted first, checked last.
    let short = s.token(c, "long", 10)?;
    let short_minted = Instant::now();
    // session_expired: a session that ends soon, with a token that ends with it (exp = its
    // expiresAt), asked about after expiresAt and inside the leeway.
    s.issue(c, "ending", None, &in_seconds(15))?;
    let ending = s.token(c, "ending", 600)?;
    let ending_minted = Instant::now();
    let valid = s.token(c, "long", 600)?;

    // token_missing: no Authorization header at all.
    let sdk = next();
    let r = run(c, &s, sdk, None, "basic", &[])?;
    expect_denied(&s, sdk, &r, "token_missing", "no token")?;

    // token_invalid: garbage, alg none, a token re-signed by another key.
    let cases = [
        ("garbage", "not-a-jwt".to_string()),
        ("alg none", alg_none(&valid)?),
        ("re-signed by another key", resigned(c, &valid)?),
    ];
    for (what, token) in &cases {
        let sdk = next();
        let r = run(c, &s, sdk, Some(token), "basic", &[])?;
        expect_denied(&s, sdk, &r, "token_invalid", what)?;
    }

    // token_invalid: a token of another server (its audience and server uid are not ours).
    let other_uid = {
        ok(
            &c.kubectl_as(
                &c.kubeconfig,
                &["apply", "-f", "-"],
                Some(&mcpserver_manifest(&s.ns, "other")),
            ),
            "create MCPServer other",
        )?;
        jsonpath(c, &s.ns, &["mcpserver", "other"], "{.metadata.uid}")?
    };
    s.issue(c, "elsewhere", Some(("other", &other_uid)), &far_future())?;
    let foreign = s.token(c, "elsewhere", 600)?;
    let sdk = next();
    let r = run(c, &s, sdk, Some(&foreign), "basic", &[])?;
    expect_denied(&s, sdk, &r, "token_invalid", "another server's token")?;

    // The query string is never read: a request carrying a token there is refused as
    // token_invalid (RFC 6750: one method per request, and the query one is not offered),
    // header or not; two Authorization headers are refused.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let json_headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let raw = mcp::http_request(
        s.gateway.addr,
        "POST",
        &format!("/mcp?access_token={valid}"),
        &json_headers,
        Some(body),
    )
    .map_err(e("a token in the query string"))?;
    ensure!(
        raw.status == 401 && raw.header("x-mcp-deny-reason") == Some("token_invalid"),
        "a token in the query string: {} {:?} {}",
        raw.status,
        raw.header("x-mcp-deny-reason"),
        raw.body
    );
    let bearer = format!("Bearer {valid}");
    let mut two = json_headers.to_vec();
    two.extend([
        ("Authorization", bearer.as_str()),
        ("Authorization", bearer.as_str()),
    ]);
    let raw = mcp::http_request(s.gateway.addr, "POST", "/mcp", &two, Some(body))
        .map_err(e("two Authorization headers"))?;
    ensure!(
        raw.status == 401 && raw.header("x-mcp-deny-reason") == Some("token_invalid"),
        "two Authorization headers: {} {:?} {}",
        raw.status,
        raw.header("x-mcp-deny-reason"),
        raw.body
    );

    // session_revoked.
    s.issue(c, "revoked", None, &far_future())?;
    let revoked = s.token(c, "revoked", 600)?;
    let sdk = next();
    let r = run(c, &s, sdk, Some(&revoked), "basic", &[])?;
    ensure!(
        r.result["ok"] == true,
        "before its revocation the session works: {}",
        r.result
    );
    s.revoke(c, "revoked")?;
    let r = eventually_denied(c, &s, next(), &revoked)?;
    expect_denied(&s, r.0, &r.1, "session_revoked", "a revoked session")?;

    // session_not_found: the session is deleted.
    s.issue(c, "deleted", None, &far_future())?;
    let deleted = s.token(c, "deleted", 600)?;
    ok(
        &c.kubectl(&["delete", "accesssession", "deleted", "-n", &s.ns]),
        "delete the session",
    )?;
    let r = eventually_denied(c, &s, next(), &deleted)?;
    expect_denied(&s, r.0, &r.1, "session_not_found", "a deleted session")?;

    // session_expired: after expiresAt (15 s after issue), within the 30 s leeway of its token.
    let wait = Duration::from_secs(17).saturating_sub(ending_minted.elapsed());
    std::thread::sleep(wait);
    let sdk = next();
    let r = run(c, &s, sdk, Some(&ending), "basic", &[])?;
    // An ordering, not a performance bound: the check must come after the session's expiry
    // (17 s) and before its token's leeway ends (30 s) for the answer to mean anything.
    ensure!(
        ending_minted.elapsed() < LEEWAY,
        "the session_expired check came {:?} after minting: past the leeway, it cannot tell",
        ending_minted.elapsed()
    );
    expect_denied(&s, sdk, &r, "session_expired", "an expired session")?;

    // token_expired: 10 s of life plus the 30 s leeway, and a margin.
    let wait = (Duration::from_secs(10) + LEEWAY + Duration::from_secs(3))
        .saturating_sub(short_minted.elapsed());
    std::thread::sleep(wait);
    let sdk = next();
    let r = run(c, &s, sdk, Some(&short), "basic", &[])?;
    expect_denied(&s, sdk, &r, "token_expired", "an expired token")?;

    // And the valid token still works: the refusals above were about their tokens.
    let sdk = next();
    let r = run(c, &s, sdk, Some(&valid), "basic", &[])?;
    ensure!(
        r.result["ok"] == true,
        "the valid token after the refusals: {}",
        r.result
    );
    Ok(())
}

/// The gateway learns of a change through its watch: ask until the session is refused (a
/// liveness bound of 10 s), and return the refusing run.
fn eventually_denied(
    c: &LocalCluster,
    s: &Served,
    sdk: Sdk,
    token: &str,
) -> Result<(Sdk, ClientRun), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = run(c, s, sdk, Some(token), "basic", &[])?;
        if r.result["ok"] == false || Instant::now() > deadline {
            return Ok((sdk, r));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An open `count` stream of every SDK client ends within 1 s of `kubectl create revocation`
/// returning, and the gateway's JSON-RPC error reaches the SDK's caller.
pub fn open_stream_cut_on_revocation(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-cut", "tools")?;
    let mut report = Vec::new();
    for (i, sdk) in Sdk::available().into_iter().enumerate() {
        let session = format!("stream-{i}");
        s.issue(c, &session, None, &far_future())?;
        let token = s.token(c, &session, 600)?;
        // 600 steps of 100 ms: a minute of streaming unless it is cut.
        let mut client = mcp::spawn_client(
            c,
            sdk,
            &s.gateway.url(),
            Some(&token),
            "count",
            &["--count", "600", "--delay-ms", "100"],
        )
        .map_err(e("the streaming client"))?;
        client
            .next_progress(Duration::from_secs(30))
            .map_err(|err| format!("{}: {err:#}\n{}", sdk.name(), s.context()))?;
        client
            .next_progress(Duration::from_secs(10))
            .map_err(|err| format!("{}: {err:#}", sdk.name()))?;
        let asked = Instant::now();
        s.revoke(c, &session)?;
        let written = Instant::now();
        let run = client.finish(Duration::from_secs(30)).map_err(|err| {
            format!(
                "{}: the stream was not cut: {err:#}\n{}",
                sdk.name(),
                s.context()
            )
        })?;
        let r = &run.result;
        let after_write = run.ended.saturating_duration_since(written);
        let after_ask = run.ended.saturating_duration_since(asked);
        report.push(format!(
            "{}: {after_write:?} after the write ({after_ask:?} after kubectl started)",
            sdk.name()
        ));
        ensure!(
            r["ok"] == false && r["count"].is_null(),
            "{}: the tool call completed after the revocation: {r}",
            sdk.name()
        );
        let steps = r["progress"].as_array().map(Vec::len).unwrap_or(0);
        ensure!(steps < 600, "{}: all {steps} steps arrived", sdk.name());
        ensure!(
            r["error"].to_string().contains("session_revoked"),
            "{}: the SDK's caller got {} — not the gateway's JSON-RPC error naming session_revoked",
            sdk.name(),
            r["error"]
        );
        ensure!(
            after_write <= CUT_BOUND,
            "{}: the stream ended {after_write:?} after kubectl create revocation returned (bound {CUT_BOUND:?})",
            sdk.name()
        );
    }
    eprintln!("    stream cut: {}", report.join("; "));
    Ok(())
}

/// Retiring a server and republishing it under the same name: the old token, presented to the
/// new generation's gateway, gets exactly 401 `session_not_found` (its session belongs to the
/// retired uid, which the new gateway's sessions never include).
pub fn retired_and_republished_server_refuses_the_old_token(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let s = Served::start(c, "e2e-mcp-retire", "tools")?;
    s.issue(c, "before", None, &far_future())?;
    let old = s.token(c, "before", 600)?;
    let r = run(c, &s, Sdk::PythonLegacy, Some(&old), "basic", &[])?;
    ensure!(
        r.result["ok"] == true,
        "the old token before retirement: {}",
        r.result
    );

    ok(
        &c.kubectl(&[
            "delete",
            "mcpserver",
            &s.server,
            "-n",
            &s.ns,
            "--wait=true",
            "--timeout=60s",
        ]),
        "delete (retire) the MCPServer",
    )?;
    let fence = format!("server-retired-{}", s.server_uid);
    let cause = jsonpath(c, &s.ns, &["revocation", &fence], "{.spec.cause}")?;
    ensure!(
        cause == "server_retired",
        "the retirement fence {fence} has cause {cause:?}"
    );

    let (new_uid, pod, pod_uid) = create_server(c, &s.ns, &s.server)?;
    ensure!(
        new_uid != s.server_uid,
        "the republished server kept uid {new_uid}"
    );
    let gateway = start_gateway(
        c,
        &s.ns,
        &s.server,
        "e2e-mcp-retire-new",
        &(pod, pod_uid),
        &s.upstream,
    )?;
    let r = mcp::run_client(
        c,
        Sdk::PythonLegacy,
        &gateway.url(),
        Some(&old),
        "basic",
        &[],
    )
    .map_err(e("the old token at the new gateway"))?;
    let http = &r.result["http"];
    ensure!(
        r.result["ok"] == false
            && http["status"] == 401
            && http["reason"] == "session_not_found"
            && http["deny_reason_header"] == "session_not_found",
        "the old token at the republished server's gateway: {}\n{}",
        r.result,
        mcp::tail(&gateway.process.log, 15)
    );
    // The new generation serves its own sessions.
    s.issue(c, "after", Some((&s.server, &new_uid)), &far_future())?;
    let new = s.token(c, "after", 600)?;
    let r = mcp::run_client(
        c,
        Sdk::PythonLegacy,
        &gateway.url(),
        Some(&new),
        "basic",
        &[],
    )
    .map_err(e("a new token at the new gateway"))?;
    ensure!(
        r.result["ok"] == true,
        "a session of the republished server: {}",
        r.result
    );
    Ok(())
}

/// The decision a raw `tools/list` with `token` gets from the gateway: None when it passes the
/// gateway (any answer but 401), else the deny reason.
fn gateway_decision(s: &Served, token: &str) -> Result<Option<String>, String> {
    let bearer = format!("Bearer {token}");
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Authorization", bearer.as_str()),
    ];
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;
    let raw = mcp::http_request(s.gateway.addr, "POST", "/mcp", &headers, Some(body))
        .map_err(e("a raw request to the gateway"))?;
    Ok((raw.status == 401).then(|| {
        raw.header("x-mcp-deny-reason")
            .unwrap_or("(no reason)")
            .to_string()
    }))
}

/// Polls the gateway every 20 ms until `token` is denied with `reason`; how long it took.
fn denied_within(
    s: &Served,
    token: &str,
    reason: &str,
    bound: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let decision = gateway_decision(s, token)?;
        if decision.as_deref() == Some(reason) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > bound {
            return Err(format!(
                "not denied with {reason} within {bound:?} (last: {decision:?})\n{}",
                s.context()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The Host's `status.sessions` and its `Ready` condition.
fn host_state(c: &LocalCluster, ns: &str, host: &str) -> Result<(Value, Value), String> {
    let out = c.kubectl(&["get", "host", host, "-n", ns, "-o", "json"]);
    let h: Value = serde_json::from_str(&ok(&out, "get host")?).map_err(e("host json"))?;
    let ready = h["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or(Value::Null);
    Ok((h["status"]["sessions"].clone(), ready))
}

/// The AccessSessions carrying `host_uid`'s label, in every namespace: (namespace/name, phase).
fn host_sessions(c: &LocalCluster, host_uid: &str) -> Result<Vec<(String, String)>, String> {
    let selector = format!("mcp-runtime.dev/host-uid={host_uid}");
    let out = c.kubectl(&["get", "accesssessions", "-A", "-l", &selector, "-o", "json"]);
    let list: Value =
        serde_json::from_str(&ok(&out, "get accesssessions")?).map_err(e("sessions json"))?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                format!(
                    "{}/{}",
                    s["metadata"]["namespace"].as_str().unwrap_or_default(),
                    s["metadata"]["name"].as_str().unwrap_or_default()
                ),
                s["status"]["phase"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect())
}

/// Waits for the Host's session for its first server to be Active; its name.
fn active_host_session(c: &LocalCluster, ns: &str, host: &str) -> Result<String, String> {
    super::controllers::until(Duration::from_secs(30), "the Host's session", || {
        let (sessions, _) = host_state(c, ns, host)?;
        Ok(sessions[0]["session"]
            .as_str()
            .filter(|_| sessions[0]["phase"] == "Active")
            .map(str::to_string))
    })
}

/// Issue 33 item 1, through the gateway: a Host's access to its Context's server is an
/// AccessSession the controllers keep (subject the Host's ServiceAccount, the Context's teams,
/// beside the server); its token passes the gateway. A Revocation of it cuts the host and is
/// never worked around (no new session; `Ready=False SessionRevoked` naming it) until withdrawn;
/// removing the server from the Context, and deleting the Host, delete the session and so cut
/// the host. A Context of another namespace grants nothing until the server consents
/// (`allowedContexts`), and a Host the Context's `hostSelector` does not select gets nothing.
pub fn host_sessions_through_the_gateway(c: &mut LocalCluster) -> Result<(), String> {
    let s = Served::start(c, "e2e-host-sessions", "tools")?;
    host_sessions_of(c, &s).map_err(|err| {
        format!(
            "{err}\n--- controllers ---\n{}",
            mcp::tail(&s._controllers.log, 30)
        )
    })
}

fn host_sessions_of(c: &LocalCluster, s: &Served) -> Result<(), String> {
    let ns = s.ns.clone();
    let context = |name: &str, ns: &str, servers: Value| {
        json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Context",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"hostSelector": {"matchLabels": {"tier": "dev"}}, "mcpServers": servers,
                     "teams": ["payments"]},
        })
    };
    let host = |name: &str, ns: &str, labels: Value| {
        json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"contextRef": {"name": "dev"}, "image": "ghcr.io/acme/agent:1"},
        })
    };
    let apply = |m: &Value| super::controllers::apply(c, m);
    apply(&context("dev", &ns, json!([{"name": "tools"}])))?;
    apply(&host("agent", &ns, json!({"tier": "dev"})))?;
    // Named the Context but not selected by it: nothing.
    apply(&host("stray", &ns, json!({"tier": "prod"})))?;

    let name = active_host_session(c, &ns, "agent")?;
    let session: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "accesssession", &name, "-n", &ns, "-o", "json"]),
        "get the host's session",
    )?)
    .map_err(e("session json"))?;
    ensure!(
        session["spec"]["subject"]["user"]
            == format!("system:serviceaccount:{ns}:agent-host").as_str()
            && session["spec"]["teams"] == json!(["payments"])
            && session["spec"]["server"]["uid"] == s.server_uid.as_str(),
        "the host's session: {session}"
    );
    let agent_uid = jsonpath(c, &ns, &["host", "agent"], "{.metadata.uid}")?;
    let stray_uid = jsonpath(c, &ns, &["host", "stray"], "{.metadata.uid}")?;
    ensure!(
        host_sessions(c, &stray_uid)?.is_empty(),
        "a Host its Context does not select got a session"
    );
    let stray_context = jsonpath(
        c,
        &ns,
        &["host", "stray"],
        "{.status.conditions[?(@.type==\"ContextResolved\")].reason}",
    )?;
    ensure!(
        stray_context == "HostNotSelected",
        "the stray Host's ContextResolved reason: {stray_context}"
    );

    let token = s.token(c, &name, 600)?;
    ensure!(
        gateway_decision(s, &token)?.is_none(),
        "the host's token did not pass the gateway\n{}",
        s.context()
    );

    // Revoked: cut at the gateway, Ready=False naming the Revocation, no replacement.
    let written = {
        s.revoke(c, &name)?;
        Instant::now()
    };
    let revoked_after = denied_within(s, &token, "session_revoked", CUT_BOUND)?;
    let ready = super::controllers::until(Duration::from_secs(30), "Ready=False", || {
        let (_, ready) = host_state(c, &ns, "agent")?;
        Ok((ready["reason"] == "SessionRevoked").then_some(ready))
    })?;
    ensure!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("rvk-{name}"))),
        "Ready does not name the Revocation: {ready}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let held = host_sessions(c, &agent_uid)?;
    ensure!(
        held == [(format!("{ns}/{name}"), "Revoked".to_string())],
        "a revoked host session was replaced or removed: {held:?}"
    );
    // Withdrawn: the same session is usable again, and the Host Ready reason moves on.
    ok(
        &c.kubectl(&["delete", "revocation", &format!("rvk-{name}"), "-n", &ns]),
        "withdraw the revocation",
    )?;
    super::controllers::until(Duration::from_secs(30), "the session restored", || {
        let (_, ready) = host_state(c, &ns, "agent")?;
        Ok((ready["reason"] != "SessionRevoked").then_some(()))
    })?;
    let token = s.token(c, &name, 600)?;
    ensure!(
        gateway_decision(s, &token)?.is_none(),
        "the restored session's token did not pass"
    );

    // Revoked again, and the revoked session deleted (by someone who may delete sessions):
    // that is no withdrawal. While the Revocation stands nothing is issued in its place and
    // the Host still names it; withdrawn, a successor is issued.
    s.revoke(c, &name)?;
    denied_within(s, &token, "session_revoked", CUT_BOUND)?;
    super::controllers::until(Duration::from_secs(30), "revoked again", || {
        let (sessions, _) = host_state(c, &ns, "agent")?;
        Ok((sessions[0]["phase"] == "Revoked").then_some(()))
    })?;
    ok(
        &c.kubectl(&["delete", "accesssession", &name, "-n", &ns]),
        "delete the revoked session",
    )?;
    let host_reconciles = || {
        s._controllers
            .metric(
                "mcp_controllers_reconcile_duration_seconds_count",
                &["controller=\"host\""],
            )
            .map_err(|e| e.to_string())
    };
    let before = host_reconciles()?;
    ok(
        &c.kubectl(&["annotate", "host", "agent", "-n", &ns, "e2e/nudge=1"]),
        "nudge the Host",
    )?;
    super::controllers::until(Duration::from_secs(30), "a Host reconcile", || {
        Ok((host_reconciles()? > before).then_some(()))
    })?;
    let (sessions, ready) = host_state(c, &ns, "agent")?;
    ensure!(
        host_sessions(c, &agent_uid)?.is_empty()
            && ready["reason"] == "SessionRevoked"
            && sessions[0]["revocation"] == format!("rvk-{name}").as_str(),
        "a deleted revoked session was replaced while its Revocation stands: {:?}, {sessions}, {ready}",
        host_sessions(c, &agent_uid)?
    );
    ok(
        &c.kubectl(&["delete", "revocation", &format!("rvk-{name}"), "-n", &ns]),
        "withdraw the revocation of the deleted session",
    )?;
    ok(
        &c.kubectl(&[
            "annotate",
            "host",
            "agent",
            "-n",
            &ns,
            "e2e/nudge=2",
            "--overwrite",
        ]),
        "nudge the Host",
    )?;
    let successor = active_host_session(c, &ns, "agent")?;
    ensure!(successor != name, "the successor reuses {name}");
    let token = s.token(c, &successor, 600)?;
    ensure!(
        gateway_decision(s, &token)?.is_none(),
        "the successor's token did not pass"
    );

    // The server removed from the Context: the session is deleted and the host cut.
    apply(&context("dev", &ns, json!([])))?;
    let removed_after = denied_within(s, &token, "session_not_found", Duration::from_secs(10))?;
    ensure!(
        host_sessions(c, &agent_uid)?.is_empty(),
        "the session outlived its grant"
    );

    // A Context of another namespace: nothing until the server consents.
    let other = format!("{ns}-b");
    create_namespace(c, &other)?;
    apply(&context(
        "dev",
        &other,
        json!([{"name": "tools", "namespace": ns}]),
    ))?;
    apply(&host("remote", &other, json!({"tier": "dev"})))?;
    let remote_uid = super::controllers::until(Duration::from_secs(30), "the remote Host", || {
        Ok(
            Some(jsonpath(c, &other, &["host", "remote"], "{.metadata.uid}")?)
                .filter(|u| !u.is_empty()),
        )
    })?;
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        host_sessions(c, &remote_uid)?.is_empty(),
        "a Context of another namespace got a session without the server's consent"
    );
    ok(
        &c.kubectl(&[
            "patch",
            "mcpserver",
            "tools",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"allowedContexts":{"namespaces":{"from":"All"}}}}"#,
        ]),
        "consent to other namespaces",
    )?;
    let remote_session = active_host_session(c, &other, "remote")?;
    let remote_token = s.token(c, &remote_session, 600)?;
    ensure!(
        gateway_decision(s, &remote_token)?.is_none(),
        "the cross-namespace host's token did not pass"
    );
    // Deleting the Host deletes its session in the server's namespace (the finalizer).
    let deleted = Instant::now();
    ok(
        &c.kubectl(&["delete", "host", "remote", "-n", &other, "--wait=false"]),
        "delete the remote Host",
    )?;
    let deleted_after = denied_within(
        s,
        &remote_token,
        "session_not_found",
        Duration::from_secs(10),
    )?;
    super::controllers::until(Duration::from_secs(30), "the Host gone", || {
        let out = c.kubectl(&["get", "host", "remote", "-n", &other]);
        Ok((!out.success && out.stderr.contains("NotFound")).then_some(()))
    })?;
    eprintln!(
        "    host cut: revocation {revoked_after:?} after the write ({:?} since), grant removed {removed_after:?}, host deleted {deleted_after:?} (deny at the gateway after kubectl returned; {:?} total)",
        written.elapsed(),
        deleted.elapsed()
    );
    Ok(())
}
