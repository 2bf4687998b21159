//! Reads: one object, and list pages at a consistent snapshot (with continue tokens) served
//! from `objects` and the change log's before-images.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use apis::selector::{FieldRequirement, LabelSelector};
use apis::strategy::{Facts, Stop, Strategy};
use bytes::Bytes;
use deadpool_postgres::GenericClient;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::coalesce::Coalescer;
use super::error::{pg_err, pool_err};
use super::history::{History, Mark};
use super::tx::{fact_of, run_reads};
use crate::store::error::{Result, StoreError};
use crate::store::port::now;
use crate::store::query::{ListAt, ListQuery, ObjectList};
use crate::store::raw::{self, RawItems, RawList};
use crate::store::rv::{set_resource_version, ContinueToken, ResourceVersion};

/// What reads need of the store: the pool, and the history their heads are checked against.
#[derive(Clone)]
pub(super) struct Reader {
    pub pool: deadpool_postgres::Pool,
    pub history: Arc<History>,
    /// Where lists of the current state gather to share a read.
    pub lists: Arc<Coalescer<FirstRead>>,
}

impl Reader {
    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(pool_err)
    }
}

/// Where the change log stands: its epoch, its head and the horizon after which every change
/// is still in the log.
pub(super) struct Head {
    pub epoch: u32,
    pub seq: u64,
    pub horizon: u64,
}

/// Reads the log's [`Head`].
pub(super) async fn head(client: &impl GenericClient) -> Result<Head> {
    let stmt = client
        .prepare_cached(
            "SELECT epoch, seq, (SELECT min(seq) FROM change_log) FROM sync_state WHERE id = 1",
        )
        .await
        .map_err(pg_err)?;
    let row = client.query_one(&stmt, &[]).await.map_err(pg_err)?;
    let seq = row.get::<_, i64>(1) as u64;
    Ok(Head {
        epoch: row.get::<_, i32>(0) as u32,
        seq,
        horizon: row
            .get::<_, Option<i64>>(2)
            .map(|min| min as u64 - 1)
            .unwrap_or(seq),
    })
}

/// The [`Head`] a list reads at, recorded as handed out; one behind what this process handed
/// out before `mark` means an older copy of the database was put back (503: the tail rotates
/// the epoch, and the list is retried there).
async fn checked_head(store: &Reader, mark: Mark, client: &impl GenericClient) -> Result<Head> {
    let head = head(client).await?;
    let history = &store.history;
    if let Some(reason) = history.went_back(mark, head.epoch, head.seq) {
        return Err(StoreError::Unavailable(reason));
    }
    history.observe(head.epoch, head.seq);
    Ok(head)
}

/// Rows fetched per query while assembling a list page.
const LIST_CHUNK: usize = 1000;

fn decode<K: Strategy>(mut body: Value, rv: ResourceVersion) -> Result<K> {
    set_resource_version(&mut body, rv);
    serde_json::from_value(body)
        .map_err(|e| StoreError::Internal(format!("stored {} is unreadable: {e}", K::KIND)))
}

/// Completes objects as read with the facts their strategy asks for (e.g. an agent's
/// `status.activeSessions`), read on the same snapshot.
async fn complete<K: Strategy>(
    client: &impl GenericClient,
    epoch: u32,
    items: &mut [K],
) -> Result<()> {
    let now = now();
    let reads = K::read_facts(items, now);
    if reads.is_empty() {
        return Ok(());
    }
    let (_, answers) = run_reads(client, None, reads).await?;
    let mut facts = Facts::default();
    let mut rows = Default::default();
    for (read, result) in answers {
        let fact = fact_of(&read, result, epoch, &mut rows)?;
        facts.insert(read, fact);
    }
    K::complete_reads(items, now, &facts).map_err(|stop| match stop {
        Stop::Rejected(r) => r.into(),
        Stop::Need(reads) => {
            StoreError::Internal(format!("a read asked for more facts: {reads:?}"))
        }
    })
}

