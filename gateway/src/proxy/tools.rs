//! What one session may do with tools at this gateway: its own grant (`spec.tools`), then the
//! server's ToolPolicies as they apply to it (its teams and agent). The grant is checked first;
//! a tool it grants is then checked against every matching policy rule.

use std::sync::Arc;

use apis::rules::{tool_granted, ToolGrant};
use apis::tool_policy::{Caller, Finding, PolicyIndex, PolicyReason};
use apis::{AccessSession, PolicyMode};
use serde_json::{Map, Value};

use super::mcp::{
    CallOutcome, Refused, ARGUMENT_NOT_ALLOWED, DESTRUCTIVE_NOT_ALLOWED, POLICY_NOT_READY,
    POLICY_NOT_READY_REASON, RATE_LIMITED, TOOL_CHANGED,
};
use crate::pins::{digest_of, Drift, Observed};

/// A session's tool authority for one request.
#[derive(Clone)]
pub struct ToolAccess {
    /// `spec.tools`: `None` grants every tool.
    pub tools: Option<Vec<String>>,
    /// `spec.callsPerMinute`: `None` is no limit of the session's own.
    pub calls_per_minute: Option<u32>,
    /// The agent's uid and `callsPerMinute` (all its sessions together), when it has one.
    pub agent_limit: Option<(String, u32)>,
    teams: Vec<String>,
    agent: Option<String>,
    /// The server's policies; `None` until the gateway holds a complete list of them.
    policies: Option<Arc<PolicyIndex>>,
    /// The definitions the server listed for pinned tools.
    observed: Arc<Observed>,
}

impl ToolAccess {
    pub fn new(
        session: &AccessSession,
        policies: Option<Arc<PolicyIndex>>,
        observed: Arc<Observed>,
    ) -> Self {
        Self {
            tools: session.spec.tools.clone(),
            calls_per_minute: session.spec.calls_per_minute,
            agent_limit: session.spec.agent.as_ref().and_then(|a| {
                Some((
                    a.uid.clone().filter(|u| !u.is_empty())?,
                    a.calls_per_minute?,
                ))
            }),
            teams: session.spec.teams.clone(),
            agent: session.spec.agent.as_ref().map(|a| a.name.clone()),
            policies,
            observed,
        }
    }

    fn caller(&self) -> Caller<'_> {
        Caller {
            teams: &self.teams,
            agent: self.agent.as_deref(),
        }
    }

    /// Whether anything stands between this session and a tool: a grant, or policies (or
    /// their absence before the first sync, which refuses every call). A restricted
    /// session's bodies must be JSON-RPC the gateway can read.
    pub fn restricted(&self) -> bool {
        self.tools.is_some() || self.policies.as_ref().is_none_or(|p| !p.is_empty())
    }

    /// Whether `tools/list` answers are filtered for this session.
    pub fn filters_lists(&self) -> bool {
        self.tools.is_some() || self.policies.as_ref().is_some_and(|p| !p.is_empty())
    }

    /// The decision on a call of `tool` with `arguments`.
    pub fn decide(&self, tool: &str, arguments: Option<&Map<String, Value>>) -> CallOutcome {
        if !tool_granted(self.tools.as_deref(), tool) {
            return CallOutcome {
                refused: Some(Refused::not_granted(tool)),
                ..Default::default()
            };
        }
        let Some(policies) = &self.policies else {
            return CallOutcome {
                refused: Some(Refused {
                    reason: POLICY_NOT_READY_REASON,
                    code: POLICY_NOT_READY,
                    message: "the gateway does not hold its server's tool policies yet; retry"
                        .into(),
                    policy: None,
                }),
                ..Default::default()
            };
        };
        let mut verdict = policies.check(tool, arguments, &self.caller());
        // Pins: a tool last listed with another definition than its pin.
        let mut pins = policies.pins(tool).peekable();
        if pins.peek().is_some() {
            if let Some(seen) = self.observed.digest(tool) {
                for pin in pins.filter(|p| p.digest != seen) {
                    let finding = Finding {
                        reason: PolicyReason::ToolChanged,
                        policy: pin.policy.to_string(),
                        mode: pin.mode,
                        message: format!(
                            "tool {tool:?} is listed with a definition ({seen}) other than the one \
                             ToolPolicy {:?} pins",
                            pin.policy
                        ),
                    };
                    match pin.mode {
                        PolicyMode::Enforce if verdict.refusal.is_none() => {
                            verdict.refusal = Some(finding)
                        }
                        PolicyMode::Enforce => {}
                        PolicyMode::Monitor => verdict.monitored.push(finding),
                    }
                }
            }
        }
        CallOutcome {
            refused: verdict.refusal.map(|finding| Refused {
                reason: finding.reason.as_str(),
                code: match finding.reason {
                    PolicyReason::DestructiveNotAllowed => DESTRUCTIVE_NOT_ALLOWED,
                    PolicyReason::ArgumentNotAllowed => ARGUMENT_NOT_ALLOWED,
                    PolicyReason::RateLimited => RATE_LIMITED,
                    PolicyReason::ToolChanged => TOOL_CHANGED,
                },
                message: finding.message,
                policy: Some(finding.policy),
            }),
            side_effect: verdict.side_effect,
            monitored: verdict.monitored,
            limits: verdict.limits,
        }
    }

    /// What a `tools/list` answer keeps, indexed once for the whole response.
    pub fn lister(&self) -> Lister {
        Lister {
            grant: ToolGrant::new(self.tools.as_deref()),
            access: self.clone(),
        }
    }
}

/// The tools a session sees listed: granted, and callable as far as side effects go.
pub struct Lister {
    grant: ToolGrant,
    access: ToolAccess,
}

impl Lister {
    /// Whether the entry `tool` (named `name`) of a `tools/list` answer is kept. A pinned
    /// tool's definition is recorded as seen, and one that differs from an enforcing pin is
    /// dropped (its description may be what changed) and reported.
    pub fn allows(&self, name: &str, tool: &serde_json::Value) -> bool {
        if !self.grant.allows(name) {
            return false;
        }
        let Some(policies) = &self.access.policies else {
            return true;
        };
        if !policies.listable(name, &self.access.caller()) {
            return false;
        }
        let mut pins = policies.pins(name).peekable();
        if pins.peek().is_none() {
            return true;
        }
        let seen = digest_of(tool);
        self.access.observed.observe(name, &seen);
        let mut keep = true;
        for pin in pins.filter(|p| p.digest != seen) {
            keep &= pin.mode == PolicyMode::Monitor;
            self.access.observed.report(Drift {
                namespace: pin.namespace.to_string(),
                policy: pin.policy.to_string(),
                tool: name.to_string(),
                pinned: pin.digest.to_string(),
                observed: seen.clone(),
            });
        }
        keep
    }
}
