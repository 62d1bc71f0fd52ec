//! `cargo xtask bench stream`: what relaying an LLM token stream costs, next to haproxy and
//! nginx, on loopback (issue 19's harness).
//!
//! Three upstreams of a small epoll server (`sse-upstream`, built from the test-support crate
//! in release) answer every POST with OpenAI-shaped `chat.completion.chunk` events, one HTTP
//! chunk and one write per event, each stamped with its send time. A load generator
//! (`sse-load`, same crate: epoll, nonblocking sockets) holds the mode's streams, reads every
//! event and records its delay (receive time minus the stamped send time: loopback shares
//! one clock) and the gap since the stream's previous event. No packaged tool does that for
//! thousands of streams: wrk and h2load count responses and bytes, not events.
//!
//! The load generator and the upstreams share CPU 0; the proxy under test has CPU 1 alone,
//! one worker each (as `bench overhead` places them). CPU per event is the proxy's own user +
//! system time over the measured window (from /proc, its process tree), divided by the
//! stamped events relayed in that window; RSS per stream is the proxy's resident memory at
//! the end of the window minus before the first connection, divided by the connections. The
//! direct row (no proxy) is the ceiling of the load side and the base of the added delay;
//! its `load gen + upstream core busy` shows how close the load side came to its core.
//! Modes: see `modes`. Raw output: `<target>/bench-stream/<unix time>/`.

mod modes;
mod sample;
mod table;
mod targets;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::os::raise_nofile_limit;
use flexinfer_test_support::harness::report::{date_utc, RunDir};
use flexinfer_test_support::is_root;

use crate::bench::peers;
use crate::ebpf;
use modes::{Mode, MODES};
use sample::{run_one, Sample};
use targets::{Target, TARGETS};

#[derive(clap::Args)]
pub(crate) struct StreamBench {
    /// Modes, comma-separated: paced, bulk (throughput), scale-1k, scale-8k (scale), idle,
    /// idle-used (memory per idle connection, before and after one answer).
    /// Default: all.
    #[arg(long, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// Only these targets, comma-separated: direct, haproxy, nginx, fx-userspace, fx-default.
    /// Default: all (fx-default needs root).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Measured seconds of the throughput modes.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Measured seconds of the scale modes.
    #[arg(long, default_value_t = 60)]
    pub scale_duration: u32,
    /// Seconds between all streams open and the measured window.
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Client connections of the idle modes (thousands: the allocators grow in MiB steps).
    #[arg(long, default_value_t = 8000)]
    pub idle_connections: usize,
    /// Streams of the paced mode (each proxy holds two open files a stream).
    #[arg(long, default_value_t = PACED_STREAMS)]
    pub paced_streams: usize,
    /// Load generator threads (all on the load side's CPU).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Skip building (use the release binaries already in the target directory).
    #[arg(long)]
    pub no_build: bool,
    /// Measure this flexinfer-proxy binary instead of the release build (the load generator
    /// and the upstream are still built unless --no-build), e.g. the one `cargo xtask pgo`
    /// writes.
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<PathBuf>,
}

/// Streams of the paced mode unless `--paced-streams`.
pub(crate) const PACED_STREAMS: usize = 1000;

/// Prefix of the cgroups and pin dirs this harness creates (`<prefix>-<pid>-<n>`).
const PREFIX: &str = "flexinfer-stream";

/// The two bins of the test-support crate.
struct Tools {
    upstream: PathBuf,
    load: PathBuf,
}

/// What the runs share.
struct Env<'a> {
    bin: &'a Path,
    tools: &'a Tools,
    out: &'a Path,
    args: &'a StreamBench,
}

