//! Field management (`metadata.managedFields`) and server-side apply, as pure functions over
//! JSON objects: which manager owns which field, what an apply merges, where it conflicts
//! and what it prunes.
//!
//! It follows kube-apiserver's structured-merge-diff for the shapes this API has:
//! - objects are granular by field; `metadata.labels` and `metadata.annotations` are maps
//!   whose entries are owned one by one;
//! - `metadata.finalizers` is a set (`v:` elements), `metadata.ownerReferences` a list
//!   keyed by `uid` (`k:` elements); every other list is atomic (owned whole), as a CRD's
//!   lists are by default;
//! - identity and server-owned fields (`apiVersion`, `kind`, `status` of the main resource,
//!   `metadata.name`, `.namespace`, `.uid`, `.resourceVersion`, `.generation`,
//!   `.creationTimestamp`, `.deletionTimestamp`, `.managedFields`, …) are never owned.
//!
//! Field sets are stored as `FieldsV1` (`{"f:spec":{"f:teams":{}}}`): a path element is
//! `f:<field>`, `k:<key object>` or `v:<value>`, and `".":{}` marks a node that is itself
//! a member and has members below it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

/// The `apiVersion` every entry records.
const API_VERSION: &str = crate::API_VERSION;

/// One path to a field: its elements in `FieldsV1` form (`f:spec`, `k:{"uid":"…"}`, `v:"x"`).
pub type Path = Vec<String>;

/// A set of owned fields.
pub type FieldSet = BTreeSet<Path>;

/// Most characters a field manager name may have (kube-apiserver's limit).
pub const MAX_MANAGER_LEN: usize = 128;

/// The operation a managed-fields entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// One manager's entry: who, by which operation, and the fields it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manager {
    pub name: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<Time>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Manager {
    fn is(&self, name: &str, operation: Operation) -> bool {
        self.name == name && self.operation == operation && self.subresource.is_none()
    }

    /// How a conflict names this manager (kube-apiserver's wording).
    fn label(&self) -> String {
        let mut label = format!("{:?}", self.name);
        if let Some(sub) = &self.subresource {
            label.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == Operation::Update {
            label.push_str(&format!(" using {}", self.api_version));
        }
        label
    }
}

/// A field an apply would change that another manager owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager, as kube-apiserver names it (`"kubectl-edit" using v1`).
    pub manager: String,
    /// The field, as kube-apiserver prints it (`.spec.teams`, `.metadata.labels.team`).
    pub field: String,
}

/// An apply that conflicts and was not forced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", conflict_message(.0))]
pub struct Conflicts(pub Vec<Conflict>);

fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [one] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            one.manager, one.field
        );
    }
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (manager, fields) in by_manager {
        lines.push(format!("conflicts with {manager}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Why a request's `managedFields` or an apply configuration cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManagedFieldsError {
    #[error("metadata.managedFields must be nil")]
    ManagedFieldsInApply,
}

/// What a request's `metadata.managedFields` asks for (kube-apiserver's rules): absent or
/// undecodable keeps the stored entries; `[]` or `[{}]` resets them; anything else
/// replaces them.
pub fn requested_or_stored(
    requested: Option<&[ManagedFieldsEntry]>,
    stored: Option<&[ManagedFieldsEntry]>,
) -> Vec<Manager> {
    match requested {
        Some([]) => return Vec::new(),
        Some([only]) if *only == ManagedFieldsEntry::default() => return Vec::new(),
        Some(entries) => {
            if let Some(managers) = decode(entries) {
                if !managers.is_empty() {
                    return managers;
                }
            }
        }
        None => {}
    }
    stored.and_then(decode).unwrap_or_default()
}

/// Decodes stored entries; None when one of them is not a well-formed entry.
pub fn decode(entries: &[ManagedFieldsEntry]) -> Option<Vec<Manager>> {
    entries
        .iter()
        .map(|e| {
            let operation = match e.operation.as_deref()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            if e.fields_type.as_deref() != Some("FieldsV1") {
                return None;
            }
            let mut fields = FieldSet::new();
            decode_fields(&e.fields_v1.as_ref()?.0, &mut Vec::new(), &mut fields)?;
            Some(Manager {
                name: e.manager.clone().unwrap_or_default(),
                operation,
                api_version: e.api_version.clone().unwrap_or_default(),
                time: e.time.clone(),
                subresource: e.subresource.clone().filter(|s| !s.is_empty()),
                fields,
            })
        })
        .collect()
}

fn decode_fields(node: &Value, path: &mut Path, out: &mut FieldSet) -> Option<()> {
    let children = node.as_object()?;
    if children.is_empty() && !path.is_empty() {
        out.insert(path.clone());
    }
    for (element, child) in children {
        if element == "." {
            out.insert(path.clone());
            continue;
        }
        if !(element.starts_with("f:") || element.starts_with("k:") || element.starts_with("v:")) {
            return None;
        }
        path.push(element.clone());
        decode_fields(child, path, out)?;
        path.pop();
    }
    Some(())
}

/// The stored form of `managers` (None when no manager owns anything).
pub fn encode(managers: &[Manager]) -> Option<Vec<ManagedFieldsEntry>> {
    let entries: Vec<ManagedFieldsEntry> = managers
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| ManagedFieldsEntry {
            api_version: Some(m.api_version.clone()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(encode_fields(&m.fields))),
            manager: Some(m.name.clone()),
            operation: Some(m.operation.as_str().into()),
            subresource: m.subresource.clone(),
            time: m.time.clone(),
        })
        .collect();
    (!entries.is_empty()).then_some(entries)
}

fn encode_fields(fields: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut node = &mut root;
        for (i, element) in path.iter().enumerate() {
            let child = node
                .entry(element.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(child) = child else {
                unreachable!("every node is an object")
            };
            node = child;
            if i + 1 == path.len() && !node.is_empty() {
                node.insert(".".into(), Value::Object(Map::new()));
            }
        }
    }
    // A member that got members below it after it was inserted needs its "." marker.
    fn mark(node: &mut Map<String, Value>, path: &mut Path, fields: &FieldSet) {
        for (element, child) in node.iter_mut() {
            if element == "." {
                continue;
            }
            path.push(element.clone());
            if let Value::Object(child) = child {
                if !child.is_empty() && fields.contains(path) && !child.contains_key(".") {
                    child.insert(".".into(), Value::Object(Map::new()));
                }
                mark(child, path, fields);
            }
            path.pop();
        }
    }
    mark(&mut root, &mut Vec::new(), fields);
    Value::Object(root)
}

/// How the schema treats the node at a path (given as field names from the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Granular by field; a member only when empty.
    Struct,
    /// Granular by key, and a member itself (`metadata.labels`).
    Map,
    /// Owned whole.
    Atomic,
    /// A list of scalars owned element by element.
    Set,
    /// A list of objects owned element by element, identified by these fields.
    Keyed(&'static [&'static str]),
}

fn shape(fields: &[&str], value: &Value) -> Shape {
    match (fields, value) {
        (["metadata", "labels" | "annotations"], Value::Object(_)) => Shape::Map,
        (["metadata", "finalizers"], Value::Array(_)) => Shape::Set,
        (["metadata", "ownerReferences"], Value::Array(_)) => Shape::Keyed(&["uid"]),
        (["status", "conditions"], Value::Array(_)) => Shape::Keyed(&["type"]),
        (_, Value::Object(_)) => Shape::Struct,
        _ => Shape::Atomic,
    }
}

