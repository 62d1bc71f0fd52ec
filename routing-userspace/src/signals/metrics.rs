//! The metric families of engine signals, and the handles resolved from them per pod, so the
//! request path and the scraper only increment counters they already hold.
//!
//! Labels stay bounded: `model` and `target` (the pod's `ip:port`) as elsewhere, plus a small
//! fixed set (`source`, `result`, `state`, `cache`). The gauges (report ages, engine counts, KV
//! use) are set from the [`SignalStore`] when `/metrics` is rendered ([`EngineFamilies::refresh`]),
//! not per request.

use std::time::Instant;

use prometheus::core::Collector;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGaugeVec, Opts};

use super::report::Source;
use super::store::{ReportView, SignalStore};
use super::usage::Usage;
use crate::load::Slot;

/// How a scrape ended (the `result` label of `flexinfer_proxy_engine_scrapes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeResult {
    Ok,
    /// No connection, or it broke before an answer.
    Connect,
    /// The time cap passed.
    Timeout,
    /// An answer other than 200.
    Status,
    /// The page passed the size cap.
    TooLarge,
    /// The page served no sane load gauge of the engine.
    Invalid,
}

impl ScrapeResult {
    pub const ALL: [ScrapeResult; 6] = [
        ScrapeResult::Ok,
        ScrapeResult::Connect,
        ScrapeResult::Timeout,
        ScrapeResult::Status,
        ScrapeResult::TooLarge,
        ScrapeResult::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ScrapeResult::Ok => "ok",
            ScrapeResult::Connect => "connect",
            ScrapeResult::Timeout => "timeout",
            ScrapeResult::Status => "status",
            ScrapeResult::TooLarge => "too_large",
            ScrapeResult::Invalid => "invalid",
        }
    }
}

/// Reads one value of a report.
type Pick = fn(&ReportView) -> Option<f64>;

/// Every engine-signal family; register [`EngineFamilies::collectors`] once.
#[derive(Debug, Clone)]
pub struct EngineFamilies {
    pub reports_total: IntCounterVec,
    pub reports_rejected_total: IntCounterVec,
    pub scrapes_total: IntCounterVec,
    pub slot_prompt_reads_total: IntCounterVec,
    pub prompt_tokens_total: IntCounterVec,
    pub report_age_seconds: GaugeVec,
    pub requests: IntGaugeVec,
    pub kv_cache_usage_ratio: GaugeVec,
}

impl Default for EngineFamilies {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineFamilies {
    pub fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            GaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        Self {
            reports_total: counter(
                "flexinfer_proxy_engine_reports_total",
                "Engine load reports kept, by source (inband: the endpoint-load-metrics response header; scrape: the pod's metrics page)",
                &["model", "target", "source"],
            ),
            reports_rejected_total: counter(
                "flexinfer_proxy_engine_reports_rejected_total",
                "Engine load reports present but without one sane number (malformed, NaN, negative, too large), by source",
                &["model", "target", "source"],
            ),
            scrapes_total: counter(
                "flexinfer_proxy_engine_scrapes_total",
                "Engine metrics page reads by result (ok, connect, timeout, status, too_large, invalid)",
                &["model", "target", "result"],
            ),
            slot_prompt_reads_total: counter(
                "flexinfer_proxy_engine_slot_prompt_reads_total",
                "Reads of a llama.cpp pod's /slots page by result (ok: its slots' prompts were read; hidden: the page shows none, or there is no page; failed)",
                &["model", "target", "result"],
            ),
            prompt_tokens_total: counter(
                "flexinfer_proxy_engine_prompt_tokens_total",
                "Prompt tokens of responses that reported usage, by cache (hit: served from the engine's prefix cache; miss: computed; unknown: the engine did not say)",
                &["model", "target", "cache"],
            ),
            report_age_seconds: gauge(
                "flexinfer_proxy_engine_report_age_seconds",
                "Age of the pod's last engine load report, by source",
                &["model", "target", "source"],
            ),
            requests: IntGaugeVec::new(
                Opts::new(
                    "flexinfer_proxy_engine_requests",
                    "Requests the pod's engine reported, by state (running, waiting), from its freshest report carrying each",
                ),
                &["model", "target", "state"],
            )
            .expect("valid metric"),
            kv_cache_usage_ratio: gauge(
                "flexinfer_proxy_engine_kv_cache_usage_ratio",
                "KV-cache use the pod's engine reported (0 to 1), from its freshest report carrying it",
                &["model", "target"],
            ),
        }
    }

