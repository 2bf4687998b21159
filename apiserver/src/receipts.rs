//! Revocation receipts (docs/revocation.md, "Revocation receipts"): which gateway watches a
//! revocation's session changes were written to, reported on the Revocation's status.
//!
//! Two halves, both per replica:
//! - [`Deliveries`], the ledger: every gateway watch on the sync listener registers its
//!   server and how far its stream has been handed to the connection (a resourceVersion,
//!   with the times it got there). The watch advances it as chunks leave, and on events it
//!   skips while nothing of its own is queued; nothing is written anywhere per event.
//! - [`run`], the reporter: it follows the change feed for new revocations and, while any
//!   of them is pending here, reads the ledger every [`ReceiptsConfig::poll`] and writes this
//!   replica's counts into the revocation's status — at most one write per revocation per
//!   [`ReceiptsConfig::min_interval`], a heartbeat every [`ReceiptsConfig::heartbeat`]
//!   while not final, none at all from a replica serving no watch of those servers. The
//!   status sums the replicas' reports ([`apis::kinds::merge_report`]).
//!
//! A watch counts as delivered once its stream has been handed out past the revocation's
//! resourceVersion: the revocation is written last in its transaction, so every session
//! change it made is at or below it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use apis::kinds::DeliveryReport;
use apis::types::{ReplicaDelivery, ServerDelivery};
use apis::Revocation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::store::{
    Context, EventType, ListAt, ListQuery, Preconditions, Requester, ResourceVersion, Store,
    StoreError,
};

/// Times kept per watch of when its stream passed a resourceVersion: enough to date a
/// delivery within the last few chunks; an older crossing is dated by the oldest kept
/// (later than it was, never earlier).
const MARKS: usize = 16;

/// Revocations one replica tracks at once; beyond it the oldest stops being reported.
pub const MAX_PENDING: usize = 1024;

/// The user the reporter writes as.
const REPORTER: &str = "system:mcp-access:revocation-receipts";

/// The gateway watches this replica serves, by server, and how far each has been delivered.
/// Indexed by server: counting a revocation reads only its servers' watches.
#[derive(Default)]
pub struct Deliveries {
    watches: Mutex<HashMap<String, HashMap<u64, Arc<Progress>>>>,
    next: AtomicU64,
}

impl Deliveries {
    /// Registers a watch of `server_uid`'s sessions, delivered through nothing until its
    /// stream says how far its client is. It stays registered until the returned handle is
    /// dropped.
    pub fn register(self: &Arc<Self>, server_uid: &str) -> Tracked {
        let progress = Arc::new(Progress {
            server_uid: server_uid.to_string(),
            marks: Mutex::new(Marks::default()),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.watches)
            .entry(server_uid.to_string())
            .or_default()
            .insert(id, progress.clone());
        Tracked {
            ledger: self.clone(),
            id,
            progress,
        }
    }

    /// Watches registered now.
    pub fn len(&self) -> usize {
        lock(&self.watches).values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This replica's counts for `servers` against `threshold`: per server with at least
    /// one watch here, how many there are, how many are past it and when the last got there.
    pub fn count(&self, servers: &[String], threshold: ResourceVersion) -> Vec<ServerDelivery> {
        let mut counts: BTreeMap<&str, ServerDelivery> = BTreeMap::new();
        for uid in servers {
            let watches: Vec<Arc<Progress>> = match lock(&self.watches).get(uid) {
                Some(watches) => watches.values().cloned().collect(),
                None => continue,
            };
            let entry = counts.entry(uid).or_insert_with(|| ServerDelivery {
                uid: uid.clone(),
                ..ServerDelivery::default()
            });
            for progress in &watches {
                entry.gateways += 1;
                if let Some(at) = progress.passed(threshold) {
                    entry.delivered += 1;
                    if entry.last_delivered_at.as_ref().is_none_or(|t| t.0 < at) {
                        entry.last_delivered_at = Some(MicroTime(at));
                    }
                }
            }
        }
        counts.into_values().collect()
    }
}

/// A registered watch; dropping it removes the watch from the ledger.
pub struct Tracked {
    ledger: Arc<Deliveries>,
    id: u64,
    progress: Arc<Progress>,
}

impl Tracked {
    /// Where the watch's stream reports what it has handed out.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut watches = lock(&self.ledger.watches);
        let server = &self.progress.server_uid;
        if let Some(of_server) = watches.get_mut(server) {
            of_server.remove(&self.id);
            if of_server.is_empty() {
                watches.remove(server);
            }
        }
    }
}

/// How far one watch's stream has been handed to its connection.
pub struct Progress {
    server_uid: String,
    marks: Mutex<Marks>,
}

#[derive(Default)]
struct Marks {
    /// The last resourceVersion handed out.
    at: Option<ResourceVersion>,
    /// When it passed the latest resourceVersions, oldest first.
    recent: VecDeque<(u64, Timestamp)>,
}

impl Progress {
    /// Everything up to `through` has been handed out. Never goes back within an epoch; a
    /// later epoch starts over (its watch is about to end with 410 anyway).
    pub fn advance(&self, through: ResourceVersion) {
        let mut marks = lock(&self.marks);
        match marks.at {
            Some(at) if at.epoch == through.epoch && at.seq >= through.seq => return,
            Some(at) if at.epoch != through.epoch => marks.recent.clear(),
            _ => {}
        }
        marks.at = Some(through);
        if marks.recent.len() == MARKS {
            marks.recent.pop_front();
        }
        marks.recent.push_back((through.seq, Timestamp::now()));
    }

