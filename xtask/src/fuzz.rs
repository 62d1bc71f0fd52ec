//! `cargo xtask fuzz`: build the cargo-fuzz targets under `tests/fuzz` and run them one after
//! the other, each for a fixed time, then print what each did (executions, corpus, crashes).
//!
//! The parsers fuzzed here face bytes from clients, pods, operators and the API server, and a
//! panic in any of them takes requests down with it. Fuzzing needs nightly and takes minutes
//! per target, so it is a task of its own. The seed corpus in the repo stays small
//! (`tests/fuzz/corpus/<target>/`); what libFuzzer adds goes to the target directory, crashes
//! to `tests/fuzz/artifacts/<target>/` (ignored by git). A crash worth keeping is minimized
//! (`cargo fuzz tmin`) into `tests/fuzz/regressions/<target>/`; `--replay` runs those and the
//! seeds once (with `--strict`, also against checks for findings already reported, which the
//! targets skip by default). See docs/fuzzing.md.
//!
//! `cargo xtask test` (so CI) runs [`replay_for_tests`]: every target built and every seed and
//! regression replayed under `--strict`, so a target that no longer compiles against the proxy
//! or an input that crashes again fails the run. It builds with `--quick-build` (debug build,
//! no sanitizer: under a third of the optimized ASan build's CPU time, see docs/fuzzing.md);
//! debug assertions and overflow checks stay on, and every check of the targets is an
//! assertion, so a replay fails on the same inputs either way (the proxy's fuzzed code has no
//! `unsafe` for a sanitizer to watch).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::ebpf::{nightly, target_dir, workspace_root};

#[derive(clap::Args)]
pub(crate) struct Fuzz {
    /// Only these targets (comma-separated); default: every target.
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,
    /// Seconds of fuzzing per target.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Run each target's seed corpus and committed regressions once instead of fuzzing.
    #[arg(long)]
    pub replay: bool,
    /// Also check findings already reported (FLEXINFER_FUZZ_STRICT=1): their reproducers
    /// crash again until the code is fixed.
    #[arg(long)]
    pub strict: bool,
    /// Build without optimization and without a sanitizer (`cargo fuzz build --dev
    /// --sanitizer none`), keeping debug assertions: a fraction of the build time, for
    /// replays (`cargo xtask test` replays this way). Slow for fuzzing.
    #[arg(long)]
    pub quick_build: bool,
    /// Extra libFuzzer flags, after `--` (e.g. `-- -jobs=2`).
    #[arg(last = true)]
    pub libfuzzer_args: Vec<String>,
}

/// A fuzz target and the libFuzzer dictionary (`tests/fuzz/dict/<dict>.dict`) it runs with.
struct Target {
    name: &'static str,
    dict: &'static str,
    what: &'static str,
}

const TARGETS: [Target; 8] = [
    Target {
        name: "keys",
        dict: "json",
        what: "headers + body through BodyFields::parse and keys::extract, every strategy",
    },
    Target {
        name: "body",
        dict: "json",
        what: "BodyFields::parse and every accessor against a typed serde reading",
    },
    Target {
        name: "resolve",
        dict: "http",
        what: "resolve::named on URIs and headers, then the upstream head",
    },
    Target {
        name: "models_file",
        dict: "yaml",
        what: "discovery::file::parse and config check on arbitrary text",
    },
    Target {
        name: "kube_translate",
        dict: "json",
        what: "JSON into Model/Service/EndpointSlice, then translate",
    },
    Target {
        name: "h1_head",
        dict: "http",
        what: "h1::head::parse_response fed in arbitrary splits",
    },
    Target {
        name: "h1_chunked",
        dict: "http",
        what: "h1::chunked::ChunkedDecoder fed in arbitrary splits",
    },
    Target {
        name: "h1_request",
        dict: "http",
        what: "proxy::h1 request head and body against hyper's server on the same bytes",
    },
];

fn fuzz_dir() -> PathBuf {
    workspace_root().join("tests").join("fuzz")
}

/// The fuzz crate's own target directory (sanitizer builds share nothing with normal ones).
fn fuzz_target_dir() -> PathBuf {
    target_dir().join("fuzz")
}

fn select(names: &[String]) -> Result<Vec<&'static Target>> {
    if names.is_empty() {
        return Ok(TARGETS.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            TARGETS.iter().find(|t| t.name == n).with_context(|| {
                let all: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
                format!("--target {n}: not one of {}", all.join(", "))
            })
        })
        .collect()
}

