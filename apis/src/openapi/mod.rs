//! The OpenAPI documents of the group version: the public entry points and what the parts share.
//!
//! Generated from the Rust types (schemars) and [`RESOURCES`]: the
//! OpenAPI v3 group document and root, and the swagger 2.0 document the aggregator merges into
//! `/openapi/v2`.
//!
//! Paths and operations follow what kube-apiserver publishes for built-in resources
//! (operation ids, `x-kubernetes-action`, `x-kubernetes-group-version-kind`), because clients
//! read them: `kubectl explain` finds schemas by their `x-kubernetes-group-version-kind`,
//! `kubectl apply` sends strategic merge patches only when the PATCH operation accepts
//! `application/strategic-merge-patch+json`, and kubectl sends `fieldValidation=Strict` only
//! when the PATCH operation lists a `fieldValidation` parameter.
//!
//! Schemas are named the Kubernetes way: our types as `dev.mcp-runtime.access.v1alpha1.<Name>`,
//! apimachinery types under their k8s-openapi names (`io.k8s.apimachinery.pkg.apis.meta.v1.*`).
//! Adding a resource to [`RESOURCES`] needs only an entry in [`KIND_SCHEMAS`].
//!
//! The parts: `schemas` generates the schemas, `paths` the paths and operations, `v2` the
//! swagger 2.0 form of both.
//!
//! [`RESOURCES`]: crate::resources::RESOURCES

use serde_json::{json, Map, Value};

use crate::types::{API_VERSION, GROUP, VERSION};

mod paths;
mod schemas;
mod v2;

use paths::{document_paths, Dialect};
use schemas::v3_schemas;

pub use paths::PATCH_CONTENT_TYPES;
pub use schemas::{kind_schema, SchemaFn, KIND_SCHEMAS};
pub use v2::openapi_v2;

/// Where OpenAPI v3 documents keep schemas.
const V3_REF_PREFIX: &str = "#/components/schemas/";
/// Where swagger 2.0 documents keep schemas.
const V2_REF_PREFIX: &str = "#/definitions/";
/// Prefix of the schema names k8s-openapi uses.
const K8S_PREFIX: &str = "io.k8s.";
/// Prefix of the apimachinery `meta/v1` schema names.
const META_V1: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";

/// The schema name prefix of this group version: the group reversed, then the version,
/// e.g. `dev.mcp-runtime.access.v1alpha1.`.
pub fn definition_prefix() -> String {
    let reversed: Vec<&str> = GROUP.split('.').rev().collect();
    format!("{}.{}.", reversed.join("."), VERSION)
}

/// The schema name of one of our kinds, e.g. `dev.mcp-runtime.access.v1alpha1.AccessSession`.
pub fn definition_name(kind: &str) -> String {
    format!("{}{}", definition_prefix(), kind)
}

/// The schema name of a Kubernetes API kind (`authentication.k8s.io`, `v1`, `TokenRequest` →
/// `io.k8s.api.authentication.v1.TokenRequest`), as k8s-openapi and kube-apiserver name it.
pub fn foreign_definition_name(group: &str, version: &str, kind: &str) -> String {
    let group = group.strip_suffix(".k8s.io").unwrap_or(group);
    let group = if group.is_empty() { "core" } else { group };
    format!("{K8S_PREFIX}api.{group}.{version}.{kind}")
}

/// The path of the OpenAPI v3 group document, relative to the server root, without the
/// leading slash (the key of the v3 root document).
pub fn openapi_v3_group_path() -> String {
    format!("apis/{API_VERSION}")
}

/// `/openapi/v3`: the root document pointing at the group document. `hash` should change
/// whenever the group document does (clients cache it by URL).
pub fn openapi_v3_root(hash: &str) -> Value {
    let path = openapi_v3_group_path();
    let mut paths = Map::new();
    paths.insert(
        path.clone(),
        json!({ "serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}") }),
    );
    json!({ "paths": paths })
}

/// `/openapi/v3/apis/access.mcp-runtime.dev/v1alpha1`: the OpenAPI 3.0 document of the group
/// version, with every path, operation and schema.
pub fn openapi_v3_group() -> Value {
    let schemas = v3_schemas();
    let paths = document_paths(Dialect::V3);
    json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "BearerToken": bearer_token_scheme() },
        },
        "security": [{ "BearerToken": [] }],
    })
}

