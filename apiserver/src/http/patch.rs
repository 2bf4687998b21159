//! The patch types kubectl sends: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch, and the apply configurations of server-side apply (merged by
//! `apis::managed_fields`; this module only reads them).

use serde_json::{Map, Value};

/// A supported patch type, from the request's `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    StrategicMerge,
    /// Server-side apply (`application/apply-patch+yaml`): YAML or JSON.
    Apply,
}

/// Media types accepted for PATCH.
pub const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::StrategicMerge),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Most operations one JSON patch may carry: kube-apiserver's `maxJSONPatchOperations`
/// (its fix for CVE-2019-1002100), answered with 413 as it does.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Most bytes the `copy` operations of one JSON patch may duplicate in all: kube-apiserver's
/// `JSONPatchMaxCopyBytes` (3 MiB, json-patch's `AccumulatedCopySizeLimit`). Without it a
/// few dozen operations copying a map into itself grow the document exponentially.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Deepest nesting (objects and arrays) of a request body or of a patched document. Far
/// beyond any object this API serves, and low enough that every recursive walk over a
/// `Value` (serialization, comparison, drop) stays well inside a thread's stack: a chain of
/// `move` operations could otherwise nest the document one level per operation.
pub const MAX_DEPTH: usize = 100;

/// How many JSON nodes the depth checks of one JSON patch may visit. A `move` into a deeper
/// path is checked by walking the moved value; ten thousand of them over a large subtree
/// would otherwise cost minutes of CPU.
const MAX_PATCH_WORK: usize = 8 * 1024 * 1024;

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well-formed but cannot apply to this object (422).
    #[error("{0}")]
    Inapplicable(String),
    /// The patch is larger than the server accepts (413).
    #[error("{0}")]
    TooLarge(String),
}

/// Applies `patch` (the raw request body) to `doc`. On error `doc` may be partly patched:
/// callers patch a copy and discard it.
pub fn apply(doc: &mut Value, patch_type: PatchType, patch: &[u8]) -> Result<(), PatchError> {
    match patch_type {
        // Merged with field ownership by the caller (`apis::managed_fields::apply`).
        PatchType::Apply => Err(PatchError::Malformed(
            "an apply configuration is not a patch of this kind".into(),
        )),
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| PatchError::Malformed(format!("invalid JSON patch: {e}")))?;
            apply_json_patch(doc, &patch.0)
        }
        PatchType::Merge | PatchType::StrategicMerge => {
            let patch: Value = serde_json::from_slice(patch)
                .map_err(|e| PatchError::Malformed(format!("invalid JSON in patch: {e}")))?;
            if !patch.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            if patch_type == PatchType::Merge {
                json_patch::merge(doc, &patch);
            } else {
                strategic_merge(doc, &patch, "")?;
            }
            // A merge never nests deeper than the document or the patch, both already
            // bounded; checked anyway so the bound does not rest on that argument.
            check_depth(doc)
        }
    }
}

/// Reads an apply configuration: a YAML or JSON object. Its encoding as JSON is checked as
/// every JSON body is (depth, no NUL), since YAML nests by indentation and escapes NUL as
/// `\0`, which the text scan of the raw body cannot see.
pub fn apply_configuration(body: &[u8]) -> Result<Value, PatchError> {
    let config: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_slice_with_options(body, yaml_options())
            .map_err(|e| PatchError::Malformed(format!("error decoding YAML: {e}")))?,
    };
    if !config.is_object() {
        return Err(PatchError::Malformed(
            "an apply configuration must be an object".into(),
        ));
    }
    let text = serde_json::to_vec(&config)
        .map_err(|e| PatchError::Malformed(format!("error decoding YAML: {e}")))?;
    let scan = scan_json_text(&text);
    if scan.depth > MAX_DEPTH {
        return Err(PatchError::Malformed(format!(
            "the apply configuration is nested {} levels deep; at most {MAX_DEPTH} are accepted",
            scan.depth
        )));
    }
    if scan.nul {
        return Err(PatchError::Malformed(
            "the apply configuration holds the NUL character in a string; it cannot be stored"
                .into(),
        ));
    }
    if text.len() > MAX_APPLY_BYTES {
        return Err(PatchError::TooLarge(format!(
            "the apply configuration is {} bytes as JSON; at most {MAX_APPLY_BYTES} are accepted",
            text.len()
        )));
    }
    Ok(config)
}

