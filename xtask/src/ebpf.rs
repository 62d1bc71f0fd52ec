//! `cargo xtask build-ebpf`: compile routing-ebpf for `bpfel-unknown-none` and put the object
//! where routing-userspace's build script looks for it.
//!
//! The eBPF crate needs nightly (`-Z build-std=core`) and bpf-linker, so it is built here, on
//! demand, rather than by a build script every `cargo build` would run.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct BuildEbpf {
    /// Build with the release profile (the only one the verifier reliably accepts).
    #[arg(long)]
    pub release: bool,
}

pub use xtask::paths::{target_dir, workspace_root};

/// The nightly toolchain that builds the eBPF crate: `FLEXINFER_NIGHTLY` (the Dockerfile pins
/// a dated one), else `nightly`.
pub fn nightly() -> String {
    std::env::var("FLEXINFER_NIGHTLY")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "nightly".to_owned())
}

/// The release `flexinfer-proxy` the benches, the soak and the replay run: built first unless
/// `build` is false (then it must exist), with the eBPF object embedded when `with_ebpf`.
pub fn release_proxy(build: bool, with_ebpf: bool) -> Result<PathBuf> {
    if build {
        if with_ebpf {
            self::build(&BuildEbpf { release: true })?;
        }
        let status = Command::new("cargo")
            .current_dir(workspace_root())
            .args([
                "build",
                "--release",
                "--locked",
                "-p",
                "routing-userspace",
                "--bin",
                "flexinfer-proxy",
            ])
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("cargo build --release -p routing-userspace failed ({status})");
        }
    }
    let bin = target_dir().join("release").join("flexinfer-proxy");
    if !bin.exists() {
        bail!("{} not found (run without --no-build)", bin.display());
    }
    Ok(bin)
}

/// The stable path of the built object: `<target>/bpf/routing-ebpf.o`.
pub fn object_path() -> PathBuf {
    target_dir().join("bpf").join("routing-ebpf.o")
}

pub fn build(args: &BuildEbpf) -> Result<()> {
    let root = workspace_root();
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .arg(format!("+{}", nightly()))
        .args([
            "build",
            "-p",
            "routing-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        // Keep BTF (maps declared with #[btf_map] need it; bpftool dumps typed values), and
        // target BPF v3 for the atomic AND, OR and compare-and-swap the gauge uses (5.12+).
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            "-C debuginfo=2 -C link-arg=--btf -C target-cpu=v3",
        )
        // The host toolchain's rustup override would otherwise leak into the nightly build.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER");
    if args.release {
        cmd.arg("--release");
    }
    let status = cmd.status().context(
        "running cargo +nightly (is the nightly toolchain installed? try `cargo xtask setup`)",
    )?;
    if !status.success() {
        bail!("building routing-ebpf failed ({status}); `cargo xtask setup` installs bpf-linker and rust-src");
    }
    let profile = if args.release { "release" } else { "debug" };
    let built = target_dir()
        .join("bpfel-unknown-none")
        .join(profile)
        .join("routing-ebpf");
    let dest = object_path();
    std::fs::create_dir_all(dest.parent().expect("object path has a parent"))
        .with_context(|| format!("creating {}", dest.display()))?;
    // An unchanged object is left alone: rewriting it would make routing-userspace's build
    // script (which watches the directory) rebuild the proxy for nothing.
    if std::fs::read(&dest).ok()
        == Some(std::fs::read(&built).with_context(|| format!("reading {}", built.display()))?)
    {
        println!("{}", dest.display());
        return Ok(());
    }
    // Copy through a temporary name so a concurrent reader never sees half an object.
    let tmp = dest.with_extension("o.tmp");
    std::fs::copy(&built, &tmp)
        .with_context(|| format!("copying {} to {}", built.display(), tmp.display()))?;
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming to {}", dest.display()))?;
    println!("{}", dest.display());
    Ok(())
}