/// Fields no manager owns: identity, server-owned metadata and (on the main resource) status.
fn ignored(fields: &[&str]) -> bool {
    matches!(
        fields,
        ["apiVersion" | "kind" | "status"]
            | [
                "metadata",
                "name"
                    | "namespace"
                    | "uid"
                    | "resourceVersion"
                    | "generation"
                    | "creationTimestamp"
                    | "deletionTimestamp"
                    | "deletionGracePeriodSeconds"
                    | "managedFields"
                    | "selfLink"
            ]
    )
}

fn field(name: &str) -> String {
    format!("f:{name}")
}

fn key_of(item: &Value, keys: &[&str]) -> Option<String> {
    let mut key = Map::new();
    for k in keys {
        key.insert((*k).to_string(), item.get(*k)?.clone());
    }
    Some(format!("k:{}", Value::Object(key)))
}

/// Every owned-able node of `object` with its value: leaves carry their value, members that
/// have members below them (a map, a keyed element) carry None.
pub fn leaves(object: &Value) -> BTreeMap<Path, Option<Value>> {
    let mut out = BTreeMap::new();
    if let Value::Object(map) = object {
        walk_struct(map, &mut Vec::new(), &mut Vec::new(), &mut out);
    }
    out
}

/// The fields `object` sets: what an apply of it owns, or a create of it.
pub fn field_set(object: &Value) -> FieldSet {
    leaves(object).into_keys().collect()
}

fn walk_struct<'a>(
    map: &'a Map<String, Value>,
    names: &mut Vec<&'a str>,
    path: &mut Path,
    out: &mut BTreeMap<Path, Option<Value>>,
) {
    for (name, value) in map {
        names.push(name);
        if !ignored(names) && !value.is_null() {
            path.push(field(name));
            walk_value(value, names, path, out);
            path.pop();
        }
        names.pop();
    }
}

fn walk_value<'a>(
    value: &'a Value,
    names: &mut Vec<&'a str>,
    path: &mut Path,
    out: &mut BTreeMap<Path, Option<Value>>,
) {
    match (shape(names, value), value) {
        (Shape::Struct, Value::Object(map)) if map.is_empty() => {
            out.insert(path.clone(), Some(value.clone()));
        }
        (Shape::Struct, Value::Object(map)) => walk_struct(map, names, path, out),
        (Shape::Map, Value::Object(map)) => {
            out.insert(path.clone(), None);
            for (key, entry) in map {
                path.push(field(key));
                out.insert(path.clone(), Some(entry.clone()));
                path.pop();
            }
        }
        (Shape::Set, Value::Array(items)) => {
            for item in items {
                path.push(format!("v:{item}"));
                out.insert(path.clone(), Some(item.clone()));
                path.pop();
            }
        }
        (Shape::Keyed(keys), Value::Array(items))
            if items
                .iter()
                .all(|i| i.is_object() && key_of(i, keys).is_some()) =>
        {
            for item in items {
                if let (Some(key), Value::Object(fields)) = (key_of(item, keys), item) {
                    path.push(key);
                    out.insert(path.clone(), None);
                    walk_struct(fields, names, path, out);
                    path.pop();
                }
            }
        }
        _ => {
            out.insert(path.clone(), Some(value.clone()));
        }
    }
}

/// Manager name for a request without `fieldManager`: the User-Agent up to its first `/`,
/// as kube-apiserver derives it.
pub fn manager_from_user_agent(user_agent: Option<&str>) -> String {
    let prefix = user_agent
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("")
        .trim();
    let name: String = prefix.chars().take(MAX_MANAGER_LEN).collect();
    if name.is_empty() {
        "unknown".into()
    } else {
        name
    }
}

/// Checks a `fieldManager` parameter: at most 128 printable characters.
pub fn valid_manager(name: &str) -> bool {
    name.chars().count() <= MAX_MANAGER_LEN && name.chars().all(|c| !c.is_control())
}

