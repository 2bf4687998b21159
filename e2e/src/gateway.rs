//! Gateway fixtures: an MCPServer with the workload chain a gateway runs in (Deployment →
//! ReplicaSet → Pod, created by kube-controller-manager; Pods stay Pending without a
//! kubelet, which is all the chain needs) and the Pod-bound tokens gateways present to the
//! sync listener. The chain is the one `mcp-access-controllers` would build (the Deployment
//! named after the server with the controllers' labels, its Pod run as `<server>-gateway`):
//! the sync listener accepts no other.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::LocalCluster;

/// The audience of a gateway's projected token.
pub const GATEWAY_AUDIENCE: &str = "mcp-runtime-gateway";

/// An MCPServer and the live chain of its gateway Pod.
#[derive(Clone, Debug)]
pub struct GatewayChain {
    pub namespace: String,
    pub server: String,
    pub server_uid: String,
    pub service_account: String,
    pub deployment: String,
    pub deployment_uid: String,
    pub replicaset: String,
    pub replicaset_uid: String,
    pub pod: String,
    pub pod_uid: String,
}

/// The labels `mcp-access-controllers` puts on a server's workload (and which the sync
/// listener requires of its gateway's Deployment).
pub const MANAGED_BY_LABEL: &str = "mcp-runtime.dev/managed-by";
pub const MANAGED_BY: &str = "mcp-access-controllers";
pub const SERVER_LABEL: &str = "mcp-runtime.dev/mcpserver";

/// The ServiceAccount the controllers run server `server`'s gateway Pod as.
pub fn gateway_service_account(server: &str) -> String {
    format!("{server}-gateway")
}

/// How long kube-controller-manager gets to create a ReplicaSet or a Pod.
const CHAIN_TIMEOUT: Duration = Duration::from_secs(60);

impl LocalCluster {
    fn kubectl_json(&self, args: &[&str]) -> Result<Value> {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        let out = self.kubectl(&full);
        if !out.success {
            bail!("kubectl {} failed: {}", args.join(" "), out.stderr);
        }
        Ok(serde_json::from_str(&out.stdout)?)
    }

    fn apply(&self, manifest: &Value) -> Result<Value> {
        let out = self.kubectl_as(
            &self.kubeconfig,
            &["apply", "-o", "json", "-f", "-"],
            Some(&manifest.to_string()),
        );
        if !out.success {
            bail!("kubectl apply failed: {}", out.stderr);
        }
        Ok(serde_json::from_str(&out.stdout)?)
    }

    /// Creates the MCPServer `server` in `namespace` (which must exist).
    pub fn create_mcpserver(&self, namespace: &str, server: &str) -> Result<String> {
        let created = self.apply(&serde_json::json!({
            "apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer",
            "metadata": {"name": server, "namespace": namespace},
            "spec": {"image": "registry.invalid/mcp/echo:1", "port": 8080},
        }))?;
        uid(&created)
    }

