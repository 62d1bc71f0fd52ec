//! Metric handles resolved once per model, pod and label group when a routing table is built,
//! so the request path only increments counters it already holds: it never formats a label
//! or looks a series up. Which series exist (at zero) follows [`crate::rules`], the same rules
//! the router decides by.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

use super::keys::ModelKeys;
use super::Metrics;
use crate::rules::{can_spill, possible_decisions};
use crate::signals::PodSignalMetrics;
use crate::vocab::{GroupOutcome, KeySource, LabelGroupMode, Outcome, Strategy};

/// Per-model counters of reservations made, consumed and expired.
#[derive(Debug, Clone)]
pub struct ReservationCounters {
    pub made: IntCounter,
    pub consumed: IntCounter,
    pub expired: IntCounter,
}

impl ReservationCounters {
    /// Counters that belong to no registry (tests, benches).
    pub fn detached() -> Arc<Self> {
        let c = || IntCounter::new("reservations", "reservations").expect("valid counter");
        Arc::new(Self {
            made: c(),
            consumed: c(),
            expired: c(),
        })
    }
}

/// `requests_total{model,status}`: `200` resolved up front (a series at zero, so `rate()` works
/// from the first scrape), every other status resolved the first time it is seen, then kept.
#[derive(Debug)]
pub struct StatusCounters {
    vec: IntCounterVec,
    model: Arc<str>,
    ok: std::sync::OnceLock<IntCounter>,
    others: RwLock<Vec<(u16, IntCounter)>>,
}

impl StatusCounters {
    /// Counters of a configured model (its `200` series exists from the start).
    pub fn new(vec: &IntCounterVec, model: &str) -> Self {
        let s = Self::lazy(vec, model);
        s.ok.get_or_init(|| vec.with_label_values(&[model, "200"]));
        s
    }

    /// Counters whose series all appear on first use.
    pub fn lazy(vec: &IntCounterVec, model: &str) -> Self {
        Self {
            vec: vec.clone(),
            model: Arc::from(model),
            ok: std::sync::OnceLock::new(),
            others: RwLock::new(Vec::new()),
        }
    }

    /// The counter of `status`.
    pub fn get(&self, status: u16) -> IntCounter {
        if status == 200 {
            return self
                .ok
                .get_or_init(|| self.vec.with_label_values(&[&*self.model, "200"]))
                .clone();
        }
        if let Some((_, c)) = self
            .others
            .read()
            .expect("status lock")
            .iter()
            .find(|(s, _)| *s == status)
        {
            return c.clone();
        }
        let c = self
            .vec
            .with_label_values(&[&*self.model, &status.to_string()]);
        self.others
            .write()
            .expect("status lock")
            .push((status, c.clone()));
        c
    }

    /// Count one request that ended with `status`.
    pub fn inc(&self, status: u16) {
        match (status, self.ok.get()) {
            (200, Some(ok)) => ok.inc(),
            _ => self.get(status).inc(),
        }
    }
}

/// Everything the request path records for one model.
#[derive(Debug)]
pub struct ModelMetrics {
    pub requests: StatusCounters,
    pub active: IntGauge,
    pub ttfb: Histogram,
    pub duration: Histogram,
    /// `routing_decisions_total` by `[key source][outcome]`; `None` where the rules say the
    /// pair cannot occur.
    decisions: DecisionCounters,
    /// `routing_spills_total`, for strategies that walk a ring.
    pub spills: Option<IntCounter>,
    /// The cache-aware series, for cache-aware models.
    pub cache_aware: Option<CacheAwareMetrics>,
    /// `routing_target_hits_total` per pod (indexed like the model's pods), then the Service.
    pub pod_hits: Vec<IntCounter>,
    pub service_hits: Option<IntCounter>,
    /// `upstream_connect_errors_total` per pod, then the Service.
    pub pod_connect_errors: Vec<IntCounter>,
    pub service_connect_errors: Option<IntCounter>,
    /// `upstream_retries_total` by reason (in `RetryReason::ALL` order).
    pub retries: [IntCounter; crate::vocab::RetryReason::ALL.len()],
    /// `outlier_ejections_total` per pod.
    pub pod_ejections: Vec<IntCounter>,
    pub reservations: Arc<ReservationCounters>,
    /// Engine signals per pod (indexed like the model's pods).
    pub pod_signals: Vec<PodSignalMetrics>,
    /// The model's key statistics (cardinality trackers and hot keys).
    pub keys: Arc<std::sync::Mutex<ModelKeys>>,
}

