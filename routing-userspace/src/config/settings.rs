//! The one place raw flags become typed settings: [`Settings::from_args`] yields every options
//! struct `serve` runs with, and the warnings of the knobs that fell back to their defaults
//! (the spec wants invalid or non-positive routing values to fall back, not to stop the
//! proxy). `replay` and `config check` validate the routing flags with [`routing_knobs`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::args::{
    AdmissionArgs, BalanceArgs, DiscoveryKind, GaugeKind, HashBalanceArgs, KeepAlive, RoutingArgs,
    ServeArgs, SignalArgs, TraceArgs,
};
use super::parse::{format_bytes, format_duration, parse_bytes, parse_duration};
use crate::admission::{AdmissionDefaults, FullWhen};
use crate::balance::bounded::{parse_factor, parse_floor, HashBalance};
use crate::discovery::kube::{FleetOptions, KubeOptions};
use crate::ebpf::EbpfOptions;
use crate::keys::KeyLimits;
use crate::metrics::KeyTracking;
use crate::proxy::server::ServeOptions;
use crate::proxy::RequestLimits;
use crate::router::health::EjectionPolicy;
use crate::router::RoutingKnobs;
use crate::signals::{ScrapeConfig, SignalSettings};
use crate::telemetry::settings::{traces_endpoint, Compression};
use crate::telemetry::{Sampler, TraceSettings};
use crate::upstream::UpstreamOptions;

/// After SIGTERM, how long `/readyz` answers 503 while the proxy still serves.
pub const DEFAULT_SHUTDOWN_DELAY: Duration = Duration::from_secs(5);

/// A knob value that was not usable, and the default used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnobWarning {
    pub knob: &'static str,
    pub value: String,
    pub used: String,
}

/// Where models and pods come from.
#[derive(Debug, Clone)]
pub enum DiscoverySettings {
    /// The models file (`None`: not given, which `serve` refuses), polled this often.
    File {
        path: Option<PathBuf>,
        poll: Duration,
    },
    Kubernetes(KubeOptions),
}

/// Which load gauge picks read.
#[derive(Debug, Clone)]
pub struct GaugeSettings {
    pub kind: GaugeKind,
    pub require_ebpf: bool,
    pub ebpf: EbpfOptions,
}

/// The retry budget: a share of requests, and a floor per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySettings {
    pub share: f64,
    pub min_per_second: u32,
    /// The pod answers retried.
    pub on_status: crate::proxy::retry_on::RetryOn,
}

/// Everything `serve` runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub worker_threads: Option<usize>,
    pub discovery: DiscoverySettings,
    pub routing: RoutingKnobs,
    pub limits: RequestLimits,
    pub upstream: UpstreamOptions,
    pub server: ServeOptions,
    pub shutdown_delay: Duration,
    pub ejection: EjectionPolicy,
    pub retry: RetrySettings,
    pub key_tracking: KeyTracking,
    pub gauge: GaugeSettings,
    pub signals: SignalSettings,
    pub admission: AdmissionDefaults,
    pub trace: TraceSettings,
}

