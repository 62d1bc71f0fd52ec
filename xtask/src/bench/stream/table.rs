//! The tables of `bench stream`, one per mode: throughput (events/s, the proxy's CPU per
//! event against haproxy's), scale (memory per open stream, the delay each event gets and
//! what the proxy adds to it against direct), idle (memory per idle client connection).

use flexinfer_test_support::harness::report::{fixed, Table};

use super::modes::Mode;
use super::sample::Sample;
use super::targets::Target;

/// One mode's samples, in target order.
pub(super) type Rows = [(Target, Sample)];

fn find(rows: &Rows, t: Target) -> Option<&Sample> {
    rows.iter().find(|(x, _)| *x == t).map(|(_, s)| s)
}

fn ms(us: f64) -> String {
    fixed(us / 1000.0, 2)
}

/// `x / haproxy's x`, e.g. `1.53x`.
fn vs(v: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 && v.is_finite() => format!("{:.2}x", v / b),
        _ => "-".into(),
    }
}

fn pct(share: f64) -> String {
    if share.is_finite() {
        format!("{:.0}%", share * 100.0)
    } else {
        "-".into()
    }
}

pub(super) fn render(mode: Mode, rows: &Rows) -> String {
    match mode {
        Mode::Paced | Mode::Bulk => throughput(rows),
        Mode::Scale1k | Mode::Scale8k => scale(mode, rows),
        Mode::Idle | Mode::IdleUsed => idle(rows),
    }
}

fn throughput(rows: &Rows) -> String {
    let base = find(rows, Target::Haproxy).map(Sample::cpu_us_per_event);
    let mut t = Table::new([
        "target",
        "what",
        "events/s",
        "proxy CPU us/event",
        "/ haproxy",
        "proxy core busy",
        "delay p50 / p99 ms",
        "load gen + upstream core busy",
        "errors",
    ]);
    for (target, s) in rows {
        let cpu = s.cpu_us_per_event();
        t.row([
            format!("`{}`", target.name()),
            target.what().to_owned(),
            fixed(s.events_per_s(), 0),
            fixed(cpu, 3),
            vs(cpu, base),
            pct(s.core_share("proxy")),
            format!(
                "{} / {}",
                ms(s.get("delay_p50_us")),
                ms(s.get("delay_p99_us"))
            ),
            pct(s.core_share("self") + s.core_share("upstream")),
            fixed(s.errors(), 0),
        ]);
    }
    t.render()
}

fn scale(mode: Mode, rows: &Rows) -> String {
    let direct = find(rows, Target::Direct);
    let added = |s: &Sample, key: &str| match direct {
        Some(d) => ms(s.get(key) - d.get(key)),
        None => "-".into(),
    };
    let pacing_us = mode.pacing().1.as_micros() as f64;
    let mut t = Table::new([
        "target",
        "streams open",
        "events/s",
        "RSS per stream KiB",
        "proxy CPU us/event",
        "proxy core busy",
        "delay p50 / p99 ms",
        "added p50 / p99 ms (vs direct)",
        "gap p99 - pacing ms",
        "errors",
    ]);
    for (target, s) in rows {
        t.row([
            format!("`{}`", target.name()),
            fixed(s.get("opened"), 0),
            fixed(s.events_per_s(), 0),
            fixed(s.rss_kib_per_connection(), 1),
            fixed(s.cpu_us_per_event(), 3),
            pct(s.core_share("proxy")),
            format!(
                "{} / {}",
                ms(s.get("delay_p50_us")),
                ms(s.get("delay_p99_us"))
            ),
            format!(
                "{} / {}",
                added(s, "delay_p50_us"),
                added(s, "delay_p99_us")
            ),
            ms(s.get("gap_p99_us") - pacing_us),
            fixed(s.errors(), 0),
        ]);
    }
    t.render()
}

fn idle(rows: &Rows) -> String {
    let mut t = Table::new([
        "target",
        "idle connections",
        "still open after the window",
        "RSS per idle connection KiB",
    ]);
    for (target, s) in rows.iter().filter(|(t, _)| *t != Target::Direct) {
        t.row([
            format!("`{}`", target.name()),
            fixed(s.get("connections"), 0),
            fixed(s.get("still_open"), 0),
            fixed(s.rss_kib_per_connection(), 2),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kv: &str) -> Sample {
        Sample::parse(&format!("RESULT {kv}")).unwrap()
    }

    #[test]
    fn ratios_and_added_delay() {
        let base = "connections=10 opened=10 window_us=1000000 events=1000 self_cpu_us=100000 upstream_cpu_us=100000";
        let rows = vec![
            (Target::Direct, sample(&format!("{base} delay_p50_us=100 delay_p99_us=400 gap_p99_us=20500"))),
            (Target::Haproxy, sample(&format!("{base} proxy_cpu_us=10000 delay_p50_us=300 delay_p99_us=900 gap_p99_us=21000 proxy_rss_idle_kib=100 proxy_rss_end_kib=200"))),
        ];
        let t = render(Mode::Paced, &rows);
        assert!(
            t.contains("| `haproxy` |") && t.contains("| 10.000 | 1.00x | 1% |"),
            "{t}"
        );
        assert!(t.contains("| 20% |"), "load side share: {t}");
        let s = render(Mode::Scale1k, &rows);
        assert!(s.contains("| 0.20 / 0.50 |"), "added vs direct: {s}");
        assert!(s.contains("| 10.0 |"), "RSS per stream: {s}");
        assert!(s.contains("| 1.00 |"), "gap p99 minus 20 ms pacing: {s}");
        let i = render(Mode::Idle, &rows);
        assert!(
            !i.contains("direct") && i.contains("| `haproxy` | 10 |"),
            "{i}"
        );
    }
}
