//! OpenAPI documents for `access.mcp-runtime.dev/v1alpha1`, generated from the Rust types
//! (schemars) and [`RESOURCES`]: the OpenAPI v3 group document and root, and the swagger 2.0
//! document the aggregator merges into `/openapi/v2`.
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

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, DeleteOptions, ListMeta, ObjectMeta, Patch, Status, WatchEvent,
};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::transform::transform_subschemas;
use schemars::Schema;
use serde_json::{json, Map, Value};

use crate::discovery::subresource_verbs;
use crate::resources::{ResourceInfo, RESOURCES};
use crate::types::{
    AccessSession, Agent, Enrollment, Kind, Revocation, API_VERSION, GROUP, VERSION,
};

/// Adds the schema of one kind (and every schema it uses) to the generator's definitions and
/// returns the schema to use for the kind, normally a `$ref` to it.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema generator of every served kind, by `kind`. A resource added to [`RESOURCES`]
/// needs an entry here; without one its documents carry a schemaless placeholder (and the
/// tests of this module fail).
pub const KIND_SCHEMAS: &[(&str, SchemaFn)] = &[
    (
        AccessSession::KIND,
        SchemaGenerator::subschema_for::<AccessSession>,
    ),
    (Agent::KIND, SchemaGenerator::subschema_for::<Agent>),
    (
        Enrollment::KIND,
        SchemaGenerator::subschema_for::<Enrollment>,
    ),
    (
        Revocation::KIND,
        SchemaGenerator::subschema_for::<Revocation>,
    ),
];

/// Request content types of PATCH operations. Server-side apply
/// (`application/apply-patch+yaml`) is deliberately not advertised.
pub const PATCH_CONTENT_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// Where OpenAPI v3 documents keep schemas.
const V3_REF_PREFIX: &str = "#/components/schemas/";
/// Where swagger 2.0 documents keep schemas.
const V2_REF_PREFIX: &str = "#/definitions/";
/// Prefix of the schema names k8s-openapi uses.
const K8S_PREFIX: &str = "io.k8s.";
/// Prefix of the apimachinery `meta/v1` schema names.
const META_V1: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";

const JSON: &str = "application/json";
const JSON_WATCH: &str = "application/json;stream=watch";

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

/// The schema generator of `kind`, if [`KIND_SCHEMAS`] has one.
pub fn kind_schema(kind: &str) -> Option<SchemaFn> {
    KIND_SCHEMAS
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, schema)| *schema)
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
    let paths = render_paths(&paths(), Dialect::V3);
    json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "BearerToken": {
                    "type": "apiKey",
                    "description": "Bearer Token authentication",
                    "name": "authorization",
                    "in": "header",
                },
            },
        },
        "security": [{ "BearerToken": [] }],
    })
}

/// `/openapi/v2`: the swagger 2.0 document with every path, operation and definition.
/// Schemas are the v3 ones with what swagger 2.0 cannot express removed (`nullable`,
/// `oneOf`/`anyOf`/`not`, `writeOnly`) and `allOf: [{$ref}]` wrappers unwrapped.
pub fn openapi_v2() -> Value {
    let mut definitions = Map::new();
    for (name, mut schema) in v3_schemas() {
        if let Ok(schema) = <&mut Schema>::try_from(&mut schema) {
            swagger2_schema(schema);
        }
        definitions.insert(name, schema);
    }
    for schema in definitions.values_mut() {
        rewrite_refs(schema, &|name| format!("{V2_REF_PREFIX}{name}"));
    }
    let paths = render_paths(&paths(), Dialect::V2);
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": {
            "BearerToken": {
                "type": "apiKey",
                "description": "Bearer Token authentication",
                "name": "authorization",
                "in": "header",
            },
        },
        "security": [{ "BearerToken": [] }],
    })
}

fn info() -> Value {
    json!({ "title": "MCP Access", "version": VERSION })
}

// ---------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------

/// A `group`/`version`/`kind` object, as `x-kubernetes-group-version-kind` holds them.
fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "kind": kind, "version": version })
}

/// `$ref` (v3 form) to a schema name.
fn v3_ref(name: &str) -> Value {
    json!({ "$ref": format!("{V3_REF_PREFIX}{name}") })
}

/// The schema name a `$ref` schema points at, if it points into the v3 components.
fn ref_name(schema: &Schema) -> Option<String> {
    let reference = schema.get("$ref")?.as_str()?;
    let encoded = reference.strip_prefix(V3_REF_PREFIX)?;
    Some(encoded.replace("~1", "/").replace("~0", "~"))
}

/// The schema generator: OpenAPI 3.0 settings, with optional fields not nullable, enums of
/// documented variants merged and integer formats spelt the Kubernetes way.
fn generator() -> SchemaGenerator {
    SchemaSettings::openapi3()
        .with(|settings| {
            settings
                .transforms
                .insert(0, Box::new(drop_null as fn(&mut Schema)));
        })
        .with_transform(merge_enum_alternatives as fn(&mut Schema))
        .with_transform(kubernetes_formats as fn(&mut Schema))
        .into_generator()
}

