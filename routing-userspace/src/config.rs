//! Command line and environment -> validated settings.
//!
//! Every knob the spec names is a flag with the spec's environment variable. Raw values are
//! taken as text and validated in one place ([`RoutingKnobs::from_raw`]), because the spec
//! wants invalid (non-positive) values to fall back to the defaults with a warning instead of
//! refusing to start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::balance::bounded::{parse_factor, parse_floor, HashBalance};
use crate::balance::least_loaded::MAX_RANKED;
use crate::keys::KeyLimits;
use crate::vocab::LabelGroupMode;

pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoveryKind {
    /// A YAML file of models and pods, reloaded when it changes.
    File,
    /// Model custom resources, EndpointSlices and Services from the Kubernetes API.
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GaugeKind {
    /// eBPF when it loads, else the userspace gauge.
    Auto,
    /// The node-wide eBPF connection gauge (fatal with --require-ebpf if it cannot load).
    Ebpf,
    /// The in-process in-flight gauge.
    Userspace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeepAlive {
    /// On (with either gauge: the eBPF gauge counts requests on pooled connections).
    Auto,
    On,
    /// One connection per request.
    Off,
}

/// `flexinfer-proxy serve` options.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the proxy listens on.
    #[arg(long, env = "FLEXINFER_PROXY_LISTEN", default_value = "0.0.0.0:8080", value_parser = parse_listen)]
    pub listen: SocketAddr,

    /// Address of the admin server (/metrics, /healthz, /readyz, /debug/routing). Loopback by
    /// default: the routing view is for the node's operators (the chart binds the pod address
    /// for Prometheus and the kubelet's probes).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ADMIN_LISTEN",
        default_value = "127.0.0.1:9090",
        value_parser = parse_listen
    )]
    pub admin_listen: SocketAddr,

    /// Where models and pods come from.
    #[arg(
        long,
        value_enum,
        env = "FLEXINFER_PROXY_DISCOVERY",
        default_value = "file"
    )]
    pub discovery: DiscoveryKind,

    /// The models file (with --discovery file).
    #[arg(long, env = "FLEXINFER_PROXY_CONFIG")]
    pub config: Option<PathBuf>,

    /// How often the models file is checked for changes.
    #[arg(long, env = "FLEXINFER_PROXY_CONFIG_POLL", default_value = "500ms", value_parser = parse_duration)]
    pub config_poll: Duration,

    /// Namespace to watch (with --discovery kubernetes); empty means all namespaces.
    #[arg(long, env = "FLEXINFER_PROXY_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Model metadata label that carries the shared service label (with --discovery kubernetes).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_SERVICE_LABEL_KEY",
        default_value = "flexinfer.ai/service"
    )]
    pub service_label_key: String,

    /// Kubeconfig file (else in-cluster config, else the default kubeconfig).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Tokio worker threads (default: one per core).
    #[arg(long, env = "FLEXINFER_PROXY_WORKER_THREADS")]
    pub worker_threads: Option<usize>,

    /// Largest request body buffered for routing; larger requests get 413.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_BODY_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Pods tried (the pick, then alternates) when connecting fails, before the Service (1-16).
    #[arg(long, env = "FLEXINFER_PROXY_MAX_POD_ATTEMPTS", default_value_t = 3,
          value_parser = clap::value_parser!(u16).range(1..=MAX_RANKED as i64))]
    pub max_pod_attempts: u16,

    /// Upstream TCP connect timeout.
    #[arg(long, env = "FLEXINFER_PROXY_CONNECT_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// Idle upstream connections older than this are closed, not reused (keep it below the
    /// model servers' keep-alive timeout: uvicorn, behind vLLM, closes after 5 s).
    #[arg(long, env = "FLEXINFER_PROXY_UPSTREAM_IDLE_TIMEOUT", default_value = "4s", value_parser = parse_duration)]
    pub upstream_idle_timeout: Duration,

    /// Keep-alive pooling of upstream connections.
    #[arg(
        long,
        value_enum,
        env = "FLEXINFER_PROXY_UPSTREAM_KEEPALIVE",
        default_value = "auto"
    )]
    pub upstream_keepalive: KeepAlive,

    /// How long in-flight requests may finish after SIGTERM (after the shutdown delay).
    #[arg(long, env = "FLEXINFER_PROXY_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// After SIGTERM, how long /readyz answers 503 while the proxy still serves, so Kubernetes
    /// takes the endpoint out before the proxy stops accepting (the pre-stop delay).
    #[arg(long, env = "FLEXINFER_PROXY_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    #[command(flatten)]
    pub timeouts: TimeoutArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub resilience: ResilienceArgs,

    #[command(flatten)]
    pub routing: RoutingArgs,

    #[command(flatten)]
    pub ebpf: EbpfArgs,

    #[command(flatten)]
    pub admission: AdmissionArgs,

    /// Cap on distinct keys tracked exactly per (model, strategy, key_source) series.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_KEY_CARDINALITY_CAP",
        default_value_t = 10_000
    )]
    pub key_cardinality_cap: usize,

    /// Cardinality window: keys count for one to two windows (two rotating generations); 0
    /// counts forever.
    #[arg(long, env = "FLEXINFER_PROXY_KEY_CARDINALITY_WINDOW", default_value = "10m", value_parser = parse_duration)]
    pub key_cardinality_window: Duration,

    /// Hottest keys listed per model in /debug/routing (space-saving top-k); 0 disables.
    #[arg(long, env = "FLEXINFER_PROXY_HOT_KEYS", default_value_t = 20)]
    pub hot_keys: usize,

    /// Half-life of the hot-key counts (shares describe recent traffic); 0 never decays.
    #[arg(long, env = "FLEXINFER_PROXY_HOT_KEYS_HALF_LIFE", default_value = "60s", value_parser = parse_duration)]
    pub hot_keys_half_life: Duration,
}

