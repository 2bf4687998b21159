//! Command line of the end-to-end scenario runner (`e2e/tests/cluster.rs`, `harness = false`).
//!
//! cargo passes the test binary the same arguments it passes libtest (`cargo test -- ARGS`,
//! and `hack/test.sh -- ARGS` for every target at once), so the runner accepts libtest's flags,
//! consumes the values of those that take one (`--test-threads 2` is not a filter "2"), and
//! selects scenarios as libtest selects tests. Selecting none is an error, so a mistyped
//! filter cannot pass as "all scenarios passed".

use thiserror::Error;

/// libtest flags that take a value, as `--flag VALUE` or `--flag=VALUE`.
const WITH_VALUE: &[&str] = &[
    "--test-threads",
    "--logfile",
    "--skip",
    "--color",
    "--format",
    "--shuffle-seed",
    "-Z",
];

/// libtest flags without a value; they do not change which scenarios run (scenarios share one
/// cluster and always run one after another, with their output shown).
const WITHOUT_VALUE: &[&str] = &[
    "--include-ignored",
    "--test",
    "--nocapture",
    "--no-capture",
    "--show-output",
    "--report-time",
    "--ensure-time",
    "--force-run-in-process",
    "--exclude-should-panic",
    "--shuffle",
    "--quiet",
    "-q",
];

/// What the runner was asked to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    /// Substrings (or, with `exact`, names) of the scenarios to run; empty means all.
    pub filters: Vec<String>,
    /// Scenarios to leave out (substring, or name with `exact`).
    pub skip: Vec<String>,
    pub exact: bool,
    /// `--list`: print the scenario names, start nothing.
    pub list: bool,
    /// `--ignored` or `--bench`: run only ignored tests or benchmarks, of which the runner has
    /// none, so nothing is started (as libtest runs zero tests, successfully).
    pub only_none: bool,
}

/// Arguments the runner cannot honour.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("unrecognized option {0}")]
    Unknown(String),
    #[error(
        "no scenario matches {filters:?}{}; scenarios: {}",
        if .skip.is_empty() { String::new() } else { format!(" (skipping {:?})", .skip) },
        .names.join(", ")
    )]
    NothingSelected {
        filters: Vec<String>,
        skip: Vec<String>,
        names: Vec<String>,
    },
}

impl Args {
    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut parsed = Self::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--" {
                parsed.filters.extend(args.by_ref());
                break;
            }
            if !arg.starts_with('-') || arg == "-" {
                parsed.filters.push(arg);
                continue;
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if arg.starts_with("--") => (flag.to_string(), Some(value)),
                _ => (arg.clone(), None),
            };
            if WITH_VALUE.contains(&flag.as_str()) {
                let value = match inline {
                    Some(v) => v.to_string(),
                    None => args
                        .next()
                        .ok_or_else(|| ArgsError::MissingValue(flag.clone()))?,
                };
                if flag == "--skip" {
                    parsed.skip.push(value);
                }
                continue;
            }
            if inline.is_some() {
                return Err(ArgsError::Unknown(arg));
            }
            match flag.as_str() {
                "--exact" => parsed.exact = true,
                "--list" => parsed.list = true,
                "--ignored" | "--bench" => parsed.only_none = true,
                f if WITHOUT_VALUE.contains(&f) => {}
                _ => return Err(ArgsError::Unknown(arg)),
            }
        }
        Ok(parsed)
    }

    fn matches(&self, pattern: &str, name: &str) -> bool {
        if self.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    }

    /// Whether scenario `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        (self.filters.is_empty() || self.filters.iter().any(|f| self.matches(f, name)))
            && !self.skip.iter().any(|s| self.matches(s, name))
    }

    /// The selected names, in order; an error when nothing is selected (unless the run was
    /// asked for ignored tests or benchmarks only, which selects nothing by definition).
    pub fn select<'a>(&self, names: &[&'a str]) -> Result<Vec<&'a str>, ArgsError> {
        if self.only_none {
            return Ok(Vec::new());
        }
        let selected: Vec<&str> = names.iter().copied().filter(|n| self.selects(n)).collect();
        if selected.is_empty() {
            return Err(ArgsError::NothingSelected {
                filters: self.filters.clone(),
                skip: self.skip.clone(),
                names: names.iter().map(|n| n.to_string()).collect(),
            });
        }
        Ok(selected)
    }
}

