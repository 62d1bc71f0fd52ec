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
pub mod families;
pub mod handles;
pub mod hot_keys;
pub mod keys;

use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::{Encoder, Gauge, IntGauge, Registry, TextEncoder};

use families::Families;
pub use families::{BalanceFamilies, RequestFamilies, SpecFamilies};
pub use keys::{KeyStats, KeyTracking};

pub struct Metrics {
    registry: Registry,
    /// Every registered family, for listing those without series yet.
    collectors: Vec<Box<dyn Collector>>,
    /// The spec's families ("Monitoring").
    pub spec: SpecFamilies,
    /// Latency and what happened upstream.
    pub requests: RequestFamilies,
    /// Bounded load and cache-aware routing.
    pub balance: BalanceFamilies,
    pub ebpf_enabled: IntGauge,
    /// The proxies the fleet size says stand in front of the same pods (set when rendered).
    pub fleet_proxies: IntGauge,
    /// This proxy's interval between two reads of one pod's metrics page at that fleet size
    /// (0: no scraping; set when rendered).
    pub engine_scrape_interval: Gauge,
    /// Cardinality trackers and hot keys per model.
    pub keys: KeyStats,
    /// `requests_total` of requests that never resolved to a configured model (client-chosen
    /// names stay out of metric labels).
    pub unknown_model_requests: handles::StatusCounters,
    /// The engine-signal families (`flexinfer_proxy_engine_*`, see [`crate::signals`]).
    pub engine: crate::signals::EngineFamilies,
    /// The admission families (queue depth and wait, rejections, see [`crate::admission`]).
    pub admission: crate::admission::AdmissionFamilies,
    /// What trace export did with the spans (see [`crate::telemetry`]).
    pub trace: crate::telemetry::TraceFamilies,
}

/// The `model` label of requests for no configured model.
pub const UNKNOWN_MODEL: &str = "unknown";

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
        let mut f = Families::default();
        let spec = SpecFamilies::register(&mut f);
        let requests = RequestFamilies::register(&mut f);
        let balance = BalanceFamilies::register(&mut f);
        let engine = crate::signals::EngineFamilies::new();
        f.add_all(|| engine.collectors());
        let admission = crate::admission::AdmissionFamilies::new();
        f.add_all(|| admission.collectors());
        let trace = crate::telemetry::TraceFamilies::new();
        f.add_all(|| trace.collectors());
        let ebpf_enabled = f.add(
            IntGauge::new(
                "flexinfer_proxy_ebpf_enabled",
                "1 when the eBPF connection gauge drives least-loaded picks, 0 on the userspace gauge",
            )
            .expect("valid metric"),
        );
        let fleet_proxies = f.add(
            IntGauge::new(
                "flexinfer_proxy_fleet_proxies",
                "Proxies in the fleet, from --fleet-size or the proxy pods Kubernetes discovery counts (1 when nothing counts); engine scrapes are spread over them",
            )
            .expect("valid metric"),
        );
        let engine_scrape_interval = f.add(
            Gauge::new(
                "flexinfer_proxy_engine_scrape_interval_seconds",
                "This proxy's interval between two reads of one pod's engine metrics page (fleet proxies / scrape budget, at least 250 ms; 0 when scraping is off)",
            )
            .expect("valid metric"),
        );
        Self {
            fleet_proxies,
            engine_scrape_interval,
            unknown_model_requests: handles::StatusCounters::lazy(
                &spec.requests_total,
                UNKNOWN_MODEL,
            ),
            keys: KeyStats::new(
                tracking,
                spec.routing_key_cardinality.clone(),
                spec.routing_key_cardinality_overflow_total.clone(),
            ),
            spec,
            requests,
            balance,
            engine,
            admission,
            trace,
            ebpf_enabled,
            registry: f.registry,
            collectors: f.collectors,
        }
    }

    /// A new routing table was published with these models and their ready endpoint counts:
    /// the ready endpoint gauges follow it, and key statistics of models it no longer has are
    /// dropped.
    pub fn table_rebuilt<'a>(&self, models: impl IntoIterator<Item = (&'a str, usize)>) {
        self.requests.ready_endpoints.reset();
        let mut names = std::collections::HashSet::new();
        for (name, pods) in models {
            self.requests
                .ready_endpoints
                .with_label_values(&[name])
                .set(pods as i64);
            names.insert(name);
        }
        self.keys.retain(|name| names.contains(name));
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
            "flexinfer_proxy_fleet_proxies gauge",
            "flexinfer_proxy_engine_scrape_interval_seconds gauge",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name}\n")),
                "{name}:\n{text}"
            );
        }
        assert_eq!(text.matches("# TYPE ").count(), 40, "{text}");
        assert!(text.contains("# TYPE flexinfer_proxy_client_refusals_total counter\n"));
        assert!(text.contains("# TYPE flexinfer_proxy_engine_scrapes_total counter\n"));
        assert!(text.contains("# TYPE flexinfer_proxy_engine_slot_prompt_reads_total counter\n"));
        assert!(text.contains("# TYPE flexinfer_proxy_queue_depth gauge\n"));
        assert!(text.contains("# TYPE flexinfer_proxy_queue_wait_seconds histogram\n"));
        // The trace export counters, both drop reasons at zero from the start.
        assert!(
            text.contains("flexinfer_proxy_trace_spans_dropped_total{reason=\"queue_full\"} 0\n")
        );
        assert!(text
            .contains("flexinfer_proxy_trace_spans_dropped_total{reason=\"export_failed\"} 0\n"));
        assert!(text.contains("# TYPE flexinfer_proxy_trace_spans_exported_total counter\n"));
        m.spec.requests_total.with_label_values(&["m", "200"]).inc();
        let text = m.render();
        assert_eq!(
            text.matches("# TYPE flexinfer_proxy_requests_total ")
                .count(),
            1
        );
        assert!(text.contains("flexinfer_proxy_requests_total{model=\"m\",status=\"200\"} 1\n"));
    }
}