    /// Creates a Deployment `name` whose Pods run as service account `sa`, controlled by
    /// `owner` (`(apiVersion, kind, name, uid)`) when given and carrying the controllers'
    /// labels for server `labelled_for` when given, and waits for its ReplicaSet and Pod:
    /// (deployment uid, replicaset name, replicaset uid, pod name, pod uid). The selector is
    /// `app: <name>` alone, so hand-made Deployments never fight over each other's Pods.
    pub fn create_gateway_deployment(
        &self,
        namespace: &str,
        name: &str,
        sa: &str,
        owner: Option<(&str, &str, &str, &str)>,
        labelled_for: Option<&str>,
    ) -> Result<(String, String, String, String, String)> {
        self.apply(&serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": namespace},
        }))?;
        let mut labels = serde_json::json!({"app": name});
        if let Some(server) = labelled_for {
            labels[MANAGED_BY_LABEL] = MANAGED_BY.into();
            labels[SERVER_LABEL] = server.into();
        }
        let mut metadata =
            serde_json::json!({"name": name, "namespace": namespace, "labels": labels});
        if let Some((api_version, kind, owner_name, owner_uid)) = owner {
            metadata["ownerReferences"] = serde_json::json!([{
                "apiVersion": api_version, "kind": kind, "name": owner_name, "uid": owner_uid,
                "controller": true, "blockOwnerDeletion": true,
            }]);
        }
        let deployment = self.apply(&serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": sa,
                        "containers": [{"name": "gateway", "image": "registry.invalid/mcp/gateway:1"}],
                    },
                },
            },
        }))?;
        let deployment_uid = uid(&deployment)?;
        let (rs, rs_uid) = self.wait_owned(namespace, "replicasets", &deployment_uid)?;
        let (pod, pod_uid) = self.wait_owned(namespace, "pods", &rs_uid)?;
        Ok((deployment_uid, rs, rs_uid, pod, pod_uid))
    }

    /// Waits until an object of `resource` controlled by `owner_uid` exists: (name, uid).
    pub fn wait_owned(
        &self,
        namespace: &str,
        resource: &str,
        owner_uid: &str,
    ) -> Result<(String, String)> {
        let deadline = Instant::now() + CHAIN_TIMEOUT;
        loop {
            let list = self.kubectl_json(&["get", resource, "-n", namespace])?;
            let found = list["items"].as_array().into_iter().flatten().find(|item| {
                item["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["uid"] == owner_uid && r["controller"] == true)
                    && item["metadata"]["deletionTimestamp"].is_null()
            });
            if let Some(item) = found {
                let name = item["metadata"]["name"].as_str().unwrap_or_default();
                return Ok((name.to_string(), uid(item)?));
            }
            if Instant::now() > deadline {
                bail!("no {resource} controlled by {owner_uid} in {namespace} after {CHAIN_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The Deployment the controllers make for MCPServer `server` (`server_uid`): named
    /// `server`, labelled as its workload, controlled by it, its Pods run as
    /// `<server>-gateway`. Waits for its ReplicaSet and Pod (as [`Self::create_gateway_deployment`]).
    pub fn create_server_deployment(
        &self,
        namespace: &str,
        server: &str,
        server_uid: &str,
    ) -> Result<(String, String, String, String, String)> {
        self.create_gateway_deployment(
            namespace,
            server,
            &gateway_service_account(server),
            Some(("mcp-runtime.dev/v1alpha1", "MCPServer", server, server_uid)),
            Some(server),
        )
    }

    /// An MCPServer `server` with the gateway workload the controllers would make for it
    /// ([`Self::create_server_deployment`]), and the ReplicaSet and Pod of that Deployment.
    pub fn create_gateway_chain(&self, namespace: &str, server: &str) -> Result<GatewayChain> {
        let server_uid = self.create_mcpserver(namespace, server)?;
        let (deployment_uid, replicaset, replicaset_uid, pod, pod_uid) =
            self.create_server_deployment(namespace, server, &server_uid)?;
        Ok(GatewayChain {
            namespace: namespace.to_string(),
            server: server.to_string(),
            server_uid,
            service_account: gateway_service_account(server),
            deployment: server.to_string(),
            deployment_uid,
            replicaset,
            replicaset_uid,
            pod,
            pod_uid,
        })
    }

    /// A token of service account `sa` (`kubectl create token`), with `audience` (kube's
    /// default audiences when None) and bound to Pod `(name, uid)` when given.
    pub fn service_account_token(
        &self,
        namespace: &str,
        sa: &str,
        audience: Option<&str>,
        pod: Option<(&str, &str)>,
    ) -> Result<String> {
        let mut args = vec!["create", "token", sa, "-n", namespace, "--duration=1h"];
        if let Some(audience) = audience {
            args.extend(["--audience", audience]);
        }
        if let Some((name, uid)) = pod {
            args.extend([
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                name,
                "--bound-object-uid",
                uid,
            ]);
        }
        let out = self.kubectl(&args);
        if !out.success {
            bail!("kubectl create token failed: {}", out.stderr);
        }
        Ok(out.stdout.trim().to_string())
    }

    /// The token a gateway of `chain` presents: audience [`GATEWAY_AUDIENCE`], bound to its
    /// Pod.
    pub fn gateway_token(&self, chain: &GatewayChain) -> Result<String> {
        self.service_account_token(
            &chain.namespace,
            &chain.service_account,
            Some(GATEWAY_AUDIENCE),
            Some((&chain.pod, &chain.pod_uid)),
        )
    }
}

fn uid(object: &Value) -> Result<String> {
    object["metadata"]["uid"]
        .as_str()
        .map(str::to_string)
        .context("object without a uid")
}

/// A started `mcp-access-authz` sidecar (binary `MCP_ACCESS_AUTHZ_BIN`) on the cluster's sync
/// listener: the process, its check and admin ports on 127.0.0.1, its token file and its log.
pub struct SpawnedAuthz {
    pub child: std::process::Child,
    /// The check listener (`--listen`): every path is a check.
    pub port: u16,
    /// The admin listener (`--admin-listen`): `/readyz`, `/metrics`, the `/v1/` long-poll.
    pub admin_port: u16,
    pub token_file: std::path::PathBuf,
    pub log: std::path::PathBuf,
}

/// Starts `mcp-access-authz` as gateway `name` with the Pod-bound `token` (written to
/// `DIR/authz-<name>/token`), its check and admin listeners on port 0 of 127.0.0.1 (the ports
/// bound are read from its stderr),
/// logging to `logs/authz-<name>.log`, with `extra` flags (which must choose how a check names
/// its session: `--public-url` or `--trust-session-header`). Readiness is the caller's to wait
/// for.
pub fn spawn_authz(
    c: &LocalCluster,
    name: &str,
    token: &str,
    extra: &[&str],
) -> Result<SpawnedAuthz> {
    use std::process::{Command, Stdio};
    let bin = std::env::var("MCP_ACCESS_AUTHZ_BIN")
        .context("MCP_ACCESS_AUTHZ_BIN is not set: run through hack/test.sh")?;
    let dir = c.dir.join(format!("authz-{name}"));
    std::fs::create_dir_all(&dir)?;
    let token_file = dir.join("token");
    std::fs::write(&token_file, token)?;
    std::fs::create_dir_all(c.dir.join("logs"))?;
    let log = c.dir.join(format!("logs/authz-{name}.log"));
    let out = std::fs::File::create(&log)?;
    let err = out.try_clone()?;
    let mut child = Command::new(&bin)
        .args(["--sync-url", &c.sync_url()])
        .arg("--ca-file")
        .arg(c.sync_ca())
        .arg("--token-file")
        .arg(&token_file)
        // Port 0: the process says which ports it bound.
        .args(["--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("SESSION_SYNC_STALE_WINDOW")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {bin}"))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let ports = crate::listening::follow("mcp-access-authz", stderr, err)
        .ports(&["check", "admin"], crate::listening::LISTEN_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{e}; see {}", log.display()))?;
    let (port, admin_port) = (ports[0], ports[1]);
    Ok(SpawnedAuthz {
        child,
        port,
        admin_port,
        token_file,
        log,
    })
}
