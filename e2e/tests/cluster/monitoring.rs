//! deploy/monitoring against the real processes: `promtool check rules` accepts the
//! PrometheusRule's `spec` (promtool built from the Go module proxy by hack/build-promtool.sh),
//! and every metric name the alerts and the Grafana dashboard query is served by a scrape of
//! the running apiserver, gateway sidecar (`mcp-access-authz`) or controllers — with the
//! exposition's own suffixes: a counter `x` is queried as `x_total`, a histogram as
//! `x_bucket`, `x_sum` or `x_count`, never bare.
//!
//! Needs `MCP_ACCESS_PROMTOOL_BIN`, `MCP_ACCESS_AUTHZ_BIN` and `MCP_ACCESS_CONTROLLERS_BIN`
//! (set by `hack/test.sh`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use e2e::LocalCluster;
use serde_json::Value;

use super::{create_namespace, ok, session_yaml};

fn env_path(name: &str) -> Result<PathBuf, String> {
    std::env::var(name)
        .map(PathBuf::from)
        .map_err(|_| format!("{name} is not set: run through hack/test.sh"))
}

fn monitoring_dir() -> PathBuf {
    e2e::repo_root().join("deploy/monitoring")
}

/// The `spec` of a PrometheusRule manifest as a plain rules file (`groups:` at the top).
fn rules_file_of(manifest: &str) -> Result<String, String> {
    let mut lines = manifest.lines();
    lines
        .by_ref()
        .find(|l| l.trim_end() == "spec:")
        .ok_or("the PrometheusRule has no top-level spec:")?;
    let mut out = String::new();
    for line in lines {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            out.push('\n');
            continue;
        }
        let body = line
            .strip_prefix("  ")
            .ok_or_else(|| format!("a top-level key after spec: {line:?}"))?;
        out.push_str(body);
        out.push('\n');
    }
    Ok(out)
}

/// Every `expr:` of a rules file: inline, or a block scalar (`|`, `>`) of the lines indented
/// deeper than the key.
fn rule_exprs(rules: &str) -> Vec<String> {
    let lines: Vec<&str> = rules.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let mut indent = line.len() - line.trim_start().len();
        let mut key = line.trim_start();
        if let Some(item) = key.strip_prefix("- ") {
            // The key of a sequence item sits after its dash.
            key = item;
            indent += 2;
        }
        if let Some(rest) = key.strip_prefix("expr:") {
            let rest = rest.trim();
            if rest.starts_with('|') || rest.starts_with('>') {
                let mut block = String::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push_str(next.trim());
                    block.push('\n');
                    i += 1;
                }
                exprs.push(block);
            } else {
                let unquoted = rest
                    .strip_prefix('"')
                    .and_then(|r| r.strip_suffix('"'))
                    .or_else(|| rest.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
                    .unwrap_or(rest);
                exprs.push(unquoted.to_string());
            }
        }
        i += 1;
    }
    exprs
}

