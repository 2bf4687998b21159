//! The desired state of one MCPServer's workload: a pure function of the MCPServer and the
//! controller's settings, built as the JSON that server-side apply sends (and that the
//! compare-before-apply check reads), so it is snapshot-tested without a cluster.

use apis::runtime::{MCPServer, Transport};
use serde_json::{json, Value};

use crate::children::{child_metadata, name_of, namespace_of, Child, ChildKind, Incomplete};
use crate::children::{MANAGED_BY, MANAGED_BY_LABEL};

/// Label naming the MCPServer an object belongs to.
pub const SERVER_LABEL: &str = "mcp-runtime.dev/mcpserver";
/// Audience of the gateway's projected token: what the 8085 sync listener accepts.
pub const GATEWAY_AUDIENCE: &str = "mcp-runtime-gateway";
/// Name of the gateway container (`mcp-access-gateway`, the enforcing proxy).
pub const GATEWAY_CONTAINER: &str = "gateway";
/// Name of the gateway container's port: the Service targets it, the probes ask it, and it is
/// the only port of the Pod that any policy opens.
pub const GATEWAY_PORT_NAME: &str = "gateway";
/// The gateway's readiness path (ready after its first complete sync of sessions).
pub const GATEWAY_READY_PATH: &str = "/readyz";
/// Name of the MCP server container.
pub const SERVER_CONTAINER: &str = "mcp";
/// Where the gateway container finds its token and the sync CA (one projected volume).
pub const GATEWAY_MOUNT: &str = "/var/run/secrets/mcp-access";
/// Name of that volume.
pub const GATEWAY_VOLUME: &str = "mcp-access";
/// The stdio bridge as the gateway image holds it: `transport: stdio` servers copy it from
/// there (an init container) into their own container, `remote` servers run it as their proxy.
pub const BRIDGE_BINARY: &str = "/usr/local/bin/mcp-access-stdio-bridge";
/// Name of the init container that copies the bridge, and of the emptyDir it copies into.
pub const BRIDGE_INSTALL: &str = "stdio-bridge";
/// Where that emptyDir is mounted (read-only in the MCP container).
pub const BRIDGE_MOUNT: &str = "/mcp-access-bridge";
/// The loopback port of a `remote` server's egress proxy (the gateway's upstream).
pub const REMOTE_PROXY_PORT: i32 = 8080;

/// What the controller was configured with (flags), as the builder needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSettings {
    /// Image of the `mcp-access-gateway` proxy.
    pub gateway_image: String,
    /// The apiserver's gateway sync URL (its 8085 Service), `https://` only.
    pub sync_url: String,
    /// PEM bundle of the CA that signed the sync listener's certificate: copied into a
    /// ConfigMap per server (pods can only mount ConfigMaps of their own namespace).
    pub sync_ca_pem: String,
    /// Port the gateway listens on (all Pod addresses): the Service targets it and it is the
    /// Pod's only exposed port.
    pub gateway_port: i32,
    /// Lifetime asked for the projected token (the kubelet rotates it at 80 %).
    pub token_expiration_seconds: i64,
}

/// Names of an MCPServer's children.
pub fn service_account_name(server: &str) -> String {
    format!("{server}-gateway")
}
pub fn ca_config_map_name(server: &str) -> String {
    format!("{server}-gateway-ca")
}

/// The resource URI of a server's gateway: its Service URL on the gateway port. The gateway
/// takes it as `--public-url`, so session tokens must name it in `aud`; the apiserver's default
/// `--session-token-audience-template` (`http://{server}.{namespace}.svc:8086`) is this URL
/// for the default `--gateway-port`.
pub fn public_url(server: &str, namespace: &str, gateway_port: i32) -> String {
    format!("http://{server}.{namespace}.svc:{gateway_port}")
}

/// The labels every child (and the Pods) carry.
pub fn labels(server: &str) -> Value {
    json!({
        "app": server,
        MANAGED_BY_LABEL: MANAGED_BY,
        SERVER_LABEL: server,
    })
}