pub(super) async fn get<K: Strategy>(store: &Reader, namespace: &str, name: &str) -> Result<K> {
    let client = store.client().await?;
    let stmt = client
        .prepare_cached(
            "SELECT s.epoch, o.seq, o.body FROM sync_state s
               LEFT JOIN objects o ON o.resource = $1 AND o.namespace = $2 AND o.name = $3",
        )
        .await
        .map_err(pg_err)?;
    let namespace = if K::NAMESPACED { namespace } else { "" };
    let row = client
        .query_one(&stmt, &[&K::PLURAL, &namespace, &name])
        .await
        .map_err(pg_err)?;
    let epoch = row.get::<_, i32>(0) as u32;
    let Some(seq) = row.get::<_, Option<i64>>(1) else {
        return Err(StoreError::NotFound);
    };
    let mut object = [decode::<K>(
        row.get(2),
        ResourceVersion::new(epoch, seq as u64),
    )?];
    complete(&client, epoch, &mut object).await?;
    let [object] = object;
    Ok(object)
}

/// The snapshot a list reads and where it starts: `(at, after)`.
fn resolve(at: &ListAt, head: &Head) -> Result<(u64, (String, String))> {
    match at {
        ListAt::Latest => Ok((head.seq, (String::new(), String::new()))),
        ListAt::Exact { rv, after } => {
            check_served(*rv, head, |rv| {
                format!(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter (resourceVersion {rv} is no longer served)"
                )
            })?;
            Ok((rv.seq, after.clone().unwrap_or_default()))
        }
    }
}

/// `Expired` unless the state at `rv` can still be read: its epoch is current and the log
/// holds every change after it.
fn check_served(
    rv: ResourceVersion,
    head: &Head,
    message: impl FnOnce(ResourceVersion) -> String,
) -> Result<()> {
    if rv.epoch != head.epoch || rv.seq > head.seq || rv.seq < head.horizon {
        return Err(StoreError::Expired(message(rv)));
    }
    Ok(())
}

/// What the page query returns per row after `namespace, name, seq`.
#[derive(Clone, Copy)]
enum Columns {
    /// The body as jsonb (typed lists).
    Body,
    /// The body as text, and its labels when a label selector needs them (raw lists).
    Text { labels: bool },
}

/// The page query of a list: the rows whose last change is at or before `$2` after the key
/// (`$3`, `$4`), with the before-image of the first change after `$2` of every other key,
/// in key order, at most the last parameter's rows. Field selectors are conditions on the
/// body; the namespace and the field values are bound parameters.
struct PageQuery {
    sql: String,
    resource: &'static str,
    namespace: Option<String>,
    field_values: Vec<String>,
}

