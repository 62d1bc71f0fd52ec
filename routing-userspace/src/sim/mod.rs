//! `flexinfer-proxy sim`: a simulated OpenAI-compatible model server, one stand-in GPU replica.
//!
//! Routing strategies are judged by what replicas do with the requests they get: a prefix-cache
//! hit makes the first token cheap, a busy replica makes requests queue. The sim models just that
//! (a vLLM-style chained-block prefix cache, a time to first token that grows with the uncached
//! prompt, a fixed inter-token delay, a concurrency limit) and says who served each request and
//! how much of its prompt was cached, so the demo, tests and benchmarks can score routing without
//! GPUs. It reports its load as vLLM does (`engine`: vLLM's gauge names on `/metrics`, the
//! ORCA `endpoint-load-metrics` header when asked) and its cache hits in
//! `usage.prompt_tokens_details.cached_tokens`, so the proxy's engine signals run against it. Output text is filler and all waiting is on the tokio clock, so many replicas share a
//! core.

pub mod cache;
mod engine;
mod metrics;
mod openai;
pub mod prompt;
mod server;
pub mod timing;
pub mod tokens;

#[cfg(test)]
mod tests;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use anyhow::Context as _;

pub use server::serve;
pub use timing::Timing;

pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9001));
pub const DEFAULT_CACHE_BLOCKS: usize = 4096;
pub const DEFAULT_BLOCK_TOKENS: usize = 16;
pub const DEFAULT_TTFT_BASE_MS: u64 = 5;
pub const DEFAULT_PREFILL_US_PER_TOKEN: u64 = 200;
pub const DEFAULT_CACHED_PREFILL_US_PER_TOKEN: u64 = 5;
pub const DEFAULT_INTER_TOKEN_MS: u64 = 2;
pub const DEFAULT_MAX_CONCURRENCY: usize = 8;
pub const DEFAULT_MAX_TOKENS: u64 = 16;
pub const DEFAULT_SERVED_MODEL: &str = "sim-model";
pub const DEFAULT_EMBEDDING_DIM: usize = 8;
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 5000;

/// Flags of `flexinfer-proxy sim`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct SimArgs {
    /// Address to listen on (HTTP/1.1 and h2c).
    #[arg(long, env = "FLEXINFER_SIM_LISTEN", default_value_t = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Replica identity for `x-sim-pod` and `system_fingerprint`; by default "sim-" and the
    /// listen address.
    #[arg(long, env = "FLEXINFER_SIM_NAME")]
    pub name: Option<String>,
    /// Prefix cache capacity in blocks (LRU; 0 disables caching).
    #[arg(long, env = "FLEXINFER_SIM_CACHE_BLOCKS", default_value_t = DEFAULT_CACHE_BLOCKS)]
    pub cache_blocks: usize,
    /// Tokens per cache block.
    #[arg(long, env = "FLEXINFER_SIM_BLOCK_TOKENS", default_value_t = DEFAULT_BLOCK_TOKENS)]
    pub block_tokens: usize,
    /// Fixed part of time to first token, in milliseconds.
    #[arg(long, env = "FLEXINFER_SIM_TTFT_BASE_MS", default_value_t = DEFAULT_TTFT_BASE_MS)]
    pub ttft_base_ms: u64,
    /// Prefill cost of each uncached prompt token, in microseconds.
    #[arg(
        long,
        env = "FLEXINFER_SIM_PREFILL_US_PER_TOKEN",
        default_value_t = DEFAULT_PREFILL_US_PER_TOKEN
    )]
    pub prefill_us_per_token: u64,
    /// Prefill cost of each cached prompt token, in microseconds.
    #[arg(
        long,
        env = "FLEXINFER_SIM_CACHED_PREFILL_US_PER_TOKEN",
        default_value_t = DEFAULT_CACHED_PREFILL_US_PER_TOKEN
    )]
    pub cached_prefill_us_per_token: u64,
    /// Delay between output tokens, in milliseconds.
    #[arg(long, env = "FLEXINFER_SIM_INTER_TOKEN_MS", default_value_t = DEFAULT_INTER_TOKEN_MS)]
    pub inter_token_ms: u64,
    /// Requests generating at once; more wait in FIFO order.
    #[arg(
        long,
        env = "FLEXINFER_SIM_MAX_CONCURRENCY",
        default_value_t = DEFAULT_MAX_CONCURRENCY
    )]
    pub max_concurrency: usize,
    /// Output tokens when a request sets neither `max_completion_tokens` nor `max_tokens`.
    #[arg(long, env = "FLEXINFER_SIM_DEFAULT_MAX_TOKENS", default_value_t = DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: u64,
    /// Model id listed by /v1/models (responses echo the request's `model`).
    #[arg(long, env = "FLEXINFER_SIM_SERVED_MODEL", default_value = DEFAULT_SERVED_MODEL)]
    pub served_model: String,
    /// Length of /v1/embeddings vectors.
    #[arg(long, env = "FLEXINFER_SIM_EMBEDDING_DIM", default_value_t = DEFAULT_EMBEDDING_DIM)]
    pub embedding_dim: usize,
    /// On shutdown, how long open connections may finish before they are closed, in milliseconds.
    #[arg(
        long,
        env = "FLEXINFER_SIM_DRAIN_TIMEOUT_MS",
        default_value_t = DEFAULT_DRAIN_TIMEOUT_MS
    )]
    pub drain_timeout_ms: u64,
    /// Serve `/slots` as llama.cpp's server does with LLAMA_SERVER_SLOTS_DEBUG=1: one slot per
    /// recent prompt, the last N prompts as text (0: no such page, 404).
    #[arg(long, env = "FLEXINFER_SIM_SLOT_PROMPTS", default_value_t = 0)]
    pub slot_prompts: usize,
}

