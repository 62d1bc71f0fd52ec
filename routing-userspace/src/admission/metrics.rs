//! Admission's metric families, and the handles one model's gate records with.
//!
//! The families are created here and registered by whoever owns the registry
//! ([`AdmissionFamilies::collectors`]). A gate resolves its handles once
//! ([`GateMetrics::resolve`]); the request path then only moves atomics. Two labels are bounded:
//! `priority` is the integer clamped to `sheddable`, `0` .. `9`, `10+` (12 values), and the
//! `tenant` of the token counter is the first `cap` tenants seen per model, every later one
//! counted as `other` (as the key cardinality tracking caps what it holds exactly).
//!
//! The wait histogram ([`WaitHistogram`]) keeps the fast path cheap: a request admitted at once
//! (the common case) adds 1 to a counter instead of observing 0 in the histogram, and those
//! zero waits are folded into every bucket when `/metrics` is scraped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::rejection::Reason;

/// Queue wait buckets (seconds): a millisecond to a minute.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `priority` label values.
pub const PRIORITY_LABELS: [&str; 12] = [
    "sheddable",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "10+",
];

/// The index of a priority's label in [`PRIORITY_LABELS`].
pub fn priority_label(priority: i32) -> usize {
    match priority {
        p if p < 0 => 0,
        p if p >= 10 => 11,
        p => p as usize + 1,
    }
}

/// The `tenant` label of tenants past the cap.
pub const OTHER_TENANT: &str = "other";

/// Distinct tenant labels of `tokens_charged_total` per model, unless configured.
pub const DEFAULT_TENANT_LABEL_CAP: usize = 100;

/// `flexinfer_proxy_queue_wait_seconds{model}`: the histogram of queued waits, plus per model a
/// count of zero waits (requests admitted at once) folded into every bucket when collected.
#[derive(Clone)]
pub struct WaitHistogram {
    vec: HistogramVec,
    immediate: Arc<RwLock<HashMap<String, Arc<AtomicU64>>>>,
}

impl WaitHistogram {
    fn new() -> Self {
        Self {
            vec: HistogramVec::new(
                HistogramOpts::new(
                    "flexinfer_proxy_queue_wait_seconds",
                    "Time from arrival to admission of admitted requests (0 when no queue formed)",
                )
                .buckets(WAIT_BUCKETS.to_vec()),
                &["model"],
            )
            .expect("valid metric"),
            immediate: Arc::default(),
        }
    }

    /// The model's histogram (queued waits) and its zero-wait counter.
    fn handles(&self, model: &str) -> (Histogram, Arc<AtomicU64>) {
        let histogram = self.vec.with_label_values(&[model]);
        let mut immediate = self.immediate.write().expect("wait histogram lock");
        let zeros = Arc::clone(immediate.entry(model.to_owned()).or_default());
        (histogram, zeros)
    }

    /// Admitted requests of `model` (queued and immediate), as the scraped histogram counts.
    pub fn admitted(&self, model: &str) -> u64 {
        let queued = self.vec.with_label_values(&[model]).get_sample_count();
        let immediate = self.immediate.read().expect("wait histogram lock");
        queued
            + immediate
                .get(model)
                .map_or(0, |z| z.load(Ordering::Relaxed))
    }
}

impl Collector for WaitHistogram {
    fn desc(&self) -> Vec<&Desc> {
        self.vec.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.vec.collect();
        let immediate = self.immediate.read().expect("wait histogram lock");
        for m in families.iter_mut().flat_map(|f| f.mut_metric().iter_mut()) {
            let model = m.get_label().iter().find(|l| l.name() == "model");
            let Some(zeros) = model.and_then(|l| immediate.get(l.value())) else {
                continue;
            };
            let n = zeros.load(Ordering::Relaxed);
            let mut h = m.get_histogram().clone();
            h.set_sample_count(h.get_sample_count() + n);
            let mut buckets = h.get_bucket().to_vec();
            for b in &mut buckets {
                // A wait of 0 is under every upper bound.
                b.set_cumulative_count(b.cumulative_count() + n);
            }
            h.set_bucket(buckets);
            m.set_histogram(h);
        }
        families
    }
}

#[derive(Clone)]
pub struct AdmissionFamilies {
    pub queue_depth: IntGaugeVec,
    pub queue_wait_seconds: WaitHistogram,
    pub rejections_total: IntCounterVec,
    pub cancelled_total: IntCounterVec,
    pub tokens_charged_total: IntCounterVec,
}

