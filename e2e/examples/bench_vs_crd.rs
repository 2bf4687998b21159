//! AccessSession served by MCP Access vs the same kind as a CRD, through one kube-apiserver
//! (run by `hack/bench-vs-crd.sh`, never by CI).
//!
//! Starts the local cluster once (etcd, kube-apiserver, kube-controller-manager, PostgreSQL and
//! MCP Access behind its APIService) and installs a CRD `accesssessions.bench.mcp-runtime.dev`
//! whose schema is the AccessSession schema MCP Access publishes (generated from the Rust type,
//! `apis::openapi::openapi_v3_group`, its `$ref`s inlined). kube-apiserver refuses a CRD whose
//! schema is not structural, so installing it is the check that the schema works as one.
//!
//! Both collections then get the same workload, through kube-apiserver with the same client
//! (kube-rs, HTTP/1.1, admin client certificate) and the same request bodies (only `apiVersion`
//! differs): ours goes through the aggregation proxy, the CRD is served natively.
//!
//! - creates of valid sessions (an Agent exists, its teams, an expiry inside its TTL): the first
//!   level is filled half by 1 client and half by 8 concurrent clients, later levels by 8; the
//!   two systems take turns in chunks (100 creates with 1 client, 500 with 8) so that machine
//!   load falls on both alike; the CPU time (user + system, `/proc/<pid>/stat`) each process
//!   spent during a system's own turns, per create: kube-apiserver, etcd,
//!   mcp-access-apiserver, PostgreSQL and the clients;
//! - at every level (1,000 / 10,000 / 50,000 objects): a full list, a full list at
//!   `resourceVersion=0` and a paged list (`limit=500`, following `continue`), each the median
//!   of a few rounds that alternate between the systems; the time is until the last byte of the
//!   response body (the client does not decode it inside the clock); every list is checked to
//!   return every object;
//! - watch delivery latency with 1 / 100 / 1,000 watchers: N watches open on a namespace, then
//!   sessions are created one at a time; each delivery is timed from just before the create is
//!   sent to the watcher's receipt of its ADDED event (p50/p99 over every delivery);
//! - memory: VmRSS (from `/proc/<pid>/status`) and PSS (from `/proc/<pid>/smaps_rollup`, which
//!   shares PostgreSQL's shared buffers out among its processes instead of counting them in each)
//!   of kube-apiserver + etcd vs mcp-access-apiserver + every PostgreSQL process, at an empty
//!   baseline and at each level, and per stored object as the delta between levels.
//!
//! Prints one table: figure, ours, CRD, ours/CRD and which is better.
//!
//! Usage: `bench_vs_crd [--quick] [--levels 1000,10000,50000] [--watchers 1,100,1000]
//! [--trials 20] [--rounds 5]`; needs `MCP_ACCESS_APISERVER_BIN` and `KUBE_APISERVER`,
//! `KUBE_CONTROLLER_MANAGER`, `ETCD` (from `hack/build-kube.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::{Database, LocalCluster, Options};
use futures::TryStreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::{json, Map, Value};

/// The namespace holding the listed objects.
const NS: &str = "bench";
/// The namespace of the watch trials (so that they do not change the listed counts).
const WATCH_NS: &str = "bench-watch";
/// The namespace of the warm-up objects.
const WARM_NS: &str = "bench-warm";
/// The CRD's group: the same kind beside ours.
const CRD_GROUP: &str = "bench.mcp-runtime.dev";
/// The agent every session is for.
const AGENT: &str = "bench-bot";
/// Concurrent clients of the concurrent create phases.
const CLIENTS: usize = 8;
/// Creates per turn before the other system's turn.
const CHUNK: usize = 500;
/// The turn of one client: its 500 creates take about 1.5 s a system, so turns of 100 let
/// machine noise fall on both systems alike five times over.
const CHUNK_ONE_CLIENT: usize = 100;

struct Args {
    levels: Vec<usize>,
    watchers: Vec<usize>,
    trials: usize,
    rounds: usize,
}

