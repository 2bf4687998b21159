//! What the controllers' integration tests share.

use std::path::PathBuf;

/// A directory removed when the test ends, pass or fail.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new directory under the system's temporary one, named from `prefix`, the pid and
    /// the time.
    pub fn new(prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fixture directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