impl PageQuery {
    fn new<K: Strategy>(query: &ListQuery, columns: Columns) -> Self {
        let namespace = query.namespace.clone().filter(|_| K::NAMESPACED);
        let mut next_param = 5;
        let mut conditions = String::new();
        if namespace.is_some() {
            let _ = write!(conditions, " AND namespace = ${next_param}");
            next_param += 1;
        }
        let mut body_conditions = Vec::new();
        for req in &query.fields.0 {
            body_conditions.push((req, next_param));
            next_param += 1;
        }
        let limit = next_param;
        // Each branch is ordered and limited on its own, so the objects branch reads no
        // more than a chunk from the primary key (else every chunk would scan and sort
        // every row after its key). The outer query renders only the chunk's rows.
        let mut sql = String::from(
            "SELECT namespace, name, seq, body FROM (
                 (SELECT namespace, name, seq, body FROM objects
                   WHERE resource = $1 AND seq <= $2 AND (resource, namespace, name) > ($1, $3, $4)",
        );
        sql.push_str(&conditions);
        for (req, i) in &body_conditions {
            let _ = write!(sql, " AND {}", field_condition("body", req, *i));
        }
        let _ = write!(
            sql,
            " ORDER BY namespace, name LIMIT ${limit})
             UNION ALL
                 (SELECT namespace, name, prev_seq, before FROM (
                     SELECT DISTINCT ON (namespace, name) namespace, name, prev_seq, before FROM change_log
                      WHERE resource = $1 AND seq > $2 AND (resource, namespace, name) > ($1, $3, $4)"
        );
        sql.push_str(&conditions);
        sql.push_str(" ORDER BY namespace, name, seq) h WHERE before IS NOT NULL");
        for (req, i) in &body_conditions {
            let _ = write!(sql, " AND {}", field_condition("before", req, *i));
        }
        let _ = write!(
            sql,
            " ORDER BY namespace, name LIMIT ${limit})
             ) s ORDER BY namespace, name LIMIT ${limit}"
        );
        let outer = match columns {
            Columns::Body => "namespace, name, seq, body",
            Columns::Text { labels: false } => "namespace, name, seq, body::text",
            Columns::Text { labels: true } => {
                "namespace, name, seq, body::text, body #> '{metadata,labels}'"
            }
        };
        Self {
            sql: format!("SELECT {outer} FROM ({sql}) p ORDER BY namespace, name"),
            resource: K::PLURAL,
            namespace,
            field_values: query.fields.0.iter().map(|r| r.value.clone()).collect(),
        }
    }

    /// At most `limit` rows of the state at sequence `at`, after the key `after`.
    async fn rows(
        &self,
        client: &impl GenericClient,
        at: u64,
        after: &(String, String),
        limit: usize,
    ) -> Result<Vec<Row>> {
        let stmt = client.prepare_cached(&self.sql).await.map_err(pg_err)?;
        let (at, limit) = (at as i64, limit as i64);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&self.resource, &at, &after.0, &after.1];
        if let Some(ns) = &self.namespace {
            params.push(ns);
        }
        for value in &self.field_values {
            params.push(value);
        }
        params.push(&limit);
        client.query(&stmt, &params).await.map_err(pg_err)
    }
}

/// The key of a page row.
fn key_of(row: &Row) -> (String, String) {
    (row.get(0), row.get(1))
}

/// Whether a row's labels satisfy the selector (labels that are not a map of strings are
/// no labels, as everywhere else).
fn labels_match(selector: &LabelSelector, value: Option<Value>) -> bool {
    if selector.is_empty() {
        return true;
    }
    let labels: Option<BTreeMap<String, String>> =
        value.and_then(|l| serde_json::from_value(l).ok());
    selector.matches(labels.as_ref())
}

pub(super) async fn list<K: Strategy>(store: &Reader, query: &ListQuery) -> Result<ObjectList<K>> {
    let mark = store.history.mark();
    let mut client = store.client().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_err)?;
    let head = checked_head(store, mark, &tx).await?;
    let epoch = head.epoch;
    let (at, mut after) = resolve(&query.at, &head)?;
    let rv = ResourceVersion::new(epoch, at);
    let page = PageQuery::new::<K>(query, Columns::Body);
    let want = query.limit.filter(|l| *l > 0);
    let keep = |row: &Row| {
        let body: Value = row.get(3);
        let labels = body.pointer("/metadata/labels").cloned();
        labels_match(&query.labels, labels).then_some(body)
    };
    let filled = fill(&page, &tx, at, &mut after, want, keep, |row, body| {
        let seq = row.get::<_, i64>(2) as u64;
        decode::<K>(body, ResourceVersion::new(epoch, seq))
    })
    .await?;
    let continue_token = filled.more.then(|| continue_token(rv, filled.last));
    let mut objects = filled.items;
    complete(&tx, epoch, &mut objects).await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(ObjectList {
        items: objects,
        resource_version: rv,
        continue_token,
    })
}

/// Rows to ask for next while filling a page of `want` that holds `have`.
fn chunk_size(want: Option<usize>, have: usize) -> usize {
    want.map_or(LIST_CHUNK, |w| (w + 1 - have).max(64))
        .min(LIST_CHUNK * 5)
}

fn continue_token(rv: ResourceVersion, (ns, name): (String, String)) -> String {
    ContinueToken {
        rv: rv.to_string(),
        ns,
        name,
    }
    .encode()
}

/// A page as [`fill`] assembled it.
struct Filled<T> {
    items: Vec<T>,
    /// The key of the last item (where the next page starts).
    last: (String, String),
    /// Rows past the page remain.
    more: bool,
}

