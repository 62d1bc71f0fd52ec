//! The figures of one scenario from its request records and the pods' counts, and the
//! markdown table of all scenarios. B's wait is its latency minus the backend's service time
//! (the time it spent queued, plus the proxy's and loopback's share, which is about a
//! millisecond here); the target is wait p95 <= 1.5x the service time.

use std::collections::BTreeMap;
use std::time::Duration;

use flexinfer_test_support::harness::report::{fixed, Table};
use flexinfer_test_support::harness::stats::{quantile, sorted};

use super::load::{Record, Tenant};

/// What one tenant got.
#[derive(Debug, Clone, Default)]
pub(super) struct TenantFigures {
    pub sent: usize,
    /// Answers by status; `unanswered` counts failed exchanges.
    pub by_status: BTreeMap<u16, usize>,
    pub unanswered: usize,
    /// Of the 200s, seconds.
    pub latency_p50: f64,
    pub latency_p95: f64,
    /// Of the 200s, latency minus the service time, seconds.
    pub wait_p50: f64,
    pub wait_p95: f64,
    /// The slowest 429, seconds (NaN without one).
    pub slowest_429: f64,
}

impl TenantFigures {
    pub(super) fn of(records: &[Record], tenant: Tenant, service: Duration) -> Self {
        let mine: Vec<&Record> = records.iter().filter(|r| r.tenant == tenant).collect();
        let mut f = TenantFigures {
            sent: mine.len(),
            ..Default::default()
        };
        for r in &mine {
            match r.status {
                Some(s) => *f.by_status.entry(s).or_default() += 1,
                None => f.unanswered += 1,
            }
        }
        let ok = |r: &&&Record| r.status == Some(200);
        let lat = sorted(mine.iter().filter(ok).map(|r| r.latency.as_secs_f64()));
        let svc = service.as_secs_f64();
        let wait: Vec<f64> = lat.iter().map(|l| (l - svc).max(0.0)).collect();
        f.latency_p50 = quantile(&lat, 0.5);
        f.latency_p95 = quantile(&lat, 0.95);
        f.wait_p50 = quantile(&wait, 0.5);
        f.wait_p95 = quantile(&wait, 0.95);
        f.slowest_429 = mine
            .iter()
            .filter(|r| r.status == Some(429))
            .map(|r| r.latency.as_secs_f64())
            .fold(f64::NAN, f64::max);
        f
    }

    /// `150 sent: 200: 148, 429: 2` (and `unanswered: n` when any).
    pub(super) fn answers(&self) -> String {
        format!("{} sent: {}", self.sent, self.statuses())
    }

    /// `200: 148, 429: 2` (and `unanswered: n` when any).
    pub(super) fn statuses(&self) -> String {
        let mut parts: Vec<String> = self
            .by_status
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        if self.unanswered > 0 {
            parts.push(format!("unanswered: {}", self.unanswered));
        }
        parts.join(", ")
    }
}

/// One scenario's figures.
#[derive(Debug, Clone)]
pub(super) struct Figures {
    pub scenario: &'static str,
    pub service: Duration,
    pub a: TenantFigures,
    pub b: TenantFigures,
    /// The most requests each pod held at once.
    pub max_per_pod: Vec<usize>,
    /// `flexinfer_proxy_admission_rejections_total` by reason (non-zero ones).
    pub rejections: Vec<(String, f64)>,
}

fn ms(secs: f64) -> String {
    if secs.is_finite() {
        fixed(secs * 1000.0, 0)
    } else {
        "-".into()
    }
}

pub(super) fn render(rows: &[Figures]) -> String {
    let mut t = Table::new([
        "scenario",
        "B answers",
        "B wait p50 / p95 ms",
        "B wait p95 / service",
        "B latency p50 / p95 ms",
        "A answers",
        "A latency p50 / p95 ms",
        "max per pod",
        "slowest 429 ms",
        "rejections",
    ]);
    for f in rows {
        let ratio = f.b.wait_p95 / f.service.as_secs_f64();
        let slowest = f.a.slowest_429.max(f.b.slowest_429);
        let rejections: Vec<String> = f
            .rejections
            .iter()
            .map(|(reason, n)| format!("{reason}: {n}"))
            .collect();
        t.row([
            f.scenario.to_string(),
            f.b.answers(),
            format!("{} / {}", ms(f.b.wait_p50), ms(f.b.wait_p95)),
            if ratio.is_finite() {
                format!("{ratio:.2}x")
            } else {
                "-".into()
            },
            format!("{} / {}", ms(f.b.latency_p50), ms(f.b.latency_p95)),
            f.a.answers(),
            format!("{} / {}", ms(f.a.latency_p50), ms(f.a.latency_p95)),
            format!("{:?}", f.max_per_pod),
            ms(slowest),
            if rejections.is_empty() {
                "none".into()
            } else {
                rejections.join(", ")
            },
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tenant: Tenant, ms: u64, status: Option<u16>) -> Record {
        Record {
            tenant,
            sent: Duration::ZERO,
            latency: Duration::from_millis(ms),
            status,
        }
    }

    #[test]
    fn waits_are_latency_minus_service_over_the_200s_only() {
        let records = [
            rec(Tenant::B, 500, Some(200)),
            rec(Tenant::B, 600, Some(200)),
            rec(Tenant::B, 900, Some(200)),
            rec(Tenant::B, 30_100, Some(429)),
            rec(Tenant::B, 10, None),
            rec(Tenant::A, 5_000, Some(200)),
        ];
        let f = TenantFigures::of(&records, Tenant::B, Duration::from_millis(500));
        assert_eq!(f.sent, 5);
        assert_eq!(f.statuses(), "200: 3, 429: 1, unanswered: 1");
        assert!((f.wait_p50 - 0.1).abs() < 1e-9, "{}", f.wait_p50);
        assert!((f.wait_p95 - 0.4).abs() < 1e-9, "{}", f.wait_p95);
        assert!((f.latency_p50 - 0.6).abs() < 1e-9);
        assert!((f.slowest_429 - 30.1).abs() < 1e-9);
        let a = TenantFigures::of(&records, Tenant::A, Duration::from_millis(500));
        assert_eq!((a.sent, a.statuses()), (1, "200: 1".to_string()));
        assert!(a.slowest_429.is_nan());
    }
}
