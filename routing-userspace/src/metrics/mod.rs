//! The spec's metric families ("Monitoring"), registered once, plus the latency histograms
//! its PromQL uses and a few operator gauges. Label values use the spec's words.
//!
//! Every registered family is listed in `/metrics` (its `# HELP` and `# TYPE` lines) even while it
//! has no series yet; series themselves are only created for label values that can really occur
//! (see [`handles`], resolved when a routing table is built), at zero, so `rate()` and ratios
//! work from the first scrape.
//!
//! Routing keys feed two bounded structures per model (see [`keys`]): the cardinality trackers
//! behind `flexinfer_proxy_routing_key_cardinality` and the hot-key list of `/debug/routing`.

pub mod cardinality;
pub mod handles;
pub mod hot_keys;
pub mod keys;

use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use keys::{KeyStats, KeyTracking};

/// Buckets of the cache-aware matched depth (prompt-chain links).
const DEPTH_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Latency buckets (seconds) sized for LLM requests: milliseconds to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub struct Metrics {
    registry: Registry,
    /// Every registered family, for the header lines of the ones without series.
    collectors: Vec<Box<dyn Collector>>,
    pub requests_total: IntCounterVec,
    pub active_connections: IntGaugeVec,
    pub label_group_route_decisions_total: IntCounterVec,
    pub label_group_route_target_hits_total: IntCounterVec,
    pub least_loaded_reservations_total: IntCounterVec,
    pub least_loaded_reservations_consumed_total: IntCounterVec,
    pub least_loaded_reservations_expired_total: IntCounterVec,
    pub routing_decisions_total: IntCounterVec,
    pub routing_target_hits_total: IntCounterVec,
    pub routing_key_cardinality: GaugeVec,
    pub routing_key_cardinality_overflow_total: IntCounterVec,
    pub request_duration_seconds: HistogramVec,
    pub time_to_first_byte_seconds: HistogramVec,
    pub upstream_connect_errors_total: IntCounterVec,
    pub upstream_retries_total: IntCounterVec,
    pub outlier_ejections_total: IntCounterVec,
    pub ready_endpoints: IntGaugeVec,
    pub ebpf_enabled: IntGauge,
    /// Hash-balance spills: requests the bound moved off their key's pod.
    pub routing_spills_total: IntCounterVec,
    /// Cache-aware: prompt-chain links the chosen pod held, per request.
    pub cache_aware_match_depth: HistogramVec,
    /// Cache-aware lookups by whether the chosen pod held any link (`result` match or miss).
    pub cache_aware_lookups_total: IntCounterVec,
    /// Cardinality trackers and hot keys per model.
    pub keys: KeyStats,
    /// `requests_total` of requests that never resolved to a configured model (client-chosen
    /// names stay out of metric labels).
    pub unknown_model_requests: handles::StatusCounters,
    /// The engine-signal families (`flexinfer_proxy_engine_*`, see [`crate::signals`]).
    pub engine: crate::signals::EngineFamilies,
}

/// The `model` label of requests for no configured model.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Registers families and remembers them, so empty ones can still be listed.
struct Families {
    registry: Registry,
    collectors: Vec<Box<dyn Collector>>,
}

impl Families {
    fn add<C: Collector + Clone + 'static>(&mut self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("metric registered once");
        self.collectors.push(Box::new(c.clone()));
        c
    }

    /// A group of families defined elsewhere (`collectors` boxes each of them anew).
    fn add_all(&mut self, collectors: impl Fn() -> Vec<Box<dyn Collector>>) {
        for c in collectors() {
            self.registry.register(c).expect("metric registered once");
        }
        self.collectors.extend(collectors());
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn histogram(&mut self, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
        self.histogram_with(name, help, labels, LATENCY_BUCKETS)
    }

    fn histogram_with(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels).expect("valid metric"))
    }
}

fn type_name(t: MetricType) -> &'static str {
    match t {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}

/// HELP text escaping of the exposition format.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

impl Metrics {
    /// Metrics with the default key tracking and the given cardinality cap.
    pub fn new(cardinality_cap: usize) -> Self {
        Self::with_key_tracking(KeyTracking {
            cardinality_cap,
            ..KeyTracking::default()
        })
    }