impl Settings {
    /// Every setting of `serve`, and what fell back to its default.
    pub fn from_args(args: &ServeArgs) -> (Self, Vec<KnobWarning>) {
        let (routing, mut warnings) = routing_knobs(&args.routing);
        let trace = trace_settings(&args.trace, &mut warnings);
        let t = &args.timeouts;
        let r = &args.resilience;
        let settings = Self {
            listen: args.listen,
            admin_listen: args.admin_listen,
            worker_threads: args.worker_threads,
            discovery: discovery(args),
            routing,
            limits: RequestLimits {
                max_body_bytes: args.max_body_bytes,
                max_header_bytes: args.limits.max_header_bytes,
                max_json_depth: args.limits.max_json_depth,
                first_byte_timeout: t.first_byte_timeout.0,
                stream_idle_timeout: t.stream_idle_timeout.0,
                request_timeout: t.request_timeout.0,
            },
            upstream: UpstreamOptions {
                connect_timeout: args.connect_timeout.0,
                keepalive: args.upstream_keepalive != KeepAlive::Off,
                idle_timeout: args.upstream_idle_timeout.0,
                ..UpstreamOptions::DEFAULT
            },
            server: ServeOptions {
                drain: args.drain_timeout.0,
                header_read_timeout: t.header_read_timeout.0,
                max_head_bytes: args.limits.max_header_bytes,
                max_connections: args.limits.max_client_connections,
                ..ServeOptions::PROXY
            },
            shutdown_delay: args.shutdown_delay.0,
            ejection: EjectionPolicy {
                after_failures: r.eject_after_failures,
                base_time: r.eject_base_time.0,
                max_share: r.max_ejected_share.clamp(0.0, 1.0),
            },
            retry: RetrySettings {
                share: r.retry_budget,
                min_per_second: r.retry_min_per_second,
                on_status: r.retry_on_status,
            },
            key_tracking: KeyTracking {
                cardinality_cap: args.key_cardinality_cap,
                cardinality_window: Some(args.key_cardinality_window.0),
                hot_keys: args.hot_keys,
                hot_keys_half_life: Some(args.hot_keys_half_life.0),
            },
            gauge: GaugeSettings {
                kind: args.ebpf.gauge,
                require_ebpf: args.ebpf.require_ebpf,
                ebpf: args.ebpf.options(),
            },
            signals: signal_settings(&args.signals),
            admission: admission_defaults(&args.admission),
            trace,
        };
        (settings, warnings)
    }
}

/// The proxy-wide admission defaults (a sheddable request never waits past the queue timeout).
pub fn admission_defaults(a: &AdmissionArgs) -> AdmissionDefaults {
    AdmissionDefaults {
        queue_max_size: a.queue_max_size,
        queue_timeout: a.queue_timeout.0,
        sheddable_timeout: a.queue_sheddable_timeout.0.min(a.queue_timeout.0),
        full_when: FullWhen {
            waiting_above: a.full_when_waiting_above,
            kv_usage_above: a.full_when_kv_usage_above,
        },
        tenant_label_cap: a.tenant_metric_cap,
        ..AdmissionDefaults::default()
    }
}

/// The trace settings: off without an endpoint; a sampler that is not a standard one falls back
/// to the default (`parentbased_always_on`) with a warning, as the OpenTelemetry SDKs do.
pub fn trace_settings(a: &TraceArgs, warnings: &mut Vec<KnobWarning>) -> TraceSettings {
    let arg = a.otel_traces_sampler_arg.as_deref();
    let sampler = Sampler::parse(&a.otel_traces_sampler, arg).unwrap_or_else(|e| {
        warnings.push(KnobWarning {
            knob: "OTEL_TRACES_SAMPLER",
            value: format!("{} ({e})", a.otel_traces_sampler),
            used: Sampler::DEFAULT.to_string(),
        });
        Sampler::DEFAULT
    });
    let compression = trace_compression(a, warnings);
    check_trace_protocol(a, warnings);
    // The exporter's timeout and the batch processor's both bound one export: the shorter wins.
    let otlp_timeout = a.otlp_traces_timeout.or(a.otlp_timeout).map(|d| d.0);
    let export_timeout = otlp_timeout.map_or(a.trace_export_timeout.0, |t| {
        t.min(a.trace_export_timeout.0)
    });
    TraceSettings {
        endpoint: traces_endpoint(
            a.otlp_endpoint.as_deref(),
            a.otlp_traces_endpoint.as_deref(),
        ),
        service_name: a.otel_service_name.clone(),
        sampler,
        queue_size: a.trace_queue_size.max(1),
        batch_size: a.trace_batch_size.max(1),
        batch_delay: a.trace_batch_delay.0,
        export_timeout,
        ca_certificate: [&a.otlp_traces_certificate, &a.otlp_certificate]
            .into_iter()
            .flatten()
            .find(|p| !p.as_os_str().is_empty())
            .cloned(),
        compression,
    }
}

/// Of a traces-only variable and its general twin, the one that applies and its name: the
/// traces one unless it is unset or blank.
fn traces_first<'a>(
    traces: (&'static str, &'a Option<String>),
    general: (&'static str, &'a Option<String>),
) -> Option<(&'static str, &'a str)> {
    match (traces, general) {
        ((name, Some(v)), _) if !v.trim().is_empty() => Some((name, v)),
        (_, (name, Some(v))) => Some((name, v)),
        _ => None,
    }
}