/// How long the proxy waits, for the pod and for the client. Each ends in an OpenAI-shaped
/// 504 (or, once an SSE stream has started, a final SSE error event and a close).
#[derive(Debug, Clone, Args)]
pub struct TimeoutArgs {
    /// From sending a request to a pod to its response head (long enough for a cold start and
    /// a long non-streaming generation); 0 waits forever.
    #[arg(long, env = "FLEXINFER_PROXY_FIRST_BYTE_TIMEOUT", default_value = "300s", value_parser = parse_duration)]
    pub first_byte_timeout: Duration,

    /// Longest pause between two chunks of a response body; 0 waits forever.
    #[arg(long, env = "FLEXINFER_PROXY_STREAM_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub stream_idle_timeout: Duration,

    /// A client must send a request's head within this (against slowloris; also how long an
    /// idle client connection stays open).
    #[arg(long, env = "FLEXINFER_PROXY_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Longest a whole request may take, response body included; 0 (the default) is no limit.
    #[arg(long, env = "FLEXINFER_PROXY_REQUEST_TIMEOUT", default_value = "0", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

/// Bounds on what a client may send.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Largest request head (request line and headers) in bytes; larger ones get 431.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_HEADER_BYTES", default_value_t = 64 * 1024,
          value_parser = parse_header_limit)]
    pub max_header_bytes: usize,

    /// Client connections served at once; the next ones get 503 with Retry-After.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_MAX_CLIENT_CONNECTIONS",
        default_value_t = 16_384
    )]
    pub max_client_connections: usize,

    /// Deepest JSON nesting the proxy parses in a request body; deeper bodies get 400.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_JSON_DEPTH", default_value_t = 128)]
    pub max_json_depth: u32,
}

/// Retries and passive outlier ejection.
#[derive(Debug, Clone, Args)]
pub struct ResilienceArgs {
    /// Retries (after a reset or a 502/503 from a pod, before any byte reached the client) may
    /// add at most this share of requests, over a 10 s window (connect failures, which send
    /// nothing, always move on).
    #[arg(long, env = "FLEXINFER_PROXY_RETRY_BUDGET", default_value_t = 0.2, value_parser = parse_share)]
    pub retry_budget: f64,

