//! Table columns (`kubectl get`): the column type, the row trait and the helpers kinds share.
//! Each kind's columns live with its strategy in `kinds/`.

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

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
    pub const fn new(
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

pub(crate) const NAME: Column = Column::new(
    "Name",
    "string",
    "name",
    "Name must be unique within a namespace.",
    0,
);
pub(crate) const AGE: Column =
    Column::new("Age", "string", "", "Time since the object was created.", 0);

pub(crate) fn or_none(s: Option<&str>) -> Value {
    Value::String(s.filter(|s| !s.is_empty()).unwrap_or("<none>").to_string())
}

pub(crate) fn age(created: Option<Timestamp>, now: Timestamp) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AccessSession, Agent};

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