/// Every schema of the group version, v3 form (refs into `#/components/schemas/`).
fn v3_schemas() -> Map<String, Value> {
    let mut generator = generator();

    // Generate first, then rename: our kinds by their RESOURCES kind, the types they use
    // under our prefix; k8s-openapi names stay as they are.
    let mut renames: BTreeMap<String, String> = BTreeMap::new();
    let mut inline_kinds: Vec<(String, Value)> = Vec::new();
    let mut placeholders: Vec<&ResourceInfo> = Vec::new();
    for resource in RESOURCES {
        let Some(schema_fn) = kind_schema(resource.kind) else {
            placeholders.push(resource);
            continue;
        };
        let schema = schema_fn(&mut generator);
        match ref_name(&schema) {
            Some(name) => {
                renames.insert(name, definition_name(resource.kind));
            }
            None => inline_kinds.push((definition_name(resource.kind), schema.to_value())),
        }
    }
    for schema in [
        generator.subschema_for::<ObjectMeta>(),
        generator.subschema_for::<ListMeta>(),
        generator.subschema_for::<Status>(),
        generator.subschema_for::<DeleteOptions>(),
        generator.subschema_for::<WatchEvent<Value>>(),
        generator.subschema_for::<Patch>(),
        generator.subschema_for::<APIResourceList>(),
    ] {
        debug_assert!(ref_name(&schema).is_some(), "k8s-openapi schemas are named");
    }

    let prefix = definition_prefix();
    let mut schemas = Map::new();
    for (name, schema) in generator.take_definitions(true) {
        let new_name = match renames.get(&name) {
            Some(new_name) => new_name.clone(),
            None if name.starts_with(K8S_PREFIX) => name.clone(),
            None => {
                let new_name = format!("{prefix}{name}");
                renames.insert(name.clone(), new_name.clone());
                new_name
            }
        };
        schemas.insert(new_name, schema);
    }
    for (name, schema) in inline_kinds {
        schemas.insert(name, schema);
    }
    for schema in schemas.values_mut() {
        rewrite_refs(schema, &|name| {
            format!(
                "{V3_REF_PREFIX}{}",
                renames.get(name).map(String::as_str).unwrap_or(name)
            )
        });
    }
    for resource in placeholders {
        schemas.insert(definition_name(resource.kind), placeholder_schema(resource));
    }
    for resource in RESOURCES {
        if let Some(Value::Object(kind)) = schemas.get_mut(&definition_name(resource.kind)) {
            // The standard type fields, as Kubernetes documents them (no defaults).
            if let Some(Value::Object(properties)) = kind.get_mut("properties") {
                properties.insert("apiVersion".into(), api_version_property());
                properties.insert("kind".into(), kind_property());
            }
            kind.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([gvk(GROUP, VERSION, resource.kind)]),
            );
        }
        schemas.insert(definition_name(resource.list_kind), list_schema(resource));
    }

    let core_and_ours = |kind: &str| json!([gvk("", "v1", kind), gvk(GROUP, VERSION, kind)]);
    let extensions = [
        ("Status", json!([gvk("", "v1", "Status")])),
        ("DeleteOptions", core_and_ours("DeleteOptions")),
        ("WatchEvent", core_and_ours("WatchEvent")),
    ];
    for (kind, gvks) in extensions {
        if let Some(Value::Object(schema)) = schemas.get_mut(&format!("{META_V1}{kind}")) {
            schema.insert("x-kubernetes-group-version-kind".into(), gvks);
        }
    }
    schemas
}

/// Calls `rewrite` on the (decoded) schema name of every `$ref` into `#/components/schemas/`
/// and replaces the reference with what it returns.
fn rewrite_refs(value: &mut Value, rewrite: &dyn Fn(&str) -> String) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "$ref" {
                    if let Value::String(reference) = child {
                        if let Some(encoded) = reference.strip_prefix(V3_REF_PREFIX) {
                            let name = encoded.replace("~1", "/").replace("~0", "~");
                            *reference = rewrite(&name);
                        }
                    }
                } else {
                    rewrite_refs(child, rewrite);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_refs(item, rewrite);
            }
        }
        _ => {}
    }
}

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// The schema of the `apiVersion` field.
fn api_version_property() -> Value {
    json!({ "type": "string", "description": API_VERSION_DESCRIPTION })
}

/// The schema of the `kind` field.
fn kind_property() -> Value {
    json!({ "type": "string", "description": KIND_DESCRIPTION })
}

/// The `<Kind>List` schema of a resource (v3 form).
fn list_schema(resource: &ResourceInfo) -> Value {
    json!({
        "description": format!("{} is a list of {}.", resource.list_kind, resource.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": api_version_property(),
            "items": {
                "type": "array",
                "description": format!("List of {}.", resource.plural),
                "items": v3_ref(&definition_name(resource.kind)),
            },
            "kind": kind_property(),
            "metadata": {
                "allOf": [v3_ref(&format!("{META_V1}ListMeta"))],
                "default": {},
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            },
        },
        "x-kubernetes-group-version-kind": [gvk(GROUP, VERSION, resource.list_kind)],
    })
}

