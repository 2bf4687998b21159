//! Which live Host children a sweep deletes: a pure function of the objects carrying our
//! managed-by and host labels, the Hosts that exist and the caps.
//!
//! An object is an **orphan** when no Host of its namespace carries its host label, or when
//! its Host owner reference names another uid than the live Host's (the Host was deleted and
//! re-created: the old runtime is not the new Host's). What becomes of an orphan depends on
//! what it grants:
//! - the `*-host-egress` NetworkPolicy (an allow), the Role and RoleBinding (grants to the
//!   Host's ServiceAccount) and the Deployment (a workload that no Host stands for, which must
//!   not outlive the egress policy that confined it) go at once, whatever the count: deleting
//!   them only narrows access;
//! - the inert rest (ServiceAccount, Service, the workspace PVC) goes only while such orphans
//!   are few: at most the absolute cap and at most the percentage of every managed host
//!   object; over either, none of them is deleted and the caller alerts, because a mass
//!   disappearance of Hosts is more likely a fault (an empty cache, a wrong cluster) than an
//!   intent, and a workspace deleted by mistake is lost.

use std::collections::{BTreeMap, BTreeSet};

use super::desired::{host_label, HOST_LABEL};
use crate::children::{is_managed, ChildKind};
use crate::netpol::settings::SweepCaps;

/// A live child as the sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChild {
    pub kind: ChildKind,
    pub namespace: String,
    pub name: String,
    /// Deleted with this uid as precondition, so an object re-created meanwhile stays.
    pub uid: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The uid of its `Host` owner reference, if it has one.
    pub owner_uid: Option<String>,
    /// Already being deleted (a finalizer holds it): counted, never deleted again.
    pub deleting: bool,
}

/// A live Host: namespace, name, uid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveHost {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What one sweep does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Deleted this pass: every orphaned grant (policy, Role, RoleBinding) and workload, and
    /// the inert orphans when within the caps.
    pub delete: Vec<LiveChild>,
    /// Inert orphans found but kept because they are over a cap (empty when within). Never
    /// a grant or a workload.
    pub withheld: Vec<LiveChild>,
    /// Managed host objects alive now: the fleet the percentage is taken of.
    pub fleet: usize,
}

/// Whether `child` is an orphan of the `hosts` ((namespace, host label) → uids).
fn orphan(child: &LiveChild, hosts: &BTreeMap<(String, String), BTreeSet<String>>) -> bool {
    let Some(label) = child.labels.get(HOST_LABEL) else {
        return false;
    };
    match hosts.get(&(child.namespace.clone(), label.clone())) {
        None => true,
        Some(uids) => child.owner_uid.as_ref().is_some_and(|u| !uids.contains(u)),
    }
}

/// Whether an orphan of `kind` goes whatever the caps: it grants access (the egress allow,
/// the Role and its binding) or runs under such grants (the Deployment).
pub fn always_deleted(kind: ChildKind) -> bool {
    matches!(
        kind,
        ChildKind::NetworkPolicy | ChildKind::Role | ChildKind::RoleBinding | ChildKind::Deployment
    )
}

