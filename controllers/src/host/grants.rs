//! What a Host may use: the MCPServers its Context grants, resolved from live objects. Pure,
//! shared by the Host operator (the host-side NetworkPolicy) and the Host API (inventory and
//! the credential's grant check), so both read the grant the same way.
//!
//! The Context is always the one the live Host names (`spec.contextRef`, in the Host's own
//! namespace); nothing a caller sends can choose another.

use std::collections::BTreeMap;

use apis::runtime::{label_selector_matches, Context, Host, MCPServer};
use kube::ResourceExt;

use super::desired;

/// The condition type a retiring MCPServer carries (set by the retirement controller).
const RETIRING: &str = "Retiring";

/// `(namespace, name)` of every MCPServer `context` grants, in its order, without repeats.
pub fn granted_refs(context: &Context) -> Vec<(String, String)> {
    let own = context.namespace().unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    for r in &context.spec.mcp_servers {
        let key = (
            r.namespace.clone().unwrap_or_else(|| own.clone()),
            r.name.clone(),
        );
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// The Context `host` is bound to, if `context` is it: same namespace and name, and the
/// Context's `hostSelector` admits the Host. A Context of another namespace never is, whatever
/// its name; nor is one whose selector does not select the Host's pods.
pub fn is_hosts_context(host: &Host, context: &Context) -> bool {
    context.namespace() == host.namespace()
        && context.name_any() == host.spec.context_ref.name
        && selects(context, host)
}

/// Whether the Context's `hostSelector` admits the Host: it matches the labels the Host's pods
/// carry (the Host's own labels that may be copied, and the operator's two), the same labels
/// the server side of L2 selects. Naming a Context is not enough to be one of its hosts.
pub fn selects(context: &Context, host: &Host) -> bool {
    label_selector_matches(&context.spec.host_selector, &pod_labels(host))
}

/// The labels of a Host's pods: its own labels outside the reserved prefixes, then the
/// operator's `managed-by` and host labels (never overridden).
pub fn pod_labels(host: &Host) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = host
        .labels()
        .iter()
        .filter(|(k, _)| desired::copyable_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(ours) = desired::labels(&host.name_any()).as_object() {
        for (k, v) in ours {
            labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
    }
    labels
}

/// A server hosts may be handed: not being deleted and not retiring. A server on its way out
/// is fenced by the retirement controller; the Host API stops offering it at the same moment.
pub fn enabled(server: &MCPServer) -> bool {
    if server.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let retiring = server.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == RETIRING && c.status == "True")
    });
    !retiring
}

/// Whether the MCPServer's `Ready` condition is `True` for its current generation.
pub fn ready(server: &MCPServer) -> bool {
    server.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == "Ready"
                && c.status == "True"
                && c.observed_generation
                    .is_none_or(|g| Some(g) == server.metadata.generation)
        })
    })
}

/// The servers `host` may use now: granted by its Context (which must be the one it names and
/// must select the Host), consented to by the server (`spec.allowedContexts` for a Context of
/// another namespace; `namespace_labels` gives a namespace's labels, None when unknown) and
/// enabled, in the Context's order. `servers` may hold any servers; only granted ones come out.
pub fn granted<'a>(
    host: &Host,
    context: &Context,
    servers: impl IntoIterator<Item = &'a MCPServer>,
    namespace_labels: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Vec<&'a MCPServer> {
    if !is_hosts_context(host, context) || host.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let servers: Vec<&MCPServer> = servers.into_iter().collect();
    granted_refs(context)
        .into_iter()
        .filter_map(|(ns, name)| {
            servers
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name)
                .copied()
        })
        .filter(|s| enabled(s))
        .filter(|s| consents(s, context, &namespace_labels))
        .collect()
}

