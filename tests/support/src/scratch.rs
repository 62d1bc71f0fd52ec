//! Scratch directories for configs, logs and data, removed when the guard drops.

use std::io;
use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir (`flexinfer-<tag>-<pid>-<n>`), removed with
/// everything in it on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Panics if the directory cannot be created (scaffolding; see [`TempDir::try_new`]).
    pub fn new(tag: &str) -> Self {
        Self::try_new(tag).unwrap_or_else(|e| panic!("scratch dir for {tag}: {e}"))
    }

    pub fn try_new(tag: &str) -> io::Result<Self> {
        let path = std::env::temp_dir().join(crate::unique_name(&format!("flexinfer-{tag}")));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::TempDir;

    #[test]
    fn distinct_dirs_removed_on_drop() {
        let a = TempDir::new("scratch");
        let b = TempDir::new("scratch");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), "x").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(b.path().is_dir());
    }
}