    /// Each family, boxed for a registry (call twice for a registry and a listing).
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reports_total.clone()),
            Box::new(self.reports_rejected_total.clone()),
            Box::new(self.scrapes_total.clone()),
            Box::new(self.slot_prompt_reads_total.clone()),
            Box::new(self.prompt_tokens_total.clone()),
            Box::new(self.report_age_seconds.clone()),
            Box::new(self.requests.clone()),
            Box::new(self.kv_cache_usage_ratio.clone()),
        ]
    }

    /// Set the gauges from the store for `pods` (`(model, target, slot)`), dropping series of
    /// pods no longer listed. Called when `/metrics` is rendered.
    pub fn refresh<'a>(
        &self,
        store: &SignalStore,
        pods: impl IntoIterator<Item = (&'a str, &'a str, Slot)>,
        now: Instant,
    ) {
        self.report_age_seconds.reset();
        self.requests.reset();
        self.kv_cache_usage_ratio.reset();
        for (model, target, slot) in pods {
            let Some(view) = store.snapshot(slot, now) else {
                continue;
            };
            let reports = [(Source::InBand, view.inband), (Source::Scrape, view.scrape)];
            for (source, r) in &reports {
                if let Some(r) = r {
                    self.report_age_seconds
                        .with_label_values(&[model, target, source.as_str()])
                        .set(r.age_seconds);
                }
            }
            // The freshest report that carries each value (stale ones are not shown).
            let newest = |pick: Pick| {
                reports
                    .iter()
                    .filter_map(|(_, r)| r.filter(|r| r.fresh))
                    .filter_map(|r| pick(&r).map(|v| (r.age_seconds, v)))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, v)| v)
            };
            let counts: [(&str, Pick); 2] = [
                ("running", |r| r.running.map(|n| n as f64)),
                ("waiting", |r| r.waiting.map(|n| n as f64)),
            ];
            for (state, pick) in counts {
                if let Some(n) = newest(pick) {
                    self.requests
                        .with_label_values(&[model, target, state])
                        .set(n as i64);
                }
            }
            if let Some(kv) = newest(|r| r.kv_usage) {
                self.kv_cache_usage_ratio
                    .with_label_values(&[model, target])
                    .set(kv);
            }
        }
    }
}

/// What the request path records for one pod of one model (resolved at table build).
#[derive(Debug, Clone)]
pub struct PodSignalMetrics {
    /// In-band reports kept.
    pub inband_reports: IntCounter,
    /// `endpoint-load-metrics` headers that held no sane report.
    pub inband_rejected: IntCounter,
    prompt_hit: IntCounter,
    prompt_miss: IntCounter,
    prompt_unknown: IntCounter,
}

impl PodSignalMetrics {
    pub fn resolve(f: &EngineFamilies, model: &str, target: &str) -> Self {
        let tokens = |cache: &str| {
            f.prompt_tokens_total
                .with_label_values(&[model, target, cache])
        };
        Self {
            inband_reports: f.reports_total.with_label_values(&[
                model,
                target,
                Source::InBand.as_str(),
            ]),
            inband_rejected: f.reports_rejected_total.with_label_values(&[
                model,
                target,
                Source::InBand.as_str(),
            ]),
            prompt_hit: tokens("hit"),
            prompt_miss: tokens("miss"),
            prompt_unknown: tokens("unknown"),
        }
    }

    /// Count a response's prompt tokens by whether the engine's cache served them.
    pub fn record_usage(&self, u: &Usage) {
        match u.cached_tokens {
            Some(cached) => {
                self.prompt_hit.inc_by(cached);
                self.prompt_miss
                    .inc_by(u.prompt_tokens.saturating_sub(cached));
            }
            None => self.prompt_unknown.inc_by(u.prompt_tokens),
        }
    }
}

/// What the scraper records for one pod.
#[derive(Debug, Clone)]
pub struct ScrapeMetrics {
    reports: IntCounter,
    rejected: IntCounter,
    /// By [`ScrapeResult::ALL`] order.
    results: [IntCounter; 6],
    /// `/slots` reads: ok, hidden, failed.
    slot_reads: [IntCounter; 3],
}

/// How a `/slots` read ended (the `result` label of
/// `flexinfer_proxy_engine_slot_prompt_reads_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotReadResult {
    Ok = 0,
    Hidden = 1,
    Failed = 2,
}

impl SlotReadResult {
    pub const ALL: [SlotReadResult; 3] = [Self::Ok, Self::Hidden, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Hidden => "hidden",
            Self::Failed => "failed",
        }
    }
}