/// Whether `server` consents to being granted by `context` (always, in its own namespace).
pub fn consents(
    server: &MCPServer,
    context: &Context,
    namespace_labels: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> bool {
    let ns = context.namespace().unwrap_or_default();
    if server.namespace().as_deref() == Some(ns.as_str()) {
        return true;
    }
    server.admits_context_from(&ns, namespace_labels(&ns).as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::{ContextSpec, HostSpec, LocalRef, MCPServerSpec, ServerRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};

    fn host(ns: &str, context: &str) -> Host {
        let mut h = Host::new(
            "h",
            HostSpec {
                context_ref: LocalRef {
                    name: context.into(),
                },
                image: "img".into(),
                resources: None,
                secret_ref: None,
                workspace_size: None,
            },
        );
        h.metadata.namespace = Some(ns.into());
        h
    }

    fn context(ns: &str, name: &str, refs: &[(Option<&str>, &str)]) -> Context {
        let mut c = Context::new(
            name,
            ContextSpec {
                teams: vec![],
                mcp_servers: refs
                    .iter()
                    .map(|(ns, n)| ServerRef {
                        name: (*n).into(),
                        namespace: ns.map(Into::into),
                    })
                    .collect(),
                host_selector: LabelSelector::default(),
            },
        );
        c.metadata.namespace = Some(ns.into());
        c
    }

    fn server(ns: &str, name: &str) -> MCPServer {
        let mut s = MCPServer::new(
            name,
            MCPServerSpec {
                allowed_contexts: None,
                image: Some("img".into()),
                port: Some(8080),
                transport: Default::default(),
                env_secret: None,
                egress_bindings: vec![],
                network: None,
                host_credential: None,
                ..Default::default()
            },
        );
        s.metadata.namespace = Some(ns.into());
        s
    }

    #[test]
    fn only_granted_enabled_servers_of_the_hosts_own_context() {
        let h = host("team", "dev");
        let ctx = context(
            "team",
            "dev",
            &[(None, "github"), (Some("shared"), "jira"), (None, "github")],
        );
        let github = server("team", "github");
        let mut jira = server("shared", "jira");
        jira.spec.allowed_contexts = Some(apis::runtime::AllowedContexts {
            namespaces: apis::runtime::ContextNamespaces {
                from: apis::runtime::NamespacesFrom::All,
                selector: None,
            },
        });
        let other_ns_github = server("other", "github");
        let ungranted = server("team", "slack");
        let mut retiring = server("team", "retiring");
        retiring.status = Some(apis::runtime::MCPServerStatus {
            conditions: vec![Condition {
                type_: "Retiring".into(),
                status: "True".into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                message: String::new(),
                reason: "Deleted".into(),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let all = [&github, &jira, &other_ns_github, &ungranted, &retiring];
        let names: Vec<String> = granted(&h, &ctx, all, no_labels)
            .iter()
            .map(|s| format!("{}/{}", s.namespace().unwrap(), s.name_any()))
            .collect();
        assert_eq!(names, ["team/github", "shared/jira"]);

        // A Context of the same name in another namespace grants nothing to this host.
        let foreign = context("other", "dev", &[(None, "github")]);
        assert!(granted(&h, &foreign, [&other_ns_github], no_labels).is_empty());
        // Nor does a Context the host does not name.
        let unnamed = context("team", "prod", &[(None, "github")]);
        assert!(granted(&h, &unnamed, [&github], no_labels).is_empty());
        // A retiring or deleted server is not offered.
        let granted_retiring = context("team", "dev", &[(None, "retiring")]);
        assert!(granted(&h, &granted_retiring, [&retiring], no_labels).is_empty());
        let mut deleted = server("team", "github");
        deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(granted(&h, &ctx, [&deleted], no_labels).is_empty());
    }

    fn no_labels(_: &str) -> Option<BTreeMap<String, String>> {
        None
    }

    #[test]
    fn a_server_of_another_namespace_is_granted_only_with_its_consent() {
        let h = host("team", "dev");
        let ctx = context("team", "dev", &[(Some("shared"), "jira")]);
        let mut jira = server("shared", "jira");
        assert!(
            granted(&h, &ctx, [&jira], no_labels).is_empty(),
            "no allowedContexts: only its own namespace's Contexts"
        );
        jira.spec.allowed_contexts = Some(apis::runtime::AllowedContexts {
            namespaces: apis::runtime::ContextNamespaces {
                from: apis::runtime::NamespacesFrom::Selector,
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("grants".into(), "jira".into())])),
                    ..Default::default()
                }),
            },
        });
        assert!(granted(&h, &ctx, [&jira], no_labels).is_empty());
        let labelled = |ns: &str| {
            (ns == "team").then(|| BTreeMap::from([("grants".to_string(), "jira".to_string())]))
        };
        assert_eq!(granted(&h, &ctx, [&jira], labelled).len(), 1);
    }

    #[test]
    fn the_hosts_labels_must_be_selected_by_the_context() {
        let mut h = host("team", "dev");
        let mut ctx = context("team", "dev", &[(None, "github")]);
        let github = server("team", "github");
        ctx.spec.host_selector = LabelSelector {
            match_labels: Some(BTreeMap::from([("tier".into(), "dev".into())])),
            ..Default::default()
        };
        assert!(
            granted(&h, &ctx, [&github], no_labels).is_empty(),
            "naming the Context is not enough"
        );
        h.metadata.labels = Some(BTreeMap::from([("tier".into(), "dev".into())]));
        assert_eq!(granted(&h, &ctx, [&github], no_labels).len(), 1);
        // A reserved label on the Host never reaches its pods, so it cannot satisfy a selector.
        ctx.spec.host_selector = LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "mcp-runtime.dev/kube-api-access".into(),
                "true".into(),
            )])),
            ..Default::default()
        };
        h.metadata.labels = Some(BTreeMap::from([(
            "mcp-runtime.dev/kube-api-access".into(),
            "true".into(),
        )]));
        assert!(granted(&h, &ctx, [&github], no_labels).is_empty());
        // The operator's own host label does: it is on every pod of the Host.
        ctx.spec.host_selector = LabelSelector {
            match_labels: Some(BTreeMap::from([(desired::HOST_LABEL.into(), "h".into())])),
            ..Default::default()
        };
        assert_eq!(granted(&h, &ctx, [&github], no_labels).len(), 1);
    }
}
