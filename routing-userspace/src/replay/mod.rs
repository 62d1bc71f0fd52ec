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
pub mod reports;
pub mod routers;
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
use fleet::{Arrivals, FleetSpec, PodTiming};
use placement::{Greedy, MODEL};
use report::Report;
use reports::ReportKinds;
use routers::{ReportSettings, Routers};
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
    #[arg(long, default_value_t = 1.0, conflicts_with = "in_flight")]
    pub speedup: f64,

    /// Closed loop: keep this many requests in flight (the next sent as one finishes),
    /// ignoring the trace's timestamps.
    #[arg(long)]
    pub in_flight: Option<usize>,

    /// Proxies in front of the pods, each with its own router, index, gauge and view of the
    /// engines' reports (a DaemonSet on this many nodes); request i goes through router
    /// i mod N. A list (`1,4,8`) replays each fleet size in turn and ends with a table of
    /// the router rows side by side.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub routers: Vec<usize>,

    /// Which engine load reports the routers get.
    #[arg(long, value_enum, default_value_t = ReportKinds::Both)]
    pub engine_reports: ReportKinds,

    /// From a pod's state to the router that reads it, milliseconds.
    #[arg(long, default_value_t = 50)]
    pub report_delay_ms: u64,

    /// Scrapes per pod per second for the whole fleet of routers (serve's
    /// --engine-scrape-budget).
    #[arg(long, default_value_t = crate::signals::ScrapeConfig::default().budget)]
    pub engine_scrape_budget: f64,

    /// How long an in-band report counts, milliseconds (serve's --engine-report-staleness).
    #[arg(long, default_value_t = crate::signals::store::DEFAULT_STALENESS.as_millis() as u64)]
    pub engine_report_staleness_ms: u64,

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
            arrivals: match self.in_flight {
                Some(in_flight) => Arrivals::Closed { in_flight },
                None => Arrivals::Trace {
                    speedup: self.speedup,
                },
            },
        }
    }

    fn front(&self, routers: usize) -> Front {
        Front {
            routers,
            reports: ReportSettings {
                kinds: self.engine_reports,
                delay: std::time::Duration::from_millis(self.report_delay_ms),
                scrape_budget: self.engine_scrape_budget,
                staleness: std::time::Duration::from_millis(self.engine_report_staleness_ms),
            },
        }
    }
}

/// What stands in front of the pods: how many routers, and what they hear of the engines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Front {
    pub routers: usize,
    pub reports: ReportSettings,
}

impl Default for Front {
    fn default() -> Self {
        Self {
            routers: 1,
            reports: ReportSettings::default(),
        }
    }
}

/// Replay `requests` through one row: router rows through `front`'s routers, the references
/// (greedy, limit) as they are.
pub fn replay_row(
    row: Row,
    requests: &[TraceRequest],
    (fleet, front): (&FleetSpec, &Front),
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
                    session_factor_milli: 0,
                    ..knobs
                },
            };
            let bound = knobs.balance_for(&Routers::model_spec(strategy, pods));
            let mut p = Routers::new(
                (strategy, knobs),
                (front.routers, pods),
                front.reports,
                chat.clone(),
                requests.len(),
            );
            let served = fleet::run(requests, fleet, &mut p);
            let mut report = Report::new(row.name(), &served, pods, Some(p.spills));
            if bound.is_on() {
                let oracle = fleet::run(requests, fleet, &mut Greedy { balance: bound });
                report.oracle_hit_ratio = Some(Report::new("", &oracle, pods, None).hit_ratio);
            }
            report
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
                arrivals: fleet.arrivals,
            };
            let mut one_pod = Greedy {
                balance: HashBalance::OFF,
            };
            let served = fleet::run(requests, &one, &mut one_pod);
            Report::new(row.name(), &served, 1, None)
        }
    }
}

/// The line above the table: the trace, the fleet, the arrivals, the routers and the knobs.
fn header(
    args: &ReplayArgs,
    path: &std::path::Path,
    requests: &[TraceRequest],
    knobs: &RoutingKnobs,
) -> String {
    let span_s = requests.last().map_or(0, |r| r.timestamp) as f64 / 1000.0;
    let arrivals = match args.in_flight {
        Some(n) => format!("closed loop, {n} in flight"),
        None => format!(
            "at the trace's times over {:.0} s (speedup {})",
            span_s / args.speedup,
            args.speedup
        ),
    };
    let reports = match args.engine_reports {
        ReportKinds::None => "no engine reports".to_owned(),
        kinds => format!(
            "engine reports {} {} ms late, scrape budget {}/pod/s",
            kinds
                .to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default(),
            args.report_delay_ms,
            args.engine_scrape_budget
        ),
    };
    format!(
        "replay: {} ({} requests, {arrivals}), {} pods x {} blocks of {} tokens, at most {} running per pod, prefill {} us/token, decode {} us/token; {} router(s), request i through router i mod {}, {reports}; hash balance factor {} floor {}, cache-aware factor {}, session factor {}",
        path.display(),
        requests.len(),
        args.pods,
        args.cache_blocks,
        args.block_tokens,
        args.max_running,
        args.prefill_us_per_token,
        args.decode_us_per_token,
        routers_text(&args.routers),
        "N",
        knobs.hash_balance.factor(),
        knobs.hash_balance.floor,
        f64::from(knobs.cache_aware_factor_milli) / 1000.0,
        f64::from(knobs.session_factor_milli) / 1000.0,
    )
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
    if args.routers.contains(&0) || args.in_flight == Some(0) {
        bail!("--routers and --in-flight must be positive");
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
    println!("{}\n", header(args, path, &requests, &knobs));
    let fleet = args.fleet();
    let mut fleets = Vec::new();
    for &n in &args.routers {
        let front = args.front(n);
        let reports: Vec<Report> = rows
            .iter()
            .map(|&row| replay_row(row, &requests, (&fleet, &front), knobs, &chat))
            .collect();
        if args.routers.len() > 1 {
            println!("### {n} router(s)\n");
        }
        println!("{}", report::table(&reports));
        fleets.push((n, reports));
    }
    if args.routers.len() > 1 {
        let limit = replay_row(
            Row::Limit,
            &requests,
            (&fleet, &args.front(1)),
            knobs,
            &chat,
        );
        println!("### Side by side\n");
        print!("{}", report::fleets(limit.hit_ratio, &fleets));
    }
    Ok(())
}

fn routers_text(routers: &[usize]) -> String {
    let list: Vec<String> = routers.iter().map(usize::to_string).collect();
    list.join(", ")
}