impl ScrapeMetrics {
    pub fn resolve(f: &EngineFamilies, model: &str, target: &str) -> Self {
        let source = Source::Scrape.as_str();
        Self {
            reports: f.reports_total.with_label_values(&[model, target, source]),
            rejected: f
                .reports_rejected_total
                .with_label_values(&[model, target, source]),
            results: ScrapeResult::ALL.map(|r| {
                f.scrapes_total
                    .with_label_values(&[model, target, r.as_str()])
            }),
            slot_reads: SlotReadResult::ALL.map(|r| {
                f.slot_prompt_reads_total
                    .with_label_values(&[model, target, r.as_str()])
            }),
        }
    }

    /// Count one `/slots` read.
    pub fn record_slots(&self, result: SlotReadResult) {
        self.slot_reads[result as usize].inc();
    }

    /// Count one scrape; a page read but holding no sane gauge also counts as a rejected
    /// report.
    pub fn record(&self, result: ScrapeResult) {
        self.results[result as usize].inc();
        match result {
            ScrapeResult::Ok => self.reports.inc(),
            ScrapeResult::Invalid => self.rejected.inc(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::{Encoder, Registry, TextEncoder};

    use super::*;
    use crate::signals::EngineReport;

    fn render(f: &EngineFamilies) -> String {
        let r = Registry::new();
        for c in f.collectors() {
            r.register(c).unwrap();
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn handles_count_and_gauges_follow_the_store() {
        let f = EngineFamilies::new();
        let pod = PodSignalMetrics::resolve(&f, "m", "10.0.0.1:8000");
        pod.record_usage(&Usage {
            prompt_tokens: 100,
            completion_tokens: 5,
            cached_tokens: Some(64),
        });
        pod.record_usage(&Usage {
            prompt_tokens: 10,
            completion_tokens: 1,
            cached_tokens: None,
        });
        pod.inband_reports.inc();
        let scrape = ScrapeMetrics::resolve(&f, "m", "10.0.0.1:8000");
        scrape.record(ScrapeResult::Ok);
        scrape.record(ScrapeResult::Invalid);
        scrape.record(ScrapeResult::Timeout);

        let local = std::sync::Arc::new(crate::load::userspace::UserspaceGauge::default());
        let store = SignalStore::new(Duration::from_secs(2), local);
        let t0 = Instant::now();
        let report = EngineReport {
            running: Some(3),
            waiting: Some(1),
            kv_usage: Some(0.5),
        };
        store.report(7, &report, Source::InBand, t0);
        f.refresh(
            &store,
            [("m", "10.0.0.1:8000", 7)],
            t0 + Duration::from_millis(500),
        );
        let text = render(&f);
        for line in [
            r#"flexinfer_proxy_engine_prompt_tokens_total{cache="hit",model="m",target="10.0.0.1:8000"} 64"#,
            r#"flexinfer_proxy_engine_prompt_tokens_total{cache="miss",model="m",target="10.0.0.1:8000"} 36"#,
            r#"flexinfer_proxy_engine_prompt_tokens_total{cache="unknown",model="m",target="10.0.0.1:8000"} 10"#,
            r#"flexinfer_proxy_engine_reports_total{model="m",source="inband",target="10.0.0.1:8000"} 1"#,
            r#"flexinfer_proxy_engine_reports_total{model="m",source="scrape",target="10.0.0.1:8000"} 1"#,
            r#"flexinfer_proxy_engine_reports_rejected_total{model="m",source="scrape",target="10.0.0.1:8000"} 1"#,
            r#"flexinfer_proxy_engine_scrapes_total{model="m",result="timeout",target="10.0.0.1:8000"} 1"#,
            r#"flexinfer_proxy_engine_scrapes_total{model="m",result="connect",target="10.0.0.1:8000"} 0"#,
            r#"flexinfer_proxy_engine_report_age_seconds{model="m",source="inband",target="10.0.0.1:8000"} 0.5"#,
            r#"flexinfer_proxy_engine_requests{model="m",state="running",target="10.0.0.1:8000"} 3"#,
            r#"flexinfer_proxy_engine_requests{model="m",state="waiting",target="10.0.0.1:8000"} 1"#,
            r#"flexinfer_proxy_engine_kv_cache_usage_ratio{model="m",target="10.0.0.1:8000"} 0.5"#,
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        }
        // A pod no longer listed loses its gauges; a stale report shows its age, no counts.
        f.refresh(&store, [], t0);
        assert!(!render(&f).contains("flexinfer_proxy_engine_requests{"));
        f.refresh(&store, [("m", "p", 7)], t0 + Duration::from_secs(5));
        let text = render(&f);
        assert!(text.contains(
            r#"flexinfer_proxy_engine_report_age_seconds{model="m",source="inband",target="p"} 5"#
        ));
        assert!(!text.contains("flexinfer_proxy_engine_requests{"), "{text}");
    }
}
