//! ToolPolicy rules as pure functions: validation of one policy, and the policies of one
//! server compiled into an index a gateway checks each `tools/call` against.
//!
//! Policies compose without precedence: a call is checked against every rule, of every
//! policy, whose name is the tool's or whose `prefix*` pattern covers it. An `enforce` policy
//! that does not allow the call refuses it; a `monitor` policy that does not allow it only
//! records what it would have refused. So adding a policy can only narrow what is allowed,
//! and no ordering between policies can be got wrong.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use crate::rules::{validate_teams, validate_tool_entry};
use crate::types::{ArgumentRule, Callers, PolicyMode, SideEffect, ToolPolicy, ToolPolicySpec};
use crate::validation::{is_dns1123_subdomain, FieldError, FieldErrorKind};

/// The most bytes the policies of one server may take, encoded as JSON: per object at
/// admission, and for all of a server's policies together in each gateway.
pub const MAX_POLICY_BYTES: usize = 700 * 1024;
/// Rules in one policy.
pub const MAX_RULES: usize = 4096;
/// Argument constraints in one rule.
pub const MAX_ARGUMENTS: usize = 32;
/// Allowed values of one argument.
pub const MAX_VALUES: usize = 256;
/// Characters of an argument name or an allowed value.
pub const MAX_ARGUMENT_LENGTH: usize = 128;
pub const MAX_VALUE_LENGTH: usize = 1024;
/// Entries of `destructiveCallers.teams` or `.agents`.
pub const MAX_CALLERS: usize = 256;

fn too_many(field: impl Into<String>, n: usize, max: usize) -> FieldError {
    FieldError::new(
        FieldErrorKind::TooMany,
        field,
        format!("Too many: {n}: must have at most {max} items"),
    )
}

fn too_long(field: impl Into<String>, max: usize) -> FieldError {
    FieldError::new(
        FieldErrorKind::TooLong,
        field,
        format!("Too long: may not be more than {max} characters"),
    )
}

fn duplicate(field: impl Into<String>, value: &str) -> FieldError {
    FieldError::new(
        FieldErrorKind::Duplicate,
        field,
        format!("Duplicate value: {value:?}"),
    )
}

/// Checks a policy's spec as a whole; every fault is reported, each at its field.
pub fn validate_tool_policy_spec(spec: &ToolPolicySpec) -> Vec<FieldError> {
    let mut errors: Vec<FieldError> = crate::rules::validate_server_name(&spec.server.name)
        .into_iter()
        .collect();
    if let Some(callers) = &spec.destructive_callers {
        errors.extend(validate_callers(callers, "spec.destructiveCallers"));
    }
    if spec.tools.is_empty() {
        errors.push(FieldError::required(
            "spec.tools",
            "Required value: at least one tool rule",
        ));
    } else if spec.tools.len() > MAX_RULES {
        errors.push(too_many("spec.tools", spec.tools.len(), MAX_RULES));
        return errors;
    }
    let mut names = BTreeSet::new();
    for (i, rule) in spec.tools.iter().enumerate() {
        let at = format!("spec.tools[{i}]");
        if let Some(e) = validate_tool_entry(&rule.name, &format!("{at}.name")) {
            errors.push(e);
        } else if !names.insert(rule.name.as_str()) {
            errors.push(duplicate(format!("{at}.name"), &rule.name));
        }
        if let Some(digest) = &rule.digest {
            if rule.name.ends_with('*') {
                errors.push(FieldError::invalid(
                    format!("{at}.digest"),
                    "Invalid value: a pin names one tool: the rule's name may not be a pattern",
                ));
            } else if !is_digest(digest) {
                errors.push(FieldError::invalid(
                    format!("{at}.digest"),
                    format!("Invalid value: {digest:?}: \"sha256:\" and 64 lowercase hex digits"),
                ));
            }
        }
        errors.extend(crate::rules::validate_calls_per_minute(
            rule.calls_per_minute,
            &format!("{at}.callsPerMinute"),
        ));
        if rule.arguments.len() > MAX_ARGUMENTS {
            errors.push(too_many(
                format!("{at}.arguments"),
                rule.arguments.len(),
                MAX_ARGUMENTS,
            ));
            continue;
        }
        let mut arguments = BTreeSet::new();
        for (j, argument) in rule.arguments.iter().enumerate() {
            let at = format!("{at}.arguments[{j}]");
            errors.extend(validate_argument(argument, &at));
            if !argument.name.is_empty() && !arguments.insert(argument.name.as_str()) {
                errors.push(duplicate(format!("{at}.name"), &argument.name));
            }
        }
    }
    errors
}

