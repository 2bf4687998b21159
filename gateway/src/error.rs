//! Why a session cache cannot start.

use std::path::PathBuf;

/// A configuration the cache refuses: every one of these is a security setting, so none has
/// an insecure fallback.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("sync URL {0:?} is invalid: {1}")]
    InvalidUrl(String, String),
    #[error(
        "sync URL {0:?} must use https: the session feed is authority and must be authenticated"
    )]
    InsecureUrl(String),
    #[error("cannot read the CA file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the CA file {0} holds no PEM certificate")]
    CaEmpty(PathBuf),
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {0} is empty")]
    TokenEmpty(PathBuf),
    #[error("invalid stale window: {0}")]
    StaleWindow(String),
    #[error("invalid lag bound: {0}")]
    MaxLag(String),
    #[error("cannot build the HTTPS client: {0}")]
    Client(#[source] kube::Error),
}