/// Records a create, update or non-apply patch by `manager`: it takes every field it
/// changed, added or removed from `live` (None for a create) to `new`, and the other
/// managers give those up.
pub fn track_update(
    live: Option<&Value>,
    new: &Value,
    mut managers: Vec<Manager>,
    manager: &str,
    now: Timestamp,
) -> Vec<Manager> {
    let before = live.map(leaves).unwrap_or_default();
    let after = leaves(new);
    let changed: FieldSet = after
        .iter()
        .filter(|(path, value)| before.get(*path) != Some(*value))
        .map(|(path, _)| path.clone())
        .collect();
    let removed: FieldSet = before
        .keys()
        .filter(|path| !after.contains_key(*path))
        .cloned()
        .collect();
    if changed.is_empty() && removed.is_empty() {
        return managers;
    }
    for m in managers.iter_mut() {
        if !m.is(manager, Operation::Update) {
            m.fields
                .retain(|p| !changed.contains(p) && !removed.contains(p));
        }
    }
    let position = managers
        .iter()
        .position(|m| m.is(manager, Operation::Update));
    let entry = match position {
        Some(i) => &mut managers[i],
        None => {
            managers.push(Manager {
                name: manager.to_string(),
                operation: Operation::Update,
                api_version: API_VERSION.into(),
                time: None,
                subresource: None,
                fields: FieldSet::new(),
            });
            managers.last_mut().expect("just pushed")
        }
    };
    let owned: FieldSet = entry
        .fields
        .union(&changed)
        .filter(|p| !removed.contains(*p))
        .cloned()
        .collect();
    if owned != entry.fields || entry.time.is_none() {
        entry.fields = owned;
        entry.time = Some(Time(now));
        entry.api_version = API_VERSION.into();
    }
    managers.retain(|m| !m.fields.is_empty());
    managers
}

/// The result of a server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The object after the apply (identity and status as `live` has them).
    pub object: Value,
    pub managers: Vec<Manager>,
}

/// Server-side apply of `config` (an apply configuration: JSON, nulls meaning unset) by
/// `manager` onto `live`: merges it, refuses (unless `force`) to change a field another
/// manager owns, removes the fields `manager` applied before and no longer applies (unless
/// someone else owns them), and records `manager`'s `Apply` entry.
pub fn apply(
    live: &Value,
    config: &Value,
    mut managers: Vec<Manager>,
    manager: &str,
    force: bool,
    now: Timestamp,
) -> Result<Applied, Conflicts> {
    let applied = field_set(config);
    let mut object = live.clone();
    merge(&mut object, config, &mut Vec::new());
    let before = leaves(live);
    let after = leaves(&object);
    let changed: FieldSet = after
        .iter()
        .filter(|(path, value)| before.get(*path) != Some(*value))
        .map(|(path, _)| path.clone())
        .collect();

    let mut conflicts = Vec::new();
    for m in managers.iter_mut() {
        if m.is(manager, Operation::Apply) {
            continue;
        }
        let taken: FieldSet = m
            .fields
            .iter()
            .filter(|p| applied.contains(*p) && changed.contains(*p))
            .cloned()
            .collect();
        if taken.is_empty() {
            continue;
        }
        if force {
            m.fields.retain(|p| !taken.contains(p));
        } else {
            let label = m.label();
            conflicts.extend(taken.iter().map(|p| Conflict {
                manager: label.clone(),
                field: display(p),
            }));
        }
    }
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts));
    }

    let previous = managers
        .iter()
        .find(|m| m.is(manager, Operation::Apply))
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    let kept: FieldSet = managers
        .iter()
        .filter(|m| !m.is(manager, Operation::Apply))
        .flat_map(|m| m.fields.iter().cloned())
        .chain(applied.iter().cloned())
        .collect();
    let disowned: Vec<&Path> = previous.iter().filter(|p| !kept.contains(*p)).collect();
    // Deepest first, so a member goes only once nothing owned is left below it.
    for path in disowned.iter().rev() {
        let owned_below = kept
            .iter()
            .any(|k| k.len() > path.len() && k.starts_with(path));
        if !owned_below {
            remove(&mut object, path);
        }
    }

    match managers
        .iter_mut()
        .find(|m| m.is(manager, Operation::Apply))
    {
        Some(entry) => {
            if entry.fields != applied {
                entry.fields = applied;
                entry.time = Some(Time(now));
            }
        }
        None => managers.push(Manager {
            name: manager.to_string(),
            operation: Operation::Apply,
            api_version: API_VERSION.into(),
            time: Some(Time(now)),
            subresource: None,
            fields: applied,
        }),
    }
    managers.retain(|m| !m.fields.is_empty());
    Ok(Applied { object, managers })
}

