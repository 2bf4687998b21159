//! Table columns (`kubectl get`) for every kind, as pure functions of the object and a clock.

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::types::{AccessSession, Agent, Enrollment, Revocation};

/// A `metav1.TableColumnDefinition`.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 shows by default; >0 only with `-o wide`.
    pub priority: i32,
}

impl Column {
    const fn new(
        name: &'static str,
        type_: &'static str,
        format: &'static str,
        description: &'static str,
        priority: i32,
    ) -> Self {
        Self {
            name,
            type_,
            format,
            description,
            priority,
        }
    }

    /// The wire form.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// A kind that renders as table rows.
pub trait TableRow {
    /// Column definitions, in order.
    const COLUMNS: &'static [Column];
    /// Cells of this object's row, matching `COLUMNS`.
    fn cells(&self, now: Timestamp) -> Vec<Value>;
}

const NAME: Column = Column::new(
    "Name",
    "string",
    "name",
    "Name must be unique within a namespace.",
    0,
);
const AGE: Column = Column::new("Age", "string", "", "Time since the object was created.", 0);

fn or_none(s: Option<&str>) -> Value {
    Value::String(s.filter(|s| !s.is_empty()).unwrap_or("<none>").to_string())
}

fn age(created: Option<Timestamp>, now: Timestamp) -> Value {
    match created {
        Some(t) => Value::String(human_duration(now.as_second() - t.as_second())),
        None => Value::String("<unknown>".into()),
    }
}

/// Kubernetes' `duration.HumanDuration`: the short, rounded form kubectl shows.
pub fn human_duration(secs: i64) -> String {
    if secs < 0 {
        return "<invalid>".into();
    }
    let (minutes, hours, days) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if minutes < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 192 {
        let h = hours % 24;
        if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else if days < 365 * 8 {
        let d = days % 365;
        if d == 0 {
            format!("{}y", days / 365)
        } else {
            format!("{}y{d}d", days / 365)
        }
    } else {
        format!("{}y", days / 365)
    }
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
        ]
    }
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

impl TableRow for Enrollment {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Server",
            "string",
            "",
            "The MCPServer the session is for.",
            0,
        ),
        Column::new(
            "Agent",
            "string",
            "",
            "The agent acting under the session.",
            0,
        ),
        Column::new(
            "Owner",
            "string",
            "",
            "The user who requested the enrollment.",
            0,
        ),
        Column::new("Phase", "string", "", "Pending or Completed.", 0),
        AGE,
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let status = self.status.as_ref();
        vec![
            or_none(self.metadata.name.as_deref()),
            or_none(Some(&self.spec.server.name)),
            or_none(self.spec.agent.as_ref().map(|a| a.name.as_str())),
            or_none(status.and_then(|s| s.owner.as_deref())),
            Value::String(format!("{:?}", self.phase())),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
        ]
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kubectl() {
        for (secs, want) in [
            (5, "5s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (20 * 3600, "20h"),
            (3 * 86_400 + 3600, "3d1h"),
            (30 * 86_400, "30d"),
            (3 * 365 * 86_400, "3y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn session_row_matches_columns() {
        let mut s = AccessSession::default();
        s.metadata.name = Some("alice-github".into());
        s.spec.server.name = "github".into();
        s.spec.teams = vec!["payments".into()];
        let cells = s.cells(Timestamp::UNIX_EPOCH);
        assert_eq!(cells.len(), AccessSession::COLUMNS.len());
        assert_eq!(cells[2], "<none>");
        assert_eq!(cells[3], "team:payments");
        assert_eq!(cells[4], "Active");
        assert_eq!(
            Agent::default().cells(Timestamp::UNIX_EPOCH).len(),
            Agent::COLUMNS.len()
        );
    }
}
