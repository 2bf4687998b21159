//! Agent: the directory entry sessions bind to. Deactivating or deleting an agent revokes
//! every session bound to its uid in the same transaction; `status.activeSessions` is
//! counted when the agent is read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::locks::SessionSelector;
use crate::resources::{ResourceInfo, AGENTS};
use crate::rules::{validate_agent_spec, CAUSE_AGENT_DEACTIVATED};
use crate::strategy::{
    updated_metadata, Context, Fact, Facts, Plan, Read, Rejection, Stop, Strategy, Withdrawal,
    Write,
};
use crate::table::{age, or_none, Column, TableRow, AGE, NAME};
use crate::types::{Agent, AgentStatus, Kind};
use crate::validation::FieldError;

use super::revoke_selected;

/// The sessions bound to an agent's uid.
fn bound_sessions(agent: &Agent) -> SessionSelector {
    SessionSelector::Agent {
        uid: agent.metadata.uid.clone().unwrap_or_default(),
    }
}

fn uids(agents: &[Agent]) -> Vec<String> {
    agents
        .iter()
        .filter_map(|a| a.metadata.uid.clone())
        .collect()
}

impl TableRow for Agent {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Active",
            "boolean",
            "",
            "Whether the agent may hold sessions.",
            0,
        ),
        Column::new("Teams", "string", "", "Teams the agent may act for.", 0),
        Column::new(
            "Sessions",
            "integer",
            "",
            "Sessions of this agent that are active or pending.",
            0,
        ),
        AGE,
        Column::new("Display Name", "string", "", "Human-readable name.", 1),
        Column::new(
            "Owners",
            "string",
            "",
            "Users responsible for the agent.",
            1,
        ),
        Column::new(
            "Max TTL",
            "string",
            "",
            "Longest session the agent may hold.",
            1,
        ),
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let sessions = self
            .status
            .as_ref()
            .and_then(|s| s.active_sessions)
            .map_or(json!(0), |n| json!(n));
        vec![
            or_none(self.metadata.name.as_deref()),
            Value::Bool(self.spec.active),
            or_none(Some(&self.spec.teams.join(","))),
            sessions,
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            or_none(self.spec.display_name.as_deref()),
            or_none(Some(&self.spec.owners.join(","))),
            or_none(self.spec.max_session_ttl.as_deref()),
        ]
    }
}

impl Strategy for Agent {
    const INFO: ResourceInfo = AGENTS;
    // `status.activeSessions` is counted when read.
    const COMPLETES_READS: bool = true;

    fn validate_create(&self) -> Vec<FieldError> {
        validate_agent_spec(&self.spec)
    }

    fn validate_update(&self) -> Vec<FieldError> {
        validate_agent_spec(&self.spec)
    }

    fn admit_create(mut agent: Self, ctx: &Context, facts: &Facts) -> Result<Plan<Self>, Stop> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        if facts.object::<Agent>("", &name)?.is_some() {
            return Err(Rejection::AlreadyExists.into());
        }
        agent.status = Some(AgentStatus {
            deactivated_at: (!agent.spec.active).then_some(Time(ctx.now)),
            ..Default::default()
        });
        agent.set_type_meta();
        Ok(Plan {
            writes: vec![Write::put(&agent, true)?],
            object: agent,
            warnings: Vec::new(),
        })
    }

    /// `spec.active: false` revokes the agent's sessions (cause `agent_deactivated`).
    fn admit_update(
        current: Self,
        requested: Self,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let mut updated = current.clone();
        updated.metadata = updated_metadata(&current.metadata, &requested.metadata)?;
        updated.spec = requested.spec;
        if updated.spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        let deactivating = current.spec.active && !updated.spec.active;
        let status = updated.status.get_or_insert_with(AgentStatus::default);
        if deactivating {
            status.deactivated_at = Some(Time(ctx.now));
        } else if updated.spec.active {
            status.deactivated_at = None;
        }
        if updated == current {
            return Ok(Plan::unchanged(updated));
        }
        let mut writes = Vec::new();
        if deactivating {
            let selector = bound_sessions(&current);
            writes =
                revoke_selected(facts, &selector, CAUSE_AGENT_DEACTIVATED, None, ctx.now)?.writes;
        }
        writes.push(Write::put(&updated, false)?);
        Ok(Plan {
            object: updated,
            writes,
            warnings: Vec::new(),
        })
    }

    /// Deleting an agent revokes its sessions, like deactivating it.
    fn admit_delete(
        current: Self,
        _by: &Withdrawal,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let mut writes = revoke_selected(
            facts,
            &bound_sessions(&current),
            CAUSE_AGENT_DEACTIVATED,
            None,
            ctx.now,
        )?
        .writes;
        let key = crate::strategy::ObjectKey::for_object(&current);
        writes.push(Write::Remove { key });
        Ok(Plan {
            object: current,
            writes,
            warnings: Vec::new(),
        })
    }

    fn read_facts(agents: &[Self], now: Timestamp) -> Vec<Read> {
        let agent_uids = uids(agents);
        if agent_uids.is_empty() {
            return Vec::new();
        }
        vec![Read::ActiveSessions {
            agent_uids,
            at: now,
        }]
    }

    fn complete_reads(agents: &mut [Self], now: Timestamp, facts: &Facts) -> Result<(), Stop> {
        let agent_uids = uids(agents);
        let none = Default::default();
        let counts = if agent_uids.is_empty() {
            &none
        } else {
            match facts.answer(&Read::ActiveSessions {
                agent_uids,
                at: now,
            })? {
                Fact::Counts(counts) => counts,
                _ => return Err(Rejection::Unreadable("active session counts".into()).into()),
            }
        };
        for agent in agents {
            let uid = agent.metadata.uid.clone().unwrap_or_default();
            let status = agent.status.get_or_insert_with(AgentStatus::default);
            status.active_sessions = Some(counts.get(&uid).copied().unwrap_or(0));
        }
        Ok(())
    }
}
