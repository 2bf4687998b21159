//! ToolPolicy: how a server's tools may be called. Validated whole on every write (a policy
//! with any fault is refused and the stored one stays in force); `Ready` says which
//! generation gateways enforce.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::resources::{ResourceInfo, TOOL_POLICIES};
use crate::strategy::{updated_metadata, Context, Facts, Plan, Rejection, Stop, Strategy, Write};
use crate::table::{age, or_none, Column, TableRow, AGE, NAME};
use crate::tool_policy::{policy_bytes, validate_tool_policy_spec, MAX_POLICY_BYTES};
use crate::types::{Kind, SideEffect, ToolPolicy, ToolPolicyStatus};
use crate::validation::{FieldError, FieldErrorKind};

impl TableRow for ToolPolicy {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new("Server", "string", "", "The MCPServer it governs.", 0),
        Column::new("Mode", "string", "", "enforce or monitor.", 0),
        Column::new("Tools", "integer", "", "Tool rules.", 0),
        Column::new(
            "Destructive",
            "integer",
            "",
            "Rules marking tools destructive.",
            0,
        ),
        Column::new("Ready", "string", "", "Whether gateways enforce it.", 0),
        AGE,
        Column::new(
            "Callers",
            "string",
            "",
            "Who may call its destructive tools (teams, agent/NAME).",
            1,
        ),
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let destructive = self
            .spec
            .tools
            .iter()
            .filter(|r| r.side_effect == SideEffect::Destructive)
            .count();
        let ready = self
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        let callers = self.spec.destructive_callers.as_ref().map(|c| {
            c.teams
                .iter()
                .cloned()
                .chain(c.agents.iter().map(|a| format!("agent/{a}")))
                .collect::<Vec<_>>()
                .join(",")
        });
        vec![
            or_none(self.metadata.name.as_deref()),
            or_none(Some(&self.spec.server.name)),
            Value::String(self.spec.mode.as_str().into()),
            json!(self.spec.tools.len()),
            json!(destructive),
            or_none(ready),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            or_none(callers.as_deref().filter(|c| !c.is_empty())),
        ]
    }
}

/// Faults listed in one refusal; the rest are counted (a policy of thousands of bad rules
/// must not answer with a Status of megabytes).
const MAX_REPORTED: usize = 100;

/// Validates the whole spec and its encoded size.
fn validate(policy: &ToolPolicy) -> Vec<FieldError> {
    let mut errors = validate_tool_policy_spec(&policy.spec);
    if errors.len() > MAX_REPORTED {
        let more = errors.len() - MAX_REPORTED;
        errors.truncate(MAX_REPORTED);
        errors.push(FieldError::invalid(
            "spec",
            format!("and {more} more faults, not listed"),
        ));
        return errors;
    }
    let bytes = policy_bytes(policy);
    if errors.is_empty() && bytes > MAX_POLICY_BYTES {
        errors.push(FieldError::new(
            FieldErrorKind::TooLong,
            "spec",
            format!(
                "Too long: {bytes} bytes encoded; a server's tool policies may take at most \
                 {MAX_POLICY_BYTES} bytes"
            ),
        ));
    }
    errors
}

/// Refuses `policy` when the server's policies would take more than [`MAX_POLICY_BYTES`]
/// together with it (in place of its stored version): gateways would leave it out.
fn check_server_cap(policy: &ToolPolicy, facts: &Facts) -> Result<(), Stop> {
    let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let others: u64 = facts
        .policy_sizes(namespace, &policy.spec.server.name)?
        .iter()
        .filter(|(n, _)| n.as_str() != name)
        .map(|(_, b)| u64::from(*b))
        .sum();
    let total = others + policy_bytes(policy) as u64;
    if total > MAX_POLICY_BYTES as u64 {
        return Err(Rejection::Invalid(vec![FieldError::new(
            FieldErrorKind::TooLong,
            "spec",
            format!(
                "Too long: the ToolPolicies of server {:?} would take {total} bytes together; \
                 gateways take at most {MAX_POLICY_BYTES}: shrink or remove another policy of \
                 the server first",
                policy.spec.server.name
            ),
        )])
        .into());
    }
    Ok(())
}

/// `Ready=True` for the generation stored now.
fn accepted(policy: &mut ToolPolicy, now: Timestamp, previous: Option<&ToolPolicyStatus>) {
    let generation = policy.metadata.generation;
    let transition = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "True")
        .map_or(Time(now), |c| c.last_transition_time.clone());
    policy.status = Some(ToolPolicyStatus {
        observed_generation: generation,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Accepted".into(),
            message: format!(
                "{} tool rules in {} mode; the server's gateways enforce this generation from \
                 their next watch event",
                policy.spec.tools.len(),
                policy.spec.mode.as_str()
            ),
            observed_generation: generation,
            last_transition_time: transition,
        }],
    });
}

impl Strategy for ToolPolicy {
    const INFO: ResourceInfo = TOOL_POLICIES;

    fn validate_create(&self) -> Vec<FieldError> {
        validate(self)
    }

    fn validate_update(&self) -> Vec<FieldError> {
        validate(self)
    }

    fn admit_create(mut policy: Self, ctx: &Context, facts: &Facts) -> Result<Plan<Self>, Stop> {
        let namespace = policy.metadata.namespace.clone().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        if facts.object::<ToolPolicy>(&namespace, &name)?.is_some() {
            return Err(Rejection::AlreadyExists.into());
        }
        check_server_cap(&policy, facts)?;
        policy.metadata.generation = Some(1);
        accepted(&mut policy, ctx.now, None);
        policy.set_type_meta();
        Ok(Plan {
            writes: vec![Write::put(&policy, true)?],
            object: policy,
            warnings: Vec::new(),
        })
    }

    /// The spec may change whole (the server it governs excepted); each change is a new
    /// generation, accepted at once.
    fn admit_update(
        current: Self,
        requested: Self,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        if requested.spec.server != current.spec.server {
            return Err(Rejection::Invalid(vec![FieldError::invalid(
                "spec.server",
                "field is immutable",
            )])
            .into());
        }
        let mut updated = current.clone();
        updated.metadata = updated_metadata(&current.metadata, &requested.metadata)?;
        updated.spec = requested.spec;
        if updated.spec != current.spec {
            check_server_cap(&updated, facts)?;
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
            accepted(&mut updated, ctx.now, current.status.as_ref());
        }
        if updated == current {
            return Ok(Plan::unchanged(updated));
        }
        Ok(Plan {
            writes: vec![Write::put(&updated, false)?],
            object: updated,
            warnings: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ServerName, ToolPolicySpec, ToolRule};

    #[test]
    fn a_refusal_lists_the_first_hundred_faults_and_counts_the_rest() {
        let policy = ToolPolicy {
            spec: ToolPolicySpec {
                server: ServerName {
                    name: "github".into(),
                },
                tools: (0..300)
                    .map(|i| ToolRule {
                        name: format!("bad name {i}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        let errors = validate(&policy);
        assert_eq!(errors.len(), MAX_REPORTED + 1);
        assert_eq!(errors[0].field, "spec.tools[0].name");
        assert_eq!(
            errors[MAX_REPORTED].message,
            "and 200 more faults, not listed"
        );
    }
}
