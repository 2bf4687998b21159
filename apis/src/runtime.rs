//! The `mcp-runtime.dev` custom resources the gateway path and the controllers act on. They
//! are served by kube-apiserver as CRDs (their YAML is generated from these types into
//! `deploy/crds/`, see `examples/crdgen.rs`), not by the aggregated API server.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the runtime resources.
pub const RUNTIME_GROUP: &str = "mcp-runtime.dev";

/// What to run for an MCP server and how clients reach it through its gateway.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mcp-runtime.dev",
    version = "v1alpha1",
    kind = "MCPServer",
    plural = "mcpservers",
    singular = "mcpserver",
    shortname = "mcps",
    namespaced,
    status = "MCPServerStatus",
    doc = "An MCP server that runs behind a gateway. Its UID is what sessions grant access to (AccessSession spec.server.uid): a server deleted and re-created under the same name is another server.",
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#,
    printcolumn = r#"{"name":"Transport","type":"string","jsonPath":".spec.transport"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MCPServerSpec {
    /// Container image of the MCP server.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Port the MCP server listens on inside its pod.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// How clients speak MCP to the server.
    #[serde(default)]
    pub transport: Transport,
    /// Environment of the MCP server container, from keys of a Secret in the server's
    /// namespace. The workload is not deployed until the Secret exists with every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_secret: Option<EnvSecret>,
}

/// A Secret whose keys become environment variables of the same names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvSecret {
    /// Name of the Secret, in the MCPServer's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Keys the server needs; each becomes an environment variable of that name.
    #[serde(default)]
    pub keys: Vec<String>,
}

/// What the controllers observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MCPServerStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `SecretsResolved`, `ImageAllowed`, `Retiring`, by Kubernetes condition
    /// conventions. Each controller owns its own types (server-side apply keyed by `type`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// MCP transports a server can be reached over through its gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Transport {
    /// The streamable HTTP transport (one endpoint, optional SSE responses).
    #[default]
    #[serde(rename = "streamable-http")]
    StreamableHttp,
    /// The older HTTP+SSE transport.
    #[serde(rename = "sse")]
    Sse,
}

/// Every CRD this project defines, with the file it is kept in under `deploy/crds/`.
pub fn crds() -> Vec<(
    &'static str,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
)> {
    use kube::CustomResourceExt;
    vec![("mcpservers.yaml", MCPServer::crd())]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRD files are what the types generate: regenerate them with
    /// `cargo run -p apis --example crdgen` after changing a type.
    #[test]
    fn committed_crds_match_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        for (file, crd) in crds() {
            let want = serde_norway::to_string(&crd).expect("a CRD serializes");
            let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            assert!(
                have == want,
                "deploy/crds/{file} is out of date: run `cargo run -p apis --example crdgen`"
            );
        }
    }

    #[test]
    fn mcpserver_is_namespaced_in_its_group() {
        use kube::CustomResourceExt;
        let crd = MCPServer::crd();
        assert_eq!(crd.spec.group, RUNTIME_GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, "mcpservers");
        let spec: MCPServerSpec =
            serde_json::from_value(serde_json::json!({"image": "ghcr.io/x/y:1", "port": 8080}))
                .unwrap();
        assert_eq!(spec.transport, Transport::StreamableHttp);
    }
}
