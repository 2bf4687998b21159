//! What a tool grant costs the gateway per request (issue 31: the decision adds ≤ 50 µs p99 at
//! 1,000 tools per grant). Run with `cargo bench -p gateway --bench tool_decision` (release);
//! never run by CI. Prints p50/p99 per case, measured side by side in one run:
//!
//! - `call`: a `tools/call` body parsed and decided against a grant of 1,000 entries (990 names
//!   and 10 prefix patterns), the granted tool last in the list (a full scan) and a refused one;
//!   beside it the same body with no grant (what every request already paid);
//! - `list`: a `tools/list` answer of 1,000 tools filtered against that grant, by the indexed
//!   grant the gateway uses and by a scan per tool (the ratio is what the index saves).

use std::time::Instant;

use apis::rules::{tool_granted, ToolGrant};
use gateway::proxy::mcp::{filter_tools_list, refuse_ungranted_calls, Posted};
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
        std::hint::black_box(filter_tools_list(&mut a, &ids, &|t| g.allows(t)));
    });
    let scanned = measure(ROUNDS / 10, || {
        let mut a = answer.clone();
        std::hint::black_box(filter_tools_list(&mut a, &ids, &|t| {
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
    println!(
        "tool-decision call_p99_added_us={:.2} list_p50_ratio_scan_over_index={:.1}",
        granted.1 - none.1,
        scanned.0 / indexed.0
    );
}
