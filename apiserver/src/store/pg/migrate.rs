//! Schema migrations from `migrations/`, applied in order under an advisory lock and recorded
//! in `schema_migrations`, so concurrent starts apply each exactly once.

use tokio_postgres::Client;

use crate::store::error::{Result, StoreError};

/// Every migration, in order. Files are never edited once released; add a new one instead.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../../../../migrations/0001_initial.sql"),
    ),
    (
        2,
        "scoped_fences",
        include_str!("../../../../migrations/0002_scoped_fences.sql"),
    ),
    (
        3,
        "session_expiry",
        include_str!("../../../../migrations/0003_session_expiry.sql"),
    ),
    (
        4,
        "epoch_identity",
        include_str!("../../../../migrations/0004_epoch_identity.sql"),
    ),
];

/// Advisory lock key: "mcpacces" in ASCII.
const MIGRATION_LOCK: i64 = 0x6d63_7061_6363_6573;

/// Applies pending migrations. Returns how many were applied by this call.
pub async fn apply_migrations(client: &mut Client) -> Result<usize> {
    let db = |e: tokio_postgres::Error| StoreError::Unavailable(format!("migrations: {e}"));
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?;
    let applied = apply_locked(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db);
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

async fn apply_locked(client: &mut Client) -> Result<usize> {
    let db = |e: tokio_postgres::Error| StoreError::Unavailable(format!("migrations: {e}"));
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer     PRIMARY KEY,
                name       text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await
        .map_err(db)?;
    let done: Vec<i32> = client
        .query("SELECT version FROM schema_migrations", &[])
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut count = 0;
    for (version, name, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        let tx = client.transaction().await.map_err(db)?;
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Internal(format!("migration {version} ({name}) failed: {e}"))
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        tracing::info!(version, name, "applied migration");
        count += 1;
    }
    Ok(count)
}