/// The schema of a kind without an entry in [`KIND_SCHEMAS`]: any spec and status.
fn placeholder_schema(resource: &ResourceInfo) -> Value {
    json!({
        "description": format!("{} (schema not published).", resource.kind),
        "type": "object",
        "properties": {
            "apiVersion": api_version_property(),
            "kind": kind_property(),
            "metadata": {
                "allOf": [v3_ref(&format!("{META_V1}ObjectMeta"))],
                "default": {},
                "description": "Standard object's metadata.",
            },
            "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        },
    })
}

/// Whether a schema only admits `null`.
fn is_null_schema(value: &Value) -> bool {
    let Some(obj) = value.as_object() else {
        return false;
    };
    obj.get("type").is_some_and(|t| t == "null")
        || obj.get("const").is_some_and(Value::is_null)
        || obj
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|values| values.iter().all(Value::is_null))
}

/// Transform: optional is not nullable in Kubernetes APIs. Removes `null` from `type` and
/// `enum`, `default: null`, and `null` alternatives of `anyOf`/`oneOf` (merging a single
/// remaining alternative into the schema, so `Option<T>` becomes `T`).
fn drop_null(schema: &mut Schema) {
    transform_subschemas(&mut drop_null, schema);
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            obj.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if obj.get("default").is_some_and(Value::is_null) {
        obj.remove("default");
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(mut alternatives)) = obj.remove(key) else {
            continue;
        };
        alternatives.retain(|alternative| !is_null_schema(alternative));
        match alternatives.pop() {
            Some(Value::Object(only)) if alternatives.is_empty() => {
                for (k, v) in only {
                    obj.entry(k).or_insert(v);
                }
            }
            Some(last) => {
                alternatives.push(last);
                obj.insert(key.into(), Value::Array(alternatives));
            }
            None => {}
        }
    }
}

/// Transform: an `anyOf`/`oneOf` whose alternatives are all plain enums (what schemars makes
/// of an enum with documented variants) becomes one `enum`, the variant docs appended to the
/// description the way Kubernetes documents enums.
fn merge_enum_alternatives(schema: &mut Schema) {
    transform_subschemas(&mut merge_enum_alternatives, schema);
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    for key in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = obj.get(key) else {
            continue;
        };
        let mut values = Vec::new();
        let mut ty: Option<Value> = None;
        let mut docs = Vec::new();
        let mut plain = !alternatives.is_empty();
        for alternative in alternatives {
            let Some(alt) = alternative.as_object() else {
                plain = false;
                break;
            };
            let Some(Value::Array(enum_values)) = alt.get("enum") else {
                plain = false;
                break;
            };
            if alt
                .keys()
                .any(|k| !matches!(k.as_str(), "enum" | "type" | "description" | "title"))
            {
                plain = false;
                break;
            }
            match (alt.get("type"), &ty) {
                (Some(t), Some(seen)) if t != seen => {
                    plain = false;
                    break;
                }
                (Some(t), None) => ty = Some(t.clone()),
                _ => {}
            }
            if let Some(Value::String(doc)) = alt.get("description") {
                for value in enum_values {
                    docs.push(format!(" - `{}` {}", value, doc));
                }
            }
            values.extend(enum_values.iter().cloned());
        }
        if !plain {
            continue;
        }
        obj.remove(key);
        obj.insert("enum".into(), Value::Array(values));
        if let Some(ty) = ty {
            obj.entry("type").or_insert(ty);
        }
        if !docs.is_empty() {
            let mut description = obj
                .get("description")
                .and_then(Value::as_str)
                .map(|d| format!("{d}\n\n"))
                .unwrap_or_default();
            description.push_str("Possible enum values:\n");
            description.push_str(&docs.join("\n"));
            obj.insert("description".into(), description.into());
        }
    }
}

/// Transform: integer formats as Kubernetes spells them (`int32`/`int64`); schemars' Rust
/// formats (`uint32`, ...) are unknown to OpenAPI tooling.
fn kubernetes_formats(schema: &mut Schema) {
    transform_subschemas(&mut kubernetes_formats, schema);
    if let Some(Value::String(format)) = schema.get_mut("format") {
        let kubernetes = match format.as_str() {
            "int8" | "int16" | "uint8" | "uint16" => "int32",
            "uint32" | "uint64" | "uint" | "int" | "uint128" | "int128" => "int64",
            _ => return,
        };
        *format = kubernetes.to_string();
    }
}

/// Transform: a v3 schema as swagger 2.0 can express it: `allOf: [{$ref}]` back to a `$ref`
/// with siblings (as Kubernetes publishes v2), and no `nullable`, `writeOnly`, `oneOf`,
/// `anyOf` or `not`.
fn swagger2_schema(schema: &mut Schema) {
    transform_subschemas(&mut swagger2_schema, schema);
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let single_ref = match obj.get("allOf") {
        Some(Value::Array(all_of)) if all_of.len() == 1 => all_of[0]
            .as_object()
            .filter(|inner| inner.len() == 1)
            .and_then(|inner| inner.get("$ref"))
            .cloned(),
        _ => None,
    };
    if let Some(reference) = single_ref {
        obj.remove("allOf");
        obj.insert("$ref".into(), reference);
    }
    for key in ["nullable", "writeOnly", "oneOf", "anyOf", "not"] {
        obj.remove(key);
    }
}

// ---------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------

/// Which OpenAPI version to render.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    V2,
    V3,
}

/// Where a parameter goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum In {
    Path,
    Query,
}

