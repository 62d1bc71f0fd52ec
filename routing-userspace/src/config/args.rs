//! The command line of `serve` (and the routing flags `replay` and `config check` share), as
//! clap structs. Every default is the `DEFAULT` of the setting it feeds, declared once where
//! that setting lives; [`super::settings`] turns these into typed settings.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::parse::{
    format_bytes, format_duration, parse_budget, parse_header_limit, parse_label_selector,
    parse_listen, parse_metrics_path, parse_positive_duration, parse_share, Dur,
};
use crate::admission::capacity::{Above, DEFAULT_FULL_WHEN};
use crate::admission::metrics::DEFAULT_TENANT_LABEL_CAP;
use crate::admission::settings::{
    parse_queue_max_size, parse_queue_timeout, DEFAULT_QUEUE_MAX_SIZE, DEFAULT_QUEUE_TIMEOUT,
    DEFAULT_SHEDDABLE_TIMEOUT,
};
use crate::balance::least_loaded::MAX_RANKED;
use crate::metrics::KeyTracking;
use crate::proxy::retry_budget::RetryBudget;
use crate::proxy::retry_on::RetryOn;
use crate::proxy::server::ServeOptions;
use crate::proxy::RequestLimits;
use crate::router::health::EjectionPolicy;
use crate::router::RoutingKnobs;
use crate::signals::{store::DEFAULT_STALENESS, ScrapeConfig};
use crate::telemetry::settings::DEFAULT_SERVICE_NAME;
use crate::telemetry::TraceSettings;
use crate::upstream::UpstreamOptions;

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
    #[arg(long, env = "FLEXINFER_PROXY_CONFIG_POLL", default_value_t = Dur(crate::discovery::file::DEFAULT_POLL))]
    pub config_poll: Dur,

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

    /// Watch Gateway API InferencePools (with --discovery kubernetes), so that a Model's
    /// `spec.inferencePoolRef` takes its pods from the pool; Pods are watched only while some
    /// Model names a pool. `false`: no InferencePool or Pod watch, and such Models have no pods.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_INFERENCE_POOLS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub inference_pools: bool,

    /// Kubeconfig file (else in-cluster config, else the default kubeconfig).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Tokio worker threads (default: one per core).
    #[arg(long, env = "FLEXINFER_PROXY_WORKER_THREADS")]
    pub worker_threads: Option<usize>,

    /// Largest request body buffered for routing; larger requests get 413.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_BODY_BYTES", default_value_t = RequestLimits::DEFAULT.max_body_bytes)]
    pub max_body_bytes: usize,

    /// Upstream TCP connect timeout.
    #[arg(long, env = "FLEXINFER_PROXY_CONNECT_TIMEOUT", default_value_t = Dur(UpstreamOptions::DEFAULT.connect_timeout))]
    pub connect_timeout: Dur,

    /// Idle upstream connections older than this are closed, not reused (keep it below the
    /// model servers' keep-alive timeout: uvicorn, behind vLLM, closes after 5 s).
    #[arg(long, env = "FLEXINFER_PROXY_UPSTREAM_IDLE_TIMEOUT", default_value_t = Dur(UpstreamOptions::DEFAULT.idle_timeout))]
    pub upstream_idle_timeout: Dur,

    /// Keep-alive pooling of upstream connections.
    #[arg(
        long,
        value_enum,
        env = "FLEXINFER_PROXY_UPSTREAM_KEEPALIVE",
        default_value = "auto"
    )]
    pub upstream_keepalive: KeepAlive,

    /// How long in-flight requests may finish after SIGTERM (after the shutdown delay).
    #[arg(long, env = "FLEXINFER_PROXY_DRAIN_TIMEOUT", default_value_t = Dur(ServeOptions::PROXY.drain))]
    pub drain_timeout: Dur,

    /// After SIGTERM, how long /readyz answers 503 while the proxy still serves, so Kubernetes
    /// takes the endpoint out before the proxy stops accepting (the pre-stop delay).
    #[arg(long, env = "FLEXINFER_PROXY_SHUTDOWN_DELAY", default_value_t = Dur(super::settings::DEFAULT_SHUTDOWN_DELAY))]
    pub shutdown_delay: Dur,

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
    pub signals: SignalArgs,

    #[command(flatten)]
    pub admission: AdmissionArgs,

    #[command(flatten)]
    pub trace: TraceArgs,

    /// Cap on distinct keys tracked exactly per (model, strategy, key_source) series.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_KEY_CARDINALITY_CAP",
        default_value_t = KeyTracking::DEFAULT.cardinality_cap
    )]
    pub key_cardinality_cap: usize,

    /// Cardinality window: keys count for one to two windows (two rotating generations); 0
    /// counts forever.
    #[arg(long, env = "FLEXINFER_PROXY_KEY_CARDINALITY_WINDOW", default_value_t = Dur(KeyTracking::DEFAULT.cardinality_window.unwrap_or_default()))]
    pub key_cardinality_window: Dur,

    /// Hottest keys listed per model in /debug/routing (space-saving top-k); 0 disables.
    #[arg(long, env = "FLEXINFER_PROXY_HOT_KEYS", default_value_t = KeyTracking::DEFAULT.hot_keys)]
    pub hot_keys: usize,

    /// Half-life of the hot-key counts (shares describe recent traffic); 0 never decays.
    #[arg(long, env = "FLEXINFER_PROXY_HOT_KEYS_HALF_LIFE", default_value_t = Dur(KeyTracking::DEFAULT.hot_keys_half_life.unwrap_or_default()))]
    pub hot_keys_half_life: Dur,
}

