//! Server-side apply under one field manager, skipped when the live object already holds
//! every field of the desired one (a resync with nothing changed writes nothing), and never
//! onto an object that is someone else's.

use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::digest::up_to_date;
use super::error::ReconcileError;
use super::kind::Child;

/// How often an owner whose children's names are held by other objects looks again (their
/// removal wakes nothing: they are not its children).
pub const NAME_CONFLICT_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// What `Ready=False NameConflict` and its Warning Event say, for an `owner` kind ("Host").
pub fn conflict_message(owner: &str, conflicts: &[String]) -> String {
    format!(
        "{}: not this {owner}'s, left alone; not deployed until removed (or the {owner} renamed)",
        conflicts.join(", ")
    )
}

/// Whether `live` (JSON; `null` when absent) is this controller's to write as `desired`:
/// absent, controlled by the owner `desired` names (same uid), or uncontrolled and carrying
/// every `mcp-runtime.dev/` label of `desired` (a child written before owner references, or
/// labelled by hand to be adopted). Anything else belongs to someone else: forcing an apply
/// onto it would take over its fields, and the owner reference would hand it to the garbage
/// collector when the owner goes (a Host named after a team's Service, once deleted, would
/// delete that Service).
pub fn claimable(desired: &Value, live: &Value) -> bool {
    if live.is_null() {
        return true;
    }
    let controller = |v: &Value| -> Option<Value> {
        v["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|o| o["controller"] == true)
            .map(|o| o["uid"].clone())
    };
    match controller(live) {
        Some(uid) => controller(desired) == Some(uid),
        None => desired["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("mcp-runtime.dev/"))
            .all(|(k, v)| live["metadata"]["labels"][k] == *v),
    }
}

/// A child after [`apply_child`]: whether it was written, and the object as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub written: bool,
    pub live: Value,
}

/// Server-side applies `body` as `name` with `field_manager`, forcing: the controller owns
/// the fields it sets.
pub async fn apply<K>(
    api: &Api<K>,
    field_manager: &str,
    name: &str,
    body: &Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(body),
    )
    .await
}

/// Server-side applies `body` to the status of `name` with `field_manager`, forcing: what
/// this manager leaves out of `body` it no longer owns, and no other manager's condition is
/// touched.
pub async fn apply_status<K>(
    api: &Api<K>,
    field_manager: &str,
    name: &str,
    body: &Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(body),
    )
    .await
}

/// Applies `body` as `name` unless the live object is already up to date; `None` when an
/// object of that name is not this owner's ([`claimable`]) and was left alone.
pub async fn apply_if_changed<K>(
    api: &Api<K>,
    field_manager: &str,
    kind: &'static str,
    name: &str,
    body: &Value,
) -> Result<Option<Applied>, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let encode = |e| ReconcileError::Encode(kind, e);
    let live = api.get_opt(name).await?;
    let live = serde_json::to_value(&live).map_err(encode)?;
    if !claimable(body, &live) {
        return Ok(None);
    }
    if up_to_date(body, &live) {
        return Ok(Some(Applied {
            written: false,
            live,
        }));
    }
    let applied = apply(api, field_manager, name, body).await?;
    let live = serde_json::to_value(&applied).map_err(encode)?;
    Ok(Some(Applied {
        written: true,
        live,
    }))
}

/// [`apply_if_changed`] for `child` of its owner in `namespace`, through the API of its kind.
pub async fn apply_child(
    client: &kube::Client,
    namespace: &str,
    field_manager: &str,
    child: &Child,
) -> Result<Option<Applied>, ReconcileError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &child.kind.api_resource());
    apply_if_changed(
        &api,
        field_manager,
        child.kind.as_str(),
        &child.name,
        &child.body,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn child(uid: &str) -> Value {
        json!({"metadata": {
            "name": "agent",
            "labels": {"mcp-runtime.dev/managed-by": "mcp-access-controllers",
                       "mcp-runtime.dev/host": "agent", "app": "agent"},
            "ownerReferences": [{"kind": "Host", "name": "agent", "uid": uid, "controller": true}],
        }})
    }

    #[test]
    fn only_what_is_absent_ours_or_labelled_ours_is_written() {
        let desired = child("u1");
        assert!(claimable(&desired, &Value::Null), "absent: created");
        assert!(claimable(&desired, &child("u1")), "ours");
        // The same name under another controller: a re-created Host's old child (until the
        // garbage collector takes it), an MCPServer's, a ReplicaSet's.
        assert!(!claimable(&desired, &child("u0")));
        let mut other = child("u1");
        other["metadata"]["ownerReferences"][0]["kind"] = json!("MCPServer");
        other["metadata"]["ownerReferences"][0]["uid"] = json!("s1");
        assert!(!claimable(&desired, &other));
        // Uncontrolled: a team's own object is not taken over.
        let theirs = json!({"metadata": {"name": "agent", "labels": {"app": "agent"}}});
        assert!(!claimable(&desired, &theirs));
        let unlabelled = json!({"metadata": {"name": "agent"}});
        assert!(!claimable(&desired, &unlabelled));
        // A non-controller owner reference does not make it ours either.
        let mut owned = theirs.clone();
        owned["metadata"]["ownerReferences"] = json!([{"kind": "Host", "uid": "u1"}]);
        assert!(!claimable(&desired, &owned));
        // Uncontrolled and labelled as this Host's child: adopted.
        let mut labelled = child("u1");
        labelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
        assert!(claimable(&desired, &labelled));
        // Labelled for another Host: not.
        labelled["metadata"]["labels"]["mcp-runtime.dev/host"] = json!("other");
        assert!(!claimable(&desired, &labelled));
    }
}
