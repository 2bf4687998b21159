//! An in-memory implementation of the storage port for handler tests without PostgreSQL. It
//! runs the same generic transaction and kind strategies as [`super::PgStore`]; what the
//! SQL narrows by index it decides with the pure rules directly. Watches are served by the
//! same fan-out PostgreSQL's tail feeds (`fanout.rs`), fed here by each commit as it installs
//! its state; it keeps no change log beyond the fan-out's ring, so a watch resumed before the
//! ring's start is answered 410 Expired, as one before PostgreSQL's retained log is. Lists at
//! an exact resourceVersion (continue tokens) are served from the recent committed states, as
//! PostgreSQL serves them from its log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use apis::locks::Fence;
use apis::rules::{counts_as_active, due_for_expiry, expiry_instant};
use apis::strategy::{Context, Fact, Facts, ObjectKey, Read, Stop, Strategy, Withdrawal, Write};
use apis::{AccessSession, Kind, Revocation};
use async_trait::async_trait;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::error::{Result, StoreError};
use super::fanout::{
    Event, EventRenderings, EventType, Fanout, FanoutLimits, Replay, Subscription,
};
use super::port::{now, Preconditions, SessionSignals, Store, Written};
use super::query::{ListAt, ListQuery, ObjectList};
use super::rv::{set_resource_version, ContinueToken, ResourceVersion};
use super::transact::{self, Backend};

/// The epoch of every resourceVersion the memory store hands out.
const EPOCH: u32 = 1;

/// Committed states kept to serve lists at an exact resourceVersion; older ones are
/// answered 410 Expired, like versions trimmed from PostgreSQL's change log.
const HISTORY: usize = 256;

#[derive(Clone, Debug, Default)]
struct State {
    seq: u64,
    objects: BTreeMap<ObjectKey, (u64, Value)>,
    reserved: BTreeSet<ObjectKey>,
    fences: Vec<Fence>,
}

impl State {
    fn body(&self, key: &ObjectKey) -> Option<Value> {
        self.objects.get(key).map(|(seq, body)| {
            let mut body = body.clone();
            set_resource_version(&mut body, ResourceVersion::new(EPOCH, *seq));
            body
        })
    }

    fn all<K: Kind>(&self) -> impl Iterator<Item = K> + '_ {
        self.objects
            .keys()
            .filter(|k| k.resource == K::PLURAL)
            .filter_map(|k| self.body(k))
            .filter_map(|b| serde_json::from_value(b).ok())
    }

    fn answer(&self, read: &Read) -> Fact {
        match read {
            Read::Object(key) => Fact::Object(self.body(key)),
            Read::NameReserved(key) => Fact::Flag(self.reserved.contains(key)),
            Read::Fenced {
                server_uid,
                namespace,
            } => Fact::Flag(self.fences.iter().any(|f| {
                f.server_uid == *server_uid && (f.cluster_wide || f.namespace == *namespace)
            })),
            Read::Revocations {
                namespace,
                session,
                subject,
                server_uid,
            } => Fact::Revocations(
                self.all::<Revocation>()
                    .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
                    .filter(|r| {
                        let t = &r.spec.target;
                        t.session.as_ref() == Some(session)
                            || (subject.is_some() && t.subject == *subject)
                            || t.server.as_ref().is_some_and(|s| s.uid == *server_uid)
                    })
                    .collect(),
            ),
            Read::Sessions(selector) => Fact::Sessions(
                self.all::<AccessSession>()
                    .filter(|s| {
                        selector.matches(
                            s.metadata.namespace.as_deref().unwrap_or_default(),
                            s.metadata.name.as_deref().unwrap_or_default(),
                            &s.spec,
                        )
                    })
                    .collect(),
            ),
            Read::DueSessions { at, limit } => Fact::Sessions(
                self.all::<AccessSession>()
                    .filter(|s| due_for_expiry(s, *at))
                    .take(*limit as usize)
                    .collect(),
            ),
            Read::PolicySizes { namespace, server } => Fact::Counts(
                apis::tool_policy::policy_sizes(self.all::<apis::ToolPolicy>(), namespace, server),
            ),
            Read::ActiveSessions { agent_uids, at } => {
                let mut counts = std::collections::HashMap::new();
                for session in self.all::<AccessSession>() {
                    let Some(uid) = session.spec.agent.as_ref().and_then(|a| a.uid.clone()) else {
                        continue;
                    };
                    if agent_uids.contains(&uid) && counts_as_active(&session, *at) {
                        *counts.entry(uid).or_insert(0) += 1;
                    }
                }
                Fact::Counts(counts)
            }
        }
    }
}

