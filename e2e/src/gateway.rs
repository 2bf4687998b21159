//! Gateway fixtures: an MCPServer with the workload chain a gateway runs in (Deployment →
//! ReplicaSet → Pod, created by kube-controller-manager; Pods stay Pending without a
//! kubelet, which is all the chain needs) and the Pod-bound tokens gateways present to the
//! sync listener.

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
    /// `owner` (`(apiVersion, kind, name, uid)`) when given, and waits for its ReplicaSet
    /// and Pod: (deployment uid, replicaset name, replicaset uid, pod name, pod uid).
    pub fn create_gateway_deployment(
        &self,
        namespace: &str,
        name: &str,
        sa: &str,
        owner: Option<(&str, &str, &str, &str)>,
    ) -> Result<(String, String, String, String, String)> {
        self.apply(&serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": namespace},
        }))?;
        let mut metadata = serde_json::json!({"name": name, "namespace": namespace});
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
                    "metadata": {"labels": {"app": name}},
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

    /// An MCPServer `server` with a gateway Deployment `<server>-gateway` it controls, run
    /// as service account `<server>-gateway`, and the ReplicaSet and Pod of that Deployment.
    pub fn create_gateway_chain(&self, namespace: &str, server: &str) -> Result<GatewayChain> {
        let server_uid = self.create_mcpserver(namespace, server)?;
        let name = format!("{server}-gateway");
        let (deployment_uid, replicaset, replicaset_uid, pod, pod_uid) = self
            .create_gateway_deployment(
                namespace,
                &name,
                &name,
                Some(("mcp-runtime.dev/v1alpha1", "MCPServer", server, &server_uid)),
            )?;
        Ok(GatewayChain {
            namespace: namespace.to_string(),
            server: server.to_string(),
            server_uid,
            service_account: name.clone(),
            deployment: name,
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
/// listener: the process, its port on 127.0.0.1, its token file and its log.
pub struct SpawnedAuthz {
    pub child: std::process::Child,
    pub port: u16,
    pub token_file: std::path::PathBuf,
    pub log: std::path::PathBuf,
}

/// Starts `mcp-access-authz` as gateway `name` with the Pod-bound `token` (written to
/// `DIR/authz-<name>/token`), listening on a free port of 127.0.0.1, logging to
/// `logs/authz-<name>.log`, with `extra` flags. Readiness is the caller's to wait for.
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
    let port = crate::free_port()?;
    let child = Command::new(&bin)
        .args(["--sync-url", &c.sync_url()])
        .arg("--ca-file")
        .arg(c.sync_ca())
        .arg("--token-file")
        .arg(&token_file)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env_remove("SESSION_SYNC_STALE_WINDOW")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {bin}"))?;
    Ok(SpawnedAuthz {
        child,
        port,
        token_file,
        log,
    })
}