    /// When the stream passed `threshold`, if it has (the earliest time kept at or past it).
    pub fn passed(&self, threshold: ResourceVersion) -> Option<Timestamp> {
        let marks = lock(&self.marks);
        let at = marks.at?;
        if at.epoch != threshold.epoch || at.seq < threshold.seq {
            return None;
        }
        marks
            .recent
            .iter()
            .find(|(seq, _)| *seq >= threshold.seq)
            .map(|(_, t)| *t)
    }
}

/// A poisoned lock only means a panic elsewhere while holding it; the data stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reporter's cadence.
#[derive(Clone, Debug)]
pub struct ReceiptsConfig {
    /// How often the ledger is read while a revocation is pending.
    pub poll: Duration,
    /// The least time between two writes for one revocation.
    pub min_interval: Duration,
    /// The most time between two writes for one revocation that is not final here: what
    /// tells the other replicas this one is still there (apis::kinds::STALE_REPORT).
    pub heartbeat: Duration,
    /// How long a revocation is tracked at most.
    pub window: Duration,
    /// The most reports written per poll, over every pending revocation: what receipts may
    /// add to the write load in a storm of revocations (50 a second at the defaults).
    pub writes_per_poll: usize,
    /// Wait before following the feed again after it failed.
    pub retry: Duration,
}

impl Default for ReceiptsConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_millis(100),
            min_interval: Duration::from_millis(250),
            heartbeat: Duration::from_secs(2),
            window: Duration::from_secs(300),
            writes_per_poll: 5,
            retry: Duration::from_secs(1),
        }
    }
}

/// The reporter's counters.
#[derive(Clone, Debug, Default)]
pub struct ReceiptsMetrics {
    reports: Family<[(&'static str, &'static str); 1], Counter>,
    pending: Gauge,
    watches: Gauge,
}

impl ReceiptsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("mcp_access_apiserver_revocation_receipts");
        sub.register(
            "reports",
            "Delivery reports this replica wrote to revocations, by result (written, failed)",
            metrics.reports.clone(),
        );
        sub.register(
            "pending",
            "Revocations this replica is tracking deliveries of",
            metrics.pending.clone(),
        );
        sub.register(
            "watches",
            "Gateway watches in this replica's delivery ledger",
            metrics.watches.clone(),
        );
        metrics
    }

    fn report(&self, result: &'static str) {
        self.reports.get_or_create(&[("result", result)]).inc();
    }
}

/// This replica's name in the reports: its pod's, or its host's with the process id (two
/// processes on one host are two replicas).
pub fn replica_name() -> String {
    match std::env::var("POD_NAME") {
        Ok(name) if !name.trim().is_empty() => name.trim().to_string(),
        _ => format!("{}-{}", crate::events::instance_name(), std::process::id()),
    }
}

/// One revocation whose deliveries this replica reports.
struct Pending {
    namespace: String,
    name: String,
    threshold: ResourceVersion,
    servers: Vec<String>,
    observed_at: Timestamp,
    since: Instant,
    /// The last report written, and when.
    sent: Option<(Instant, ReplicaDelivery)>,
}