/// How long the proxy waits, for the pod and for the client. Each ends in an OpenAI-shaped
/// 504 (or, once an SSE stream has started, a final SSE error event and a close).
#[derive(Debug, Clone, Args)]
pub struct TimeoutArgs {
    /// From sending a request to a pod to its response head (long enough for a cold start and
    /// a long non-streaming generation); 0 waits forever.
    #[arg(long, env = "FLEXINFER_PROXY_FIRST_BYTE_TIMEOUT", default_value_t = Dur(RequestLimits::DEFAULT.first_byte_timeout))]
    pub first_byte_timeout: Dur,

    /// Longest pause between two chunks of a response body; 0 waits forever.
    #[arg(long, env = "FLEXINFER_PROXY_STREAM_IDLE_TIMEOUT", default_value_t = Dur(RequestLimits::DEFAULT.stream_idle_timeout))]
    pub stream_idle_timeout: Dur,

    /// A client must send a request's head within this (against slowloris; also how long an
    /// idle client connection stays open).
    #[arg(long, env = "FLEXINFER_PROXY_HEADER_READ_TIMEOUT", default_value_t = Dur(ServeOptions::PROXY.header_read_timeout))]
    pub header_read_timeout: Dur,

    /// Longest a whole request may take, response body included; 0 (the default) is no limit.
    #[arg(long, env = "FLEXINFER_PROXY_REQUEST_TIMEOUT", default_value_t = Dur(RequestLimits::DEFAULT.request_timeout))]
    pub request_timeout: Dur,
}

/// Bounds on what a client may send.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Largest request head (request line and headers) in bytes; larger ones get 431.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_HEADER_BYTES", default_value_t = ServeOptions::PROXY.max_head_bytes,
          value_parser = parse_header_limit)]
    pub max_header_bytes: usize,

    /// Client connections served at once; the next ones get 503 with Retry-After. Lowered at
    /// start to what the open-files limit fits (two descriptors a connection, with its
    /// upstream one), after raising that limit as far as the process may.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_MAX_CLIENT_CONNECTIONS",
        default_value_t = ServeOptions::PROXY.max_connections
    )]
    pub max_client_connections: usize,

    /// Deepest JSON nesting the proxy parses in a request body; deeper bodies get 400.
    #[arg(long, env = "FLEXINFER_PROXY_MAX_JSON_DEPTH", default_value_t = RequestLimits::DEFAULT.max_json_depth)]
    pub max_json_depth: u32,
}

/// Retries and passive outlier ejection.
#[derive(Debug, Clone, Args)]
pub struct ResilienceArgs {
    /// Retries (after a reset or a `--retry-on-status` answer, before any byte reached the client) may
    /// add at most this share of requests, over a 10 s window (connect failures, which send
    /// nothing, always move on).
    #[arg(long, env = "FLEXINFER_PROXY_RETRY_BUDGET", default_value_t = RetryBudget::DEFAULT_SHARE, value_parser = parse_share)]
    pub retry_budget: f64,