fn parse_list(value: &str) -> Result<Vec<usize>> {
    value
        .split(',')
        .map(|v| v.trim().replace('_', "").parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("not a list of counts: {value}"))
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        levels: vec![1_000, 10_000, 50_000],
        watchers: vec![1, 100, 1_000],
        trials: 20,
        rounds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--quick" {
            args.levels = vec![1_000];
            args.watchers = vec![1, 100];
            args.trials = 5;
            args.rounds = 3;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--levels" => args.levels = parse_list(&value)?,
            "--watchers" => args.watchers = parse_list(&value)?,
            "--trials" => args.trials = value.parse()?,
            "--rounds" => args.rounds = value.parse()?,
            other => {
                bail!("unknown flag {other} (flags: --quick --levels --watchers --trials --rounds)")
            }
        }
    }
    args.levels.sort_unstable();
    args.levels.dedup();
    if args.levels.first().is_none_or(|&l| l < 2) || args.trials == 0 || args.rounds == 0 {
        bail!("--levels needs counts of at least 2, --trials and --rounds at least 1");
    }
    Ok(args)
}

fn need(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run hack/bench-vs-crd.sh"))
}

// ---------------------------------------------------------------------------------------------
// The CRD, from the schema MCP Access publishes

/// Keys a CRD's `JSONSchemaProps` has (kube-apiserver refuses others).
const SCHEMA_KEYS: &[&str] = &[
    "description",
    "type",
    "format",
    "title",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "allOf",
    "oneOf",
    "anyOf",
    "not",
    "properties",
    "additionalProperties",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

/// `schema` with every `$ref` into `components` replaced by the schema it names (keeping the
/// referring schema's own description), and keys a CRD schema cannot carry dropped (noted in
/// `dropped`).
fn inline(
    schema: &Value,
    components: &Map<String, Value>,
    dropped: &mut BTreeMap<String, usize>,
    depth: usize,
) -> Result<Value> {
    if depth > 64 {
        bail!("the schema nests deeper than 64 levels (a recursive type?)");
    }
    let Value::Object(map) = schema else {
        return Ok(schema.clone());
    };
    let mut out = Map::new();
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        let name = reference
            .strip_prefix("#/components/schemas/")
            .with_context(|| format!("unexpected $ref {reference}"))?;
        let target = components
            .get(name)
            .with_context(|| format!("$ref to a missing schema {name}"))?;
        if let Value::Object(resolved) = inline(target, components, dropped, depth + 1)? {
            out = resolved;
        }
    }
    for (key, value) in map {
        let value = match key.as_str() {
            "$ref" => continue,
            "properties" => {
                let mut props = Map::new();
                for (name, prop) in value.as_object().into_iter().flatten() {
                    props.insert(name.clone(), inline(prop, components, dropped, depth + 1)?);
                }
                Value::Object(props)
            }
            "items" | "additionalProperties" | "not" if value.is_object() => {
                inline(value, components, dropped, depth + 1)?
            }
            "allOf" | "oneOf" | "anyOf" => Value::Array(
                value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| inline(s, components, dropped, depth + 1))
                    .collect::<Result<_>>()?,
            ),
            k if SCHEMA_KEYS.contains(&k) => value.clone(),
            other => {
                *dropped.entry(other.to_string()).or_default() += 1;
                continue;
            }
        };
        out.insert(key.clone(), value);
    }
    // A lone `allOf: [X]` (a `$ref` with siblings in OpenAPI 3.0) is X.
    if let Some(Value::Array(all)) = out.get("allOf") {
        if all.len() == 1 {
            if let Some(Value::Object(only)) = all.first().cloned() {
                out.remove("allOf");
                for (k, v) in only {
                    out.entry(k).or_insert(v);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// The CRD `accesssessions.bench.mcp-runtime.dev`: the AccessSession schema MCP Access
/// publishes, with `metadata` left to kube-apiserver (a CRD may not constrain it).
fn access_session_crd() -> Result<Value> {
    let doc = apis::openapi::openapi_v3_group();
    let components = doc["components"]["schemas"]
        .as_object()
        .context("the OpenAPI document has no schemas")?;
    let name = apis::openapi::definition_name("AccessSession");
    let kind = components
        .get(&name)
        .with_context(|| format!("the OpenAPI document has no {name}"))?;
    let mut dropped = BTreeMap::new();
    let mut schema = inline(kind, components, &mut dropped, 0)?;
    let props = schema["properties"]
        .as_object_mut()
        .context("the AccessSession schema has no properties")?;
    // A CRD schema may say no more of `metadata` than that it is an object.
    props.insert("metadata".into(), json!({"type": "object"}));
    if !dropped.is_empty() {
        eprintln!("CRD schema: dropped keys a CRD schema cannot carry: {dropped:?}");
    }
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("accesssessions.{CRD_GROUP}")},
        "spec": {
            "group": CRD_GROUP,
            "names": {
                "kind": "AccessSession",
                "listKind": "AccessSessionList",
                "plural": "accesssessions",
                "singular": "accesssession",
            },
            "scope": "Namespaced",
            "versions": [{
                "name": apis::VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
            }],
        },
    }))
}

