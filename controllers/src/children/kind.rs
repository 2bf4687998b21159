//! The kinds of children the controllers write, and one child to apply.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::core::ApiResource;
use serde_json::Value;

use super::digest::with_digest;

/// Every kind of child an owner of ours has (each owner uses a subset, in its own order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChildKind {
    ServiceAccount,
    ConfigMap,
    Secret,
    Role,
    RoleBinding,
    PersistentVolumeClaim,
    NetworkPolicy,
    Service,
    Deployment,
}

impl ChildKind {
    /// Every kind.
    pub const ALL: [ChildKind; 9] = [
        ChildKind::ServiceAccount,
        ChildKind::ConfigMap,
        ChildKind::Secret,
        ChildKind::Role,
        ChildKind::RoleBinding,
        ChildKind::PersistentVolumeClaim,
        ChildKind::NetworkPolicy,
        ChildKind::Service,
        ChildKind::Deployment,
    ];

    /// The kind's name (`kind` of its objects, the `kind` label of the write counter).
    pub fn as_str(self) -> &'static str {
        match self {
            ChildKind::ServiceAccount => "ServiceAccount",
            ChildKind::ConfigMap => "ConfigMap",
            ChildKind::Secret => "Secret",
            ChildKind::Role => "Role",
            ChildKind::RoleBinding => "RoleBinding",
            ChildKind::PersistentVolumeClaim => "PersistentVolumeClaim",
            ChildKind::NetworkPolicy => "NetworkPolicy",
            ChildKind::Service => "Service",
            ChildKind::Deployment => "Deployment",
        }
    }

    /// The API of the kind, from its k8s-openapi type.
    pub fn api_resource(self) -> ApiResource {
        match self {
            ChildKind::ServiceAccount => ApiResource::erase::<ServiceAccount>(&()),
            ChildKind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
            ChildKind::Secret => ApiResource::erase::<Secret>(&()),
            ChildKind::Role => ApiResource::erase::<Role>(&()),
            ChildKind::RoleBinding => ApiResource::erase::<RoleBinding>(&()),
            ChildKind::PersistentVolumeClaim => ApiResource::erase::<PersistentVolumeClaim>(&()),
            ChildKind::NetworkPolicy => ApiResource::erase::<NetworkPolicy>(&()),
            ChildKind::Service => ApiResource::erase::<Service>(&()),
            ChildKind::Deployment => ApiResource::erase::<Deployment>(&()),
        }
    }
}

/// One child object to apply: its kind (for the right API), its name and the apply body,
/// stamped with the body's digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub kind: ChildKind,
    pub name: String,
    pub body: Value,
}

impl Child {
    /// The child `name` of `kind` with `body` (whole, metadata included), its digest stamped
    /// into its annotations.
    pub fn new(kind: ChildKind, name: impl Into<String>, body: Value) -> Self {
        Child {
            kind,
            name: name.into(),
            body: with_digest(body),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DynamicObject;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn every_child_kind_finds_its_api() {
        let paths: Vec<String> = ChildKind::ALL
            .iter()
            .map(|k| DynamicObject::url_path(&k.api_resource(), Some("n")))
            .collect();
        assert_eq!(
            paths,
            [
                "/api/v1/namespaces/n/serviceaccounts",
                "/api/v1/namespaces/n/configmaps",
                "/api/v1/namespaces/n/secrets",
                "/apis/rbac.authorization.k8s.io/v1/namespaces/n/roles",
                "/apis/rbac.authorization.k8s.io/v1/namespaces/n/rolebindings",
                "/api/v1/namespaces/n/persistentvolumeclaims",
                "/apis/networking.k8s.io/v1/namespaces/n/networkpolicies",
                "/api/v1/namespaces/n/services",
                "/apis/apps/v1/namespaces/n/deployments",
            ]
        );
        for k in ChildKind::ALL {
            assert_eq!(k.api_resource().kind, k.as_str());
        }
    }

    #[test]
    fn a_new_child_carries_the_digest_of_its_body() {
        let body = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}});
        let child = Child::new(ChildKind::Service, "s", body.clone());
        assert_eq!(
            child.body["metadata"]["annotations"][super::super::DESIRED_DIGEST],
            super::super::digest(&body)
        );
        assert_eq!(child.name, "s");
    }
}
