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
//!   dropped from `--runtime-namespace`). Orphans go only while they are few: over the
//!   absolute cap or the percentage of the managed fleet, none is deleted and the caller
//!   alerts, because a mass disappearance of owners is more likely a fault (a wrong flag, an
//!   empty cache) than an intent.
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
    /// Ours, not desired, an owner gone: deleted within the caps.
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
    /// Deleted this pass: every obsolete policy, and the orphans when within the caps.
    pub delete: Vec<LivePolicy>,
    /// Orphans found but kept because they are over a cap (empty when within).
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
    let mut orphans = Vec::new();
    for policy in live {
        let verdict = classify(policy, desired, owners);
        if verdict != Verdict::NotOurs {
            out.fleet += 1;
        }
        match verdict {
            Verdict::Obsolete => out.delete.push(policy.clone()),
            Verdict::Orphan => orphans.push(policy.clone()),
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

    #[test]
    fn orphans_over_a_cap_are_all_withheld() {
        let o = owners();
        let desired: BTreeSet<(String, String)> = (0..100)
            .map(|i| ("tools".into(), format!("keep-{i}")))
            .collect();
        let mut live: Vec<LivePolicy> = desired
            .iter()
            .map(|(ns, n)| mk_policy(ns, n, PolicyType::DenyAll, &[]))
            .collect();
        let orphan = |i: usize| {
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

        let mut ten = live.clone();
        ten.extend((0..10).map(orphan));
        let p = plan(&ten, &desired, &o, CAPS);
        assert_eq!(p.delete.len(), 11, "10 orphans and the obsolete one");
        assert!(p.withheld.is_empty());

        let mut eleven = live.clone();
        eleven.extend((0..11).map(orphan));
        let p = plan(&eleven, &desired, &o, CAPS);
        assert_eq!(p.delete, vec![obsolete], "obsolete allows still go");
        assert_eq!(p.withheld.len(), 11);
        assert_eq!(p.fleet, 112);

        // The percentage: 3 orphans in a fleet of 12 is 25 % > 20 %.
        assert!(!within_caps(3, 12, CAPS));
        assert!(within_caps(2, 12, CAPS));
        assert!(within_caps(0, 0, CAPS));
    }
}
