//! An equal, fixed share of the machine's CPU for each model server (a CFS quota in a cgroup
//! of its own), as each replica of a real fleet has its own accelerator.
//!
//! Without it, the three single-threaded servers share the machine's two cores, and a router
//! that leaves one server idle hands that server's share to the other two: its wall time then
//! measures the CPU it freed, not its placement (smg put 17, 19 and 0 of 36 requests on the
//! three servers and finished 20% sooner on the same cached share). With a cap, a server's
//! speed is its own, whatever the others do.
//!
//! The cgroup is a child of the `cpu` controller's hierarchy: cgroup v1's `cpu` mount
//! (`cpu.cfs_quota_us`), else a cgroup2 mount that offers `cpu` (`cpu.max`). Removed on drop
//! (by [`Cgroup`]'s own drop).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::Cgroup;

/// CFS period of the quota.
const PERIOD_US: u64 = 100_000;

/// A cgroup whose members together get `share` of one core.
pub(super) struct CpuCap {
    cgroup: Cgroup,
}

impl CpuCap {
    /// A new cgroup named after `prefix` (and this process) capped at `share` cores.
    pub(super) fn create(prefix: &str, share: f64) -> Result<Self> {
        if !(share > 0.0 && share.is_finite()) {
            bail!("a CPU share must be a positive number of cores, not {share}");
        }
        let (root, v2) = cpu_hierarchy()?;
        let cgroup = Cgroup::create_under(&root, prefix)?;
        let cap = CpuCap { cgroup };
        let quota = ((share * PERIOD_US as f64).round() as u64).max(1_000);
        match v2 {
            true => cap.write("cpu.max", &format!("{quota} {PERIOD_US}"))?,
            false => {
                cap.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
                cap.write("cpu.cfs_quota_us", &quota.to_string())?;
            }
        }
        Ok(cap)
    }

    /// Move process `pid` (all its threads, and the ones it starts later) into the cgroup.
    pub(super) fn add(&self, pid: u32) -> Result<()> {
        let path = self.cgroup.path().display();
        self.cgroup
            .add_pid(pid)
            .with_context(|| format!("moving process {pid} into {path}"))
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let p = self.cgroup.path().join(file);
        std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
    }
}

/// The root of a hierarchy with the `cpu` controller: (path, whether it is cgroup2).
fn cpu_hierarchy() -> Result<(PathBuf, bool)> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading mounts")?;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, dir, kind, opts, ..] = f[..] else {
            continue;
        };
        if kind == "cgroup" && opts.split(',').any(|o| o == "cpu") {
            return Ok((PathBuf::from(dir), false));
        }
        if kind == "cgroup2" && offers_cpu(Path::new(dir)) {
            // Children get the controller only once the root hands it down.
            std::fs::write(Path::new(dir).join("cgroup.subtree_control"), "+cpu")
                .with_context(|| format!("enabling cpu under {dir}"))?;
            return Ok((PathBuf::from(dir), true));
        }
    }
    bail!("no cgroup hierarchy with the cpu controller is mounted")
}

fn offers_cpu(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_must_be_a_positive_number_of_cores() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = CpuCap::create("flexinfer-xtask-bad-share", bad)
                .err()
                .unwrap();
            assert!(e.to_string().contains("positive number of cores"), "{e}");
        }
    }

    #[test]
    fn a_capped_process_is_in_a_cgroup_with_its_quota_and_the_cgroup_goes_away() {
        if !flexinfer_test_support::is_root() {
            flexinfer_test_support::skip("needs root to make cgroups");
            return;
        }
        let cap = CpuCap::create("flexinfer-xtask-cap-test", 0.5).unwrap();
        let dir = cap.cgroup.path().to_path_buf();
        let v2 = dir.join("cpu.max").exists();
        let quota = match v2 {
            true => std::fs::read_to_string(dir.join("cpu.max")).unwrap(),
            false => std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap(),
        };
        let want = match v2 {
            true => "50000 100000",
            false => "50000",
        };
        assert_eq!(quota.trim(), want);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        cap.add(child.id()).unwrap();
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l.trim() == child.id().to_string()),
            "{procs}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        drop(cap);
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}
