//! `flexinfer-proxy replay`: a request trace through the proxy's real routing, in simulated
//! time, against a simulated fleet; one markdown table row per strategy.
//!
//! The router is the one `serve` runs (same `Router::decide`, same table build, same knobs
//! from the same flags and variables, the same gauge type, fed with the simulated requests in
//! flight), so a replay measures the code that ships, not a model of it. Each trace request
//! becomes a chat body (see [`chat`]) and goes through the real body view and key extraction.
//! The fleet ([`fleet`]) is simple on purpose: an LRU prefix cache of blocks per pod, a running
//! limit with a queue, prefill time per uncached token and decode time per output token.
//!
//! Two references bracket the strategies: `greedy` places each request on the pod whose
//! simulated cache holds its longest prefix (an oracle no router has), and `limit` is one cache
//! with the whole fleet's capacity (the most any placement could hit).

pub mod chat;
pub mod fleet;
pub mod generate;
pub mod placement;
pub mod report;
pub mod trace;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};

use crate::balance::bounded::HashBalance;
use crate::config::RoutingArgs;
use crate::router::RoutingKnobs;
use crate::vocab::Strategy;
use chat::ChatRenderer;
use fleet::{FleetSpec, PodTiming};
use placement::{Greedy, RouterPlacement, MODEL};
use report::Report;
use trace::TraceRequest;

/// A row of the replay table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Row {
    /// Default routing without a Service: round-robin over the pods.
    RoundRobin,
    LeastLoaded,
    /// Session affinity (implicit session key) on the plain ring.
    SessionAffinity,
    /// Session affinity under the hash-balance bound.
    SessionAffinityBounded,
    /// Prefix routing (canonical context) on the plain ring.
    Prefix,
    /// Prefix routing under the hash-balance bound.
    PrefixBounded,
    /// Cache-aware (under the bound the knobs set).
    CacheAware,
    /// Oracle: the longest prefix in the simulated caches, among pods under the bound.
    Greedy,
    /// One cache of the whole fleet's capacity.
    Limit,
}

impl Row {
    pub const ALL: [Row; 9] = [
        Row::RoundRobin,
        Row::LeastLoaded,
        Row::SessionAffinity,
        Row::SessionAffinityBounded,
        Row::Prefix,
        Row::PrefixBounded,
        Row::CacheAware,
        Row::Greedy,
        Row::Limit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Row::RoundRobin => "round-robin",
            Row::LeastLoaded => "least-loaded",
            Row::SessionAffinity => "session-affinity",
            Row::SessionAffinityBounded => "session-affinity-bounded",
            Row::Prefix => "prefix",
            Row::PrefixBounded => "prefix-bounded",
            Row::CacheAware => "cache-aware",
            Row::Greedy => "greedy",
            Row::Limit => "limit",
        }
    }

    #[cfg(test)]
    fn clap_name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    /// The strategy the router runs and whether the bound applies, for router rows.
    fn routing(self) -> Option<(Strategy, bool)> {
        Some(match self {
            Row::RoundRobin => (Strategy::Default, false),
            Row::LeastLoaded => (Strategy::LeastLoaded, false),
            Row::SessionAffinity => (Strategy::SessionAffinity, false),
            Row::SessionAffinityBounded => (Strategy::SessionAffinity, true),
            Row::Prefix => (Strategy::Prefix, false),
            Row::PrefixBounded => (Strategy::Prefix, true),
            Row::CacheAware => (Strategy::CacheAware, true),
            Row::Greedy | Row::Limit => return None,
        })
    }
}

/// `flexinfer-proxy replay` options.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The trace (Mooncake JSONL: timestamp ms, input_length, output_length, hash_ids).
    #[arg(long, required_unless_present = "generate")]
    pub trace: Option<PathBuf>,

    /// Simulated pods.
    #[arg(long, default_value_t = 4)]
    pub pods: usize,

    /// Rows to run, comma-separated (default: all).
    #[arg(long = "strategy", value_enum, value_delimiter = ',')]
    pub strategies: Vec<Row>,

    /// Prefix-cache capacity of each pod, in blocks.
    #[arg(long, default_value_t = 4000)]
    pub cache_blocks: usize,

    /// Arrivals this many times faster than the trace's timestamps.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,

    /// Only the first N requests of the trace.
    #[arg(long)]
    pub requests: Option<usize>,

    /// Tokens per block (Mooncake's hash_ids are 512-token blocks).
    #[arg(long, default_value_t = 512)]
    pub block_tokens: u64,

    /// Characters of chat text per token.
    #[arg(long, default_value_t = 4)]
    pub chars_per_token: usize,

    /// Prefill time per uncached prompt token, microseconds.
    #[arg(long, default_value_t = 100)]
    pub prefill_us_per_token: u64,

    /// Decode time per output token, microseconds.
    #[arg(long, default_value_t = 20_000)]
    pub decode_us_per_token: u64,

    /// Requests a pod runs at once; more queue.
    #[arg(long, default_value_t = 16)]
    pub max_running: usize,

    /// Write a synthetic trace of this shape to --out instead of replaying.
    #[arg(long, value_enum, requires = "out")]
    pub generate: Option<generate::Shape>,

    /// Where --generate writes.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Seed of --generate.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,

    /// Conversations of --generate rag-chat.
    #[arg(long, default_value_t = 700)]
    pub conversations: usize,

    #[command(flatten)]
    pub routing: RoutingArgs,
}