/// Most bytes an apply configuration may take as JSON: YAML aliases can expand a small body.
const MAX_APPLY_BYTES: usize = 3 * 1024 * 1024;

/// Bounds of the YAML decoder: what a 3 MiB body may hold, and aliases that replay at most
/// that much again, so an alias bomb is refused before it is expanded.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 200_000;
    budget.max_total_scalar_bytes = MAX_APPLY_BYTES;
    budget.max_aliases = 1_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.alias_limits.max_total_replayed_events = 100_000;
    options
}

/// Applies JSON-patch operations one at a time, checking before each that it keeps the
/// document within [`MAX_DEPTH`] and the copies within [`MAX_JSON_PATCH_COPY_BYTES`].
fn apply_json_patch(doc: &mut Value, ops: &[json_patch::PatchOperation]) -> Result<(), PatchError> {
    use json_patch::PatchOperation as Op;
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(PatchError::TooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    check_depth(doc)?;
    let mut copied = 0usize;
    let mut work = 0usize;
    for (i, op) in ops.iter().enumerate() {
        // The depth the operation's value lands at, and that value's own depth.
        let (landing, value_depth) = match op {
            Op::Add(add) => (add.path.count(), depth(&add.value)),
            Op::Replace(replace) => (replace.path.count(), depth(&replace.value)),
            Op::Move(mv) if mv.path.count() > mv.from.count() => {
                let moved = mv.from.resolve(doc).map_err(|e| inapplicable(i, &e))?;
                work += nodes(moved);
                (mv.path.count(), depth(moved))
            }
            Op::Copy(cp) => {
                let source = cp.from.resolve(doc).map_err(|e| inapplicable(i, &e))?;
                copied += encoded_len(source);
                if copied > MAX_JSON_PATCH_COPY_BYTES {
                    return Err(PatchError::Inapplicable(format!(
                        "the JSON patch cannot be applied: operation {i}: unable to copy, the copies would exceed {MAX_JSON_PATCH_COPY_BYTES} bytes"
                    )));
                }
                (cp.path.count(), depth(source))
            }
            // A move up or sideways, a remove or a test never deepens the document.
            Op::Move(_) | Op::Remove(_) | Op::Test(_) => (0, 0),
        };
        if work > MAX_PATCH_WORK {
            return Err(PatchError::Inapplicable(format!(
                "the JSON patch cannot be applied: operation {i}: the patch moves more data than the server processes in one request"
            )));
        }
        // The value sits one level below its parent container (`landing` tokens deep).
        if landing.saturating_sub(1) + value_depth > MAX_DEPTH {
            return Err(too_deep());
        }
        json_patch::patch_unsafe(doc, std::slice::from_ref(op)).map_err(|e| inapplicable(i, &e))?;
    }
    Ok(())
}

fn inapplicable(i: usize, e: &dyn std::fmt::Display) -> PatchError {
    PatchError::Inapplicable(format!(
        "the JSON patch cannot be applied: operation {i}: {e}"
    ))
}

fn too_deep() -> PatchError {
    PatchError::Inapplicable(format!(
        "the patched object would be nested more than {MAX_DEPTH} levels deep"
    ))
}

fn check_depth(doc: &Value) -> Result<(), PatchError> {
    if depth(doc) > MAX_DEPTH {
        Err(too_deep())
    } else {
        Ok(())
    }
}

/// Nesting depth of a value: 0 for a scalar, 1 for a flat object or array. Recursive:
/// only called on values already bounded (parsed bodies, checked documents).
pub fn depth(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn nodes(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(nodes).sum::<usize>(),
        Value::Array(a) => 1 + a.iter().map(nodes).sum::<usize>(),
        _ => 1,
    }
}

/// Length of a value's JSON encoding, without building it.
pub fn encoded_len<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a Value always serializes.
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

/// What a scan of a JSON text's bytes (without parsing it) finds: checked on every request
/// body before anything recursive reads it or anything is stored.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TextScan {
    /// Nesting depth of arrays and objects (strings skipped).
    pub depth: usize,
    /// A string holds the NUL character (the escape `\u0000`), which PostgreSQL's jsonb
    /// cannot store.
    pub nul: bool,
}

