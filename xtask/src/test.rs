//! `cargo xtask test`: the README's test command, and what CI runs.
//!
//! On a fresh machine it installs what the tests need (rust-src, bpf-linker, Debian packages),
//! builds the eBPF object the proxy embeds, then checks formatting, clippy and every test of
//! the workspace. Each step prints how long it took.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::ebpf;
use crate::setup::{self, Setup};
use xtask::paths;

/// Debian packages the integration tests drive for real: a Prometheus server, yamllint and
/// bpftool; podman, runc and debootstrap build and run the proxy image (container tests).
const TEST_PACKAGES: &[&str] = &[
    "prometheus",
    "yamllint",
    "bpftool",
    "podman",
    "runc",
    "debootstrap",
];

/// PyPI packages: kubernetes-validate checks the rendered manifests against the Kubernetes
/// schemas (its dependency jsonschema checks values.schema.json).
const PYTHON_PACKAGES: &[&str] = &["kubernetes-validate"];

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

/// Totals over every `test result:` line cargo prints.
#[derive(Debug, Default, PartialEq, Eq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Add one `test result: ok. 12 passed; 0 failed; 1 ignored; ...` line (others are ignored).
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// `cargo test`, echoing its output and adding up its result lines.
fn cargo_test(args: &[&str], totals: &mut Totals) -> Result<()> {
    let mut child = Command::new("cargo")
        .current_dir(ebpf::workspace_root())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running cargo {args:?}"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        totals.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo {args:?} failed ({status})");
    }
    Ok(())
}

/// Prints the disk space free where the build goes. A build that runs out of disk fails deep
/// inside rustc or the linker; this line, at the start and the end, says so up front.
fn report_disk(when: &str) {
    let target = paths::target_dir();
    let dir = if target.exists() {
        target
    } else {
        ebpf::workspace_root()
    };
    let free = Command::new("df")
        .args(["-h", "--output=avail,target"])
        .arg(&dir)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .nth(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" free on "))
        });
    match free {
        Some(line) => println!("xtask test: disk {when}: {line} ({})", dir.display()),
        None => println!(
            "xtask test: disk {when}: df gave no answer for {}",
            dir.display()
        ),
    }
}

pub fn run(args: &Test) -> Result<()> {
    let t = Instant::now();
    report_disk("at start");
    if !args.no_setup {
        step("setup", || {
            setup::run(&Setup { no_apt: false })?;
            setup::ensure_apt(TEST_PACKAGES)?;
            let python =
                setup::ensure_python(PYTHON_PACKAGES, &["kubernetes_validate", "jsonschema"])?;
            // The manifest tests run this interpreter (`python -m kubernetes_validate`).
            std::env::set_var("FLEXINFER_PYTHON", python);
            Ok(())
        })?;
    }
    // Exactly the README's command, so CI fails when its default builds a refused object.
    step("build-ebpf", ebpf::build_as_documented)?;
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
    let mut totals = Totals::default();
    let result = step("test", || {
        let mut a = vec!["test", "--workspace", "--no-fail-fast"];
        a.extend(args.cargo_args.iter().map(String::as_str));
        cargo_test(&a, &mut totals)
    });
    println!(
        "xtask test: finished in {:.1}s ({} ignored)",
        t.elapsed().as_secs_f64(),
        totals.ignored
    );
    report_disk("at end");
    // The closing line CI reads: every test of the workspace, added up.
    println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    result
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn adds_up_cargo_result_lines() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.3s");
        t.add_line("test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s");
        t.add_line("running 5 tests");
        assert_eq!(
            t,
            Totals {
                passed: 15,
                failed: 2,
                ignored: 1
            }
        );
    }
}