impl ReplayArgs {
    fn fleet(&self) -> FleetSpec {
        FleetSpec {
            pods: self.pods,
            cache_blocks: self.cache_blocks,
            timing: PodTiming {
                block_tokens: self.block_tokens,
                prefill_us_per_token: self.prefill_us_per_token,
                decode_us_per_token: self.decode_us_per_token,
                max_running: self.max_running,
            },
            speedup: self.speedup,
        }
    }
}

/// Replay `requests` through one row.
pub fn replay_row(
    row: Row,
    requests: &[TraceRequest],
    fleet: &FleetSpec,
    knobs: RoutingKnobs,
    chat: &ChatRenderer,
) -> Report {
    let pods = fleet.pods;
    match row.routing() {
        Some((strategy, bounded)) => {
            let knobs = match bounded {
                true => knobs,
                false => RoutingKnobs {
                    hash_balance: HashBalance::OFF,
                    cache_aware_factor_milli: 0,
                    ..knobs
                },
            };
            let mut p = RouterPlacement::new(strategy, pods, knobs, chat.clone(), requests.len());
            let served = fleet::run(requests, fleet, &mut p);
            Report::new(row.name(), &served, pods, Some(p.spills))
        }
        None if row == Row::Greedy => {
            let mut greedy = Greedy {
                balance: knobs.hash_balance,
            };
            let served = fleet::run(requests, fleet, &mut greedy);
            Report::new(row.name(), &served, pods, None)
        }
        None => {
            // One pod with the whole fleet's cache and running slots.
            let one = FleetSpec {
                pods: 1,
                cache_blocks: fleet.cache_blocks * pods,
                timing: PodTiming {
                    max_running: fleet.timing.max_running * pods,
                    ..fleet.timing
                },
                speedup: fleet.speedup,
            };
            let mut one_pod = Greedy {
                balance: HashBalance::OFF,
            };
            let served = fleet::run(requests, &one, &mut one_pod);
            Report::new(row.name(), &served, 1, None)
        }
    }
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    if let Some(shape) = args.generate {
        let out = args.out.as_ref().context("--generate needs --out")?;
        let requests = match shape {
            generate::Shape::RagChat => generate::rag_chat(&generate::RagChat {
                seed: args.seed,
                conversations: args.conversations,
                block_tokens: args.block_tokens,
                ..generate::RagChat::default()
            }),
        };
        trace::write(out, &requests)?;
        println!("wrote {} requests to {}", requests.len(), out.display());
        return Ok(());
    }
    if args.pods == 0 || args.max_running == 0 || args.speedup <= 0.0 {
        bail!("--pods, --max-running and --speedup must be positive");
    }
    let path = args.trace.as_ref().context("--trace is required")?;
    let requests = trace::load(path, args.requests)?;
    if requests.is_empty() {
        bail!("{} holds no requests", path.display());
    }
    let (knobs, warnings) = crate::config::routing_knobs(&args.routing);
    for w in &warnings {
        eprintln!(
            "warning: {}={:?} is not usable; using {}",
            w.knob, w.value, w.used
        );
    }
    let rows = if args.strategies.is_empty() {
        Row::ALL.to_vec()
    } else {
        args.strategies.clone()
    };
    let chat = ChatRenderer::new(MODEL, args.block_tokens as usize, args.chars_per_token);
    let span_s = requests.last().map_or(0, |r| r.timestamp) as f64 / 1000.0 / args.speedup;
    println!(
        "replay: {} ({} requests over {:.0} s), {} pods x {} blocks of {} tokens, at most {} running per pod, prefill {} us/token, decode {} us/token, speedup {}, hash balance factor {} floor {}, cache-aware factor {}\n",
        path.display(),
        requests.len(),
        span_s,
        args.pods,
        args.cache_blocks,
        args.block_tokens,
        args.max_running,
        args.prefill_us_per_token,
        args.decode_us_per_token,
        args.speedup,
        knobs.hash_balance.factor(),
        knobs.hash_balance.floor,
        f64::from(knobs.cache_aware_factor_milli) / 1000.0,
    );
    let fleet = args.fleet();
    let reports: Vec<Report> = rows
        .iter()
        .map(|&row| replay_row(row, &requests, &fleet, knobs, &chat))
        .collect();
    print!("{}", report::table(&reports));
    Ok(())
}