// ---------------------------------------------------------------------------------------------
// The two systems

/// One of the two collections under test.
#[derive(Clone)]
struct System {
    label: &'static str,
    group: &'static str,
}

impl System {
    fn api_version(&self) -> String {
        format!("{}/{}", self.group, apis::VERSION)
    }

    fn collection(&self, ns: &str) -> String {
        format!(
            "/apis/{}/{}/namespaces/{ns}/accesssessions",
            self.group,
            apis::VERSION
        )
    }

    fn resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.into(),
            version: apis::VERSION.into(),
            api_version: self.api_version(),
            kind: "AccessSession".into(),
            plural: "accesssessions".into(),
        }
    }
}

/// The body of session `name`: what the README issues (an agent, its team, an expiry inside
/// the agent's TTL, a label), the same for both systems but for `apiVersion`.
fn session_body(system: &System, ns: &str, name: &str, server_uid: &str) -> Vec<u8> {
    let expires =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(1);
    serde_json::to_vec(&json!({
        "apiVersion": system.api_version(),
        "kind": "AccessSession",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "bench"}},
        "spec": {
            "server": {"name": "github", "uid": server_uid},
            "agent": {"name": AGENT},
            "teams": ["bench"],
            "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        },
    }))
    .unwrap_or_default()
}

async fn create(client: &kube::Client, system: &System, ns: &str, name: &str) -> Result<()> {
    let body = session_body(system, ns, name, SERVER_UID);
    let req = http::Request::post(system.collection(ns))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(body)?;
    client
        .request_text(req)
        .await
        .with_context(|| format!("create {} {ns}/{name}", system.label))?;
    Ok(())
}

const SERVER_UID: &str = "2f9c1a6e-0000-4000-8000-000000000001";

/// Creates `count` sessions named `s-<from>…` with `clients` concurrent clients; the elapsed
/// time.
async fn create_many(
    client: &kube::Client,
    system: &System,
    from: usize,
    count: usize,
    clients: usize,
) -> Result<Duration> {
    let next = Arc::new(AtomicUsize::new(from));
    let end = from + count;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, system, next) = (client.clone(), system.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return anyhow::Ok(());
                    }
                    create(&client, &system, NS, &format!("s-{i:06}")).await?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

/// What one create phase measured for each system (ours, CRD).
struct Filled {
    rates: [f64; 2],
    /// CPU time per create of each process group, during that system's turns only.
    cpu: [Cpu; 2],
}

/// Fills both systems from `from` to `to` objects with `clients` clients, taking turns in
/// chunks; the create rate of each and the CPU its creates cost every process.
async fn fill(
    client: &kube::Client,
    systems: &[System; 2],
    pids: &Pids,
    from: usize,
    to: usize,
    clients: usize,
) -> Result<Filled> {
    let mut elapsed = [Duration::ZERO; 2];
    let mut cpu = [Cpu::default(); 2];
    let mut at = from;
    let mut turn = 0usize;
    while at < to {
        let chunk = if clients == 1 {
            CHUNK_ONE_CLIENT
        } else {
            CHUNK
        };
        let n = chunk.min(to - at);
        // Alternate which system goes first in a pair of turns.
        for k in 0..2 {
            let i = (turn + k) % 2;
            let before = pids.cpu()?;
            elapsed[i] += create_many(client, &systems[i], at, n, clients).await?;
            cpu[i].add(&pids.cpu()?.since(&before));
        }
        at += n;
        turn += 1;
    }
    let n = (to - from) as f64;
    Ok(Filled {
        rates: [n / elapsed[0].as_secs_f64(), n / elapsed[1].as_secs_f64()],
        cpu: cpu.map(|c| c.per(n)),
    })
}