/// The traces variable if set, else the general one. A value other than gzip or none is
/// ignored with a warning, as the OpenTelemetry specification asks of an unknown enum value.
fn trace_compression(a: &TraceArgs, warnings: &mut Vec<KnobWarning>) -> Compression {
    let Some((knob, value)) = traces_first(
        (
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            &a.otlp_traces_compression,
        ),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", &a.otlp_compression),
    ) else {
        return Compression::None;
    };
    Compression::parse(value).unwrap_or_else(|e| {
        warnings.push(KnobWarning {
            knob,
            value: e,
            used: Compression::None.as_str().to_owned(),
        });
        Compression::None
    })
}

/// The only OTLP protocol exported is `http/protobuf`: another value of the protocol variables
/// (the traces one wins) is ignored with a warning, as the OpenTelemetry specification asks of
/// an unsupported enum value, so a collector port that speaks gRPC is named at startup rather
/// than found through failed exports.
fn check_trace_protocol(a: &TraceArgs, warnings: &mut Vec<KnobWarning>) {
    let Some((knob, value)) = traces_first(
        (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            &a.otlp_traces_protocol,
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", &a.otlp_protocol),
    ) else {
        return;
    };
    if !matches!(value.trim(), "" | "http/protobuf") {
        warnings.push(KnobWarning {
            knob,
            value: format!("{value:?} is not exported; only http/protobuf is"),
            used: "http/protobuf".to_owned(),
        });
    }
}

/// The engine-signal settings: scraping off when its budget is 0.
fn signal_settings(a: &SignalArgs) -> SignalSettings {
    let scrape = (a.engine_scrape_budget > 0.0).then(|| ScrapeConfig {
        path: a.engine_metrics_path.clone(),
        budget: a.engine_scrape_budget,
        max_report_age: a.engine_scrape_max_age.0,
        timeout: a.engine_scrape_timeout.0,
        slot_prompts_budget: match a.engine_slot_prompts {
            true => a.engine_slot_prompts_budget,
            false => 0.0,
        },
        ..ScrapeConfig::default()
    });
    SignalSettings {
        inband: a.engine_load_reports,
        staleness: a.engine_report_staleness.0,
        scrape,
        fleet_size: a.fleet_size,
        fleet_rank: a.fleet_rank,
    }
}

fn discovery(args: &ServeArgs) -> DiscoverySettings {
    match args.discovery {
        DiscoveryKind::File => DiscoverySettings::File {
            path: args.config.clone(),
            poll: args.config_poll.0,
        },
        DiscoveryKind::Kubernetes => DiscoverySettings::Kubernetes(KubeOptions {
            namespace: Some(args.namespace.clone()).filter(|n| !n.is_empty()),
            kubeconfig: args.kubeconfig.clone(),
            service_label_key: args.service_label_key.clone(),
            inference_pools: args.inference_pools,
            fleet: FleetOptions {
                selector: args.signals.fleet_selector.clone(),
                namespace: Some(args.signals.fleet_namespace.clone()).filter(|n| !n.is_empty()),
                pod_name: Some(args.signals.fleet_pod_name.clone()).filter(|n| !n.is_empty()),
            },
        }),
    }
}

/// Collects the knobs that fell back to their defaults.
struct Fallbacks(Vec<KnobWarning>);

impl Fallbacks {
    /// `parsed`, or `default` (recorded as a fallback of `knob` from `value`).
    fn or<T>(
        &mut self,
        knob: &'static str,
        value: &str,
        parsed: Option<T>,
        default: T,
        shown: String,
    ) -> T {
        parsed.unwrap_or_else(|| {
            self.0.push(KnobWarning {
                knob,
                value: value.to_owned(),
                used: shown,
            });
            default
        })
    }

    /// A positive length, else `default`.
    fn length(&mut self, knob: &'static str, value: &str, default: usize) -> usize {
        let parsed = value
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|&n| n > 0)
            .map(|n| n as usize);
        self.or(knob, value, parsed, default, default.to_string())
    }
}