impl Default for SimArgs {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN,
            name: None,
            cache_blocks: DEFAULT_CACHE_BLOCKS,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            ttft_base_ms: DEFAULT_TTFT_BASE_MS,
            prefill_us_per_token: DEFAULT_PREFILL_US_PER_TOKEN,
            cached_prefill_us_per_token: DEFAULT_CACHED_PREFILL_US_PER_TOKEN,
            inter_token_ms: DEFAULT_INTER_TOKEN_MS,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            served_model: DEFAULT_SERVED_MODEL.to_owned(),
            embedding_dim: DEFAULT_EMBEDDING_DIM,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
            slot_prompts: 0,
        }
    }
}

/// The most prompts `/slots` shows.
const MAX_SLOT_PROMPTS: usize = 256;

/// A flag value the sim cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    #[error("--name must be a valid header value: {0:?}")]
    BadName(String),
}

/// Validated settings, built once from [`SimArgs`] and the bound address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub name: String,
    pub served_model: String,
    pub cache_blocks: usize,
    pub block_tokens: usize,
    pub timing: Timing,
    pub max_concurrency: usize,
    pub default_max_tokens: u64,
    pub embedding_dim: usize,
    pub drain_timeout: Duration,
    /// Prompts `/slots` shows (0: no page).
    pub slot_prompts: usize,
}

impl Settings {
    pub(crate) fn from_args(args: &SimArgs, local: SocketAddr) -> Result<Self, ConfigError> {
        for (flag, value) in [
            ("block-tokens", args.block_tokens),
            ("max-concurrency", args.max_concurrency),
            ("embedding-dim", args.embedding_dim),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(flag));
            }
        }
        let name = args.name.clone().unwrap_or_else(|| format!("sim-{local}"));
        if name.is_empty() || http::HeaderValue::from_str(&name).is_err() {
            return Err(ConfigError::BadName(name));
        }
        Ok(Self {
            name,
            served_model: args.served_model.clone(),
            cache_blocks: args.cache_blocks,
            block_tokens: args.block_tokens,
            timing: Timing {
                ttft_base_us: args.ttft_base_ms.saturating_mul(1000),
                prefill_us_per_token: args.prefill_us_per_token,
                cached_prefill_us_per_token: args.cached_prefill_us_per_token,
                inter_token_us: args.inter_token_ms.saturating_mul(1000),
            },
            max_concurrency: args.max_concurrency,
            default_max_tokens: args.default_max_tokens,
            embedding_dim: args.embedding_dim,
            drain_timeout: Duration::from_millis(args.drain_timeout_ms),
            slot_prompts: args.slot_prompts.min(MAX_SLOT_PROMPTS),
        })
    }
}

/// Bind `args.listen` and serve until ctrl-c or SIGTERM.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding sim listener on {}", args.listen))?;
    serve(listener, args, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
