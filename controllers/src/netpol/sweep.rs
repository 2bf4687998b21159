//! Which live NetworkPolicies a pass deletes: a pure function of the live managed policies,
//! the desired set, the owners that exist and the caps.
//!
//! A policy is ours only when it carries [`MANAGED_BY_LABEL`] with our value *and* a known
//! [`POLICY_TYPE_LABEL`]; anything else is never touched, whatever its name. One of ours that
//! is no longer desired is either
//! - **obsolete**: every owner its labels name still exists (a Context stopped granting a
//!   server, a binding was removed, a server is being deleted): it goes at once, because an
//!   allow its owner no longer implies must not outlive the change; or
//! - **orphaned**: an owner it names is gone (a deleted Context or MCPServer, a namespace
//!   dropped from `--runtime-namespace`). What becomes of an orphan depends on what its
//!   deletion does:
//!   - an **allow** (L2 ingress and egress, L3, `spec.network`) goes at once, whatever the
//!     count: deleting it only narrows access, and a stale allow must never outlive its owner;
//!   - a **namespace layer** (L0 deny-all and the L1 infrastructure beside it) goes only while
//!     such orphans are few: deleting a deny widens access, so over the absolute cap or the
//!     percentage of the managed fleet none is deleted and the caller alerts, because a mass
//!     disappearance of runtime namespaces is more likely a fault (a wrong flag) than an
//!     intent. The L1 policies are held with their L0 so a namespace is never left with its
//!     deny and without the DNS and sync paths, or the reverse.
//!
//! A policy that names no owner at all (labels stripped by hand) is neither: it is left alone.

use std::collections::{BTreeMap, BTreeSet};

use super::desired::{
    PolicyType, CONTEXT_LABEL, CONTEXT_NAMESPACE_LABEL, POLICY_TYPE_LABEL, SERVER_NAMESPACE_LABEL,
};
use super::settings::SweepCaps;
use crate::children::is_managed;
use crate::mcpserver::desired::SERVER_LABEL;

/// A live policy as the sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePolicy {
    pub namespace: String,
    pub name: String,
    /// Deleted with this uid as precondition, so a policy re-created meanwhile stays.
    pub uid: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// The owners that exist now: (namespace, name) of MCPServers and Contexts (being deleted
/// or not), and the runtime namespaces.
#[derive(Debug, Default)]
pub struct Owners {
    pub servers: BTreeSet<(String, String)>,
    pub contexts: BTreeSet<(String, String)>,
    pub runtime_namespaces: BTreeSet<String>,
}

/// What becomes of one live policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not ours (no managed-by label, or an unknown type): never touched.
    NotOurs,
    /// Ours and still desired: kept (and applied if it differs).
    Desired,
    /// Ours, not desired, every owner alive: deleted now.
    Obsolete,
    /// Ours, not desired, an owner gone: deleted at once if an allow, within the caps if a
    /// namespace layer (L0/L1).
    Orphan,
    /// Ours by its labels but naming no owner: left alone.
    Ownerless,
}

/// The type of a policy that carries both of our labels.
pub fn managed_type(labels: &BTreeMap<String, String>) -> Option<PolicyType> {
    if !is_managed(labels) {
        return None;
    }
    PolicyType::parse(labels.get(POLICY_TYPE_LABEL)?)
}