#[derive(serde::Deserialize)]
struct ListShape {
    metadata: ListMetaShape,
    items: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct ListMetaShape {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

/// GET `path`; the body and the time until its last byte.
async fn get_timed(client: &kube::Client, path: &str) -> Result<(String, Duration)> {
    let req = http::Request::get(path)
        .header("accept", "application/json")
        .body(Vec::new())?;
    let started = Instant::now();
    let text = client
        .request_text(req)
        .await
        .with_context(|| format!("GET {path}"))?;
    Ok((text, started.elapsed()))
}

/// One full list (`query` added); its time. Fails unless it holds `expect` items.
async fn list_full(
    client: &kube::Client,
    system: &System,
    query: &str,
    expect: usize,
) -> Result<Duration> {
    let (text, elapsed) = get_timed(client, &format!("{}{query}", system.collection(NS))).await?;
    let list: ListShape = serde_json::from_str(&text)?;
    if list.items.len() != expect {
        bail!(
            "{}: the list{query} returned {} items, expected {expect}",
            system.label,
            list.items.len()
        );
    }
    Ok(elapsed)
}

/// A paged list (`limit=500`, following `continue`); the sum of the page times (the client's
/// decoding of each page for its token is outside the clock). Fails unless the pages hold
/// `expect` items.
async fn list_paged(client: &kube::Client, system: &System, expect: usize) -> Result<Duration> {
    let mut elapsed = Duration::ZERO;
    let mut token: Option<String> = None;
    let mut items = 0;
    loop {
        let mut path = format!("{}?limit=500", system.collection(NS));
        if let Some(t) = &token {
            path.push_str("&continue=");
            path.push_str(&urlencode(t));
        }
        let (text, page) = get_timed(client, &path).await?;
        elapsed += page;
        let list: ListShape = serde_json::from_str(&text)?;
        items += list.items.len();
        match list.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    if items != expect {
        bail!(
            "{}: the paged list returned {items} items, expected {expect}",
            system.label
        );
    }
    Ok(elapsed)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median times in ms (ours, CRD) of `rounds` rounds of `op`, the systems alternating.
async fn alternate<F, Fut>(systems: &[System; 2], rounds: usize, op: F) -> Result<[f64; 2]>
where
    F: Fn(System) -> Fut,
    Fut: std::future::Future<Output = Result<Duration>>,
{
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..2 {
            let i = (round + k) % 2;
            times[i].push(op(systems[i].clone()).await?.as_secs_f64() * 1e3);
        }
    }
    let [a, b] = times;
    Ok([median(a), median(b)])
}

// ---------------------------------------------------------------------------------------------
// Watch delivery

/// Opens `count` watches on the watch namespace of `system`, creates one session first to see
/// that every watch delivers, then `trials` sessions one at a time; every delivery latency in ms.
async fn watch_latency(
    client: &kube::Client,
    system: &System,
    count: usize,
    trials: usize,
    tag: &str,
) -> Result<Vec<f64>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), WATCH_NS, &system.resource());
    let rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .context("a list without resourceVersion")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let mut tasks = Vec::with_capacity(count);
    let opened = Instant::now();
    for _ in 0..count {
        let (api, tx, rv) = (api.clone(), tx.clone(), rv.clone());
        tasks.push(tokio::spawn(async move {
            let stream = api.watch(&WatchParams::default().timeout(290), &rv).await?;
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.try_next().await? {
                match event {
                    WatchEvent::Added(obj) => {
                        let now = Instant::now();
                        let _ = tx.send((obj.metadata.name.unwrap_or_default(), now));
                    }
                    WatchEvent::Error(e) => bail!("watch error: {e:?}"),
                    _ => {}
                }
            }
            anyhow::Ok(())
        }));
    }
    drop(tx);
    let abort = || tasks.iter().for_each(|t| t.abort());
    // Every watch is open once each has delivered the warm-up object.
    let warm = format!("w-{tag}-{count}-warm");
    let result = async {
        create(client, system, WATCH_NS, &warm).await?;
        wait_all(&mut rx, count, &warm, Duration::from_secs(120)).await?;
        eprintln!(
            "  {}: {count} watches open in {:.1}s",
            system.label,
            opened.elapsed().as_secs_f64()
        );
        let mut latencies = Vec::with_capacity(count * trials);
        for trial in 0..trials {
            let name = format!("w-{tag}-{count}-{trial}");
            let started = Instant::now();
            create(client, system, WATCH_NS, &name).await?;
            for at in wait_all(&mut rx, count, &name, Duration::from_secs(60)).await? {
                latencies.push(at.saturating_duration_since(started).as_secs_f64() * 1e3);
            }
        }
        anyhow::Ok(latencies)
    }
    .await;
    abort();
    result
}

