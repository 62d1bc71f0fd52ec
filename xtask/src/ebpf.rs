//! `cargo xtask build-ebpf`: compile routing-ebpf for `bpfel-unknown-none` and put the object
//! where routing-userspace's build script looks for it.
//!
//! The eBPF crate needs nightly (`-Z build-std=core`) and bpf-linker, so it is built here, on
//! demand, rather than by a build script every `cargo build` would run. It is always built
//! with the release profile: an unoptimized build keeps register spills and pointer
//! arithmetic the kernel's verifier refuses (`R1 bitwise operator &= on pointer prohibited`),
//! so there is no profile of this command that gives an object the kernel would not load.
//! What it needs (the nightly toolchain, rust-src, bpf-linker) it installs first, as
//! `cargo xtask setup` does; each check costs well under a second when all is there.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub(crate) struct BuildEbpf {}

pub(crate) use xtask::paths::{target_dir, workspace_root};

/// The nightly toolchain that builds the eBPF crate: `FLEXINFER_NIGHTLY` (the Dockerfile pins
/// a dated one), else `nightly`.
pub(crate) fn nightly() -> String {
    std::env::var("FLEXINFER_NIGHTLY")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "nightly".to_owned())
}

/// The binary a bench measures: `given` as it is (it must exist), else [`release_proxy`].
pub(crate) fn proxy_to_measure(
    given: Option<&std::path::Path>,
    build: bool,
    with_ebpf: bool,
) -> Result<PathBuf> {
    match given {
        Some(bin) if bin.is_file() => Ok(bin.to_path_buf()),
        Some(bin) => bail!("--proxy-bin {}: no such file", bin.display()),
        None => release_proxy(build, with_ebpf),
    }
}

/// The release `flexinfer-proxy` the benches, the soak and the replay run: built first unless
/// `build` is false (then it must exist), with the eBPF object embedded when `with_ebpf`.
pub(crate) fn release_proxy(build: bool, with_ebpf: bool) -> Result<PathBuf> {
    if build {
        if with_ebpf {
            self::build()?;
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

/// Build the object by running `cargo xtask build-ebpf` itself, the command the README gives,
/// so that a broken default of that very command fails whoever calls this (CI does).
pub(crate) fn build_as_documented() -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(workspace_root())
        .args(["xtask", "build-ebpf"])
        .status()
        .context("running cargo xtask build-ebpf")?;
    if !status.success() {
        bail!("cargo xtask build-ebpf failed ({status})");
    }
    Ok(())
}

/// The stable path of the built object: `<target>/bpf/routing-ebpf.o`.
pub(crate) fn object_path() -> PathBuf {
    target_dir().join("bpf").join("routing-ebpf.o")
}

/// Where cargo leaves the eBPF crate's release build.
fn built_object() -> PathBuf {
    target_dir()
        .join("bpfel-unknown-none")
        .join("release")
        .join("routing-ebpf")
}

pub(crate) fn build() -> Result<()> {
    crate::setup::ensure_ebpf_toolchain().context("installing what the eBPF build needs")?;
    let status = Command::new("cargo")
        .current_dir(workspace_root())
        .arg(format!("+{}", nightly()))
        .args([
            "build",
            "-p",
            "routing-ebpf",
            "--release",
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
        .env_remove("RUSTC_WRAPPER")
        .status()
        .with_context(|| format!("running cargo +{}", nightly()))?;
    if !status.success() {
        bail!("building routing-ebpf failed ({status})");
    }
    install_object(&built_object(), &object_path())
}

/// Copy the built object to `dest`, unless it is there already.
fn install_object(built: &std::path::Path, dest: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dest.parent().expect("object path has a parent"))
        .with_context(|| format!("creating {}", dest.display()))?;
    // An unchanged object is left alone: rewriting it would make routing-userspace's build
    // script (which watches the directory) rebuild the proxy for nothing.
    if std::fs::read(dest).ok()
        == Some(std::fs::read(built).with_context(|| format!("reading {}", built.display()))?)
    {
        println!("{}", dest.display());
        return Ok(());
    }
    // Copy through a temporary name so a concurrent reader never sees half an object.
    let tmp = dest.with_extension("o.tmp");
    std::fs::copy(built, &tmp)
        .with_context(|| format!("copying {} to {}", built.display(), tmp.display()))?;
    std::fs::rename(&tmp, dest).with_context(|| format!("renaming to {}", dest.display()))?;
    println!("{}", dest.display());
    Ok(())
}
