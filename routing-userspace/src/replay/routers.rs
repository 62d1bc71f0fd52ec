//! The routers of a replay: N proxies in front of the same simulated pods, as a DaemonSet of
//! N nodes runs them. Each has what a real node's proxy has and nothing more: its own router
//! (the one `serve` runs), routing table, cache-aware index and in-flight gauge (the requests
//! it sent), and its own view of the engines' reports ([`super::reports`]), late by the
//! report delay. Request `i` goes through router `i mod N`, as stateless frontends spread
//! over the nodes send it. Each answer's usage (its cached prompt tokens) goes back to the
//! router that sent it, as the proxy reads it off the response stream.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

use super::chat::ChatRenderer;
use super::fleet::{Placement, Pod, Served};
use super::placement::{pod_addr, MODEL};
use super::reports::{engine_state, Due, ReportKinds, ReportSchedule};
use super::trace::TraceRequest;
use crate::body::BodyFields;
use crate::discovery::ModelSpec;
use crate::keys::{self, RequestParts};
use crate::load::userspace::{InFlight, UserspaceGauge};
use crate::metrics::Metrics;
use crate::router::health::EjectionPolicy;
use crate::router::{Attempt, Decision, Router, RoutingKnobs};
use crate::signals::fleet::FleetPlace;
use crate::signals::scrape::report_validity;
use crate::signals::store::DEFAULT_STALENESS;
use crate::signals::{ScrapeConfig, SignalStore, Source, Usage};
use crate::table::{Route, RoutingTable};
use crate::vocab::{Outcome, Strategy};

/// How the routers hear of the pods' load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportSettings {
    pub kinds: ReportKinds,
    /// From a pod's state to the router that reads it.
    pub delay: Duration,
    /// Scrapes per pod per second for the whole fleet of routers (`serve`'s budget).
    pub scrape_budget: f64,
    /// How long an in-band report counts (`serve`'s `--engine-report-staleness`).
    pub staleness: Duration,
}

impl Default for ReportSettings {
    fn default() -> Self {
        Self {
            kinds: ReportKinds::Both,
            delay: Duration::from_millis(50),
            scrape_budget: ScrapeConfig::default().budget,
            staleness: DEFAULT_STALENESS,
        }
    }
}

/// One node's proxy.
struct Node {
    router: Router,
    /// The requests this proxy sent, in flight (what its eBPF gauge would count on its node).
    gauge: Arc<UserspaceGauge>,
    route: Route,
}

impl Node {
    fn new(strategy: Strategy, pods: usize, knobs: RoutingKnobs, staleness: Duration) -> Self {
        let spec = Routers::model_spec(strategy, pods);
        let metrics = Metrics::new(10_000);
        let (table, _) = RoutingTable::of_models(vec![spec], &metrics, knobs.label_group_mode);
        let route = table.lookup(MODEL).expect("the replayed model");
        let gauge = Arc::new(UserspaceGauge::default());
        let signals = Arc::new(SignalStore::new(staleness, gauge.clone()));
        let router = Router::with_signals(gauge.clone(), signals, knobs, EjectionPolicy::DEFAULT);
        Self {
            router,
            gauge,
            route,
        }
    }

    fn model(&self) -> &crate::table::ModelRoute {
        match &self.route {
            Route::Model(m) => m,
            Route::Group(_) => unreachable!("the replay routes one model"),
        }
    }
}

/// A request on its way: who sent it where, and what the router holds for it.
struct Sent {
    node: usize,
    pod: usize,
    decision: Decision,
    _in_flight: Option<InFlight>,
}

/// N routers placing the trace's requests on one fleet.
pub struct Routers {
    nodes: Vec<Node>,
    strategy: Strategy,
    chat: ChatRenderer,
    headers: HeaderMap,
    reports: ReportSchedule,
    /// How long a scraped report counts (as `serve` computes it for its interval).
    scrape_validity: Duration,
    /// Each router's interval between two reads of one pod.
    scrape_every: Duration,
    block_tokens: u64,
    /// Simulated time zero.
    base: Instant,
    sent: Vec<Option<Sent>>,
    draws: u64,
    /// Decisions the hash-balance bound moved.
    pub spills: u64,
}

impl Routers {
    /// The replayed model: `strategy` over `pods` pods, no Service.
    pub fn model_spec(strategy: Strategy, pods: usize) -> ModelSpec {
        let mut spec = ModelSpec::new(MODEL);
        spec.routing = strategy;
        spec.endpoints = (0..pods).map(pod_addr).collect();
        spec
    }