impl ModelMetrics {
    /// Resolve the handles of a model whose pods have the `target` labels `pods`.
    pub fn resolve(
        m: &Metrics,
        name: &Arc<str>,
        strategy: Strategy,
        pods: &[Arc<str>],
        has_service: bool,
        now: Instant,
    ) -> Self {
        let n = &**name;
        let hits = |target: &str| {
            m.spec
                .routing_target_hits_total
                .with_label_values(&[n, strategy.as_str(), target])
        };
        let errors = |target: &str| {
            m.requests
                .upstream_connect_errors_total
                .with_label_values(&[n, target])
        };
        Self {
            requests: StatusCounters::new(&m.spec.requests_total, n),
            active: m.spec.active_connections.with_label_values(&[n]),
            ttfb: m
                .requests
                .time_to_first_byte_seconds
                .with_label_values(&[n]),
            duration: m.requests.request_duration_seconds.with_label_values(&[n]),
            decisions: decision_counters(m, n, strategy, has_service),
            spills: can_spill(strategy, has_service).then(|| {
                m.balance
                    .routing_spills_total
                    .with_label_values(&[n, strategy.as_str()])
            }),
            cache_aware: (strategy == Strategy::CacheAware)
                .then(|| CacheAwareMetrics::resolve(m, n)),
            pod_hits: pods.iter().map(|p| hits(p)).collect(),
            service_hits: has_service.then(|| hits(SERVICE_TARGET)),
            pod_connect_errors: pods.iter().map(|p| errors(p)).collect(),
            service_connect_errors: has_service.then(|| errors(SERVICE_TARGET)),
            retries: crate::vocab::RetryReason::ALL.map(|r| {
                m.requests
                    .upstream_retries_total
                    .with_label_values(&[n, r.as_str()])
            }),
            pod_ejections: pods
                .iter()
                .map(|p| {
                    m.requests
                        .outlier_ejections_total
                        .with_label_values(&[n, p])
                })
                .collect(),
            reservations: ReservationCounters::resolve(m, n),
            pod_signals: pods
                .iter()
                .map(|p| PodSignalMetrics::resolve(&m.engine, n, p))
                .collect(),
            keys: m.keys.model(name, strategy, now),
        }
    }

    /// The decision counter for `(source, outcome)`; `None` only if the rules missed a case.
    pub fn decision(&self, source: KeySource, outcome: Outcome) -> Option<&IntCounter> {
        self.decisions[source.index()][outcome.index()].as_ref()
    }
}

/// Decision counters by key source and outcome: only those the rules allow for `strategy`.
type DecisionCounters = [[Option<IntCounter>; Outcome::ALL.len()]; KeySource::ALL.len()];

fn decision_counters(
    m: &Metrics,
    n: &str,
    strategy: Strategy,
    has_service: bool,
) -> DecisionCounters {
    let mut decisions: DecisionCounters = Default::default();
    for (source, outcome) in possible_decisions(strategy, has_service) {
        decisions[source.index()][outcome.index()] =
            Some(m.spec.routing_decisions_total.with_label_values(&[
                n,
                strategy.as_str(),
                source.as_str(),
                outcome.as_str(),
            ]));
    }
    decisions
}

impl CacheAwareMetrics {
    fn resolve(m: &Metrics, n: &str) -> Self {
        let lookups = |result: &str| {
            m.balance
                .cache_aware_lookups_total
                .with_label_values(&[n, result])
        };
        Self {
            depth: m.balance.cache_aware_match_depth.with_label_values(&[n]),
            matched: lookups("match"),
            missed: lookups("miss"),
            prefill_waits: PrefillWait::ALL.map(|outcome| {
                m.balance
                    .cache_aware_prefill_waits_total
                    .with_label_values(&[n, outcome.as_str()])
            }),
        }
    }
}

