//! `cargo xtask pgo`: a profile-guided `flexinfer-proxy`.
//!
//! Why: the request path is bound by instruction fetch (callgrind's cache model: about 2,500
//! instruction-cache misses a short request, over every layer), and a profile lets LLVM lay the
//! hot paths out together and keep the cold ones (errors, retries, startup) out of their way.
//! On the shared-core bench it took short requests from about 0.97x haproxy's rate (LTO alone)
//! to 1.01x (docs/benchmarks.md).
//!
//! Three steps, each in a target directory of its own under `<target>/pgo/` so the workspace's
//! release build stays as it is: an instrumented build; training, which is the proxy rows of
//! the overhead bench (every case, with and without tracing, the eBPF gauge too where BPF works) and
//! of the stream bench (paced and bulk SSE relay) run against the instrumented binary; then
//! the build that uses the merged profile. The training is the benches themselves, so the
//! profile covers what they measure and what a node serves: short JSON answers, the four
//! routings, tracing, streamed answers.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::bench::overhead::OverheadBench;
use crate::bench::stream::{StreamBench, PACED_STREAMS};
use crate::ebpf::{self, target_dir, workspace_root};
use flexinfer_test_support::harness::os::raise_nofile_limit;

#[derive(clap::Args)]
pub(crate) struct Pgo {
    /// Measured seconds of each training run (longer adds little: the profile counts
    /// branches, and a few seconds of each path already weigh them).
    #[arg(long, default_value_t = TRAIN_SECONDS)]
    pub train_seconds: u32,
}

const TRAIN_SECONDS: u32 = 3;

impl Default for Pgo {
    fn default() -> Self {
        Self {
            train_seconds: TRAIN_SECONDS,
        }
    }
}

/// Where the profile-guided binary goes.
pub(crate) fn output() -> PathBuf {
    target_dir().join("pgo").join("flexinfer-proxy")
}

pub(crate) fn run(args: &Pgo) -> Result<PathBuf> {
    let dir = target_dir().join("pgo");
    let profdata = llvm_profdata()?;
    // Every build embeds the object, as the release build does; only the training's eBPF row
    // needs BPF to work here.
    ebpf::build()?;
    let raw = dir.join("raw");
    xtask::paths::fresh_dir(&raw)?;
    println!("pgo: 1/3 the instrumented build");
    let instrumented = build(
        &dir.join("instrumented"),
        &format!("-Cprofile-generate={}", raw.display()),
    )?;
    println!("pgo: 2/3 training on the benches' proxy rows");
    train(&instrumented, args.train_seconds)?;
    let merged = dir.join("merged.profdata");
    let status = Command::new(&profdata)
        .arg("merge")
        .arg("-o")
        .arg(&merged)
        .arg(&raw)
        .status()
        .with_context(|| format!("running {}", profdata.display()))?;
    if !status.success() {
        bail!("llvm-profdata merge failed ({status})");
    }
    println!("pgo: 3/3 the build that uses {}", merged.display());
    let optimized = build(
        &dir.join("optimized"),
        &format!("-Cprofile-use={}", merged.display()),
    )?;
    let out = output();
    std::fs::copy(&optimized, &out)
        .with_context(|| format!("copying {} to {}", optimized.display(), out.display()))?;
    println!("pgo: {}", out.display());
    Ok(out)
}

/// `cargo build --release` of the proxy into `target`, with `rustflags`, embedding the eBPF
/// object the workspace's build wrote (if any).
fn build(target: &Path, rustflags: &str) -> Result<PathBuf> {
    let object = ebpf::object_path();
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .args(["build", "--release", "--locked", "-p", "routing-userspace"])
        .args(["--bin", "flexinfer-proxy"])
        .env("CARGO_TARGET_DIR", target)
        .env("RUSTFLAGS", rustflags);
    if object.is_file() {
        cmd.env("FLEXINFER_EBPF_OBJECT", &object);
    }
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build ({rustflags}) failed ({status})");
    }
    Ok(target.join("release").join("flexinfer-proxy"))
}

/// Run the benches' proxy rows against `bin` (it writes its profile as each run ends).
fn train(bin: &Path, seconds: u32) -> Result<()> {
    let mut only: Vec<String> = ["fx-userspace", "fx-trace-1", "fx-trace-0.1"]
        .map(String::from)
        .into();
    match flexinfer_test_support::bpf_missing() {
        None => only.push("fx-default".into()),
        Some(why) => println!("pgo: no eBPF-gauge training row: {why}"),
    }
    crate::bench::overhead::run(&OverheadBench {
        duration: seconds,
        warmup: 1,
        rounds: 1,
        connections: 32,
        only,
        no_build: true,
        shared_core_with: None,
        proxy_bin: Some(bin.to_path_buf()),
    })
    .context("training on the overhead bench")?;
    let files = raise_nofile_limit().context("raising the open-files limit")?;
    let paced_streams = paced_streams(files);
    if paced_streams < PACED_STREAMS {
        println!(
            "pgo: open files limited to {files} here (a container build's default): the paced \
             training relays {paced_streams} streams, not {PACED_STREAMS}"
        );
    }
    crate::bench::stream::run(&StreamBench {
        modes: vec!["paced".into(), "bulk".into()],
        only: vec!["fx-userspace".into()],
        duration: seconds,
        scale_duration: seconds,
        warmup: 1,
        idle_connections: 0,
        paced_streams,
        threads: 1,
        no_build: false,
        proxy_bin: Some(bin.to_path_buf()),
    })
    .context("training on the stream bench")
}

/// Streams the paced training can hold under an open-files limit of `files`: a third of it.
/// The proxy serves at most three eighths of a small limit (two descriptors a connection beside
/// a reserve of a quarter, up to 1,024: `routing_userspace::open_files`) and answers 503 past
/// that; the load generator and the upstream each hold one a stream.
fn paced_streams(files: u64) -> usize {
    usize::try_from(files / 3)
        .unwrap_or(usize::MAX)
        .clamp(32, PACED_STREAMS)
}

/// The toolchain's `llvm-profdata` (the `llvm-tools` component, added if missing): the one
/// whose format matches the compiler's LLVM.
fn llvm_profdata() -> Result<PathBuf> {
    let find = || -> Result<Option<PathBuf>> {
        let out = Command::new("rustc")
            .current_dir(workspace_root())
            .args(["--print", "target-libdir"])
            .output()
            .context("running rustc --print target-libdir")?;
        let libdir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let bin = libdir.parent().map(|p| p.join("bin").join("llvm-profdata"));
        Ok(bin.filter(|b| b.is_file()))
    };
    if let Some(bin) = find()? {
        return Ok(bin);
    }
    let status = Command::new("rustup")
        .current_dir(workspace_root())
        .args(["component", "add", "llvm-tools"])
        .status()
        .context("running rustup component add llvm-tools")?;
    if !status.success() {
        bail!("rustup component add llvm-tools failed ({status})");
    }
    find()?.context("llvm-profdata not found after adding llvm-tools")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_training_fits_the_open_files_limit() {
        assert_eq!(paced_streams(20_000), PACED_STREAMS);
        // Under the proxy's 384 at 1,024 files.
        assert_eq!(paced_streams(1024), 341);
        assert_eq!(paced_streams(3000), PACED_STREAMS);
        assert_eq!(paced_streams(50), 32);
    }
}
