//! The shipped `deploy/` kustomizations against the local cluster's kube-apiserver: every
//! object they render is accepted by a server-side dry run (schemas, defaulting, admission),
//! and every container of this project's images is started with arguments its binary parses.
//! Nothing else reads `deploy/base/deployment.yaml` or `deploy/controllers/deployment.yaml`
//! (the e2e cluster runs the binaries as local processes), so a flag renamed in a binary's
//! CLI and not in the manifests would otherwise ship a Pod that crash-loops on a usage error.
//!
//! `deploy/monitoring` is left out: its PrometheusRule needs prometheus-operator's CRD, which
//! this cluster does not have (promtool checks its rules, see `monitoring.rs`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::LocalCluster;
use serde_json::Value;

use super::ok;

/// The kustomizations a cluster installs (docs/operations.md); `base` includes crds and rbac.
const KUSTOMIZATIONS: &[&str] = &["deploy/base", "deploy/controllers"];

/// How long a binary may run before it counts as having parsed its arguments: clap's usage
/// errors come before anything else the process does.
const PARSE_WINDOW: Duration = Duration::from_secs(5);

/// `kubectl apply -k DIR --dry-run=MODE -o json`: the objects as the server (or the client)
/// would store them.
fn dry_run(c: &LocalCluster, dir: &str, mode: &str) -> Result<Vec<Value>, String> {
    let path = e2e::repo_root().join(dir).display().to_string();
    let dry = format!("--dry-run={mode}");
    let out = c.kubectl(&["apply", "-k", &path, &dry, "-o", "json"]);
    let text = ok(&out, &format!("kubectl apply -k {dir} {dry}"))?;
    let rendered: Value =
        serde_json::from_str(&text).map_err(|e| format!("{dir}: not JSON ({e}): {text:.300}"))?;
    Ok(match rendered["kind"].as_str() {
        Some("List") => rendered["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![rendered],
    })
}

/// Every kustomization is accepted by kube-apiserver as it stands (server-side dry run: the
/// objects are validated, defaulted and admitted, nothing is stored).
pub fn apply_with_server_dry_run(c: &mut LocalCluster) -> Result<(), String> {
    for dir in KUSTOMIZATIONS {
        let objects = dry_run(c, dir, "server")?;
        let kinds: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect();
        ensure!(
            kinds.iter().any(|k| k.starts_with("Deployment/")),
            "{dir}: no Deployment in the dry run: {kinds:?}"
        );
        eprintln!("{dir}: server dry run accepted {} objects", objects.len());
    }
    Ok(())
}

/// A container of this project: which binary, and the process it would run.
struct Container {
    what: String,
    binary_env: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// The value a Pod would see for an `env` entry: its literal value, or for a reference to a
/// Secret, ConfigMap or field (which this test does not have) a stand-in of the same shape.
fn env_value(entry: &Value) -> String {
    if let Some(value) = entry["value"].as_str() {
        return value.to_string();
    }
    let name = entry["name"].as_str().unwrap_or_default();
    if name.ends_with("_URL") {
        "postgres://stand-in@127.0.0.1:1/stand-in".into()
    } else if name.ends_with("NAMESPACE") {
        "mcp-access".into()
    } else {
        format!("stand-in-{}", name.to_lowercase())
    }
}

/// Kubernetes' `$(VAR)` expansion of command and args from the container's env
/// (`$$` escapes; an unknown variable is left as written).
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(close) = tail.strip_prefix("$(").and_then(|t| t.find(')')) {
            let name = &tail[2..2 + close];
            match env.iter().rev().find(|(n, _)| n == name) {
                Some((_, value)) => out.push_str(value),
                None => out.push_str(&tail[..close + 3]),
            }
            rest = &tail[close + 3..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// This project's containers in rendered objects: those whose image is `…/mcp-access-NAME`,
/// run by the binary `$MCP_ACCESS_NAME_BIN`.
fn project_containers(objects: &[Value]) -> Vec<Container> {
    let mut found = Vec::new();
    for object in objects {
        let spec = &object["spec"]["template"]["spec"];
        let containers = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| spec[k].as_array().cloned().unwrap_or_default());
        for container in containers {
            let image = container["image"].as_str().unwrap_or_default();
            let repository = image.rsplit('/').next().unwrap_or_default();
            let repository = repository.split([':', '@']).next().unwrap_or_default();
            let Some(name) = repository.strip_prefix("mcp-access-") else {
                continue;
            };
            let env: Vec<(String, String)> = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or_default().to_string(),
                        env_value(e),
                    )
                })
                .collect();
            let strings = |key: &str| -> Vec<String> {
                container[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|a| expand(a, &env))
                    .collect()
            };
            // A `command` replaces the image's entrypoint, the binary itself: its first
            // element is the binary, the rest are arguments before `args`.
            let mut args: Vec<String> = strings("command").into_iter().skip(1).collect();
            args.extend(strings("args"));
            found.push(Container {
                what: format!(
                    "{}/{} container {}",
                    object["kind"].as_str().unwrap_or("?"),
                    object["metadata"]["name"].as_str().unwrap_or("?"),
                    container["name"].as_str().unwrap_or("?")
                ),
                binary_env: format!("MCP_ACCESS_{}_BIN", name.to_uppercase().replace('-', "_")),
                args,
                env,
            });
        }
    }
    found
}