impl Pending {
    /// A revocation with servers to report on, seen by the feed at `observed_at`.
    fn of(revocation: &Revocation, rv: ResourceVersion, observed_at: Timestamp) -> Option<Self> {
        let delivery = revocation.status.as_ref()?.delivery.as_ref()?;
        // Another replica's first report fixed the threshold; the same for everyone.
        let threshold = delivery
            .resource_version
            .as_deref()
            .and_then(|v| ResourceVersion::parse(v).ok())
            .unwrap_or(rv);
        Some(Self {
            namespace: revocation.metadata.namespace.clone().unwrap_or_default(),
            name: revocation.metadata.name.clone()?,
            threshold,
            servers: delivery.servers.iter().map(|s| s.uid.clone()).collect(),
            observed_at,
            since: Instant::now(),
            sent: None,
        })
    }

    /// This replica's report now, if it has anything to say.
    fn report(&self, ledger: &Deliveries, replica: &str) -> Option<ReplicaDelivery> {
        let servers = ledger.count(&self.servers, self.threshold);
        // A replica that serves none of these servers has nothing to say, unless it said
        // something before (its watches left: it now reports none, final).
        if servers.is_empty() && self.sent.is_none() {
            return None;
        }
        Some(ReplicaDelivery {
            name: replica.to_string(),
            reported_at: None,
            r#final: servers.iter().all(|s| s.delivered >= s.gateways),
            observed_at: Some(MicroTime(self.observed_at)),
            servers,
        })
    }
}

/// Follows revocations and reports this replica's deliveries until the process ends.
pub async fn run<S: Store>(
    store: S,
    ledger: Arc<Deliveries>,
    replica: String,
    config: ReceiptsConfig,
    metrics: ReceiptsMetrics,
) {
    loop {
        if let Err(e) = follow(&store, &ledger, &replica, &config, &metrics).await {
            tracing::warn!(error = %e, "revocation receipts: following the feed again");
        }
        tokio::time::sleep(config.retry).await;
    }
}