    /// Retries always allowed per second, whatever the budget (so a quiet model can retry).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_RETRY_MIN_PER_SECOND",
        default_value_t = 5
    )]
    pub retry_min_per_second: u32,

    /// Consecutive failures (connect errors, 5xx answers) that eject a pod; a connect or
    /// first-byte timeout ejects at once. 0 disables ejection.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_EJECT_AFTER_FAILURES",
        default_value_t = 5
    )]
    pub eject_after_failures: u32,

    /// First ejection's cool-down; each repeat ejection doubles it, up to 32 times.
    #[arg(long, env = "FLEXINFER_PROXY_EJECT_BASE_TIME", default_value = "10s", value_parser = parse_duration)]
    pub eject_base_time: Duration,

    /// Largest share of a model's pods ejected at once (at least one may always be).
    #[arg(long, env = "FLEXINFER_PROXY_MAX_EJECTED_SHARE", default_value_t = 0.5, value_parser = parse_share)]
    pub max_ejected_share: f64,
}

/// The spec's routing knobs, as raw text (validated by [`RoutingKnobs::from_raw`]).
#[derive(Debug, Clone, Args)]
pub struct RoutingArgs {
    /// Longest accepted explicit cache key (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
        default_value = "128"
    )]
    pub explicit_key_max_length: String,

    /// System-message segment length used by canonical context (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
        default_value = "512"
    )]
    pub system_segment_max_length: String,

    /// Document-context segment length used by canonical context (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
        default_value = "256"
    )]
    pub document_segment_max_length: String,

    /// Least-loaded reservation lifetime ("10s", "500ms", or seconds); 0 disables reservations.
    #[arg(
        long,
        env = "PROXY_LEAST_LOADED_RESERVATION_TTL",
        default_value = "10s"
    )]
    pub least_loaded_reservation_ttl: String,

    /// Member selection in shared service-label groups.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
        default_value = "round-robin"
    )]
    pub label_group_routing: String,

    #[command(flatten)]
    pub balance: BalanceArgs,
}

/// The hash-balance bound, as `serve` takes it and `config check` shows it per model.
#[derive(Debug, Clone, Args)]
pub struct HashBalanceArgs {
    /// Bounded-load factor c for session-affinity, prefix, cache-aware and the prefix/session
    /// label-group modes: a pod takes a new request only while its load is under
    /// max(ceil(c x mean load), floor), where mean load = (requests in flight + reservations
    /// over the candidate pods + 1) / pods; else the next pod on the ring under the bound takes
    /// it. 0 turns the bound off (the spec's plain ring).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
        default_value = "1.2"
    )]
    pub hash_balance_factor: String,

    /// The least bound of --hash-balance-factor: a pod with fewer requests in flight always
    /// takes its keys, so light traffic routes exactly as the plain ring does.
    #[arg(long, env = "FLEXINFER_PROXY_HASH_BALANCE_FLOOR", default_value = "4")]
    pub hash_balance_floor: String,
}

/// Bounded-load hashing, the cache-aware index and the route header (beyond the spec), as raw
/// text where the spec's knobs are raw text (validated by [`RoutingKnobs::from_raw`]).
#[derive(Debug, Clone, Args)]
pub struct BalanceArgs {
    #[command(flatten)]
    pub hash: HashBalanceArgs,

    /// The bounded-load factor of cache-aware models (its floor is --hash-balance-floor).
    /// Looser than the rings' because cache-aware ties already go to the least-loaded pod and
    /// a prefix most pods hold also counts for a pod much less busy than its holders, so load
    /// spreads without a tight bound;
    /// see docs/routing-quality.md. 0 turns the bound off for them.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
        default_value = "1.5"
    )]
    pub cache_aware_balance_factor: String,

    /// Memory the cache-aware prefix index may use (all models and pods of this proxy): bytes,
    /// or with a unit (KiB, MiB, GiB, KB, MB, GB); about 40 bytes per (prefix link, pod).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET",
        default_value = "16MiB"
    )]
    pub cache_aware_index_budget: String,

    /// Add an `x-flexinfer-route` header to routed responses: strategy, key source, outcome,
    /// matched depth (cache-aware) and spill. Never key text.
    #[arg(long, env = "FLEXINFER_PROXY_ROUTE_HEADER", default_value_t = false)]
    pub route_header: bool,
}

/// The default hash-balance factor (thousandths) and floor: see `docs/routing-quality.md`.
pub const DEFAULT_HASH_BALANCE: HashBalance = HashBalance {
    factor_milli: 1200,
    floor: 4,
};

/// The default hash-balance factor of cache-aware models (thousandths).
pub const DEFAULT_CACHE_AWARE_FACTOR_MILLI: u32 = 1500;