fn validate_callers(callers: &Callers, field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if callers.teams.len() > MAX_CALLERS {
        errors.push(too_many(
            format!("{field}.teams"),
            callers.teams.len(),
            MAX_CALLERS,
        ));
    } else {
        errors.extend(validate_teams(&callers.teams, &format!("{field}.teams")));
    }
    if callers.agents.len() > MAX_CALLERS {
        errors.push(too_many(
            format!("{field}.agents"),
            callers.agents.len(),
            MAX_CALLERS,
        ));
        return errors;
    }
    let mut seen = BTreeSet::new();
    for (i, agent) in callers.agents.iter().enumerate() {
        let at = format!("{field}.agents[{i}]");
        if !is_dns1123_subdomain(agent) {
            errors.push(FieldError::invalid(
                at,
                format!("Invalid value: {agent:?}: an Agent name (a DNS-1123 subdomain)"),
            ));
        } else if !seen.insert(agent.as_str()) {
            errors.push(duplicate(at, agent));
        }
    }
    errors
}

fn validate_argument(argument: &ArgumentRule, at: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let name_at = format!("{at}.name");
    if argument.name.is_empty() {
        errors.push(FieldError::required(&name_at, "Required value"));
    } else if argument.name.chars().count() > MAX_ARGUMENT_LENGTH {
        errors.push(too_long(&name_at, MAX_ARGUMENT_LENGTH));
    } else if argument.name.chars().any(char::is_control) {
        errors.push(FieldError::invalid(
            &name_at,
            "Invalid value: control characters are not allowed",
        ));
    }
    let values_at = format!("{at}.values");
    if argument.values.is_empty() {
        errors.push(FieldError::required(
            &values_at,
            "Required value: at least one allowed value",
        ));
    } else if argument.values.len() > MAX_VALUES {
        errors.push(too_many(&values_at, argument.values.len(), MAX_VALUES));
        return errors;
    }
    let mut seen = BTreeSet::new();
    for (k, value) in argument.values.iter().enumerate() {
        let at = format!("{values_at}[{k}]");
        if value.chars().count() > MAX_VALUE_LENGTH {
            errors.push(too_long(at, MAX_VALUE_LENGTH));
        } else if !seen.insert(value.as_str()) {
            errors.push(duplicate(at, value));
        }
    }
    errors
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
pub fn is_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The part of a `tools/list` entry a pin covers, as canonical JSON (keys sorted at every
/// level, no whitespace): its `name`, `description` and `inputSchema`, each `null` when absent.
/// The pin is the SHA-256 of these bytes.
pub fn pinned_definition(tool: &Value) -> Vec<u8> {
    let part = serde_json::json!({
        "description": tool.get("description").cloned().unwrap_or(Value::Null),
        "inputSchema": tool.get("inputSchema").cloned().unwrap_or(Value::Null),
        "name": tool.get("name").cloned().unwrap_or(Value::Null),
    });
    let mut out = Vec::new();
    canonical(&part, &mut out);
    out
}

fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(key).unwrap_or_default());
                out.push(b':');
                canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend(serde_json::to_vec(scalar).unwrap_or_default()),
    }
}

/// Why a policy does not allow a call: the JSON-RPC error's `reason`, the audit line's and
/// the metric's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyReason {
    /// A `destructive` tool called by a session that is not among the policy's callers.
    DestructiveNotAllowed,
    /// A constrained argument absent or outside its allowed values.
    ArgumentNotAllowed,
    /// A rule's `callsPerMinute` spent (decided by the gateway's token buckets, not here).
    RateLimited,
    /// The server lists the tool with a definition other than the pinned one.
    ToolChanged,
}

