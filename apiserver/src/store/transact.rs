//! The one write transaction every kind runs: fill and validate server-owned metadata, take
//! the write lock, load what the kind's [`Strategy`] hooks ask for, and execute the typed
//! [`Plan`] they return — on PostgreSQL ([`super::PgStore`]) or in memory
//! ([`super::MemoryStore`]) alike, through a [`Backend`].

use std::collections::HashSet;
use std::time::Duration;

use apis::strategy::encode;
use apis::strategy::{
    Context, Fact, Facts, ObjectKey, Plan, Read, Rejection, Stop, Strategy, Withdrawal, Write,
};
use apis::validation::FieldError;
use apis::{AccessSession, Enrollment, Kind};
use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rand::Rng;
use serde_json::Value;
use uuid::Uuid;

use super::error::{Result, StoreError};
use super::port::{Preconditions, SessionChanges, SessionEvent, SessionSignals, Store, Written};
use super::query::{ListAt, ListQuery};
use super::rv::ResourceVersion;

/// Hook rounds one write may take before it is declared a bug (each round loads facts the
/// previous one asked for; the kinds here need at most four).
const MAX_ROUNDS: usize = 8;

/// One write transaction of a store: reads facts under its write lock and executes writes.
#[async_trait]
pub trait Backend: Send {
    /// Loads facts. The first call takes the write lock first (in the same round trip).
    async fn read(&mut self, reads: Vec<Read>) -> Result<Vec<(Read, Fact)>>;
    /// Executes writes in order. Returns the resourceVersion each object write got.
    async fn write(&mut self, writes: Vec<Write>) -> Result<Vec<(ObjectKey, ResourceVersion)>>;
    /// Commits; dropping the backend without committing rolls back.
    async fn commit(self) -> Result<()>;
}

/// Where a committed write reports what it did to sessions: the store's [`SessionSignals`],
/// or a holder that passes it on once a shared commit is known (group commit).
pub trait OnCommit: Send + Sync {
    fn committed(&self, changes: SessionChanges);
}

impl OnCommit for SessionSignals {
    fn committed(&self, changes: SessionChanges) {
        SessionSignals::committed(self, changes)
    }
}

/// Runs `decide` until it returns a plan, loading the facts it asks for (`first` with the
/// lock). A refusal ends the transaction with nothing written.
pub async fn transact<K, B: Backend>(
    backend: &mut B,
    first: Vec<Read>,
    decide: impl FnMut(&Facts) -> Result<Plan<K>, Stop> + Send,
) -> Result<Plan<K>> {
    Ok(transact_with_facts(backend, first, decide).await?.0)
}

/// [`transact`], also returning the facts the plan was decided on (the before-images of its
/// writes).
async fn transact_with_facts<K, B: Backend>(
    backend: &mut B,
    first: Vec<Read>,
    mut decide: impl FnMut(&Facts) -> Result<Plan<K>, Stop> + Send,
) -> Result<(Plan<K>, Facts)> {
    let mut facts = Facts::default();
    let mut reads = first;
    for round in 0..MAX_ROUNDS {
        // Each fact once, in the order asked (a withdrawal may ask for the same fence for
        // thousands of sessions).
        let mut seen = HashSet::new();
        let wanted: Vec<Read> = reads
            .into_iter()
            .filter(|r| !facts.contains(r) && seen.insert(r.clone()))
            .collect();
        // The first round always reads: it takes the lock.
        if round == 0 || !wanted.is_empty() {
            for (read, fact) in backend.read(wanted).await? {
                facts.insert(read, fact);
            }
        }
        match decide(&facts) {
            Ok(plan) => return Ok((plan, facts)),
            Err(Stop::Rejected(rejection)) => return Err(rejection.into()),
            Err(Stop::Need(more)) => {
                if more.iter().all(|r| facts.contains(r)) {
                    return Err(StoreError::Internal(format!(
                        "a strategy asked again for facts it was given: {more:?}"
                    )));
                }
                reads = more;
            }
        }
    }
    Err(StoreError::Internal(format!(
        "a write needed more than {MAX_ROUNDS} rounds of reads"
    )))
}