    pub fn with_key_tracking(tracking: KeyTracking) -> Self {
        let mut f = Families {
            registry: Registry::new(),
            collectors: Vec::new(),
        };
        let routing_key_cardinality = f.add(
            GaugeVec::new(
                Opts::new(
                    "flexinfer_proxy_routing_key_cardinality",
                    "Approximate unique routing-key count per source (bounded in-memory tracker)",
                ),
                &["model", "strategy", "key_source"],
            )
            .expect("valid metric"),
        );
        let ebpf_enabled = f.add(
            IntGauge::new(
                "flexinfer_proxy_ebpf_enabled",
                "1 when the eBPF connection gauge drives least-loaded picks, 0 on the userspace gauge",
            )
            .expect("valid metric"),
        );
        let routing_key_cardinality_overflow_total = f.counter(
            "flexinfer_proxy_routing_key_cardinality_overflow_total",
            "Number of times cardinality tracking reached its cap",
            &["model", "strategy", "key_source"],
        );
        let requests_total = f.counter(
            "flexinfer_proxy_requests_total",
            "Total requests per model (by status)",
            &["model", "status"],
        );
        let engine = crate::signals::EngineFamilies::new();
        f.add_all(|| engine.collectors());
        Self {
            engine,
            unknown_model_requests: handles::StatusCounters::lazy(&requests_total, UNKNOWN_MODEL),
            requests_total,
            active_connections: f.gauge(
                "flexinfer_proxy_active_connections",
                "Current connections per model",
                &["model"],
            ),
            label_group_route_decisions_total: f.counter(
                "flexinfer_proxy_label_group_route_decisions_total",
                "Shared-label decisions; least_loaded confirms active-load selection",
                &["label", "strategy", "outcome"],
            ),
            label_group_route_target_hits_total: f.counter(
                "flexinfer_proxy_label_group_route_target_hits_total",
                "Shared-label traffic distribution by selected Model",
                &["label", "strategy", "model"],
            ),
            least_loaded_reservations_total: f.counter(
                "flexinfer_proxy_least_loaded_reservations_total",
                "Least-loaded pick reservations recorded per model (burst-spread placeholders ahead of the connection gauge)",
                &["model"],
            ),
            least_loaded_reservations_consumed_total: f.counter(
                "flexinfer_proxy_least_loaded_reservations_consumed_total",
                "Reservations a real request replaced (reserved = consumed + expired + pending)",
                &["model"],
            ),
            least_loaded_reservations_expired_total: f.counter(
                "flexinfer_proxy_least_loaded_reservations_expired_total",
                "Reservations that expired before a real connection consumed them",
                &["model"],
            ),
            routing_decisions_total: f.counter(
                "flexinfer_proxy_routing_decisions_total",
                "Routing decisions by strategy and key source (outcome: pod or service-fallback)",
                &["model", "strategy", "key_source", "outcome"],
            ),
            routing_target_hits_total: f.counter(
                "flexinfer_proxy_routing_target_hits_total",
                "Route-hit distribution by selected target (target is pod IP:port or service-dns)",
                &["model", "strategy", "target"],
            ),
            routing_key_cardinality: routing_key_cardinality.clone(),
            routing_key_cardinality_overflow_total: routing_key_cardinality_overflow_total.clone(),
            request_duration_seconds: f.histogram(
                "flexinfer_proxy_request_duration_seconds",
                "Request duration from arrival to the end of the response body",
                &["model"],
            ),
            time_to_first_byte_seconds: f.histogram(
                "flexinfer_proxy_time_to_first_byte_seconds",
                "Time from arrival to the first response body byte (time to first token when streaming)",
                &["model"],
            ),
            upstream_connect_errors_total: f.counter(
                "flexinfer_proxy_upstream_connect_errors_total",
                "Upstream connection attempts that failed before any byte was sent",
                &["model", "target"],
            ),
            upstream_retries_total: f.counter(
                "flexinfer_proxy_upstream_retries_total",
                "Requests sent on to the next target after a reset or a 502/503, before any byte reached the client (reason: reset, status-502, status-503)",
                &["model", "reason"],
            ),
            outlier_ejections_total: f.counter(
                "flexinfer_proxy_outlier_ejections_total",
                "Pods taken out of the candidates for a cool-down after failing (connect errors, 5xx, timeouts)",
                &["model", "target"],
            ),
            ready_endpoints: f.gauge(
                "flexinfer_proxy_ready_endpoints",
                "Ready pod endpoints per model",
                &["model"],
            ),
            ebpf_enabled,
            routing_spills_total: f.counter(
                "flexinfer_proxy_routing_spills_total",
                "Requests the hash-balance bound moved off their key's pod to the next pod under the bound (model is the label for label groups)",
                &["model", "strategy"],
            ),
            cache_aware_match_depth: f.histogram_with(
                "flexinfer_proxy_cache_aware_match_depth",
                "Leading prompt-chain links the pod a cache-aware request went to had been sent before",
                &["model"],
                DEPTH_BUCKETS,
            ),
            cache_aware_lookups_total: f.counter(
                "flexinfer_proxy_cache_aware_lookups_total",
                "Cache-aware decisions by whether the chosen pod matched any prompt-chain link (result: match or miss)",
                &["model", "result"],
            ),
            keys: KeyStats::new(
                tracking,
                routing_key_cardinality,
                routing_key_cardinality_overflow_total,
            ),
            registry: f.registry,
            collectors: f.collectors,
        }
    }