    /// Retries always allowed per second, whatever the budget (so a quiet model can retry).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_RETRY_MIN_PER_SECOND",
        default_value_t = RetryBudget::DEFAULT_MIN_PER_SECOND
    )]
    pub retry_min_per_second: u32,

    /// Pod answers retried on the next candidate, before any byte reached the client and
    /// within the retry budget: a comma-separated list of 429 and 5xx statuses, or "none".
    #[arg(
        long,
        env = "FLEXINFER_PROXY_RETRY_ON_STATUS",
        default_value_t = RetryOn::DEFAULT
    )]
    pub retry_on_status: RetryOn,

    /// Consecutive failures (connect errors, 5xx answers) that eject a pod; a connect or
    /// first-byte timeout ejects at once. 0 disables ejection.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_EJECT_AFTER_FAILURES",
        default_value_t = EjectionPolicy::DEFAULT.after_failures
    )]
    pub eject_after_failures: u32,

    /// First ejection's cool-down; each repeat ejection doubles it, up to 32 times.
    #[arg(long, env = "FLEXINFER_PROXY_EJECT_BASE_TIME", default_value_t = Dur(EjectionPolicy::DEFAULT.base_time))]
    pub eject_base_time: Dur,

    /// Largest share of a model's pods ejected at once (at least one may always be).
    #[arg(long, env = "FLEXINFER_PROXY_MAX_EJECTED_SHARE", default_value_t = EjectionPolicy::DEFAULT.max_share, value_parser = parse_share)]
    pub max_ejected_share: f64,
}

/// The routing knobs: the spec's as raw text (invalid values fall back to the defaults with a
/// warning, as the spec wants), validated by [`super::settings::routing_knobs`].
#[derive(Debug, Clone, Args)]
pub struct RoutingArgs {
    /// Longest accepted explicit cache key (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
        default_value_t = RoutingKnobs::DEFAULT.limits.explicit_key_max_length.to_string()
    )]
    pub explicit_key_max_length: String,

    /// System-message segment length used by canonical context (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
        default_value_t = RoutingKnobs::DEFAULT.limits.system_segment_max_length.to_string()
    )]
    pub system_segment_max_length: String,

    /// Document-context segment length used by canonical context (characters).
    #[arg(
        long,
        env = "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
        default_value_t = RoutingKnobs::DEFAULT.limits.document_segment_max_length.to_string()
    )]
    pub document_segment_max_length: String,

    /// Least-loaded reservation lifetime ("10s", "500ms", or seconds); 0 disables reservations.
    #[arg(
        long,
        env = "PROXY_LEAST_LOADED_RESERVATION_TTL",
        default_value_t = format_duration(RoutingKnobs::DEFAULT.reservation_ttl)
    )]
    pub least_loaded_reservation_ttl: String,

    /// Member selection in shared service-label groups.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
        default_value_t = RoutingKnobs::DEFAULT.label_group_mode.to_string()
    )]
    pub label_group_routing: String,

    /// Pods tried (the pick, then alternates) when connecting fails, before the Service (1-16).
    #[arg(long, env = "FLEXINFER_PROXY_MAX_POD_ATTEMPTS", default_value_t = RoutingKnobs::DEFAULT.max_pod_attempts as u16,
          value_parser = clap::value_parser!(u16).range(1..=MAX_RANKED as i64))]
    pub max_pod_attempts: u16,

    #[command(flatten)]
    pub balance: BalanceArgs,
}

/// The hash-balance bound, as raw text.
#[derive(Debug, Clone, Args)]
pub struct HashBalanceArgs {
    /// Bounded-load factor c for prefix and the prefix/session label-group modes
    /// (session-affinity and cache-aware models have their own factors): a pod takes a new request only while its load is under
    /// max(ceil(c x mean load), floor), where mean load = (requests in flight + reservations
    /// over the candidate pods + 1) / pods; else the next pod on the ring under the bound takes
    /// it. 0 turns the bound off (the spec's plain ring).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
        default_value_t = RoutingKnobs::DEFAULT.hash_balance.factor().to_string()
    )]
    pub hash_balance_factor: String,

    /// The least bound of --hash-balance-factor: a pod with fewer requests in flight always
    /// takes its keys, so light traffic routes exactly as the plain ring does.
    #[arg(long, env = "FLEXINFER_PROXY_HASH_BALANCE_FLOOR", default_value_t = RoutingKnobs::DEFAULT.hash_balance.floor.to_string())]
    pub hash_balance_floor: String,
}

/// Bounded-load hashing, the cache-aware index and the route header (beyond the spec), as raw
/// text where the spec's knobs are raw text.
#[derive(Debug, Clone, Args)]
pub struct BalanceArgs {
    #[command(flatten)]
    pub hash: HashBalanceArgs,