/// The default memory budget of the cache-aware index.
pub const DEFAULT_CACHE_AWARE_INDEX_BUDGET: usize = 16 << 20;

/// A byte size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {0:?} (use e.g. 16MiB, 512KiB, 1GB, or bytes)")]
pub struct SizeError(String);

/// "16MiB", "512KiB", "1GB", "1048576": a size in bytes.
pub fn parse_bytes(s: &str) -> Result<usize, SizeError> {
    let t = s.trim();
    let bad = || SizeError(s.to_owned());
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let n: u64 = num.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "ki" => 1 << 10,
        "mib" | "mi" => 1 << 20,
        "gib" | "gi" => 1 << 30,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)
}

/// eBPF gauge options.
#[derive(Debug, Clone, Args)]
pub struct EbpfArgs {
    /// Which load gauge drives least-loaded picks.
    #[arg(
        long,
        value_enum,
        env = "FLEXINFER_PROXY_GAUGE",
        default_value = "auto"
    )]
    pub gauge: GaugeKind,

    /// Exit if the eBPF gauge cannot be loaded.
    #[arg(long, env = "FLEXINFER_PROXY_REQUIRE_EBPF", default_value_t = false)]
    pub require_ebpf: bool,

    /// cgroup v2 path the sock_ops program attaches to (default: the cgroup2 root).
    #[arg(long, env = "FLEXINFER_PROXY_CGROUP_PATH")]
    pub cgroup_path: Option<PathBuf>,

    /// Where the BPF maps and links are pinned.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_BPF_PIN_DIR",
        default_value = "/sys/fs/bpf/flexinfer"
    )]
    pub bpf_pin_dir: PathBuf,

    /// The bpffs mount point.
    #[arg(long, env = "FLEXINFER_PROXY_BPFFS", default_value = "/sys/fs/bpf")]
    pub bpffs: PathBuf,
}

impl EbpfArgs {
    /// The loader's options.
    pub fn options(&self) -> crate::ebpf::EbpfOptions {
        crate::ebpf::EbpfOptions {
            cgroup: self.cgroup_path.clone(),
            pin_dir: self.bpf_pin_dir.clone(),
            bpffs: self.bpffs.clone(),
        }
    }
}

/// Admission (see `crate::admission`): the proxy-wide defaults of every model's queue, and
/// when a pod counts as full from its engine's reports. Models set their own `maxConcurrency`,
/// `queue.*` and token budget; the values are validated by `crate::admission::settings`.
#[derive(Debug, Clone, Args)]
pub struct AdmissionArgs {
    /// Requests a model's queue holds while its pods are full (models: `queue.maxSize`); past
    /// it, 429 queue_full. 0: no queue.
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_MAX_SIZE", default_value_t = 1_000,
          value_parser = |s: &str| crate::admission::settings::parse_queue_max_size(s))]
    pub queue_max_size: u32,

    /// Longest wait in a model's queue before 429 queue_timeout (models: `queue.timeout`).
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_TIMEOUT", default_value = "30s",
          value_parser = |s: &str| crate::admission::settings::parse_queue_timeout(s))]
    pub queue_timeout: Duration,

    /// Longest wait of a sheddable request (negative x-flexinfer-priority), at most
    /// --queue-timeout (models: `queue.sheddableTimeout`).
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_SHEDDABLE_TIMEOUT", default_value = "5s",
          value_parser = |s: &str| crate::admission::settings::parse_queue_timeout(s))]
    pub queue_sheddable_timeout: Duration,

    /// A pod whose fresh engine report shows more waiting requests than this is full; "off"
    /// ignores the waiting count.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_FULL_WHEN_WAITING_ABOVE",
        default_value = "0"
    )]
    pub full_when_waiting_above: crate::admission::Above<u64>,

    /// A pod whose fresh engine report shows KV-cache use above this share (0 to 1) is full;
    /// "off" ignores it.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_FULL_WHEN_KV_USAGE_ABOVE",
        default_value = "0.95"
    )]
    pub full_when_kv_usage_above: crate::admission::Above<f64>,

    /// Tenants with their own `tenant` label on flexinfer_proxy_tokens_charged_total per
    /// model; later ones count as "other".
    #[arg(long, env = "FLEXINFER_PROXY_TENANT_METRIC_CAP", default_value_t = 100)]
    pub tenant_metric_cap: usize,
}

