//! The spec's metric families ("Monitoring"), registered once, plus the latency histograms
//! its PromQL uses and a few operator gauges. Label values use the spec's words.

pub mod cardinality;

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use cardinality::{CardinalityTracker, Observed};

/// Latency buckets (seconds) sized for LLM requests: milliseconds to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub struct Metrics {
    registry: Registry,
    pub requests_total: IntCounterVec,
    pub active_connections: IntGaugeVec,
    pub label_group_route_decisions_total: IntCounterVec,
    pub label_group_route_target_hits_total: IntCounterVec,
    pub least_loaded_reservations_total: IntCounterVec,
    pub least_loaded_reservations_expired_total: IntCounterVec,
    pub routing_decisions_total: IntCounterVec,
    pub routing_target_hits_total: IntCounterVec,
    pub routing_key_cardinality: GaugeVec,
    pub routing_key_cardinality_overflow_total: IntCounterVec,
    pub request_duration_seconds: HistogramVec,
    pub time_to_first_byte_seconds: HistogramVec,
    pub upstream_connect_errors_total: IntCounterVec,
    pub ready_endpoints: IntGaugeVec,
    pub ebpf_enabled: IntGauge,
    cardinality_cap: usize,
    trackers: Mutex<HashMap<(String, String, String), CardinalityTracker>>,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        labels,
    )
    .expect("valid metric");
    r.register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    pub fn new(cardinality_cap: usize) -> Self {
        let r = Registry::new();
        let routing_key_cardinality = GaugeVec::new(
            Opts::new(
                "flexinfer_proxy_routing_key_cardinality",
                "Approximate unique routing-key count per source (bounded in-memory tracker)",
            ),
            &["model", "strategy", "key_source"],
        )
        .expect("valid metric");
        r.register(Box::new(routing_key_cardinality.clone()))
            .expect("metric registered once");
        let ebpf_enabled = IntGauge::new(
            "flexinfer_proxy_ebpf_enabled",
            "1 when the eBPF connection gauge drives least-loaded picks, 0 on the userspace gauge",
        )
        .expect("valid metric");
        r.register(Box::new(ebpf_enabled.clone()))
            .expect("metric registered once");
        Self {
            requests_total: counter(&r, "flexinfer_proxy_requests_total", "Total requests per model (by status)", &["model", "status"]),
            active_connections: gauge(&r, "flexinfer_proxy_active_connections", "Current connections per model", &["model"]),
            label_group_route_decisions_total: counter(
                &r,
                "flexinfer_proxy_label_group_route_decisions_total",
                "Shared-label decisions; least_loaded confirms active-load selection",
                &["label", "strategy", "outcome"],
            ),
            label_group_route_target_hits_total: counter(
                &r,
                "flexinfer_proxy_label_group_route_target_hits_total",
                "Shared-label traffic distribution by selected Model",
                &["label", "strategy", "model"],
            ),
            least_loaded_reservations_total: counter(
                &r,
                "flexinfer_proxy_least_loaded_reservations_total",
                "Least-loaded pick reservations recorded per model (burst-spread placeholders ahead of the connection gauge)",
                &["model"],
            ),
            least_loaded_reservations_expired_total: counter(
                &r,
                "flexinfer_proxy_least_loaded_reservations_expired_total",
                "Reservations that expired before a real connection consumed them",
                &["model"],
            ),
            routing_decisions_total: counter(
                &r,
                "flexinfer_proxy_routing_decisions_total",
                "Routing decisions by strategy and key source (outcome: pod or service-fallback)",
                &["model", "strategy", "key_source", "outcome"],
            ),
            routing_target_hits_total: counter(
                &r,
                "flexinfer_proxy_routing_target_hits_total",
                "Route-hit distribution by selected target (target is pod IP:port or service-dns)",
                &["model", "strategy", "target"],
            ),
            routing_key_cardinality,
            routing_key_cardinality_overflow_total: counter(
                &r,
                "flexinfer_proxy_routing_key_cardinality_overflow_total",
                "Number of times cardinality tracking reached its cap",
                &["model", "strategy", "key_source"],
            ),
            request_duration_seconds: histogram(
                &r,
                "flexinfer_proxy_request_duration_seconds",
                "Request duration from arrival to the end of the response body",
                &["model"],
            ),
            time_to_first_byte_seconds: histogram(
                &r,
                "flexinfer_proxy_time_to_first_byte_seconds",
                "Time from arrival to the first response body byte (time to first token when streaming)",
                &["model"],
            ),
            upstream_connect_errors_total: counter(
                &r,
                "flexinfer_proxy_upstream_connect_errors_total",
                "Upstream connection attempts that failed before any byte was sent",
                &["model", "target"],
            ),
            ready_endpoints: gauge(&r, "flexinfer_proxy_ready_endpoints", "Ready pod endpoints per model", &["model"]),
            ebpf_enabled,
            registry: r,
            cardinality_cap,
            trackers: Mutex::new(HashMap::new()),
        }
    }

    /// Count a routing key for the cardinality tracker.
    pub fn observe_key(&self, model: &str, strategy: &str, key_source: &str, hash: u64) {
        let mut trackers = self.trackers.lock().expect("tracker lock");
        let id = (model.to_owned(), strategy.to_owned(), key_source.to_owned());
        let t = trackers
            .entry(id)
            .or_insert_with(|| CardinalityTracker::new(self.cardinality_cap));
        let observed = t.observe(hash);
        let labels = [model, strategy, key_source];
        if observed == Observed::Overflow {
            self.routing_key_cardinality_overflow_total
                .with_label_values(&labels)
                .inc();
        }
        if observed != Observed::Known {
            self.routing_key_cardinality
                .with_label_values(&labels)
                .set(t.estimate());
        }
    }

    /// Upper bound of the memory the key trackers may hold, in bytes.
    pub fn cardinality_memory_bound(&self) -> usize {
        let trackers = self.trackers.lock().expect("tracker lock");
        trackers
            .values()
            .map(CardinalityTracker::memory_bound)
            .sum()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}
