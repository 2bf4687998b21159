//! What a tool grant costs the gateway per request (issue 31: the decision adds ≤ 50 µs p99 at
//! 1,000 tools per grant). Run with `cargo bench -p gateway --bench tool_decision` (release);
//! never run by CI. Prints p50/p99 per case, measured side by side in one run:
//!
//! - `call`: a `tools/call` body parsed and decided against a grant of 1,000 entries (990 names
//!   and 10 prefix patterns), the granted tool last in the list (a full scan) and a refused one;
//!   beside it the same body with no grant (what every request already paid);
//! - `list`: a `tools/list` answer of 1,000 tools filtered against that grant, by the indexed
//!   grant the gateway uses and by a scan per tool (the ratio is what the index saves);
//! - `policy`: the same call decided by the session's grant and then by a ToolPolicy of 1,000
//!   rules (990 names, 10 patterns, every tenth rule with an argument constraint), as the
//!   gateway decides it (`ToolAccess::decide`), and the policy's compilation, which the gateway
//!   pays once per policy change, not per request.

use std::time::Instant;

use apis::rules::{tool_granted, ToolGrant};
use apis::tool_policy::PolicyIndex;
use apis::{
    AccessSession, ArgumentRule, Callers, ServerName, SideEffect, ToolPolicy, ToolPolicySpec,
    ToolRule,
};
use gateway::proxy::mcp::{
    decide_calls, filter_tools_list, refusal, refuse_ungranted_calls, Posted,
};
use gateway::proxy::tools::ToolAccess;
use serde_json::{json, Value};

const ENTRIES: usize = 1_000;
const ROUNDS: usize = 2_000;

fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |p: f64| us[((p / 100.0) * us.len() as f64).ceil() as usize - 1];
    (at(50.0), at(99.0))
}

fn measure(rounds: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..rounds / 10 {
        f();
    }
    let mut us = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        f();
        us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    percentiles(us)
}