/// One parameter of a path or operation.
#[derive(Clone)]
struct Param {
    name: &'static str,
    location: In,
    ty: &'static str,
    description: Cow<'static, str>,
}

impl Param {
    const fn query(name: &'static str, ty: &'static str, description: &'static str) -> Self {
        Self {
            name,
            location: In::Query,
            ty,
            description: Cow::Borrowed(description),
        }
    }

    fn render(&self, dialect: Dialect) -> Value {
        let location = match self.location {
            In::Path => "path",
            In::Query => "query",
        };
        let mut out = Map::new();
        out.insert("name".into(), self.name.into());
        out.insert("in".into(), location.into());
        out.insert("description".into(), self.description.as_ref().into());
        if self.location == In::Path {
            out.insert("required".into(), true.into());
        }
        let mut ty = Map::new();
        ty.insert("type".into(), self.ty.into());
        ty.insert("uniqueItems".into(), true.into());
        match dialect {
            Dialect::V3 => {
                out.insert("schema".into(), Value::Object(ty));
            }
            Dialect::V2 => out.extend(ty),
        }
        Value::Object(out)
    }
}

const PRETTY: Param = Param::query("pretty", "string", "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).");
const ALLOW_WATCH_BOOKMARKS: Param = Param::query("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag and bookmarks are sent at the server's discretion. Clients should not assume bookmarks are returned at any specific interval, nor may they assume the server will send any BOOKMARK event during a session. If this is not a watch, this field is ignored.");
const CONTINUE: Param = Param::query("continue", "string", "The continue option should be set when retrieving more results from the server. Since this value is server defined, clients may only use the continue value from a previous query result with identical query parameters (except for the value of continue) and the server may reject a continue value it does not recognize. If the specified continue value is no longer valid the server will respond with a 410 ResourceExpired error. This field is not supported when watch is true.");
const FIELD_SELECTOR: Param = Param::query(
    "fieldSelector",
    "string",
    "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
);
const LABEL_SELECTOR: Param = Param::query(
    "labelSelector",
    "string",
    "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
);
const LIMIT: Param = Param::query("limit", "integer", "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results. The server guarantees that the objects returned when using continue will be identical to issuing a single list call without a limit.");
const RESOURCE_VERSION: Param = Param::query("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request may be served from. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset");
const RESOURCE_VERSION_MATCH: Param = Param::query("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls. It is highly recommended that resourceVersionMatch be set for list calls where resourceVersion is set See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset");
const SEND_INITIAL_EVENTS: Param = Param::query("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection. Once all such events have been sent, a synthetic \"Bookmark\" event will be sent. The bookmark will report the ResourceVersion (RV) corresponding to the set of objects, and be marked with `\"k8s.io/initial-events-end\": \"true\"` annotation. Afterwards, the watch stream will proceed as usual, sending watch events corresponding to changes (subsequent to the RV) to objects watched.\n\nWhen `sendInitialEvents` option is set, we require `resourceVersionMatch` option to also be set.");
const TIMEOUT_SECONDS: Param = Param::query("timeoutSeconds", "integer", "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity.");
const WATCH: Param = Param::query("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion.");
const DRY_RUN: Param = Param::query("dryRun", "string", "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed");
const FIELD_MANAGER: Param = Param::query("fieldManager", "string", "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.");
const FIELD_VALIDATION: Param = Param::query("fieldValidation", "string", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: This will ignore any unknown fields that are silently dropped from the object, and will ignore all but the last duplicate field that the decoder encounters. - Warn: This will send a warning via the standard warning response header for each unknown field that is dropped from the object, and for each duplicate field that is encountered. The request will still succeed if there are no other errors, and will only persist the last of any duplicate fields. This is the default. - Strict: This will fail the request with a BadRequest error if any unknown fields would be dropped from the object, or if any duplicate fields are present. The error returned from the server will contain all unknown and duplicate fields encountered.");
const GRACE_PERIOD_SECONDS: Param = Param::query("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately. If this value is nil, the default grace period for the specified type will be used.");
const ORPHAN_DEPENDENTS: Param = Param::query("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned. If true/false, the \"orphan\" finalizer will be added to/removed from the object's finalizers list. Either this field or PropagationPolicy may be set, but not both.");
const PROPAGATION_POLICY: Param = Param::query("propagationPolicy", "string", "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. The default policy is decided by the existing finalizer set in the metadata.finalizers and the resource-specific default policy. Acceptable values are: 'Orphan' - orphan the dependents; 'Background' - allow the garbage collector to delete the dependents in the background; 'Foreground' - a cascading policy that deletes all dependents in the foreground.");

fn namespace_param() -> Param {
    Param {
        name: "namespace",
        location: In::Path,
        ty: "string",
        description: Cow::Borrowed("object name and auth scope, such as for teams and projects"),
    }
}

fn name_param(kind: &str) -> Param {
    Param {
        name: "name",
        location: In::Path,
        ty: "string",
        description: Cow::Owned(format!("name of the {kind}")),
    }
}

/// Query parameters of list (and watch) calls.
fn list_params(resource: &ResourceInfo) -> Vec<Param> {
    let watch = resource.verbs.contains(&"watch");
    let mut params = Vec::new();
    if watch {
        params.push(ALLOW_WATCH_BOOKMARKS);
    }
    params.extend([
        CONTINUE,
        FIELD_SELECTOR,
        LABEL_SELECTOR,
        LIMIT,
        RESOURCE_VERSION,
        RESOURCE_VERSION_MATCH,
    ]);
    if watch {
        params.push(SEND_INITIAL_EVENTS);
    }
    params.push(TIMEOUT_SECONDS);
    if watch {
        params.push(WATCH);
    }
    params
}

/// Query parameters of create, replace and patch calls.
fn write_params() -> Vec<Param> {
    vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION]
}

