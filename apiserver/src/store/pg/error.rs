//! PostgreSQL failures as [`StoreError`]s, and the deadline every database step of a
//! background task runs under.

use std::time::Duration;

use crate::store::error::{Result, StoreError};

/// A database error: retryable ones (timeouts, shutdowns, the network) are `Unavailable`.
pub(crate) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    match e.as_db_error() {
        // A statement, lock or idle-transaction timeout, a cancel, or a server going away:
        // the request may succeed when retried, so 503 with Retry-After, never 500.
        Some(db)
            if [
                SqlState::QUERY_CANCELED,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::TOO_MANY_CONNECTIONS,
                // Only ever the echo of an earlier failure in the same transaction: a
                // statement pipelined after the sync-state lock request (which timed out)
                // can report first. The lock's own error is the cause.
                SqlState::IN_FAILED_SQL_TRANSACTION,
            ]
            .contains(db.code()) =>
        {
            StoreError::Unavailable(format!("{}: {}", db.code().code(), db.message()))
        }
        Some(db) => StoreError::Internal(format!("{}: {}", db.code().code(), db.message())),
        // tokio-postgres names only the step ("error performing TLS handshake"); the cause
        // (e.g. the certificate is not valid for the host name) is its source. Neither
        // carries the DSN or a password.
        None => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            StoreError::Unavailable(message)
        }
    }
}

/// A pool error: waiting, creating or recycling a connection failed.
pub(crate) fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        // Timeouts (wait, create, recycle) and a closed pool: retry later.
        e => StoreError::Unavailable(e.to_string()),
    }
}

/// Runs a database step with a deadline; a missed deadline is `Unavailable`.
pub(crate) async fn timed<T>(
    limit: Duration,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(format!(
            "no answer within {limit:?}"
        )))
    })
}

/// A failure worth retrying later (the database or the network), by its message.
pub(crate) fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}