fn main() {
    let mut grant: Vec<String> = (0..ENTRIES - 10).map(|i| format!("tool_{i:04}")).collect();
    grant.extend((0..10).map(|i| format!("family_{i}_*")));
    let last = format!("tool_{:04}", ENTRIES - 11);
    let call = |tool: &str| {
        serde_json::to_vec(&json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
            "params":{"name": tool, "arguments": {"q": "x".repeat(200)}}}))
        .unwrap()
    };
    let (granted_body, refused_body) = (call(&last), call("drop_table"));

    let decide = |body: &[u8], tools: Option<&[String]>| {
        let posted = Posted::parse(body);
        std::hint::black_box(refuse_ungranted_calls(&posted, |t| tool_granted(tools, t)));
    };
    let none = measure(ROUNDS, || decide(&granted_body, None));
    let granted = measure(ROUNDS, || decide(&granted_body, Some(&grant)));
    let refused = measure(ROUNDS, || decide(&refused_body, Some(&grant)));
    println!(
        "call, no grant (parse only):            p50 {:7.2} µs  p99 {:7.2} µs",
        none.0, none.1
    );
    println!(
        "call, 1,000 entries, granted (last):    p50 {:7.2} µs  p99 {:7.2} µs",
        granted.0, granted.1
    );
    println!(
        "call, 1,000 entries, refused:           p50 {:7.2} µs  p99 {:7.2} µs",
        refused.0, refused.1
    );
    println!(
        "call decision added at p99 (granted):   {:7.2} µs",
        granted.1 - none.1
    );

    let tools: Vec<Value> = (0..ENTRIES)
        .map(|i| json!({"name": format!("tool_{i:04}"), "inputSchema": {"type": "object"}}))
        .collect();
    let answer = json!({"jsonrpc":"2.0","id":1,"result":{"tools": tools}});
    let ids = [json!(1)];
    let indexed = measure(ROUNDS / 10, || {
        let mut a = answer.clone();
        let g = ToolGrant::new(Some(&grant));
        std::hint::black_box(filter_tools_list(&mut a, &ids, &|t, _| g.allows(t)));
    });
    let scanned = measure(ROUNDS / 10, || {
        let mut a = answer.clone();
        std::hint::black_box(filter_tools_list(&mut a, &ids, &|t, _| {
            tool_granted(Some(&grant), t)
        }));
    });
    let copy = measure(ROUNDS / 10, || {
        std::hint::black_box(answer.clone());
    });
    println!(
        "list of 1,000 filtered, indexed grant:  p50 {:7.2} µs  p99 {:7.2} µs",
        indexed.0, indexed.1
    );
    println!(
        "list of 1,000 filtered, scan per tool:  p50 {:7.2} µs  p99 {:7.2} µs",
        scanned.0, scanned.1
    );
    println!(
        "  (the answer's copy alone:             p50 {:7.2} µs  p99 {:7.2} µs)",
        copy.0, copy.1
    );

    // A ToolPolicy of 1,000 rules over the same tools: every tenth with an argument rule the
    // benchmark's call satisfies, the patterns destructive.
    let rules: Vec<ToolRule> = grant
        .iter()
        .enumerate()
        .map(|(i, name)| ToolRule {
            name: name.clone(),
            side_effect: if name.ends_with('*') {
                SideEffect::Destructive
            } else {
                SideEffect::Write
            },
            arguments: if i % 10 == 9 {
                vec![ArgumentRule {
                    name: "q".into(),
                    values: vec!["x".repeat(200), "y".into()],
                }]
            } else {
                vec![]
            },
            calls_per_minute: None,
            digest: None,
        })
        .collect();
    let mut policy = ToolPolicy {
        spec: ToolPolicySpec {
            server: ServerName {
                name: "bench".into(),
            },
            destructive_callers: Some(Callers {
                teams: vec!["sre".into()],
                agents: vec![],
            }),
            tools: rules,
            ..Default::default()
        },
        ..Default::default()
    };
    policy.metadata.name = Some("bench".into());
    let compile = measure(ROUNDS / 10, || {
        std::hint::black_box(PolicyIndex::new([&policy]));
    });
    let index = std::sync::Arc::new(PolicyIndex::new([&policy]));
    let mut session = AccessSession::default();
    session.spec.tools = Some(grant.clone());
    session.spec.teams = vec!["payments".into()];
    let observed = std::sync::Arc::new(gateway::pins::Observed::default());
    let grant_only = ToolAccess::new(
        &session,
        Some(std::sync::Arc::new(PolicyIndex::new([]))),
        observed.clone(),
    );
    let with_policy = ToolAccess::new(&session, Some(index), observed);
    let access_decide = |body: &[u8], access: &ToolAccess| {
        let posted = Posted::parse(body);
        let calls = decide_calls(&posted, |tool, arguments| access.decide(tool, arguments));
        std::hint::black_box(refusal(&posted, &calls));
    };
    // The last name of the grant (a full scan of it), whose rule carries an argument rule.
    let argued = call(&last);
    let parse_only = measure(ROUNDS, || decide(&argued, None));
    let grant_only_t = measure(ROUNDS, || access_decide(&argued, &grant_only));
    let policed = measure(ROUNDS, || access_decide(&argued, &with_policy));
    let destructive = call("family_3_drop");
    let policed_refused = measure(ROUNDS, || access_decide(&destructive, &with_policy));
    println!(
        "call, parse only (again, beside these):  p50 {:7.2} µs  p99 {:7.2} µs",
        parse_only.0, parse_only.1
    );
    println!(
        "call, grant only (1,000 entries):       p50 {:7.2} µs  p99 {:7.2} µs",
        grant_only_t.0, grant_only_t.1
    );
    println!(
        "call, grant + policy of 1,000 rules:    p50 {:7.2} µs  p99 {:7.2} µs  (argument checked)",
        policed.0, policed.1
    );
    println!(
        "call, policy refuses (destructive):     p50 {:7.2} µs  p99 {:7.2} µs",
        policed_refused.0, policed_refused.1
    );
    println!(
        "policy of 1,000 rules compiled:         p50 {:7.2} µs  p99 {:7.2} µs  (per policy change)",
        compile.0, compile.1
    );
    println!(
        "tool-decision call_p99_added_us={:.2} policy_over_grant_p99_added_us={:.2} grant_and_policy_p99_added_us={:.2} list_p50_ratio_scan_over_index={:.1}",
        granted.1 - none.1,
        policed.1 - grant_only_t.1,
        policed.1 - parse_only.1,
        scanned.0 / indexed.0
    );
}
