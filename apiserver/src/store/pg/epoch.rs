//! When the epoch changes (docs/storage.md, "Epoch").
//!
//! Every resourceVersion carries the epoch, so a new epoch makes every watcher and continue
//! token relist. The epoch must change when the change history in the database may no longer
//! be the one clients have seen (a restored backup reuses sequence numbers that clients already
//! saw for other changes), and should not change otherwise: replicas restart all the time.
//!
//! `sync_state` records what the epoch was minted on: the cluster's system identifier, the WAL
//! timeline, the database's OID and sync_state's own table OID. A replica compares them with
//! the live database at start and whenever its change feed reconnects, and rotates when any
//! differs, when an operator set `rotate_requested`, or when `--rotate-epoch` asks for it. What
//! these cannot see (a file-level copy of the same cluster put back on the same timeline) is
//! caught by running replicas, which remember how far the history went (`history.rs`).

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::error::pg_err;
use crate::store::error::{Result, StoreError};
use crate::store::rv::EPOCH_LIMIT;

/// The channel every committing transaction and every rotation notifies; the tail LISTENs on
/// it (`tail.rs`).
pub(crate) const CHANNEL: &str = "mcp_access_changes";

/// The live database's identity, as SQL expressions.
const SYSTEM_ID: &str = "(SELECT system_identifier FROM pg_control_system())::text";
const TIMELINE: &str = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int";
const DATABASE: &str = "(SELECT oid FROM pg_database WHERE datname = current_database())";

/// What identifies a database's change history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    pub system_id: Option<String>,
    pub timeline: Option<i32>,
    pub database: Option<u32>,
    pub table: Option<u32>,
}

impl Identity {
    fn complete(&self) -> bool {
        self.system_id.is_some()
            && self.timeline.is_some()
            && self.database.is_some()
            && self.table.is_some()
    }
}

/// The sync-state row with the live database's identity, read in one statement.
#[derive(Clone, Debug)]
pub(super) struct Snapshot {
    pub epoch: u32,
    pub seq: u64,
    /// What the current epoch was minted on.
    pub minted: Identity,
    /// The database as it is now.
    pub live: Identity,
    pub rotate_requested: bool,
}

/// How much an unknown identity counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unknown {
    /// At start: an identity that cannot be compared rotates (the safe default).
    Rotates,
    /// While running: only evidence rotates; the start already rotated for the unknown.
    Ignored,
}

impl Snapshot {
    /// Whether only the WAL timeline differs from what the epoch was minted on: a promoted
    /// standby (or a point-in-time recovery, which the history checks then tell apart).
    pub fn promoted(&self) -> bool {
        let (m, l) = (&self.minted, &self.live);
        !self.rotate_requested
            && m.complete()
            && l.complete()
            && m.system_id == l.system_id
            && m.database == l.database
            && m.table == l.table
            && m.timeline != l.timeline
    }

    /// Why this history cannot be trusted to be the one the epoch was minted on, if it cannot.
    pub fn reset_reason(&self, unknown: Unknown) -> Option<String> {
        if self.rotate_requested {
            return Some(
                "sync_state.rotate_requested is set (the database was marked restored)".into(),
            );
        }
        let (m, l) = (&self.minted, &self.live);
        if let (Some(a), Some(b)) = (&m.system_id, &l.system_id) {
            if a != b {
                return Some(format!(
                    "the database cluster changed (system identifier {a} -> {b}): \
                     a backup restored into another cluster"
                ));
            }
        }
        if let (Some(a), Some(b)) = (m.timeline, l.timeline) {
            if a != b {
                return Some(format!(
                    "the WAL timeline changed ({a} -> {b}): point-in-time recovery or a \
                     promoted standby, which may lack the latest commits"
                ));
            }
        }
        if let (Some(a), Some(b)) = (m.database, l.database) {
            if a != b {
                return Some(format!(
                    "the database changed (OID {a} -> {b}): a dump restored into a fresh database"
                ));
            }
        }
        if let (Some(a), Some(b)) = (m.table, l.table) {
            if a != b {
                return Some(format!(
                    "sync_state was recreated (table OID {a} -> {b}): a dump restored in place"
                ));
            }
        }
        if unknown == Unknown::Rotates && !(m.complete() && l.complete()) {
            return Some(if l.complete() {
                "no identity is recorded for the epoch (written by an older version)".into()
            } else {
                "the database's identity cannot be read (pg_control_system or \
                 pg_current_wal_lsn refused): every start rotates"
                    .into()
            });
        }
        None
    }
}