/// How a binary ended within [`PARSE_WINDOW`] (`None`: still running) and its stderr.
fn run_briefly(binary: &str, c: &Container) -> Result<(Option<i32>, String), String> {
    let mut cmd = Command::new(binary);
    cmd.args(&c.args)
        // The Pod's environment only: the test's own MCP_ACCESS_* must not stand in for it.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: cannot run {binary}: {e}", c.what))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if started.elapsed() >= PARSE_WINDOW {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    Ok((status.and_then(|s| s.code()), stderr))
}

/// Each container of this project's images, with its rendered args and env (references
/// replaced by stand-ins), is started from the binary the tests built: none exits with a
/// usage error (clap: exit code 2). A later failure (no TLS files, no cluster, no database
/// here) is expected and fine — it comes after the arguments were parsed.
pub fn container_args_parse(c: &mut LocalCluster) -> Result<(), String> {
    let mut checked = Vec::new();
    for dir in KUSTOMIZATIONS {
        let objects = dry_run(c, dir, "server")?;
        for container in project_containers(&objects) {
            let binary = std::env::var(&container.binary_env).map_err(|_| {
                format!(
                    "{}: no {} (set by hack/test.sh) for its image",
                    container.what, container.binary_env
                )
            })?;
            ensure!(
                !container.args.is_empty(),
                "{}: no args rendered",
                container.what
            );
            let (code, stderr) = run_briefly(&binary, &container)?;
            let usage_error =
                code == Some(2) && (stderr.contains("error:") || stderr.contains("Usage:"));
            ensure!(
                !usage_error,
                "{}: `{} {}` is a usage error:\n{stderr}",
                container.what,
                binary,
                container.args.join(" ")
            );
            eprintln!(
                "{}: {} arguments parsed ({})",
                container.what,
                container.args.len(),
                match code {
                    None => "still running after the parse window".to_string(),
                    Some(code) => format!(
                        "then exited {code}: {}",
                        stderr.lines().last().unwrap_or_default()
                    ),
                }
            );
            checked.push(container.binary_env);
        }
    }
    for wanted in ["MCP_ACCESS_APISERVER_BIN", "MCP_ACCESS_CONTROLLERS_BIN"] {
        ensure!(
            checked.iter().any(|c| c == wanted),
            "no container of the binary of {wanted} in {KUSTOMIZATIONS:?}: {checked:?}"
        );
    }
    Ok(())
}