/// The plan for `live` (objects listed by our managed-by and host labels) against `hosts`.
pub fn plan(live: &[LiveChild], hosts: &[LiveHost], caps: SweepCaps) -> SweepPlan {
    let mut by_label: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for h in hosts {
        by_label
            .entry((h.namespace.clone(), host_label(&h.name)))
            .or_default()
            .insert(h.uid.clone());
    }
    let mut out = SweepPlan::default();
    let mut orphans = Vec::new();
    for child in live {
        if !is_managed(&child.labels) || !child.labels.contains_key(HOST_LABEL) {
            continue;
        }
        out.fleet += 1;
        if !child.deleting && orphan(child, &by_label) {
            if always_deleted(child.kind) {
                out.delete.push(child.clone());
            } else {
                orphans.push(child.clone());
            }
        }
    }
    if crate::netpol::sweep::within_caps(orphans.len(), out.fleet, caps) {
        out.delete.extend(orphans);
    } else {
        out.withheld = orphans;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::{MANAGED_BY, MANAGED_BY_LABEL};
    use crate::host::desired::KINDS;

    fn child(kind: ChildKind, ns: &str, host: &str, owner: Option<&str>) -> LiveChild {
        LiveChild {
            kind,
            namespace: ns.into(),
            name: format!("{host}-{}", kind.as_str()),
            uid: Some(format!("uid-{host}-{}", kind.as_str())),
            labels: BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                (HOST_LABEL.to_string(), host_label(host)),
            ]),
            owner_uid: owner.map(Into::into),
            deleting: false,
        }
    }

    fn host(ns: &str, name: &str, uid: &str) -> LiveHost {
        LiveHost {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    const CAPS: SweepCaps = SweepCaps {
        max: 10,
        max_percent: 50,
    };

    fn runtime(ns: &str, name: &str, owner: Option<&str>) -> Vec<LiveChild> {
        KINDS
            .into_iter()
            .map(|k| child(k, ns, name, owner))
            .collect()
    }

    #[test]
    fn a_deleted_or_recreated_host_leaves_orphans() {
        let hosts = [host("team", "alive", "u1"), host("team", "recreated", "u2")];
        let mut live = runtime("team", "alive", Some("u1"));
        live.extend(runtime("team", "alive", Some("u1")));
        live.extend(runtime("team", "alive", Some("u1")));
        let gone = child(ChildKind::Deployment, "team", "gone", Some("u9"));
        let stale = child(ChildKind::Service, "team", "recreated", Some("u-old"));
        let other_ns = child(ChildKind::Role, "elsewhere", "alive", Some("u1"));
        // Labelled for a live Host but without an owner: adopted by the next apply, kept.
        let unowned = child(ChildKind::ServiceAccount, "team", "alive", None);
        // Already on its way out (a finalizer holds it): nothing to do.
        let mut terminating = child(ChildKind::PersistentVolumeClaim, "team", "gone", None);
        terminating.deleting = true;
        live.extend([
            gone.clone(),
            stale.clone(),
            other_ns.clone(),
            unowned,
            terminating,
        ]);
        let p = plan(&live, &hosts, CAPS);
        // Grants and workloads first (never capped), then the inert rest within the caps.
        assert_eq!(p.delete, vec![gone, other_ns, stale]);
        assert!(p.withheld.is_empty());
        assert_eq!(p.fleet, 26);
    }

    #[test]
    fn long_host_names_match_by_their_fitted_label() {
        let name = "h".repeat(90);
        let hosts = [host("team", &name, "u1")];
        let live = runtime("team", &name, Some("u1"));
        assert!(plan(&live, &hosts, CAPS).delete.is_empty());
    }

    #[test]
    fn objects_without_both_labels_are_not_ours() {
        let mut foreign = child(ChildKind::Deployment, "team", "gone", None);
        foreign
            .labels
            .insert(MANAGED_BY_LABEL.into(), "someone-else".into());
        let mut unlabelled = child(ChildKind::Deployment, "team", "gone", None);
        unlabelled.labels.remove(HOST_LABEL);
        let p = plan(&[foreign, unlabelled], &[], CAPS);
        assert_eq!(p, SweepPlan::default());
    }

    #[test]
    fn over_either_cap_nothing_is_deleted() {
        let hosts = [host("team", "alive", "u1")];
        let keep: Vec<LiveChild> = (0..4)
            .flat_map(|_| runtime("team", "alive", Some("u1")))
            .collect(); // 28
        let orphans = |n: usize| -> Vec<LiveChild> {
            (0..n)
                .map(|i| child(ChildKind::Service, "team", &format!("ghost-{i}"), None))
                .collect()
        };
        let mut ten = keep.clone();
        ten.extend(orphans(10));
        let p = plan(&ten, &hosts, CAPS);
        assert_eq!((p.delete.len(), p.withheld.len(), p.fleet), (10, 0, 38));

        let mut eleven = keep.clone();
        eleven.extend(orphans(11));
        let p = plan(&eleven, &hosts, CAPS);
        assert_eq!((p.delete.len(), p.withheld.len()), (0, 11), "absolute cap");

        // The percentage: 3 orphans of 4 objects is 75 % > 50 %.
        let mut few = runtime("team", "alive", Some("u1"))[..1].to_vec();
        few.extend(orphans(3));
        let p = plan(&few, &hosts, CAPS);
        assert_eq!((p.delete.len(), p.withheld.len()), (0, 3), "percentage cap");

        // Cap 1: two orphans are over it, one is not.
        let one = SweepCaps {
            max: 1,
            max_percent: 100,
        };
        assert_eq!(plan(&orphans(2), &[], one).withheld.len(), 2);
        assert_eq!(plan(&orphans(1), &[], one).delete.len(), 1);
    }

    /// Twelve deleted Hosts leave 84 orphans, far over both caps: their egress allows, Roles,
    /// RoleBindings and Deployments still go; only the inert rest is held back.
    #[test]
    fn orphaned_grants_and_workloads_go_past_the_caps() {
        let hosts = [host("team", "alive", "u1")];
        let mut live = runtime("team", "alive", Some("u1"));
        for i in 0..12 {
            live.extend(runtime("team", &format!("gone-{i}"), Some("u9")));
        }
        let p = plan(&live, &hosts, CAPS);
        let kinds = |v: &[LiveChild]| -> BTreeSet<&'static str> {
            v.iter().map(|c| c.kind.as_str()).collect()
        };
        assert_eq!(p.delete.len(), 48, "4 kinds × 12 Hosts");
        assert_eq!(
            kinds(&p.delete),
            BTreeSet::from(["Deployment", "NetworkPolicy", "Role", "RoleBinding"])
        );
        assert!(p
            .delete
            .iter()
            .any(|c| c.kind == ChildKind::NetworkPolicy && c.name == "gone-11-NetworkPolicy"));
        assert_eq!(p.withheld.len(), 36, "3 inert kinds × 12 Hosts");
        assert_eq!(
            kinds(&p.withheld),
            BTreeSet::from(["PersistentVolumeClaim", "Service", "ServiceAccount"])
        );
    }
}