/// The receipt times of `name` at `count` watches.
async fn wait_all(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    count: usize,
    name: &str,
    timeout: Duration,
) -> Result<Vec<Instant>> {
    let mut seen = Vec::with_capacity(count);
    let deadline = tokio::time::Instant::now() + timeout;
    while seen.len() < count {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((n, at))) if n == name => seen.push(at),
            Ok(Some(_)) => {}
            Ok(None) => bail!("every watch ended"),
            Err(_) => bail!(
                "{} of {count} watches saw {name} within {timeout:?}",
                seen.len()
            ),
        }
    }
    Ok(seen)
}

// ---------------------------------------------------------------------------------------------
// CPU

/// CPU time (user + system) of each process group, in microseconds: a sample, a difference
/// of two, or a difference divided per create. Indexed by [`KUBE_APISERVER`] and the rest.
#[derive(Clone, Copy, Default)]
struct Cpu([f64; 5]);

const KUBE_APISERVER: usize = 0;
const ETCD: usize = 1;
const OURS: usize = 2;
const POSTGRES: usize = 3;
/// This benchmark's own process (the clients).
const BENCH: usize = 4;

impl Cpu {
    fn since(&self, before: &Cpu) -> Cpu {
        Cpu(std::array::from_fn(|i| self.0[i] - before.0[i]))
    }

    fn add(&mut self, other: &Cpu) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    fn per(&self, n: f64) -> Cpu {
        Cpu(self.0.map(|v| v / n))
    }