/// Validated routing knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingKnobs {
    pub limits: KeyLimits,
    pub reservation_ttl: Duration,
    pub label_group_mode: LabelGroupMode,
    /// Pods a request tries before the Service (the pick and its alternates).
    pub max_pod_attempts: usize,
    /// Bounded-load hashing of every ring (models may override it).
    pub hash_balance: HashBalance,
    /// The bounded-load factor of cache-aware models, thousandths (0 = off); the floor is
    /// `hash_balance.floor`.
    pub cache_aware_factor_milli: u32,
    /// Memory budget of the cache-aware prefix index, in bytes.
    pub cache_aware_index_budget: usize,
    /// Whether routed responses carry `x-flexinfer-route`.
    pub route_header: bool,
}

impl Default for RoutingKnobs {
    fn default() -> Self {
        Self {
            limits: KeyLimits::default(),
            reservation_ttl: DEFAULT_RESERVATION_TTL,
            label_group_mode: LabelGroupMode::RoundRobin,
            max_pod_attempts: DEFAULT_MAX_POD_ATTEMPTS,
            hash_balance: DEFAULT_HASH_BALANCE,
            cache_aware_factor_milli: DEFAULT_CACHE_AWARE_FACTOR_MILLI,
            cache_aware_index_budget: DEFAULT_CACHE_AWARE_INDEX_BUDGET,
            route_header: false,
        }
    }
}

/// Pods a request tries before the Service unless told otherwise.
pub const DEFAULT_MAX_POD_ATTEMPTS: usize = 3;

/// A knob value that was not usable, and the default used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnobWarning {
    pub knob: &'static str,
    pub value: String,
    pub used: String,
}

impl RoutingKnobs {
    /// Validate raw knob text. Invalid or non-positive lengths, unparsable or negative TTLs and
    /// unknown modes fall back to the defaults; each fallback is reported.
    pub fn from_raw(raw: &RoutingArgs) -> (Self, Vec<KnobWarning>) {
        let d = Self::default();
        let mut warnings = Vec::new();
        let mut length =
            |knob: &'static str, value: &str, default: usize| match value.trim().parse::<i64>() {
                Ok(n) if n > 0 => n as usize,
                _ => {
                    warnings.push(KnobWarning {
                        knob,
                        value: value.to_owned(),
                        used: default.to_string(),
                    });
                    default
                }
            };
        let limits = KeyLimits {
            explicit_key_max_length: length(
                "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
                &raw.explicit_key_max_length,
                d.limits.explicit_key_max_length,
            ),
            system_segment_max_length: length(
                "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
                &raw.system_segment_max_length,
                d.limits.system_segment_max_length,
            ),
            document_segment_max_length: length(
                "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
                &raw.document_segment_max_length,
                d.limits.document_segment_max_length,
            ),
        };
        let reservation_ttl = match parse_duration(&raw.least_loaded_reservation_ttl) {
            Ok(t) => t,
            Err(_) => {
                warnings.push(KnobWarning {
                    knob: "PROXY_LEAST_LOADED_RESERVATION_TTL",
                    value: raw.least_loaded_reservation_ttl.clone(),
                    used: "10s".into(),
                });
                d.reservation_ttl
            }
        };
        let label_group_mode = match raw.label_group_routing.parse() {
            Ok(m) => m,
            Err(_) => {
                warnings.push(KnobWarning {
                    knob: "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
                    value: raw.label_group_routing.clone(),
                    used: d.label_group_mode.to_string(),
                });
                d.label_group_mode
            }
        };
        let (hash_balance, cache_aware_factor_milli, cache_aware_index_budget) =
            raw.balance.validate(&mut warnings);
        (
            Self {
                limits,
                reservation_ttl,
                label_group_mode,
                max_pod_attempts: d.max_pod_attempts,
                hash_balance,
                cache_aware_factor_milli,
                cache_aware_index_budget,
                route_header: raw.balance.route_header,
            },
            warnings,
        )
    }
}

impl HashBalanceArgs {
    /// The defaults, as if no flag or variable were set.
    pub fn defaults() -> Self {
        Self {
            hash_balance_factor: DEFAULT_HASH_BALANCE.factor().to_string(),
            hash_balance_floor: DEFAULT_HASH_BALANCE.floor.to_string(),
        }
    }

