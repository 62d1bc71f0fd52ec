//! Pin directories of their own on bpffs, so a test or bench never touches a node's live set
//! (`/sys/fs/bpf/flexinfer`, the proxy's default) and leaves nothing pinned.
//!
//! Unpinning is removing the files: once no process holds a map or link open, removing its
//! last pin frees it, and removing a link's pin detaches its program.

use std::io;
use std::path::{Path, PathBuf};

/// The proxy's default pin directory name under bpffs, which no [`PinDir`] may take.
const LIVE_SET: &str = "flexinfer";

/// The bpffs mount: `/sys/fs/bpf` if it is one (or if nothing is mounted yet: the proxy
/// mounts it there), else the first bpf mount in `/proc/self/mounts`.
pub fn bpffs_root() -> PathBuf {
    let default = PathBuf::from("/sys/fs/bpf");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let bpf = crate::mounts_of(&mounts, "bpf");
    if bpf.is_empty() || bpf.contains(&default) {
        default
    } else {
        bpf[0].clone()
    }
}

/// A unique, not yet created pin directory `<bpffs>/<prefix>-<pid>-<n>`; whatever is pinned
/// under it is removed with it on drop.
pub struct PinDir {
    path: PathBuf,
}

impl PinDir {
    pub fn new(prefix: &str) -> Self {
        let name = crate::unique_name(prefix);
        assert_ne!(name, LIVE_SET);
        Self {
            path: bpffs_root().join(name),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unpin everything under the directory and remove it (nothing to do if it is not there).
    pub fn remove(&self) -> io::Result<()> {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Remove the pin directories named `<prefix>-<pid>-...` whose creating process is gone.
    /// Returns what was removed.
    pub fn remove_stale(prefix: &str) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(bpffs_root()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| crate::owner_gone(&e.file_name().to_string_lossy(), prefix))
            .map(|e| e.path())
            .filter(|p| std::fs::remove_dir_all(p).is_ok())
            .collect()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("could not unpin {}: {e}", self.path.display());
        }
    }
}

/// Why BPF cannot be used here, or `None` if it can.
#[allow(unsafe_code)]
pub fn bpf_missing() -> Option<String> {
    if !crate::is_root() {
        return Some("not running as root".into());
    }
    // A tiny BPF_MAP_CREATE (array, 4-byte key and value, 1 entry) proves the syscall works.
    let mut attr = [0u32; 30];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Some(format!(
            "bpf() syscall unavailable: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: closing the descriptor the kernel just returned to us.
    unsafe { libc::close(fd as i32) };
    if crate::cgroup2_root().is_err() {
        return Some("no cgroup2 mount".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_dirs_are_unique_under_bpffs_and_never_the_live_set() {
        let (a, b) = (
            PinDir::new("flexinfer-support-test"),
            PinDir::new("flexinfer-support-test"),
        );
        assert_ne!(a.path(), b.path());
        assert_eq!(a.path().parent(), Some(bpffs_root().as_path()));
        assert_ne!(a.path().file_name().unwrap(), LIVE_SET);
        assert!(!a.path().exists(), "created by whoever pins, not up front");
        a.remove()
            .expect("removing a dir that is not there is fine");
    }
}