/// Every `expr` of a Grafana dashboard (its panels' targets, rows' panels included).
fn dashboard_exprs(dashboard: &Value, out: &mut Vec<String>) {
    match dashboard {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// PromQL words that are not metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
];
/// Words followed by a list of label names.
const GROUPINGS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Skips from `open` at `chars[i]` to after its `close`, stepping over quoted strings.
fn skip_until(chars: &[char], mut i: usize, close: char) -> usize {
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i),
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The metric names a PromQL expression selects: identifiers that are neither functions nor
/// aggregations (followed by `(`, `by` or `without`), keywords, label names (inside `{…}` or a grouping list),
/// durations (inside `[…]`) nor strings.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            '{' => i = skip_until(&chars, i + 1, '}'),
            '[' => i = skip_until(&chars, i + 1, ']'),
            '0'..='9' | '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                // An aggregation may put its grouping first: `sum by (le) (…)`.
                let grouped_next = ["by", "without"].iter().any(|g| {
                    let rest: String = chars[next..].iter().take(g.len() + 1).collect();
                    rest.strip_prefix(g).is_some_and(|after| {
                        after.is_empty()
                            || !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    })
                });
                let called = chars.get(next) == Some(&'(') || grouped_next;
                if GROUPINGS.contains(&word.as_str()) && called {
                    i = skip_until(&chars, next + 1, ')');
                } else if !called && !KEYWORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// What a scrape serves: each family's type (`# TYPE`) and each sample's name.
#[derive(Default)]
struct Scrape {
    families: BTreeMap<String, String>,
    samples: BTreeSet<String>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut scrape = Self::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    scrape.families.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                scrape.samples.insert(line[..end].to_string());
            }
        }
        scrape
    }

    /// Whether a query of `name` selects series of this scrape: a sample of that name, or a
    /// family whose exposition has it (a family with no labelled child yet has only its
    /// `# TYPE` line; its series appear with the first event).
    fn serves(&self, name: &str) -> bool {
        if self.samples.contains(name) {
            return true;
        }
        self.families.iter().any(|(family, kind)| {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            suffixes
                .iter()
                .any(|suffix| name.strip_suffix(suffix) == Some(family.as_str()))
        })
    }
}

