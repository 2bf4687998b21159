//! `kube::Resource` for the served kinds, so kube-rs clients (`Api<AccessSession>`,
//! `watcher`, reflectors) work with the typed objects instead of `DynamicObject`.
//!
//! Every fact comes from the kind's [`Kind`] constants: one source for the apiserver's routing
//! and the clients' URLs.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};

use crate::types::{
    AccessSession, Agent, Enrollment, Kind, Revocation, ToolPolicy, GROUP, VERSION,
};

macro_rules! kube_resource {
    ($ty:ty, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$ty as Kind>::KIND)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$ty as Kind>::PLURAL)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

kube_resource!(AccessSession, NamespaceResourceScope);
kube_resource!(Agent, ClusterResourceScope);
kube_resource!(Enrollment, NamespaceResourceScope);
kube_resource!(Revocation, NamespaceResourceScope);
kube_resource!(ToolPolicy, NamespaceResourceScope);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn urls_match_the_served_paths() {
        assert_eq!(
            AccessSession::url_path(&(), Some("team-a")),
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/team-a/accesssessions"
        );
        assert_eq!(
            AccessSession::url_path(&(), None),
            "/apis/access.mcp-runtime.dev/v1alpha1/accesssessions"
        );
        assert_eq!(
            Agent::url_path(&(), None),
            "/apis/access.mcp-runtime.dev/v1alpha1/agents"
        );
        assert_eq!(Revocation::api_version(&()), crate::types::API_VERSION);
        assert_eq!(Enrollment::kind(&()), "Enrollment");
    }
}