impl PolicyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DestructiveNotAllowed => "destructive_not_allowed",
            Self::ArgumentNotAllowed => "argument_not_allowed",
            Self::RateLimited => "rate_limited",
            Self::ToolChanged => "tool_changed",
        }
    }
}

/// Who is calling: what a session says of itself that policies name.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller<'a> {
    pub teams: &'a [String],
    pub agent: Option<&'a str>,
}

/// One policy's objection to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub reason: PolicyReason,
    /// The policy that objects (its name; policies of one server share a namespace).
    pub policy: String,
    pub mode: PolicyMode,
    /// What a person reading the refusal needs: the tool, and the argument when one is at
    /// fault. Never an argument's value.
    pub message: String,
}

/// What the policies say of one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The strictest side effect any matching rule declares; `None` when no rule matches.
    pub side_effect: Option<SideEffect>,
    /// The first objection of an `enforce` policy: the call is refused with it.
    pub refusal: Option<Finding>,
    /// Objections of `monitor` policies: the call is forwarded, and these are recorded.
    pub monitored: Vec<Finding>,
    /// The rate limits of the matching rules that have one: each a token bucket per session.
    pub limits: Vec<RuleLimit>,
}

/// A matching rule's `callsPerMinute`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLimit {
    pub policy: String,
    /// The rule's `name` (a tool or a `prefix*`): calls of every tool it covers share it.
    pub rule: String,
    pub calls_per_minute: u32,
    pub mode: PolicyMode,
}

/// The compiled rule of one tool name or pattern in one policy.
struct Rule {
    policy: u32,
    name: String,
    side_effect: SideEffect,
    arguments: Vec<ArgumentRule>,
    calls_per_minute: Option<u32>,
}

struct Compiled {
    name: String,
    namespace: String,
    resource_version: String,
    mode: PolicyMode,
    teams: BTreeSet<String>,
    agents: BTreeSet<String>,
}

/// The policies of one server, indexed by tool name and by pattern prefix: a lookup costs a
/// hash of the name plus one per distinct pattern length, whatever the number of rules.
#[derive(Default)]
pub struct PolicyIndex {
    policies: Vec<Compiled>,
    exact: HashMap<String, Vec<Rule>>,
    prefixes: HashMap<String, Vec<Rule>>,
    /// Distinct pattern prefix lengths in bytes, ascending.
    prefix_lengths: Vec<usize>,
    /// Pinned definitions by tool: the policy and the digest.
    pins: HashMap<String, Vec<(u32, String)>>,
}

/// One pinned definition of a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin<'a> {
    pub policy: &'a str,
    pub namespace: &'a str,
    pub digest: &'a str,
    pub mode: PolicyMode,
}