fn curl(url: &str) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-fsS", "--max-time", "5", url])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "GET {url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The status code of a GET of `url` by curl with `extra` arguments (headers, a CA).
fn status_of(extra: &[&str], url: &str) -> Result<u16, String> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .args(extra)
        .arg(url)
        .output()
        .map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| {
            format!(
                "GET {url}: no status ({e}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

/// A running `mcp-access-authz` sidecar, killed on drop.
struct Sidecar {
    child: Child,
    /// The check listener.
    base: String,
    /// The admin listener (`/readyz`, `/metrics`).
    admin: String,
    log: PathBuf,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sidecar {
    fn start(c: &LocalCluster, token: &str) -> Result<Self, String> {
        // The metrics are under test, not the credential: sessions are named by header.
        let e2e::gateway::SpawnedAuthz {
            child,
            port,
            admin_port,
            log,
            ..
        } = e2e::gateway::spawn_authz(c, "monitoring", token, &["--trust-session-header"])
            .map_err(|e| format!("{e:#}"))?;
        let sidecar = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            log,
        };
        sidecar.wait(Duration::from_secs(30), "ready", |s| {
            Ok(curl(&format!("{}/readyz", s.admin)).is_ok())
        })?;
        Ok(sidecar)
    }

    fn wait(
        &self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&Self) -> Result<bool, String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while !done(self)? {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(format!(
                    "mcp-access-authz not {what} within {limit:?}: {log}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The check's status for `ns/name`.
    fn check(&self, ns: &str, name: &str) -> Result<u16, String> {
        status_of(
            &["-H", &format!("X-MCP-Session: {ns}/{name}")],
            &format!("{}/mcp", self.base),
        )
    }
}

/// promtool accepts the rules; every metric the rules and the dashboard query is served by
/// a scrape of the four running processes, suffixes included; the revoke-to-deny histogram
/// records a real revocation.
pub fn rules_and_dashboard_match_the_scrapes(c: &mut LocalCluster) -> Result<(), String> {
    // The checks below must be able to fail: first, their parts on known inputs.
    let parsed = metric_names(
        r#"histogram_quantile(0.99, sum by (verb, le) (rate(a_bucket{verb!="watch", x=~"b{1}"}[5m]))) > 1 and on(pod) b_total offset 5m unless c / max without(x) (bytes)"#,
    );
    ensure!(
        parsed.iter().map(String::as_str).collect::<Vec<_>>()
            == ["a_bucket", "b_total", "bytes", "c"],
        "PromQL names: {parsed:?}"
    );
    let known = Scrape::parse("# TYPE h histogram\n# TYPE c counter\n# TYPE g gauge\ng 1\n# EOF\n");
    ensure!(
        known.serves("h_bucket")
            && known.serves("h_count")
            && !known.serves("h")
            && known.serves("c_total")
            && !known.serves("c")
            && known.serves("g")
            && !known.serves("g_total"),
        "exposition suffixes"
    );
    ensure!(
        rule_exprs("- expr: up == 0\n- expr: |\n    a\n    > 1\n  for: 1m\n")
            == ["up == 0", "a\n> 1\n"],
        "rule exprs"
    );

    let dir = monitoring_dir();
    let manifest = std::fs::read_to_string(dir.join("prometheusrule.yaml"))
        .map_err(|e| format!("deploy/monitoring/prometheusrule.yaml: {e}"))?;
    let rules = rules_file_of(&manifest)?;
    let rules_path = c.dir.join("mcp-access-rules.yaml");
    std::fs::write(&rules_path, &rules).map_err(|e| e.to_string())?;
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let promtool = env_path("MCP_ACCESS_PROMTOOL_BIN")?;
    let checked = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules_path)
        .output()
        .map_err(|e| format!("{}: {e}", promtool.display()))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    ensure!(
        checked.status.success() && report.contains(&format!("SUCCESS: {alerts} rules found")),
        "promtool check rules ({alerts} alerts): {report}"
    );

    let mut exprs = rule_exprs(&rules);
    ensure!(
        exprs.len() == alerts,
        "one expr per alert: {} exprs, {alerts} alerts",
        exprs.len()
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dashboard.json"))
            .map_err(|e| format!("deploy/monitoring/dashboard.json: {e}"))?,
    )
    .map_err(|e| format!("dashboard.json: {e}"))?;
    dashboard_exprs(&dashboard, &mut exprs);
    let names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    // The themes of the issue, under the names the processes export.
    for wanted in [
        "mcp_gateway_session_sync_age_seconds",
        "mcp_gateway_revoke_to_deny_seconds_bucket",
        "mcp_access_apiserver_change_feed_lag_seconds",
        "mcp_access_apiserver_watch_cutoffs_total",
        "mcp_controllers_netpol_orphans_withheld",
        "mcp_controllers_reconcile_errors_total",
        "mcp_access_apiserver_request_duration_seconds_bucket",
        "mcp_gateway_calls_refused_total",
        "mcp_gateway_calls_monitored_total",
        "mcp_runtime_gateway_policy_oversize_total",
    ] {
        ensure!(
            names.contains(wanted),
            "the rules and dashboard do not query {wanted}: {names:?}"
        );
    }

    // The gateway sidecar, with a session it allows and then denies after a revocation.
    let ns = "e2e-monitoring";
    create_namespace(c, ns)?;
    let chain = c
        .create_gateway_chain(ns, "watched")
        .map_err(|e| format!("{e:#}"))?;
    let token = c.gateway_token(&chain).map_err(|e| format!("{e:#}"))?;
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["create", "-n", ns, "-f", "-"],
            Some(&session_yaml("observed", &chain.server_uid)),
        ),
        "create session",
    )?;
    let sidecar = Sidecar::start(c, &token)?;
    sidecar.wait(Duration::from_secs(10), "allowing", |s| {
        Ok(s.check(ns, "observed")? == 200)
    })?;
    let revocation = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: rvk-observed\nspec:\n  target: {session: observed}\n  cause: compromised\n";
    ok(
        &c.kubectl_as(
            &c.kubeconfig,
            &["create", "-n", ns, "-f", "-"],
            Some(revocation),
        ),
        "create revocation",
    )?;
    sidecar.wait(Duration::from_secs(10), "denying", |s| {
        Ok(s.check(ns, "observed")? == 401)
    })?;
    let gateway_text = curl(&format!("{}/metrics", sidecar.admin))?;
    drop(sidecar);
    // The enforcing gateway on the same Pod-bound token (its upstream is never asked): the
    // tool-call panels and alerts query what it serves.
    let enforcing = e2e::mcp::spawn_gateway(
        c,
        "monitoring",
        &token,
        "http://127.0.0.1:9",
        &e2e::mcp::public_url(ns, "watched"),
        &[],
    )
    .map_err(|e| format!("mcp-access-gateway: {e:#}"))?;
    let enforcing_text = enforcing
        .get("/metrics")
        .map_err(|e| format!("mcp-access-gateway /metrics: {e:#}"))?
        .body;
    drop(enforcing);
    let applied = gateway_text
        .lines()
        .find_map(|l| l.strip_prefix("mcp_gateway_revoke_to_deny_seconds_count "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    ensure!(
        applied == Some(1.0),
        "the revocation is one revoke-to-deny observation: {applied:?}\n{gateway_text}"
    );
    let observed_sum = gateway_text
        .lines()
        .find_map(|l| l.strip_prefix("mcp_gateway_revoke_to_deny_seconds_sum "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    // revokedAt is whole seconds: the observation is the latency plus up to 1 s.
    ensure!(
        (0.0..3.0).contains(&observed_sum),
        "revoke-to-deny observed {observed_sum} s"
    );
    eprintln!("    revoke-to-deny observed by the sidecar: {observed_sum:.3} s (revokedAt has whole-second precision)");

    // The controllers (after the sidecar: as leader they would reconcile its MCPServer), with
    // the Host API on; one request without a token gives its request counter a series.
    let host_api = c.host_api_args().map_err(|e| format!("{e:#}"))?;
    let mut args = vec!["--lease-name=mcp-access-monitoring"];
    args.extend(host_api.iter().map(String::as_str));
    let controllers = c
        .start_controllers(
            &env_path("MCP_ACCESS_CONTROLLERS_BIN")?,
            "monitoring",
            &args,
        )
        .map_err(|e| format!("{e:#}"))?;
    let host_api_port = controllers.host_api_port.ok_or("no Host API port")?;
    let host_ca = c
        .env
        .get("HOST_API_CA_FILE")
        .ok_or("the cluster env has no HOST_API_CA_FILE")?;
    let refused = status_of(
        &["--cacert", host_ca],
        &format!("https://127.0.0.1:{host_api_port}/api/v2/hosts/self/mcpservers"),
    )?;
    ensure!(refused == 401, "the Host API without a token: {refused}");
    let controllers_text = controllers.get("/metrics").map_err(|e| format!("{e:#}"))?;
    drop(controllers);
    let apiserver_text = curl(&format!("http://127.0.0.1:{}/metrics", c.metrics_port))?;

    let scrapes = [
        ("mcp-access-apiserver", Scrape::parse(&apiserver_text)),
        ("mcp-access-authz", Scrape::parse(&gateway_text)),
        ("mcp-access-gateway", Scrape::parse(&enforcing_text)),
        ("mcp-access-controllers", Scrape::parse(&controllers_text)),
    ];
    // The check itself must be able to fail: bare family names of a histogram or a counter
    // select nothing in Prometheus.
    for bare in [
        "mcp_gateway_revoke_to_deny_seconds",
        "mcp_access_apiserver_requests",
        "mcp_access_apiserver_watch_cutoffs",
    ] {
        ensure!(
            !scrapes.iter().any(|(_, s)| s.serves(bare)),
            "the check accepts the bare name {bare}"
        );
    }
    let mut missing = Vec::new();
    let mut served_by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in &names {
        match scrapes.iter().find(|(_, s)| s.serves(name)) {
            Some((process, _)) => served_by.entry(process).or_default().push(name),
            None => missing.push(name.as_str()),
        }
    }
    ensure!(
        missing.is_empty(),
        "queried by deploy/monitoring but served by no process: {missing:?}"
    );
    ensure!(
        served_by.len() == scrapes.len(),
        "each process serves some of the queried metrics: {served_by:?}"
    );
    eprintln!(
        "    {} metric names in {} queries, all served: {served_by:?}",
        names.len(),
        exprs.len()
    );
    Ok(())
}
