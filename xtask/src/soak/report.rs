//! The soak's report: requests by model and mode with latencies, failures by cause and by the
//! churn that explains them, per churn kind what was in flight, the proxy's own account, its
//! gauges after the run and its RSS, and the verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use flexinfer_test_support::harness::report::fixed;
use flexinfer_test_support::harness::stats::{quantile, sorted};

use super::churn::{Event, Kind};
use super::clients::Record;
use super::gauges::Gauges;
use super::{Soak, MODELS};

/// Why a failed request failed, as far as the churn explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Blame {
    /// `x-sim-pod` names a pod that was SIGKILLed while the request was in flight.
    KilledPod,
    /// No `x-sim-pod` (no head from the pod), and a pod of its model was killed meanwhile.
    KillUnreported,
    /// In flight while a pod of its model was being removed gracefully.
    Removal,
    /// In flight while a pod of its model was being added.
    Add,
    /// No churn event of its model while it was in flight.
    Steady,
}

impl Blame {
    pub(super) fn name(self) -> &'static str {
        match self {
            Blame::KilledPod => "on a killed pod (x-sim-pod)",
            Blame::KillUnreported => "during a kill, pod not reported",
            Blame::Removal => "during a graceful removal",
            Blame::Add => "during an add",
            Blame::Steady => "no churn in flight",
        }
    }
}

pub(super) fn overlaps(r: &Record, e: &Event) -> bool {
    r.model == e.model && r.start <= e.done && e.at <= r.end
}

pub(super) fn blame(r: &Record, events: &[Event]) -> Blame {
    let in_flight_at = |e: &Event| r.start <= e.done && e.at <= r.end;
    let kills = || events.iter().filter(|e| e.kind == Kind::Kill);
    if let Some(pod) = &r.pod {
        if kills().any(|e| e.pod == *pod && in_flight_at(e)) {
            return Blame::KilledPod;
        }
    } else if kills().any(|e| e.model == r.model && in_flight_at(e)) {
        return Blame::KillUnreported;
    }
    let by = |k: Kind| events.iter().any(|e| e.kind == k && overlaps(r, e));
    if by(Kind::Remove) {
        Blame::Removal
    } else if by(Kind::Add) {
        Blame::Add
    } else {
        Blame::Steady
    }
}

pub(super) struct Summary {
    pub records: Vec<Record>,
    pub events: Vec<Event>,
    pub gauges_after: Gauges,
    pub settled_after: Option<Duration>,
    pub rss_kib: (u64, u64, u64),
    pub upstream_failures: BTreeMap<String, u64>,
    pub killed_addrs: Vec<String>,
    pub mode: String,
}

const BLAMES: [Blame; 5] = [
    Blame::KilledPod,
    Blame::KillUnreported,
    Blame::Removal,
    Blame::Add,
    Blame::Steady,
];

/// The report's text, and whether the run passed.
pub(super) fn report(s: &Summary, args: &Soak, wall: Duration) -> (String, bool) {
    let mut t = String::new();
    let total = s.records.len();
    let ok = s.records.iter().filter(|r| r.outcome.is_ok()).count();
    let _ = writeln!(
        t,
        "{} clients ({} streaming), {:.0} s of load, seed {}, {}; {} requests, {} ok, {} failed",
        args.clients,
        args.clients / 2,
        wall.as_secs_f64(),
        args.seed,
        s.mode,
        total,
        ok,
        total - ok
    );
    latencies(&mut t, s);
    let blame_totals = failures(&mut t, s, ok);
    churn_kinds(&mut t, s);
    proxy_state(&mut t, s);
    let pass = verdict(&mut t, s, &blame_totals);
    (t, pass)
}

/// Requests, failures and latency (p50, p99 of the successful ones) per model and mode.
fn latencies(t: &mut String, s: &Summary) {
    t.push_str("\n| model | mode | requests | ok | failed | p50 s | p99 s |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for (m, (name, _)) in MODELS.iter().enumerate() {
        for stream in [false, true] {
            let rs: Vec<&Record> = s
                .records
                .iter()
                .filter(|r| r.model == m && r.stream == stream)
                .collect();
            let lat = sorted(
                rs.iter()
                    .filter(|r| r.outcome.is_ok())
                    .map(|r| (r.end - r.start).as_secs_f64()),
            );
            let good = rs.iter().filter(|r| r.outcome.is_ok()).count();
            let _ = writeln!(
                t,
                "| {name} | {} | {} | {good} | {} | {} | {} |",
                if stream { "stream (SSE)" } else { "non-stream" },
                rs.len(),
                rs.len() - good,
                fixed(quantile(&lat, 0.5), 3),
                fixed(quantile(&lat, 0.99), 3)
            );
        }
    }
}