/// Executes a plan (unless `dry_run`) and commits. The answer's `resourceVersion` is that of
/// the last write touching its key; with nothing written it stays as read. After the commit,
/// `signals` hears what the write did to sessions (derived from the plan's writes and the
/// facts it was decided on; `requested` is a created object as the client asked for it).
async fn finish<K: Kind, B: Backend>(
    mut backend: B,
    (mut plan, facts): (Plan<K>, Facts),
    requested: Option<(&ObjectKey, &Value)>,
    dry_run: bool,
    signals: &dyn OnCommit,
) -> Result<Written<K>> {
    if dry_run || plan.writes.is_empty() {
        return Ok(Written {
            object: plan.object,
            warnings: plan.warnings,
        });
    }
    let own = ObjectKey::for_object(&plan.object);
    let writes = std::mem::take(&mut plan.writes);
    let changes = session_changes(&facts, &writes, requested);
    let versions = backend.write(writes).await?;
    if let Some((_, rv)) = versions.iter().rev().find(|(key, _)| *key == own) {
        plan.object.meta_mut().resource_version = Some(rv.to_string());
    }
    backend.commit().await?;
    signals.committed(changes);
    Ok(Written {
        object: plan.object,
        warnings: plan.warnings,
    })
}

/// What `writes` do to sessions: the Events they are worth and the earliest expiry among
/// the sessions written (the expiry scheduler's next wake-up may have to come sooner).
fn session_changes(
    facts: &Facts,
    writes: &[Write],
    requested: Option<(&ObjectKey, &Value)>,
) -> SessionChanges {
    let mut changes = SessionChanges::default();
    for write in writes {
        let (key, body) = match write {
            Write::Create { key, body, .. } | Write::Replace { key, body }
                if key.resource == AccessSession::PLURAL =>
            {
                (key, body)
            }
            _ => continue,
        };
        let Ok(after) = serde_json::from_value::<AccessSession>(body.clone()) else {
            continue;
        };
        if let Some(at) = after.spec.expires_at.as_ref().map(|t| t.0) {
            super::port::fold_earliest(&mut changes.earliest_expiry, at);
        }
        let transition = match write {
            Write::Create { .. } => requested
                .filter(|(k, _)| *k == key)
                .and_then(|(_, v)| serde_json::from_value::<AccessSession>(v.clone()).ok())
                .and_then(|asked| apis::rules::ttl_clamped(&asked.spec, &after.spec)),
            _ => facts
                .stored_session(key)
                .and_then(|before| apis::rules::session_transition(&before, &after)),
        };
        if let Some(transition) = transition {
            changes.events.push(SessionEvent::of(&after, transition));
        }
    }
    changes
}

/// How many sessions one expiry transaction turns `Expired` at most (the sync-state lock is
/// held for it; the sweep runs again at once when a batch was full).
pub const EXPIRY_BATCH: u32 = 500;

/// Turns the sessions due at `now` `Expired` (at most [`EXPIRY_BATCH`]), in one write
/// transaction under the write lock: a second replica sweeping after this one finds nothing
/// due. Returns the sessions expired, as written.
pub(crate) async fn expire_sessions<B: Backend>(
    mut backend: B,
    now: Timestamp,
    signals: &dyn OnCommit,
) -> Result<Vec<AccessSession>> {
    let first = vec![Read::DueSessions {
        at: now,
        limit: EXPIRY_BATCH,
    }];
    let (plan, facts) = transact_with_facts(&mut backend, first, |facts| {
        let mut expired = Vec::new();
        let mut writes = Vec::new();
        for session in facts.due_sessions(now, EXPIRY_BATCH)? {
            let mut session = session.clone();
            if apis::rules::expire_session(&mut session, now) {
                writes.push(Write::put(&session, false)?);
                expired.push(session);
            }
        }
        Ok(Plan {
            object: expired,
            writes,
            warnings: Vec::new(),
        })
    })
    .await?;
    let Plan {
        object: mut expired,
        writes,
        ..
    } = plan;
    if writes.is_empty() {
        // Dropping the backend rolls back: nothing was due.
        return Ok(expired);
    }
    let changes = session_changes(&facts, &writes, None);
    let versions = backend.write(writes).await?;
    backend.commit().await?;
    for session in &mut expired {
        let key = ObjectKey::for_object(session);
        if let Some((_, rv)) = versions.iter().find(|(k, _)| *k == key) {
            session.metadata.resource_version = Some(rv.to_string());
        }
    }
    signals.committed(changes);
    Ok(expired)
}

