//! The projected service-account token, read from its file on every request so a rotation on
//! disk (the kubelet rewrites it well before expiry) is used without a restart, and a 401 is
//! retried with whatever the file holds now. The token never reaches a log or a `Debug`.

use std::path::{Path, PathBuf};

use crate::error::CacheError;

/// A token file. `Debug` shows the path only.
#[derive(Clone, Debug)]
pub struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    /// Checks that the file is readable and holds a token: a gateway that starts without
    /// credentials fails loudly instead of denying everything quietly.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let file = Self { path: path.into() };
        file.read()?;
        Ok(file)
    }

    /// Where the token is read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current token, surrounding whitespace removed.
    pub fn read(&self) -> Result<String, CacheError> {
        let raw = std::fs::read_to_string(&self.path).map_err(|source| CacheError::TokenFile {
            path: self.path.clone(),
            source,
        })?;
        let token = raw.trim();
        if token.is_empty() {
            return Err(CacheError::TokenEmpty(self.path.clone()));
        }
        Ok(token.to_string())
    }
}