    /// The bound; an unusable value falls back to its default, and `warn` hears of it.
    pub fn validate(&self, warn: &mut impl FnMut(&'static str, &str, String)) -> HashBalance {
        let d = DEFAULT_HASH_BALANCE;
        let factor_milli = parse_factor(&self.hash_balance_factor).unwrap_or_else(|_| {
            warn(
                "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
                &self.hash_balance_factor,
                d.factor().to_string(),
            );
            d.factor_milli
        });
        let floor = parse_floor(&self.hash_balance_floor).unwrap_or_else(|_| {
            warn(
                "FLEXINFER_PROXY_HASH_BALANCE_FLOOR",
                &self.hash_balance_floor,
                d.floor.to_string(),
            );
            d.floor
        });
        HashBalance {
            factor_milli,
            floor,
        }
    }
}

impl BalanceArgs {
    /// The defaults, as if no flag or variable were set.
    pub fn defaults() -> Self {
        Self {
            hash: HashBalanceArgs::defaults(),
            cache_aware_balance_factor: "1.5".into(),
            cache_aware_index_budget: "16MiB".into(),
            route_header: false,
        }
    }

    /// The hash balance, the cache-aware factor and the index budget; an unusable value falls
    /// back to its default, with a warning, as the spec's knobs do.
    fn validate(&self, warnings: &mut Vec<KnobWarning>) -> (HashBalance, u32, usize) {
        let mut warn = |knob: &'static str, value: &str, used: String| {
            warnings.push(KnobWarning {
                knob,
                value: value.to_owned(),
                used,
            })
        };
        let hash = self.hash.validate(&mut warn);
        let cache_aware_factor =
            parse_factor(&self.cache_aware_balance_factor).unwrap_or_else(|_| {
                warn(
                    "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
                    &self.cache_aware_balance_factor,
                    "1.5".into(),
                );
                DEFAULT_CACHE_AWARE_FACTOR_MILLI
            });
        let budget = parse_bytes(&self.cache_aware_index_budget).unwrap_or_else(|_| {
            warn(
                "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET",
                &self.cache_aware_index_budget,
                "16MiB".into(),
            );
            DEFAULT_CACHE_AWARE_INDEX_BUDGET
        });
        (hash, cache_aware_factor, budget)
    }
}

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?} (use e.g. 10s, 250ms, 2m, 1h, or seconds)")]
    Invalid(String),
    #[error("invalid duration {0:?}: must be zero or positive")]
    Negative(String),
    #[error("invalid duration unit in {0:?} (use ms, s, m or h)")]
    Unit(String),
}

/// "10s", "250ms", "2m", "1h", or a plain number of seconds (fractions allowed). Not negative.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| DurationError::Invalid(s.to_owned()))?;
    if !n.is_finite() || n < 0.0 {
        return Err(DurationError::Negative(s.to_owned()));
    }
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(DurationError::Unit(s.to_owned())),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A listen address: `host:port`, `[v6]:port`, or a bare IPv6 address before the port
/// (`fd00::5:9090`, what `$(POD_IP):9090` expands to on an IPv6 pod), read as the last colon.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let bad = || format!("{s:?} is not an address:port (e.g. 0.0.0.0:8080 or [::]:8080)");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = host.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::new(ip, port))
}

/// The request-head limit; the HTTP/1 reader needs room for at least 8 KiB.
pub fn parse_header_limit(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    if n < 8192 {
        return Err(format!(
            "{n} is below the smallest request-head limit, 8192"
        ));
    }
    Ok(n)
}

