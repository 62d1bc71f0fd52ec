//! `bench overhead --shared-core-with <config>`: each configuration runs at the same moments as
//! a reference configuration, both on the proxy CPU, each under its own wrk and upstreams.
//!
//! Why: this machine's speed drifts by a third within an hour, so two configurations measured
//! one after the other differ by more than the few percent an issue's target is about. Two
//! processes that share one core at the same time see the same drift; each in a CPU cgroup of
//! its own with equal weight gets half the core however many threads it runs (an exporter
//! thread beside the worker, say), so the ratio of their request rates is the inverse ratio of
//! their CPU cost per request, user and kernel time alike. The load side (both wrk and both
//! upstream nginx on the other CPU) must not be the limit: the table shows each proxy's share
//! of the core, which is near half when it is not.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::stats::{median, min_max};
use flexinfer_test_support::Cgroup;

use super::configs::wrk_script;
use super::sample::{evidence, preflight, start, wrk, Running, Sample};
use super::targets::{Case, Target};
use super::{Env, PREFIX};

/// A configuration's samples beside the reference's, round by round.
pub(super) type SharedRow = (Case, Target, Vec<(Sample, Sample)>);

/// Every (case, configuration) beside `reference` once per round, rounds interleaved (the
/// reference itself beside another copy of it, if selected).
pub(super) fn rounds(
    reference: Target,
    targets: &[Target],
    cases: &[Case],
    env: &Env,
) -> Result<Vec<SharedRow>> {
    let cpu = cpu_controller()?;
    for p in Cgroup::remove_stale_under(&cpu, PREFIX) {
        eprintln!(
            "bench overhead: removed {} of a run that was killed",
            p.display()
        );
    }
    let mut rows: Vec<SharedRow> = Vec::new();
    for &case in cases {
        for &t in targets {
            rows.push((case, t, Vec::new()));
        }
    }
    for round in 1..=env.args.rounds {
        for (case, target, samples) in rows.iter_mut() {
            let tag = format!(
                "{}-{}-beside-{}-r{round}",
                case.name(),
                target.name(),
                reference.name()
            );
            let (s, r) = run_pair(*target, reference, *case, &tag, &cpu, env)
                .with_context(|| format!("{} / {} (round {round})", case.name(), target.name()))?;
            println!(
                "  {:<13} {:<13} round {round}: {:>8.0} req/s beside {} {:>8.0} req/s: {:.3}",
                case.name(),
                target.name(),
                s.rps(),
                reference.name(),
                r.rps(),
                s.rps() / r.rps()
            );
            samples.push((s, r));
        }
    }
    Ok(rows)
}

/// The root of a CPU controller hierarchy whose child cgroups share the CPU by weight: the
/// cgroup v1 `cpu` mount, else the cgroup2 root if `cpu` is enabled below it.
fn cpu_controller() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    for f in mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
    {
        if f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpu") {
            return Ok(PathBuf::from(f[1]));
        }
    }
    let root = flexinfer_test_support::cgroup2_root()?;
    let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "cpu") {
        return Ok(root);
    }
    bail!(
        "--shared-core-with needs a CPU controller to give each proxy half the core: no cgroup v1 \
         `cpu` mount, and `cpu` is not in {}/cgroup.subtree_control",
        root.display()
    )
}