    /// A new routing table was published: the ready endpoint counts follow it, and key
    /// statistics of models it no longer has are dropped.
    pub fn table_rebuilt(&self, table: &crate::table::RoutingTable) {
        self.ready_endpoints.reset();
        for model in table.models() {
            self.ready_endpoints
                .with_label_values(&[&model.name])
                .set(model.pods.len() as i64);
        }
        self.keys
            .retain(|name| table.models().any(|model| &*model.name == name));
    }

    /// The Prometheus text exposition: every family, sorted by name; the cardinality gauges are
    /// brought up to date first (estimates are computed per scrape, not per request).
    pub fn render(&self) -> String {
        self.keys.refresh_gauges(std::time::Instant::now());
        let gathered = self.registry.gather();
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        let encoder = TextEncoder::new();
        for (i, mf) in gathered.iter().enumerate() {
            let mut buf = Vec::new();
            encoder
                .encode(&gathered[i..=i], &mut buf)
                .expect("text encoding cannot fail");
            out.push((mf.name().to_owned(), buf));
        }
        for c in &self.collectors {
            for mf in c.collect() {
                if mf.get_metric().is_empty() && !out.iter().any(|(n, _)| n == mf.name()) {
                    let header = format!(
                        "# HELP {name} {help}\n# TYPE {name} {ty}\n",
                        name = mf.name(),
                        help = escape_help(mf.help()),
                        ty = type_name(mf.get_field_type()),
                    );
                    out.push((mf.name().to_owned(), header.into_bytes()));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let bytes: Vec<u8> = out.into_iter().flat_map(|(_, b)| b).collect();
        String::from_utf8(bytes).expect("prometheus text is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_listed_before_it_has_series() {
        let m = Metrics::new(10);
        let text = m.render();
        for name in [
            "flexinfer_proxy_requests_total counter",
            "flexinfer_proxy_routing_key_cardinality gauge",
            "flexinfer_proxy_request_duration_seconds histogram",
            "flexinfer_proxy_ebpf_enabled gauge",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name}\n")),
                "{name}:\n{text}"
            );
        }
        assert_eq!(text.matches("# TYPE ").count(), 28, "{text}");
        assert!(text.contains("# TYPE flexinfer_proxy_engine_scrapes_total counter\n"));
        m.requests_total.with_label_values(&["m", "200"]).inc();
        let text = m.render();
        assert_eq!(
            text.matches("# TYPE flexinfer_proxy_requests_total ")
                .count(),
            1
        );
        assert!(text.contains("flexinfer_proxy_requests_total{model=\"m\",status=\"200\"} 1\n"));
    }
}
