//! The gateway sync listener end to end: a gateway Pod's bound token, the live owner chain
//! through kube-apiserver's objects (created by kube-controller-manager), the server scope,
//! and an open watch ended once the chain breaks.

use std::time::{Duration, Instant};

use e2e::gateway::GatewayChain;
use e2e::LocalCluster;
use serde_json::Value;

use super::{create_namespace, ok, session_yaml};

const NS: &str = "e2e-gw-sync";
const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions";

/// HTTPS to the sync listener, trusting its CA.
pub struct Sync {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Sync {
    pub fn new(c: &LocalCluster) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = std::fs::read(c.sync_ca()).map_err(|e| e.to_string())?;
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).map_err(|e| e.to_string())?])
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            rt,
            client,
            base: c.sync_url(),
        })
    }

    /// `method path` with a bearer token: status code and JSON body.
    pub fn send(&self, method: &str, token: &str, path: &str) -> Result<(u16, Value), String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body("{}");
        self.rt.block_on(async {
            let response = request
                .send()
                .await
                .map_err(|e| format!("{method} {path}: {e}"))?;
            let code = response.status().as_u16();
            Ok((code, response.json().await.unwrap_or(Value::Null)))
        })
    }

    pub fn get(&self, token: &str, path: &str) -> Result<(u16, Value), String> {
        self.send("GET", token, path)
    }

    /// Opens a watch on `path`; returns once the response headers arrived.
    pub fn open_watch(&self, token: &str, path: &str) -> Result<reqwest::Response, String> {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(600));
        self.rt.block_on(async {
            let response = request.send().await.map_err(|e| e.to_string())?;
            if response.status() != 200 {
                return Err(format!("watch answered {}", response.status()));
            }
            Ok(response)
        })
    }

    /// Reads a watch until it ends or `limit` passes: whether it ended, and the event lines.
    pub fn read_until_end(
        &self,
        response: &mut reqwest::Response,
        limit: Duration,
    ) -> (bool, Vec<Value>) {
        let deadline = Instant::now() + limit;
        let mut buffer = Vec::new();
        let ended = self.rt.block_on(async {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, response.chunk()).await {
                    Ok(Ok(Some(chunk))) => buffer.extend_from_slice(&chunk),
                    Ok(Ok(None)) | Ok(Err(_)) => return true,
                    Err(_) => return false,
                }
            }
        });
        let events = buffer
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect();
        (ended, events)
    }
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

fn chain(c: &LocalCluster, server: &str) -> Result<(GatewayChain, String), String> {
    let chain = c
        .create_gateway_chain(NS, server)
        .map_err(|e| format!("{e:#}"))?;
    let token = c.gateway_token(&chain).map_err(|e| format!("{e:#}"))?;
    Ok((chain, token))
}

/// A gateway lists, gets and watches its own server's sessions and nothing else; writes are
/// 405; its watch ends soon after its Deployment is deleted, and the token is then 401.
pub fn gateway_sync_serves_its_own_server(c: &mut LocalCluster) -> Result<(), String> {
    create_namespace(c, NS)?;
    let (alpha, alpha_token) = chain(c, "alpha")?;
    let (beta, _) = chain(c, "beta")?;
    for (name, uid) in [("alpha-1", &alpha.server_uid), ("beta-1", &beta.server_uid)] {
        ok(
            &c.kubectl_as(
                &c.kubeconfig,
                &["create", "-n", NS, "-f", "-"],
                Some(&session_yaml(name, uid)),
            ),
            "create session",
        )?;
    }
    let sync = Sync::new(c)?;

    let (code, list) = sync.get(&alpha_token, SESSIONS)?;
    if code != 200 || names(&list) != ["alpha-1"] {
        return Err(format!("list of every namespace: {code} {list}"));
    }
    let ns_path = format!("/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{NS}/accesssessions");
    let (code, _) = sync.get(&alpha_token, &format!("{ns_path}/alpha-1"))?;
    if code != 200 {
        return Err(format!("get of its own session: {code}"));
    }
    let (code, body) = sync.get(&alpha_token, &format!("{ns_path}/beta-1"))?;
    if code != 404 || body["reason"] != "NotFound" {
        return Err(format!("get of another server's session: {code} {body}"));
    }
    let (code, body) = sync.send("POST", &alpha_token, &ns_path)?;
    if code != 405 {
        return Err(format!("create on the sync listener: {code} {body}"));
    }

    // The watch is up; the chain breaks; the watch ends within the re-verification period
    // (2 s in these tests) plus the time to notice.
    let mut watch = sync.open_watch(&alpha_token, &format!("{SESSIONS}?watch=true"))?;
    let (ended, events) = sync.read_until_end(&mut watch, Duration::from_secs(3));
    if ended || events.len() != 1 || events[0]["object"]["metadata"]["name"] != "alpha-1" {
        return Err(format!(
            "the watch before the chain broke: ended={ended} {events:?}"
        ));
    }
    ok(
        &c.kubectl(&["delete", "deployment", &alpha.deployment, "-n", NS]),
        "delete the gateway's deployment",
    )?;
    let started = Instant::now();
    let (ended, _) = sync.read_until_end(&mut watch, Duration::from_secs(20));
    if !ended {
        return Err("the watch outlived its broken chain by 20 s".into());
    }
    eprintln!(
        "    watch ended {:.1}s after the deployment was deleted",
        started.elapsed().as_secs_f64()
    );
    let (code, body) = sync.get(&alpha_token, SESSIONS)?;
    if code != 401 || body["reason"] != "Unauthorized" {
        return Err(format!("a token of a broken chain: {code} {body}"));
    }
    Ok(())
}
