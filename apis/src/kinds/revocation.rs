//! Revocation: a standing lock (see `locks`). Creating it revokes what its target selects and
//! (for `server_retired`) installs the fence; deleting it withdraws it, restoring only the
//! sessions nothing else covers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::locks::{self, Uncovered};
use crate::resources::{ResourceInfo, REVOCATIONS};
use crate::rules::{self, CAUSE_AGENT_DEACTIVATED, CAUSE_SERVER_RETIRED};
use crate::strategy::{
    Context, Facts, ObjectKey, Plan, Read, Refusal, Rejection, Stop, Strategy, Withdrawal, Write,
};
use crate::table::{age, or_none, Column, TableRow, AGE, NAME};
use crate::types::{AccessSession, Agent, Kind, Revocation, RevocationStatus};
use crate::validation::FieldError;

use super::revoke_selected;

fn key_of(revocation: &Revocation) -> (String, String) {
    (
        revocation.metadata.namespace.clone().unwrap_or_default(),
        revocation.metadata.name.clone().unwrap_or_default(),
    )
}

impl TableRow for Revocation {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Target",
            "string",
            "",
            "What was revoked: session/NAME, server/NAME or subject/USER.",
            0,
        ),
        Column::new("Cause", "string", "", "Why.", 0),
        Column::new(
            "Revoked",
            "integer",
            "",
            "Sessions this revocation revoked.",
            0,
        ),
        AGE,
        Column::new("Message", "string", "", "Explanation.", 1),
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let t = &self.spec.target;
        let target = match (&t.session, &t.server, &t.subject) {
            (Some(s), _, _) => format!("session/{s}"),
            (_, Some(s), _) => format!("server/{}", s.name),
            (_, _, Some(u)) => format!("subject/{u}"),
            _ => "<none>".into(),
        };
        vec![
            or_none(self.metadata.name.as_deref()),
            Value::String(target),
            or_none(Some(&self.spec.cause)),
            json!(self.status.as_ref().map_or(0, |s| s.revoked_sessions)),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            or_none(self.spec.message.as_deref()),
        ]
    }
}

impl Strategy for Revocation {
    const INFO: ResourceInfo = REVOCATIONS;
    const ASKS_CLUSTER_AUTHORITY: bool = true;

    fn validate_create(&self) -> Vec<FieldError> {
        rules::validate_revocation_spec(&self.spec)
    }

    fn create_reads(&self, ctx: &Context) -> Vec<Read> {
        let (ns, _) = key_of(self);
        let mut reads = Vec::new();
        if let Some(session) = &self.spec.target.session {
            reads.push(Read::Object(ObjectKey::of::<AccessSession>(&ns, session)));
        }
        if let Ok(plan) = locks::plan_revocation(&ns, &self.spec, ctx.authority, ctx.now) {
            reads.push(Read::Sessions(plan.sessions));
        }
        reads
    }