fn info() -> Value {
    json!({ "title": "MCP Access", "version": VERSION })
}

/// The security scheme both documents declare: a bearer token in the `authorization` header.
fn bearer_token_scheme() -> Value {
    json!({
        "type": "apiKey",
        "description": "Bearer Token authentication",
        "name": "authorization",
        "in": "header",
    })
}

/// A `group`/`version`/`kind` object, as `x-kubernetes-group-version-kind` holds them.
fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "kind": kind, "version": version })
}

/// `$ref` (v3 form) to a schema name.
fn v3_ref(name: &str) -> Value {
    json!({ "$ref": format!("{V3_REF_PREFIX}{name}") })
}

/// Helpers the tests of every part share: reference resolution and document checks.
#[cfg(test)]
mod test_support {
    use super::*;
    use crate::resources::RESOURCES;
    use std::collections::BTreeSet;

    /// Every `$ref` in a document.
    pub(super) fn refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("$ref", Value::String(reference)) => out.push(reference.clone()),
                        _ => refs(child, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
            _ => {}
        }
    }

    /// Asserts every `$ref` points at an existing schema under `prefix` (`#/...`).
    pub(super) fn assert_refs_resolve(doc: &Value, prefix: &str) {
        let mut all = Vec::new();
        refs(doc, &mut all);
        assert!(!all.is_empty(), "the document has references");
        let pointer = prefix.trim_start_matches('#').trim_end_matches('/');
        let schemas = doc
            .pointer(pointer)
            .and_then(Value::as_object)
            .expect("schemas object");
        for reference in all {
            assert!(!reference.starts_with("#/$defs"), "{reference} into $defs");
            let name = reference
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{reference} does not start with {prefix}"));
            assert!(schemas.contains_key(name), "{reference} does not resolve");
        }
    }

    /// Every object under `paths` that is an operation, with its path and method.
    pub(super) fn operations(doc: &Value) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("path item") {
                if method != "parameters" {
                    out.push((path.clone(), method.clone(), operation.clone()));
                }
            }
        }
        out
    }

    pub(super) fn param_names(params: &Value) -> Vec<String> {
        params
            .as_array()
            .map(|params| {
                params
                    .iter()
                    .map(|p| p["name"].as_str().expect("param name").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether any object in `value` has `key`.
    pub(super) fn has_key(value: &Value, key: &str) -> bool {
        match value {
            Value::Object(map) => map.contains_key(key) || map.values().any(|v| has_key(v, key)),
            Value::Array(items) => items.iter().any(|v| has_key(v, key)),
            _ => false,
        }
    }

    /// The properties of our kinds' `spec` and `status` and, recursively, of the objects of
    /// our group they hold, as `Kind.spec.field` paths: every one (to show the walk reaches
    /// them) and those without a non-empty `description`. apimachinery types (ObjectMeta,
    /// Time, Condition) are documented by k8s-openapi and are not entered; the property
    /// holding one must still describe itself.
    fn undocumented_properties(schemas: &Map<String, Value>, ref_prefix: &str) -> Fields {
        let mut fields = Fields::default();
        for resource in RESOURCES {
            let kind = &schemas[&definition_name(resource.kind)];
            for field in ["spec", "status"] {
                let property = &kind["properties"][field];
                let path = format!("{}.{field}", resource.kind);
                assert!(property.is_object(), "{path} published");
                check_property(schemas, ref_prefix, property, &path, &mut fields);
            }
        }
        fields
    }

    /// Asserts every field of our kinds' spec and status has a description, and that the walk
    /// of [`undocumented_properties`] reached nested objects, array items and enums.
    pub(super) fn assert_fields_described(schemas: &Map<String, Value>, ref_prefix: &str) {
        let fields = undocumented_properties(schemas, ref_prefix);
        for path in [
            "AccessSession.spec.server.uid",
            "AccessSession.status.phase",
            "AccessSession.status.revocation.coveredBy[].revocationName",
            "AccessSession.status.enrollment.ownerUid",
            "Agent.spec.maxSessionTTL",
            "Enrollment.spec.agent.uid",
            "Enrollment.status.completedAt",
            "Revocation.spec.target.server.name",
            "Revocation.status.clusterWide",
        ] {
            assert!(
                fields.all.iter().any(|f| f == path),
                "{path} visited: {:?}",
                fields.all
            );
        }
        assert!(
            fields.undocumented.is_empty(),
            "fields without a description: {:?}",
            fields.undocumented
        );
    }

    /// Property paths found by [`undocumented_properties`].
    #[derive(Debug, Default)]
    struct Fields {
        all: Vec<String>,
        undocumented: Vec<String>,
    }

    fn check_property(
        schemas: &Map<String, Value>,
        ref_prefix: &str,
        property: &Value,
        path: &str,
        fields: &mut Fields,
    ) {
        let described = property["description"]
            .as_str()
            .is_some_and(|d| !d.trim().is_empty());
        fields.all.push(path.to_string());
        if !described {
            fields.undocumented.push(path.to_string());
        }
        check_object(schemas, ref_prefix, property, path, fields);
    }

    /// Checks the properties of `schema`: its own, those of the schema of our group it
    /// refers to (`$ref`, `allOf: [{$ref}]`), and those of its array items.
    fn check_object(
        schemas: &Map<String, Value>,
        ref_prefix: &str,
        schema: &Value,
        path: &str,
        fields: &mut Fields,
    ) {
        if let Some(properties) = schema["properties"].as_object() {
            for (name, property) in properties {
                check_property(
                    schemas,
                    ref_prefix,
                    property,
                    &format!("{path}.{name}"),
                    fields,
                );
            }
        }
        let mut targets = vec![&schema["$ref"]];
        if let Some(all_of) = schema["allOf"].as_array() {
            targets.extend(all_of.iter().map(|s| &s["$ref"]));
        }
        let ours = format!("{ref_prefix}{}", definition_prefix());
        for target in targets.iter().filter_map(|t| t.as_str()) {
            if let Some(name) = target
                .strip_prefix(ref_prefix)
                .filter(|_| target.starts_with(&ours))
            {
                check_object(schemas, ref_prefix, &schemas[name], path, fields);
            }
        }
        if schema["items"].is_object() {
            check_object(
                schemas,
                ref_prefix,
                &schema["items"],
                &format!("{path}[]"),
                fields,
            );
        }
    }

    pub(super) fn check_schemas(schemas: &Map<String, Value>) {
        for resource in RESOURCES {
            let kind = &schemas[&definition_name(resource.kind)];
            assert_eq!(
                kind["x-kubernetes-group-version-kind"],
                json!([{"group": GROUP, "version": VERSION, "kind": resource.kind}])
            );
            assert!(kind["properties"]["spec"].is_object());
            assert!(kind["properties"]["metadata"].is_object());
            let list = &schemas[&definition_name(resource.list_kind)];
            assert_eq!(
                list["x-kubernetes-group-version-kind"],
                json!([{"group": GROUP, "version": VERSION, "kind": resource.list_kind}])
            );
            for field in ["apiVersion", "kind", "metadata", "items"] {
                assert!(list["properties"][field].is_object(), "list has {field}");
            }
        }
        for name in [
            "ObjectMeta",
            "ListMeta",
            "Status",
            "DeleteOptions",
            "WatchEvent",
            "Patch",
            "Time",
        ] {
            assert!(
                schemas.contains_key(&format!("{META_V1}{name}")),
                "{name} defined"
            );
        }
        assert_eq!(
            schemas[&format!("{META_V1}Status")]["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Status"}])
        );
        for name in schemas.keys() {
            assert!(
                name.starts_with(K8S_PREFIX)
                    || name.starts_with("dev.mcp-runtime.access.v1alpha1."),
                "{name} is named the Kubernetes way"
            );
        }
    }

    pub(super) fn check_paths(doc: &Value) {
        let paths = doc["paths"].as_object().expect("paths");
        for path in [
            "/apis/access.mcp-runtime.dev/v1alpha1/",
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions",
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}",
            "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions",
            "/apis/access.mcp-runtime.dev/v1alpha1/agents",
            "/apis/access.mcp-runtime.dev/v1alpha1/agents/{name}",
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}/token",
        ] {
            assert!(paths.contains_key(path), "{path} published");
        }
        let collection =
            &paths["/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions"];
        assert_eq!(
            collection["get"]["operationId"],
            "listAccessMcpRuntimeDevV1alpha1NamespacedAccessSession"
        );
        assert_eq!(collection["get"]["x-kubernetes-action"], "list");
        assert_eq!(collection["post"]["x-kubernetes-action"], "post");
        assert_eq!(
            collection["delete"]["x-kubernetes-action"],
            "deletecollection"
        );
        assert_eq!(
            param_names(&collection["parameters"]),
            ["namespace", "pretty"]
        );
        let list_params = param_names(&collection["get"]["parameters"]);
        for name in [
            "labelSelector",
            "fieldSelector",
            "limit",
            "continue",
            "resourceVersion",
            "resourceVersionMatch",
            "sendInitialEvents",
            "timeoutSeconds",
            "watch",
            "allowWatchBookmarks",
        ] {
            assert!(list_params.iter().any(|p| p == name), "list has {name}");
        }
        let create_params = param_names(&collection["post"]["parameters"]);
        for name in ["dryRun", "fieldManager", "fieldValidation"] {
            assert!(create_params.iter().any(|p| p == name), "create has {name}");
        }

        let item = &paths
            ["/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}"];
        assert_eq!(
            param_names(&item["parameters"]),
            ["name", "namespace", "pretty"]
        );
        for (method, action) in [
            ("get", "get"),
            ("put", "put"),
            ("patch", "patch"),
            ("delete", "delete"),
        ] {
            assert_eq!(item[method]["x-kubernetes-action"], action);
        }
        assert_eq!(
            paths["/apis/access.mcp-runtime.dev/v1alpha1/accesssessions"]["get"]["operationId"],
            "listAccessMcpRuntimeDevV1alpha1AccessSessionForAllNamespaces"
        );
        assert_eq!(
            paths["/apis/access.mcp-runtime.dev/v1alpha1/agents/{name}"]["patch"]["operationId"],
            "patchAccessMcpRuntimeDevV1alpha1Agent"
        );
        assert_eq!(
            param_names(
                &paths["/apis/access.mcp-runtime.dev/v1alpha1/agents/{name}"]["parameters"]
            ),
            ["name", "pretty"]
        );

        let mut ids = BTreeSet::new();
        for (path, method, operation) in operations(doc) {
            let id = operation["operationId"].as_str().expect("operationId");
            assert!(ids.insert(id.to_string()), "{id} unique");
            assert!(operation["tags"].is_array(), "{method} {path} tagged");
            assert!(operation["responses"]["200"].is_object());
            if path.ends_with("/v1alpha1/") {
                continue;
            }
            assert!(operation["x-kubernetes-action"].is_string());
            let gvk = &operation["x-kubernetes-group-version-kind"];
            if path.ends_with("/{name}/token") {
                assert_eq!(gvk["group"], "authentication.k8s.io", "{method} {path}");
                assert_eq!(gvk["kind"], "TokenRequest");
                assert_eq!(operation["x-kubernetes-action"], "post");
                continue;
            }
            assert_eq!(gvk["group"], GROUP, "{method} {path}");
            assert_eq!(gvk["version"], VERSION);
            assert!(gvk["kind"].is_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::paths::{operation_group_version, tag};
    use super::test_support::*;
    use super::*;
    use crate::resources::RESOURCES;

    #[test]
    fn every_resource_has_a_schema() {
        for resource in RESOURCES {
            assert!(
                kind_schema(resource.kind).is_some(),
                "add {} to KIND_SCHEMAS",
                resource.kind
            );
        }
    }

    #[test]
    fn definition_names_are_kubernetes_style() {
        assert_eq!(definition_prefix(), "dev.mcp-runtime.access.v1alpha1.");
        assert_eq!(
            definition_name("AccessSession"),
            "dev.mcp-runtime.access.v1alpha1.AccessSession"
        );
        assert_eq!(operation_group_version(), "AccessMcpRuntimeDevV1alpha1");
        assert_eq!(tag(), "accessMcpRuntimeDev_v1alpha1");
    }

    #[test]
    fn v3_root_points_at_the_group_document() {
        assert_eq!(
            openapi_v3_root("abc"),
            json!({"paths": {"apis/access.mcp-runtime.dev/v1alpha1": {
                "serverRelativeURL": "/openapi/v3/apis/access.mcp-runtime.dev/v1alpha1?hash=abc"
            }}})
        );
    }

    #[test]
    fn v3_schemas_are_named_and_tagged() {
        let doc = openapi_v3_group();
        assert_eq!(doc["openapi"], "3.0.0");
        assert!(doc["info"]["title"].is_string());
        check_schemas(doc["components"]["schemas"].as_object().expect("schemas"));
        let session = &doc["components"]["schemas"][&definition_name("AccessSession")];
        assert_eq!(
            session["properties"]["metadata"]["allOf"][0]["$ref"],
            format!("{V3_REF_PREFIX}{META_V1}ObjectMeta")
        );
        // Option<T> is optional, not nullable.
        let spec = &doc["components"]["schemas"][&definition_name("AccessSessionSpec")];
        assert!(spec["properties"]["agent"].get("anyOf").is_none());
        assert!(!has_key(&doc["components"]["schemas"], "$defs"));
    }

    /// `kubectl explain` shows each field's `description`: every field of our kinds has one.
    #[test]
    fn every_spec_and_status_field_is_described() {
        let doc = openapi_v3_group();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        assert_fields_described(schemas, V3_REF_PREFIX);
    }

    #[test]
    fn v3_refs_resolve() {
        assert_refs_resolve(&openapi_v3_group(), V3_REF_PREFIX);
    }

    #[test]
    fn formats_are_kubernetes_formats() {
        let doc = openapi_v3_group();
        let spec = &doc["components"]["schemas"][&definition_name("AgentSpec")];
        assert_eq!(
            spec["properties"]["maxActiveSessions"]["format"],
            json!("int64")
        );
    }

    #[test]
    fn v3_paths_and_operations() {
        let doc = openapi_v3_group();
        check_paths(&doc);
        let item = &doc["paths"]
            ["/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}"];
        assert_eq!(
            item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            format!("{V3_REF_PREFIX}{}", definition_name("AccessSession"))
        );
        assert_eq!(
            item["delete"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            format!("{V3_REF_PREFIX}{META_V1}Status")
        );
        assert_eq!(
            item["get"]["x-kubernetes-group-version-kind"],
            json!({"group": GROUP, "version": VERSION, "kind": "AccessSession"})
        );
    }

    #[test]
    fn patch_operations_advertise_patch_types_and_field_validation() {
        let v3 = openapi_v3_group();
        let v2 = openapi_v2();
        let mut patches = 0;
        for (doc, v3_dialect) in [(&v3, true), (&v2, false)] {
            for (path, method, operation) in operations(doc) {
                if method != "patch" {
                    continue;
                }
                patches += 1;
                let types: Vec<String> = if v3_dialect {
                    operation["requestBody"]["content"]
                        .as_object()
                        .expect("requestBody content")
                        .keys()
                        .cloned()
                        .collect()
                } else {
                    operation["consumes"]
                        .as_array()
                        .expect("consumes")
                        .iter()
                        .map(|t| t.as_str().expect("content type").to_string())
                        .collect()
                };
                let status = path.ends_with("/status");
                let advertised = if status {
                    paths::STATUS_PATCH_CONTENT_TYPES
                } else {
                    PATCH_CONTENT_TYPES
                };
                let mut expected: Vec<String> = advertised.iter().map(|t| t.to_string()).collect();
                let mut types_sorted = types.clone();
                types_sorted.sort();
                expected.sort();
                assert_eq!(types_sorted, expected, "PATCH {path}");
                // Server-side apply, with `force`, on the resource; not on its status.
                assert_eq!(
                    types.iter().any(|t| t == "application/apply-patch+yaml"),
                    !status,
                    "PATCH {path}"
                );
                let params = param_names(&operation["parameters"]);
                for name in ["fieldValidation", "dryRun", "fieldManager"] {
                    assert!(params.iter().any(|p| p == name), "PATCH {path} has {name}");
                }
                assert_eq!(params.iter().any(|p| p == "force"), !status, "PATCH {path}");
                assert_eq!(operation["x-kubernetes-action"], "patch");
                assert!(operation["x-kubernetes-group-version-kind"]["kind"].is_string());
            }
        }
        let patchable: usize = RESOURCES
            .iter()
            .map(|r| {
                usize::from(r.verbs.contains(&"patch"))
                    + usize::from(r.subresources.contains(&"status"))
            })
            .sum();
        assert_eq!(patches, 2 * patchable);
    }

    #[test]
    fn documents_are_deterministic() {
        assert_eq!(openapi_v3_group(), openapi_v3_group());
        assert_eq!(openapi_v2(), openapi_v2());
    }
}