pub fn scan_json_text(body: &[u8]) -> TextScan {
    let mut scan = TextScan::default();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in body.iter().enumerate() {
        if in_string {
            match b {
                b'u' if escaped => {
                    escaped = false;
                    scan.nul |= body.get(i + 1..i + 5) == Some(b"0000");
                }
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                scan.depth = scan.depth.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    scan
}

/// The merge key of a list field that merges element-wise (`patchMergeKey` in the
/// Kubernetes types); every other list is replaced whole.
fn merge_key(path: &str) -> Option<&'static str> {
    match path {
        "metadata.ownerReferences" => Some("uid"),
        "status.conditions" => Some("type"),
        _ => None,
    }
}

fn strategic_merge(doc: &mut Value, patch: &Value, path: &str) -> Result<(), PatchError> {
    let Some(patch) = patch.as_object() else {
        *doc = patch.clone();
        return Ok(());
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *doc = Value::Object(strip_directives(replaced));
            return Ok(());
        }
        Some("delete") => {
            *doc = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "unknown patch directive $patch: {other:?}"
            )))
        }
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Some(target) = doc.as_object_mut() else {
        return Ok(());
    };
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = value.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(items)) = target.get_mut(field) {
                items.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            return Err(PatchError::Malformed(format!(
                "unknown patch directive {key:?}"
            )));
        }
        let child_path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(_) => {
                let entry = target.entry(key.clone()).or_insert(Value::Null);
                strategic_merge(entry, value, &child_path)?;
                if entry.is_null() {
                    target.remove(key);
                }
            }
            Value::Array(items) => match merge_key(&child_path) {
                Some(mk) => {
                    let entry = target
                        .entry(key.clone())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    merge_list(entry, items, mk, &child_path)?;
                }
                None => {
                    target.insert(
                        key.clone(),
                        Value::Array(items.iter().map(strip_value).collect()),
                    );
                }
            },
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(doc: &mut Value, items: &[Value], key: &str, path: &str) -> Result<(), PatchError> {
    if !doc.is_array() {
        *doc = Value::Array(Vec::new());
    }
    let Some(list) = doc.as_array_mut() else {
        return Ok(());
    };
    for item in items {
        let Some(id) = item.get(key) else {
            return Err(PatchError::Inapplicable(format!(
                "{path}: element has no merge key {key:?}"
            )));
        };
        let position = list.iter().position(|e| e.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut list[i], item, path)?,
            (None, false) => list.push(strip_value(item)),
        }
    }
    Ok(())
}

fn strip_directives(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k, strip_value(&v)))
        .collect()
}

