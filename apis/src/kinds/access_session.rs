//! AccessSession: issued under the rules of DESIGN §2; updates keep every authority field;
//! a deleted session's name is reserved forever.

use crate::resources::{ResourceInfo, ACCESS_SESSIONS};
use crate::rules::{self, admit_session_update};
use crate::strategy::{
    updated_metadata, Context, Facts, ObjectKey, Plan, Read, Stop, Strategy, Withdrawal, Write,
};
use crate::table::{age, human_duration, or_none, Column, TableRow, AGE, NAME};
use crate::types::{AccessSession, AccessSessionStatus, Kind, SessionPhase};
use crate::validation::FieldError;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::{admit_issuance, check_session_name, issuance_reads};

fn key_of(session: &AccessSession) -> (String, String) {
    (
        session.metadata.namespace.clone().unwrap_or_default(),
        session.metadata.name.clone().unwrap_or_default(),
    )
}

impl TableRow for AccessSession {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Server",
            "string",
            "",
            "The MCPServer this session is for.",
            0,
        ),
        Column::new(
            "Agent",
            "string",
            "",
            "The agent acting under this session.",
            0,
        ),
        Column::new(
            "Subject",
            "string",
            "",
            "The human subject, or the teams of a team session.",
            0,
        ),
        Column::new(
            "Phase",
            "string",
            "",
            "Active, PendingEnrollment, Revoked or Expired.",
            0,
        ),
        Column::new(
            "Expires",
            "string",
            "",
            "Time left until the session expires.",
            0,
        ),
        AGE,
        Column::new(
            "Server UID",
            "string",
            "",
            "UID of the MCPServer generation.",
            1,
        ),
        Column::new("Teams", "string", "", "Authority teams.", 1),
        Column::new(
            "Revocation",
            "string",
            "",
            "Why the session was revoked.",
            1,
        ),
        Column::new(
            "Tools",
            "string",
            "",
            "The tools the session may call (* when not restricted).",
            1,
        ),
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let subject = match &self.spec.subject {
            Some(s) => Some(s.user.clone()),
            None if !self.spec.teams.is_empty() => {
                Some(format!("team:{}", self.spec.teams.join(",")))
            }
            None => None,
        };
        let expires = match self
            .spec
            .expires_at
            .as_ref()
            .map(|t| t.0.as_second() - now.as_second())
        {
            Some(left) if left > 0 => human_duration(left),
            Some(_) => "expired".into(),
            None => "<none>".into(),
        };
        let status = self.status.as_ref();
        vec![
            or_none(self.metadata.name.as_deref()),
            or_none(Some(&self.spec.server.name)),
            or_none(self.spec.agent.as_ref().map(|a| a.name.as_str())),
            or_none(subject.as_deref()),
            Value::String(self.phase().as_str().into()),
            Value::String(expires),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            or_none(Some(&self.spec.server.uid)),
            or_none(Some(&self.spec.teams.join(","))),
            or_none(
                status
                    .and_then(|s| s.revocation.as_ref())
                    .map(|r| r.cause.as_str()),
            ),
            Value::String(tools_cell(self.spec.tools.as_deref())),
        ]
    }
}

/// The TOOLS cell: `*` when not restricted, `<none>` for an empty list, else the entries
/// (the first few, with how many more).
fn tools_cell(tools: Option<&[String]>) -> String {
    const SHOWN: usize = 4;
    match tools {
        None => "*".into(),
        Some([]) => "<none>".into(),
        Some(tools) if tools.len() <= SHOWN => tools.join(","),
        Some(tools) => format!("{},+{} more", tools[..SHOWN].join(","), tools.len() - SHOWN),
    }
}

impl Strategy for AccessSession {
    const INFO: ResourceInfo = ACCESS_SESSIONS;

    fn validate_create(&self) -> Vec<FieldError> {
        rules::validate_session_spec(&self.spec)
    }

    fn create_reads(&self, _ctx: &Context) -> Vec<Read> {
        let (ns, name) = key_of(self);
        issuance_reads(&ns, &name, &self.spec)
    }

    fn admit_create(mut session: Self, ctx: &Context, facts: &Facts) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&session);
        check_session_name(facts, &ns, &name)?;
        let admission = admit_issuance(facts, &ns, &name, &session.spec, ctx)?;
        session.spec = admission.spec;
        session.status = Some(AccessSessionStatus {
            phase: SessionPhase::Active,
            ..Default::default()
        });
        session.set_type_meta();
        Ok(Plan {
            writes: vec![Write::put(&session, true)?],
            object: session,
            warnings: admission.warnings,
        })
    }

    fn admit_update(
        current: Self,
        requested: Self,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let admission = admit_session_update(&current.spec, &requested.spec)?;
        let mut updated = current.clone();
        updated.metadata = updated_metadata(&current.metadata, &requested.metadata)?;
        if admission.spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        updated.spec = admission.spec;
        let writes = if updated == current {
            Vec::new()
        } else {
            vec![Write::put(&updated, false)?]
        };
        Ok(Plan {
            object: updated,
            writes,
            warnings: admission.warnings,
        })
    }

    /// The session goes and its name is reserved: a session name is never reused.
    fn admit_delete(
        current: Self,
        _by: &Withdrawal,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let key = ObjectKey::for_object(&current);
        let uid = current.metadata.uid.clone().unwrap_or_default();
        Ok(Plan {
            object: current,
            writes: vec![
                Write::Remove { key: key.clone() },
                Write::ReserveName { key, uid },
            ],
            warnings: Vec::new(),
        })
    }
}