impl ReservationCounters {
    /// Model `n`'s counters in the spec's reservation families.
    fn resolve(m: &Metrics, n: &str) -> Arc<Self> {
        let s = &m.spec;
        Arc::new(Self {
            made: s.least_loaded_reservations_total.with_label_values(&[n]),
            consumed: s
                .least_loaded_reservations_consumed_total
                .with_label_values(&[n]),
            expired: s
                .least_loaded_reservations_expired_total
                .with_label_values(&[n]),
        })
    }
}

/// What a cache-aware model records per decision that consulted its index.
#[derive(Debug)]
pub struct CacheAwareMetrics {
    pub depth: Histogram,
    pub matched: IntCounter,
    pub missed: IntCounter,
    /// Waits for another request's prefill, by [`PrefillWait`].
    pub prefill_waits: [IntCounter; 3],
}

/// How a cache-aware request's wait for another's prefill of its prompt ended (the `outcome`
/// label of `flexinfer_proxy_cache_aware_prefill_waits_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillWait {
    /// The prompt became reusable: the first token came, the other request ended, or (on a
    /// llama.cpp slot) the waiter before this one ended.
    Prefilled = 0,
    /// `--cache-aware-prefill-wait` passed; the request was sent anyway.
    Timeout = 1,
    /// The llama.cpp slot holding the prompt stayed busy past its first token for as long as
    /// computing the prompt had taken: the request was sent to compute it again.
    Recompute = 2,
}

impl PrefillWait {
    pub const ALL: [Self; 3] = [Self::Prefilled, Self::Timeout, Self::Recompute];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefilled => "prefilled",
            Self::Timeout => "timeout",
            Self::Recompute => "recompute",
        }
    }
}

impl CacheAwareMetrics {
    /// One lookup whose chosen pod held `depth` leading links.
    pub fn observe(&self, depth: u32) {
        self.depth.observe(f64::from(depth));
        if depth > 0 {
            self.matched.inc();
        } else {
            self.missed.inc();
        }
    }
}

/// The `target` label of the Service fallback.
pub const SERVICE_TARGET: &str = "service-dns";

/// Handles of one label group.
#[derive(Debug)]
pub struct GroupMetrics {
    /// `label_group_route_decisions_total` by outcome, in [`GroupOutcome::possible`] order.
    decisions: [IntCounter; 3],
    /// `label_group_route_target_hits_total` per member (indexed like the members).
    pub member_hits: Vec<IntCounter>,
    /// `routing_spills_total{model=<label>,strategy=<mode>}` for the hashing modes.
    pub spills: Option<IntCounter>,
}

impl GroupMetrics {
    pub fn resolve(m: &Metrics, label: &str, mode: LabelGroupMode, members: &[&str]) -> Self {
        let decisions = GroupOutcome::possible(mode).map(|o| {
            m.spec
                .label_group_route_decisions_total
                .with_label_values(&[label, mode.as_str(), o.as_str()])
        });
        let hashing = matches!(mode, LabelGroupMode::Prefix | LabelGroupMode::Session);
        Self {
            decisions,
            spills: hashing.then(|| {
                m.balance
                    .routing_spills_total
                    .with_label_values(&[label, mode.as_str()])
            }),
            member_hits: members
                .iter()
                .map(|member| {
                    m.spec
                        .label_group_route_target_hits_total
                        .with_label_values(&[label, mode.as_str(), member])
                })
                .collect(),
        }
    }

    pub fn decision(&self, outcome: GroupOutcome) -> &IntCounter {
        let i = match outcome {
            GroupOutcome::Mode(_) => 0,
            GroupOutcome::PriorityPick => 1,
            GroupOutcome::ColdStart => 2,
        };
        &self.decisions[i]
    }
}
