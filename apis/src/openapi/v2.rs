//! The swagger 2.0 document (`/openapi/v2`): the v3 schemas and paths as swagger 2.0 says them.

use schemars::transform::transform_subschemas;
use schemars::Schema;
use serde_json::{json, Map, Value};

use super::paths::{document_paths, Dialect};
use super::schemas::{rewrite_refs, v3_schemas};
use super::{bearer_token_scheme, info, V2_REF_PREFIX};

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
    let paths = document_paths(Dialect::V2);
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": { "BearerToken": bearer_token_scheme() },
        "security": [{ "BearerToken": [] }],
    })
}

/// Transform: a v3 schema as swagger 2.0 can express it: `allOf: [{$ref}]` back to a `$ref`
/// with siblings (as Kubernetes publishes v2), and no `nullable`, `writeOnly`, `oneOf`,
/// `anyOf` or `not`.
pub(super) fn swagger2_schema(schema: &mut Schema) {
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{definition_name, META_V1};
    use super::*;

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
        // kubectl explain reads v2 too (`--output=plaintext-openapiv2`): the field docs survive.
        assert_fields_described(definitions, V2_REF_PREFIX);
    }

    #[test]
    fn v2_refs_resolve() {
        assert_refs_resolve(&openapi_v2(), V2_REF_PREFIX);
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
}
