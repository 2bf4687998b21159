//! A Context's status as a pure function of what the reconcile read: each server it names (in
//! `spec.mcpServers` order, without repeats), how many are Ready, the `Ready` condition, and
//! which Events a change of status calls for.

use std::collections::BTreeMap;

use apis::runtime::{Context, ContextServerStatus, ContextStatus, MCPServer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::host::grants;

pub const READY: &str = "Ready";
/// `Ready=True`: every server the Context names is Ready.
pub const ALL_SERVERS_READY: &str = "AllServersReady";
/// `Ready=True`: the Context names no server.
pub const NO_SERVERS: &str = "NoServers";
/// `Ready=False`: at least one server is not Ready.
pub const SERVERS_NOT_READY: &str = "ServersNotReady";

/// Where one referenced server stands, seen from the Context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Exists, consents, enabled and `Ready=True` for its generation.
    Ready,
    /// Exists, consents and is enabled, but is not Ready (yet).
    NotReady,
    /// No such MCPServer.
    Missing,
    /// Being deleted, or retiring (`Retiring=True`).
    Disabled,
    /// Its `allowedContexts` does not admit Contexts of this Context's namespace.
    NotAllowed,
}

impl ServerState {
    const ALL: [ServerState; 5] = [
        ServerState::Ready,
        ServerState::NotReady,
        ServerState::Missing,
        ServerState::Disabled,
        ServerState::NotAllowed,
    ];

    /// The state named `name` (as `status.servers[].state` says it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Ready => "Ready",
            ServerState::NotReady => "NotReady",
            ServerState::Missing => "Missing",
            ServerState::Disabled => "Disabled",
            ServerState::NotAllowed => "NotAllowed",
        }
    }
}

/// States no waiting fixes (someone must create, restore or consent): a server entering one
/// gets a Warning Event.
pub const UNAVAILABLE: [ServerState; 3] = [
    ServerState::Missing,
    ServerState::Disabled,
    ServerState::NotAllowed,
];

/// The state of server `namespace/name` for a Context of `context_namespace`, whose labels are
/// `namespace_labels` (`None` when unknown), and the message saying why (none when Ready).
/// The first state that holds wins: Missing, Disabled, NotAllowed, NotReady, Ready.
pub fn server_state(
    context_namespace: &str,
    namespace_labels: Option<&BTreeMap<String, String>>,
    namespace: &str,
    name: &str,
    server: Option<&MCPServer>,
) -> (ServerState, Option<String>) {
    let Some(server) = server else {
        return (
            ServerState::Missing,
            Some(format!("MCPServer {namespace}/{name} not found")),
        );
    };
    if server.metadata.deletion_timestamp.is_some() {
        return (
            ServerState::Disabled,
            Some(format!("MCPServer {namespace}/{name} is being deleted")),
        );
    }
    if !grants::enabled(server) {
        return (
            ServerState::Disabled,
            Some(format!("MCPServer {namespace}/{name} is retiring")),
        );
    }
    if !server.admits_context_from(context_namespace, namespace_labels) {
        return (
            ServerState::NotAllowed,
            Some(format!(
                "MCPServer {namespace}/{name} does not admit Contexts of namespace \
                 {context_namespace} (its spec.allowedContexts)"
            )),
        );
    }
    if !grants::ready(server) {
        let ready = server
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == READY);
        let why = match ready {
            Some(c)
                if c.observed_generation
                    .is_none_or(|g| Some(g) == server.metadata.generation) =>
            {
                format!("Ready={} ({})", c.status, c.reason)
            }
            Some(_) => "its Ready condition is for an older generation".to_string(),
            None => "it has no Ready condition yet".to_string(),
        };
        return (
            ServerState::NotReady,
            Some(format!("MCPServer {namespace}/{name} is not Ready: {why}")),
        );
    }
    (ServerState::Ready, None)
}