/// `cargo +nightly fuzz ...` at the workspace root, for the fuzz crate and its target dir
/// (`run` builds first, so it takes the same build flags as `build`).
fn cargo_fuzz(sub: &str, quick_build: bool) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .arg(format!("+{}", nightly()))
        .args(["fuzz", sub, "--fuzz-dir"])
        .arg(fuzz_dir())
        // Debug assertions and overflow checks: an overflow is a finding, not a wrap.
        .arg("--debug-assertions")
        .arg("--target-dir")
        .arg(fuzz_target_dir());
    if quick_build {
        cmd.args(["--dev", "--sanitizer", "none"]);
    }
    // The host toolchain's rustup override would otherwise leak into the nightly build.
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER");
    cmd
}

/// Installs cargo-fuzz unless `cargo fuzz` works already.
pub(crate) fn ensure_cargo_fuzz() -> Result<()> {
    let works = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if works {
        return Ok(());
    }
    println!("fuzz: installing cargo-fuzz from crates.io");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .context("running cargo install cargo-fuzz")?;
    if !status.success() {
        bail!("cargo install cargo-fuzz failed ({status})");
    }
    Ok(())
}

/// What one libFuzzer run reported.
#[derive(Debug, Default, PartialEq)]
struct Stats {
    execs: Option<u64>,
    execs_per_sec: Option<u64>,
    peak_rss_mb: Option<u64>,
    /// Crash inputs libFuzzer wrote.
    artifacts: Vec<String>,
    /// `file:line: message` of the first panic.
    panic: Option<String>,
}

impl Stats {
    fn parse(log: &str) -> Self {
        let stat = |key: &str| {
            log.lines().find_map(|l| {
                l.trim()
                    .strip_prefix(key)?
                    .trim_start_matches(':')
                    .trim()
                    .parse()
                    .ok()
            })
        };
        let mut lines = log.lines();
        let mut panic = None;
        while let Some(l) = lines.next() {
            if let Some(rest) = l.split_once(" panicked at ").map(|(_, r)| r) {
                let at = rest.trim_end_matches(':');
                let message = lines.next().unwrap_or_default().trim();
                panic = Some(format!("{at}: {message}"));
                break;
            }
        }
        Stats {
            execs: stat("stat::number_of_executed_units"),
            execs_per_sec: stat("stat::average_exec_per_sec"),
            peak_rss_mb: stat("stat::peak_rss_mb"),
            artifacts: log
                .lines()
                .filter_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
                .map(str::to_owned)
                .collect(),
            panic,
        }
    }
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

struct Outcome {
    target: &'static Target,
    seconds: f64,
    stats: Stats,
    corpus: usize,
    ok: bool,
    log: PathBuf,
}

fn run_target(t: &'static Target, args: &Fuzz, logs: &Path) -> Result<Outcome> {
    let seeds = fuzz_dir().join("corpus").join(t.name);
    let regressions = fuzz_dir().join("regressions").join(t.name);
    let work = fuzz_target_dir().join("corpus").join(t.name);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let log_path = logs.join(format!("{}.log", t.name));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = cargo_fuzz("run", args.quick_build);
    cmd.arg(t.name);
    if args.replay {
        // Directories and files given on the command line are run once each (-runs=0 keeps
        // libFuzzer from fuzzing on afterwards).
        cmd.arg(&seeds);
        if regressions.is_dir() {
            cmd.arg(&regressions);
        }
        // The final stats count the inputs run: a replay that ran none must not pass.
        cmd.args(["--", "-runs=0", "-print_final_stats=1"]);
    } else {
        // libFuzzer writes new inputs to the first directory: the work corpus, not the repo.
        cmd.arg(&work).arg(&seeds).arg("--");
        cmd.arg(format!("-max_total_time={}", args.seconds));
        cmd.arg(format!(
            "-dict={}",
            fuzz_dir()
                .join("dict")
                .join(format!("{}.dict", t.dict))
                .display()
        ));
        cmd.args(["-timeout=30", "-print_final_stats=1"]);
    }
    cmd.args(&args.libfuzzer_args);
    if args.strict {
        cmd.env("FLEXINFER_FUZZ_STRICT", "1");
    }
    cmd.stdout(log.try_clone()?).stderr(log);
    let start = Instant::now();
    let status = cmd.status().context("running cargo fuzz run")?;
    let seconds = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    Ok(Outcome {
        target: t,
        seconds,
        stats: Stats::parse(&text),
        corpus: count_files(&work),
        ok: status.success(),
        log: log_path,
    })
}

fn render(outcomes: &[Outcome], replay: bool) -> String {
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let mut t = String::new();
    t.push_str("| target | drives | seconds | execs | execs/s | peak RSS MB | corpus | result |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for o in outcomes {
        let result = if o.ok {
            "ok".to_owned()
        } else {
            let what = o.stats.panic.as_deref().unwrap_or("failed (see the log)");
            let files = o.stats.artifacts.join(", ");
            format!("CRASH {what} {files}")
        };
        let corpus = if replay {
            "-".to_owned()
        } else {
            o.corpus.to_string()
        };
        t.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            o.target.name,
            o.target.what,
            o.seconds,
            opt(o.stats.execs),
            opt(o.stats.execs_per_sec),
            opt(o.stats.peak_rss_mb),
            corpus,
            result.replace('|', "\\|"),
        ));
    }
    t
}

