//! The children of the controllers' owners, in one place for the MCPServer, Host and
//! NetworkPolicy controllers: each computes its desired children as JSON (a pure function),
//! and this module says how every child is labelled ([`MANAGED_BY_LABEL`]), owned
//! ([`child_metadata`], through kube's `Resource::controller_owner_ref`), stamped with the
//! digest of its body ([`Child::new`], [`DESIRED_DIGEST`]), compared with its live object
//! ([`up_to_date`]), applied with server-side apply under the controller's field manager
//! ([`apply_child`], [`apply`]), and deleted only when it is ours ([`prune_owned`],
//! [`delete_exact`]). A reconcile fails with the one [`ReconcileError`].
//!
//! - `kind.rs`: [`ChildKind`] (every kind a controller writes, with its API) and [`Child`];
//! - `digest.rs`: the digest annotation and the compare-before-apply check;
//! - `owner.rs`: owner references, child metadata, and whose child an object is;
//! - `apply.rs`: apply-if-changed, and what is ours to write ([`claimable`]);
//! - `prune.rs`: deletes that never take someone else's object;
//! - `error.rs`: [`ReconcileError`] and [`Incomplete`].

mod apply;
mod digest;
mod error;
mod kind;
mod owner;
mod prune;

use std::collections::BTreeMap;

pub use apply::{
    apply, apply_child, apply_if_changed, apply_status, claimable, conflict_message, Applied,
    NAME_CONFLICT_RETRY,
};
pub use digest::{contains, digest, quantity, up_to_date, with_digest, DESIRED_DIGEST};
pub use error::{Incomplete, ReconcileError};
pub use kind::{Child, ChildKind};
pub use owner::{child_metadata, controller_ref, name_of, namespace_of, owned_by, owner_uid};
pub use prune::{delete_exact, list_managed, prune_owned};

/// Label naming the component that manages an object (with [`MANAGED_BY`] as its value).
pub const MANAGED_BY_LABEL: &str = "mcp-runtime.dev/managed-by";
/// Our value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "mcp-access-controllers";

/// Whether `labels` carry our managed-by label (the first condition of anything we delete).
pub fn is_managed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
}

/// The label selector of our objects (`managed-by=ours`), narrowed by `also` (label
/// selector terms such as a key that must exist): what the watches and sweeps list.
pub fn managed_selector(also: &[&str]) -> String {
    std::iter::once(format!("{MANAGED_BY_LABEL}={MANAGED_BY}"))
        .chain(also.iter().map(|s| s.to_string()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_means_our_value_of_the_label() {
        let labels = |v: &str| BTreeMap::from([(MANAGED_BY_LABEL.to_string(), v.to_string())]);
        assert!(is_managed(&labels(MANAGED_BY)));
        assert!(!is_managed(&labels("helm")));
        assert!(!is_managed(&BTreeMap::new()));
        assert_eq!(
            managed_selector(&[]),
            "mcp-runtime.dev/managed-by=mcp-access-controllers"
        );
        assert_eq!(
            managed_selector(&["mcp-runtime.dev/host"]),
            "mcp-runtime.dev/managed-by=mcp-access-controllers,mcp-runtime.dev/host"
        );
    }
}
