//! What the harness reads from the OS about the processes it measures (resident memory, CPU
//! time), the open-files limit it raises before opening thousands of sockets, and the
//! monotonic clock that stamps events across processes.
//!
//! CLOCK_MONOTONIC is one clock for every process on the machine, so an upstream can stamp an
//! event with its send time and a load generator in another process can subtract it from the
//! receive time: on loopback that is the event's whole delay, with no clock skew to correct.
#![allow(unsafe_code)] // see the SAFETY lines

use std::io;
use std::time::Duration;

use crate::Proc;

/// `VmRSS` of `pid` in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `pid` and every live process below it.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        out.push(p);
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// `VmRSS` summed over `pid` and its descendants (an nginx master and its worker), in KiB.
pub fn tree_rss_kib(pid: u32) -> u64 {
    process_tree(pid).into_iter().filter_map(vm_rss_kib).sum()
}

impl Proc {
    /// Resident memory of the process and its live descendants, in KiB.
    pub fn rss_kib(&self) -> u64 {
        tree_rss_kib(self.pid())
    }
}

/// CPU time (user + system) of `pid` and its live descendants.
pub fn tree_cpu(pid: u32) -> Duration {
    crate::process::tree_cpu_time(pid)
}

/// Raise this process's soft limit on open files to its hard limit (children inherit it), and
/// return the new limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard
        // limit needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// Nanoseconds on CLOCK_MONOTONIC: comparable between processes of this machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(vm_rss_kib(me).is_some_and(|k| k > 0));
        // This process's RSS moves while other tests run, so the sums are checked on a child
        // that sits still: the tree holds it, and its tree is itself alone.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let kid = child.id();
        // Until it has exec'd, the child is a copy of this process; wait for `sleep`.
        let comm = || std::fs::read_to_string(format!("/proc/{kid}/comm")).unwrap_or_default();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while comm().trim() != "sleep" {
            assert!(std::time::Instant::now() < deadline, "sleep never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        let tree = process_tree(me);
        assert_eq!(tree[0], me);
        assert!(tree.contains(&kid), "{tree:?} lacks {kid}");
        // Just after exec the loader still maps pages, so the RSS grows for a moment: compare
        // the tree's sum with two reads of the child that agree (the RSS only grows then).
        loop {
            let before = vm_rss_kib(kid).unwrap();
            let tree_rss = tree_rss_kib(kid);
            let after = vm_rss_kib(kid).unwrap();
            if before == after {
                assert!(before > 0);
                assert_eq!(tree_rss, before);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sleep's RSS never settled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(vm_rss_kib(u32::MAX).is_none());
        let limit = raise_nofile_limit().unwrap();
        assert!(limit >= 1024, "{limit}");
        let (a, b) = (mono_ns(), mono_ns());
        assert!(b >= a && a > 0);
    }
}
