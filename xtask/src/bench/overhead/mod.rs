//! `cargo xtask bench overhead`: what flexinfer-proxy costs per request next to nginx, haproxy
//! and smg, in front of upstreams so fast that the proxy's own work is what gets measured.
//!
//! The upstreams are one nginx serving a fixed chat completion on three loopback ports (it
//! answers in microseconds; a simulated model server would hide the proxy). Every proxy runs
//! one worker thread and routes one model over the three upstreams, per case: a session header
//! with a small body (consistent hashing on `X-Session-ID`), a ~4 KB chat body (flexinfer
//! routes it by its prefix, the header proxies by the session header), least-loaded, and `sdk`:
//! the session case from a client that sends the header fields the OpenAI Python SDK sends (15
//! in all, where wrk's own head has four).
//! wrk -t1 and the upstreams share CPU 0; the proxy under test has CPU 1 to itself, so its
//! requests per second are what one core of it serves. Configurations are interleaved round by
//! round so drift hits all alike; the table gives the median and min..max over rounds, and
//! raw output goes to `<target>/bench-overhead/<unix time>/`.
//!
//! The files: `targets` (what is compared), `configs` (the peers' and upstreams' configs, the
//! wrk script), `sample` (one measured run), `table`; processes start through
//! [`crate::bench::peers`].
//!
//! The `fx-trace-0`, `fx-trace-0.1` and `fx-trace-1` rows are `fx-userspace` exporting OpenTelemetry traces to
//! an OTLP/HTTP sink in the upstreams' nginx (on CPU 0, beside wrk), sampling none, one in ten
//! (`fx-trace-0.1`) or every request; `<tag>-trace-spans.txt` shows what was exported and dropped.
//!
//! The default-flags row runs as root with no `--gauge` flag, so the proxy loads its eBPF gauge;
//! it attaches to a child cgroup of this harness with a pin dir of its own, both removed after
//! the run (and, if a run was killed, by the next one). Only loopback addresses are used.

mod configs;
mod sample;
mod shared;
mod table;
mod targets;

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::report::RunDir;
use flexinfer_test_support::{is_root, TempDir};

use crate::bench::peers;
use crate::ebpf;
use sample::{run_one, Sample};
use table::{cpu_cell, render_table};
use targets::{Case, Target, CASES, TARGETS};

#[derive(clap::Args)]
pub(crate) struct OverheadBench {
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Warm-up seconds before each measured run (not recorded).
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Rounds (each selected configuration and case once per round).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Connections wrk keeps open (closed loop: this many requests always in flight).
    #[arg(long, default_value_t = 32)]
    pub connections: u32,
    /// Only these configurations and/or cases, comma-separated (configurations: direct, nginx,
    /// haproxy, smg, fx-userspace, fx-default, fx-trace-0, fx-trace-0.1, fx-trace-1; cases: session, prefix,
    /// least-loaded, sdk). A kind not named is not filtered.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
    /// Measure this flexinfer-proxy binary instead of the release build (nothing is built),
    /// e.g. the profile-guided one `cargo xtask pgo` writes.
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<std::path::PathBuf>,
    /// Run each configuration at the same moments as this one (e.g. haproxy, fx-userspace),
    /// both on the proxy CPU in CPU cgroups of equal weight, each under its own wrk and
    /// upstreams, and report the ratio of their request rates: their CPU cost per request
    /// compared with the machine's drift cancelled (this one beside itself, if selected, shows
    /// the method's spread). Needs root (cgroups).
    #[arg(long, value_name = "CONFIG")]
    pub shared_core_with: Option<String>,
}

/// Prefix of the cgroups and pin dirs this harness creates (`<prefix>-<pid>-<n>`).
const PREFIX: &str = "flexinfer-bench";

/// What the runs share.
struct Env<'a> {
    bin: &'a Path,
    smg: Option<&'a Path>,
    tmp: &'a Path,
    out: &'a Path,
    args: &'a OverheadBench,
}