/// A share between 0 and 1.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&x) {
        return Err(format!("{x} is not a share between 0 and 1"));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_bare_ipv6_before_the_port() {
        assert_eq!(
            parse_listen("0.0.0.0:80").unwrap().to_string(),
            "0.0.0.0:80"
        );
        assert_eq!(
            parse_listen("[::1]:9090").unwrap().to_string(),
            "[::1]:9090"
        );
        assert_eq!(
            parse_listen("fd00::5:9090").unwrap().to_string(),
            "[fd00::5]:9090"
        );
        assert!(parse_listen("localhost:80").is_err());
        assert!(parse_listen("10.0.0.1").is_err());
        assert!(parse_listen(":80").is_err());
    }

    #[test]
    fn limits_and_shares_reject_what_would_break_the_proxy() {
        assert!(parse_header_limit("8191").is_err());
        assert_eq!(parse_header_limit("65536"), Ok(65536));
        assert!(parse_share("1.5").is_err());
        assert!(parse_share("-0.1").is_err());
        assert_eq!(parse_share("0"), Ok(0.0));
    }

    fn raw(e: &str, s: &str, d: &str, ttl: &str, mode: &str) -> RoutingArgs {
        RoutingArgs {
            explicit_key_max_length: e.into(),
            system_segment_max_length: s.into(),
            document_segment_max_length: d.into(),
            least_loaded_reservation_ttl: ttl.into(),
            label_group_routing: mode.into(),
            balance: BalanceArgs::defaults(),
        }
    }

    #[test]
    fn valid_knobs_are_taken() {
        let (k, w) = RoutingKnobs::from_raw(&raw("64", "1024", "32", "250ms", "least-loaded"));
        assert!(w.is_empty());
        assert_eq!(
            k.limits,
            KeyLimits {
                explicit_key_max_length: 64,
                system_segment_max_length: 1024,
                document_segment_max_length: 32
            }
        );
        assert_eq!(k.reservation_ttl, Duration::from_millis(250));
        assert_eq!(k.label_group_mode, LabelGroupMode::LeastLoaded);
    }

    #[test]
    fn invalid_or_non_positive_knobs_fall_back_to_defaults() {
        let (k, w) = RoutingKnobs::from_raw(&raw("0", "-5", "abc", "-1s", "random"));
        assert_eq!(k, RoutingKnobs::default());
        let names: Vec<_> = w.iter().map(|w| w.knob).collect();
        assert_eq!(
            names,
            [
                "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
                "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
                "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
                "PROXY_LEAST_LOADED_RESERVATION_TTL",
                "FLEXINFER_PROXY_LABEL_GROUP_ROUTING"
            ]
        );
    }

    #[test]
    fn ttl_zero_disables_and_durations_parse() {
        let (k, w) = RoutingKnobs::from_raw(&raw("128", "512", "256", "0", "round-robin"));
        assert!(w.is_empty());
        assert_eq!(k.reservation_ttl, Duration::ZERO);
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn hash_balance_and_index_knobs_validate_like_the_others() {
        let mut r = raw("128", "512", "256", "10s", "round-robin");
        let (k, w) = RoutingKnobs::from_raw(&r);
        assert!(w.is_empty());
        assert_eq!(k.hash_balance, DEFAULT_HASH_BALANCE);
        assert_eq!(k.cache_aware_index_budget, 16 << 20);
        assert_eq!(k.cache_aware_factor_milli, 1500);
        r.balance = BalanceArgs {
            hash: HashBalanceArgs {
                hash_balance_factor: "1.5".into(),
                hash_balance_floor: "0".into(),
            },
            cache_aware_balance_factor: "2".into(),
            cache_aware_index_budget: "512KiB".into(),
            route_header: true,
        };
        let (k, w) = RoutingKnobs::from_raw(&r);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            (k.hash_balance.factor_milli, k.hash_balance.floor),
            (1500, 0)
        );
        assert_eq!(k.cache_aware_factor_milli, 2000);
        assert_eq!(k.cache_aware_index_budget, 512 << 10);
        assert!(k.route_header);
        r.balance.hash.hash_balance_factor = "0".into();
        assert!(
            !RoutingKnobs::from_raw(&r).0.hash_balance.is_on(),
            "0 = off"
        );
        r.balance = BalanceArgs {
            hash: HashBalanceArgs {
                hash_balance_factor: "0.5".into(),
                hash_balance_floor: "-1".into(),
            },
            cache_aware_balance_factor: "0.9".into(),
            cache_aware_index_budget: "lots".into(),
            route_header: false,
        };
        let (k, w) = RoutingKnobs::from_raw(&r);
        assert_eq!(k, RoutingKnobs::default());
        let names: Vec<_> = w.iter().map(|w| w.knob).collect();
        assert_eq!(
            names,
            [
                "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
                "FLEXINFER_PROXY_HASH_BALANCE_FLOOR",
                "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
                "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET"
            ]
        );
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("1 GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("-1").is_err() && parse_bytes("1.5MiB").is_err());
    }
}