/// Failures by cause and by what the churn says about them; the totals per [`BLAMES`].
fn failures(t: &mut String, s: &Summary, ok: usize) -> [usize; 5] {
    let mut by_cause: BTreeMap<String, [usize; 5]> = BTreeMap::new();
    let mut blame_totals = [0usize; 5];
    for r in s.records.iter().filter(|r| !r.outcome.is_ok()) {
        let b = blame(r, &s.events);
        let i = BLAMES.iter().position(|x| *x == b).expect("listed");
        by_cause.entry(r.outcome.cause()).or_default()[i] += 1;
        blame_totals[i] += 1;
    }
    t.push_str("\n| outcome | requests |");
    for b in BLAMES {
        let _ = write!(t, " {} |", b.name());
    }
    t.push_str("\n| --- | --- |");
    t.push_str(&" --- |".repeat(BLAMES.len()));
    t.push('\n');
    let _ = writeln!(t, "| ok | {ok} |{}", " |".repeat(BLAMES.len()));
    for (cause, counts) in &by_cause {
        let n: usize = counts.iter().sum();
        let _ = write!(t, "| {cause} | {n} |");
        for c in counts {
            let _ = write!(t, " {c} |");
        }
        t.push('\n');
    }
    blame_totals
}

/// Per churn kind: events, what the sims had in flight, and the requests that overlapped.
fn churn_kinds(t: &mut String, s: &Summary) {
    t.push_str("\n| churn | events | sim in flight at the event | requests in flight on the pod (x-sim-pod) | requests of its model in flight | failed of those |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for kind in [Kind::Add, Kind::Remove, Kind::Kill] {
        let evs: Vec<&Event> = s.events.iter().filter(|e| e.kind == kind).collect();
        let sim: u64 = evs.iter().filter_map(|e| e.sim_in_flight).sum();
        let on_pod = s
            .records
            .iter()
            .filter(|r| {
                evs.iter().any(|e| {
                    r.pod.as_deref() == Some(e.pod.as_str()) && r.start <= e.at && e.at <= r.end
                })
            })
            .count();
        let of_model: Vec<&Record> = s
            .records
            .iter()
            .filter(|r| evs.iter().any(|e| overlaps(r, e)))
            .collect();
        let failed = of_model.iter().filter(|r| !r.outcome.is_ok()).count();
        let sim_cell = if kind == Kind::Add {
            "-".to_owned()
        } else {
            sim.to_string()
        };
        let _ = writeln!(
            t,
            "| {} | {} | {sim_cell} | {on_pod} | {} | {failed} |",
            kind.name(),
            evs.len(),
            of_model.len()
        );
    }
    for e in s.events.iter().filter(|e| !e.note.is_empty()) {
        let _ = writeln!(
            t,
            "\nnote: {} {} at {:.1} s: {}",
            e.kind.name(),
            e.pod,
            e.at.as_secs_f64(),
            e.note
        );
    }
}

/// The proxy's own account of upstream failures, its gauges after the run and its RSS.
fn proxy_state(t: &mut String, s: &Summary) {
    let (mut on_killed, mut on_others) = (0u64, 0u64);
    for (target, n) in &s.upstream_failures {
        if s.killed_addrs.contains(target) {
            on_killed += n;
        } else {
            on_others += n;
        }
    }
    let _ = writeln!(
        t,
        "\nproxy log, `upstream request failed` warnings: {on_killed} on killed pods, {on_others} on other targets"
    );
    let g = &s.gauges_after;
    let _ = writeln!(
        t,
        "\nafter the run{}: /debug/routing active {} in_flight_here {} reservations {} reservations_pending {}; /metrics flexinfer_proxy_active_connections {}{}",
        match s.settled_after {
            Some(d) => format!(" (all zero {:.1} s after the last client finished)", d.as_secs_f64()),
            None => " (NOT all zero within 20 s)".to_owned(),
        },
        g.active,
        g.in_flight_here,
        g.reservations,
        g.reservations_pending,
        g.active_connections,
        match g.ebpf {
            Some((tracked, a, f)) => format!(
                "; ebpf status: tracked connections {tracked}, active {a}, in_flight {f}"
            ),
            None => String::new(),
        }
    );
    let (start, peak, end) = s.rss_kib;
    let _ = writeln!(
        t,
        "\nproxy RSS (VmRSS): start {:.1} MiB, peak {:.1} MiB, end {:.1} MiB",
        start as f64 / 1024.0,
        peak as f64 / 1024.0,
        end as f64 / 1024.0
    );
}