pub(crate) fn run(args: &StreamBench) -> Result<()> {
    let (modes, mut targets) = select(&args.modes, &args.only)?;
    if modes.contains(&Mode::Paced) && args.paced_streams == 0 {
        bail!("--paced-streams must be at least 1");
    }
    // Every process started from here inherits it: 8,000 streams are 16,000 sockets in a proxy.
    let files = raise_nofile_limit().context("raising the open-files limit")?;
    if files < 20_000 {
        eprintln!(
            "bench stream: open files limited to {files}; the 8,000-stream mode needs 16,000+"
        );
    }
    crate::setup::ensure_apt(&["nginx", "haproxy"])?;
    let root = is_root();
    let bin = ebpf::proxy_to_measure(args.proxy_bin.as_deref(), !args.no_build, root)?;
    let tools = build_tools(!args.no_build)?;
    let mut notes = Vec::new();
    if root {
        peers::remove_stale(PREFIX, "bench stream");
    }
    if targets.contains(&Target::FxDefault) {
        if let Some(note) = peers::fx_default_unavailable() {
            targets.retain(|t| *t != Target::FxDefault);
            notes.push(note);
        }
    }
    if targets.is_empty() {
        bail!("nothing to run: {}", notes.join("; "));
    }
    let out = RunDir::create(&ebpf::target_dir().join("bench-stream"))?;
    out.stamp(&peers::versions(&peers::PEER_TOOLS, None))?;
    let env = Env {
        bin: &bin,
        tools: &tools,
        out: out.path(),
        args,
    };
    println!(
        "bench stream: {}s ({}s scale) measured after {}s warm-up; raw output in {}",
        args.duration,
        args.scale_duration,
        args.warmup,
        out.path().display()
    );
    let mut report = format!("date: {}\n", date_utc());
    for mode in modes {
        let rows = run_mode(mode, &targets, &env)?;
        let _ = write!(
            report,
            "\n### {} ({})\n\n{}",
            mode.name(),
            mode.what(args.paced_streams),
            table::render(mode, &rows)
        );
    }
    for n in notes {
        let _ = writeln!(report, "\n{n}");
    }
    out.write("table.md", &report)?;
    println!("\n{report}");
    Ok(())
}

/// Every target once for `mode`, one after the other (no direct row for idle connections).
fn run_mode(mode: Mode, targets: &[Target], env: &Env) -> Result<Vec<(Target, Sample)>> {
    let mut rows = Vec::new();
    // Idle connections cost the upstreams nothing: only proxies are measured.
    for &t in targets
        .iter()
        .filter(|t| !mode.is_idle() || **t != Target::Direct)
    {
        let tag = format!("{}-{}", mode.name(), t.name());
        let s = run_one(mode, t, &tag, env)
            .with_context(|| format!("{} / {}", mode.name(), t.name()))?;
        println!(
            "  {:<9} {:<13} {:>9.0} events/s  proxy CPU {:>7.3} us/event  delay p50 {:>7.2} p99 {:>7.2} ms  RSS {:>6.1} KiB/conn  errors {}",
            mode.name(),
            t.name(),
            s.events_per_s(),
            s.cpu_us_per_event(),
            s.get("delay_p50_us") / 1000.0,
            s.get("delay_p99_us") / 1000.0,
            s.rss_kib_per_connection(),
            s.errors()
        );
        rows.push((t, s));
    }
    Ok(rows)
}

/// Build `sse-upstream` and `sse-load` in release (small: the test-support crate).
fn build_tools(build: bool) -> Result<Tools> {
    if build {
        let status = Command::new("cargo")
            .current_dir(ebpf::workspace_root())
            .args([
                "build",
                "--release",
                "--locked",
                "-p",
                "flexinfer-test-support",
            ])
            .args(["--bin", "sse-upstream", "--bin", "sse-load"])
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("cargo build --release -p flexinfer-test-support failed ({status})");
        }
    }
    let dir = ebpf::target_dir().join("release");
    let tools = Tools {
        upstream: dir.join("sse-upstream"),
        load: dir.join("sse-load"),
    };
    for p in [&tools.upstream, &tools.load] {
        if !p.exists() {
            bail!("{} not found (run without --no-build)", p.display());
        }
    }
    Ok(tools)
}

/// The modes and targets named (all of a kind when none is).
fn select(modes: &[String], only: &[String]) -> Result<(Vec<Mode>, Vec<Target>)> {
    fn pick<T: Copy>(
        all: &[T],
        names: &[String],
        name: fn(T) -> &'static str,
        flag: &str,
    ) -> Result<Vec<T>> {
        if let Some(bad) = names
            .iter()
            .find(|n| !all.iter().any(|x| name(*x) == n.as_str()))
        {
            let known: Vec<&str> = all.iter().map(|x| name(*x)).collect();
            bail!("{flag} {bad}: not one of {}", known.join(", "));
        }
        let picked: Vec<T> = all
            .iter()
            .copied()
            .filter(|x| names.is_empty() || names.iter().any(|n| n == name(*x)))
            .collect();
        Ok(picked)
    }
    Ok((
        pick(&MODES, modes, Mode::name, "--modes")?,
        pick(&TARGETS, only, Target::name, "--only")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_modes_and_targets_by_name() {
        let (m, t) = select(&[], &[]).unwrap();
        assert_eq!((m.len(), t.len()), (6, 5));
        let (m, t) = select(&["bulk".into()], &["haproxy".into(), "direct".into()]).unwrap();
        assert_eq!(m, vec![Mode::Bulk]);
        assert_eq!(
            t,
            vec![Target::Direct, Target::Haproxy],
            "in the table's order"
        );
        assert!(select(&["scale".into()], &[]).is_err());
        assert!(select(&[], &["envoy".into()]).is_err());
    }
}