/// `target` and `reference` at the same time on the proxy CPU, each in a CPU cgroup of its own.
fn run_pair(
    target: Target,
    reference: Target,
    case: Case,
    tag: &str,
    cpu: &Path,
    env: &Env,
) -> Result<(Sample, Sample)> {
    let body = case.body();
    let mut sides = Vec::new();
    // Dropped after the processes in `sides` (a cgroup goes once it is empty).
    let mut groups = Vec::new();
    for (side, t) in [("a", target), ("b", reference)] {
        let side_tag = format!("{tag}-{side}");
        let dir = env.tmp.join(&side_tag);
        std::fs::create_dir_all(&dir)?;
        let run = start(t, case, &side_tag, &dir, env)?;
        let proxy = run.proxy().context("a configuration without a proxy")?;
        let group = Cgroup::create_under(cpu, PREFIX)?;
        group
            .add_pid(proxy.pid())
            .with_context(|| format!("moving {} into {}", t.name(), group.path().display()))?;
        groups.push(group);
        preflight(run.url_addr(), case, &body, t, &side_tag, env)?;
        let script = dir.join("load.lua");
        std::fs::write(&script, wrk_script(case, &body))?;
        sides.push((side_tag, t, run, script));
    }
    let both = |secs: u32, save: bool| -> Result<Vec<String>> {
        std::thread::scope(|s| {
            let runs: Vec<_> = sides
                .iter()
                .map(|(side_tag, _, run, script)| {
                    let save = save.then(|| env.out.join(format!("{side_tag}-wrk.txt")));
                    s.spawn(move || wrk(env, script, &run.url(), secs, save.as_deref()))
                })
                .collect();
            runs.into_iter()
                .map(|h| h.join().expect("a wrk thread"))
                .collect()
        })
    };
    if env.args.warmup > 0 {
        both(env.args.warmup, false)?;
    }
    let before: Vec<_> = sides.iter().map(|(_, _, r, _)| cpu_time(r)).collect();
    let texts = both(env.args.duration, true)?;
    let mut samples = Vec::new();
    for ((side_tag, t, run, _), (text, before)) in sides.iter().zip(texts.iter().zip(before)) {
        let mut s = Sample::parse(text)?;
        s.proxy_cpu = cpu_time(run).zip(before).map(|(a, b)| a.saturating_sub(b));
        evidence(run, *t, side_tag, env)?;
        samples.push(s);
    }
    drop(sides);
    drop(groups);
    Ok((samples[0], samples[1]))
}

fn cpu_time(run: &Running) -> Option<std::time::Duration> {
    run.proxy().map(|p| p.cpu_time())
}

/// Per case and configuration: its request rate over the reference's, round by round
/// (median and [min, max]), each side's rate and CPU per request, and each side's share of
/// the core (near 50% each when the proxy CPU, not the load side, was the limit).
pub(super) fn render(rows: &[SharedRow], reference: Target) -> String {
    let mut t = String::new();
    let r = reference.name();
    let _ = writeln!(
        t,
        "| case | config | req/s / `{r}` beside it, median [min, max] | req/s median | `{r}` req/s median | CPU us/req | `{r}` CPU us/req | core share (each) | errors + non-2xx |"
    );
    t.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (case, target, pairs) in rows {
        let ratios: Vec<f64> = pairs.iter().map(|(s, r)| s.rps() / r.rps()).collect();
        let (lo, hi) = min_max(&ratios);
        let of = |f: fn(&(Sample, Sample)) -> Option<f64>| {
            let v: Vec<f64> = pairs.iter().filter_map(f).collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(&v))
            }
        };
        let share = |s: &Sample| {
            s.proxy_core_share()
                .map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
        };
        let last = pairs.last();
        let _ = writeln!(
            t,
            "| {} | `{}` | {:.3} [{:.3}, {:.3}] | {:.0} | {:.0} | {} | {} | {} | {} |",
            case.name(),
            target.name(),
            median(&ratios),
            lo,
            hi,
            median(&pairs.iter().map(|(s, _)| s.rps()).collect::<Vec<_>>()),
            median(&pairs.iter().map(|(_, r)| r.rps()).collect::<Vec<_>>()),
            of(|(s, _)| s.cpu_us_per_request()),
            of(|(_, r)| r.cpu_us_per_request()),
            last.map_or("-".into(), |(s, r)| format!(
                "{} / {} (last round)",
                share(s),
                share(r)
            )),
            pairs
                .iter()
                .map(|(s, r)| s.errors + s.non2xx + r.errors + r.non2xx)
                .sum::<u64>(),
        );
    }
    t
}