fn strip_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_directives(m.clone())),
        Value::Array(a) => Value::Array(a.iter().map(strip_value).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(doc: Value, t: PatchType, patch: Value) -> Result<Value, PatchError> {
        let mut doc = doc;
        apply(&mut doc, t, &serde_json::to_vec(&patch).unwrap())?;
        Ok(doc)
    }

    #[test]
    fn merge_patch_merges_maps_and_deletes_nulls() {
        let doc =
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"teams": ["x", "y"]}});
        let out = patched(
            doc,
            PatchType::Merge,
            json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"teams": ["z"]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"teams": ["z"]}})
        );
    }

    #[test]
    fn json_patch_applies_and_reports_failures() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}});
        let out = patched(
            doc.clone(),
            PatchType::Json,
            json!([{"op": "add", "path": "/metadata/labels/b", "value": "2"}]),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["b"], "2");
        assert!(matches!(
            patched(
                doc.clone(),
                PatchType::Json,
                json!([{"op": "remove", "path": "/nope"}])
            ),
            Err(PatchError::Inapplicable(_))
        ));
        assert!(matches!(
            patched(doc, PatchType::Json, json!({"op": "add"})),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn json_patch_limits() {
        // A move chain nests one level per round: refused at the depth limit.
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": {}})];
        for _ in 0..(MAX_DEPTH + 5) {
            ops.push(json!({"op": "add", "path": "/b", "value": {}}));
            ops.push(json!({"op": "move", "from": "/a", "path": "/b/a"}));
            ops.push(json!({"op": "move", "from": "/b", "path": "/a"}));
        }
        let err = patched(json!({}), PatchType::Json, Value::Array(ops.clone())).unwrap_err();
        assert!(
            matches!(err, PatchError::Inapplicable(ref m) if m.contains("nested")),
            "{err}"
        );
        // Exactly at the limit applies.
        ops.truncate(1 + 3 * (MAX_DEPTH - 2));
        let out = patched(json!({}), PatchType::Json, Value::Array(ops)).unwrap();
        assert_eq!(depth(&out), MAX_DEPTH);
        // Self-copies stop at the accumulated copy limit.
        let mut ops = vec![json!({"op": "add", "path": "/m", "value": {"a": "x".repeat(1024)}})];
        for i in 0..40 {
            ops.push(json!({"op": "copy", "from": "/m", "path": format!("/m/c{i}")}));
        }
        let err = patched(json!({}), PatchType::Json, Value::Array(ops)).unwrap_err();
        assert!(
            matches!(err, PatchError::Inapplicable(ref m) if m.contains("unable to copy")),
            "{err}"
        );
        // Operation count.
        let ops =
            vec![json!({"op": "test", "path": "", "value": {}}); MAX_JSON_PATCH_OPERATIONS + 1];
        assert!(matches!(
            patched(json!({}), PatchType::Json, Value::Array(ops)),
            Err(PatchError::TooLarge(_))
        ));
    }

    #[test]
    fn text_depth_skips_strings() {
        let depth = |text: &[u8]| scan_json_text(text).depth;
        assert_eq!(depth(br#"{"a":[1,{"b":"[[[{{{\"]]"}]}"#), 3);
        assert_eq!(depth(b"1"), 0);
        assert_eq!(depth(b"[[[]]]"), 3);
    }

    #[test]
    fn text_scan_finds_a_nul_only_where_a_string_escapes_one() {
        let nul = |text: &[u8]| scan_json_text(text).nul;
        assert!(nul(br#"{"a":"x\u0000y"}"#));
        assert!(nul(br#"{"a\u0000":1}"#));
        assert!(nul(br#"["\\\u0000"]"#));
        // An escaped backslash followed by the text u0000, another code point, none at all.
        assert!(!nul(br#"{"a":"\\u0000"}"#));
        assert!(!nul(br#"{"a":"\u0001\u1000"}"#));
        assert!(!nul(br#"{"a":"\u000"}"#));
        assert!(!nul(br#"{"a":"u0000"}"#));
    }

    #[test]
    fn strategic_merge_honours_directives_and_merge_keys() {
        let doc = json!({
            "metadata": {"labels": {"a": "1"}, "finalizers": ["f1", "f2"],
                         "ownerReferences": [{"uid": "u1", "name": "one"}, {"uid": "u2", "name": "two"}]},
            "spec": {"teams": ["x"], "grant": {"name": "g"}}
        });
        let out = patched(
            doc,
            PatchType::StrategicMerge,
            json!({
                "$setElementOrder/metadata": [],
                "metadata": {
                    "labels": {"b": "2"},
                    "$deleteFromPrimitiveList/finalizers": ["f1"],
                    "ownerReferences": [{"uid": "u2", "name": "TWO"}, {"uid": "u1", "$patch": "delete"}, {"uid": "u3", "name": "three"}]
                },
                "spec": {"teams": ["y", "z"], "grant": {"$patch": "replace", "name": "h"}}
            }),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["f2"]));
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "u2", "name": "TWO"}, {"uid": "u3", "name": "three"}])
        );
        assert_eq!(
            out["spec"],
            json!({"teams": ["y", "z"], "grant": {"name": "h"}})
        );
        assert!(patched(json!({}), PatchType::StrategicMerge, json!({"$bogus": 1})).is_err());
        assert!(patched(json!({}), PatchType::StrategicMerge, json!([1])).is_err());
    }
}