    /// The bounded-load factor of cache-aware models (its floor is --hash-balance-floor).
    /// Looser than the rings' because a prefix half the pods hold also counts for a pod much less
    /// busy than its holders, so load spreads without a tight bound, and every spill costs the
    /// cache hits of a whole conversation; see docs/routing-quality.md. 0 turns the bound off
    /// for them.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
        default_value_t = (f64::from(RoutingKnobs::DEFAULT.cache_aware_factor_milli) / 1000.0).to_string()
    )]
    pub cache_aware_balance_factor: String,

    /// The bounded-load factor of session-affinity models (its floor is --hash-balance-floor).
    /// Looser than the prefix rings': a session moved by a momentary burst loses its whole
    /// KV-cache, and bursts of in-flight counts are short; see docs/routing-quality.md. 0
    /// turns the bound off for them.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_SESSION_BALANCE_FACTOR",
        default_value_t = (f64::from(RoutingKnobs::DEFAULT.session_factor_milli) / 1000.0).to_string()
    )]
    pub session_balance_factor: String,

    /// Memory the cache-aware prefix index may use (all models and pods of this proxy): bytes,
    /// or with a unit (KiB, MiB, GiB, KB, MB, GB); about 40 bytes per (prefix link, pod).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET",
        default_value_t = format_bytes(RoutingKnobs::DEFAULT.cache_aware_index_budget)
    )]
    pub cache_aware_index_budget: String,

    /// Longest a cache-aware request waits when another request is still prefilling its prompt
    /// on its pod (a streamed answer, until its first token): engines do not share a prefill in
    /// progress, so sent at once it would compute the same prompt beside the first. On llama.cpp
    /// pods (the model's engine, or their metrics pages read as llama.cpp's) the prompt stays in
    /// the first request's slot until its answer ends: the wait lasts until that end, the
    /// waiters go one per end, and a waiter stops once the slot has been busy past the first
    /// token as long as the prompt took to compute. Another proxy's request is waited for too
    /// when the pod's `/slots` shows the prompt only in a slot still computing it while
    /// another slot is free. 0: never waits.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_CACHE_AWARE_PREFILL_WAIT",
        default_value_t = Dur(RoutingKnobs::DEFAULT.cache_aware_prefill_wait)
    )]
    pub cache_aware_prefill_wait: Dur,

    /// Add an `x-flexinfer-route` header to routed responses: strategy, key source, outcome,
    /// matched depth (cache-aware), spill, `passed-over=N` when the pick passed over full or
    /// ejected pods, and `prefill-wait=<ms>ms` when a cache-aware request waited for another's
    /// prefill of its prompt. Never key text.
    #[arg(long, env = "FLEXINFER_PROXY_ROUTE_HEADER", default_value_t = RoutingKnobs::DEFAULT.route_header)]
    pub route_header: bool,
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
        default_value = crate::ebpf::DEFAULT_PIN_DIR
    )]
    pub bpf_pin_dir: PathBuf,

    /// The bpffs mount point.
    #[arg(long, env = "FLEXINFER_PROXY_BPFFS", default_value = crate::ebpf::DEFAULT_BPFFS)]
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

/// Engine-signal options: the pods' own load reports, in-band and scraped.
#[derive(Debug, Clone, Args)]
pub struct SignalArgs {
    /// Ask engines for a load report on each forwarded request
    /// (`endpoint-load-metrics-format: text`) and read the one they answer with.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_LOAD_REPORTS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub engine_load_reports: bool,

