//! Proxies starting together on a node without bpffs mount it once, not once each.
//!
//! Reproduces what a fresh CI machine did: several processes found no bpffs at the same
//! moment and each mounted one, stacking mounts (and pin directories made on the lower mount
//! vanished from view). Here sixteen threads, each with its own open of the mount point (an
//! flock is per open file, so they contend exactly as processes do), race to mount bpffs on a
//! fresh directory; exactly one may mount and the directory must carry exactly one bpf mount.
//! Root only; fails instead of skipping under FLEXINFER_REQUIRE_EBPF.
#![allow(unsafe_code)] // see the SAFETY lines

use std::path::Path;
use std::sync::{Arc, Barrier};

use flexinfer_tests::ebpf::bpf_or_skip;
use flexinfer_tests::TempDir;
use routing_userspace::ebpf::sys;

/// bpf mounts whose mount point is `dir`, from /proc/self/mountinfo.
fn bpf_mounts_at(dir: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = dir.to_str().expect("utf-8 path");
    info.lines()
        .filter(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let fstype = l
                .split(" - ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next());
            fields.get(4) == Some(&dir) && fstype == Some("bpf")
        })
        .count()
}

fn unmount_all(dir: &Path) {
    let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: umount2 on a path we mounted; a NUL-terminated string valid for the call.
    while bpf_mounts_at(dir) > 0 && unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {}
}

#[test]
fn concurrent_starts_mount_bpffs_exactly_once() {
    if !bpf_or_skip() {
        return;
    }
    for round in 0..5 {
        let dir = TempDir::new(&format!("bpffs-race-{round}"));
        let mount_point = dir.path().to_path_buf();
        assert_eq!(bpf_mounts_at(&mount_point), 0);
        let start = Arc::new(Barrier::new(16));
        let racers: Vec<_> = (0..16)
            .map(|_| {
                let (start, path) = (start.clone(), mount_point.clone());
                std::thread::spawn(move || {
                    start.wait();
                    sys::mount_bpffs_once(&path)
                })
            })
            .collect();
        let results: Vec<_> = racers
            .into_iter()
            .map(|t| t.join().expect("racer thread"))
            .collect();
        let mounts = bpf_mounts_at(&mount_point);
        let mounted_here = results.iter().filter(|r| matches!(r, Ok(true))).count();
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        unmount_all(&mount_point);
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        assert_eq!(mounts, 1, "round {round}: bpffs mounted {mounts} times");
        assert_eq!(
            mounted_here, 1,
            "round {round}: {mounted_here} callers mounted"
        );
        assert!(
            sys::is_bpffs(&mount_point).is_ok_and(|b| !b),
            "unmounted again"
        );
    }
}