    /// `routers` proxies routing one model of `strategy` over `pods` pods with no Service
    /// (default routing is then round-robin over the pods, as without a Service in `serve`).
    pub fn new(
        (strategy, knobs): (Strategy, RoutingKnobs),
        (routers, pods): (usize, usize),
        reports: ReportSettings,
        chat: ChatRenderer,
        requests: usize,
    ) -> Self {
        let routers = routers.max(1);
        let defaults = ScrapeConfig::default();
        let every =
            crate::signals::scrape::interval(routers, reports.scrape_budget, defaults.min_interval);
        // Every node knows the fleet's size and its own rank, as discovery counts them in a
        // cluster.
        let fleet = Arc::new(AtomicUsize::new(routers));
        Self {
            nodes: (0..routers)
                .map(|rank| {
                    let mut node = Node::new(strategy, pods, knobs, reports.staleness);
                    node.router.set_fleet(FleetPlace {
                        size: Arc::clone(&fleet),
                        rank: Arc::new(AtomicUsize::new(rank)),
                    });
                    node
                })
                .collect(),
            strategy,
            block_tokens: chat.block_tokens() as u64,
            chat,
            headers: HeaderMap::new(),
            reports: ReportSchedule::new(
                reports.kinds,
                routers,
                reports.delay.as_micros() as u64,
                every.map(|e| e.as_micros() as u64),
            ),
            scrape_validity: every.map_or(reports.staleness, |e| {
                report_validity(e, reports.staleness, defaults.max_report_age)
            }),
            scrape_every: every.unwrap_or(Duration::MAX),
            base: Instant::now(),
            sent: (0..requests).map(|_| None).collect(),
            draws: 0,
            spills: 0,
        }
    }

    fn at(&self, us: u64) -> Instant {
        self.base + Duration::from_micros(us)
    }

    /// Scrape rounds and reports due by `now_us` reach their routers' signal stores.
    fn deliver(&mut self, now_us: u64, pods: &[Pod]) {
        for (r, round_us) in self.reports.scrape_rounds(now_us) {
            let at = self.at(round_us);
            for (p, pod) in pods.iter().enumerate() {
                let signals = self.nodes[r].router.signals();
                let Some(slot) = self.nodes[r].model().pods[p].slot else {
                    continue;
                };
                if signals.wants_scrape(slot, at, self.scrape_every) {
                    let state = engine_state(pod.running(), pod.waiting());
                    let stamp = signals.stamp(slot, Source::Scrape, at);
                    self.reports.scraped(r, p, state, round_us, stamp);
                }
            }
        }
        while let Some(due) = self.reports.next_due(now_us) {
            self.hear(due);
        }
    }

    fn hear(&self, due: Due) {
        let node = &self.nodes[due.router];
        let Some(slot) = node.model().pods[due.pod].slot else {
            return;
        };
        let signals = node.router.signals();
        match due.stamp {
            Some(stamp) => signals.record(slot, &due.report, stamp, self.scrape_validity),
            None => signals.report(slot, &due.report, due.source, self.at(due.at_us)),
        }
    }
}

impl Placement for Routers {
    fn place(&mut self, index: usize, r: &TraceRequest, now_us: u64, pods: &[Pod]) -> usize {
        self.deliver(now_us, pods);
        let now = self.at(now_us);
        let n = index % self.nodes.len();
        let node = &self.nodes[n];
        node.router.sweep(now);
        let limits = &node.router.knobs().limits;
        let body =
            keys::needs_body(self.strategy, &self.headers, limits).then(|| self.chat.body(r));
        let fields = body
            .as_deref()
            .and_then(|b| BodyFields::parse(b.as_bytes()));
        let parts = RequestParts {
            headers: &self.headers,
            body: fields.as_ref(),
            model: Some(MODEL),
        };
        // The random draw of session requests without a key: a fixed sequence, so runs repeat.
        self.draws = self.draws.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut d = node.router.decide(&node.route, &parts, self.draws, now);
        if d.outcome() == Outcome::Spill {
            self.spills += 1;
        }
        let attempt = match d.next_attempt() {
            Some(a @ Attempt::Pod(_)) => a,
            // No pod was picked (no key and no Service cannot happen here): the first pod.
            _ => Attempt::Pod(0),
        };
        // The request starts on its pod now, exactly as the proxy starts it.
        let in_flight = d.start_on(attempt, &node.gauge);
        let pod = match attempt {
            Attempt::Pod(i) => i,
            Attempt::Service => 0,
        };
        self.sent[index] = Some(Sent {
            node: n,
            pod,
            decision: d,
            _in_flight: in_flight,
        });
        pod
    }

    fn accepted(&mut self, index: usize, now_us: u64, pods: &[Pod]) {
        if let Some(s) = &self.sent[index] {
            let state = engine_state(pods[s.pod].running(), pods[s.pod].waiting());
            self.reports.response(s.node, s.pod, state, now_us);
        }
    }

    fn finished(&mut self, index: usize, served: &Served, now_us: u64, pods: &[Pod]) {
        self.deliver(now_us, pods);
        let Some(s) = self.sent[index].take() else {
            return;
        };
        let prompt_tokens = served.blocks * self.block_tokens;
        let usage = Usage {
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: Some((served.hit_blocks * self.block_tokens).min(prompt_tokens)),
        };
        // What the answer reported teaches the router that sent it (and only that one).
        self.nodes[s.node]
            .router
            .cache_feedback(&s.decision, s.pod, &usage);
    }
}
