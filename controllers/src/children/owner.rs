//! Owner references and child metadata: every child of an MCPServer or a Host names its owner
//! in a controller owner reference (kube-controller-manager's garbage collector removes it
//! when the owner goes), built by kube's `Resource::controller_owner_ref`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde_json::{json, Value};

use super::error::Incomplete;

/// The owner's name, or which field it lacks.
pub fn name_of<K: Resource<DynamicType = ()>>(owner: &K) -> Result<&str, Incomplete> {
    owner
        .meta()
        .name
        .as_deref()
        .ok_or_else(|| Incomplete::missing::<K>("name"))
}

/// The owner's namespace (where its children go), or which field it lacks.
pub fn namespace_of<K: Resource<DynamicType = ()>>(owner: &K) -> Result<&str, Incomplete> {
    owner
        .meta()
        .namespace
        .as_deref()
        .ok_or_else(|| Incomplete::missing::<K>("namespace"))
}

/// The controller owner reference to `owner` (kube's helper), blocking the owner's
/// foreground deletion until the child is gone.
pub fn controller_ref<K: Resource<DynamicType = ()>>(
    owner: &K,
) -> Result<OwnerReference, Incomplete> {
    name_of(owner)?;
    let reference = owner
        .controller_owner_ref(&())
        .ok_or_else(|| Incomplete::missing::<K>("uid"))?;
    Ok(OwnerReference {
        block_owner_deletion: Some(true),
        ..reference
    })
}

/// The metadata of `owner`'s child `name`: in the owner's namespace, with `labels` and a
/// controller owner reference to the owner.
pub fn child_metadata<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: &str,
    labels: Value,
) -> Result<Value, Incomplete> {
    let reference = controller_ref(owner)?;
    let namespace = namespace_of(owner)?;
    Ok(json!({
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [reference],
    }))
}

/// The uid `meta`'s owner reference to a `K` names (controller or not), if it has one.
pub fn owner_uid<K: Resource<DynamicType = ()>>(meta: &ObjectMeta) -> Option<&str> {
    let group = K::group(&());
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.kind == K::kind(&())
                && o.api_version
                    .strip_prefix(group.as_ref())
                    .is_some_and(|version| version.starts_with('/'))
        })
        .map(|o| o.uid.as_str())
}

/// Whether `meta` is owned by `owner` itself (its owner reference names the owner's uid,
/// not the uid of an earlier object of the same name).
pub fn owned_by<K: Resource<DynamicType = ()>>(meta: &ObjectMeta, owner: &K) -> bool {
    owner
        .meta()
        .uid
        .as_deref()
        .is_some_and(|uid| owner_uid::<K>(meta) == Some(uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::{Host, HostSpec, LocalRef};

    fn mk_host(uid: Option<&str>) -> Host {
        let mut h = Host::new(
            "agent",
            HostSpec {
                context_ref: LocalRef { name: "dev".into() },
                image: "img".into(),
                resources: None,
                secret_ref: None,
                workspace_size: None,
            },
        );
        h.metadata.namespace = Some("team".into());
        h.metadata.uid = uid.map(Into::into);
        h
    }

    fn mk_meta(refs: Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": "agent", "ownerReferences": refs})).unwrap()
    }

    #[test]
    fn children_name_their_owner_as_controller() {
        let meta = child_metadata(&mk_host(Some("u1")), "agent-host", json!({"a": "b"})).unwrap();
        assert_eq!(
            meta,
            json!({
                "name": "agent-host", "namespace": "team", "labels": {"a": "b"},
                "ownerReferences": [{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
                    "name": "agent", "uid": "u1", "controller": true, "blockOwnerDeletion": true}],
            })
        );
        assert_eq!(
            child_metadata(&mk_host(None), "x", json!({})),
            Err(Incomplete::missing::<Host>("uid"))
        );
        let mut nameless = mk_host(Some("u1"));
        nameless.metadata.name = None;
        assert_eq!(
            controller_ref(&nameless),
            Err(Incomplete::missing::<Host>("name"))
        );
        let mut homeless = mk_host(Some("u1"));
        homeless.metadata.namespace = None;
        let err = child_metadata(&homeless, "x", json!({})).unwrap_err();
        assert_eq!(err.to_string(), "the Host has no namespace yet");
    }

    #[test]
    fn ownership_is_by_kind_group_and_uid() {
        let host = mk_host(Some("u1"));
        let ours = mk_meta(
            json!([{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
            "name": "agent", "uid": "u1", "controller": true}]),
        );
        assert_eq!(owner_uid::<Host>(&ours), Some("u1"));
        assert!(owned_by(&ours, &host));
        // A non-controller reference counts too (the owner is named either way).
        let plain = mk_meta(json!([{"apiVersion": "mcp-runtime.dev/v1", "kind": "Host",
            "name": "agent", "uid": "u1"}]));
        assert!(owned_by(&plain, &host));
        // The previous Host of that name, another kind, another group: not this Host's.
        let earlier = mk_meta(
            json!([{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
            "name": "agent", "uid": "u0"}]),
        );
        assert!(!owned_by(&earlier, &host));
        let server = mk_meta(json!([{"apiVersion": "mcp-runtime.dev/v1alpha1",
            "kind": "MCPServer", "name": "agent", "uid": "u1"}]));
        assert_eq!(owner_uid::<Host>(&server), None);
        let foreign = mk_meta(
            json!([{"apiVersion": "mcp-runtime.dev.evil/v1", "kind": "Host",
            "name": "agent", "uid": "u1"}]),
        );
        assert_eq!(owner_uid::<Host>(&foreign), None);
        assert!(!owned_by(&mk_meta(json!([])), &host));
        // An owner without a uid owns nothing.
        assert!(!owned_by(&ours, &mk_host(None)));
    }
}
