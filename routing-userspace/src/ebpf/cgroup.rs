//! Finding the cgroup2 mount: parsed from /proc/self/mounts, never assumed (it is
//! `/sys/fs/cgroup` on most systems but `/sys/fs/cgroup/unified` on hybrid ones).

use std::path::PathBuf;

use super::EbpfError;

/// The first cgroup2 mount point in a `/proc/self/mounts` text.
pub fn cgroup2_mount_in(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount_path(target)))
    })
}

/// The cgroup2 root of this machine.
pub fn cgroup2_root() -> Result<PathBuf, EbpfError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|source| EbpfError::Io {
        action: "reading",
        path: PathBuf::from("/proc/self/mounts"),
        source,
    })?;
    cgroup2_mount_in(&mounts).ok_or(EbpfError::NoCgroup2)
}

/// /proc/mounts escapes space, tab, newline and backslash as 3-digit octal (`\040`).
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
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
    fn finds_cgroup2_on_a_hybrid_system() {
        let text = "\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
bpf /sys/fs/bpf bpf rw,relatime 0 0
";
        assert_eq!(
            cgroup2_mount_in(text),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn finds_unified_cgroup2_and_unescapes() {
        let text = "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n";
        assert_eq!(
            cgroup2_mount_in(text),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let text = "none /mnt/my\\040cg cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_mount_in(text), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn cgroup_v1_only_is_none() {
        let text = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert_eq!(cgroup2_mount_in(text), None);
    }
}
