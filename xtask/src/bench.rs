//! `cargo xtask bench <group>`: named criterion runs with the exact flags docs/benchmarks.md uses.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Bench {
    #[command(subcommand)]
    pub group: Group,
}

#[derive(clap::Subcommand)]
pub enum Group {
    /// Gauge read per pod: mmapped BPF array vs map-lookup syscall vs userspace atomic.
    /// Builds the eBPF object first; needs root for the BPF rows.
    Gauge,
}

pub fn run(args: &Bench) -> Result<()> {
    match args.group {
        Group::Gauge => {
            crate::ebpf::build(&crate::ebpf::BuildEbpf { release: true })?;
            let status = Command::new("cargo")
                .current_dir(crate::ebpf::workspace_root())
                .args(["bench", "-p", "routing-userspace", "--bench", "gauge_read"])
                .status()
                .context("running cargo bench")?;
            if !status.success() {
                bail!("cargo bench failed ({status})");
            }
            Ok(())
        }
    }
}