impl PolicyIndex {
    /// Compiles `policies` (already validated, and within the size cap).
    pub fn new<'a>(policies: impl IntoIterator<Item = &'a ToolPolicy>) -> Self {
        let mut index = Self::default();
        let mut lengths = BTreeSet::new();
        for policy in policies {
            let spec = &policy.spec;
            let id = index.policies.len() as u32;
            let callers = spec.destructive_callers.clone().unwrap_or_default();
            index.policies.push(Compiled {
                name: policy.metadata.name.clone().unwrap_or_default(),
                namespace: policy.metadata.namespace.clone().unwrap_or_default(),
                resource_version: policy.metadata.resource_version.clone().unwrap_or_default(),
                mode: spec.mode,
                teams: callers.teams.into_iter().collect(),
                agents: callers.agents.into_iter().collect(),
            });
            for rule in &spec.tools {
                if let Some(digest) = &rule.digest {
                    index
                        .pins
                        .entry(rule.name.clone())
                        .or_default()
                        .push((id, digest.clone()));
                }
                let compiled = Rule {
                    policy: id,
                    name: rule.name.clone(),
                    side_effect: rule.side_effect,
                    arguments: rule.arguments.clone(),
                    calls_per_minute: rule.calls_per_minute,
                };
                match rule.name.strip_suffix('*') {
                    Some(prefix) => {
                        lengths.insert(prefix.len());
                        index
                            .prefixes
                            .entry(prefix.to_string())
                            .or_default()
                            .push(compiled);
                    }
                    None => index
                        .exact
                        .entry(rule.name.clone())
                        .or_default()
                        .push(compiled),
                }
            }
        }
        index.prefix_lengths = lengths.into_iter().collect();
        index
    }

    /// Whether no policy is in force.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The policies in force: name, resourceVersion and mode of each.
    pub fn policies(&self) -> impl Iterator<Item = (&str, &str, PolicyMode)> {
        self.policies
            .iter()
            .map(|p| (p.name.as_str(), p.resource_version.as_str(), p.mode))
    }

    fn matching<'s>(&'s self, tool: &'s str) -> impl Iterator<Item = &'s Rule> + 's {
        let exact = self.exact.get(tool).into_iter().flatten();
        let patterns = self
            .prefix_lengths
            .iter()
            .take_while(move |&&n| n <= tool.len())
            .filter(move |&&n| tool.is_char_boundary(n))
            .filter_map(move |&n| self.prefixes.get(&tool[..n]))
            .flatten();
        exact.chain(patterns)
    }

    /// Whether any policy pins a tool's definition.
    pub fn has_pins(&self) -> bool {
        !self.pins.is_empty()
    }

    /// The pinned definitions of `tool`.
    pub fn pins<'s>(&'s self, tool: &str) -> impl Iterator<Item = Pin<'s>> + 's {
        self.pins
            .get(tool)
            .into_iter()
            .flatten()
            .map(|(id, digest)| {
                let policy = &self.policies[*id as usize];
                Pin {
                    policy: &policy.name,
                    namespace: &policy.namespace,
                    digest,
                    mode: policy.mode,
                }
            })
    }

    /// Whether `caller` may call `tool` as far as its side effect goes: no `enforce` policy
    /// marks it destructive without admitting the caller. A `tools/list` answer keeps the
    /// tools for which this holds (arguments are checked per call).
    pub fn listable(&self, tool: &str, caller: &Caller<'_>) -> bool {
        self.matching(tool).all(|rule| {
            let policy = &self.policies[rule.policy as usize];
            rule.side_effect != SideEffect::Destructive
                || policy.mode == PolicyMode::Monitor
                || policy.admits(caller)
        })
    }

    /// Checks a call of `tool` with `arguments` (the request's `params.arguments`) by `caller`.
    pub fn check(
        &self,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        caller: &Caller<'_>,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        for rule in self.matching(tool) {
            verdict.side_effect = verdict.side_effect.max(Some(rule.side_effect));
            let policy = &self.policies[rule.policy as usize];
            if let Some(calls_per_minute) = rule.calls_per_minute {
                verdict.limits.push(RuleLimit {
                    policy: policy.name.clone(),
                    rule: rule.name.clone(),
                    calls_per_minute,
                    mode: policy.mode,
                });
            }
            let mut object = |reason: PolicyReason, message: String| {
                let finding = Finding {
                    reason,
                    policy: policy.name.clone(),
                    mode: policy.mode,
                    message,
                };
                match policy.mode {
                    PolicyMode::Enforce if verdict.refusal.is_none() => {
                        verdict.refusal = Some(finding)
                    }
                    PolicyMode::Enforce => {}
                    PolicyMode::Monitor => verdict.monitored.push(finding),
                }
            };
            if rule.side_effect == SideEffect::Destructive && !policy.admits(caller) {
                object(
                    PolicyReason::DestructiveNotAllowed,
                    format!(
                        "tool {tool:?} is destructive and this session is not among the callers \
                         ToolPolicy {:?} allows",
                        policy.name
                    ),
                );
            }
            for argument in &rule.arguments {
                if !argument_allowed(argument, arguments.and_then(|a| a.get(&argument.name))) {
                    object(
                        PolicyReason::ArgumentNotAllowed,
                        format!(
                            "argument {:?} of tool {tool:?} is not one of the values ToolPolicy \
                             {:?} allows",
                            argument.name, policy.name
                        ),
                    );
                }
            }
        }
        verdict
    }
}

impl Compiled {
    fn admits(&self, caller: &Caller<'_>) -> bool {
        caller.agent.is_some_and(|a| self.agents.contains(a))
            || caller.teams.iter().any(|t| self.teams.contains(t))
    }
}