/// Query parameters of delete calls.
fn delete_params() -> Vec<Param> {
    vec![
        DRY_RUN,
        GRACE_PERIOD_SECONDS,
        ORPHAN_DEPENDENTS,
        PROPAGATION_POLICY,
    ]
}

/// Query parameters of deletecollection calls.
fn delete_collection_params() -> Vec<Param> {
    vec![
        CONTINUE,
        DRY_RUN,
        FIELD_SELECTOR,
        GRACE_PERIOD_SECONDS,
        LABEL_SELECTOR,
        LIMIT,
        ORPHAN_DEPENDENTS,
        PROPAGATION_POLICY,
        RESOURCE_VERSION,
        RESOURCE_VERSION_MATCH,
        SEND_INITIAL_EVENTS,
        TIMEOUT_SECONDS,
    ]
}

/// A request body.
struct Body {
    schema: String,
    content_types: &'static [&'static str],
    required: bool,
}

/// One response of an operation.
struct Response {
    code: &'static str,
    description: &'static str,
    /// Schema name and the content types it is served as.
    schema: Option<(String, &'static [&'static str])>,
}

impl Response {
    fn unauthorized() -> Self {
        Self {
            code: "401",
            description: "Unauthorized",
            schema: None,
        }
    }

    fn json(code: &'static str, description: &'static str, schema: String) -> Self {
        Self {
            code,
            description,
            schema: Some((schema, &[JSON])),
        }
    }
}

/// One operation of a path.
struct Operation {
    method: &'static str,
    action: &'static str,
    operation_id: String,
    description: String,
    params: Vec<Param>,
    body: Option<Body>,
    responses: Vec<Response>,
    /// `kind` of `x-kubernetes-group-version-kind`; `None` for operations on no kind.
    kind: Option<&'static str>,
}

/// A path with its path-level parameters and operations.
struct PathItem {
    path: String,
    params: Vec<Param>,
    operations: Vec<Operation>,
}

/// `AccessMcpRuntimeDevV1alpha1`: the group and version as operation ids spell them.
fn operation_group_version() -> String {
    let mut out = String::new();
    for word in GROUP.split(['.', '-']) {
        out.push_str(&capitalize(word));
    }
    out.push_str(&capitalize(VERSION));
    out
}