/// The managers of an object created by an apply of it.
pub fn applied_create(config: &Value, manager: &str, now: Timestamp) -> Vec<Manager> {
    let fields = field_set(config);
    if fields.is_empty() {
        return Vec::new();
    }
    vec![Manager {
        name: manager.to_string(),
        operation: Operation::Apply,
        api_version: API_VERSION.into(),
        time: Some(Time(now)),
        subresource: None,
        fields,
    }]
}

/// Drops from every entry the fields `object` does not have: an apply configuration's
/// unknown fields, dropped when the object was decoded, are owned by nobody.
pub fn retain_present(managers: &mut Vec<Manager>, object: &Value) {
    let present = leaves(object);
    for m in managers.iter_mut() {
        m.fields.retain(|p| present.contains_key(p));
    }
    managers.retain(|m| !m.fields.is_empty());
}

/// Merges an apply configuration into `live`: fields replace, structs and maps merge,
/// sets and keyed lists merge element-wise, other lists are replaced.
fn merge(live: &mut Value, config: &Value, names: &mut Vec<String>) {
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    match (shape(&names_ref, config), live, config) {
        (Shape::Struct | Shape::Map, Value::Object(target), Value::Object(source)) => {
            for (key, value) in source {
                names.push(key.clone());
                let path: Vec<&str> = names.iter().map(String::as_str).collect();
                // Identity and status are not applied; resourceVersion is a precondition
                // and name/namespace were checked against the request path.
                let carried = matches!(
                    path.as_slice(),
                    ["metadata", "resourceVersion" | "name" | "namespace"]
                );
                if (!ignored(&path) || carried) && !value.is_null() {
                    match target.get_mut(key) {
                        Some(existing) => merge(existing, value, names),
                        None => {
                            target.insert(key.clone(), value.clone());
                        }
                    }
                }
                names.pop();
            }
        }
        (Shape::Set, Value::Array(target), Value::Array(source)) => {
            for item in source {
                if !target.contains(item) {
                    target.push(item.clone());
                }
            }
        }
        (Shape::Keyed(keys), Value::Array(target), Value::Array(source)) => {
            for item in source {
                let key = key_of(item, keys);
                match target
                    .iter_mut()
                    .find(|e| key.is_some() && key_of(e, keys) == key)
                {
                    Some(existing) => merge(existing, item, names),
                    None => target.push(item.clone()),
                }
            }
        }
        (_, live, config) => *live = config.clone(),
    }
}

/// Removes the node at `path` from `object`, and any struct or list left empty by it.
fn remove(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    fn parent_of<'a>(object: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
        let mut node = object;
        for element in path {
            node = child_mut(node, element)?;
        }
        Some(node)
    }
    let Some(parent) = parent_of(object, parents) else {
        return;
    };
    match (parent, last.split_at(2)) {
        (Value::Object(map), ("f:", name)) => {
            map.remove(name);
        }
        (Value::Array(items), ("v:", value)) => {
            if let Ok(value) = serde_json::from_str::<Value>(value) {
                items.retain(|i| *i != value);
            }
        }
        (Value::Array(items), ("k:", key)) => {
            if let Ok(Value::Object(key)) = serde_json::from_str::<Value>(key) {
                items.retain(|i| !key.iter().all(|(k, v)| i.get(k) == Some(v)));
            }
        }
        _ => return,
    }
    // Leave no empty container behind where pruning emptied it.
    if let Some(parent) = parent_of(object, parents) {
        let empty = match parent {
            Value::Object(m) => m.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => false,
        };
        if empty && !parents.is_empty() {
            remove(object, parents);
        }
    }
}