/// The current state and the recent committed ones, by their sequence number.
#[derive(Default)]
struct Shared {
    current: State,
    history: BTreeMap<u64, Arc<State>>,
}

impl Shared {
    /// The state a list at `rv` reads: the last one committed at or before it, while kept.
    fn at(&self, rv: &ResourceVersion) -> Option<&State> {
        if rv.epoch != EPOCH || rv.seq > self.current.seq {
            return None;
        }
        if rv.seq == self.current.seq {
            return Some(&self.current);
        }
        let oldest = *self.history.keys().next()?;
        if rv.seq < oldest {
            return None;
        }
        self.history
            .range(..=rv.seq)
            .next_back()
            .map(|(_, state)| state.as_ref())
    }
}

/// Events kept in the fan-out's ring by [`MemoryStore::new`], and queued per watcher.
const RING: usize = 1024;
const WATCHER_BUFFER: usize = 1024;

/// The in-memory store. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<Shared>>,
    signals: Arc<SessionSignals>,
    /// Serves watches; every commit publishes its events here, in commit order.
    fanout: Arc<Fanout>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_watch_limits(RING, WATCHER_BUFFER)
    }
}

/// The memory store's replay: it keeps no log beyond the fan-out's ring, so there is never
/// anything to replay (a subscription behind the ring is expired).
struct NoLog;

#[async_trait]
impl Replay for NoLog {
    async fn read_after(&self, _epoch: u32, _after: u64) -> Result<Vec<Arc<Event>>> {
        Ok(Vec::new())
    }