/// Assembles a page: rows after `after` in chunks, those the label selector `keep`s (with
/// what it read of them) made items by `item`, until `want` items are held and one more row
/// is kept (`more`; that row is never made an item) or the rows run out. Without `want`,
/// every row. `after` ends at the last row read.
async fn fill<T, P>(
    page: &PageQuery,
    client: &impl GenericClient,
    at: u64,
    after: &mut (String, String),
    want: Option<usize>,
    keep: impl Fn(&Row) -> Option<P>,
    item: impl Fn(&Row, P) -> Result<T>,
) -> Result<Filled<T>> {
    let mut filled = Filled {
        items: Vec::new(),
        last: Default::default(),
        more: false,
    };
    loop {
        let chunk = chunk_size(want, filled.items.len());
        let rows = page.rows(client, at, after, chunk).await?;
        let exhausted = rows.len() < chunk;
        for row in rows {
            *after = key_of(&row);
            let Some(kept) = keep(&row) else {
                continue;
            };
            if want.is_some_and(|w| filled.items.len() == w) {
                filled.more = true;
                return Ok(filled);
            }
            filled.items.push(item(&row, kept)?);
            filled.last = after.clone();
        }
        if exhausted {
            return Ok(filled);
        }
    }
}

/// A list served from the stored text (see `store/raw.rs`). A page (`limit`) is read in
/// one snapshot and held as bytes: its continue token goes before its items. A whole list
/// is streamed: the first chunk is read with the snapshot's head, every later chunk in a
/// short transaction of its own at that snapshot's resourceVersion (served from the change
/// log's before-images, as continue pages are), so a slow reader holds neither a
/// connection nor a snapshot, and memory does not grow with the list. Lists of the current
/// state that arrive together share the first read (`coalesce.rs`).
pub(super) async fn list_raw<K: Strategy>(store: &Reader, query: &ListQuery) -> Result<RawList> {
    if K::COMPLETES_READS {
        return raw::from_typed(list::<K>(store, query).await?);
    }
    let first = if query.at == ListAt::Latest {
        let key = format!(
            "{}\n{:?}\n{:?}\n{:?}\n{:?}",
            K::PLURAL,
            query.namespace,
            query.labels,
            query.fields,
            query.limit
        );
        let (reader, query) = (store.clone(), query.clone());
        store
            .lists
            .read(key, move || async move {
                first_read::<K>(&reader, &query).await
            })
            .await?
    } else {
        first_read::<K>(store, query).await?
    };
    Ok(first.serve::<K>())
}

/// What the first read of a raw list holds: a whole page, or the first chunk of a whole
/// list and where the rest is read from. Cheap to clone (the items are shared).
#[derive(Clone)]
pub(super) struct FirstRead {
    resource_version: ResourceVersion,
    continue_token: Option<String>,
    items: Arc<[Bytes]>,
    rest: Option<Chunks>,
}

impl FirstRead {
    fn serve<K: Strategy>(self) -> RawList {
        let items = self.items;
        let first = stream::iter((0..items.len()).map(move |i| Ok(items[i].clone())));
        RawList {
            resource_version: self.resource_version,
            continue_token: self.continue_token,
            items: match self.rest {
                None => Box::pin(first) as RawItems,
                Some(rest) => Box::pin(first.chain(rest.stream::<K>())),
            },
        }
    }
}

async fn first_read<K: Strategy>(store: &Reader, query: &ListQuery) -> Result<FirstRead> {
    let page = PageQuery::new::<K>(
        query,
        Columns::Text {
            labels: !query.labels.is_empty(),
        },
    );
    let mark = store.history.mark();
    let mut client = store.client().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_err)?;
    let head = checked_head(store, mark, &tx).await?;
    let epoch = head.epoch;
    let (at, mut after) = resolve(&query.at, &head)?;
    let rv = ResourceVersion::new(epoch, at);
    match query.limit.filter(|l| *l > 0) {
        Some(want) => {
            let keep = |row: &Row| raw_labels_match(row, &query.labels).then_some(());
            let filled = fill(&page, &tx, at, &mut after, Some(want), keep, |row, ()| {
                raw_item::<K>(row, epoch)
            })
            .await?;
            tx.commit().await.map_err(pg_err)?;
            Ok(FirstRead {
                resource_version: rv,
                continue_token: filled.more.then(|| continue_token(rv, filled.last)),
                items: filled.items.into(),
                rest: None,
            })
        }
        None => {
            let rows = page.rows(&tx, at, &after, LIST_CHUNK).await?;
            tx.commit().await.map_err(pg_err)?;
            drop(client);
            let exhausted = rows.len() < LIST_CHUNK;
            let items = raw_chunk::<K>(&rows, epoch, &query.labels, &mut after)?;
            Ok(FirstRead {
                resource_version: rv,
                continue_token: None,
                items: items.into(),
                rest: (!exhausted).then(|| Chunks {
                    store: store.clone(),
                    page: Arc::new(page),
                    labels: Arc::new(query.labels.clone()),
                    rv,
                    after,
                }),
            })
        }
    }
}