pub(crate) fn run(args: &OverheadBench) -> Result<()> {
    let (targets, cases) = select(&args.only)?;
    let reference = args
        .shared_core_with
        .as_deref()
        .map(|name| shared_reference(name, &targets))
        .transpose()?;
    crate::setup::ensure_apt(&["nginx", "haproxy", "wrk"])?;
    let root = is_root();
    if reference.is_some() && !root {
        bail!("--shared-core-with puts each proxy in a CPU cgroup: run it as root");
    }
    let bin = ebpf::proxy_to_measure(args.proxy_bin.as_deref(), !args.no_build, root)?;
    if root {
        peers::remove_stale(PREFIX, "bench overhead");
    }
    let base = ebpf::target_dir().join("bench-overhead");
    let mut skipped: Vec<String> = Vec::new();
    let smg = if targets.contains(&Target::Smg) {
        match peers::install_smg(&base) {
            Ok(p) => Some(p),
            Err(e) => {
                skipped.push(format!("smg: not measured, it did not install: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    let targets = runnable(targets, smg.is_some(), &mut skipped);
    if targets.is_empty() || cases.is_empty() {
        bail!("nothing to run: {}", skipped.join("; "));
    }
    let out = RunDir::create(&base)?;
    let [nginx, haproxy] = peers::PEER_TOOLS;
    let tools = [nginx, haproxy, ("wrk", &["wrk", "-v"][..])];
    out.stamp(&peers::versions(&tools, smg.as_deref()))?;
    let tmp = TempDir::try_new("bench")?;
    let env = Env {
        bin: &bin,
        smg: smg.as_deref(),
        tmp: tmp.path(),
        out: out.path(),
        args,
    };
    println!(
        "bench overhead: {} connections, {}s warm-up + {}s measured, {} rounds; raw output in {}",
        args.connections,
        args.warmup,
        args.duration,
        args.rounds,
        out.path().display()
    );
    let mut table = match reference {
        Some(reference) => shared::render(
            &shared::rounds(reference, &targets, &cases, &env)?,
            reference,
        ),
        None => render_table(&rounds(&targets, &cases, &env)?),
    };
    for s in &skipped {
        let _ = writeln!(table, "\n{s}");
    }
    out.write("table.md", &table)?;
    println!("\n{table}");
    Ok(())
}

/// The targets that can run here: smg only if it installed, fx-default only where BPF works
/// (root, the `bpf()` syscall and a cgroup2 mount; the others are named in `skipped`).
fn runnable(targets: Vec<Target>, smg: bool, skipped: &mut Vec<String>) -> Vec<Target> {
    let no_bpf = targets
        .contains(&Target::FxDefault)
        .then(peers::fx_default_unavailable)
        .flatten();
    targets
        .into_iter()
        .filter(|t| match t {
            Target::Smg => smg,
            Target::FxDefault => match &no_bpf {
                Some(note) => {
                    skipped.push(note.clone());
                    false
                }
                None => true,
            },
            _ => true,
        })
        .collect()
}

/// Every (case, target) once per round, rounds interleaved so drift hits all alike.
fn rounds(
    targets: &[Target],
    cases: &[Case],
    env: &Env,
) -> Result<Vec<(Case, Target, Vec<Sample>)>> {
    let mut rows: Vec<(Case, Target, Vec<Sample>)> = Vec::new();
    for &case in cases {
        for &t in targets {
            rows.push((case, t, Vec::new()));
        }
    }
    for round in 1..=env.args.rounds {
        for (case, target, samples) in rows.iter_mut() {
            let tag = format!("{}-{}-r{round}", case.name(), target.name());
            let s = run_one(*target, *case, &tag, env)
                .with_context(|| format!("{} / {} (round {round})", case.name(), target.name()))?;
            println!(
                "  {:<13} {:<13} round {round}: {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  proxy CPU {}  errors {} non-2xx {}",
                case.name(),
                target.name(),
                s.rps(),
                s.p50_us as f64 / 1e3,
                s.p99_us as f64 / 1e3,
                cpu_cell(&[s]),
                s.errors,
                s.non2xx
            );
            samples.push(s);
        }
    }
    Ok(rows)
}

/// The reference configuration of `--shared-core-with`: one with a proxy process of its own
/// (not `direct`), and not `fx-default`, whose cgroup holds its upstreams for the eBPF gauge.
/// Selected itself, it runs beside itself: the method's own spread.
fn shared_reference(name: &str, targets: &[Target]) -> Result<Target> {
    let Some(reference) = TARGETS.into_iter().find(|t| t.name() == name) else {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
        bail!("--shared-core-with {name}: not one of {}", names.join(", "));
    };
    for t in targets.iter().copied().chain([reference]) {
        if matches!(t, Target::Direct | Target::FxDefault) {
            bail!(
                "--shared-core-with: {} cannot share the core (direct has no proxy; fx-default's \
                 cgroup holds its upstreams for the eBPF gauge); leave it out with --only",
                t.name()
            );
        }
    }
    Ok(reference)
}

/// Split `--only` into the configurations and cases it names (all of a kind it does not name).
fn select(only: &[String]) -> Result<(Vec<Target>, Vec<Case>)> {
    for o in only {
        let known = TARGETS.iter().any(|t| t.name() == o) || CASES.iter().any(|c| c.name() == o);
        if !known {
            let names: Vec<&str> = TARGETS
                .iter()
                .map(|t| t.name())
                .chain(CASES.iter().map(|c| c.name()))
                .collect();
            bail!("--only {o}: not one of {}", names.join(", "));
        }
    }
    let named = |n: &str| only.iter().any(|o| o == n);
    let mut targets: Vec<Target> = TARGETS.into_iter().filter(|t| named(t.name())).collect();
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let mut cases: Vec<Case> = CASES.into_iter().filter(|c| named(c.name())).collect();
    if cases.is_empty() {
        cases = CASES.to_vec();
    }
    Ok((targets, cases))
}

#[cfg(test)]
mod tests {
    use super::configs::{haproxy_conf, nginx_proxy_conf};
    use super::targets::{prefix_body, small_body, COMPLETION, MODEL};
    use super::*;
    use flexinfer_test_support::loopback;

    #[test]
    fn parses_the_done_line() {
        let s = Sample::parse(
            "Running 10s test\nBENCH requests=1000 duration_us=2000000 errors=1 non2xx=2 p50_us=900 p99_us=3000\n",
        )
        .unwrap();
        assert_eq!(s.requests, 1000);
        assert_eq!(s.rps(), 500.0);
        assert_eq!((s.errors, s.non2xx, s.p50_us, s.p99_us), (1, 2, 900, 3000));
        assert!(Sample::parse("no line").is_err());
    }

    #[test]
    fn bodies_have_the_issues_sizes_and_quote_safely() {
        let p = prefix_body();
        assert!((3900..=4300).contains(&p.len()), "{}", p.len());
        let s = small_body();
        assert!(s.len() < 200, "{}", s.len());
        for b in [&p, &s] {
            assert!(
                !b.contains("]==]"),
                "the Lua long string must not end early"
            );
            let v: serde_json::Value = serde_json::from_str(b).unwrap();
            assert_eq!(v["model"], MODEL);
        }
        // nginx's return '...' needs the completion free of single quotes.
        assert!(!COMPLETION.contains('\''));
        serde_json::from_str::<serde_json::Value>(COMPLETION).unwrap();
    }

    #[test]
    fn only_filters_each_kind_it_names() {
        let (t, c) = select(&[]).unwrap();
        assert_eq!((t.len(), c.len()), (TARGETS.len(), CASES.len()));
        let (t, c) = select(&["haproxy".into(), "fx-default".into()]).unwrap();
        assert_eq!(t, vec![Target::Haproxy, Target::FxDefault]);
        assert_eq!(c.len(), CASES.len());
        let (t, c) = select(&["prefix".into()]).unwrap();
        assert_eq!((t.len(), c), (TARGETS.len(), vec![Case::Prefix]));
        let (t, _) = select(&["fx-trace-0.1".into()]).unwrap();
        assert_eq!(t, vec![Target::FxTraceTenth]);
        assert!(select(&["fx-ebpf".into()]).is_err());
    }

    #[test]
    fn a_shared_core_reference_has_a_proxy_and_others_beside_it() {
        let t = |names: &[&str]| -> Vec<Target> {
            names
                .iter()
                .map(|n| *TARGETS.iter().find(|t| t.name() == *n).unwrap())
                .collect()
        };
        let r = shared_reference("haproxy", &t(&["haproxy", "fx-userspace", "fx-trace-1"]));
        assert_eq!(r.unwrap(), Target::Haproxy);
        assert!(shared_reference("nope", &t(&["fx-userspace"])).is_err());
        for bad in ["direct", "fx-default"] {
            assert!(
                shared_reference(bad, &t(&["fx-userspace"])).is_err(),
                "{bad}"
            );
            assert!(shared_reference("haproxy", &t(&[bad, "haproxy", "fx-userspace"])).is_err());
        }
    }

    #[test]
    fn only_the_tracing_rows_export_and_each_with_its_ratio() {
        assert!(super::sample::trace_flags(Target::FxUserspace, Some(9)).is_empty());
        let f = super::sample::trace_flags(Target::FxTrace1, Some(9));
        assert_eq!(f[1], "http://127.0.0.1:9");
        assert_eq!(f.last().map(String::as_str), Some("1.0"));
        let f = super::sample::trace_flags(Target::FxTrace0, Some(9));
        assert_eq!(f.last().map(String::as_str), Some("0"));
        let f = super::sample::trace_flags(Target::FxTraceTenth, Some(9));
        assert_eq!(f.last().map(String::as_str), Some("0.1"));
    }

    #[test]
    fn the_header_proxies_hash_the_session_header_consistently() {
        let ups = [loopback(1), loopback(2), loopback(3)];
        let n = nginx_proxy_conf(Path::new("/t"), 9, &ups, Case::Session);
        assert!(n.contains("hash $http_x_session_id consistent;") && n.contains("keepalive 64;"));
        assert_eq!(n.matches("server 127.0.0.1:").count(), 3);
        assert!(
            nginx_proxy_conf(Path::new("/t"), 9, &ups, Case::LeastLoaded).contains("least_conn;")
        );
        let h = haproxy_conf(9, &ups, Case::Prefix);
        assert!(h.contains("balance hdr(X-Session-ID)") && h.contains("hash-type consistent"));
        assert!(haproxy_conf(9, &ups, Case::LeastLoaded).contains("balance leastconn"));
    }
}