fn metadata(server: &MCPServer, name: &str) -> Result<Value, Incomplete> {
    child_metadata(server, name, labels(name_of(server)?))
}

/// The children of `server`, in the order they are applied (the Deployment last: its Pods
/// need the ServiceAccount and the CA ConfigMap).
pub fn children(server: &MCPServer, settings: &WorkloadSettings) -> Result<Vec<Child>, Incomplete> {
    let name = name_of(server)?;
    let namespace = namespace_of(server)?;
    let spec = &server.spec;
    let sa = service_account_name(name);
    let ca = ca_config_map_name(name);

    let service_account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(server, &sa)?,
        // Tokens reach the gateway only through the projected volume below.
        "automountServiceAccountToken": false,
    });
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(server, &ca)?,
        "data": {"ca.crt": settings.sync_ca_pem},
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(server, name)?,
        "spec": {
            "selector": {"app": name, SERVER_LABEL: name},
            "ports": [{
                "name": "gateway",
                "port": settings.gateway_port,
                "targetPort": GATEWAY_PORT_NAME,
                "protocol": "TCP",
            }],
        },
    });

    let mut workload = server_container(server, settings)?;
    let upstream_port = workload.port;
    let gateway_container = json!({
        "name": GATEWAY_CONTAINER,
        "image": settings.gateway_image,
        "args": [
            format!("--sync-url={}", settings.sync_url),
            format!("--ca-file={GATEWAY_MOUNT}/ca.crt"),
            format!("--token-file={GATEWAY_MOUNT}/token"),
            format!("--listen=0.0.0.0:{}", settings.gateway_port),
            format!("--upstream=http://127.0.0.1:{upstream_port}"),
            format!("--public-url={}", public_url(name, namespace, settings.gateway_port)),
        ],
        "ports": [{"name": GATEWAY_PORT_NAME, "containerPort": settings.gateway_port, "protocol": "TCP"}],
        // Out of the Service until its first sync (it would deny everyone anyway) and while
        // its sessions are stale.
        "readinessProbe": {
            "httpGet": {"path": GATEWAY_READY_PATH, "port": GATEWAY_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        // Alive is "answers": a sync outage makes it unready, and a restart would only throw
        // away its last-known-good sessions.
        "livenessProbe": {
            "tcpSocket": {"port": GATEWAY_PORT_NAME},
            "periodSeconds": 20,
            "failureThreshold": 6,
        },
        // The token is mounted here and nowhere else.
        "volumeMounts": [{"name": GATEWAY_VOLUME, "mountPath": GATEWAY_MOUNT, "readOnly": true}],
    });
    workload.volumes.push(json!({
        "name": GATEWAY_VOLUME,
        "projected": {"sources": [
            {"serviceAccountToken": {
                "audience": GATEWAY_AUDIENCE,
                "expirationSeconds": settings.token_expiration_seconds,
                "path": "token",
            }},
            {"configMap": {"name": ca, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]},
    }));
    let mut pod = json!({
        "serviceAccountName": sa,
        "automountServiceAccountToken": false,
        "containers": [workload.container, gateway_container],
        "volumes": workload.volumes,
    });
    if !workload.init_containers.is_empty() {
        pod["initContainers"] = Value::Array(workload.init_containers);
    }
    if !spec.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = json!(spec.image_pull_secrets);
    }
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(server, name)?,
        "spec": {
            "replicas": spec.replicas.unwrap_or(1),
            "selector": {"matchLabels": {"app": name, SERVER_LABEL: name}},
            "template": {
                "metadata": {"labels": labels(name)},
                "spec": pod,
            },
        },
    });

    Ok([
        (ChildKind::ServiceAccount, sa, service_account),
        (ChildKind::ConfigMap, ca, config_map),
        (ChildKind::Service, name.to_string(), service),
        (ChildKind::Deployment, name.to_string(), deployment),
    ]
    .into_iter()
    .map(|(kind, name, body)| Child::new(kind, name, body))
    .collect())
}