    /// Every server process (not the benchmark's clients).
    fn servers(&self) -> f64 {
        self.0[..BENCH].iter().sum()
    }
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid` (every thread), in microseconds; 0 for a process gone.
fn cpu_of(pid: &str, tick_us: f64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // pid (comm) state ppid ... utime stime: fields 14 and 15, counted after the last ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 * tick_us
}

// ---------------------------------------------------------------------------------------------
// Memory

#[derive(Clone, Copy, Default)]
struct Mem {
    rss_kib: u64,
    pss_kib: u64,
}

fn proc_field(path: &Path, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn mem_of(pids: &[u32]) -> Result<Mem> {
    let mut mem = Mem::default();
    for pid in pids {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        mem.rss_kib += proc_field(&dir.join("status"), "VmRSS:")
            .with_context(|| format!("no VmRSS for pid {pid}"))?;
        mem.pss_kib += proc_field(&dir.join("smaps_rollup"), "Pss:")
            .with_context(|| format!("no Pss for pid {pid}"))?;
    }
    Ok(mem)
}

/// The postmaster of `pg_data` and its children.
fn postgres_pids(pg_data: &Path) -> Result<Vec<u32>> {
    let pidfile = std::fs::read_to_string(pg_data.join("postmaster.pid"))
        .context("cannot read postmaster.pid")?;
    let master: u32 = pidfile
        .lines()
        .next()
        .context("empty postmaster.pid")?
        .trim()
        .parse()?;
    let mut pids = vec![master];
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(master) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

struct Pids {
    kube_apiserver: u32,
    etcd: u32,
    ours: u32,
    pg_data: PathBuf,
    /// Microseconds per clock tick of `/proc/<pid>/stat`.
    tick_us: f64,
}

impl Pids {
    /// CPU used so far by each process group. PostgreSQL's backends are the pool's, which
    /// live as long as the apiserver, so a sum over the living ones loses nothing.
    fn cpu(&self) -> Result<Cpu> {
        let us = |pid: u32| cpu_of(&pid.to_string(), self.tick_us);
        let mut cpu = Cpu::default();
        cpu.0[KUBE_APISERVER] = us(self.kube_apiserver);
        cpu.0[ETCD] = us(self.etcd);
        cpu.0[OURS] = us(self.ours);
        cpu.0[POSTGRES] = postgres_pids(&self.pg_data)?.into_iter().map(us).sum();
        cpu.0[BENCH] = cpu_of("self", self.tick_us);
        Ok(cpu)
    }

    /// (ours + PostgreSQL, kube-apiserver + etcd, ours alone, kube-apiserver alone).
    fn sample(&self) -> Result<[Mem; 4]> {
        let mut ours = vec![self.ours];
        ours.extend(postgres_pids(&self.pg_data)?);
        Ok([
            mem_of(&ours)?,
            mem_of(&[self.kube_apiserver, self.etcd])?,
            mem_of(&[self.ours])?,
            mem_of(&[self.kube_apiserver])?,
        ])
    }
}

// ---------------------------------------------------------------------------------------------
// The table

enum Better {
    Higher,
    Lower,
}

struct Row {
    figure: String,
    unit: &'static str,
    ours: f64,
    crd: f64,
    better: Better,
}

fn print_table(rows: &[Row]) {
    let width = rows
        .iter()
        .map(|r| r.figure.len())
        .max()
        .unwrap_or(10)
        .max(6);
    println!();
    println!(
        "{:<width$}  {:>12}  {:>12}  {:>9}  better",
        "figure", "ours", "CRD", "ours/CRD"
    );
    println!("{}", "-".repeat(width + 50));
    for r in rows {
        let ratio = r.ours / r.crd;
        let better = match r.better {
            Better::Higher if r.ours > r.crd => "ours",
            Better::Lower if r.ours < r.crd => "ours",
            _ if r.ours == r.crd => "=",
            _ => "CRD",
        };
        let fmt = |v: f64| {
            if v.abs() >= 100.0 {
                format!("{v:.0} {}", r.unit)
            } else {
                format!("{v:.2} {}", r.unit)
            }
        };
        println!(
            "{:<width$}  {:>12}  {:>12}  {:>8.2}×  {better}",
            r.figure,
            fmt(r.ours),
            fmt(r.crd),
            ratio
        );
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string().into_bytes();
    let groups: Vec<&str> = digits
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap_or_default())
        .collect();
    groups.join(",")
}

// ---------------------------------------------------------------------------------------------

fn main() -> Result<()> {
    let args = parse_args()?;
    let max_watchers = args.watchers.iter().copied().max().unwrap_or(1);
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-bench-crd-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let cluster = LocalCluster::start(Options {
        dir: dir.clone(),
        apiserver_bin: PathBuf::from(need("MCP_ACCESS_APISERVER_BIN")?),
        database: Database::Local,
        // Every watcher is the admin; ours limits watches per user (kube-apiserver does not).
        apiserver_args: vec![
            format!("--max-watches-per-user={}", max_watchers * 2 + 100),
            format!("--max-requests-inflight={}", max_watchers * 2 + 400),
        ],
        node: false,
    })?;
    let result = bench(&cluster, &args);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn kubectl(cluster: &LocalCluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = cluster.kubectl_as(&cluster.kubeconfig, args, stdin);
    if !out.success {
        bail!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            out.stdout,
            out.stderr
        );
    }
    Ok(out.stdout)
}

fn bench(cluster: &LocalCluster, args: &Args) -> Result<()> {
    let crd = access_session_crd()?;
    let crd_path = cluster.dir.join("accesssessions.bench.crd.json");
    std::fs::write(&crd_path, serde_json::to_string_pretty(&crd)?)?;
    kubectl(
        cluster,
        &["create", "-f", &crd_path.display().to_string()],
        None,
    )
    .context("kube-apiserver refused the CRD made from the AccessSession schema")?;
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/accesssessions.{CRD_GROUP}"),
        ],
        None,
    )?;
    let nonstructural = kubectl(
        cluster,
        &[
            "get",
            &format!("crd/accesssessions.{CRD_GROUP}"),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"NonStructuralSchema\")].message}",
        ],
        None,
    )?;
    if !nonstructural.trim().is_empty() {
        bail!("the CRD schema is not structural: {nonstructural}");
    }
    eprintln!(
        "CRD accesssessions.{CRD_GROUP} established (schema in {})",
        crd_path.display()
    );
    for ns in [NS, WATCH_NS, WARM_NS] {
        kubectl(cluster, &["create", "namespace", ns], None)?;
    }
    let agent = format!(
        "apiVersion: {}\nkind: Agent\nmetadata: {{name: {AGENT}}}\nspec: {{teams: [bench], maxSessionTTL: 8h}}\n",
        apis::API_VERSION
    );
    kubectl(cluster, &["create", "-f", "-"], Some(&agent))?;

    let get = |k: &str| {
        cluster
            .env
            .get(k)
            .with_context(|| format!("{k} missing from the cluster env"))?
            .parse::<u32>()
            .with_context(|| format!("{k} is not a pid"))
    };
    let pids = Pids {
        kube_apiserver: get("KUBE_APISERVER_PID")?,
        etcd: get("ETCD_PID")?,
        ours: cluster
            .apiserver_pid()
            .context("mcp-access-apiserver is not running")?,
        pg_data: cluster.dir.join("pg/data"),
        tick_us: 1e6 / clock_ticks(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (rows, cpu_lines) = rt.block_on(run(cluster, args, &pids))?;
    print_table(&rows);
    print_cpu(&cpu_lines);
    println!();
    println!(
        "ours: access.mcp-runtime.dev through the aggregation proxy; memory of \
         mcp-access-apiserver + every PostgreSQL process (RSS counts PostgreSQL's shared \
         buffers once per process that touched them, PSS shares them out)"
    );
    println!("CRD:  {CRD_GROUP} served by kube-apiserver; memory of kube-apiserver + etcd");
    println!(
        "ours/CRD below 1 is ours faster or smaller for times and memory, above 1 ours faster for rates"
    );
    Ok(())
}

/// The table's rows, and where each create phase's CPU went.
type Measured = (Vec<Row>, Vec<(String, [Cpu; 2])>);

async fn run(cluster: &LocalCluster, args: &Args, pids: &Pids) -> Result<Measured> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let systems = [
        System {
            label: "ours",
            group: apis::GROUP,
        },
        System {
            label: "CRD",
            group: CRD_GROUP,
        },
    ];
    let mut rows = Vec::new();

    // Warm both paths (connections, authorization caches, the CRD's storage) before the
    // memory baseline.
    for system in &systems {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut i = 0;
        while i < 20 {
            match create(&client, system, WARM_NS, &format!("warm-{i}")).await {
                Ok(()) => i += 1,
                // The CRD's path can trail its Established condition briefly.
                Err(e) if Instant::now() < deadline => {
                    eprintln!("  {} not ready yet: {e:#}", system.label);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
        get_timed(&client, &system.collection(WARM_NS)).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut mem: Vec<(usize, [Mem; 4])> = vec![(0, pids.sample()?)];

    let mut have = 0usize;
    let mut cpu_lines = Vec::new();
    for (li, &level) in args.levels.iter().enumerate() {
        eprintln!("level {}: creating", thousands(level));
        // (clients, from, to) of this level's create phases.
        let phases = if li == 0 {
            vec![(1, 0, level / 2), (CLIENTS, level / 2, level)]
        } else {
            vec![(CLIENTS, have, level)]
        };
        for (clients, from, to) in phases {
            let filled = fill(&client, &systems, pids, from, to, clients).await?;
            let phase = format!(
                "{clients} client{}, objects {}-{}",
                if clients == 1 { "" } else { "s" },
                thousands(from),
                thousands(to)
            );
            create_rows(&mut rows, &phase, &filled);
            cpu_lines.push((phase, filled.cpu));
        }
        have = level;
        tokio::time::sleep(Duration::from_secs(2)).await;
        mem.push((level, pids.sample()?));

        eprintln!("level {}: listing", thousands(level));
        let rounds = if level >= 50_000 {
            args.rounds.min(3)
        } else {
            args.rounds
        };
        let n = thousands(level);
        let client_ = &client;
        let [ours, crd] = alternate(&systems, rounds, |s| async move {
            list_full(client_, &s, "", level).await
        })
        .await?;
        rows.push(Row {
            figure: format!("full list of {n} (median of {rounds})"),
            unit: "ms",
            ours,
            crd,
            better: Better::Lower,
        });
        let [ours, crd] = alternate(&systems, rounds, |s| async move {
            list_full(client_, &s, "?resourceVersion=0", level).await
        })
        .await?;
        rows.push(Row {
            figure: format!("full list of {n}, resourceVersion=0"),
            unit: "ms",
            ours,
            crd,
            better: Better::Lower,
        });
        let [ours, crd] = alternate(&systems, rounds, |s| async move {
            list_paged(client_, &s, level).await
        })
        .await?;
        rows.push(Row {
            figure: format!("paged list of {n} (limit 500, all pages)"),
            unit: "ms",
            ours,
            crd,
            better: Better::Lower,
        });

        if li == 0 {
            for &count in &args.watchers {
                eprintln!("watch delivery, {count} watcher(s)");
                let mut stats = [[0.0; 2]; 2];
                for (i, system) in systems.iter().enumerate() {
                    // A failure here is reported and leaves the row empty: the other
                    // figures are still worth the run.
                    match watch_latency(&client, system, count, args.trials, "t").await {
                        Ok(mut ms) => {
                            ms.sort_by(f64::total_cmp);
                            stats[i] = [percentile(&ms, 50.0), percentile(&ms, 99.0)];
                        }
                        Err(e) => {
                            eprintln!(
                                "  {}: watch with {count} watchers failed: {e:#}",
                                system.label
                            );
                            stats[i] = [f64::NAN; 2];
                        }
                    }
                }
                for (p, name) in [(0, "p50"), (1, "p99")] {
                    rows.push(Row {
                        figure: format!(
                            "watch delivery {name}, {count} watcher(s), {} events",
                            args.trials
                        ),
                        unit: "ms",
                        ours: stats[0][p],
                        crd: stats[1][p],
                        better: Better::Lower,
                    });
                }
            }
        }
    }

    // Memory rows: the totals (RSS and PSS), and the RSS of each API server process alone.
    let mib = |kib: u64| kib as f64 / 1024.0;
    for (level, [ours, crd, ours_alone, kube_alone]) in &mem {
        for (what, o, c) in [
            ("RSS", ours.rss_kib, crd.rss_kib),
            ("PSS", ours.pss_kib, crd.pss_kib),
            (
                "RSS, API server alone,",
                ours_alone.rss_kib,
                kube_alone.rss_kib,
            ),
        ] {
            rows.push(Row {
                figure: format!("memory {what} at {} objects", thousands(*level)),
                unit: "MiB",
                ours: mib(o),
                crd: mib(c),
                better: Better::Lower,
            });
        }
    }
    for pair in mem.windows(2) {
        let (from, [o0, c0, oa0, ka0]) = pair[0];
        let (to, [o1, c1, oa1, ka1]) = pair[1];
        let n = (to - from) as f64;
        let delta = |a: u64, b: u64| b as f64 - a as f64;
        for (what, o, c) in [
            (
                "RSS",
                delta(o0.rss_kib, o1.rss_kib),
                delta(c0.rss_kib, c1.rss_kib),
            ),
            (
                "PSS",
                delta(o0.pss_kib, o1.pss_kib),
                delta(c0.pss_kib, c1.pss_kib),
            ),
            (
                "RSS, API server alone,",
                delta(oa0.rss_kib, oa1.rss_kib),
                delta(ka0.rss_kib, ka1.rss_kib),
            ),
        ] {
            rows.push(Row {
                figure: format!(
                    "memory {what} per object, {}-{} objects",
                    thousands(from),
                    thousands(to)
                ),
                unit: "KiB",
                ours: o / n,
                crd: c / n,
                better: Better::Lower,
            });
        }
    }
    Ok((rows, cpu_lines))
}

/// The rows of one create phase: its rate, and the CPU a create cost kube-apiserver and all
/// the server processes together.
fn create_rows(rows: &mut Vec<Row>, phase: &str, filled: &Filled) {
    let [ours, crd] = filled.rates;
    rows.push(Row {
        figure: format!("creates/s, {phase}"),
        unit: "/s",
        ours,
        crd,
        better: Better::Higher,
    });
    let [o, c] = &filled.cpu;
    for (what, ours, crd) in [
        ("kube-apiserver", o.0[KUBE_APISERVER], c.0[KUBE_APISERVER]),
        ("all servers", o.servers(), c.servers()),
    ] {
        rows.push(Row {
            figure: format!("CPU per create, {what} ({phase})"),
            unit: "µs",
            ours,
            crd,
            better: Better::Lower,
        });
    }
}

/// Where a create's CPU went, process by process, phase by phase.
fn print_cpu(lines: &[(String, [Cpu; 2])]) {
    println!();
    println!("CPU per create (µs), during each system's own turns:");
    for (phase, [o, c]) in lines {
        println!(
            "  {phase}: ours: kube-apiserver {:.0}, mcp-access-apiserver {:.0}, PostgreSQL {:.0}, \
             etcd {:.0} (clients {:.0}); CRD: kube-apiserver {:.0}, etcd {:.0} (clients {:.0})",
            o.0[KUBE_APISERVER],
            o.0[OURS],
            o.0[POSTGRES],
            o.0[ETCD],
            o.0[BENCH],
            c.0[KUBE_APISERVER],
            c.0[ETCD],
            c.0[BENCH]
        );
    }
}
