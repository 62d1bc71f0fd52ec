//! The metric families, registered once, in groups by what they describe: the spec's
//! routing families, request latency and upstream outcomes, bounded load and cache-aware
//! routing. Per-model handles into them are resolved in [`super::handles`].

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Buckets of the cache-aware matched depth (prompt-chain links).
const DEPTH_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Latency buckets (seconds) sized for LLM requests: milliseconds to minutes.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Registers families and remembers them, so empty ones can still be listed.
#[derive(Default)]
pub struct Families {
    pub(super) registry: Registry,
    pub(super) collectors: Vec<Box<dyn Collector>>,
}

impl Families {
    pub fn add<C: Collector + Clone + 'static>(&mut self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("metric registered once");
        self.collectors.push(Box::new(c.clone()));
        c
    }

    /// A group of families defined elsewhere (`collectors` boxes each of them anew).
    pub fn add_all(&mut self, collectors: impl Fn() -> Vec<Box<dyn Collector>>) {
        for c in collectors() {
            self.registry.register(c).expect("metric registered once");
        }
        self.collectors.extend(collectors());
    }

    pub fn counter(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn float_gauge(&mut self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.add(GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn histogram(&mut self, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
        self.histogram_with(name, help, labels, LATENCY_BUCKETS)
    }

    pub fn histogram_with(
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

/// The spec's families ("Monitoring"), with its names, help texts and labels.
pub struct SpecFamilies {
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
}

impl SpecFamilies {
    pub fn register(f: &mut Families) -> Self {
        Self {
            requests_total: f.counter(
                "flexinfer_proxy_requests_total",
                "Total requests per model (by status)",
                &["model", "status"],
            ),
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
            routing_key_cardinality: f.float_gauge(
                "flexinfer_proxy_routing_key_cardinality",
                "Approximate unique routing-key count per source (bounded in-memory tracker)",
                &["model", "strategy", "key_source"],
            ),
            routing_key_cardinality_overflow_total: f.counter(
                "flexinfer_proxy_routing_key_cardinality_overflow_total",
                "Number of times cardinality tracking reached its cap",
                &["model", "strategy", "key_source"],
            ),
        }
    }
}

/// Request latency, and what happened upstream.
pub struct RequestFamilies {
    pub request_duration_seconds: HistogramVec,
    pub time_to_first_byte_seconds: HistogramVec,
    pub upstream_connect_errors_total: IntCounterVec,
    pub upstream_retries_total: IntCounterVec,
    pub outlier_ejections_total: IntCounterVec,
    pub ready_endpoints: IntGaugeVec,
    /// Clients answered with an error before a request was read (`code`, `status`).
    pub client_refusals_total: IntCounterVec,
}

impl RequestFamilies {
    pub fn register(f: &mut Families) -> Self {
        Self {
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
                "Requests sent on to the next target after a reset or a retryable answer (--retry-on-status), before any byte reached the client (reason: reset, status-500, status-502, status-503, status-504, status-other)",
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
            client_refusals_total: f.counter(
                "flexinfer_proxy_client_refusals_total",
                "Client connections answered with an error and closed before a request was read (code malformed_request: a head the proxy will not read, status 400, 431 or 501; header_too_large: 431 past --max-header-bytes; request_timeout: 408, a head begun but not whole within --header-read-timeout; too_many_connections: 503 past --max-client-connections)",
                &["code", "status"],
            ),
        }
    }
}

/// Bounded-load hashing and cache-aware routing.
pub struct BalanceFamilies {
    /// Hash-balance spills: requests the bound moved off their key's pod.
    pub routing_spills_total: IntCounterVec,
    /// Cache-aware: prompt-chain links the chosen pod held, per request.
    pub cache_aware_match_depth: HistogramVec,
    /// Cache-aware lookups by whether the chosen pod held any link (`result` match or miss).
    pub cache_aware_lookups_total: IntCounterVec,
    /// Cache-aware requests that waited for another request's prefill of their prompt on
    /// their pod (`outcome` prefilled or timeout).
    pub cache_aware_prefill_waits_total: IntCounterVec,
}

impl BalanceFamilies {
    pub fn register(f: &mut Families) -> Self {
        Self {
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
            cache_aware_prefill_waits_total: f.counter(
                "flexinfer_proxy_cache_aware_prefill_waits_total",
                "Cache-aware requests held until another request computing the same prompt on their pod (this proxy's, or another's seen in the pod's /slots) had its first token (on llama.cpp: its end) (outcome: prefilled; timeout after --cache-aware-prefill-wait; recompute when a llama.cpp slot stayed busy as long again as computing the prompt took)",
                &["model", "outcome"],
            ),
        }
    }
}