/// The verdict on `live` given the desired (namespace, name) pairs and the owners.
pub fn classify(
    live: &LivePolicy,
    desired: &BTreeSet<(String, String)>,
    owners: &Owners,
) -> Verdict {
    let Some(policy_type) = managed_type(&live.labels) else {
        return Verdict::NotOurs;
    };
    if desired.contains(&(live.namespace.clone(), live.name.clone())) {
        return Verdict::Desired;
    }
    let label = |k: &str| live.labels.get(k).cloned();
    let server = |ns: Option<String>| Some((ns?, label(SERVER_LABEL)?));
    let context = |ns: Option<String>| Some((ns?, label(CONTEXT_LABEL)?));
    let own_ns = Some(live.namespace.clone());
    // Every owner the policy names, each as "exists?"; None: it names none it should.
    let alive: Option<Vec<bool>> = match policy_type {
        t if t.is_namespace_layer() => {
            Some(vec![owners.runtime_namespaces.contains(&live.namespace)])
        }
        PolicyType::ExternalEgress | PolicyType::ServerIngress | PolicyType::ServerEgress => {
            server(own_ns).map(|s| vec![owners.servers.contains(&s)])
        }
        PolicyType::ContextIngress => {
            match (server(own_ns), context(label(CONTEXT_NAMESPACE_LABEL))) {
                (Some(s), Some(c)) => Some(vec![
                    owners.servers.contains(&s),
                    owners.contexts.contains(&c),
                ]),
                _ => None,
            }
        }
        PolicyType::ContextEgress => {
            match (context(own_ns), server(label(SERVER_NAMESPACE_LABEL))) {
                (Some(c), Some(s)) => Some(vec![
                    owners.contexts.contains(&c),
                    owners.servers.contains(&s),
                ]),
                _ => None,
            }
        }
        _ => None,
    };
    match alive {
        None => Verdict::Ownerless,
        Some(alive) if alive.iter().all(|a| *a) => Verdict::Obsolete,
        Some(_) => Verdict::Orphan,
    }
}

/// What one sweep does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Deleted this pass: every obsolete policy, every orphaned allow, and the orphaned
    /// namespace layers when within the caps.
    pub delete: Vec<LivePolicy>,
    /// How many of `delete` are orphaned allows (gone whatever the caps).
    pub orphan_allows: usize,
    /// Orphaned namespace layers (L0/L1) kept because they are over a cap (empty when
    /// within). Never an allow.
    pub withheld: Vec<LivePolicy>,
    /// Policies of ours (both labels) alive now: the fleet the percentage is taken of.
    pub fleet: usize,
}

/// The plan for `live` (the policies carrying our managed-by label).
pub fn plan(
    live: &[LivePolicy],
    desired: &BTreeSet<(String, String)>,
    owners: &Owners,
    caps: SweepCaps,
) -> SweepPlan {
    let mut out = SweepPlan::default();
    // Only the orphaned namespace layers are counted against the caps: deleting them widens
    // access. An orphaned allow goes like an obsolete one.
    let mut orphans = Vec::new();
    for policy in live {
        let verdict = classify(policy, desired, owners);
        if verdict != Verdict::NotOurs {
            out.fleet += 1;
        }
        match verdict {
            Verdict::Obsolete => out.delete.push(policy.clone()),
            Verdict::Orphan if widens_when_deleted(policy) => orphans.push(policy.clone()),
            Verdict::Orphan => {
                out.orphan_allows += 1;
                out.delete.push(policy.clone());
            }
            Verdict::NotOurs | Verdict::Desired | Verdict::Ownerless => {}
        }
    }
    if within_caps(orphans.len(), out.fleet, caps) {
        out.delete.extend(orphans);
    } else {
        out.withheld = orphans;
    }
    out
}

/// Whether deleting `policy` (one of ours) may widen access: the L0 deny-all, and the L1
/// infrastructure held with it. Every other layer is an allow.
pub fn widens_when_deleted(policy: &LivePolicy) -> bool {
    managed_type(&policy.labels).is_some_and(PolicyType::is_namespace_layer)
}