/// Each server `context` names, in order and without repeats, with its state. `lookup` finds
/// a live MCPServer by namespace and name; `namespace_labels` are the Context namespace's.
pub fn servers<'a>(
    context: &Context,
    namespace_labels: Option<&BTreeMap<String, String>>,
    lookup: impl Fn(&str, &str) -> Option<&'a MCPServer>,
) -> Vec<ContextServerStatus> {
    let own = context.namespace().unwrap_or_default();
    grants::granted_refs(context)
        .into_iter()
        .map(|(namespace, name)| {
            let (state, message) = server_state(
                &own,
                namespace_labels,
                &namespace,
                &name,
                lookup(&namespace, &name),
            );
            ContextServerStatus {
                name,
                namespace,
                state: state.as_str().to_string(),
                message,
            }
        })
        .collect()
}

/// The wanted status for `servers` at `generation`; `Ready` keeps its `lastTransitionTime`
/// from `previous` unless its status changed.
pub fn status(
    previous: Option<&ContextStatus>,
    generation: Option<i64>,
    servers: Vec<ContextServerStatus>,
    now: Time,
) -> ContextStatus {
    let ready: Vec<&ContextServerStatus> = servers
        .iter()
        .filter(|s| s.state == ServerState::Ready.as_str())
        .collect();
    let not_ready: Vec<String> = servers
        .iter()
        .filter(|s| s.state != ServerState::Ready.as_str())
        .map(|s| format!("{}/{} {}", s.namespace, s.name, s.state))
        .collect();
    let (ok, reason, message) = if servers.is_empty() {
        (true, NO_SERVERS, "spec.mcpServers is empty".to_string())
    } else if not_ready.is_empty() {
        (
            true,
            ALL_SERVERS_READY,
            format!("all {} server(s) are Ready", servers.len()),
        )
    } else {
        (
            false,
            SERVERS_NOT_READY,
            format!(
                "{} of {} server(s) not Ready: {}",
                not_ready.len(),
                servers.len(),
                not_ready.join(", ")
            ),
        )
    };
    let status = if ok { "True" } else { "False" };
    let since = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == READY))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(now);
    let ready_servers = i32::try_from(ready.len()).unwrap_or(i32::MAX);
    ContextStatus {
        observed_generation: generation,
        ready_servers: Some(ready_servers),
        servers,
        conditions: vec![Condition {
            type_: READY.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }],
    }
}

/// Whether `previous` already says `wanted` (then nothing is written).
pub fn current(previous: Option<&ContextStatus>, wanted: &ContextStatus) -> bool {
    previous.is_some_and(|p| {
        p.observed_generation == wanted.observed_generation
            && p.ready_servers == wanted.ready_servers
            && p.servers == wanted.servers
            && wanted.conditions.iter().all(|w| p.conditions.contains(w))
    })
}

/// An Event a change of status calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Warning `ServerUnavailable`: server `namespace/name` became Missing, Disabled or
    /// NotAllowed.
    ServerUnavailable {
        namespace: String,
        name: String,
        state: ServerState,
        note: String,
    },
    /// Normal `Ready`: the Context became Ready.
    Ready { note: String },
}

impl Notice {
    pub fn reason(&self) -> &'static str {
        match self {
            Notice::ServerUnavailable { .. } => "ServerUnavailable",
            Notice::Ready { .. } => "Ready",
        }
    }

    /// The Event's action: the check that failed. One per state, because kube's recorder folds
    /// an Event into an earlier one of the same reason, action and related object (whatever
    /// its note) as a series: a server gone from NotAllowed to Missing must say so anew.
    pub fn action(&self) -> &'static str {
        match self {
            Notice::ServerUnavailable { state, .. } => match state {
                ServerState::Missing => "FindServer",
                ServerState::Disabled => "CheckServerEnabled",
                ServerState::NotAllowed => "CheckConsent",
                ServerState::Ready | ServerState::NotReady => "Resolve",
            },
            Notice::Ready { .. } => "Resolve",
        }
    }

    pub fn note(&self) -> &str {
        match self {
            Notice::ServerUnavailable { note, .. } | Notice::Ready { note } => note,
        }
    }
}