/// `accessMcpRuntimeDev_v1alpha1`: the tag of every operation of the group version.
fn tag() -> String {
    let mut group = String::new();
    for (i, word) in GROUP.split(['.', '-']).enumerate() {
        if i == 0 {
            group.push_str(word);
        } else {
            group.push_str(&capitalize(word));
        }
    }
    format!("{group}_{VERSION}")
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `a` or `an` before a kind.
fn article(kind: &str) -> &'static str {
    match kind.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

/// Every path of the group version.
fn paths() -> Vec<PathItem> {
    let gv = operation_group_version();
    let base = format!("/apis/{API_VERSION}");
    let mut items = vec![PathItem {
        path: format!("{base}/"),
        params: Vec::new(),
        operations: vec![Operation {
            method: "get",
            action: "",
            operation_id: format!("get{gv}APIResources"),
            description: "get available resources".into(),
            params: Vec::new(),
            body: None,
            responses: vec![
                Response::json("200", "OK", format!("{META_V1}APIResourceList")),
                Response::unauthorized(),
            ],
            kind: None,
        }],
    }];
    for resource in RESOURCES {
        items.extend(resource_paths(resource, &gv, &base));
    }
    items
}

/// The paths of one resource: collection, item, subresources and (namespaced) the
/// all-namespaces list.
fn resource_paths(resource: &ResourceInfo, gv: &str, base: &str) -> Vec<PathItem> {
    let kind = resource.kind;
    let has = |verb: &str| resource.verbs.contains(&verb);
    let object = definition_name(kind);
    let list = definition_name(resource.list_kind);
    let status = format!("{META_V1}Status");
    let scope = if resource.namespaced {
        "Namespaced"
    } else {
        ""
    };
    let collection_path = if resource.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", resource.plural)
    } else {
        format!("{base}/{}", resource.plural)
    };
    let scope_params = || {
        let mut params = Vec::new();
        if resource.namespaced {
            params.push(namespace_param());
        }
        params.push(PRETTY);
        params
    };
    let list_operation = |operation_id: String| Operation {
        method: "get",
        action: "list",
        operation_id,
        description: format!("list or watch objects of kind {kind}"),
        params: list_params(resource),
        body: None,
        responses: vec![
            Response {
                code: "200",
                description: "OK",
                schema: Some((list.clone(), &[JSON, JSON_WATCH])),
            },
            Response::unauthorized(),
        ],
        kind: Some(kind),
    };

    let mut paths = Vec::new();

    // Collection.
    let mut operations = Vec::new();
    if has("list") || has("watch") {
        operations.push(list_operation(format!("list{gv}{scope}{kind}")));
    }
    if has("create") {
        operations.push(Operation {
            method: "post",
            action: "post",
            operation_id: format!("create{gv}{scope}{kind}"),
            description: format!("create {} {kind}", article(kind)),
            params: write_params(),
            body: Some(Body {
                schema: object.clone(),
                content_types: &[JSON],
                required: true,
            }),
            responses: vec![
                Response::json("200", "OK", object.clone()),
                Response::json("201", "Created", object.clone()),
                Response::json("202", "Accepted", object.clone()),
                Response::unauthorized(),
            ],
            kind: Some(kind),
        });
    }
    if has("deletecollection") {
        operations.push(Operation {
            method: "delete",
            action: "deletecollection",
            operation_id: format!("delete{gv}Collection{scope}{kind}"),
            description: format!("delete collection of {kind}"),
            params: delete_collection_params(),
            body: Some(Body {
                schema: format!("{META_V1}DeleteOptions"),
                content_types: &[JSON],
                required: false,
            }),
            responses: vec![
                Response::json("200", "OK", status.clone()),
                Response::unauthorized(),
            ],
            kind: Some(kind),
        });
    }
    if !operations.is_empty() {
        paths.push(PathItem {
            path: collection_path.clone(),
            params: scope_params(),
            operations,
        });
    }

    // Item.
    let item_path = format!("{collection_path}/{{name}}");
    let item_params = || {
        let mut params = vec![name_param(kind)];
        params.extend(scope_params());
        params
    };
    let patch_operation = |operation_id: String, description: String| Operation {
        method: "patch",
        action: "patch",
        operation_id,
        description,
        params: write_params(),
        body: Some(Body {
            schema: format!("{META_V1}Patch"),
            content_types: PATCH_CONTENT_TYPES,
            required: true,
        }),
        responses: vec![
            Response::json("200", "OK", object.clone()),
            Response::json("201", "Created", object.clone()),
            Response::unauthorized(),
        ],
        kind: Some(kind),
    };
    let replace_operation = |operation_id: String, description: String| Operation {
        method: "put",
        action: "put",
        operation_id,
        description,
        params: write_params(),
        body: Some(Body {
            schema: object.clone(),
            content_types: &[JSON],
            required: true,
        }),
        responses: vec![
            Response::json("200", "OK", object.clone()),
            Response::json("201", "Created", object.clone()),
            Response::unauthorized(),
        ],
        kind: Some(kind),
    };
    let read_operation = |operation_id: String, description: String| Operation {
        method: "get",
        action: "get",
        operation_id,
        description,
        params: Vec::new(),
        body: None,
        responses: vec![
            Response::json("200", "OK", object.clone()),
            Response::unauthorized(),
        ],
        kind: Some(kind),
    };

    let mut operations = Vec::new();
    if has("get") {
        operations.push(read_operation(
            format!("read{gv}{scope}{kind}"),
            format!("read the specified {kind}"),
        ));
    }
    if has("update") {
        operations.push(replace_operation(
            format!("replace{gv}{scope}{kind}"),
            format!("replace the specified {kind}"),
        ));
    }
    if has("delete") {
        operations.push(Operation {
            method: "delete",
            action: "delete",
            operation_id: format!("delete{gv}{scope}{kind}"),
            description: format!("delete {} {kind}", article(kind)),
            params: delete_params(),
            body: Some(Body {
                schema: format!("{META_V1}DeleteOptions"),
                content_types: &[JSON],
                required: false,
            }),
            responses: vec![
                Response::json("200", "OK", status.clone()),
                Response::json("202", "Accepted", status.clone()),
                Response::unauthorized(),
            ],
            kind: Some(kind),
        });
    }
    if has("patch") {
        operations.push(patch_operation(
            format!("patch{gv}{scope}{kind}"),
            format!("partially update the specified {kind}"),
        ));
    }
    if !operations.is_empty() {
        paths.push(PathItem {
            path: item_path.clone(),
            params: item_params(),
            operations,
        });
    }

    // Subresources.
    for sub in resource.subresources {
        let suffix = capitalize(sub);
        let mut operations = Vec::new();
        for verb in subresource_verbs(sub) {
            match *verb {
                "get" => operations.push(read_operation(
                    format!("read{gv}{scope}{kind}{suffix}"),
                    format!("read {sub} of the specified {kind}"),
                )),
                "update" => operations.push(replace_operation(
                    format!("replace{gv}{scope}{kind}{suffix}"),
                    format!("replace {sub} of the specified {kind}"),
                )),
                "patch" => operations.push(patch_operation(
                    format!("patch{gv}{scope}{kind}{suffix}"),
                    format!("partially update {sub} of the specified {kind}"),
                )),
                _ => {}
            }
        }
        if !operations.is_empty() {
            paths.push(PathItem {
                path: format!("{item_path}/{sub}"),
                params: item_params(),
                operations,
            });
        }
    }

    // List across namespaces.
    if resource.namespaced && (has("list") || has("watch")) {
        paths.push(PathItem {
            path: format!("{base}/{}", resource.plural),
            params: vec![PRETTY],
            operations: vec![list_operation(format!("list{gv}{kind}ForAllNamespaces"))],
        });
    }
    paths
}

