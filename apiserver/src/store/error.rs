//! The storage error every store speaks: structural, so the HTTP layer writes the Status
//! text in one place (`http/error.rs`).

use apis::strategy::{Refusal, Rejection};
use apis::validation::{join_errors, FieldError};

/// A storage failure, structurally; the HTTP layer writes the Status text (`http/error.rs`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    /// The name was used by a deleted object and is never reused.
    #[error("already exists: the name was used before and is reserved")]
    NameReserved,
    #[error("Precondition failed: UID in precondition: {given}, UID in object meta: {actual}")]
    UidPrecondition { given: String, actual: String },
    /// The resourceVersion named is not the stored one.
    #[error("the object has been modified")]
    Modified,
    #[error("{}", join_errors(.0))]
    Invalid(Vec<FieldError>),
    /// The kind does not serve this write.
    #[error("{0}")]
    Unsupported(String),
    /// A domain rule refused the write.
    #[error("{0}")]
    Refused(Refusal),
    /// The resourceVersion or continue token is no longer (or not yet) served; relist.
    #[error("{0}")]
    Expired(String),
    /// [`StoreError::Expired`] because the epoch changed: the history itself was reset, not
    /// only the position (410 with the cause `apis::feed::EPOCH_CHANGED_CAUSE`).
    #[error("{0}")]
    EpochChanged(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("internal storage error: {0}")]
    Internal(String),
}

impl From<Rejection> for StoreError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::NotFound => Self::NotFound,
            Rejection::AlreadyExists => Self::AlreadyExists,
            Rejection::NameReserved => Self::NameReserved,
            Rejection::UidPrecondition { given, actual } => Self::UidPrecondition { given, actual },
            Rejection::Modified => Self::Modified,
            Rejection::Invalid(errors) => Self::Invalid(errors),
            Rejection::Unsupported(message) => Self::Unsupported(message),
            Rejection::Refused(refusal) => Self::Refused(refusal),
            Rejection::Unreadable(message) => Self::Internal(message),
        }
    }
}

/// Result alias for storage calls.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
