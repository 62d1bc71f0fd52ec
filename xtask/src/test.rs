//! `cargo xtask test`: the README's test command, and what CI runs.
//!
//! On a fresh machine it installs what the tests need (rust-src, bpf-linker, Debian packages),
//! builds the eBPF object the proxy embeds, then checks formatting, clippy and every test of
//! the workspace. Each step prints how long it took.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::ebpf::{self, BuildEbpf};
use crate::setup::{self, Setup};

/// Debian packages the integration tests drive for real.
const TEST_PACKAGES: &[&str] = &["prometheus", "yamllint", "bpftool"];

#[derive(clap::Args)]
pub struct Test {
    /// Skip installing tools and packages (they are already there).
    #[arg(long)]
    pub no_setup: bool,
    /// Skip `cargo fmt --check` and clippy.
    #[arg(long)]
    pub no_lint: bool,
    /// Arguments passed to `cargo test` after `--workspace` (e.g. `-- routing`).
    #[arg(last = true)]
    pub cargo_args: Vec<String>,
}

fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("xtask test: == {name}");
    let t = Instant::now();
    f().with_context(|| format!("step `{name}` failed"))?;
    println!(
        "xtask test: == {name}: ok in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn cargo(args: &[&str]) -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(ebpf::workspace_root())
        .args(args)
        .status()
        .with_context(|| format!("running cargo {args:?}"))?;
    if !status.success() {
        bail!("cargo {args:?} failed ({status})");
    }
    Ok(())
}

pub fn run(args: &Test) -> Result<()> {
    let t = Instant::now();
    if !args.no_setup {
        step("setup", || {
            setup::run(&Setup { no_apt: false })?;
            setup::ensure_apt(TEST_PACKAGES)
        })?;
    }
    step("build-ebpf", || ebpf::build(&BuildEbpf { release: true }))?;
    if !args.no_lint {
        step("fmt", || cargo(&["fmt", "--all", "--", "--check"]))?;
        step("clippy", || {
            cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
        })?;
    }
    step("test", || {
        let mut a = vec!["test", "--workspace"];
        a.extend(args.cargo_args.iter().map(String::as_str));
        cargo(&a)
    })?;
    println!("xtask test: all green in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}