/// `cargo fuzz build` of every target; `Ok(false)` if it did not compile.
fn build(args: &Fuzz) -> Result<bool> {
    crate::setup::ensure_nightly()?;
    ensure_cargo_fuzz()?;
    println!(
        "fuzz: building the targets ({} toolchain{})",
        nightly(),
        if args.quick_build {
            ", debug build, no sanitizer"
        } else {
            ""
        }
    );
    let status = cargo_fuzz("build", args.quick_build)
        .status()
        .context("running cargo fuzz build")?;
    Ok(status.success())
}

/// Runs `targets` one after the other; prints and writes the table, returns the outcomes.
fn run_all(targets: &[&'static Target], args: &Fuzz) -> Result<Vec<Outcome>> {
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let logs = fuzz_target_dir().join("logs").join(stamp.to_string());
    std::fs::create_dir_all(&logs)?;
    let mut outcomes = Vec::new();
    for &t in targets {
        if args.replay {
            println!("fuzz: {}: replaying seeds and regressions", t.name);
        } else {
            println!("fuzz: {}: {} s ({})", t.name, args.seconds, t.what);
        }
        let o = run_target(t, args, &logs)?;
        println!(
            "fuzz: {}: {} after {:.0} s, {} execs; log {}",
            t.name,
            if o.ok { "ok" } else { "CRASHED" },
            o.seconds,
            o.stats.execs.map_or("?".into(), |e| e.to_string()),
            o.log.display()
        );
        outcomes.push(o);
    }
    let table = render(&outcomes, args.replay);
    std::fs::write(logs.join("summary.md"), &table)?;
    println!("\n{table}");
    Ok(outcomes)
}

pub(crate) fn run(args: &Fuzz) -> Result<()> {
    let targets = select(&args.target)?;
    if !build(args)? {
        bail!("cargo fuzz build failed");
    }
    let outcomes = run_all(&targets, args)?;
    let crashed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok).collect();
    if !crashed.is_empty() {
        let names: Vec<&str> = crashed.iter().map(|o| o.target.name).collect();
        bail!(
            "{} crashed; inputs under tests/fuzz/artifacts/, logs in {}",
            names.join(", "),
            crashed[0].log.parent().unwrap_or(Path::new(".")).display()
        );
    }
    Ok(())
}

/// One target's replay under `cargo xtask test`: `failure` says what went wrong, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub target: &'static str,
    pub failure: Option<String>,
}

/// What `cargo xtask test` runs: `cargo xtask fuzz --replay --strict --quick-build`, every
/// target. A build that fails is one failure (`target: "build"`), each target that crashes on
/// a seed or a regression another; `Err` only when the tools cannot be set up or run.
pub(crate) fn replay_for_tests() -> Result<Vec<Replayed>> {
    let args = Fuzz {
        target: Vec::new(),
        seconds: 0,
        replay: true,
        strict: true,
        quick_build: true,
        libfuzzer_args: Vec::new(),
    };
    if !build(&args)? {
        return Ok(vec![Replayed {
            target: "build",
            failure: Some("`cargo fuzz build` of tests/fuzz failed (output above)".into()),
        }]);
    }
    let targets: Vec<&'static Target> = TARGETS.iter().collect();
    let outcomes = run_all(&targets, &args)?;
    Ok(outcomes
        .iter()
        .map(|o| Replayed {
            target: o.target.name,
            failure: replay_failure(o, replay_inputs(o.target)),
        })
        .collect())
}