/// The stored object `key` names, checked against the preconditions of the request.
fn existing<K: Kind>(facts: &Facts, key: &ObjectKey, pre: &Preconditions) -> Result<K, Stop> {
    let Some(current) = facts.object::<K>(&key.namespace, &key.name)? else {
        return Err(Rejection::NotFound.into());
    };
    let meta = current.meta();
    if let Some(uid) = pre.uid.as_deref().filter(|u| !u.is_empty()) {
        let actual = meta.uid.clone().unwrap_or_default();
        if uid != actual {
            return Err(Rejection::UidPrecondition {
                given: uid.to_string(),
                actual,
            }
            .into());
        }
    }
    if let Some(rv) = pre.resource_version.as_deref().filter(|r| !r.is_empty()) {
        if Some(rv) != meta.resource_version.as_deref() {
            return Err(Rejection::Modified.into());
        }
    }
    Ok(current)
}

/// Fills the server-owned metadata of a new object and validates it with its spec.
pub(crate) fn prepare_new<K: Strategy>(object: &mut K, now: Timestamp) -> Result<()> {
    let namespace = namespace_of(object)?;
    init_metadata(object.meta_mut(), &namespace, now);
    let mut errors = apis::rules::validate_metadata(object.meta());
    errors.extend(object.validate_create());
    if !errors.is_empty() {
        return Err(StoreError::Invalid(errors));
    }
    Ok(())
}

/// The namespace of a request's object: required for namespaced kinds, "" otherwise.
fn namespace_of<K: Kind>(object: &K) -> Result<String> {
    match (&object.meta().namespace, K::NAMESPACED) {
        (Some(ns), true) if !ns.is_empty() => Ok(ns.clone()),
        (_, true) => Err(StoreError::Invalid(vec![FieldError::required(
            "metadata.namespace",
            "Required value",
        )])),
        (_, false) => Ok(String::new()),
    }
}

fn init_metadata(meta: &mut ObjectMeta, namespace: &str, now: Timestamp) {
    if meta.name.as_deref().unwrap_or("").is_empty() {
        if let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty()) {
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let mut rng = rand::rng();
            let suffix: String = (0..5)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect();
            meta.name = Some(format!("{prefix}{suffix}"));
        }
    }
    meta.namespace = (!namespace.is_empty()).then(|| namespace.to_string());
    meta.uid = Some(Uuid::new_v4().to_string());
    meta.resource_version = None;
    meta.creation_timestamp = Some(Time(now));
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = Some(1);
    // managedFields are the HTTP layer's record of the request (`apis::managed_fields`).
}

/// What the first round of a create of `object` reads: the object's key and what its
/// strategy asks for.
pub(crate) fn create_reads<K: Strategy>(object: &K, ctx: &Context) -> Vec<Read> {
    let mut first = vec![Read::Object(ObjectKey::for_object(object))];
    first.extend(object.create_reads(ctx));
    first
}

/// Creates `object` (metadata prepared by [`prepare_new`]) as its strategy admits it.
pub(crate) async fn create<K: Strategy, B: Backend>(
    mut backend: B,
    object: K,
    ctx: &Context,
    dry_run: bool,
    signals: &dyn OnCommit,
) -> Result<Written<K>> {
    let first = create_reads(&object, ctx);
    let requested = encode(&object)?;
    let key = ObjectKey::for_object(&object);
    let decided = transact_with_facts(&mut backend, first, |facts| {
        K::admit_create(object.clone(), ctx, facts)
    })
    .await?;
    finish(backend, decided, Some((&key, &requested)), dry_run, signals).await
}

/// Checks what an update can be refused for before anything is read.
pub(crate) fn check_update<K: Strategy>(requested: &K) -> Result<()> {
    namespace_of(requested)?;
    let errors = requested.validate_update();
    if !errors.is_empty() {
        return Err(StoreError::Invalid(errors));
    }
    Ok(())
}