async fn follow<S: Store>(
    store: &S,
    ledger: &Deliveries,
    replica: &str,
    config: &ReceiptsConfig,
    metrics: &ReceiptsMetrics,
) -> Result<(), StoreError> {
    let listed = store
        .list::<Revocation>(&ListQuery {
            at: ListAt::Latest,
            ..ListQuery::default()
        })
        .await?;
    let window = k8s_openapi::jiff::SignedDuration::try_from(config.window).unwrap_or_default();
    let now = Timestamp::now();
    let mut pending: Vec<Pending> = Vec::new();
    for revocation in &listed.items {
        // Only those recent enough to be in the window still get reports.
        let created = revocation.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if created.is_none_or(|c| now.duration_since(c) > window) {
            continue;
        }
        let rv = revocation
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| ResourceVersion::parse(v).ok())
            .unwrap_or(listed.resource_version);
        // What this replica already reported final needs no second write after a relist.
        let reported_final = revocation
            .status
            .as_ref()
            .and_then(|s| s.delivery.as_ref())
            .is_some_and(|d| d.replicas.iter().any(|r| r.name == replica && r.r#final));
        if reported_final {
            continue;
        }
        if let Some(p) = Pending::of(revocation, rv, created.unwrap_or(now)) {
            pending.push(p);
        }
    }
    let mut feed = store.subscribe(listed.resource_version).await?;
    let mut poll = tokio::time::interval(config.poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        metrics.pending.set(pending.len() as i64);
        metrics.watches.set(ledger.len() as i64);
        tokio::select! {
            event = feed.next() => {
                let event = event?;
                if event.resource != <Revocation as apis::types::Kind>::PLURAL {
                    continue;
                }
                match event.event_type {
                    EventType::Added => {
                        let Ok(revocation) = serde_json::from_value::<Revocation>(event.object.clone()) else {
                            continue;
                        };
                        if let Some(p) = Pending::of(&revocation, event.rv, event.seen_at) {
                            if pending.len() == MAX_PENDING {
                                let oldest = pending
                                    .iter()
                                    .enumerate()
                                    .min_by_key(|(_, p)| p.since)
                                    .map_or(0, |(i, _)| i);
                                let oldest = pending.swap_remove(oldest);
                                tracing::warn!(ns = %oldest.namespace, name = %oldest.name,
                                    "revocation receipts: too many pending; this one is no longer reported");
                            }
                            pending.push(p);
                        }
                    }
                    EventType::Deleted => pending.retain(|p| !(p.namespace == event.namespace && p.name == event.name)),
                    EventType::Modified => {}
                }
            }
            _ = poll.tick(), if !pending.is_empty() => {
                // The longest unreported first: under the write budget, nobody starves.
                pending.sort_by_key(|p| p.sent.as_ref().map(|(at, _)| *at));
                let mut budget = config.writes_per_poll;
                let mut kept = Vec::with_capacity(pending.len());
                for mut p in std::mem::take(&mut pending) {
                    if report_one(store, ledger, replica, config, metrics, &mut p, &mut budget).await {
                        kept.push(p);
                    }
                }
                pending = kept;
            }
        }
    }
}

/// Writes `p`'s report if it is due and `budget` allows; returns whether to keep tracking it.
async fn report_one<S: Store>(
    store: &S,
    ledger: &Deliveries,
    replica: &str,
    config: &ReceiptsConfig,
    metrics: &ReceiptsMetrics,
    p: &mut Pending,
    budget: &mut usize,
) -> bool {
    let in_window = p.since.elapsed() < config.window;
    let Some(report) = p.report(ledger, replica) else {
        return in_window;
    };
    let due = match &p.sent {
        None => true,
        Some((at, sent)) => {
            let changed = *sent != report;
            (changed && at.elapsed() >= config.min_interval)
                || (!report.r#final && at.elapsed() >= config.heartbeat)
        }
    };
    if !due || *budget == 0 {
        return in_window;
    }
    *budget -= 1;
    let mut written = report.clone();
    written.reported_at = Some(MicroTime(Timestamp::now()));
    let body = DeliveryReport {
        resource_version: p.threshold.to_string(),
        replica: written,
    };
    let requested = match serde_json::to_value(&body) {
        Ok(v) => v,
        Err(_) => return false,
    };
    let ctx = Context::new(
        crate::store::now(),
        Requester {
            name: REPORTER.into(),
            uid: String::new(),
        },
    );
    let result = store
        .write_status::<Revocation>(
            &p.namespace,
            &p.name,
            &requested,
            &ctx,
            &Preconditions::default(),
            false,
        )
        .await;
    match result {
        Ok(_) => {
            metrics.report("written");
            let done = report.r#final;
            p.sent = Some((Instant::now(), report));
            in_window && !done
        }
        // Deleted meanwhile: nothing left to report on.
        Err(StoreError::NotFound) => false,
        Err(e) => {
            metrics.report("failed");
            tracing::warn!(ns = %p.namespace, name = %p.name, error = %e,
                "revocation receipts: cannot write a report");
            in_window
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rv(seq: u64) -> ResourceVersion {
        ResourceVersion::new(7, seq)
    }

    fn registered(ledger: &Arc<Deliveries>, server: &str, at: u64) -> Tracked {
        let tracked = ledger.register(server);
        tracked.progress().advance(rv(at));
        tracked
    }

    #[test]
    fn a_watch_counts_once_past_the_threshold() {
        let ledger = Arc::new(Deliveries::default());
        let a = registered(&ledger, "a", 10);
        let _b = registered(&ledger, "a", 10);
        let _c = registered(&ledger, "other", 10);
        let servers = vec!["a".to_string()];
        let counts = ledger.count(&servers, rv(12));
        assert_eq!(
            (counts.len(), counts[0].gateways, counts[0].delivered),
            (1, 2, 0)
        );
        a.progress().advance(rv(11));
        assert_eq!(ledger.count(&servers, rv(12))[0].delivered, 0);
        a.progress().advance(rv(13));
        let counts = ledger.count(&servers, rv(12));
        assert_eq!(counts[0].delivered, 1);
        assert!(counts[0].last_delivered_at.is_some());
        // Never backwards; another epoch is not "past".
        a.progress().advance(rv(5));
        assert_eq!(ledger.count(&servers, rv(12))[0].delivered, 1);
        assert_eq!(
            ledger.count(&servers, ResourceVersion::new(8, 1))[0].delivered,
            0
        );
        drop(a);
        assert_eq!(ledger.count(&servers, rv(12))[0].gateways, 1);
        assert_eq!(ledger.len(), 2);
    }

    #[test]
    fn a_crossing_is_dated_by_the_first_mark_past_it() {
        let ledger = Arc::new(Deliveries::default());
        let w = registered(&ledger, "a", 1);
        let p = w.progress();
        p.advance(rv(5));
        let first = p.passed(rv(5)).expect("passed");
        std::thread::sleep(Duration::from_millis(5));
        p.advance(rv(9));
        assert_eq!(p.passed(rv(3)), Some(first));
        assert!(p.passed(rv(7)).expect("passed") > first);
        assert_eq!(p.passed(rv(10)), None);
        // Past the kept marks: dated by the oldest kept, never earlier than it was.
        for seq in 10..40 {
            p.advance(rv(seq));
        }
        assert!(p.passed(rv(5)).expect("passed") > first);
    }

    /// A store with `n` sessions of server "a", each revoked by a revocation of its own;
    /// returns the pending revocations as the reporter tracks them.
    async fn revoked(store: &crate::store::MemoryStore, n: usize) -> Vec<Pending> {
        use apis::{AccessSession, RevocationTarget, ServerRef};
        let ctx = Context::new(crate::store::now(), Requester::default());
        let mut pending = Vec::new();
        for i in 0..n {
            let mut session = AccessSession::default();
            session.metadata.namespace = Some("ns".into());
            session.metadata.name = Some(format!("s{i}"));
            session.spec.server = ServerRef {
                name: "github".into(),
                uid: "a".into(),
            };
            session.spec.teams = vec!["payments".into()];
            session.spec.expires_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                crate::store::now() + k8s_openapi::jiff::SignedDuration::from_hours(1),
            ));
            store.create(session, &ctx, false).await.expect("session");
            let mut revocation = Revocation::default();
            revocation.metadata.namespace = Some("ns".into());
            revocation.metadata.name = Some(format!("r{i}"));
            revocation.spec.cause = "compromised".into();
            revocation.spec.target = RevocationTarget {
                session: Some(format!("s{i}")),
                ..Default::default()
            };
            let written = store
                .create(revocation, &ctx, false)
                .await
                .expect("revocation");
            let rv = ResourceVersion::parse(
                written.object.metadata.resource_version.as_deref().unwrap(),
            )
            .unwrap();
            pending.push(Pending::of(&written.object, rv, Timestamp::now()).expect("tracked"));
        }
        pending
    }

    #[tokio::test]
    async fn a_storm_of_revocations_is_reported_within_the_write_budget() {
        let store = crate::store::MemoryStore::new();
        let ledger = Arc::new(Deliveries::default());
        let watch = ledger.register("a");
        let mut pending = revoked(&store, 5).await;
        watch
            .progress()
            .advance(store.current_version().await.unwrap());
        let config = ReceiptsConfig::default();
        let metrics = ReceiptsMetrics::default();
        let mut budget = 2;
        for p in &mut pending {
            let keep = report_one(&store, &ledger, "me", &config, &metrics, p, &mut budget).await;
            // Final once written (the one watch has it); still tracked while unwritten.
            assert_eq!(keep, p.sent.is_none());
        }
        assert_eq!(budget, 0);
        let mut reported = Vec::new();
        for i in 0..5 {
            let r: Revocation = store.get("ns", &format!("r{i}")).await.unwrap();
            let delivery = r.status.unwrap().delivery.unwrap();
            reported.push((delivery.gateways, delivery.delivered));
        }
        assert_eq!(reported, [(1, 1), (1, 1), (0, 0), (0, 0), (0, 0)]);
    }

    #[test]
    fn a_replica_serving_none_of_the_servers_reports_nothing() {
        let ledger = Arc::new(Deliveries::default());
        let _w = registered(&ledger, "other", 1);
        let p = Pending {
            namespace: "ns".into(),
            name: "r".into(),
            threshold: rv(2),
            servers: vec!["a".into()],
            observed_at: Timestamp::now(),
            since: Instant::now(),
            sent: None,
        };
        assert!(p.report(&ledger, "me").is_none());
        let w = registered(&ledger, "a", 1);
        let report = p.report(&ledger, "me").expect("a report");
        assert!(!report.r#final);
        w.progress().advance(rv(2));
        assert!(p.report(&ledger, "me").expect("a report").r#final);
    }
}
