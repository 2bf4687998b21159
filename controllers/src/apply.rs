//! Server-side apply of one child object, skipped when the live object already holds every
//! field of the desired one (a resync with nothing changed writes nothing).

use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, TypeMeta};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::mcpserver::desired::up_to_date;

/// Why a child could not be applied.
#[derive(Debug)]
pub enum ApplyError {
    Kube(kube::Error),
    /// The live or applied object did not encode as JSON.
    Encode(serde_json::Error),
}

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

/// Applies `body` as `name` with `field_manager` (forcing: the controller owns its fields)
/// unless the live object is already up to date; whether it wrote, and the object as it is
/// now. `None`: an object of that name is not this owner's ([`claimable`]) and was left alone.
pub async fn apply_if_changed<K>(
    api: Api<K>,
    field_manager: &str,
    name: &str,
    body: &Value,
) -> Result<Option<(bool, Value)>, ApplyError>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let live = api.get_opt(name).await.map_err(ApplyError::Kube)?;
    let live = serde_json::to_value(&live).map_err(ApplyError::Encode)?;
    if !claimable(body, &live) {
        return Ok(None);
    }
    if up_to_date(body, &live) {
        return Ok(Some((false, live)));
    }
    let params = PatchParams::apply(field_manager).force();
    let applied = api
        .patch(name, &params, &Patch::Apply(body))
        .await
        .map_err(ApplyError::Kube)?;
    let applied = serde_json::to_value(&applied).map_err(ApplyError::Encode)?;
    Ok(Some((true, applied)))
}

/// [`apply_if_changed`] for a namespaced child of any kind: its API is the one of the body's
/// `apiVersion` and `kind`.
pub async fn apply_child(
    client: &kube::Client,
    namespace: &str,
    field_manager: &str,
    name: &str,
    body: &Value,
) -> Result<Option<(bool, Value)>, ApplyError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource(body)?);
    apply_if_changed(api, field_manager, name, body).await
}

/// The API of `body`'s `apiVersion` and `kind` (every child kind's plural is the regular one).
fn api_resource(body: &Value) -> Result<ApiResource, ApplyError> {
    let types: TypeMeta = serde_json::from_value(
        serde_json::json!({"apiVersion": body["apiVersion"], "kind": body["kind"]}),
    )
    .map_err(ApplyError::Encode)?;
    let gvk = GroupVersionKind::try_from(&types)
        .map_err(|e| ApplyError::Encode(serde::de::Error::custom(e)))?;
    Ok(ApiResource::from_gvk(&gvk))
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
    fn every_child_kind_finds_its_api() {
        for (api_version, kind, path) in [
            (
                "v1",
                "ServiceAccount",
                "/api/v1/namespaces/n/serviceaccounts",
            ),
            ("v1", "ConfigMap", "/api/v1/namespaces/n/configmaps"),
            ("v1", "Service", "/api/v1/namespaces/n/services"),
            (
                "v1",
                "PersistentVolumeClaim",
                "/api/v1/namespaces/n/persistentvolumeclaims",
            ),
            (
                "apps/v1",
                "Deployment",
                "/apis/apps/v1/namespaces/n/deployments",
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "Role",
                "/apis/rbac.authorization.k8s.io/v1/namespaces/n/roles",
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                "/apis/rbac.authorization.k8s.io/v1/namespaces/n/rolebindings",
            ),
            (
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "/apis/networking.k8s.io/v1/namespaces/n/networkpolicies",
            ),
        ] {
            let resource = api_resource(&json!({"apiVersion": api_version, "kind": kind})).unwrap();
            assert_eq!(DynamicObject::url_path(&resource, Some("n")), path);
        }
        assert!(api_resource(&json!({"kind": "Service"})).is_err());
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