impl Default for AdmissionFamilies {
    fn default() -> Self {
        Self::new()
    }
}

impl AdmissionFamilies {
    pub fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        Self {
            queue_depth: IntGaugeVec::new(
                Opts::new(
                    "flexinfer_proxy_queue_depth",
                    "Requests waiting in a model's admission queue, by priority (sheddable, 0 to 9, 10+)",
                ),
                &["model", "priority"],
            )
            .expect("valid metric"),
            queue_wait_seconds: WaitHistogram::new(),
            rejections_total: counter(
                "flexinfer_proxy_admission_rejections_total",
                "Requests admission turned away (reason: queue_full, shed, queue_timeout, rate_limited, proxy_shutdown, model_removed)",
                &["model", "reason"],
            ),
            cancelled_total: counter(
                "flexinfer_proxy_queue_cancelled_total",
                "Queued requests whose client went away before admission (they never reached a pod)",
                &["model"],
            ),
            tokens_charged_total: counter(
                "flexinfer_proxy_tokens_charged_total",
                "Tokens charged to token budgets (the estimate, corrected from usage), by tenant (the first tenants per model; later ones are other)",
                &["model", "tenant"],
            ),
        }
    }

    /// Every family, for the registry's owner to register once.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.queue_depth.clone()),
            Box::new(self.queue_wait_seconds.clone()),
            Box::new(self.rejections_total.clone()),
            Box::new(self.cancelled_total.clone()),
            Box::new(self.tokens_charged_total.clone()),
        ]
    }

    /// Register every family in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for c in self.collectors() {
            registry.register(c)?;
        }
        Ok(())
    }
}

/// One model's admission handles.
#[derive(Debug)]
pub struct GateMetrics {
    model: String,
    depth_vec: IntGaugeVec,
    depth: [OnceLock<IntGauge>; 12],
    /// Waits of queued requests.
    pub wait: Histogram,
    /// Requests admitted at once (a wait of 0).
    pub immediate: Arc<AtomicU64>,
    rejections: [IntCounter; Reason::ALL.len()],
    pub cancelled: IntCounter,
}

impl GateMetrics {
    /// Resolve the model's series: depth at priority 0, the wait histogram and every rejection
    /// reason exist (at zero) from the start; other priorities appear when first queued.
    pub fn resolve(f: &AdmissionFamilies, model: &str) -> Self {
        let depth: [OnceLock<IntGauge>; 12] = Default::default();
        let _ = depth[priority_label(0)].set(f.queue_depth.with_label_values(&[model, "0"]));
        let (wait, immediate) = f.queue_wait_seconds.handles(model);
        Self {
            model: model.to_owned(),
            depth_vec: f.queue_depth.clone(),
            depth,
            wait,
            immediate,
            rejections: Reason::ALL
                .map(|r| f.rejections_total.with_label_values(&[model, r.as_str()])),
            cancelled: f.cancelled_total.with_label_values(&[model]),
        }
    }

    /// The depth gauge of `priority`'s label.
    pub fn depth(&self, priority: i32) -> &IntGauge {
        let i = priority_label(priority);
        self.depth[i].get_or_init(|| {
            self.depth_vec
                .with_label_values(&[&self.model, PRIORITY_LABELS[i]])
        })
    }

    /// A request admitted at once. Called with the gate's lock held: the writers are
    /// serialized, so a load and a store do (no locked add); the collector only loads.
    pub fn admitted_at_once(&self) {
        let n = self.immediate.load(Ordering::Relaxed);
        self.immediate.store(n + 1, Ordering::Relaxed);
    }

    pub fn rejected(&self, reason: Reason) {
        self.rejections[reason.index()].inc();
    }
}

/// `tokens_charged_total{model,tenant}` handles, the tenant label bounded by a cap.
#[derive(Debug)]
pub struct TenantCounters {
    vec: IntCounterVec,
    model: String,
    cap: usize,
    labelled: HashMap<u64, IntCounter>,
    other: Option<IntCounter>,
}

impl TenantCounters {
    pub fn new(f: &AdmissionFamilies, model: &str, cap: usize) -> Self {
        Self {
            vec: f.tokens_charged_total.clone(),
            model: model.to_owned(),
            cap,
            labelled: HashMap::new(),
            other: None,
        }
    }