/// `orphans` may go: at most `caps.max`, and at most `caps.max_percent` % of `fleet`.
pub fn within_caps(orphans: usize, fleet: usize, caps: SweepCaps) -> bool {
    orphans <= caps.max && orphans * 100 <= usize::from(caps.max_percent) * fleet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::{MANAGED_BY, MANAGED_BY_LABEL};

    fn mk_policy(ns: &str, name: &str, t: PolicyType, extra: &[(&str, &str)]) -> LivePolicy {
        let mut labels = BTreeMap::from([
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            (POLICY_TYPE_LABEL.to_string(), t.as_str().to_string()),
        ]);
        for (k, v) in extra {
            labels.insert(k.to_string(), v.to_string());
        }
        LivePolicy {
            namespace: ns.into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            labels,
        }
    }

    fn owners() -> Owners {
        Owners {
            servers: BTreeSet::from([("tools".to_string(), "github".to_string())]),
            contexts: BTreeSet::from([("hosts".to_string(), "dev".to_string())]),
            runtime_namespaces: BTreeSet::from(["tools".to_string()]),
        }
    }

    const CAPS: SweepCaps = SweepCaps {
        max: 10,
        max_percent: 20,
    };

    #[test]
    fn each_layer_names_its_owners() {
        let none = BTreeSet::new();
        let o = owners();
        let ingress = |server: &str, ctx: &str| {
            mk_policy(
                "tools",
                "i",
                PolicyType::ContextIngress,
                &[
                    (SERVER_LABEL, server),
                    (CONTEXT_LABEL, ctx),
                    (CONTEXT_NAMESPACE_LABEL, "hosts"),
                ],
            )
        };
        assert_eq!(
            classify(&ingress("github", "dev"), &none, &o),
            Verdict::Obsolete
        );
        assert_eq!(
            classify(&ingress("github", "gone"), &none, &o),
            Verdict::Orphan
        );
        assert_eq!(
            classify(&ingress("gone", "dev"), &none, &o),
            Verdict::Orphan
        );
        let egress = mk_policy(
            "hosts",
            "e",
            PolicyType::ContextEgress,
            &[
                (CONTEXT_LABEL, "dev"),
                (SERVER_LABEL, "github"),
                (SERVER_NAMESPACE_LABEL, "tools"),
            ],
        );
        assert_eq!(classify(&egress, &none, &o), Verdict::Obsolete);
        let l3 = mk_policy(
            "tools",
            "l3",
            PolicyType::ExternalEgress,
            &[(SERVER_LABEL, "jira")],
        );
        assert_eq!(classify(&l3, &none, &o), Verdict::Orphan);
        let l0 = mk_policy("tools", "d", PolicyType::DenyAll, &[]);
        assert_eq!(classify(&l0, &none, &o), Verdict::Obsolete);
        let l0_elsewhere = mk_policy("old", "d", PolicyType::DenyAll, &[]);
        assert_eq!(classify(&l0_elsewhere, &none, &o), Verdict::Orphan);
        // Desired wins over everything.
        let want = BTreeSet::from([("old".to_string(), "d".to_string())]);
        assert_eq!(classify(&l0_elsewhere, &want, &o), Verdict::Desired);
    }

    #[test]
    fn lookalikes_and_ownerless_policies_are_never_touched() {
        let none = BTreeSet::new();
        let o = owners();
        let mut lookalike = mk_policy("old", "mcp-l0-deny-all", PolicyType::DenyAll, &[]);
        lookalike.labels.remove(MANAGED_BY_LABEL);
        assert_eq!(classify(&lookalike, &none, &o), Verdict::NotOurs);
        let mut foreign = mk_policy("old", "mcp-l0-deny-all", PolicyType::DenyAll, &[]);
        foreign
            .labels
            .insert(MANAGED_BY_LABEL.into(), "someone-else".into());
        assert_eq!(classify(&foreign, &none, &o), Verdict::NotOurs);
        let mut untyped = mk_policy("old", "x", PolicyType::DenyAll, &[]);
        untyped
            .labels
            .insert(POLICY_TYPE_LABEL.into(), "l9-magic".into());
        assert_eq!(classify(&untyped, &none, &o), Verdict::NotOurs);
        let nameless = mk_policy("tools", "l3", PolicyType::ExternalEgress, &[]);
        assert_eq!(classify(&nameless, &none, &o), Verdict::Ownerless);

        let plan = plan(&[lookalike, foreign, untyped, nameless], &none, &o, CAPS);
        assert!(plan.delete.is_empty() && plan.withheld.is_empty());
        assert_eq!(plan.fleet, 1, "only the ownerless one is ours");
    }

    /// A deleted Context that granted more servers than the cap: every ingress allow it
    /// implied is an orphan, and every one goes, whatever the count.
    #[test]
    fn a_deleted_context_takes_all_its_allows_past_the_caps() {
        let o = owners();
        let servers: Vec<String> = (0..11).map(|i| format!("s{i}")).collect();
        let mut o = o;
        for s in &servers {
            o.servers.insert(("tools".into(), s.clone()));
        }
        let live: Vec<LivePolicy> = servers
            .iter()
            .map(|s| {
                mk_policy(
                    "tools",
                    &format!("mcp-l2-ingress.{s}.hosts.big"),
                    PolicyType::ContextIngress,
                    &[
                        (SERVER_LABEL, s),
                        (CONTEXT_LABEL, "big"),
                        (CONTEXT_NAMESPACE_LABEL, "hosts"),
                    ],
                )
            })
            .collect();
        let p = plan(&live, &BTreeSet::new(), &o, CAPS);
        assert_eq!(p.delete.len(), 11, "every stale allow goes: {p:?}");
        assert!(p.withheld.is_empty(), "no allow is held back: {p:?}");
    }

    #[test]
    fn orphaned_denies_over_a_cap_are_all_withheld_and_allows_still_go() {
        let o = owners();
        let desired: BTreeSet<(String, String)> = (0..100)
            .map(|i| ("tools".into(), format!("keep-{i}")))
            .collect();
        let mut live: Vec<LivePolicy> = desired
            .iter()
            .map(|(ns, n)| mk_policy(ns, n, PolicyType::DenyAll, &[]))
            .collect();
        // Namespaces dropped from --runtime-namespace: their L0 (and L1) are orphans.
        let deny = |i: usize| {
            let t = if i.is_multiple_of(2) {
                PolicyType::DenyAll
            } else {
                PolicyType::Dns
            };
            mk_policy(&format!("old-{i}"), "mcp-l0-deny-all", t, &[])
        };
        let stale_allow = |i: usize| {
            mk_policy(
                "tools",
                &format!("orphan-{i}"),
                PolicyType::ExternalEgress,
                &[(SERVER_LABEL, "deleted")],
            )
        };
        let obsolete = mk_policy(
            "tools",
            "obsolete",
            PolicyType::ExternalEgress,
            &[(SERVER_LABEL, "github")],
        );
        live.push(obsolete.clone());
        live.extend((0..12).map(stale_allow));

        let mut ten = live.clone();
        ten.extend((0..10).map(deny));
        let p = plan(&ten, &desired, &o, CAPS);
        assert_eq!(p.delete.len(), 23, "10 denies, 12 allows, the obsolete one");
        assert_eq!(p.orphan_allows, 12);
        assert!(p.withheld.is_empty());

        let mut eleven = live.clone();
        eleven.extend((0..11).map(deny));
        let p = plan(&eleven, &desired, &o, CAPS);
        let mut expected = vec![obsolete];
        expected.extend((0..12).map(stale_allow));
        assert_eq!(p.delete, expected, "obsolete and orphaned allows still go");
        assert_eq!(p.orphan_allows, 12);
        assert_eq!(p.withheld, (0..11).map(deny).collect::<Vec<_>>());
        assert!(p.withheld.iter().all(widens_when_deleted));
        assert_eq!(p.fleet, 124);

        // The percentage: 3 orphans in a fleet of 12 is 25 % > 20 %.
        assert!(!within_caps(3, 12, CAPS));
        assert!(within_caps(2, 12, CAPS));
        assert!(within_caps(0, 0, CAPS));
    }
}