/// The seeds and regressions a replay of `t` runs.
fn replay_inputs(t: &Target) -> u64 {
    let dir = |d: &str| count_files(&fuzz_dir().join(d).join(t.name)) as u64;
    dir("corpus") + dir("regressions")
}

/// Why a replay failed: a crash (its first panic), or fewer runs than inputs (libFuzzer runs
/// each input once, and an empty one first).
fn replay_failure(o: &Outcome, inputs: u64) -> Option<String> {
    let log = o.log.display();
    if !o.ok {
        let what = o.stats.panic.as_deref().unwrap_or("failed");
        return Some(format!("crashed: {what} (log {log})"));
    }
    match o.stats.execs {
        Some(n) if n >= inputs && inputs > 0 => None,
        n => Some(format!(
            "ran {} of its {inputs} seeds and regressions (log {log})",
            n.map_or("?".into(), |n| n.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_final_stats_and_the_crash() {
        let log = "\
#1024\tpulse  cov: 10 ft: 20 corp: 5/100b exec/s: 512 rss: 80Mb

thread '<unnamed>' (123) panicked at fuzz_targets/body.rs:236:17:
the view rejected a body
stack backtrace:
==123== ERROR: libFuzzer: deadly signal
artifact_prefix='tests/fuzz/artifacts/body/'; Test unit written to tests/fuzz/artifacts/body/crash-abc
stat::number_of_executed_units: 4242
stat::average_exec_per_sec:     707
stat::new_units_added:          3
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              81
";
        let s = Stats::parse(log);
        assert_eq!(s.execs, Some(4242));
        assert_eq!(s.execs_per_sec, Some(707));
        assert_eq!(s.peak_rss_mb, Some(81));
        assert_eq!(s.artifacts, vec!["tests/fuzz/artifacts/body/crash-abc"]);
        assert_eq!(
            s.panic.as_deref(),
            Some("fuzz_targets/body.rs:236:17: the view rejected a body")
        );
        assert_eq!(Stats::parse("nothing"), Stats::default());
    }

    #[test]
    fn every_target_has_its_files() {
        for t in &TARGETS {
            let src = fuzz_dir()
                .join("fuzz_targets")
                .join(format!("{}.rs", t.name));
            assert!(src.is_file(), "{}", src.display());
            let dict = fuzz_dir().join("dict").join(format!("{}.dict", t.dict));
            assert!(dict.is_file(), "{}", dict.display());
            let seeds = fuzz_dir().join("corpus").join(t.name);
            let n = count_files(&seeds);
            assert!((15..=60).contains(&n), "{}: {n} seeds", seeds.display());
        }
        let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        for t in &TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{}\"", t.name)),
                "{} is not a [[bin]] of tests/fuzz/Cargo.toml",
                t.name
            );
        }
    }

    #[test]
    fn a_replay_fails_on_a_crash_or_on_inputs_it_did_not_run() {
        let outcome = |ok: bool, execs: Option<u64>| Outcome {
            target: &TARGETS[0],
            seconds: 1.0,
            stats: Stats {
                execs,
                panic: (!ok).then(|| "fuzz_targets/keys.rs:9:9: boom".to_owned()),
                ..Stats::default()
            },
            corpus: 0,
            ok,
            log: PathBuf::from("/logs/keys.log"),
        };
        assert_eq!(replay_failure(&outcome(true, Some(33)), 32), None);
        assert_eq!(
            replay_failure(&outcome(false, Some(3)), 32).as_deref(),
            Some("crashed: fuzz_targets/keys.rs:9:9: boom (log /logs/keys.log)")
        );
        assert_eq!(
            replay_failure(&outcome(true, Some(5)), 32).as_deref(),
            Some("ran 5 of its 32 seeds and regressions (log /logs/keys.log)")
        );
        assert!(replay_failure(&outcome(true, None), 32).is_some());
        assert!(replay_failure(&outcome(true, Some(1)), 0).is_some());
    }

    #[test]
    fn selects_targets_by_name() {
        assert_eq!(select(&[]).unwrap().len(), TARGETS.len());
        let one = select(&["h1_head".into()]).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "h1_head");
        assert!(select(&["nope".into()]).is_err());
    }
}
