//! What the suites that drive the real `kubectl` share: asserting on its output, reading the
//! tables it prints, and the manifest times it is given.
#![allow(dead_code)]

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::server::{Output, TestServer};

/// Asserts that kubectl succeeded.
pub fn ok(out: &Output) {
    assert!(out.success, "kubectl failed: {out:#?}");
}

/// Asserts that kubectl failed.
pub fn failed(out: &Output) {
    assert!(!out.success, "kubectl should have failed: {out:#?}");
}

/// Asserts a failed kubectl whose error is `Error from server (<reason>)` and mentions `text`.
pub fn failed_with(out: &Output, reason: &str, text: &str) {
    failed(out);
    assert!(
        out.stderr
            .contains(&format!("Error from server ({reason})")),
        "expected reason {reason}: {out:#?}"
    );
    assert!(out.stderr.contains(text), "expected {text:?}: {out:#?}");
}

/// Asserts a failed kubectl reporting a 422 (kubectl words it `The <Kind> "<name>" is
/// invalid`) that names `field`.
pub fn invalid(out: &Output, kind: &str, name: &str, field: &str) {
    failed(out);
    assert!(
        out.stderr
            .contains(&format!("The {kind} \"{name}\" is invalid")),
        "expected 422 Invalid: {out:#?}"
    );
    assert!(out.stderr.contains(field), "expected {field:?}: {out:#?}");
}

/// A `kubectl get` table: column names and rows, cut at the header's column positions (so
/// empty cells, as `-L` prints them, and cells with spaces are read correctly).
#[derive(Debug)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn parse(text: &str) -> Self {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header_line = lines
            .next()
            .unwrap_or_else(|| panic!("no table header in {text:?}"));
        let bytes = header_line.as_bytes();
        // A column starts at a non-space after at least two spaces (or at the line's start).
        let starts: Vec<usize> = (0..bytes.len())
            .filter(|&i| {
                bytes[i] != b' '
                    && (i == 0 || (bytes[i - 1] == b' ' && (i < 2 || bytes[i - 2] == b' ')))
            })
            .collect();
        let cut = |line: &str| -> Vec<String> {
            starts
                .iter()
                .enumerate()
                .map(|(k, &start)| {
                    let end = starts
                        .get(k + 1)
                        .copied()
                        .unwrap_or(usize::MAX)
                        .min(line.len());
                    line.get(start.min(line.len())..end)
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .collect()
        };
        Self {
            header: cut(header_line),
            rows: lines.map(cut).collect(),
        }
    }

    pub fn column(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.header))
    }

    /// The row whose NAME is `name`.
    pub fn row(&self, name: &str) -> &Vec<String> {
        let col = self.column("NAME");
        self.rows
            .iter()
            .find(|r| r[col] == name)
            .unwrap_or_else(|| panic!("no row {name} in {self:?}"))
    }

    pub fn cell(&self, name: &str, column: &str) -> &str {
        &self.row(name)[self.column(column)]
    }

    /// The NAME column, sorted.
    pub fn names(&self) -> Vec<String> {
        let col = self.column("NAME");
        let mut names: Vec<String> = self.rows.iter().map(|r| r[col].clone()).collect();
        names.sort();
        names
    }
}

/// `kubectl get ARGS` (as the admin), which must succeed, as a table.
pub async fn get_table(server: &TestServer, args: &[&str]) -> Table {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    let out = server.kubectl(&full).await;
    ok(&out);
    Table::parse(&out.stdout)
}

/// `kubectl get ARGS -o json` (as the admin), which must succeed.
pub async fn get_json(server: &TestServer, args: &[&str]) -> Value {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    let out = server.kubectl(&full).await;
    ok(&out);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("-o json is not JSON ({e}): {}", out.stdout))
}

/// Whether a table cell is an age as kubectl prints a young object's (`5s`).
pub fn is_age(cell: &str) -> bool {
    cell.len() >= 2
        && cell.ends_with('s')
        && cell[..cell.len() - 1].chars().all(|c| c.is_ascii_digit())
}

/// An RFC 3339 time `secs` from now, at second precision.
pub fn in_secs(secs: i64) -> String {
    let t = Timestamp::now() + SignedDuration::from_secs(secs);
    Timestamp::from_second(t.as_second())
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The lines of `text` with runs of white space folded to one space (how `describe` and
/// `explain` output is compared).
pub fn normalized_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Asserts that each of `wants` is a whole line of `text`, white space folded.
pub fn assert_lines(text: &str, wants: &[&str]) {
    let lines = normalized_lines(text);
    for want in wants {
        assert!(
            lines.iter().any(|l| l == want),
            "missing {want:?} in\n{text}"
        );
    }
}