fn child_mut<'a>(node: &'a mut Value, element: &str) -> Option<&'a mut Value> {
    let (kind, rest) = element.split_at(2);
    match (node, kind) {
        (Value::Object(map), "f:") => map.get_mut(rest),
        (Value::Array(items), "k:") => {
            let Ok(Value::Object(key)) = serde_json::from_str::<Value>(rest) else {
                return None;
            };
            items
                .iter_mut()
                .find(|i| key.iter().all(|(k, v)| i.get(k) == Some(v)))
        }
        _ => None,
    }
}

/// A path as kube-apiserver prints it: `.spec.teams`, `.metadata.ownerReferences[uid="u"]`,
/// `.metadata.finalizers[="f"]`.
pub fn display(path: &Path) -> String {
    let mut out = String::new();
    for element in path {
        let (kind, rest) = element.split_at(2);
        match kind {
            "f:" => {
                out.push('.');
                out.push_str(rest);
            }
            "v:" => out.push_str(&format!("[={rest}]")),
            _ => {
                let key = match serde_json::from_str::<Value>(rest) {
                    Ok(Value::Object(key)) => key
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => rest.to_string(),
                };
                out.push_str(&format!("[{key}]"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-12-03T10:00:00Z".parse().unwrap()
    }

    fn later() -> Timestamp {
        "2026-12-03T11:00:00Z".parse().unwrap()
    }

    fn paths(fields: &FieldSet) -> Vec<String> {
        fields.iter().map(display).collect()
    }

    fn mk_agent(teams: &[&str], labels: Value) -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": "Agent",
            "metadata": {"name": "bot", "uid": "u1", "resourceVersion": "7", "labels": labels},
            "spec": {"teams": teams, "active": true},
            "status": {"activeSessions": 0}
        })
    }

    #[test]
    fn field_sets_skip_identity_and_status_and_own_map_entries() {
        let object = mk_agent(&["a"], json!({"team": "payments"}));
        assert_eq!(
            paths(&field_set(&object)),
            [
                ".metadata.labels",
                ".metadata.labels.team",
                ".spec.active",
                ".spec.teams"
            ]
        );
        let encoded = encode_fields(&field_set(&object));
        assert_eq!(
            encoded,
            json!({"f:metadata": {"f:labels": {".": {}, "f:team": {}}},
                   "f:spec": {"f:active": {}, "f:teams": {}}})
        );
        let mut decoded = FieldSet::new();
        decode_fields(&encoded, &mut Vec::new(), &mut decoded).unwrap();
        assert_eq!(decoded, field_set(&object));
    }

    #[test]
    fn sets_and_keyed_lists_are_owned_element_by_element() {
        let object = json!({"metadata": {
            "finalizers": ["a/b"],
            "ownerReferences": [{"uid": "u9", "name": "owner", "kind": "Agent"}]
        }});
        assert_eq!(
            paths(&field_set(&object)),
            [
                ".metadata.finalizers[=\"a/b\"]",
                ".metadata.ownerReferences[uid=\"u9\"]",
                ".metadata.ownerReferences[uid=\"u9\"].kind",
                ".metadata.ownerReferences[uid=\"u9\"].name",
                ".metadata.ownerReferences[uid=\"u9\"].uid",
            ]
        );
        let encoded = encode_fields(&field_set(&object));
        assert_eq!(
            encoded["f:metadata"]["f:ownerReferences"]["k:{\"uid\":\"u9\"}"],
            json!({".": {}, "f:kind": {}, "f:name": {}, "f:uid": {}})
        );
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_from_other_managers() {
        let created = mk_agent(&["a"], json!({"team": "x"}));
        let managers = track_update(None, &created, Vec::new(), "kubectl-create", now());
        assert_eq!(managers.len(), 1);
        let mut edited = created.clone();
        edited["spec"]["teams"] = json!(["a", "b"]);
        let managers = track_update(Some(&created), &edited, managers, "kubectl-edit", later());
        assert_eq!(managers.len(), 2);
        assert_eq!(
            paths(&managers[0].fields),
            [".metadata.labels", ".metadata.labels.team", ".spec.active"]
        );
        assert_eq!(paths(&managers[1].fields), [".spec.teams"]);
        assert_eq!(managers[1].time, Some(Time(later())));
        // An unchanged object changes no entry, not even its time.
        let again = track_update(
            Some(&edited),
            &edited,
            managers.clone(),
            "kubectl-edit",
            now(),
        );
        assert_eq!(again, managers);
    }

    #[test]
    fn an_apply_conflicts_on_a_changed_field_owned_by_another_manager() {
        let live = mk_agent(&["a"], json!({}));
        let managers = track_update(None, &live, Vec::new(), "kubectl-create", now());
        let config = json!({"apiVersion": API_VERSION, "kind": "Agent",
                            "metadata": {"name": "bot"}, "spec": {"teams": ["b"]}});
        let err = apply(&live, &config, managers.clone(), "gitops", false, now()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Apply failed with 1 conflict: conflict with \"kubectl-create\" using {API_VERSION}: .spec.teams")
        );
        // The same value is shared ownership, not a conflict.
        let same = json!({"metadata": {"name": "bot"}, "spec": {"teams": ["a"]}});
        let shared = apply(&live, &same, managers.clone(), "gitops", false, now()).unwrap();
        assert_eq!(shared.object, live);
        assert!(shared.managers[0]
            .fields
            .contains(&vec!["f:spec".to_string(), "f:teams".to_string()]));
        // Forced, the field changes hands.
        let forced = apply(&live, &config, managers, "gitops", true, now()).unwrap();
        assert_eq!(forced.object["spec"]["teams"], json!(["b"]));
        assert_eq!(
            paths(&forced.managers[0].fields),
            [".metadata.labels", ".spec.active"]
        );
        assert_eq!(forced.managers[1].name, "gitops");
        assert_eq!(forced.managers[1].operation, Operation::Apply);
        assert_eq!(paths(&forced.managers[1].fields), [".spec.teams"]);
    }

    #[test]
    fn conflicts_with_several_managers_are_listed_by_manager() {
        let err = Conflicts(vec![
            Conflict {
                manager: "\"b\"".into(),
                field: ".spec.x".into(),
            },
            Conflict {
                manager: "\"a\"".into(),
                field: ".spec.y".into(),
            },
        ]);
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.y\nconflicts with \"b\":\n- .spec.x"
        );
    }

    #[test]
    fn an_apply_removes_what_it_applied_before_unless_someone_else_owns_it() {
        let config1 = json!({"metadata": {"name": "bot", "labels": {"a": "1", "b": "2"}},
                             "spec": {"teams": ["t"], "displayName": "Bot"}});
        let created = json!({"metadata": {"name": "bot", "uid": "u", "labels": {"a": "1", "b": "2"}},
                             "spec": {"teams": ["t"], "displayName": "Bot", "active": true}});
        let managers = applied_create(&config1, "gitops", now());
        // Another manager also sets label b (same value: shared).
        let mut edited = created.clone();
        edited["metadata"]["labels"]["c"] = json!("3");
        let managers = track_update(Some(&created), &edited, managers, "kubectl-label", now());
        let shared = apply(
            &edited,
            &json!({"metadata": {"labels": {"b": "2"}}}),
            managers,
            "other",
            false,
            now(),
        )
        .unwrap();
        // gitops drops label a, label b, displayName.
        let config2 = json!({"metadata": {"name": "bot"}, "spec": {"teams": ["t"]}});
        let out = apply(
            &shared.object,
            &config2,
            shared.managers,
            "gitops",
            false,
            later(),
        )
        .unwrap();
        assert_eq!(
            out.object["metadata"]["labels"],
            json!({"b": "2", "c": "3"}),
            "a is removed; b is still owned by another applier; c by an updater"
        );
        assert!(out.object["spec"].get("displayName").is_none());
        assert_eq!(out.object["spec"]["active"], json!(true), "never applied");
        let gitops = out.managers.iter().find(|m| m.name == "gitops").unwrap();
        assert_eq!(paths(&gitops.fields), [".spec.teams"]);
        assert_eq!(gitops.time, Some(Time(later())));
    }

    #[test]
    fn pruning_the_last_label_removes_the_emptied_map() {
        let config1 = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"teams": ["t"]}});
        let live =
            json!({"metadata": {"name": "x", "labels": {"a": "1"}}, "spec": {"teams": ["t"]}});
        let managers = applied_create(&config1, "m", now());
        let out = apply(
            &live,
            &json!({"spec": {"teams": ["t"]}}),
            managers,
            "m",
            false,
            now(),
        )
        .unwrap();
        assert_eq!(
            out.object,
            json!({"metadata": {"name": "x"}, "spec": {"teams": ["t"]}})
        );
    }

    #[test]
    fn apply_merges_sets_and_keyed_lists_and_keeps_identity_and_status() {
        let live = json!({
            "metadata": {"name": "x", "uid": "u", "finalizers": ["f1"],
                         "ownerReferences": [{"uid": "o1", "name": "one"}]},
            "status": {"phase": "Active"}
        });
        let config = json!({
            "metadata": {"uid": "forged", "finalizers": ["f2"],
                         "ownerReferences": [{"uid": "o1", "name": "ONE"}, {"uid": "o2", "name": "two"}]},
            "status": {"phase": "Revoked"}
        });
        let out = apply(&live, &config, Vec::new(), "m", false, now()).unwrap();
        assert_eq!(out.object["metadata"]["uid"], "u");
        assert_eq!(out.object["status"]["phase"], "Active");
        assert_eq!(out.object["metadata"]["finalizers"], json!(["f1", "f2"]));
        assert_eq!(
            out.object["metadata"]["ownerReferences"],
            json!([{"uid": "o1", "name": "ONE"}, {"uid": "o2", "name": "two"}])
        );
    }

    #[test]
    fn request_managed_fields_replace_reset_or_fall_back() {
        let stored = encode(&applied_create(&json!({"spec": {"a": 1}}), "m", now())).unwrap();
        let other = encode(&applied_create(&json!({"spec": {"b": 1}}), "n", now())).unwrap();
        assert_eq!(requested_or_stored(None, Some(&stored))[0].name, "m");
        assert!(requested_or_stored(Some(&[]), Some(&stored)).is_empty());
        assert!(
            requested_or_stored(Some(&[ManagedFieldsEntry::default()]), Some(&stored)).is_empty()
        );
        assert_eq!(
            requested_or_stored(Some(&other), Some(&stored))[0].name,
            "n"
        );
        let broken = vec![ManagedFieldsEntry {
            operation: Some("Steal".into()),
            ..other[0].clone()
        }];
        assert_eq!(
            requested_or_stored(Some(&broken), Some(&stored))[0].name,
            "m"
        );
    }

    #[test]
    fn manager_names_follow_kube_apiserver() {
        assert_eq!(
            manager_from_user_agent(Some("kubectl/v1.36.0 (linux/amd64)")),
            "kubectl"
        );
        assert_eq!(manager_from_user_agent(None), "unknown");
        assert!(valid_manager("kubectl-client-side-apply"));
        assert!(!valid_manager(&"m".repeat(129)));
        assert!(!valid_manager("a\u{7}b"));
    }
}
