//! Reads: one object, and list pages at a consistent snapshot (with continue tokens) served
//! from `objects` and the change log's before-images.

use std::fmt::Write as _;

use apis::selector::FieldRequirement;
use apis::strategy::{Facts, Stop, Strategy};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::tx::{fact_of, run_reads};
use super::{pg_err, PgStore};
use crate::store::feed::set_resource_version;
use crate::store::rv::{ContinueToken, ResourceVersion};
use crate::store::{now, ListAt, ListQuery, ObjectList, Result, StoreError};

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

pub(super) async fn get<K: Strategy>(store: &PgStore, namespace: &str, name: &str) -> Result<K> {
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

pub(super) async fn list<K: Strategy>(store: &PgStore, query: &ListQuery) -> Result<ObjectList<K>> {
    let mut client = store.client().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_err)?;
    let Head {
        epoch,
        seq: head_seq,
        horizon,
    } = head(&tx).await?;
    let (at, mut after) = match &query.at {
        ListAt::Latest => (head_seq, (String::new(), String::new())),
        ListAt::Exact { rv, after } => {
            if rv.epoch != epoch || rv.seq > head_seq || rv.seq < horizon {
                return Err(StoreError::Expired(format!(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter (resourceVersion {rv} is no longer served)"
                )));
            }
            (rv.seq, after.clone().unwrap_or_default())
        }
    };
    let rv = ResourceVersion::new(epoch, at);

    let mut sql = String::from(
        "SELECT namespace, name, seq, body FROM (
             SELECT namespace, name, seq, body FROM objects
              WHERE resource = $1 AND seq <= $2 AND (resource, namespace, name) > ($1, $3, $4)",
    );
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![
        Box::new(K::PLURAL),
        Box::new(at as i64),
        Box::new(String::new()),
        Box::new(String::new()),
    ];
    let mut conditions = String::new();
    if let Some(ns) = query.namespace.as_ref().filter(|_| K::NAMESPACED) {
        params.push(Box::new(ns.clone()));
        let _ = write!(conditions, " AND namespace = ${}", params.len());
    }
    let mut body_conditions = Vec::new();
    for req in &query.fields.0 {
        params.push(Box::new(req.value.clone()));
        body_conditions.push((req, params.len()));
    }
    sql.push_str(&conditions);
    for (req, i) in &body_conditions {
        let _ = write!(sql, " AND {}", field_condition("body", req, *i));
    }
    sql.push_str(
        " UNION ALL
             SELECT namespace, name, prev_seq, before FROM (
                 SELECT DISTINCT ON (namespace, name) namespace, name, prev_seq, before FROM change_log
                  WHERE resource = $1 AND seq > $2 AND (resource, namespace, name) > ($1, $3, $4)",
    );
    sql.push_str(&conditions);
    sql.push_str(" ORDER BY namespace, name, seq) h WHERE before IS NOT NULL");
    for (req, i) in &body_conditions {
        let _ = write!(sql, " AND {}", field_condition("before", req, *i));
    }
    params.push(Box::new(0i64));
    let limit_param = params.len();
    let _ = write!(sql, ") s ORDER BY namespace, name LIMIT ${limit_param}");

    let stmt = tx.prepare_cached(&sql).await.map_err(pg_err)?;
    let want = query.limit.filter(|l| *l > 0);
    let mut items = Vec::new();
    let mut more = false;
    loop {
        let chunk = want
            .map_or(LIST_CHUNK, |w| (w + 1 - items.len()).max(64))
            .min(LIST_CHUNK * 5);
        params[2] = Box::new(after.0.clone());
        params[3] = Box::new(after.1.clone());
        params[limit_param - 1] = Box::new(chunk as i64);
        let refs: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = tx.query(&stmt, &refs).await.map_err(pg_err)?;
        let exhausted = rows.len() < chunk;
        for row in rows {
            let (ns, name): (String, String) = (row.get(0), row.get(1));
            let body: Value = row.get(3);
            after = (ns, name);
            let labels = body
                .pointer("/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok());
            if !query.labels.matches(labels.as_ref()) {
                continue;
            }
            if want.is_some_and(|w| items.len() == w) {
                more = true;
                break;
            }
            let seq = row.get::<_, i64>(2) as u64;
            items.push((body, ResourceVersion::new(epoch, seq), after.clone()));
        }
        if more || exhausted {
            break;
        }
    }
    let continue_token = more.then(|| {
        let (ns, name) = items
            .last()
            .map(|(_, _, key)| key.clone())
            .unwrap_or_default();
        ContinueToken {
            rv: rv.to_string(),
            ns,
            name,
        }
        .encode()
    });
    let mut objects = items
        .into_iter()
        .map(|(body, item_rv, _)| decode::<K>(body, item_rv))
        .collect::<Result<Vec<K>>>()?;
    complete(&tx, epoch, &mut objects).await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(ObjectList {
        items: objects,
        resource_version: rv,
        continue_token,
    })
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