/// Whether `e` says the identity functions are not available to this role.
fn identity_refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNDEFINED_FUNCTION,
            // pg_current_wal_lsn during recovery (a standby): writes fail there anyway.
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        ]
        .contains(db.code())
    })
}

fn db_err(e: tokio_postgres::Error) -> StoreError {
    pg_err(e)
}

/// Reads the sync-state row and the live identity.
pub(super) async fn read(client: &Client) -> Result<Snapshot> {
    let sql = |system_id: &str, timeline: &str| {
        format!(
            "SELECT epoch, seq, rotate_requested,
                    epoch_system_id, epoch_timeline, epoch_database, epoch_table,
                    {system_id} AS system_id, {timeline} AS timeline, {DATABASE} AS database,
                    tableoid AS table_oid
               FROM sync_state WHERE id = 1"
        )
    };
    let row = match client.query_one(&sql(SYSTEM_ID, TIMELINE), &[]).await {
        Ok(row) => row,
        Err(e) if identity_refused(&e) => {
            tracing::warn!(error = %e, "the database's identity cannot be read");
            client
                .query_one(&sql("NULL::text", "NULL::int"), &[])
                .await
                .map_err(db_err)?
        }
        Err(e) => return Err(db_err(e)),
    };
    Ok(Snapshot {
        epoch: row.get::<_, i32>("epoch") as u32,
        seq: row.get::<_, i64>("seq") as u64,
        rotate_requested: row.get("rotate_requested"),
        minted: Identity {
            system_id: row.get("epoch_system_id"),
            timeline: row.get("epoch_timeline"),
            database: row.get("epoch_database"),
            table: row.get("epoch_table"),
        },
        live: Identity {
            system_id: row.get("system_id"),
            timeline: row.get("timeline"),
            database: row.get("database"),
            table: row.get("table_oid"),
        },
    })
}

/// Replaces epoch `from` with a new random one minted on the live identity, unless the epoch
/// is no longer `from` (another replica rotated first: `None`). Returns the new epoch and the
/// sequence number it starts at, and notifies every replica's feed.
pub(super) async fn rotate(client: &Client, from: u32) -> Result<Option<(u32, u64)>> {
    let sql = |system_id: &str, timeline: &str| {
        format!(
            "UPDATE sync_state
                SET epoch = $1, epoch_seq = seq, rotate_requested = false,
                    epoch_system_id = {system_id}, epoch_timeline = {timeline},
                    epoch_database = {DATABASE}, epoch_table = tableoid
              WHERE id = 1 AND epoch = $2
          RETURNING seq"
        )
    };
    let epoch = loop {
        let e = rand::random_range(1..EPOCH_LIMIT);
        if e != from {
            break e as i32;
        }
    };
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&epoch, &(from as i32)];
    let rows = match client.query(&sql(SYSTEM_ID, TIMELINE), &params).await {
        Ok(rows) => rows,
        Err(e) if identity_refused(&e) => client
            .query(&sql("NULL::text", "NULL::int"), &params)
            .await
            .map_err(db_err)?,
        Err(e) => return Err(db_err(e)),
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    client
        .batch_execute(&format!("NOTIFY {CHANNEL}"))
        .await
        .map_err(db_err)?;
    Ok(Some((epoch as u32, row.get::<_, i64>(0) as u64)))
}

/// Records the live WAL timeline as the one epoch `epoch` was minted on: a failover kept
/// the history (the caller proved it).
pub(super) async fn adopt_timeline(client: &Client, epoch: u32) -> Result<()> {
    client
        .execute(
            &format!(
                "UPDATE sync_state SET epoch_timeline = {TIMELINE} WHERE id = 1 AND epoch = $1"
            ),
            &[&(epoch as i32)],
        )
        .await
        .map_err(db_err)?;
    Ok(())
}