    /// How long an engine load report counts in its pod's load.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_REPORT_STALENESS",
        default_value_t = Dur(DEFAULT_STALENESS),
        value_parser = parse_positive_duration
    )]
    pub engine_report_staleness: Dur,

    /// Reads of each pod's metrics page per second, by the whole fleet (0 = never scrape).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_BUDGET",
        default_value_t = ScrapeConfig::default().budget,
        value_parser = parse_budget
    )]
    pub engine_scrape_budget: f64,

    /// The longest a scraped report counts, however rarely a large fleet lets one proxy read.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_MAX_AGE",
        default_value_t = Dur(ScrapeConfig::default().max_report_age),
        value_parser = parse_positive_duration
    )]
    pub engine_scrape_max_age: Dur,

    /// Time cap of one page read, connect to last byte.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_TIMEOUT",
        default_value_t = Dur(ScrapeConfig::default().timeout),
        value_parser = parse_positive_duration
    )]
    pub engine_scrape_timeout: Dur,

    /// Also read each llama.cpp pod's `/slots` page, when it shows the
    /// slots' prompts (the server runs with LLAMA_SERVER_SLOTS_DEBUG=1): the proxies of a
    /// fleet then find a document where another proxy placed it, and place new ones where the
    /// pods hold least. Only fingerprints of the text are kept. A pod that shows no prompts is
    /// asked again after 10 minutes. Off with --engine-scrape-budget 0, which stops every
    /// read of the engines' pages.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SLOT_PROMPTS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub engine_slot_prompts: bool,

    /// Reads of each llama.cpp pod's `/slots` page per second, by the whole fleet (with
    /// --engine-slot-prompts). A proxy reads a pod every fleet size / budget seconds (3
    /// proxies: every 0.75 s; 100: every 25 s).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SLOT_PROMPTS_BUDGET",
        default_value_t = ScrapeConfig::default().slot_prompts_budget,
        value_parser = parse_budget
    )]
    pub engine_slot_prompts_budget: f64,

    /// The engines' metrics path.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_METRICS_PATH",
        default_value_t = ScrapeConfig::default().path,
        value_parser = parse_metrics_path
    )]
    pub engine_metrics_path: http::uri::PathAndQuery,

    /// Proxies in the fleet (> 0 wins over counting them). 0: with --discovery kubernetes,
    /// the Running and Ready pods of --fleet-selector in --fleet-namespace; else 1. Scrapes
    /// per proxy are spread by it; at 1 the proxy routes alone (cache-aware ties also keep
    /// even what each pod was sent lately); above 1, a cache-aware prompt the proxy knows no
    /// holder of waits in the queue of the pod the hash picks, where the other proxies send it.
    #[arg(long, env = "FLEXINFER_PROXY_FLEET_SIZE", default_value_t = 0)]
    pub fleet_size: usize,

    /// This proxy's rank in the fleet, 0 to --fleet-size less one (with --fleet-size; counted
    /// fleets rank by --fleet-pod-name). Where every pod shows what its slots hold, proxies
    /// of distinct ranks place prompts no pod holds yet on distinct pods, so that new prompts
    /// the fleet gets at once (one or several) are not computed side by side on one pod.
    #[arg(long, env = "FLEXINFER_PROXY_FLEET_RANK", default_value_t = 0)]
    pub fleet_rank: usize,

    /// This proxy's own pod (the chart sets it), ranked among the fleet's counted pods by
    /// name (with --discovery kubernetes and no --fleet-size); empty: rank 0.
    #[arg(long, env = "FLEXINFER_PROXY_FLEET_POD_NAME", default_value = "")]
    pub fleet_pod_name: String,

    /// Label selector of the proxy's own pods, counted as the fleet (with --discovery
    /// kubernetes and no --fleet-size).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_FLEET_SELECTOR",
        default_value = crate::discovery::kube::DEFAULT_FLEET_SELECTOR,
        value_parser = parse_label_selector
    )]
    pub fleet_selector: String,

    /// Namespace of the proxy's own pods (the chart sets the pod's namespace); empty: the
    /// service account's namespace in a cluster, else the kubeconfig context's.
    #[arg(long, env = "FLEXINFER_PROXY_FLEET_NAMESPACE", default_value = "")]
    pub fleet_namespace: String,
}

/// Admission (see `crate::admission`): the proxy-wide defaults of every model's queue, and
/// when a pod counts as full from its engine's reports. Models set their own `maxConcurrency`,
/// `queue.*` and token budget.
#[derive(Debug, Clone, Args)]
pub struct AdmissionArgs {
    /// Requests a model's queue holds while its pods are full (models: `queue.maxSize`); past
    /// it, 429 queue_full. 0: no queue.
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_MAX_SIZE", default_value_t = DEFAULT_QUEUE_MAX_SIZE,
          value_parser = parse_queue_max_size)]
    pub queue_max_size: u32,

    /// Longest wait in a model's queue before 429 queue_timeout (models: `queue.timeout`).
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_TIMEOUT", default_value_t = Dur(DEFAULT_QUEUE_TIMEOUT),
          value_parser = |s: &str| parse_queue_timeout(s).map(Dur))]
    pub queue_timeout: Dur,

    /// Longest wait of a sheddable request (negative x-flexinfer-priority), at most
    /// --queue-timeout (models: `queue.sheddableTimeout`).
    #[arg(long, env = "FLEXINFER_PROXY_QUEUE_SHEDDABLE_TIMEOUT", default_value_t = Dur(DEFAULT_SHEDDABLE_TIMEOUT),
          value_parser = |s: &str| parse_queue_timeout(s).map(Dur))]
    pub queue_sheddable_timeout: Dur,

    /// A pod whose fresh engine report shows more waiting requests than this is full; "off"
    /// ignores the waiting count.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_FULL_WHEN_WAITING_ABOVE",
        default_value_t = DEFAULT_FULL_WHEN.waiting_above
    )]
    pub full_when_waiting_above: Above<u64>,

    /// A pod whose fresh engine report shows KV-cache use above this share (0 to 1) is full;
    /// "off" ignores it.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_FULL_WHEN_KV_USAGE_ABOVE",
        default_value_t = DEFAULT_FULL_WHEN.kv_usage_above
    )]
    pub full_when_kv_usage_above: Above<f64>,

    /// Tenants with their own `tenant` label on flexinfer_proxy_tokens_charged_total per
    /// model; later ones count as "other".
    #[arg(long, env = "FLEXINFER_PROXY_TENANT_METRIC_CAP", default_value_t = DEFAULT_TENANT_LABEL_CAP)]
    pub tenant_metric_cap: usize,
}