    fn nudge(&self) {}
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store whose watch fan-out keeps `ring` recent events (a watch may resume from any of
    /// them, older ones are 410) and queues `watcher_buffer` events per watcher (a watcher
    /// that falls further behind is cut off with 410).
    pub fn with_watch_limits(ring: usize, watcher_buffer: usize) -> Self {
        let limits = FanoutLimits {
            buffer: watcher_buffer,
            ring_capacity: ring,
            ring_bytes: usize::MAX,
            epoch_wait: std::time::Duration::ZERO,
        };
        Self {
            state: Arc::default(),
            signals: Arc::default(),
            fanout: Fanout::new(EPOCH, 0, limits, None, Arc::new(NoLog)),
        }
    }

    /// Number of live watch subscribers.
    pub fn live_subscribers(&self) -> usize {
        self.fanout.subscriber_count()
    }

    async fn begin(&self) -> MemoryTx {
        let guard = self.state.clone().lock_owned().await;
        let staged = guard.current.clone();
        MemoryTx {
            guard,
            staged,
            events: Vec::new(),
            fanout: self.fanout.clone(),
        }
    }
}

/// A transaction: holds the state's lock and works on a copy, installed on commit with the
/// events of its writes.
struct MemoryTx {
    guard: OwnedMutexGuard<Shared>,
    staged: State,
    /// The change events of the writes so far, in sequence order.
    events: Vec<Event>,
    fanout: Arc<Fanout>,
}

/// The change event of a write at `seq`: `object` after it (for DELETED, the last state),
/// `before` the state it replaced.
fn change(
    seq: u64,
    event_type: EventType,
    key: &ObjectKey,
    object: &Value,
    before: Option<&Value>,
) -> Event {
    let rv = ResourceVersion::new(EPOCH, seq);
    let mut object = object.clone();
    set_resource_version(&mut object, rv);
    let encoded = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
    Event {
        rv,
        event_type,
        resource: key.resource.to_string(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        size: encoded(&object) + before.map_or(0, encoded),
        object,
        before: before.cloned(),
        rendered: EventRenderings::default(),
        seen_at: k8s_openapi::jiff::Timestamp::now(),
    }
}

#[async_trait]
impl Backend for MemoryTx {
    async fn read(&mut self, reads: Vec<Read>) -> Result<Vec<(Read, Fact)>> {
        Ok(reads
            .into_iter()
            .map(|r| {
                let fact = self.staged.answer(&r);
                (r, fact)
            })
            .collect())
    }

    async fn write(&mut self, writes: Vec<Write>) -> Result<Vec<(ObjectKey, ResourceVersion)>> {
        let s = &mut self.staged;
        let mut versions = Vec::new();
        for write in writes {
            match write {
                Write::Create { key, body, .. } => {
                    if s.objects.contains_key(&key) {
                        return Err(StoreError::Internal(format!("{key:?} exists")));
                    }
                    s.seq += 1;
                    self.events
                        .push(change(s.seq, EventType::Added, &key, &body, None));
                    s.objects.insert(key.clone(), (s.seq, body));
                    versions.push((key, ResourceVersion::new(EPOCH, s.seq)));
                }
                Write::Replace { key, body } => {
                    s.seq += 1;
                    let seq = s.seq;
                    match s.objects.get_mut(&key) {
                        Some(slot) => {
                            self.events.push(change(
                                seq,
                                EventType::Modified,
                                &key,
                                &body,
                                Some(&slot.1),
                            ));
                            *slot = (seq, body);
                        }
                        None => return Err(StoreError::Internal(format!("{key:?} is gone"))),
                    }
                    versions.push((key, ResourceVersion::new(EPOCH, seq)));
                }
                Write::Remove { key } => {
                    s.seq += 1;
                    let Some((_, last)) = s.objects.remove(&key) else {
                        return Err(StoreError::Internal(format!("{key:?} is gone")));
                    };
                    self.events
                        .push(change(s.seq, EventType::Deleted, &key, &last, Some(&last)));
                    versions.push((key, ResourceVersion::new(EPOCH, s.seq)));
                }
                Write::ReserveName { key, .. } => {
                    s.reserved.insert(key);
                }
                Write::Fence { fence, .. } => {
                    match s.fences.iter_mut().find(|f| {
                        f.server_uid == fence.server_uid && f.namespace == fence.namespace
                    }) {
                        Some(f) => f.cluster_wide |= fence.cluster_wide,
                        None => s.fences.push(fence),
                    }
                }
            }
        }
        Ok(versions)
    }

    async fn commit(mut self) -> Result<()> {
        let shared = &mut *self.guard;
        if self.staged.seq != shared.current.seq {
            shared
                .history
                .insert(self.staged.seq, Arc::new(self.staged.clone()));
            while shared.history.len() > HISTORY {
                shared.history.pop_first();
            }
        }
        shared.current = self.staged;
        // Published while the state's lock is held: watchers see commits in their order.
        for event in self.events {
            self.fanout.publish(Arc::new(event));
        }
        Ok(())
    }
}

fn decode<K: Kind>(body: Value) -> Result<K> {
    serde_json::from_value(body)
        .map_err(|e| StoreError::Internal(format!("stored {} is unreadable: {e}", K::KIND)))
}

/// Completes objects as read from the facts their strategy asks for.
fn complete<K: Strategy>(state: &State, items: &mut [K]) -> Result<()> {
    let now = now();
    let mut facts = Facts::default();
    for read in K::read_facts(items, now) {
        let fact = state.answer(&read);
        facts.insert(read, fact);
    }
    K::complete_reads(items, now, &facts).map_err(|stop| match stop {
        Stop::Rejected(r) => r.into(),
        Stop::Need(reads) => {
            StoreError::Internal(format!("a read asked for more facts: {reads:?}"))
        }
    })
}

#[async_trait]
impl Store for MemoryStore {
    async fn get<K: Strategy>(&self, namespace: &str, name: &str) -> Result<K> {
        let shared = self.state.lock().await;
        let state = &shared.current;
        let body = state
            .body(&ObjectKey::of::<K>(namespace, name))
            .ok_or(StoreError::NotFound)?;
        let mut items = [decode::<K>(body)?];
        complete(state, &mut items)?;
        let [object] = items;
        Ok(object)
    }

    async fn list<K: Strategy>(&self, query: &ListQuery) -> Result<ObjectList<K>> {
        let shared = self.state.lock().await;
        let (state, after) = match &query.at {
            ListAt::Latest => (&shared.current, None),
            ListAt::Exact { rv, after } => match shared.at(rv) {
                Some(state) => (state, after.clone()),
                None => {
                    return Err(StoreError::Expired(format!(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter (resourceVersion {rv} is no longer served)"
                    )))
                }
            },
        };
        let want = query.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut more = false;
        for key in state.objects.keys().filter(|k| k.resource == K::PLURAL) {
            if K::NAMESPACED
                && query
                    .namespace
                    .as_ref()
                    .is_some_and(|ns| *ns != key.namespace)
            {
                continue;
            }
            if after
                .as_ref()
                .is_some_and(|(ns, name)| (&key.namespace, &key.name) <= (ns, name))
            {
                continue;
            }
            let Some(body) = state.body(key) else {
                continue;
            };
            let labels = body
                .pointer("/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok());
            if !query.labels.matches(labels.as_ref()) || !query.fields.matches(&body) {
                continue;
            }
            if want.is_some_and(|w| items.len() == w) {
                more = true;
                break;
            }
            items.push((key.clone(), decode::<K>(body)?));
        }
        // Every page of one list carries the version it reads at.
        let rv = match &query.at {
            ListAt::Exact { rv, .. } => *rv,
            ListAt::Latest => ResourceVersion::new(EPOCH, state.seq),
        };
        let continue_token = more.then(|| {
            let key = items.last().map(|(k, _)| k.clone());
            ContinueToken {
                rv: rv.to_string(),
                ns: key
                    .as_ref()
                    .map(|k| k.namespace.clone())
                    .unwrap_or_default(),
                name: key.map(|k| k.name).unwrap_or_default(),
            }
            .encode()
        });
        let mut objects: Vec<K> = items.into_iter().map(|(_, o)| o).collect();
        // Computed fields are read now, as PostgreSQL reads them on its current rows.
        complete(&shared.current, &mut objects)?;
        Ok(ObjectList {
            items: objects,
            resource_version: rv,
            continue_token,
        })
    }

    async fn create<K: Strategy>(
        &self,
        mut object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>> {
        transact::prepare_new(&mut object, ctx.now)?;
        transact::create(self.begin().await, object, ctx, dry_run, &*self.signals).await
    }

    async fn update<K: Strategy>(
        &self,
        object: K,
        ctx: &Context,
        dry_run: bool,
    ) -> Result<Written<K>> {
        transact::check_update(&object)?;
        transact::update(self.begin().await, object, ctx, dry_run, &*self.signals).await
    }

    async fn delete<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        by: &Withdrawal,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        let tx = self.begin().await;
        transact::delete(
            tx,
            namespace,
            name,
            by,
            ctx,
            preconditions,
            dry_run,
            &*self.signals,
        )
        .await
    }

    async fn write_status<K: Strategy>(
        &self,
        namespace: &str,
        name: &str,
        requested: &Value,
        ctx: &Context,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        let tx = self.begin().await;
        transact::write_status(
            tx,
            namespace,
            name,
            requested,
            ctx,
            preconditions,
            dry_run,
            &*self.signals,
        )
        .await
    }

    async fn expire_sessions(&self, now: Timestamp) -> Result<Vec<AccessSession>> {
        transact::expire_sessions(self.begin().await, now, &*self.signals).await
    }

    async fn next_session_expiry(&self) -> Result<Option<Timestamp>> {
        let shared = self.state.lock().await;
        Ok(shared
            .current
            .all::<AccessSession>()
            .filter_map(|s| expiry_instant(&s))
            .min())
    }

    fn session_signals(&self) -> Arc<SessionSignals> {
        self.signals.clone()
    }

    async fn server_fenced(&self, server_uid: &str, namespace: &str) -> Result<bool> {
        let shared = self.state.lock().await;
        Ok(matches!(
            shared.current.answer(&Read::Fenced {
                server_uid: server_uid.to_string(),
                namespace: namespace.to_string(),
            }),
            Fact::Flag(true)
        ))
    }

    async fn current_version(&self) -> Result<ResourceVersion> {
        Ok(ResourceVersion::new(
            EPOCH,
            self.state.lock().await.current.seq,
        ))
    }

    async fn subscribe(&self, from: ResourceVersion) -> Result<Subscription> {
        // Checked as PostgreSQL's store checks it, the ring standing for the retained log.
        let (epoch, head) = self.fanout.position();
        if from.epoch != epoch {
            return Err(StoreError::EpochChanged(format!(
                "too old resource version: {from}: the change history was reset (the epoch \
                 changed: a restored database or an operator's --rotate-epoch); relist"
            )));
        }
        if from.seq > head {
            return Err(StoreError::Expired(format!(
                "too old resource version: {from} is ahead of the current state ({}); relist",
                ResourceVersion::new(epoch, head)
            )));
        }
        let horizon = self.fanout.horizon();
        if from.seq < horizon {
            return Err(StoreError::Expired(format!(
                "too old resource version: {from} ({})",
                ResourceVersion::new(epoch, horizon)
            )));
        }
        self.fanout.subscription(from)
    }
}