/// Renders paths in the given dialect.
fn render_paths(items: &[PathItem], dialect: Dialect) -> Value {
    let mut paths = Map::new();
    for item in items {
        let mut path = Map::new();
        for operation in &item.operations {
            path.insert(
                operation.method.into(),
                render_operation(operation, dialect),
            );
        }
        if !item.params.is_empty() {
            let params = item.params.iter().map(|p| p.render(dialect)).collect();
            path.insert("parameters".into(), Value::Array(params));
        }
        paths.insert(item.path.clone(), Value::Object(path));
    }
    Value::Object(paths)
}

/// `$ref` to a schema name in the given dialect.
fn schema_ref(name: &str, dialect: Dialect) -> Value {
    match dialect {
        Dialect::V3 => v3_ref(name),
        Dialect::V2 => json!({ "$ref": format!("{V2_REF_PREFIX}{name}") }),
    }
}

fn render_operation(operation: &Operation, dialect: Dialect) -> Value {
    let mut out = Map::new();
    out.insert("description".into(), operation.description.clone().into());
    if dialect == Dialect::V2 {
        if let Some(body) = &operation.body {
            out.insert("consumes".into(), json!(body.content_types));
        }
        let mut produces: Vec<&str> = Vec::new();
        for response in &operation.responses {
            for content_type in response.schema.iter().flat_map(|(_, types)| types.iter()) {
                if !produces.contains(content_type) {
                    produces.push(content_type);
                }
            }
        }
        if produces.is_empty() {
            produces.push(JSON);
        }
        out.insert("produces".into(), json!(produces));
        out.insert("schemes".into(), json!(["https"]));
    }
    out.insert("tags".into(), json!([tag()]));
    out.insert("operationId".into(), operation.operation_id.clone().into());

    let mut params: Vec<Value> = Vec::new();
    if let (Dialect::V2, Some(body)) = (dialect, &operation.body) {
        params.push(json!({
            "name": "body",
            "in": "body",
            "required": body.required,
            "schema": schema_ref(&body.schema, dialect),
        }));
    }
    params.extend(operation.params.iter().map(|p| p.render(dialect)));
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    if let (Dialect::V3, Some(body)) = (dialect, &operation.body) {
        let mut content = Map::new();
        for content_type in body.content_types {
            content.insert(
                (*content_type).into(),
                json!({ "schema": schema_ref(&body.schema, dialect) }),
            );
        }
        out.insert(
            "requestBody".into(),
            json!({ "content": content, "required": body.required }),
        );
    }

    let mut responses = Map::new();
    for response in &operation.responses {
        let mut rendered = Map::new();
        rendered.insert("description".into(), response.description.into());
        if let Some((schema, content_types)) = &response.schema {
            match dialect {
                Dialect::V3 => {
                    let mut content = Map::new();
                    for content_type in *content_types {
                        content.insert(
                            (*content_type).into(),
                            json!({ "schema": schema_ref(schema, dialect) }),
                        );
                    }
                    rendered.insert("content".into(), Value::Object(content));
                }
                Dialect::V2 => {
                    rendered.insert("schema".into(), schema_ref(schema, dialect));
                }
            }
        }
        responses.insert(response.code.into(), Value::Object(rendered));
    }
    out.insert("responses".into(), Value::Object(responses));

    if !operation.action.is_empty() {
        out.insert("x-kubernetes-action".into(), operation.action.into());
    }
    if let Some(kind) = operation.kind {
        out.insert(
            "x-kubernetes-group-version-kind".into(),
            gvk(GROUP, VERSION, kind),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every `$ref` in a document.
    fn refs(value: &Value, out: &mut Vec<String>) {
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
    fn assert_refs_resolve(doc: &Value, prefix: &str) {
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
    fn operations(doc: &Value) -> Vec<(String, String, Value)> {
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

    fn param_names(params: &Value) -> Vec<String> {
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
    fn has_key(value: &Value, key: &str) -> bool {
        match value {
            Value::Object(map) => map.contains_key(key) || map.values().any(|v| has_key(v, key)),
            Value::Array(items) => items.iter().any(|v| has_key(v, key)),
            _ => false,
        }
    }

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

    fn check_schemas(schemas: &Map<String, Value>) {
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

    #[test]
    fn v2_schemas_are_named_and_tagged() {
        let doc = openapi_v2();
        assert_eq!(doc["swagger"], "2.0");
        let definitions = doc["definitions"].as_object().expect("definitions");
        check_schemas(definitions);
        let session = &definitions[&definition_name("AccessSession")];
        assert_eq!(
            session["properties"]["metadata"]["$ref"],
            format!("{V2_REF_PREFIX}{META_V1}ObjectMeta")
        );
        for key in ["nullable", "oneOf", "anyOf", "$defs", "components"] {
            assert!(!has_key(&doc, key), "v2 has no {key}");
        }
    }

    #[test]
    fn v3_refs_resolve() {
        assert_refs_resolve(&openapi_v3_group(), V3_REF_PREFIX);
    }

    #[test]
    fn v2_refs_resolve() {
        assert_refs_resolve(&openapi_v2(), V2_REF_PREFIX);
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

    fn check_paths(doc: &Value) {
        let paths = doc["paths"].as_object().expect("paths");
        for path in [
            "/apis/access.mcp-runtime.dev/v1alpha1/",
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions",
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions/{name}",
            "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions",
            "/apis/access.mcp-runtime.dev/v1alpha1/agents",
            "/apis/access.mcp-runtime.dev/v1alpha1/agents/{name}",
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
            assert_eq!(gvk["group"], GROUP, "{method} {path}");
            assert_eq!(gvk["version"], VERSION);
            assert!(gvk["kind"].is_string());
        }
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
    fn v2_paths_and_operations() {
        let doc = openapi_v2();
        check_paths(&doc);
        let collection = &doc["paths"]
            ["/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{namespace}/accesssessions"];
        assert_eq!(
            collection["get"]["responses"]["200"]["schema"]["$ref"],
            format!("{V2_REF_PREFIX}{}", definition_name("AccessSessionList"))
        );
        assert_eq!(collection["post"]["parameters"][0]["in"], "body");
        assert!(collection["get"]["produces"]
            .as_array()
            .expect("produces")
            .contains(&json!("application/json")));
    }

    /// kubectl picks strategic merge and `fieldValidation=Strict` from the PATCH operations.
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
                let mut expected: Vec<String> =
                    PATCH_CONTENT_TYPES.iter().map(|t| t.to_string()).collect();
                let mut types_sorted = types.clone();
                types_sorted.sort();
                expected.sort();
                assert_eq!(types_sorted, expected, "PATCH {path}");
                assert!(!types.iter().any(|t| t == "application/apply-patch+yaml"));
                let params = param_names(&operation["parameters"]);
                for name in ["fieldValidation", "dryRun", "fieldManager"] {
                    assert!(params.iter().any(|p| p == name), "PATCH {path} has {name}");
                }
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
        assert!(!serde_json::to_string(&v3)
            .expect("serializable")
            .contains("apply-patch+yaml"));
        assert!(!serde_json::to_string(&v2)
            .expect("serializable")
            .contains("apply-patch+yaml"));
    }

    #[test]
    fn status_subresource_gets_paths() {
        let resource = ResourceInfo {
            subresources: &["status"],
            ..crate::resources::ACCESS_SESSIONS
        };
        let items = resource_paths(&resource, &operation_group_version(), "/apis/g/v");
        let status = items
            .iter()
            .find(|item| item.path.ends_with("/{name}/status"))
            .expect("status path");
        let methods: Vec<&str> = status.operations.iter().map(|o| o.method).collect();
        assert_eq!(methods, ["get", "patch", "put"]);
        let patch = render_operation(&status.operations[1], Dialect::V3);
        assert_eq!(
            patch["operationId"],
            "patchAccessMcpRuntimeDevV1alpha1NamespacedAccessSessionStatus"
        );
        assert!(param_names(&patch["parameters"]).contains(&"fieldValidation".to_string()));
    }

    /// Exercises the transforms on shapes our current types do not have.
    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    enum Documented {
        /// The first.
        First,
        /// The second.
        Second,
    }

    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Holder {
        /// Maybe documented.
        maybe: Option<Documented>,
        count: Option<u16>,
        names: Option<Vec<String>>,
    }

    #[test]
    fn transforms_make_kubernetes_style_schemas() {
        let mut generator = generator();
        let _ = generator.subschema_for::<Holder>();
        let mut definitions = generator.take_definitions(true);
        let documented = &definitions["Documented"];
        assert_eq!(documented["enum"], json!(["First", "Second"]));
        assert_eq!(documented["type"], "string");
        assert!(documented.get("oneOf").is_none());
        let description = documented["description"].as_str().expect("description");
        assert!(
            description.contains("Possible enum values"),
            "{description}"
        );
        assert!(
            description.contains("`\"First\"` The first."),
            "{description}"
        );

        let holder = &definitions["Holder"]["properties"];
        assert!(holder["maybe"].get("anyOf").is_none(), "{holder}");
        assert_eq!(
            holder["maybe"]["allOf"][0]["$ref"],
            format!("{V3_REF_PREFIX}Documented")
        );
        assert_eq!(holder["maybe"]["description"], "Maybe documented.");
        assert_eq!(holder["count"]["type"], "integer");
        assert_eq!(holder["count"]["format"], "int32");
        assert_eq!(holder["names"]["type"], "array");
        assert!(!has_key(&Value::Object(definitions.clone()), "nullable"));

        let holder = definitions.get_mut("Holder").expect("Holder");
        swagger2_schema(<&mut Schema>::try_from(holder).expect("a schema"));
        let maybe = &definitions["Holder"]["properties"]["maybe"];
        assert_eq!(maybe["$ref"], format!("{V3_REF_PREFIX}Documented"));
        assert!(maybe.get("allOf").is_none());
    }

    #[test]
    fn documents_are_deterministic() {
        assert_eq!(openapi_v3_group(), openapi_v3_group());
        assert_eq!(openapi_v2(), openapi_v2());
    }
}