/// Whether `value` is one of the argument's allowed values: a string equal to an entry, or a
/// number or boolean whose JSON text is one. Anything else (absent, null, object, array) is not.
fn argument_allowed(rule: &ArgumentRule, value: Option<&Value>) -> bool {
    match value {
        Some(Value::String(s)) => rule.values.iter().any(|v| v == s),
        Some(Value::Number(n)) => {
            let text = n.to_string();
            rule.values.contains(&text)
        }
        Some(Value::Bool(b)) => {
            let text = if *b { "true" } else { "false" };
            rule.values.iter().any(|v| v == text)
        }
        _ => false,
    }
}

/// The size a policy counts against its server's cap: its spec encoded as JSON.
pub fn policy_bytes(policy: &ToolPolicy) -> usize {
    serde_json::to_vec(&policy.spec).map_or(usize::MAX, |b| b.len())
}

/// The fact `Read::PolicySizes` answers from a store's policies: the name and [`policy_bytes`]
/// of each policy of `server` in `namespace`.
pub fn policy_sizes(
    policies: impl IntoIterator<Item = ToolPolicy>,
    namespace: &str,
    server: &str,
) -> std::collections::HashMap<String, u32> {
    policies
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace) && p.spec.server.name == server
        })
        .map(|p| {
            let bytes = policy_bytes(&p) as u32;
            (p.metadata.name.clone().unwrap_or_default(), bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ServerName, ToolRule};
    use serde_json::json;

    fn policy(name: &str, mode: PolicyMode, rules: Vec<ToolRule>, teams: &[&str]) -> ToolPolicy {
        let mut p = ToolPolicy {
            spec: ToolPolicySpec {
                server: ServerName {
                    name: "github".into(),
                },
                mode,
                destructive_callers: Some(Callers {
                    teams: teams.iter().map(|t| t.to_string()).collect(),
                    agents: vec!["release-bot".into()],
                }),
                tools: rules,
            },
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p
    }

    fn rule(name: &str, side_effect: SideEffect, args: &[(&str, &[&str])]) -> ToolRule {
        ToolRule {
            name: name.into(),
            side_effect,
            arguments: args
                .iter()
                .map(|(n, vs)| ArgumentRule {
                    name: n.to_string(),
                    values: vs.iter().map(|v| v.to_string()).collect(),
                })
                .collect(),
            calls_per_minute: None,
            digest: None,
        }
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn destructive_tools_answer_to_teams_and_agents() {
        let p = policy(
            "p",
            PolicyMode::Enforce,
            vec![rule("delete_*", SideEffect::Destructive, &[])],
            &["sre"],
        );
        let index = PolicyIndex::new([&p]);
        let sre = ["sre".to_string()];
        let dev = ["dev".to_string()];
        let ok = index.check(
            "delete_repo",
            None,
            &Caller {
                teams: &sre,
                agent: None,
            },
        );
        assert_eq!(ok.refusal, None);
        assert_eq!(ok.side_effect, Some(SideEffect::Destructive));
        let bot = index.check(
            "delete_repo",
            None,
            &Caller {
                teams: &dev,
                agent: Some("release-bot"),
            },
        );
        assert_eq!(bot.refusal, None);
        let refused = index.check(
            "delete_repo",
            None,
            &Caller {
                teams: &dev,
                agent: Some("other"),
            },
        );
        assert_eq!(
            refused.refusal.map(|f| f.reason),
            Some(PolicyReason::DestructiveNotAllowed)
        );
        // No rule matches: the policy has nothing to say.
        let other = index.check(
            "list_repos",
            None,
            &Caller {
                teams: &dev,
                agent: None,
            },
        );
        assert_eq!(other, Verdict::default());
    }

    #[test]
    fn arguments_must_carry_an_allowed_value() {
        let p = policy(
            "p",
            PolicyMode::Enforce,
            vec![rule(
                "create_repo",
                SideEffect::Write,
                &[
                    ("visibility", &["private", "internal"]),
                    ("count", &["1", "true"]),
                ],
            )],
            &[],
        );
        let index = PolicyIndex::new([&p]);
        let c = Caller::default();
        let allowed = args(json!({"visibility": "private", "count": 1, "name": "x"}));
        assert_eq!(index.check("create_repo", Some(&allowed), &c).refusal, None);
        let truthy = args(json!({"visibility": "internal", "count": true}));
        assert_eq!(index.check("create_repo", Some(&truthy), &c).refusal, None);
        for bad in [
            json!({"visibility": "public", "count": 1}),
            json!({"count": 1}),
            json!({"visibility": null, "count": 1}),
            json!({"visibility": ["private"], "count": 1}),
            json!({"visibility": "private", "count": 1.5}),
        ] {
            let verdict = index.check("create_repo", Some(&args(bad.clone())), &c);
            assert_eq!(
                verdict.refusal.map(|f| f.reason),
                Some(PolicyReason::ArgumentNotAllowed),
                "{bad}"
            );
        }
        assert!(index.check("create_repo", None, &c).refusal.is_some());
    }

    #[test]
    fn policies_compose_and_monitor_mode_only_records() {
        let strict = policy(
            "strict",
            PolicyMode::Enforce,
            vec![rule("admin_*", SideEffect::Write, &[("scope", &["own"])])],
            &[],
        );
        let watch = policy(
            "watch",
            PolicyMode::Monitor,
            vec![
                rule("admin_delete", SideEffect::Destructive, &[]),
                rule("a*", SideEffect::Read, &[]),
            ],
            &["nobody"],
        );
        let index = PolicyIndex::new([&strict, &watch]);
        let c = Caller::default();
        let scoped = args(json!({"scope": "own"}));
        let v = index.check("admin_delete", Some(&scoped), &c);
        assert_eq!(v.refusal, None);
        assert_eq!(v.side_effect, Some(SideEffect::Destructive));
        assert_eq!(v.monitored.len(), 1);
        assert_eq!(v.monitored[0].policy, "watch");
        assert_eq!(v.monitored[0].reason, PolicyReason::DestructiveNotAllowed);
        let v = index.check("admin_delete", None, &c);
        let refusal = v.refusal.expect("the enforcing policy refuses");
        assert_eq!(refusal.policy, "strict");
        assert_eq!(refusal.reason, PolicyReason::ArgumentNotAllowed);
        assert!(!refusal.message.contains("own"));
    }

    #[test]
    fn patterns_match_on_character_boundaries() {
        let p = policy(
            "p",
            PolicyMode::Enforce,
            vec![
                rule("é*", SideEffect::Destructive, &[]),
                rule("*", SideEffect::Write, &[]),
            ],
            &[],
        );
        let index = PolicyIndex::new([&p]);
        let c = Caller::default();
        assert_eq!(
            index.check("éteindre", None, &c).side_effect,
            Some(SideEffect::Destructive)
        );
        assert!(index.check("éteindre", None, &c).refusal.is_some());
        assert_eq!(
            index.check("ab", None, &c).side_effect,
            Some(SideEffect::Write)
        );
        assert_eq!(
            index.check("", None, &c).side_effect,
            Some(SideEffect::Write)
        );
    }

    #[test]
    fn validation_names_every_fault() {
        let mut p = policy(
            "p",
            PolicyMode::Enforce,
            vec![
                rule("a b", SideEffect::Read, &[]),
                rule("x", SideEffect::Read, &[("", &[]), ("v", &["1", "1"])]),
                rule("x", SideEffect::Read, &[]),
            ],
            &["", "t", "t"],
        );
        p.spec.server.name = "Not_A_Name".into();
        p.spec.destructive_callers.as_mut().unwrap().agents = vec!["BAD".into()];
        let fields: Vec<String> = validate_tool_policy_spec(&p.spec)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.server.name",
                "spec.destructiveCallers.teams[0]",
                "spec.destructiveCallers.teams[2]",
                "spec.destructiveCallers.agents[0]",
                "spec.tools[0].name",
                "spec.tools[1].arguments[0].name",
                "spec.tools[1].arguments[0].values",
                "spec.tools[1].arguments[1].values[1]",
                "spec.tools[2].name",
            ]
        );
        p.spec.tools.clear();
        assert!(validate_tool_policy_spec(&p.spec)
            .iter()
            .any(|e| e.field == "spec.tools"));
    }
}