/// Updates through the main resource; the request's uid and resourceVersion are
/// preconditions.
pub(crate) async fn update<K: Strategy, B: Backend>(
    mut backend: B,
    requested: K,
    ctx: &Context,
    dry_run: bool,
    signals: &dyn OnCommit,
) -> Result<Written<K>> {
    let key = ObjectKey::for_object(&requested);
    let pre = Preconditions {
        uid: requested.meta().uid.clone(),
        resource_version: requested.meta().resource_version.clone(),
    };
    let decided = transact_with_facts(&mut backend, vec![Read::Object(key.clone())], |facts| {
        let current = existing::<K>(facts, &key, &pre)?;
        K::admit_update(current, requested.clone(), ctx, facts)
    })
    .await?;
    finish(backend, decided, None, dry_run, signals).await
}

/// Runs `hook` on the stored object `namespace`/`name` (preconditions checked) and returns
/// the object of its plan: the shape of a delete and of a status write.
async fn on_existing<K: Strategy, B: Backend>(
    mut backend: B,
    (namespace, name): (&str, &str),
    pre: &Preconditions,
    dry_run: bool,
    signals: &dyn OnCommit,
    hook: impl Fn(K, &Facts) -> Result<Plan<K>, Stop> + Send + Sync,
) -> Result<K> {
    let key = ObjectKey::of::<K>(namespace, name);
    let decided = transact_with_facts(&mut backend, vec![Read::Object(key.clone())], |facts| {
        hook(existing::<K>(facts, &key, pre)?, facts)
    })
    .await?;
    Ok(finish(backend, decided, None, dry_run, signals)
        .await?
        .object)
}

/// Deletes for `by`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn delete<K: Strategy, B: Backend>(
    backend: B,
    namespace: &str,
    name: &str,
    by: &Withdrawal,
    ctx: &Context,
    pre: &Preconditions,
    dry_run: bool,
    signals: &dyn OnCommit,
) -> Result<K> {
    on_existing(
        backend,
        (namespace, name),
        pre,
        dry_run,
        signals,
        |current, facts| K::admit_delete(current, by, ctx, facts),
    )
    .await
}

/// Writes through the status subresource.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_status<K: Strategy, B: Backend>(
    backend: B,
    namespace: &str,
    name: &str,
    requested: &Value,
    ctx: &Context,
    pre: &Preconditions,
    dry_run: bool,
    signals: &dyn OnCommit,
) -> Result<K> {
    on_existing(
        backend,
        (namespace, name),
        pre,
        dry_run,
        signals,
        |current, facts| K::admit_status(current, requested, ctx, facts),
    )
    .await
}

/// Removes completed enrollments older than `retention` (the server's own retention, not
/// a user's delete). Returns how many.
pub async fn collect_completed_enrollments<S: Store>(
    store: &S,
    retention: Duration,
    now: Timestamp,
) -> Result<usize> {
    let retention =
        SignedDuration::try_from(retention).map_err(|e| StoreError::Internal(e.to_string()))?;
    // Only completed records are candidates; the rule decides which are due.
    let completed =
        apis::selector::FieldSelector::parse("status.phase=Completed", Enrollment::FIELDS)
            .map_err(|e| StoreError::Internal(e.to_string()))?;
    let listed = store
        .list::<Enrollment>(&ListQuery {
            fields: completed,
            at: ListAt::Latest,
            ..ListQuery::default()
        })
        .await?;
    let ctx = Context::new(now, Default::default());
    let mut collected = 0;
    for enrollment in listed.items {
        if !apis::kinds::due_for_collection(&enrollment, now, retention) {
            continue;
        }
        let meta = &enrollment.metadata;
        match store
            .delete::<Enrollment>(
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                &Withdrawal::Retention,
                &ctx,
                &Preconditions {
                    uid: meta.uid.clone(),
                    resource_version: None,
                },
                false,
            )
            .await
        {
            Ok(last) if last.phase() == apis::EnrollmentPhase::Completed => collected += 1,
            Ok(_) | Err(StoreError::NotFound) | Err(StoreError::UidPrecondition { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(collected)
}