/// Whether a raw page row's labels (its fifth column, present when a label selector is)
/// satisfy the selector.
fn raw_labels_match(row: &Row, labels: &LabelSelector) -> bool {
    labels.is_empty() || labels_match(labels, row.get::<_, Option<Value>>(4))
}

/// The served JSON of a raw page row.
fn raw_item<K: Strategy>(row: &Row, epoch: u32) -> Result<Bytes> {
    let seq = row.get::<_, i64>(2) as u64;
    raw::served_json::<K>(row.get::<_, &str>(3), ResourceVersion::new(epoch, seq))
}

/// The served JSON of the rows of one chunk that the selector keeps; `after` moves to the
/// last row's key.
fn raw_chunk<K: Strategy>(
    rows: &[Row],
    epoch: u32,
    labels: &LabelSelector,
    after: &mut (String, String),
) -> Result<Vec<Bytes>> {
    let mut items = Vec::with_capacity(rows.len());
    for row in rows {
        if raw_labels_match(row, labels) {
            items.push(raw_item::<K>(row, epoch)?);
        }
    }
    if let Some(row) = rows.last() {
        *after = key_of(row);
    }
    Ok(items)
}

/// The chunks of a streamed list after its first: each read in a transaction of its own at
/// the list's resourceVersion.
#[derive(Clone)]
struct Chunks {
    store: Reader,
    page: Arc<PageQuery>,
    labels: Arc<LabelSelector>,
    rv: ResourceVersion,
    after: (String, String),
}

impl Chunks {
    /// The next chunk's items, or `None` after the last chunk.
    async fn next<K: Strategy>(mut self) -> Result<Option<(Vec<Bytes>, Option<Self>)>> {
        let mut client = self.store.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg_err)?;
        let head = head(&tx).await?;
        check_served(self.rv, &head, |rv| {
            format!(
                "the list's resourceVersion {rv} is no longer served (the change log was trimmed \
                 or the epoch rotated while the list was read); list again"
            )
        })?;
        let rows = self
            .page
            .rows(&tx, self.rv.seq, &self.after, LIST_CHUNK)
            .await?;
        tx.commit().await.map_err(pg_err)?;
        drop(client);
        let exhausted = rows.len() < LIST_CHUNK;
        let items = raw_chunk::<K>(&rows, self.rv.epoch, &self.labels, &mut self.after)?;
        Ok(Some((items, (!exhausted).then_some(self))))
    }

    fn stream<K: Strategy>(self) -> impl futures::Stream<Item = Result<Bytes>> + Send + 'static {
        stream::try_unfold(Some(self), |chunks| async move {
            match chunks {
                None => Ok(None),
                Some(chunks) => chunks.next::<K>().await,
            }
        })
        .map_ok(|items| stream::iter(items.into_iter().map(Ok)))
        .try_flatten()
    }
}

/// The SQL condition for one field requirement. Paths come from `Kind::FIELDS` (static,
/// trusted), values are bound parameters.
fn field_condition(column: &str, req: &FieldRequirement, param: usize) -> String {
    let path = format!("{column} #>> '{{{}}}'", req.path.join(","));
    if req.value.is_empty() || req.negated {
        let op = if req.negated { "<>" } else { "=" };
        format!("COALESCE({path}, '') {op} ${param}")
    } else {
        format!("{path} = ${param}")
    }
}
