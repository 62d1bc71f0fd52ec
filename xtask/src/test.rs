//! `cargo xtask test`: the README's test command, and what CI runs.
//!
//! On a fresh machine it installs what the tests need (rust-src, bpf-linker, cargo-fuzz,
//! Debian packages), builds the eBPF object the proxy embeds, then checks formatting, clippy,
//! the API docs (`cargo doc`, warnings denied) and every test of the workspace, and builds every fuzz target and replays its seeds and
//! regressions. Each step prints how long it took.
//!
//! The closing line, `tests: N passed, M failed, K skipped`, counts real results: a test that
//! skipped (it left a marker, see `flexinfer_test_support::skip`) is not a pass, and a test
//! binary that crashed or a target that did not build is a failure ([`summary`]). Every skip
//! is named above that line with its reason; with `FLEXINFER_REQUIRE_EBPF` set (CI) a skip is
//! a failure instead.

mod summary;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use flexinfer_test_support::{read_markers, Skipped, SKIP_DIR_ENV};

use crate::ebpf;
use crate::fuzz;
use crate::setup::{self, Setup};
use summary::Summary;
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
    // The tracing tests' throwaway CA for the https collector.
    "openssl",
];

/// PyPI packages: kubernetes-validate checks the rendered manifests against the Kubernetes
/// schemas (its dependency jsonschema checks values.schema.json).
const PYTHON_PACKAGES: &[&str] = &["kubernetes-validate"];

#[derive(clap::Args)]
pub(crate) struct Test {
    /// Skip installing tools and packages (they are already there).
    #[arg(long)]
    pub no_setup: bool,
    /// Skip `cargo fmt --check`, clippy and `cargo doc`.
    #[arg(long)]
    pub no_lint: bool,
    /// Skip building the fuzz targets and replaying their seeds and regressions.
    #[arg(long)]
    pub no_fuzz: bool,
    /// Arguments passed to `cargo test` after `--workspace` (e.g. `-- routing`).
    #[arg(last = true)]
    pub cargo_args: Vec<String>,
}

fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    println!("xtask test: == {name}");
    let t = Instant::now();
    let v = f().with_context(|| format!("step `{name}` failed"))?;
    println!(
        "xtask test: == {name}: done in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(v)
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

/// `cargo test` with `env`, echoing its output (stdout and stderr in one pipe, so cargo's
/// `Running` lines and each binary's results stay in order) and reading its results.
fn cargo_test(args: &[&str], env: &[(&str, OsString)]) -> Result<Summary> {
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(ebpf::workspace_root())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(writer.try_clone()?)
        .stderr(writer);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running cargo {args:?}"))?;
    // Our copy of the write end is gone with `cmd`: the reader ends when cargo and the test
    // binaries it started have exited.
    drop(cmd);
    let mut summary = Summary::default();
    for line in BufReader::new(reader).lines() {
        let line = line?;
        println!("{line}");
        summary.line(&line);
    }
    let status = child.wait()?;
    summary.finish(status.success());
    Ok(summary)
}

/// A fresh, empty directory for the tests' skip markers.
fn fresh_skip_dir() -> Result<PathBuf> {
    let dir = paths::target_dir().join("xtask-test-skips");
    paths::fresh_dir(&dir)?;
    Ok(dir)
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
            "xtask test: disk {when}: {}: df gave no answer",
            dir.display()
        ),
    }
}

/// Installs what the tests need; returns their environment additions.
fn setup_step() -> Result<Vec<(&'static str, OsString)>> {
    setup::run(&Setup { no_apt: false })?;
    setup::ensure_apt(TEST_PACKAGES)?;
    let python = setup::ensure_python(PYTHON_PACKAGES, &["kubernetes_validate", "jsonschema"])?;
    fuzz::ensure_cargo_fuzz()?;
    // The manifest tests run this interpreter (`python -m kubernetes_validate`).
    Ok(vec![("FLEXINFER_PYTHON", python.into_os_string())])
}

pub(crate) fn run(args: &Test) -> Result<()> {
    let t = Instant::now();
    report_disk("at start");
    let mut env = if args.no_setup {
        Vec::new()
    } else {
        step("setup", setup_step)?
    };
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
        step("doc", || {
            let status = Command::new("cargo")
                .current_dir(ebpf::workspace_root())
                .args(["doc", "--no-deps", "--workspace"])
                // Broken intra-doc links and every other rustdoc warning fail the step.
                .env("RUSTDOCFLAGS", "-D warnings")
                .status()
                .context("running cargo doc")?;
            if !status.success() {
                bail!("cargo doc failed ({status})");
            }
            Ok(())
        })?;
    }
    let skip_dir = fresh_skip_dir()?;
    env.push((SKIP_DIR_ENV, skip_dir.clone().into_os_string()));
    let tests = step("test", || {
        let mut a = vec!["test", "--workspace", "--no-fail-fast"];
        a.extend(args.cargo_args.iter().map(String::as_str));
        cargo_test(&a, &env)
    })?;
    let skipped = read_markers(&skip_dir)
        .with_context(|| format!("reading the skip markers in {}", skip_dir.display()))?;
    // After the tests, and whatever they did: both outcomes reach the closing line.
    let fuzzed = if args.no_fuzz {
        None
    } else {
        Some(step("fuzz", fuzz::replay_for_tests)?)
    };
    println!(
        "xtask test: finished in {:.1}s ({} ignored)",
        t.elapsed().as_secs_f64(),
        tests.ignored
    );
    report_disk("at end");
    let closing = Closing::new(&tests, &skipped, fuzzed.as_deref(), ebpf_required());
    for line in closing.lines() {
        println!("xtask test: {line}");
    }
    // The closing line CI reads: every test of the workspace and every fuzz target, added up.
    println!("{}", closing.totals());
    if closing.failed > 0 {
        bail!("{} failed", closing.failed);
    }
    Ok(())
}

