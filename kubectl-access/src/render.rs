//! Output as kubectl prints it: tables with upper-case headers and columns three spaces
//! apart, ages as `HumanDuration`, `-o json` (indented) and `-o yaml`.

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::cli::ObjectOutput;
use crate::error::{CliError, Result};

/// A table: headers and rows of the same width.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    /// kubectl's tabwriter layout: each column as wide as its widest cell plus three spaces,
    /// the last one unpadded, every line ending with a newline.
    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths = vec![0usize; columns];
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(columns) {
                line.push_str(cell);
                if i + 1 < columns {
                    let pad = widths[i] - cell.chars().count() + 3;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`: what kubectl prints as an age.
pub fn human_duration(d: SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// How long from `now` until `t`, as kubectl prints ages; `<none>` without a time.
pub fn until(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        Some(t) => human_duration(t.duration_since(now)),
        None => "<none>".into(),
    }
}

/// `value` as `-o json` (two-space indent) or `-o yaml` prints it.
pub fn object<T: Serialize>(value: &T, format: ObjectOutput) -> Result<String> {
    match format {
        ObjectOutput::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(CliError::other),
        ObjectOutput::Yaml => serde_norway::to_string(value).map_err(CliError::other),
    }
}

/// kubectl's wrapper around the items of a `-o json|yaml` list.
pub fn list<T: Serialize>(items: &[T]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    })
}

/// `<none>` for an empty cell, as kubectl's printers write it.
pub fn or_none(s: impl Into<String>) -> String {
    let s = s.into();
    if s.is_empty() {
        "<none>".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_three_spaces_apart_and_the_last_is_unpadded() {
        let mut t = Table::new(&["NAME", "SUBJECT", "TEAMS"]);
        t.push(vec![
            "alice-github".into(),
            "alice@example.com".into(),
            "payments".into(),
        ]);
        t.push(vec!["b".into(), "<none>".into(), "".into()]);
        assert_eq!(
            t.render(),
            "NAME           SUBJECT             TEAMS\n\
             alice-github   alice@example.com   payments\n\
             b              <none>\n"
        );
    }

    #[test]
    fn a_table_without_rows_is_its_header() {
        assert_eq!(Table::new(&["A", "B"]).render(), "A   B\n");
    }

    #[test]
    fn durations_read_like_kubectl_ages() {
        let s = SignedDuration::from_secs;
        assert_eq!(human_duration(s(-5)), "<invalid>");
        assert_eq!(human_duration(s(-1)), "0s");
        assert_eq!(human_duration(s(59)), "59s");
        assert_eq!(human_duration(s(119)), "119s");
        assert_eq!(human_duration(s(120)), "2m");
        assert_eq!(human_duration(s(125)), "2m5s");
        assert_eq!(human_duration(s(600)), "10m");
        assert_eq!(human_duration(s(3 * 3600)), "3h");
        assert_eq!(human_duration(s(3 * 3600 + 25 * 60)), "3h25m");
        assert_eq!(human_duration(s(30 * 3600)), "30h");
        assert_eq!(human_duration(s(3 * 86400 + 5 * 3600)), "3d5h");
        assert_eq!(human_duration(s(100 * 86400)), "100d");
        assert_eq!(human_duration(s(3 * 365 * 86400 + 86400)), "3y1d");
        assert_eq!(human_duration(s(10 * 365 * 86400)), "10y");
    }

    #[test]
    fn until_without_a_time_is_none() {
        assert_eq!(until(None, Timestamp::UNIX_EPOCH), "<none>");
        let later = Timestamp::UNIX_EPOCH + SignedDuration::from_secs(90);
        assert_eq!(until(Some(later), Timestamp::UNIX_EPOCH), "90s");
    }

    #[test]
    fn lists_are_wrapped_as_kubectl_wraps_them() {
        let l = list(&[serde_json::json!({"a": 1})]);
        assert_eq!(l["kind"], "List");
        assert_eq!(l["items"][0]["a"], 1);
        assert!(object(&l, ObjectOutput::Yaml)
            .unwrap()
            .contains("kind: List"));
        assert!(object(&l, ObjectOutput::Json).unwrap().ends_with("}\n"));
    }
}