/// The Events of going from `previous` to `wanted`: transitions only, so a reconcile that
/// changes nothing publishes nothing (and neither does a restart: the status is the memory).
pub fn notices(previous: Option<&ContextStatus>, wanted: &ContextStatus) -> Vec<Notice> {
    let before = |s: &ContextServerStatus| {
        previous?
            .servers
            .iter()
            .find(|p| p.namespace == s.namespace && p.name == s.name)
            .map(|p| p.state.as_str())
    };
    let mut out: Vec<Notice> = wanted
        .servers
        .iter()
        .filter(|s| before(s) != Some(s.state.as_str()))
        .filter_map(|s| {
            let state = ServerState::from_name(&s.state).filter(|st| UNAVAILABLE.contains(st))?;
            Some(Notice::ServerUnavailable {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                state,
                note: s.message.clone().unwrap_or_else(|| {
                    format!("MCPServer {}/{}: {}", s.namespace, s.name, s.state)
                }),
            })
        })
        .collect();
    let ready_of = |s: &ContextStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    if let Some((status, message)) = ready_of(wanted) {
        let was_ready = previous
            .and_then(ready_of)
            .is_some_and(|(s, _)| s == "True");
        if status == "True" && !was_ready {
            out.push(Notice::Ready { note: message });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::{
        AllowedContexts, ContextNamespaces, ContextSpec, MCPServerSpec, MCPServerStatus,
        NamespacesFrom, ServerRef,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn mk_context(ns: &str, refs: &[(Option<&str>, &str)]) -> Context {
        let mut c = Context::new(
            "dev",
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
        c.metadata.generation = Some(1);
        c
    }

    fn condition(type_: &str, status: &str, generation: Option<i64>) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "DeploymentObserved".into(),
            message: String::new(),
            observed_generation: generation,
            last_transition_time: t(1),
        }
    }

    /// A server at generation 2 carrying `conditions`.
    fn mk_server(ns: &str, name: &str, conditions: Vec<Condition>) -> MCPServer {
        let mut s = MCPServer::new(
            name,
            MCPServerSpec {
                image: Some("img".into()),
                port: Some(8080),
                ..Default::default()
            },
        );
        s.metadata.namespace = Some(ns.into());
        s.metadata.generation = Some(2);
        s.status = Some(MCPServerStatus {
            conditions,
            ..Default::default()
        });
        s
    }

    fn ready_server(ns: &str, name: &str) -> MCPServer {
        mk_server(ns, name, vec![condition(READY, "True", Some(2))])
    }

    fn admitting(mut s: MCPServer, from: NamespacesFrom, selector: Option<&str>) -> MCPServer {
        s.spec.allowed_contexts = Some(AllowedContexts {
            namespaces: ContextNamespaces {
                from,
                selector: selector.map(|v| LabelSelector {
                    match_labels: Some([("team".to_string(), v.to_string())].into()),
                    ..Default::default()
                }),
            },
        });
        s
    }

    fn state(server: Option<&MCPServer>, labels: Option<&BTreeMap<String, String>>) -> ServerState {
        let (ns, name) = server
            .map(|s| (s.namespace().unwrap(), s.name_any()))
            .unwrap_or_else(|| ("team".into(), "gone".into()));
        server_state("team", labels, &ns, &name, server).0
    }

    #[test]
    fn each_state_and_the_order_they_are_judged_in() {
        assert_eq!(state(None, None), ServerState::Missing);
        assert_eq!(
            state(Some(&ready_server("team", "github")), None),
            ServerState::Ready
        );
        // Ready for an older generation, False, or absent: NotReady.
        for conditions in [
            vec![condition(READY, "True", Some(1))],
            vec![condition(READY, "False", Some(2))],
            vec![],
        ] {
            let s = mk_server("team", "github", conditions);
            assert_eq!(state(Some(&s), None), ServerState::NotReady);
        }
        let (_, message) = server_state(
            "team",
            None,
            "team",
            "github",
            Some(&mk_server(
                "team",
                "github",
                vec![condition(READY, "False", Some(2))],
            )),
        );
        assert_eq!(
            message.as_deref(),
            Some("MCPServer team/github is not Ready: Ready=False (DeploymentObserved)")
        );
        // Retiring or being deleted: Disabled, before anything else.
        let retiring = mk_server(
            "team",
            "github",
            vec![
                condition(READY, "True", Some(2)),
                condition("Retiring", "True", None),
            ],
        );
        assert_eq!(state(Some(&retiring), None), ServerState::Disabled);
        let mut deleting = ready_server("shared", "jira");
        deleting.metadata.deletion_timestamp = Some(t(5));
        assert_eq!(state(Some(&deleting), None), ServerState::Disabled);
        // Another namespace's server without consent: NotAllowed, even when Ready.
        assert_eq!(
            state(Some(&ready_server("shared", "jira")), None),
            ServerState::NotAllowed
        );
        let not_ready_foreign = mk_server("shared", "jira", vec![]);
        assert_eq!(
            state(Some(&not_ready_foreign), None),
            ServerState::NotAllowed,
            "consent is judged before readiness"
        );
    }

    #[test]
    fn consent_follows_allowed_contexts_and_the_namespace_labels() {
        let labels: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        let other: BTreeMap<String, String> = [("team".to_string(), "b".to_string())].into();
        let all = admitting(ready_server("shared", "jira"), NamespacesFrom::All, None);
        assert_eq!(state(Some(&all), None), ServerState::Ready);
        let same = admitting(ready_server("shared", "jira"), NamespacesFrom::Same, None);
        assert_eq!(state(Some(&same), Some(&labels)), ServerState::NotAllowed);
        let by_label = admitting(
            ready_server("shared", "jira"),
            NamespacesFrom::Selector,
            Some("a"),
        );
        assert_eq!(state(Some(&by_label), Some(&labels)), ServerState::Ready);
        assert_eq!(
            state(Some(&by_label), Some(&other)),
            ServerState::NotAllowed
        );
        assert_eq!(
            state(Some(&by_label), None),
            ServerState::NotAllowed,
            "unknown labels fail closed"
        );
    }

    #[test]
    fn servers_in_order_without_repeats_and_the_ready_condition() {
        let ctx = mk_context(
            "team",
            &[
                (None, "github"),
                (Some("shared"), "jira"),
                (None, "slack"),
                (Some("team"), "github"),
            ],
        );
        let github = ready_server("team", "github");
        let jira = ready_server("shared", "jira");
        let live = [&github, &jira];
        let lookup = |ns: &str, name: &str| {
            live.iter()
                .find(|s| s.namespace().as_deref() == Some(ns) && s.name_any() == name)
                .copied()
        };
        let listed = servers(&ctx, None, lookup);
        let summary: Vec<String> = listed
            .iter()
            .map(|s| format!("{}/{} {}", s.namespace, s.name, s.state))
            .collect();
        assert_eq!(
            summary,
            [
                "team/github Ready",
                "shared/jira NotAllowed",
                "team/slack Missing"
            ]
        );
        let got = status(None, Some(1), listed, t(10));
        assert_eq!(got.ready_servers, Some(1));
        assert_eq!(got.observed_generation, Some(1));
        let ready = &got.conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            (READY, "False", SERVERS_NOT_READY)
        );
        assert_eq!(
            ready.message,
            "2 of 3 server(s) not Ready: shared/jira NotAllowed, team/slack Missing"
        );
        assert_eq!(ready.observed_generation, Some(1));
        assert_eq!(ready.last_transition_time, t(10));

        // Every server Ready: True, AllServersReady.
        let both = mk_context("team", &[(None, "github")]);
        let got = status(None, Some(1), servers(&both, None, lookup), t(10));
        assert_eq!(
            (
                got.conditions[0].status.as_str(),
                got.conditions[0].reason.as_str()
            ),
            ("True", ALL_SERVERS_READY)
        );
        assert_eq!(got.ready_servers, Some(1));
        // None named: Ready, NoServers, and 0 granted.
        let empty = mk_context("team", &[]);
        let got = status(None, Some(1), servers(&empty, None, lookup), t(10));
        assert_eq!(
            (
                got.conditions[0].status.as_str(),
                got.conditions[0].reason.as_str()
            ),
            ("True", NO_SERVERS)
        );
        assert_eq!(got.ready_servers, Some(0));
        assert!(got.servers.is_empty());
    }

    fn entry(ns: &str, name: &str, state: ServerState) -> ContextServerStatus {
        ContextServerStatus {
            name: name.into(),
            namespace: ns.into(),
            state: state.as_str().into(),
            message: (state != ServerState::Ready).then(|| format!("{ns}/{name} why")),
        }
    }

    #[test]
    fn transition_time_moves_only_with_the_status_and_no_change_is_no_write() {
        let missing = vec![entry("team", "jira", ServerState::Missing)];
        let first = status(None, Some(1), missing.clone(), t(10));
        let again = status(Some(&first), Some(1), missing, t(20));
        assert_eq!(again, first);
        assert!(current(Some(&first), &again));
        assert!(!current(None, &again));
        // Another reason for False keeps the time; the message and the list are written.
        let not_ready = vec![entry("team", "jira", ServerState::NotReady)];
        let later = status(Some(&first), Some(1), not_ready, t(30));
        assert_eq!(later.conditions[0].last_transition_time, t(10));
        assert!(!current(Some(&first), &later));
        // Turning True moves it.
        let ready = vec![entry("team", "jira", ServerState::Ready)];
        let fixed = status(Some(&later), Some(1), ready, t(40));
        assert_eq!(fixed.conditions[0].last_transition_time, t(40));
        assert_eq!(fixed.ready_servers, Some(1));
        // A new generation is written even when nothing else changed.
        let bumped = status(Some(&fixed), Some(2), fixed.servers.clone(), t(50));
        assert!(!current(Some(&fixed), &bumped));
        assert_eq!(bumped.conditions[0].last_transition_time, t(40));
    }

    #[test]
    fn events_only_on_transitions() {
        let s = |list: Vec<ContextServerStatus>| status(None, Some(1), list, t(1));
        let first = s(vec![
            entry("team", "github", ServerState::NotReady),
            entry("team", "jira", ServerState::Missing),
            entry("shared", "x", ServerState::NotAllowed),
        ]);
        let got = notices(None, &first);
        assert_eq!(
            got,
            [
                Notice::ServerUnavailable {
                    namespace: "team".into(),
                    name: "jira".into(),
                    state: ServerState::Missing,
                    note: "team/jira why".into()
                },
                Notice::ServerUnavailable {
                    namespace: "shared".into(),
                    name: "x".into(),
                    state: ServerState::NotAllowed,
                    note: "shared/x why".into()
                },
            ]
        );
        assert_eq!(
            got.iter().map(Notice::action).collect::<Vec<_>>(),
            ["FindServer", "CheckConsent"]
        );
        // The same again: nothing.
        assert!(notices(Some(&first), &first).is_empty());
        // Missing → Disabled is news; NotAllowed → Ready is not a warning.
        let second = s(vec![
            entry("team", "github", ServerState::NotReady),
            entry("team", "jira", ServerState::Disabled),
            entry("shared", "x", ServerState::Ready),
        ]);
        let got = notices(Some(&first), &second);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].reason(), "ServerUnavailable");
        assert_eq!(got[0].action(), "CheckServerEnabled");
        assert_eq!(got[0].note(), "team/jira why");
        // Becoming Ready: one Normal Ready, and only once.
        let ready = s(vec![entry("team", "github", ServerState::Ready)]);
        let got = notices(Some(&second), &ready);
        assert_eq!(
            got,
            [Notice::Ready {
                note: "all 1 server(s) are Ready".into()
            }]
        );
        assert!(notices(Some(&ready), &ready).is_empty());
        // A new Context with no servers is Ready at once.
        let empty = s(vec![]);
        assert_eq!(notices(None, &empty).len(), 1);
    }
}