/// The verdict line (no failure outside requests in flight on killed pods, gauges back to
/// 0); whether the run passed.
fn verdict(t: &mut String, s: &Summary, blame_totals: &[usize; 5]) -> bool {
    let removal_failures = blame_totals[2];
    let unexplained = blame_totals[2] + blame_totals[3] + blame_totals[4];
    let mut verdict = Vec::new();
    if removal_failures > 0 {
        verdict.push(format!(
            "{removal_failures} failures during graceful removals (target 0)"
        ));
    }
    if unexplained > removal_failures {
        verdict.push(format!(
            "{} failures not on a killed pod (target 0)",
            unexplained - removal_failures
        ));
    }
    if s.settled_after.is_none() {
        verdict.push("gauges or reservations did not return to 0".into());
    }
    let pass = verdict.is_empty();
    let _ = writeln!(
        t,
        "\nverdict: {}",
        if pass {
            "PASS: no failure outside requests in flight on killed pods; gauges back to 0"
                .to_owned()
        } else {
            format!("FAIL: {}", verdict.join("; "))
        }
    );
    pass
}

/// One line per churn event (for `events.txt`).
pub(super) fn events_text(events: &[Event]) -> String {
    let mut text = String::new();
    for e in events {
        let _ = writeln!(
            text,
            "{:>7.2}s {:>7.2}s {:<16} {:<20} {:<8} sim_in_flight={:?} {}",
            e.at.as_secs_f64(),
            e.done.as_secs_f64(),
            e.kind.name(),
            MODELS[e.model].0,
            e.pod,
            e.sim_in_flight,
            e.note
        );
    }
    text
}

pub(super) fn records_csv(records: &[Record]) -> String {
    let mut s = String::from("model,stream,start_ms,end_ms,pod,outcome\n");
    for r in records {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            MODELS[r.model].0,
            r.stream,
            r.start.as_millis(),
            r.end.as_millis(),
            r.pod.as_deref().unwrap_or(""),
            r.outcome.cause().replace(',', ";")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::clients::Outcome;

    #[test]
    fn blames_failures_on_the_churn_they_overlap() {
        let s = |ms| Duration::from_millis(ms);
        let rec = |pod: Option<&str>, start, end| Record {
            model: 0,
            stream: true,
            start: s(start),
            end: s(end),
            pod: pod.map(str::to_owned),
            outcome: Outcome::Cut { stream: true },
        };
        let ev = |kind, pod: &str, at, done| Event {
            kind,
            model: 0,
            pod: pod.into(),
            at: s(at),
            done: s(done),
            sim_in_flight: None,
            note: String::new(),
        };
        let events = [
            ev(Kind::Kill, "ll-1", 1000, 1010),
            ev(Kind::Remove, "ll-2", 3000, 4000),
            ev(Kind::Add, "ll-3", 6000, 6500),
        ];
        assert_eq!(
            blame(&rec(Some("ll-1"), 900, 1100), &events),
            Blame::KilledPod
        );
        // The kill spans from the signal to the reaped process: a stream that broke inside
        // it, or a request that reached the dying pod then, is on the killed pod.
        assert_eq!(
            blame(&rec(Some("ll-1"), 1004, 1008), &events),
            Blame::KilledPod
        );
        assert_eq!(blame(&rec(None, 900, 1100), &events), Blame::KillUnreported);
        assert_eq!(blame(&rec(Some("ll-4"), 900, 1100), &events), Blame::Steady);
        assert_eq!(
            blame(&rec(Some("ll-2"), 3500, 3600), &events),
            Blame::Removal
        );
        assert_eq!(blame(&rec(None, 6400, 7000), &events), Blame::Add);
        assert_eq!(blame(&rec(None, 8000, 9000), &events), Blame::Steady);
    }
}