    fn admit_create(
        mut revocation: Self,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&revocation);
        let plan = locks::plan_revocation(&ns, &revocation.spec, ctx.authority, ctx.now)
            .map_err(Rejection::Invalid)?;
        if facts.object::<Revocation>(&ns, &name)?.is_some() {
            return Err(Rejection::AlreadyExists.into());
        }
        if let Some(session) = &revocation.spec.target.session {
            if facts.object::<AccessSession>(&ns, session)?.is_none() {
                return Err(Rejection::Invalid(vec![FieldError::invalid(
                    "spec.target.session",
                    format!("session {session:?} not found in namespace {ns:?}"),
                )])
                .into());
            }
        }
        let mut writes = Vec::new();
        if let Some(fence) = &plan.fence {
            writes.push(Write::Fence {
                fence: fence.clone(),
                revocation: name.clone(),
            });
        }
        let (revoked, newly, already) = revoke_selected(
            facts,
            &plan.sessions,
            &revocation.spec.cause,
            Some(&name),
            ctx.now,
        )?;
        writes.extend(revoked);
        revocation.status = Some(RevocationStatus {
            revoked_sessions: (newly + already) as u32,
            cluster_wide: plan.fence.as_ref().is_some_and(|f| f.cluster_wide),
            completed_at: Some(Time(ctx.now)),
        });
        revocation.set_type_meta();
        writes.push(Write::put(&revocation, true)?);
        let mut warnings = Vec::new();
        if already > 0 {
            warnings.push(format!(
                "{already} of the sessions it covers were already revoked; they now stay revoked until every revocation covering them is deleted"
            ));
        }
        Ok(Plan {
            object: revocation,
            writes,
            warnings,
        })
    }

    /// Withdrawal: every session the revocation covers loses that cover, and those nothing
    /// else covers are restored when their agent and server are still usable. Tearing the
    /// namespace down restores nothing. Fences are permanent.
    fn admit_delete(
        current: Self,
        by: &Withdrawal,
        _ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&current);
        if current.spec.cause == CAUSE_SERVER_RETIRED {
            // The fence lives on in the store's fence table; only the namespace's own
            // teardown may take the record with it (else a namespace that ever held a retired
            // server could never be deleted). Nobody withdraws a fence.
            if !matches!(by, Withdrawal::NamespaceTeardown) {
                return Err(Refusal::FencePermanent(name).into());
            }
            return Ok(Plan {
                writes: vec![Write::Remove {
                    key: ObjectKey::for_object(&current),
                }],
                object: current,
                warnings: Vec::new(),
            });
        }
        let refuse = |why: String| -> Stop {
            Refusal::Withdrawal {
                revocation: name.clone(),
                why,
            }
            .into()
        };
        let single = current.spec.target.session.is_some();
        let restore = matches!(by, Withdrawal::ByCaller(_));
        let mut writes = Vec::new();
        if let (true, Some(selector)) = (
            restore,
            locks::revocation_selector(&ns, &current.spec, false),
        ) {
            let mut uncovered = Vec::new();
            for session in facts.sessions(&selector)? {
                let mut session = session.clone();
                let effect = locks::uncover(&mut session, &name);
                if effect != Uncovered::NotCovered {
                    uncovered.push((session, effect));
                }
            }
            // Everything restoring needs, in one round trip.
            let needed: Vec<Read> = uncovered
                .iter()
                .filter(|(_, e)| *e == Uncovered::Restore)
                .flat_map(|(s, _)| restore_reads(s))
                .filter(|r| !facts.contains(r))
                .collect();
            if !needed.is_empty() {
                return Err(Stop::Need(needed));
            }
            for (mut session, effect) in uncovered {
                if effect == Uncovered::Restore {
                    let session_ns = session.metadata.namespace.clone().unwrap_or_default();
                    let fenced = facts.fenced(&session.spec.server.uid, &session_ns)?;
                    let agent = match &session.spec.agent {
                        Some(a) => facts.object::<Agent>("", &a.name)?,
                        None => None,
                    };
                    match (fenced, rules::check_session_agent(&session, agent.as_ref())) {
                        (false, Ok(())) => locks::restore(&mut session),
                        // A single-session withdrawal says why it cannot restore.
                        (true, _) if single => {
                            return Err(refuse(format!(
                                "server uid {:?} was retired",
                                session.spec.server.uid
                            )))
                        }
                        (_, Err(why)) if single => return Err(refuse(why)),
                        // Among many, the unusable ones stay revoked for their reason.
                        (true, _) => locks::keep_revoked(&mut session, CAUSE_SERVER_RETIRED),
                        (_, Err(_)) => locks::keep_revoked(&mut session, CAUSE_AGENT_DEACTIVATED),
                    }
                }
                writes.push(Write::put(&session, false)?);
            }
        }
        writes.push(Write::Remove {
            key: ObjectKey::for_object(&current),
        });
        Ok(Plan {
            object: current,
            writes,
            warnings: Vec::new(),
        })
    }
}

/// What deciding whether a session can be restored reads: its server's fence and its agent.
fn restore_reads(session: &AccessSession) -> Vec<Read> {
    let mut reads = vec![Read::Fenced {
        server_uid: session.spec.server.uid.clone(),
        namespace: session.metadata.namespace.clone().unwrap_or_default(),
    }];
    if let Some(agent) = &session.spec.agent {
        reads.push(Read::Object(ObjectKey::of::<Agent>("", &agent.name)));
    }
    reads
}