/// One of `count` disjoint parts of a run: `MCP_ACCESS_E2E_SHARD=INDEX/COUNT` (1-based), so
/// `hack/test.sh` can run the scenarios on several clusters at once. The selected scenarios are
/// dealt round-robin in their declared order: each part gets every COUNT-th, so slow and fast
/// neighbours spread over the parts, and the parts together are exactly the selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 0-based.
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub const ENV: &'static str = "MCP_ACCESS_E2E_SHARD";

    /// The whole run.
    pub const ALL: Self = Self { index: 0, count: 1 };

    /// `INDEX/COUNT` with 1 ≤ INDEX ≤ COUNT.
    pub fn parse(value: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{}={value:?}: expected INDEX/COUNT with 1 <= INDEX <= COUNT",
                Self::ENV
            )
        };
        let (index, count) = value.split_once('/').ok_or_else(bad)?;
        let index: usize = index.trim().parse().map_err(|_| bad())?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Self {
            index: index - 1,
            count,
        })
    }

    /// From the environment; unset or empty is the whole run, anything malformed an error.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v),
            _ => Ok(Self::ALL),
        }
    }

    /// This part's share of `selected`, in order.
    pub fn take<'a>(&self, selected: &[&'a str]) -> Vec<&'a str> {
        selected
            .iter()
            .enumerate()
            .filter(|(i, _)| i % self.count == self.index)
            .map(|(_, n)| *n)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &[
        "rbac_limits_users",
        "default_roles_matrix",
        "namespace_lifecycle",
    ];

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn no_arguments_select_every_scenario() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.select(NAMES).unwrap(), NAMES);
    }

    #[test]
    fn values_of_harness_flags_are_not_filters() {
        for argv in [
            &["--test-threads", "2"][..],
            &["--test-threads=2"],
            &[
                "--nocapture",
                "-q",
                "--color",
                "never",
                "--format",
                "pretty",
            ],
            &[
                "--logfile",
                "/tmp/x",
                "--shuffle-seed",
                "7",
                "-Z",
                "unstable-options",
            ],
            &["--show-output", "--include-ignored", "--report-time"],
        ] {
            let args = parse(argv).unwrap();
            assert!(args.filters.is_empty(), "{argv:?} -> {args:?}");
            assert_eq!(args.select(NAMES).unwrap(), NAMES, "{argv:?}");
        }
    }

    #[test]
    fn filters_select_by_substring_or_exact_name() {
        let args = parse(&["--test-threads", "2", "roles", "--nocapture"]).unwrap();
        assert_eq!(args.select(NAMES).unwrap(), ["default_roles_matrix"]);
        let args = parse(&["--exact", "rbac_limits_users"]).unwrap();
        assert_eq!(args.select(NAMES).unwrap(), ["rbac_limits_users"]);
        let args = parse(&["--exact", "rbac"]).unwrap();
        assert!(matches!(
            args.select(NAMES),
            Err(ArgsError::NothingSelected { .. })
        ));
    }

    #[test]
    fn skip_leaves_scenarios_out() {
        let args = parse(&["--skip", "rbac", "--skip=namespace"]).unwrap();
        assert_eq!(args.select(NAMES).unwrap(), ["default_roles_matrix"]);
    }

    #[test]
    fn a_filter_matching_nothing_is_an_error_naming_the_scenarios() {
        let args = parse(&["no_such_scenario"]).unwrap();
        let err = args.select(NAMES).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("no_such_scenario") && text.contains("rbac_limits_users"),
            "{text}"
        );
    }

    #[test]
    fn ignored_and_bench_runs_select_nothing_without_error() {
        assert!(parse(&["--ignored"])
            .unwrap()
            .select(NAMES)
            .unwrap()
            .is_empty());
        assert!(parse(&["--bench"])
            .unwrap()
            .select(NAMES)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn unknown_flags_and_missing_values_are_errors() {
        assert_eq!(
            parse(&["--frobnicate"]),
            Err(ArgsError::Unknown("--frobnicate".into()))
        );
        assert_eq!(
            parse(&["--nocapture=yes"]),
            Err(ArgsError::Unknown("--nocapture=yes".into()))
        );
        assert_eq!(
            parse(&["--test-threads"]),
            Err(ArgsError::MissingValue("--test-threads".into()))
        );
    }

    #[test]
    fn list_is_recognised() {
        assert!(parse(&["--list"]).unwrap().list);
    }

    #[test]
    fn shards_partition_the_selection_round_robin() {
        let names = ["a", "b", "c", "d", "e"];
        let first = Shard::parse("1/2").unwrap();
        let second = Shard::parse("2/2").unwrap();
        assert_eq!(first.take(&names), ["a", "c", "e"]);
        assert_eq!(second.take(&names), ["b", "d"]);
        assert_eq!(Shard::ALL.take(&names), names);
        // A part may be empty when the selection is smaller than the parts.
        assert!(Shard::parse("3/3").unwrap().take(&["only"]).is_empty());
    }

    #[test]
    fn malformed_shards_are_refused() {
        for bad in ["", "1", "0/2", "3/2", "1/0", "a/b", "1/2/3"] {
            assert!(Shard::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