/// The part of the Pod that runs the MCP server itself: its container, what it needs first
/// (init containers, volumes), and the loopback port the gateway forwards to.
struct Workload {
    container: Value,
    init_containers: Vec<Value>,
    volumes: Vec<Value>,
    port: i32,
}

/// The MCP container of `server`, by how it speaks MCP:
/// - an image serving HTTP on `spec.port`: the image, its `command`/`args` if given;
/// - `transport: stdio`: the same image, its command run by the stdio bridge, which an init
///   container (the gateway image) copies into an emptyDir first, as Tekton delivers its
///   entrypoint: `<bridge> --listen 127.0.0.1:<port> -- <command> <args>`;
/// - `remote`: the gateway image's bridge as an egress proxy to the URL, on
///   [`REMOTE_PROXY_PORT`], and no image of the server's owners.
fn server_container(
    server: &MCPServer,
    settings: &WorkloadSettings,
) -> Result<Workload, Incomplete> {
    let spec = &server.spec;
    if let Some(remote) = &spec.remote {
        let container = json!({
            "name": SERVER_CONTAINER,
            "image": settings.gateway_image,
            "command": [BRIDGE_BINARY],
            "args": [
                format!("--listen=127.0.0.1:{REMOTE_PROXY_PORT}"),
                format!("--remote={}", remote.url),
            ],
        });
        return Ok(Workload {
            container,
            init_containers: Vec::new(),
            volumes: Vec::new(),
            port: REMOTE_PROXY_PORT,
        });
    }
    let image = spec
        .image
        .as_deref()
        .ok_or_else(|| Incomplete::missing::<MCPServer>("spec.image"))?;
    let port = spec
        .port
        .ok_or_else(|| Incomplete::missing::<MCPServer>("spec.port"))?;
    let env: Vec<Value> = spec
        .env_secret
        .iter()
        .flat_map(|s| {
            s.keys.iter().map(move |key| {
                json!({
                    "name": key,
                    "valueFrom": {"secretKeyRef": {"name": s.name, "key": key}},
                })
            })
        })
        .collect();
    // No declared port: nothing outside the Pod is meant to reach `spec.port`. The gateway
    // reaches it on loopback, and no NetworkPolicy the controllers write opens it.
    let mut container = json!({
        "name": SERVER_CONTAINER,
        "image": image,
    });
    let mut init_containers = Vec::new();
    let mut volumes = Vec::new();
    if spec.transport == Transport::Stdio {
        if spec.command.is_empty() {
            return Err(Incomplete::missing::<MCPServer>("spec.command"));
        }
        let bridge = format!("{BRIDGE_MOUNT}/mcp-access-stdio-bridge");
        let mut args = vec![format!("--listen=127.0.0.1:{port}"), "--".to_string()];
        args.extend(spec.command.iter().chain(&spec.args).cloned());
        container["command"] = json!([bridge]);
        container["args"] = json!(args);
        container["volumeMounts"] =
            json!([{"name": BRIDGE_INSTALL, "mountPath": BRIDGE_MOUNT, "readOnly": true}]);
        init_containers.push(json!({
            "name": BRIDGE_INSTALL,
            "image": settings.gateway_image,
            "command": [BRIDGE_BINARY],
            "args": [format!("--install={bridge}")],
            "volumeMounts": [{"name": BRIDGE_INSTALL, "mountPath": BRIDGE_MOUNT}],
        }));
        volumes.push(json!({"name": BRIDGE_INSTALL, "emptyDir": {}}));
    } else {
        if !spec.command.is_empty() {
            container["command"] = json!(spec.command);
        }
        if !spec.args.is_empty() {
            container["args"] = json!(spec.args);
        }
    }
    if !env.is_empty() {
        container["env"] = Value::Array(env);
    }
    if let Some(resources) = &spec.resources {
        container["resources"] = json!(resources);
    }
    if let Some(policy) = spec.image_pull_policy {
        container["imagePullPolicy"] = json!(policy.as_str());
    }
    Ok(Workload {
        container,
        init_containers,
        volumes,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::{up_to_date, DESIRED_DIGEST};
    use apis::runtime::{EnvSecret, MCPServerSpec};

    fn settings() -> WorkloadSettings {
        WorkloadSettings {
            gateway_image: "ghcr.io/mcp-access/gateway:1".into(),
            sync_url: "https://mcp-access-apiserver.mcp-access.svc:8085".into(),
            sync_ca_pem: "-----BEGIN CERTIFICATE-----\n...\n".into(),
            gateway_port: 8086,
            token_expiration_seconds: 600,
        }
    }

    fn server(env_secret: Option<EnvSecret>) -> MCPServer {
        let mut s = MCPServer::new(
            "github",
            MCPServerSpec {
                allowed_contexts: None,
                image: Some("ghcr.io/acme/github-mcp:2".into()),
                port: Some(8080),
                transport: Transport::StreamableHttp,
                env_secret,
                host_credential: None,
                egress_bindings: Vec::new(),
                network: None,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some("team-a".into());
        s.metadata.uid = Some("0b7a3c2e-1111-2222-3333-444455556666".into());
        s
    }

    fn find(children: &[Child], kind: ChildKind) -> &Value {
        &children
            .iter()
            .find(|c| c.kind == kind)
            .expect("child present")
            .body
    }

    #[test]
    fn deployment_snapshot() {
        let secret = EnvSecret {
            name: "github-env".into(),
            keys: vec!["GITHUB_TOKEN".into()],
        };
        let children = children(&server(Some(secret)), &settings()).unwrap();
        let kinds: Vec<_> = children.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                ChildKind::ServiceAccount,
                ChildKind::ConfigMap,
                ChildKind::Service,
                ChildKind::Deployment
            ]
        );
        let mut deployment = find(&children, ChildKind::Deployment).clone();
        let digest = deployment["metadata"]["annotations"][DESIRED_DIGEST].clone();
        assert_eq!(digest.as_str().map(str::len), Some(64));
        deployment["metadata"]["annotations"] = Value::Null;
        let want = json!({
          "apiVersion": "apps/v1", "kind": "Deployment",
          "metadata": {
            "name": "github", "namespace": "team-a", "annotations": null,
            "labels": {"app": "github", "mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/mcpserver": "github"},
            "ownerReferences": [{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "MCPServer", "name": "github",
              "uid": "0b7a3c2e-1111-2222-3333-444455556666", "controller": true, "blockOwnerDeletion": true}]
          },
          "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "github", "mcp-runtime.dev/mcpserver": "github"}},
            "template": {
              "metadata": {"labels": {"app": "github", "mcp-runtime.dev/managed-by": "mcp-access-controllers", "mcp-runtime.dev/mcpserver": "github"}},
              "spec": {
                "serviceAccountName": "github-gateway",
                "automountServiceAccountToken": false,
                "containers": [
                  {"name": "mcp", "image": "ghcr.io/acme/github-mcp:2",
                   "env": [{"name": "GITHUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "github-env", "key": "GITHUB_TOKEN"}}}]},
                  {"name": "gateway", "image": "ghcr.io/mcp-access/gateway:1",
                   "args": ["--sync-url=https://mcp-access-apiserver.mcp-access.svc:8085",
                            "--ca-file=/var/run/secrets/mcp-access/ca.crt",
                            "--token-file=/var/run/secrets/mcp-access/token",
                            "--listen=0.0.0.0:8086",
                            "--upstream=http://127.0.0.1:8080",
                            "--public-url=http://github.team-a.svc:8086"],
                   "ports": [{"name": "gateway", "containerPort": 8086, "protocol": "TCP"}],
                   "readinessProbe": {"httpGet": {"path": "/readyz", "port": "gateway"},
                                      "periodSeconds": 5, "failureThreshold": 3},
                   "livenessProbe": {"tcpSocket": {"port": "gateway"},
                                     "periodSeconds": 20, "failureThreshold": 6},
                   "volumeMounts": [{"name": "mcp-access", "mountPath": "/var/run/secrets/mcp-access", "readOnly": true}]}
                ],
                "volumes": [{"name": "mcp-access", "projected": {"sources": [
                  {"serviceAccountToken": {"audience": "mcp-runtime-gateway", "expirationSeconds": 600, "path": "token"}},
                  {"configMap": {"name": "github-gateway-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                ]}}]
              }
            }
          }
        });
        assert_eq!(deployment, want, "{deployment:#}");
    }

    #[test]
    fn token_is_mounted_only_in_the_gateway_container() {
        let children = children(&server(None), &settings()).unwrap();
        let pod = &find(&children, ChildKind::Deployment)["spec"]["template"]["spec"];
        for c in pod["containers"].as_array().unwrap() {
            let mounts = c["volumeMounts"].as_array().map(Vec::len).unwrap_or(0);
            if c["name"] == GATEWAY_CONTAINER {
                assert_eq!(mounts, 1);
            } else {
                assert_eq!(mounts, 0, "{c}");
                assert!(c.get("env").is_none(), "no env without envSecret");
            }
        }
    }

    #[test]
    fn service_targets_the_gateway_port_and_sa_has_no_automount() {
        let children = children(&server(None), &settings()).unwrap();
        let svc = find(&children, ChildKind::Service);
        assert_eq!(svc["spec"]["ports"][0]["port"], 8086);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "gateway");
        let sa = find(&children, ChildKind::ServiceAccount);
        assert_eq!(sa["metadata"]["name"], "github-gateway");
        assert_eq!(sa["automountServiceAccountToken"], false);
        let cm = find(&children, ChildKind::ConfigMap);
        assert_eq!(cm["data"]["ca.crt"], settings().sync_ca_pem);
    }

    #[test]
    fn the_gateway_port_is_the_only_port_of_the_pod() {
        let children = children(&server(None), &settings()).unwrap();
        let pod = &find(&children, ChildKind::Deployment)["spec"]["template"]["spec"];
        let ports: Vec<(&Value, &Value)> = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .map(|p| (&p["name"], &p["containerPort"]))
            .collect();
        assert_eq!(ports, [(&json!("gateway"), &json!(8086))]);
        // The gateway forwards to the MCP container on loopback, and the audience tokens are
        // minted for is the Service URL the Host API hands out (apiserver default template).
        let gateway = &pod["containers"][1];
        let args: Vec<&str> = gateway["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            args.contains(&"--upstream=http://127.0.0.1:8080"),
            "{args:?}"
        );
        assert!(
            args.contains(&"--public-url=http://github.team-a.svc:8086"),
            "{args:?}"
        );
        assert_eq!(
            public_url("github", "team-a", 8086),
            "http://{server}.{namespace}.svc:8086"
                .replace("{server}", "github")
                .replace("{namespace}", "team-a")
        );
    }

    #[test]
    fn without_uid_there_is_no_owner_reference_to_build() {
        let mut s = server(None);
        s.metadata.uid = None;
        assert_eq!(
            children(&s, &settings()),
            Err(Incomplete::missing::<MCPServer>("uid"))
        );
    }

    #[test]
    fn compare_before_apply() {
        let children = children(&server(None), &settings()).unwrap();
        let desired = find(&children, ChildKind::Deployment);
        // The live object has server defaults and status on top: still up to date.
        let mut live = desired.clone();
        live["metadata"]["uid"] = json!("x");
        live["metadata"]["generation"] = json!(1);
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        live["spec"]["template"]["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(420);
        live["status"] = json!({"observedGeneration": 1});
        assert!(up_to_date(desired, &live));
        // Someone changed a field we own: apply again.
        let mut drifted = live.clone();
        drifted["spec"]["replicas"] = json!(3);
        assert!(!up_to_date(desired, &drifted));
        // A container added by someone else: the list differs.
        let mut extra = live.clone();
        extra["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "x"}));
        assert!(!up_to_date(desired, &extra));
        // A spec change (env added) changes the digest.
        let with_env = server(Some(EnvSecret {
            name: "e".into(),
            keys: vec!["K".into()],
        }));
        let changed = super::children(&with_env, &settings()).unwrap();
        assert!(!up_to_date(find(&changed, ChildKind::Deployment), &live));
        // And dropping it again (a field we stop setting) does too, though the live object
        // still "contains" the smaller body.
        let mut live_with_env = find(&changed, ChildKind::Deployment).clone();
        live_with_env["status"] = json!({});
        assert!(!up_to_date(desired, &live_with_env));
        // Absent object.
        assert!(!up_to_date(desired, &Value::Null));
    }

    fn pod_of(server: &MCPServer) -> Value {
        let children = children(server, &settings()).unwrap();
        find(&children, ChildKind::Deployment)["spec"]["template"]["spec"].clone()
    }

    #[test]
    fn resources_replicas_and_pulling_reach_the_deployment() {
        use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut s = server(None);
        s.spec.replicas = Some(3);
        s.spec.resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("100m".into()))].into()),
            limits: Some([("memory".to_string(), Quantity("256Mi".into()))].into()),
            ..Default::default()
        });
        s.spec.image_pull_policy = Some(apis::runtime::ImagePullPolicy::Always);
        s.spec.image_pull_secrets = vec![LocalObjectReference {
            name: "registry".into(),
        }];
        let children = children(&s, &settings()).unwrap();
        let deployment = find(&children, ChildKind::Deployment);
        assert_eq!(deployment["spec"]["replicas"], 3);
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "registry"}]));
        let mcp = &pod["containers"][0];
        assert_eq!(mcp["name"], SERVER_CONTAINER);
        assert_eq!(
            mcp["resources"],
            json!({"requests": {"cpu": "100m"}, "limits": {"memory": "256Mi"}})
        );
        assert_eq!(mcp["imagePullPolicy"], "Always");
        // The gateway's container is the platform's: none of it applies there.
        let gateway = &pod["containers"][1];
        assert!(gateway.get("resources").is_none() && gateway.get("imagePullPolicy").is_none());
        // Zero replicas: defined and stopped, not defaulted back to one.
        s.spec.replicas = Some(0);
        let children = super::children(&s, &settings()).unwrap();
        assert_eq!(
            find(&children, ChildKind::Deployment)["spec"]["replicas"],
            0
        );
        // Absent: one, and no field the server did not ask for.
        let pod = pod_of(&server(None));
        assert!(pod.get("imagePullSecrets").is_none());
        assert!(pod["containers"][0].get("resources").is_none());
        assert!(pod.get("initContainers").is_none());
    }

    #[test]
    fn command_and_args_override_the_entrypoint_of_an_http_server() {
        let mut s = server(None);
        s.spec.command = vec!["/app/serve".into()];
        s.spec.args = vec!["--port=8080".into()];
        let pod = pod_of(&s);
        assert_eq!(pod["containers"][0]["command"], json!(["/app/serve"]));
        assert_eq!(pod["containers"][0]["args"], json!(["--port=8080"]));
    }

    #[test]
    fn a_stdio_server_runs_its_command_behind_the_bridge_an_init_container_delivers() {
        let mut s = server(Some(EnvSecret {
            name: "github-env".into(),
            keys: vec!["GITHUB_TOKEN".into()],
        }));
        s.spec.transport = Transport::Stdio;
        s.spec.command = vec!["npx".into(), "-y".into()];
        s.spec.args = vec!["@acme/github-mcp".into(), "--stdio".into()];
        let pod = pod_of(&s);
        assert_eq!(
            pod["initContainers"],
            json!([{
                "name": "stdio-bridge",
                "image": "ghcr.io/mcp-access/gateway:1",
                "command": ["/usr/local/bin/mcp-access-stdio-bridge"],
                "args": ["--install=/mcp-access-bridge/mcp-access-stdio-bridge"],
                "volumeMounts": [{"name": "stdio-bridge", "mountPath": "/mcp-access-bridge"}],
            }])
        );
        let mcp = &pod["containers"][0];
        assert_eq!(mcp["image"], "ghcr.io/acme/github-mcp:2");
        assert_eq!(
            mcp["command"],
            json!(["/mcp-access-bridge/mcp-access-stdio-bridge"])
        );
        assert_eq!(
            mcp["args"],
            json!([
                "--listen=127.0.0.1:8080",
                "--",
                "npx",
                "-y",
                "@acme/github-mcp",
                "--stdio"
            ])
        );
        assert_eq!(
            mcp["volumeMounts"],
            json!([{"name": "stdio-bridge", "mountPath": "/mcp-access-bridge", "readOnly": true}])
        );
        // The Secret's keys reach the bridge's environment, which its children inherit.
        assert_eq!(mcp["env"][0]["name"], "GITHUB_TOKEN");
        // The gateway forwards to the bridge on loopback; still the only port of the Pod.
        let gateway = &pod["containers"][1];
        assert!(gateway["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--upstream=http://127.0.0.1:8080")));
        assert!(mcp.get("ports").is_none());
        // The bridge's volume sits beside the gateway's, never in the gateway's container.
        let volumes: Vec<&Value> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| &v["name"])
            .collect();
        assert_eq!(volumes, [&json!("stdio-bridge"), &json!("mcp-access")]);
        assert_eq!(pod["volumes"][0]["emptyDir"], json!({}));
        // A stdio server without a command has nothing to run (the CRD refuses it first).
        s.spec.command.clear();
        assert_eq!(
            children(&s, &settings()),
            Err(Incomplete::missing::<MCPServer>("spec.command"))
        );
    }

    #[test]
    fn a_remote_server_runs_only_the_platform_proxy() {
        let mut s = server(None);
        s.spec.image = None;
        s.spec.port = None;
        s.spec.remote = Some(apis::runtime::RemoteServer {
            url: "https://mcp.example.com/v1/mcp".into(),
        });
        let pod = pod_of(&s);
        assert!(pod.get("initContainers").is_none());
        let proxy = &pod["containers"][0];
        assert_eq!(
            *proxy,
            json!({
                "name": "mcp",
                "image": "ghcr.io/mcp-access/gateway:1",
                "command": ["/usr/local/bin/mcp-access-stdio-bridge"],
                "args": ["--listen=127.0.0.1:8080", "--remote=https://mcp.example.com/v1/mcp"],
            })
        );
        let gateway = &pod["containers"][1];
        assert!(gateway["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--upstream=http://127.0.0.1:8080")));
    }

    /// The digests of every child, pinned: a change to how bodies are built or hashed would
    /// make every live child look changed and re-apply the whole fleet once.
    #[test]
    fn digests_are_pinned() {
        let secret = EnvSecret {
            name: "github-env".into(),
            keys: vec!["GITHUB_TOKEN".into()],
        };
        let got: Vec<String> = children(&server(Some(secret)), &settings())
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c.kind.as_str(),
                    c.body["metadata"]["annotations"][DESIRED_DIGEST]
                        .as_str()
                        .unwrap()
                )
            })
            .collect();
        assert_eq!(got, PINNED, "{got:#?}");
    }

    const PINNED: [&str; 4] = [
        "ServiceAccount 8e5573bd53ff05183190738f287dca95a99f8dbd0fc6d3fdea84439deb9a6fbb",
        "ConfigMap 9987befc8e1a144aa8a61171926bd8e6dbaad9ee860e5289c356ac980fefeb92",
        "Service 1b41be99e65c63d42e5863d549f46186970ee3d7424ae863e3529b9014243240",
        "Deployment 34155fa583b0dd0b9934db387b100ebffe911c130b58fa66dd492c8006fae30f",
    ];
}