/// OpenTelemetry traces, by the standard OTEL variables. Off without an endpoint.
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// OTLP/HTTP base URL of the collector (`/v1/traces` is appended), e.g.
    /// http://127.0.0.1:4318. Empty: no traces.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// OTLP/HTTP traces URL, used as it is (wins over --otlp-endpoint).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,

    /// PEM file of the CAs an https collector's certificate may chain to, trusted beside the
    /// platform's roots.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_CERTIFICATE")]
    pub otlp_certificate: Option<std::path::PathBuf>,

    /// The same for the traces endpoint (wins over --otlp-certificate).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")]
    pub otlp_traces_certificate: Option<std::path::PathBuf>,

    /// Export request bodies compressed: gzip or none (the default). Worth it when the
    /// collector is across a network; it costs the proxy CPU.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_COMPRESSION")]
    pub otlp_compression: Option<String>,

    /// The same for traces (wins over --otlp-compression).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION")]
    pub otlp_traces_compression: Option<String>,

    /// The exporter's cap on one export request (milliseconds, or a duration); the shorter of
    /// it and --trace-export-timeout applies.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TIMEOUT", value_parser = parse_millis)]
    pub otlp_timeout: Option<Dur>,

    /// The same for traces (wins over --otlp-timeout).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", value_parser = parse_millis)]
    pub otlp_traces_timeout: Option<Dur>,

    /// The OTLP protocol: only http/protobuf is exported; another value is ignored with a
    /// warning.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<String>,

    /// The same for traces (wins over --otlp-protocol).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")]
    pub otlp_traces_protocol: Option<String>,

    /// `service.name` of the spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = DEFAULT_SERVICE_NAME)]
    pub otel_service_name: String,

    /// Which requests are traced: always_on, always_off, traceidratio, parentbased_always_on,
    /// parentbased_always_off, parentbased_traceidratio.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        default_value_t = crate::telemetry::sampler::Sampler::DEFAULT.to_string()
    )]
    pub otel_traces_sampler: String,

    /// The ratio (0 to 1) of the traceidratio samplers.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG")]
    pub otel_traces_sampler_arg: Option<String>,

    /// Ended spans waiting for export; past it they are dropped and counted.
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = TraceSettings::DEFAULT.queue_size)]
    pub trace_queue_size: usize,

    /// Spans per export request.
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value_t = TraceSettings::DEFAULT.batch_size)]
    pub trace_batch_size: usize,

    /// Longest a span waits for its batch (milliseconds, or a duration such as 500ms).
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value_t = Dur(TraceSettings::DEFAULT.batch_delay),
          value_parser = parse_millis)]
    pub trace_batch_delay: Dur,

    /// One export request's time cap; past it the batch is dropped and counted
    /// (milliseconds, or a duration).
    #[arg(long, env = "OTEL_BSP_EXPORT_TIMEOUT", default_value_t = Dur(TraceSettings::DEFAULT.export_timeout),
          value_parser = parse_millis)]
    pub trace_export_timeout: Dur,
}

/// The OTEL variables' milliseconds (a bare number), or one of our durations.
fn parse_millis(s: &str) -> Result<Dur, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) => Ok(Dur(std::time::Duration::from_millis(ms))),
        Err(_) => super::parse::parse_duration(s)
            .map(Dur)
            .map_err(|e| e.to_string()),
    }
}