    /// The counter of `tenant` (`label` is asked for only when a new series is made), or the
    /// shared `other` one past the cap.
    pub fn counter(&mut self, tenant: u64, label: impl FnOnce() -> String) -> IntCounter {
        if let Some(c) = self.labelled.get(&tenant) {
            return c.clone();
        }
        if self.labelled.len() < self.cap {
            let c = self.vec.with_label_values(&[&self.model, &label()]);
            self.labelled.insert(tenant, c.clone());
            return c;
        }
        self.other
            .get_or_insert_with(|| self.vec.with_label_values(&[&self.model, OTHER_TENANT]))
            .clone()
    }

    /// Tenants with their own series.
    pub fn labelled(&self) -> usize {
        self.labelled.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_labels_are_bounded() {
        for (p, want) in [
            (i32::MIN, "sheddable"),
            (-1, "sheddable"),
            (0, "0"),
            (9, "9"),
            (10, "10+"),
            (i32::MAX, "10+"),
        ] {
            assert_eq!(PRIORITY_LABELS[priority_label(p)], want, "{p}");
        }
    }

    #[test]
    fn tenant_labels_stop_at_the_cap_and_the_rest_is_other() {
        let f = AdmissionFamilies::new();
        let mut t = TenantCounters::new(&f, "m", 2);
        t.counter(1, || "a".into()).inc_by(5);
        t.counter(2, || "b".into()).inc();
        t.counter(1, || unreachable!("resolved once")).inc();
        t.counter(3, || "c".into()).inc_by(2);
        t.counter(4, || "d".into()).inc_by(3);
        assert_eq!(t.labelled(), 2);
        let get = |tenant: &str| {
            f.tokens_charged_total
                .with_label_values(&["m", tenant])
                .get()
        };
        assert_eq!((get("a"), get("b"), get(OTHER_TENANT)), (6, 1, 5));
        let registry = Registry::new();
        f.register(&registry).unwrap();
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        assert!(names.contains(&"flexinfer_proxy_tokens_charged_total".to_owned()));
    }

    #[test]
    fn immediate_admissions_are_zero_waits_in_every_bucket() {
        let f = AdmissionFamilies::new();
        let g = GateMetrics::resolve(&f, "m");
        for _ in 0..3 {
            g.admitted_at_once();
        }
        g.wait.observe(0.3);
        let registry = Registry::new();
        f.register(&registry).unwrap();
        let families = registry.gather();
        let mf = families
            .iter()
            .find(|m| m.name() == "flexinfer_proxy_queue_wait_seconds")
            .unwrap();
        let h = mf.get_metric()[0].get_histogram();
        assert_eq!(h.get_sample_count(), 4);
        assert_eq!(h.get_sample_sum(), 0.3);
        let counts: Vec<(f64, u64)> = h
            .get_bucket()
            .iter()
            .map(|b| (b.upper_bound(), b.cumulative_count()))
            .collect();
        assert_eq!(counts[0], (0.001, 3));
        assert_eq!(counts.iter().find(|(le, _)| *le == 0.25).unwrap().1, 3);
        assert_eq!(counts.iter().find(|(le, _)| *le == 0.5).unwrap().1, 4);
        assert_eq!(f.queue_wait_seconds.admitted("m"), 4);
        // The text format agrees.
        let mut text = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &families, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(
                "flexinfer_proxy_queue_wait_seconds_bucket{model=\"m\",le=\"0.001\"} 3\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("flexinfer_proxy_queue_wait_seconds_count{model=\"m\"} 4\n"),
            "{text}"
        );
    }

    #[test]
    fn a_gate_starts_with_its_zero_series() {
        let f = AdmissionFamilies::new();
        let g = GateMetrics::resolve(&f, "m");
        let registry = Registry::new();
        f.register(&registry).unwrap();
        let count = |name: &str| {
            registry
                .gather()
                .iter()
                .find(|m| m.name() == name)
                .map_or(0, |m| m.get_metric().len())
        };
        assert_eq!(count("flexinfer_proxy_queue_depth"), 1);
        assert_eq!(count("flexinfer_proxy_admission_rejections_total"), 6);
        g.depth(-4).inc();
        g.depth(-1).inc();
        assert_eq!(count("flexinfer_proxy_queue_depth"), 2);
        assert_eq!(
            f.queue_depth.with_label_values(&["m", "sheddable"]).get(),
            2
        );
        g.rejected(Reason::Shed);
        assert_eq!(
            f.rejections_total.with_label_values(&["m", "shed"]).get(),
            1
        );
    }
}