/// Validate the routing flags. Invalid or non-positive lengths, unparsable or negative TTLs,
/// unknown modes and unusable balance values fall back to the defaults; each fallback is
/// reported.
pub fn routing_knobs(raw: &RoutingArgs) -> (RoutingKnobs, Vec<KnobWarning>) {
    let d = RoutingKnobs::DEFAULT;
    let mut w = Fallbacks(Vec::new());
    let limits = KeyLimits {
        explicit_key_max_length: w.length(
            "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
            &raw.explicit_key_max_length,
            d.limits.explicit_key_max_length,
        ),
        system_segment_max_length: w.length(
            "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
            &raw.system_segment_max_length,
            d.limits.system_segment_max_length,
        ),
        document_segment_max_length: w.length(
            "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
            &raw.document_segment_max_length,
            d.limits.document_segment_max_length,
        ),
    };
    let ttl = &raw.least_loaded_reservation_ttl;
    let reservation_ttl = w.or(
        "PROXY_LEAST_LOADED_RESERVATION_TTL",
        ttl,
        parse_duration(ttl).ok(),
        d.reservation_ttl,
        format_duration(d.reservation_ttl),
    );
    let mode = &raw.label_group_routing;
    let label_group_mode = w.or(
        "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
        mode,
        mode.parse().ok(),
        d.label_group_mode,
        d.label_group_mode.to_string(),
    );
    let (hash_balance, [cache_aware_factor_milli, session_factor_milli], cache_aware_index_budget) =
        balance(&raw.balance, &mut w);
    let knobs = RoutingKnobs {
        limits,
        reservation_ttl,
        label_group_mode,
        max_pod_attempts: usize::from(raw.max_pod_attempts),
        hash_balance,
        cache_aware_factor_milli,
        session_factor_milli,
        cache_aware_index_budget,
        cache_aware_prefill_wait: raw.balance.cache_aware_prefill_wait.0,
        route_header: raw.balance.route_header,
    };
    (knobs, w.0)
}

/// The bound of every ring, with fallbacks (also what `config check` shows per model).
pub fn hash_balance(raw: &HashBalanceArgs) -> (HashBalance, Vec<KnobWarning>) {
    let mut w = Fallbacks(Vec::new());
    let b = hash_balance_with(raw, &mut w);
    (b, w.0)
}

fn hash_balance_with(raw: &HashBalanceArgs, w: &mut Fallbacks) -> HashBalance {
    let d = RoutingKnobs::DEFAULT.hash_balance;
    let factor = &raw.hash_balance_factor;
    let factor_milli = w.or(
        "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
        factor,
        parse_factor(factor).ok(),
        d.factor_milli,
        d.factor().to_string(),
    );
    let floor = &raw.hash_balance_floor;
    let floor = w.or(
        "FLEXINFER_PROXY_HASH_BALANCE_FLOOR",
        floor,
        parse_floor(floor).ok(),
        d.floor,
        d.floor.to_string(),
    );
    HashBalance {
        factor_milli,
        floor,
    }
}

/// The hash balance, the cache-aware and session factors, and the index budget.
fn balance(raw: &BalanceArgs, w: &mut Fallbacks) -> (HashBalance, [u32; 2], usize) {
    let d = RoutingKnobs::DEFAULT;
    let hash = hash_balance_with(&raw.hash, w);
    let mut own_factor = |env, raw: &String, default: u32| {
        w.or(
            env,
            raw,
            parse_factor(raw).ok(),
            default,
            (f64::from(default) / 1000.0).to_string(),
        )
    };
    let factors = [
        own_factor(
            "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
            &raw.cache_aware_balance_factor,
            d.cache_aware_factor_milli,
        ),
        own_factor(
            "FLEXINFER_PROXY_SESSION_BALANCE_FACTOR",
            &raw.session_balance_factor,
            d.session_factor_milli,
        ),
    ];
    let budget = &raw.cache_aware_index_budget;
    let budget = w.or(
        "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET",
        budget,
        parse_bytes(budget).ok(),
        d.cache_aware_index_budget,
        format_bytes(d.cache_aware_index_budget),
    );
    (hash, factors, budget)
}

#[cfg(test)]
mod tests;