/// Whether eBPF (and with it every other test) must really run: CI sets this.
fn ebpf_required() -> bool {
    std::env::var_os("FLEXINFER_REQUIRE_EBPF").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The closing account: counts, and a line for everything that did not pass.
struct Closing {
    passed: u64,
    failed: u64,
    skipped: u64,
    lines: Vec<String>,
}

impl Closing {
    /// `tests` as cargo ran them, the skip markers they left, the fuzz replay (`None`: not
    /// run), and whether a skip is a failure.
    fn new(
        tests: &Summary,
        skips: &[Skipped],
        fuzzed: Option<&[fuzz::Replayed]>,
        skip_fails: bool,
    ) -> Self {
        let n = skips.len() as u64;
        // A skipped test returned early, so libtest counted it as passed.
        let mut c = Closing {
            passed: tests.passed.saturating_sub(n),
            failed: tests.failures(),
            skipped: 0,
            lines: tests.failure_lines(),
        };
        for s in skips {
            let what = format!("{} ({}): {}", s.test, s.binary, s.reason);
            if skip_fails {
                c.lines.push(format!(
                    "skipped although FLEXINFER_REQUIRE_EBPF is set: {what}"
                ));
            } else {
                c.lines.push(format!("skipped: {what}"));
            }
        }
        if skip_fails {
            c.failed += n;
        } else {
            c.skipped = n;
        }
        match fuzzed {
            None => c.lines.push("fuzz replay not run (--no-fuzz)".into()),
            Some(targets) => {
                for t in targets {
                    match &t.failure {
                        None => c.passed += 1,
                        Some(why) => {
                            c.failed += 1;
                            c.lines.push(format!("fuzz {}: {why}", t.target));
                        }
                    }
                }
            }
        }
        c
    }

    fn lines(&self) -> &[String] {
        &self.lines
    }

    fn totals(&self) -> String {
        format!(
            "tests: {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip(test: &str) -> Skipped {
        Skipped {
            binary: "it".into(),
            test: test.into(),
            reason: "not running as root".into(),
        }
    }

    fn ran(passed: u64, failed: u64) -> Summary {
        let line = format!("test result: ok. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s");
        Summary::read(
            [
                "     Running tests/it/main.rs (target/debug/deps/it-1)",
                &line,
            ],
            failed == 0,
        )
    }

    #[test]
    fn skips_are_not_passes_and_are_named() {
        let c = Closing::new(
            &ran(10, 0),
            &[skip("ebpf::a"), skip("ebpf::b")],
            None,
            false,
        );
        assert_eq!(c.totals(), "tests: 8 passed, 0 failed, 2 skipped");
        assert_eq!(
            c.lines(),
            [
                "skipped: ebpf::a (it): not running as root",
                "skipped: ebpf::b (it): not running as root",
                "fuzz replay not run (--no-fuzz)",
            ]
        );
    }

    #[test]
    fn under_require_ebpf_a_skip_is_a_failure() {
        let c = Closing::new(&ran(10, 1), &[skip("ebpf::a")], Some(&[]), true);
        assert_eq!(c.totals(), "tests: 9 passed, 2 failed, 0 skipped");
        assert_eq!(
            c.lines(),
            ["skipped although FLEXINFER_REQUIRE_EBPF is set: ebpf::a (it): not running as root"]
        );
    }

    #[test]
    fn each_fuzz_target_is_a_result() {
        let fuzzed = [
            fuzz::Replayed {
                target: "keys",
                failure: None,
            },
            fuzz::Replayed {
                target: "body",
                failure: Some("crashed: fuzz_targets/body.rs:1:1: boom".into()),
            },
        ];
        let c = Closing::new(&ran(3, 0), &[], Some(&fuzzed), true);
        assert_eq!(c.totals(), "tests: 4 passed, 1 failed, 0 skipped");
        assert_eq!(
            c.lines(),
            ["fuzz body: crashed: fuzz_targets/body.rs:1:1: boom"]
        );
    }
}
