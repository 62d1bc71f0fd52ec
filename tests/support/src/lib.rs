//! What the integration tests (`tests/`) and `cargo xtask bench` both need to run real
//! processes on loopback and clean up after them: child process guards, scratch directories,
//! free ports and readiness waits, child cgroups, bpffs pin directories, models files, the
//! skip markers a test leaves when it cannot run here (read back by `cargo xtask test`), the
//! measuring [`harness`] (statistics, reports, an HTTP/1.1 client with an SSE reader), and an
//! upstream that holds requests and counts them ([`holding`]).
//!
//! One copy, so a fix (a process that outlives its test, a pin left on bpffs) lands in every
//! user at once. Deliberately synchronous std code with no dependency on `routing-userspace`:
//! xtask links it and stays quick to build. Every guard cleans up on drop, also when a test
//! panics or a bench run fails half way.

mod bpffs;
mod cgroup;
mod cpu;
pub mod harness;
pub mod holding;
mod models;
mod net;
mod process;
mod scratch;
mod skip;
pub mod stream;

pub use bpffs::{bpf_missing, bpffs_root, PinDir};
pub use cgroup::{cgroup2_root, Cgroup};
pub use cpu::pin_to_cpu;
pub use harness::http::parse_response;
pub use models::{ModelEntry, ModelsFile, QueueEntry};
pub use net::{
    free_port, http_request, loopback, raw_exchange, wait_http_ok, wait_port, HttpReply,
};
pub use process::Proc;
pub use scratch::TempDir;
pub use skip::{read_markers, running_test, skip, write_marker, Skipped, SKIP_DIR_ENV};

use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this process runs as root (BPF, cgroups and pin dirs need it).
#[allow(unsafe_code)]
pub fn is_root() -> bool {
    // SAFETY: geteuid has no side effects and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `<prefix>-<pid>-<n>`: unique within the machine while this process lives, and the PID tells
/// a later run whether the owner is gone (see [`owner_gone`]).
fn unique_name(prefix: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether `name` was made by [`unique_name`] with `prefix` in a process that no longer runs.
fn owner_gone(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| {
            pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        })
}

/// A path entry per line of `/proc/self/mounts` whose type is `fstype` (octal escapes undone).
fn mounts_of(mounts: &str, fstype: &str) -> Vec<std::path::PathBuf> {
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 2 && f[2] == fstype)
        .map(|f| std::path::PathBuf::from(unescape_mount_path(f[1])))
        .collect()
}

/// /proc/mounts escapes space, tab, newline and backslash as three octal digits (`\040`).
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c));
        if octal {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_carry_this_pid_and_differ() {
        let (a, b) = (unique_name("fx"), unique_name("fx"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("fx-{}-", std::process::id())), "{a}");
        assert!(!owner_gone(&a, "fx"), "our own names are not stale");
    }

    #[test]
    fn owner_gone_needs_the_prefix_and_a_dead_pid() {
        // PIDs are below 2^22 on Linux, so this one never runs.
        assert!(owner_gone("fx-bench-4999999-0", "fx-bench"));
        assert!(!owner_gone("fx-bench-4999999-0", "fx-test"));
        assert!(!owner_gone("fx-bench-x-0", "fx-bench"));
        assert!(!owner_gone("fx-benchy-4999999-0", "fx-bench"));
        assert!(!owner_gone("fx-bench-1-0", "fx-bench"), "PID 1 always runs");
    }

    #[test]
    fn finds_mounts_by_type_and_unescapes() {
        let text = "\
tmpfs /sys/fs/cgroup tmpfs ro 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
bpf /sys/fs/bpf bpf rw 0 0
none /mnt/my\\040bpf bpf rw 0 0
";
        assert_eq!(
            mounts_of(text, "cgroup2"),
            vec![std::path::PathBuf::from("/sys/fs/cgroup/unified")]
        );
        assert_eq!(
            mounts_of(text, "bpf"),
            vec![
                std::path::PathBuf::from("/sys/fs/bpf"),
                std::path::PathBuf::from("/mnt/my bpf")
            ]
        );
        assert!(mounts_of("cgroup /a cgroup rw 0 0\n", "cgroup2").is_empty());
    }
}