/// At start: keeps the epoch if the database is still the one it was minted on, else (or when
/// `force`) rotates it. Returns the epoch, the head, and why it rotated (if it did).
pub(super) async fn adopt(client: &Client, force: bool) -> Result<(u32, u64, Option<String>)> {
    let mut force = force;
    loop {
        let snapshot = read(client).await?;
        let reason = if force {
            Some("--rotate-epoch was given".to_string())
        } else {
            snapshot.reset_reason(Unknown::Rotates)
        };
        let Some(reason) = reason else {
            return Ok((snapshot.epoch, snapshot.seq, None));
        };
        if let Some((epoch, seq)) = rotate(client, snapshot.epoch).await? {
            return Ok((epoch, seq, Some(reason)));
        }
        // Another replica rotated between the read and the update: that rotation is as new
        // as the one asked for. Judge the database again.
        force = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(system: &str, timeline: i32, database: u32, table: u32) -> Identity {
        Identity {
            system_id: Some(system.into()),
            timeline: Some(timeline),
            database: Some(database),
            table: Some(table),
        }
    }

    fn mk_snapshot(minted: Identity, live: Identity) -> Snapshot {
        Snapshot {
            epoch: 7,
            seq: 10,
            minted,
            live,
            rotate_requested: false,
        }
    }

    #[test]
    fn the_same_database_keeps_its_epoch() {
        let id = identity("1", 1, 5, 9);
        let s = mk_snapshot(id.clone(), id);
        assert_eq!(s.reset_reason(Unknown::Rotates), None);
        assert_eq!(s.reset_reason(Unknown::Ignored), None);
    }

    #[test]
    fn each_part_of_the_identity_rotates() {
        let minted = identity("1", 1, 5, 9);
        for (live, word) in [
            (identity("2", 1, 5, 9), "cluster"),
            (identity("1", 2, 5, 9), "timeline"),
            (identity("1", 1, 6, 9), "fresh database"),
            (identity("1", 1, 5, 10), "recreated"),
        ] {
            let why = mk_snapshot(minted.clone(), live)
                .reset_reason(Unknown::Ignored)
                .unwrap();
            assert!(why.contains(word), "{why}");
        }
    }

    #[test]
    fn only_a_timeline_change_alone_may_be_a_failover() {
        let minted = identity("1", 1, 5, 9);
        assert!(mk_snapshot(minted.clone(), identity("1", 2, 5, 9)).promoted());
        for live in [
            identity("1", 1, 5, 9),
            identity("2", 2, 5, 9),
            identity("1", 2, 6, 9),
            identity("1", 2, 5, 10),
        ] {
            assert!(!mk_snapshot(minted.clone(), live).promoted());
        }
        let mut marked = mk_snapshot(minted, identity("1", 2, 5, 9));
        marked.rotate_requested = true;
        assert!(!marked.promoted(), "the operator's marker always rotates");
    }

    #[test]
    fn the_operator_marker_rotates() {
        let id = identity("1", 1, 5, 9);
        let mut s = mk_snapshot(id.clone(), id);
        s.rotate_requested = true;
        assert!(s.reset_reason(Unknown::Ignored).unwrap().contains("marked"));
    }

    #[test]
    fn an_unknown_identity_rotates_only_at_start() {
        let unknown = Identity {
            system_id: None,
            timeline: None,
            database: None,
            table: None,
        };
        let live = identity("1", 1, 5, 9);
        let s = mk_snapshot(unknown, live.clone());
        assert!(s
            .reset_reason(Unknown::Rotates)
            .unwrap()
            .contains("older version"));
        assert_eq!(s.reset_reason(Unknown::Ignored), None);
        let mut unreadable = live.clone();
        unreadable.system_id = None;
        let s = mk_snapshot(live, unreadable);
        assert!(s
            .reset_reason(Unknown::Rotates)
            .unwrap()
            .contains("cannot be read"));
    }
}
