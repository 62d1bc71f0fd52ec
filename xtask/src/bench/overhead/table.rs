//! The markdown table of `bench overhead`: per case and configuration the median and
//! [min, max] over rounds, the ratios to haproxy in the same case, and the proxy's CPU.

use std::fmt::Write as _;

use flexinfer_test_support::harness::stats::{median, min_max};

use super::sample::Sample;
use super::targets::{Case, Target};

/// Median CPU microseconds per request of the proxy and the share of its core it used, e.g.
/// `33.4 (99%)`; `-` without a proxy.
pub(super) fn cpu_cell(s: &[Sample]) -> String {
    let per_req: Vec<f64> = s.iter().filter_map(Sample::cpu_us_per_request).collect();
    let share: Vec<f64> = s.iter().filter_map(Sample::proxy_core_share).collect();
    if per_req.is_empty() {
        return "-".into();
    }
    format!("{:.1} ({:.0}%)", median(&per_req), median(&share) * 100.0)
}

/// `median [min, max]` of `f` over the samples, with `digits` decimals.
fn spread_cell(s: &[Sample], f: fn(&Sample) -> f64, digits: usize) -> String {
    let v: Vec<f64> = s.iter().map(f).collect();
    let (lo, hi) = min_max(&v);
    format!(
        "{:.*} [{:.*}, {:.*}]",
        digits,
        median(&v),
        digits,
        lo,
        digits,
        hi
    )
}

pub(super) fn render_table(rows: &[(Case, Target, Vec<Sample>)]) -> String {
    let med = |s: &[Sample], f: fn(&Sample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
    let rps = |s: &Sample| s.rps();
    let p50 = |s: &Sample| s.p50_us as f64 / 1e3;
    let p99 = |s: &Sample| s.p99_us as f64 / 1e3;
    let mut t = String::new();
    t.push_str("| case | config | what | req/s median [min, max] | p50 ms median [min, max] | p99 ms median [min, max] | req/s / haproxy | p50 / haproxy | p99 / haproxy | proxy CPU us/req (core busy) | errors + non-2xx |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (case, target, s) in rows {
        let haproxy = rows
            .iter()
            .find(|(c, t, _)| c == case && *t == Target::Haproxy)
            .map(|(_, _, h)| h.as_slice());
        let ratio = |f: fn(&Sample) -> f64| match haproxy {
            Some(h) if !h.is_empty() => format!("{:.2}", med(s, f) / med(h, f)),
            _ => "-".into(),
        };
        let bad: u64 = s.iter().map(|x| x.errors + x.non2xx).sum();
        let _ = writeln!(
            t,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.name(),
            target.name(),
            target.what(*case),
            spread_cell(s, rps, 0),
            spread_cell(s, p50, 3),
            spread_cell(s, p99, 3),
            ratio(rps),
            ratio(p50),
            ratio(p99),
            cpu_cell(s),
            bad
        );
    }
    t
}
