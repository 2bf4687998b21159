//! The Host API as `hack/up.sh` runs it: the controllers started with the local cluster's
//! Host API flags (`LocalCluster::host_api_args`: the PKI and issuer `hack/cluster.sh` makes),
//! and a host calling it with curl and a token from `hack/host-token.sh`, as the README shows.

use std::process::Command;

use e2e::LocalCluster;
use serde_json::{json, Value};

use super::controllers::{apply, start};
use super::{create_namespace, ok};

const NS: &str = "host-local";

/// `curl -s` against the Host API, trusting the local Host API CA: (status, body).
fn call(
    c: &LocalCluster,
    url: &str,
    token: &str,
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let ca = c
        .env
        .get("HOST_API_CA_FILE")
        .ok_or("the cluster env has no HOST_API_CA_FILE")?;
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--cacert", ca])
        .args(["-w", "\n%{http_code}"])
        .args(["-H", &format!("Authorization: Bearer {token}")]);
    if let Some(body) = body {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ]);
    }
    let out = cmd.arg(url).output().map_err(|e| format!("curl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "curl {url} failed: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (body, code) = text.rsplit_once('\n').ok_or("curl printed no status")?;
    let code = code
        .trim()
        .parse()
        .map_err(|_| format!("status {code:?}"))?;
    Ok((code, body.to_string()))
}

fn host_token(c: &LocalCluster, host: &str) -> Result<String, String> {
    let out = Command::new(e2e::repo_root().join("hack/host-token.sh"))
        .args([NS, host])
        .env("MCP_ACCESS_LOCAL_DIR", &c.dir)
        .output()
        .map_err(|e| format!("hack/host-token.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "hack/host-token.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(super) fn host_token_sh_signs_what_the_local_host_api_accepts(
    c: &mut LocalCluster,
) -> Result<(), String> {
    create_namespace(c, NS)?;
    let args = c.host_api_args().map_err(|e| format!("{e:#}"))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut controllers = start(c, "host-local", "host-local", &args)?;
    let port = controllers.host_api_port.ok_or("no Host API port")?;
    let base = format!("https://127.0.0.1:{port}/api/v2/hosts/self/mcpservers");
    let result = (|| {
        ok(
            &c.kubectl(&[
                "create",
                "secret",
                "generic",
                "github-token",
                "-n",
                NS,
                "--from-literal=token=ghp-local",
            ]),
            "create secret",
        )?;
        for manifest in [
            json!({
                "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer",
                "metadata": {"name": "github", "namespace": NS},
                "spec": {"image": "ghcr.io/example/github-mcp:1", "port": 8080,
                         "hostCredential": {"name": "github-token", "key": "token"}},
            }),
            json!({
                "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Context",
                "metadata": {"name": "dev", "namespace": NS},
                "spec": {"mcpServers": [{"name": "github"}],
                         "hostSelector": {"matchLabels": {"mcp-runtime.dev/host": "dev-host"}}},
            }),
            json!({
                "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
                "metadata": {"name": "dev-host", "namespace": NS},
                "spec": {"contextRef": {"name": "dev"}, "image": "ghcr.io/example/agent-host:1"},
            }),
        ] {
            apply(c, &manifest)?;
        }
        let token = host_token(c, "dev-host")?;

        // The API answers from watch caches: polled until they hold the new objects.
        let mut reply = (0, String::new());
        for _ in 0..50 {
            reply = call(c, &base, &token, None)?;
            if reply.0 == 200 && reply.1.contains(r#""name":"github""#) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let (code, body) = reply;
        ensure!(code == 200, "inventory: {code} {body}");
        let inventory: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let names: Vec<&str> = inventory["items"]
            .as_array()
            .ok_or(format!("no items: {body}"))?
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect();
        ensure!(names == ["github"], "inventory lists {names:?}: {body}");
        ensure!(
            !body.contains("github-token"),
            "the inventory names the Secret: {body}"
        );

        // The host's session for github is the Host operator's: polled until it is issued.
        let credential = format!("{base}/credential");
        let mut answer = (0, String::new());
        for _ in 0..50 {
            answer = call(c, &credential, &token, Some(r#"{"serverName":"github"}"#))?;
            if answer.0 == 200 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let (code, body) = answer;
        ensure!(code == 200, "credential: {code} {body}");
        let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        ensure!(
            answer["token"] == "ghp-local" && answer["session"]["token"].is_string(),
            "credential answer: {body}"
        );

        // One flipped character of the signature: the same token is refused.
        let mut forged = token.clone().into_bytes();
        let last = forged.len() - 2;
        forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).map_err(|e| e.to_string())?;
        let (code, body) = call(c, &base, &forged, None)?;
        ensure!(code == 401, "a forged signature got {code} {body}");

        // A client that completes the TLS handshake and then sends nothing does not keep its
        // connection (and one of the API's connection slots): it is closed within seconds.
        let started = std::time::Instant::now();
        let idle = Command::new("timeout")
            .args(["60", "openssl", "s_client", "-quiet"])
            .args(["-connect", &format!("127.0.0.1:{port}")])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("openssl s_client: {e}"))?;
        let held = started.elapsed();
        // At least the 10 s the API grants a first request (so the handshake did complete),
        // and not much more.
        ensure!(
            idle.status.code() != Some(124)
                && held >= std::time::Duration::from_secs(9)
                && held < std::time::Duration::from_secs(20),
            "an idle TLS connection was held {held:?} ({})",
            idle.status
        );
        eprintln!("    an idle TLS connection was closed after {held:.1?}");
        Ok(())
    })();
    // Asked to go while the controllers still run (the MCPServer's retirement finalizer is
    // theirs); not waited for: nothing later reads this namespace.
    let _ = c.kubectl(&["delete", "namespace", NS, "--wait=false"]);
    controllers.stop();
    result
}

/// The runtime-token Secret's token and its annotations.
fn runtime_token(c: &LocalCluster, host: &str) -> Result<Option<(String, Value)>, String> {
    let out = c.kubectl(&[
        "get",
        "secret",
        &format!("{host}-runtime-token"),
        "-n",
        RUNTIME_NS,
        "-o",
        "json",
    ]);
    if !out.success {
        return if out.stderr.contains("NotFound") {
            Ok(None)
        } else {
            Err(out.stderr)
        };
    }
    let secret: Value = serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
    let token = secret["data"]["token"]
        .as_str()
        .and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(b).ok()
        })
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok_or("no token in the runtime-token Secret")?;
    Ok(Some((token, secret["metadata"]["annotations"].clone())))
}

const RUNTIME_NS: &str = "host-runtime";

/// Issue 33 item 3: the operator keeps each Host's runtime token (RS256, the claims the Host API
/// checks) in Secret `<host>-runtime-token`, mounts it into the host pod, refreshes it
/// `--host-runtime-token-refresh-before` ahead of its expiry, and re-mints it for a re-created
/// Host, whose old token the Host API then refuses; `RuntimeTokenReady` says so.
pub(super) fn runtime_token_kept_for_each_host(c: &mut LocalCluster) -> Result<(), String> {
    let ns = RUNTIME_NS;
    create_namespace(c, ns)?;
    let mut args = c.host_api_args().map_err(|e| format!("{e:#}"))?;
    args.extend(c.runtime_token_args().map_err(|e| format!("{e:#}"))?);
    // A 40 s token refreshed 30 s ahead: a new one every ~10 s.
    args.extend([
        "--host-runtime-token-ttl=40s".to_string(),
        "--host-runtime-token-refresh-before=30s".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut controllers = start(c, "host-runtime", "host-runtime", &args)?;
    let port = controllers.host_api_port.ok_or("no Host API port")?;
    let base = format!("https://127.0.0.1:{port}/api/v2/hosts/self/mcpservers");
    let host = json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
        "metadata": {"name": "dev-host", "namespace": ns},
        "spec": {"contextRef": {"name": "dev"}, "image": "ghcr.io/example/agent-host:1"},
    });
    let result =
        (|| {
            apply(
                c,
                &json!({
                    "apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Context",
                    "metadata": {"name": "dev", "namespace": ns},
                    "spec": {"mcpServers": [],
                             "hostSelector": {"matchLabels": {"mcp-runtime.dev/host": "dev-host"}}},
                }),
            )?;
            apply(c, &host)?;
            let uid = super::controllers::until(
                std::time::Duration::from_secs(30),
                "the runtime token",
                || {
                    Ok(runtime_token(c, "dev-host")?.and_then(|(_, a)| {
                        a["mcp-runtime.dev/host-uid"].as_str().map(str::to_string)
                    }))
                },
            )?;
            let (first, _) = runtime_token(c, "dev-host")?.ok_or("the Secret went")?;
            let (code, body) = call(c, &base, &first, None)?;
            ensure!(code == 200, "the runtime token's inventory: {code} {body}");
            let cond =
                super::controllers::until(
                    std::time::Duration::from_secs(30),
                    "RuntimeTokenReady",
                    || {
                        let out = c.kubectl(&[
                    "get", "host", "dev-host", "-n", ns, "-o",
                    "jsonpath={.status.conditions[?(@.type==\"RuntimeTokenReady\")].status}",
                ]);
                        Ok((out.stdout.trim() == "True").then_some(()))
                    },
                );
            cond?;
            // Mounted into the host pod, in the host container, read-only.
            let deployment = ok(
                &c.kubectl(&["get", "deployment", "dev-host", "-n", ns, "-o", "json"]),
                "get deployment",
            )?;
            let d: Value = serde_json::from_str(&deployment).map_err(|e| e.to_string())?;
            let pod = &d["spec"]["template"]["spec"];
            ensure!(
                pod["volumes"].as_array().is_some_and(|v| v
                    .iter()
                    .any(|v| v["secret"]["secretName"] == "dev-host-runtime-token"))
                    && pod["containers"][0]["volumeMounts"]
                        .as_array()
                        .is_some_and(|m| m
                            .iter()
                            .any(|m| m["mountPath"] == "/var/run/secrets/mcp-host-runtime"
                                && m["readOnly"] == true)),
                "the runtime token is not mounted: {pod}"
            );

            // Refreshed ahead of expiry: a new token, the Host API takes it.
            let refreshed = super::controllers::until(
                std::time::Duration::from_secs(30),
                "a refreshed token",
                || {
                    Ok(runtime_token(c, "dev-host")?
                        .map(|(t, _)| t)
                        .filter(|t| *t != first))
                },
            )?;
            let (code, body) = call(c, &base, &refreshed, None)?;
            ensure!(code == 200, "the refreshed token: {code} {body}");

            // Re-created under the same name: a new token for the new UID; the old one is refused.
            ok(
                &c.kubectl(&[
                    "delete",
                    "host",
                    "dev-host",
                    "-n",
                    ns,
                    "--wait=true",
                    "--timeout=60s",
                ]),
                "delete the Host",
            )?;
            apply(c, &host)?;
            // The old Host's children (owner references to the old UID) hold the names until the
            // garbage collector removes them; the operator retries every 10 s meanwhile.
            let renewed = super::controllers::until(
                std::time::Duration::from_secs(90),
                "the re-created Host's token",
                || {
                    Ok(runtime_token(c, "dev-host")?.and_then(|(t, a)| {
                        (a["mcp-runtime.dev/host-uid"].as_str() != Some(uid.as_str())).then_some(t)
                    }))
                },
            )?;
            let (code, body) = call(c, &base, &refreshed, None)?;
            ensure!(
                code == 401,
                "the old Host's token after re-creation: {code} {body}"
            );
            let (code, body) = call(c, &base, &renewed, None)?;
            ensure!(code == 200, "the re-created Host's token: {code} {body}");
            Ok(())
        })();
    let result = result.map_err(|e| {
        format!(
            "{e}\n--- controllers ---\n{}\n--- secrets ---\n{}\n--- host ---\n{}",
            e2e::mcp::tail(&controllers.log, 20),
            c.kubectl(&["get", "secrets", "-n", ns, "--show-labels"])
                .stdout,
            c.kubectl(&[
                "get",
                "host",
                "dev-host",
                "-n",
                ns,
                "-o",
                "jsonpath={.status}"
            ])
            .stdout
        )
    });
    let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    controllers.stop();
    result
}
