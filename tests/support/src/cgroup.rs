//! Child cgroups of the cgroup2 root for tests and benchmarks that attach BPF programs (and of
//! any other hierarchy, for benchmarks that set a controller's limits).
//!
//! A sock_ops program on the cgroup2 root would see every TCP connection on the machine, so
//! tests and benches attach to a fresh child cgroup instead and move only their own processes
//! into it (cgroup v2 membership is per process). The cgroup is removed on drop.
#![allow(unsafe_code)] // see the SAFETY lines

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where cgroup2 is mounted, read from `/proc/self/mounts` (never assumed: on a hybrid
/// system it is e.g. `/sys/fs/cgroup/unified`).
pub fn cgroup2_root() -> io::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    crate::mounts_of(&mounts, "cgroup2")
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup2 mount"))
}

/// A child cgroup `<cgroup2 root>/<prefix>-<pid>-<n>`, removed on drop once it is empty.
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn create(prefix: &str) -> io::Result<Self> {
        Self::create_under(&cgroup2_root()?, prefix)
    }

    /// A child cgroup `<root>/<prefix>-<pid>-<n>` of another hierarchy's `root` (a cgroup v1
    /// controller's mount, say), removed on drop once it is empty.
    pub fn create_under(root: &Path, prefix: &str) -> io::Result<Self> {
        let path = root.join(crate::unique_name(prefix));
        std::fs::create_dir(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// PIDs currently in the cgroup.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Move a running process into the cgroup.
    pub fn add_pid(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// Make the process `cmd` starts join the cgroup before it execs, so it never runs (nor
    /// opens a socket) outside it. Spawning fails if joining fails.
    pub fn spawn_inside<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        let procs = CString::new(self.path.join("cgroup.procs").as_os_str().as_bytes())
            .expect("cgroup path without NUL");
        // SAFETY: the hook runs in the forked child before exec and only calls
        // async-signal-safe functions (open, write, close) on memory prepared before fork.
        unsafe {
            cmd.pre_exec(move || {
                // Writing "0" to cgroup.procs moves the writing process itself.
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            })
        }
    }

    /// Remove the child cgroups named `<prefix>-<pid>-...` whose creating process is gone (a
    /// run killed by Ctrl-C never reaches its drop guards). Returns what was removed.
    pub fn remove_stale(prefix: &str) -> Vec<PathBuf> {
        let Ok(root) = cgroup2_root() else {
            return Vec::new();
        };
        Self::remove_stale_under(&root, prefix)
    }

    /// [`Cgroup::remove_stale`] in another hierarchy's `root` (a cgroup v1 controller's mount).
    pub fn remove_stale_under(root: &Path, prefix: &str) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| crate::owner_gone(&e.file_name().to_string_lossy(), prefix))
            .map(|e| e.path())
            .filter(|p| std::fs::remove_dir(p).is_ok())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Members are stopped by their own guards first; retry briefly while they are reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = std::fs::remove_dir(&self.path) {
            if Instant::now() >= deadline {
                eprintln!(
                    "could not remove cgroup {} ({e}); members: {:?}",
                    self.path.display(),
                    self.procs()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with_cgroups() -> bool {
        if !crate::is_root() || cgroup2_root().is_err() {
            crate::skip("needs root and a cgroup2 mount");
            return false;
        }
        true
    }

    #[test]
    fn a_spawned_process_runs_inside_and_the_cgroup_goes_away() {
        if !root_with_cgroups() {
            return;
        }
        let cg = Cgroup::create("flexinfer-support-test").unwrap();
        let path = cg.path().to_path_buf();
        assert!(path.starts_with(cgroup2_root().unwrap()) && path != cgroup2_root().unwrap());
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut child = cg.spawn_inside(&mut cmd).spawn().unwrap();
        assert_eq!(cg.procs(), vec![child.id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        drop(cg);
        assert!(!path.exists());
    }
}
