//! Schema generation: schemars settings, Kubernetes-style transforms, kind and list schemas.
//!
//! Our types are named under [`definition_prefix`], k8s-openapi's keep their own names.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, DeleteOptions, ListMeta, ObjectMeta, Patch, Status, WatchEvent,
};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::transform::transform_subschemas;
use schemars::Schema;
use serde_json::{json, Map, Value};

use super::{
    definition_name, definition_prefix, foreign_definition_name, gvk, v3_ref, K8S_PREFIX, META_V1,
    V3_REF_PREFIX,
};
use crate::resources::{ResourceInfo, RESOURCES};
use crate::session_token::{TOKEN_REQUEST_GROUP, TOKEN_REQUEST_KIND, TOKEN_REQUEST_VERSION};
use crate::types::{
    AccessSession, Agent, Enrollment, Kind, Revocation, ToolPolicy, GROUP, VERSION,
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
    (
        ToolPolicy::KIND,
        SchemaGenerator::subschema_for::<ToolPolicy>,
    ),
];

/// The schema generator of `kind`, if [`KIND_SCHEMAS`] has one.
pub fn kind_schema(kind: &str) -> Option<SchemaFn> {
    KIND_SCHEMAS
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, schema)| *schema)
}

/// The schema name a `$ref` schema points at, if it points into the v3 components.
fn ref_name(schema: &Schema) -> Option<String> {
    let reference = schema.get("$ref")?.as_str()?;
    let encoded = reference.strip_prefix(V3_REF_PREFIX)?;
    Some(encoded.replace("~1", "/").replace("~0", "~"))
}

/// The schema generator: OpenAPI 3.0 settings, with optional fields not nullable, enums of
/// documented variants merged and integer formats spelt the Kubernetes way.
pub(super) fn generator() -> SchemaGenerator {
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
pub(super) fn v3_schemas() -> Map<String, Value> {
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
        // What the `token` subresource of AccessSession takes and answers.
        generator.subschema_for::<TokenRequest>(),
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
    for (name, schema) in schemas.iter_mut() {
        if name.starts_with(&prefix) {
            join_wrapped_descriptions(schema);
        }
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
    let token_request = foreign_definition_name(
        TOKEN_REQUEST_GROUP,
        TOKEN_REQUEST_VERSION,
        TOKEN_REQUEST_KIND,
    );
    if let Some(Value::Object(schema)) = schemas.get_mut(&token_request) {
        schema.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([gvk(
                TOKEN_REQUEST_GROUP,
                TOKEN_REQUEST_VERSION,
                TOKEN_REQUEST_KIND
            )]),
        );
    }
    schemas
}

/// Calls `rewrite` on the (decoded) schema name of every `$ref` into `#/components/schemas/`
/// and replaces the reference with what it returns.
pub(super) fn rewrite_refs(value: &mut Value, rewrite: &dyn Fn(&str) -> String) {
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

/// Descriptions of our schemas as Kubernetes publishes them, the lines of a paragraph joined:
/// schemars keeps the line breaks of wrapped doc comments, and `kubectl explain` would print
/// them inside its own word wrap. k8s-openapi's descriptions are published as they are.
fn join_wrapped_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(description) if key == "description" => {
                        *description = join_paragraph_lines(description);
                    }
                    _ => join_wrapped_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(join_wrapped_descriptions),
        _ => {}
    }
}

/// Joins the lines of each paragraph of `text` with spaces; blank lines, list items and
/// indented lines (code) keep their line breaks.
fn join_paragraph_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut previous: Option<&str> = None;
    for line in text.split('\n') {
        if let Some(previous) = previous {
            let kept = line.trim().is_empty()
                || previous.trim().is_empty()
                || line.starts_with(char::is_whitespace)
                || line.starts_with("- ")
                || line.starts_with("* ");
            let joined = !kept;
            out.push(if joined { ' ' } else { '\n' });
        }
        out.push_str(line);
        previous = Some(line);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::super::test_support::has_key;
    use super::super::v2::swagger2_schema;
    use super::*;

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

    /// A wrapped doc comment.
    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Wrapped {
        /// The first paragraph,
        /// wrapped.
        ///
        /// A list:
        /// - one
        /// - two
        field: String,
    }

    #[test]
    fn descriptions_are_unwrapped_paragraphs() {
        let mut generator = generator();
        let _ = generator.subschema_for::<Wrapped>();
        let mut definitions = Value::Object(generator.take_definitions(true));
        join_wrapped_descriptions(&mut definitions);
        assert_eq!(
            definitions["Wrapped"]["properties"]["field"]["description"],
            "The first paragraph, wrapped.\n\nA list:\n- one\n- two"
        );
        assert_eq!(
            join_paragraph_lines("a\nb\n\nc\n  code"),
            "a b\n\nc\n  code"
        );
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
}
