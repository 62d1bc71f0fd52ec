//! `cargo xtask bench real-llm`: routing quality on real model servers. Three llama.cpp
//! servers (xllamacpp with SmolLM2-135M from PyPI, one thread each, prompt caching on) behind
//! flexinfer-proxy with each routing, and behind smg 1.13 `--policy cache_aware`, on two
//! workloads:
//!
//! - **chat-with-doc**: a few long documents (each in its request's system message, as a
//!   real engine renders it), a different question per request, a few requests in flight;
//! - **hot-prompt**: one long system prompt shared by every request, a different user each,
//!   several requests in flight.
//!
//! Reported per run: time to first token p50 and p95 (streaming, the first SSE event), the share
//! of prompt tokens the servers found cached (`timings.cache_n`, else
//! `usage.prompt_tokens_details.cached_tokens`), requests per server and the wall time. The
//! rows are a paired comparison: every row of a run sends the same salted prompts to servers
//! started afresh for it (empty caches, one warm-up answer each; smg too is started afresh for
//! each of its runs, and a row of proxies that read the servers' slots starts once every proxy
//! has read every server anew), so every routing meets the
//! same documents and the same engines, and only its placement differs; each run (`--repeat`)
//! has its own salt, so no run finds another's prefixes cached. Requests per server are
//! counted by a small forwarder in front of each server (it counts the completions it passes
//! back, so every router is counted alike). Each server runs on an equal, fixed share of the
//! CPU (`cpu_cap`), as each replica of a real fleet has its own accelerator. Everything
//! listens on loopback; outputs go to
//! `<target>/real-llm/<unix time>/` (the table, and each request's route and cached tokens in
//! `samples-*.tsv`). It is a benchmark, never a test.
//!
//! The files: `install` (xllamacpp, the model, the launcher), `forwarder` (the counting
//! forwarders), `cpu_cap` (the servers' CPU shares), `workload` (prompts and the streaming
//! client), `table`.

mod cpu_cap;
mod forwarder;
mod install;
mod table;
mod workload;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::report::RunDir;
use flexinfer_test_support::{
    free_port, http_request, loopback, wait_http_ok, ModelEntry, ModelsFile, Proc,
};

use crate::ebpf;
use cpu_cap::CpuCap;
use forwarder::counting_forwarder;
use install::{install_llama, served_model_id, LAUNCHER};
use table::{table, Row};
use workload::{request_body, run_workload, Run};

#[derive(clap::Args)]
pub(crate) struct RealLlmBench {
    /// Model servers.
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Requests of the hot-prompt workload per routing.
    #[arg(long, default_value_t = 96)]
    pub hot_requests: usize,
    /// Requests in flight in the hot-prompt workload.
    #[arg(long, default_value_t = 9)]
    pub hot_concurrency: usize,
    /// Requests of the chat-with-doc workload per routing.
    #[arg(long, default_value_t = 36)]
    pub doc_requests: usize,
    /// Requests in flight in the chat-with-doc workload.
    #[arg(long, default_value_t = 3)]
    pub doc_concurrency: usize,
    /// Documents of the chat-with-doc workload.
    #[arg(long, default_value_t = 6)]
    pub documents: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Slots per server (llama.cpp n_parallel): requests a server runs at once, each slot
    /// keeping its last prompt's KV for the next request that shares it.
    #[arg(long, default_value_t = 2)]
    pub slots: u32,
    /// hashBalanceFloor of the bounded models (default: the proxy's own, 4). At the slot
    /// count (2) a document's third request spilled whenever its server ran two: each spill
    /// prefilled the document again (TTFT 6.9 to 7.5 s against 0.3 to 0.5 s for a hit).
    #[arg(long)]
    pub floor: Option<u64>,
    /// Runs of each row, interleaved (every row once, then again), each run with its own salt
    /// and so its own placement of the documents: a row pools its runs' requests and reports
    /// the mean wall time. One salt moved a row's cached share by 5 points and its wall by a
    /// third.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// The salt of the prompts (run r salts with "r of run <salt>"); default: the run's own
    /// directory name. Another run's salt sends it the same prompts again, to compare a
    /// setting on the same documents and placements.
    #[arg(long)]
    pub salt: Option<String>,
    /// Let the servers share the machine's CPU freely. By default each gets an equal, fixed
    /// share (cores / servers, a cgroup CPU quota), as each replica has its own accelerator.
    #[arg(long)]
    pub uncapped: bool,
    /// Only these routings, comma-separated (default, prefix, prefix-bounded, session-affinity,
    /// cache-aware, cache-aware-3-proxies, cache-aware-3-proxies-hash, smg-cache-aware) and/or
    /// workloads (chat-with-doc,
    /// hot-prompt).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
}

/// Who a routing's requests go through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Front {
    /// One flexinfer-proxy, the model that selects the routing.
    Proxy(&'static str),
    /// Three flexinfer-proxies in front of the same servers, as a DaemonSet on three nodes
    /// runs them, request i through proxy i mod 3 (each with its own index and loads, the
    /// servers' metrics pages and answers their shared truth, `--fleet-size 3` as counting
    /// the DaemonSet's pods gives it, and proxy i `--fleet-rank i` as its pod's name ranks it
    /// there). `SlotPrompts::Off`: the proxies do not read the
    /// servers' `/slots` prompts (`--engine-slot-prompts false`), so they place documents by
    /// the hash alone.
    Proxies(&'static str, SlotPrompts),
    /// smg `--policy cache_aware`.
    Smg,
}

/// Whether a fleet row's proxies read the servers' slot prompts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SlotPrompts {
    On,
    Off,
}

/// Proxies of the fleet rows.
const FLEET_PROXIES: usize = 3;

/// The routings compared: a label, and who routes it.
const ROUTINGS: [(&str, Front); 8] = [
    ("default", Front::Proxy("llm-default")),
    ("prefix", Front::Proxy("llm-prefix")),
    ("prefix-bounded", Front::Proxy("llm-prefix-bounded")),
    ("session-affinity", Front::Proxy("llm-session")),
    ("cache-aware", Front::Proxy("llm-cache-aware")),
    (
        "cache-aware-3-proxies",
        Front::Proxies("llm-cache-aware", SlotPrompts::On),
    ),
    (
        "cache-aware-3-proxies-hash",
        Front::Proxies("llm-cache-aware", SlotPrompts::Off),
    ),
    ("smg-cache-aware", Front::Smg),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Workload {
    ChatWithDoc,
    HotPrompt,
}

impl Workload {
    pub(crate) const ALL: [Workload; 2] = [Workload::ChatWithDoc, Workload::HotPrompt];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::ChatWithDoc => "chat-with-doc",
            Workload::HotPrompt => "hot-prompt",
        }
    }
}

const START_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const PATH: &str = "/v1/chat/completions";

type Routing = (&'static str, Front);

/// The routings and workloads `--only` picks (all of a kind it does not name).
fn select(only: &[String]) -> Result<(Vec<Routing>, Vec<Workload>)> {
    let routing_names: Vec<&str> = ROUTINGS.iter().map(|r| r.0).collect();
    let workload_names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
    let known: Vec<&str> = routing_names
        .iter()
        .chain(&workload_names)
        .copied()
        .collect();
    if let Some(bad) = only.iter().find(|o| !known.contains(&o.as_str())) {
        bail!("--only {bad}: not one of {}", known.join(", "));
    }
    let picked = |name: &str, of: &[&str]| {
        let named: Vec<&String> = only.iter().filter(|o| of.contains(&o.as_str())).collect();
        named.is_empty() || named.iter().any(|o| *o == name)
    };
    let routings = ROUTINGS
        .into_iter()
        .filter(|r| picked(r.0, &routing_names))
        .collect();
    let workloads = Workload::ALL
        .into_iter()
        .filter(|w| picked(w.name(), &workload_names))
        .collect();
    Ok((routings, workloads))
}

pub(crate) fn run(args: &RealLlmBench) -> Result<()> {
    if args.servers == 0 || args.hot_concurrency == 0 || args.doc_concurrency == 0 {
        bail!("--servers and the concurrencies must be positive");
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let (routings, workloads) = select(&args.only)?;
    let base = ebpf::target_dir().join("real-llm");
    let out = RunDir::create(&base)?;
    let (python, model) = install_llama(&base)?;
    let smg = if routings.iter().any(|r| r.1 == Front::Smg) {
        Some(crate::bench::peers::install_smg(
            &ebpf::target_dir().join("bench-overhead"),
        )?)
    } else {
        None
    };
    let bin = ebpf::release_proxy(!args.no_build, false)?;
    let mut fleet = Fleet::start(&python, &model, out.path(), args)?;
    let served_model = served_model_id(fleet.servers[0].addr)?;
    let (proxy, proxy_addr, admin) =
        start_proxy(&bin, "proxy", out.path(), &fleet.fronts, (1, 0, true), args)?;
    let start_fleet = |prompts: SlotPrompts| -> Result<Vec<(Proc, SocketAddr, SocketAddr)>> {
        if !routings
            .iter()
            .any(|r| matches!(r.1, Front::Proxies(_, p) if p == prompts))
        {
            return Ok(Vec::new());
        }
        (0..FLEET_PROXIES)
            .map(|i| {
                let name = match prompts {
                    SlotPrompts::On => format!("proxy-fleet-{i}"),
                    SlotPrompts::Off => format!("proxy-fleet-hash-{i}"),
                };
                let place = (FLEET_PROXIES, i, prompts == SlotPrompts::On);
                start_proxy(&bin, &name, out.path(), &fleet.fronts, place, args)
            })
            .collect()
    };
    let proxies = start_fleet(SlotPrompts::On)?;
    let hash_proxies = start_fleet(SlotPrompts::Off)?;
    let fleet_addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.1).collect();
    let fleet_admins: Vec<SocketAddr> = proxies.iter().map(|p| p.2).collect();
    let hash_addrs: Vec<SocketAddr> = hash_proxies.iter().map(|p| p.1).collect();
    out.stamp(&crate::bench::peers::versions(&[], smg.as_deref()))?;
    let salt = args.salt.clone().unwrap_or_else(|| {
        out.path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let cells: Vec<(Workload, Routing)> = workloads
        .iter()
        .flat_map(|&w| routings.iter().map(move |&r| (w, r)))
        .collect();
    let mut runs: Vec<Vec<(Run, Vec<u64>)>> = cells.iter().map(|_| Vec::new()).collect();
    for rep in 0..args.repeat {
        for (c, &(workload, (label, front))) in cells.iter().enumerate() {
            // Every row of this run: the same prompts, on servers with nothing cached but the
            // warm-up's chat template.
            let restarted = Instant::now();
            fleet.restart(&served_model)?;
            // A proxy that read a server while it restarted drops its view of the slots and
            // reads it again a few seconds later; a run started before that places its first
            // requests by the hash alone. A fleet in service does not restart every server
            // before a burst: the rows of proxies that read the slots start once every proxy
            // has read every server anew.
            match front {
                Front::Proxies(m, SlotPrompts::On) => {
                    wait_for_slot_views(&fleet_admins, m, restarted.elapsed())?
                }
                Front::Proxy(m @ "llm-cache-aware") => {
                    wait_for_slot_views(&[admin], m, restarted.elapsed())?
                }
                Front::Proxy(_) | Front::Proxies(_, SlotPrompts::Off) | Front::Smg => {}
            }
            // smg starts afresh for each of its runs, once the servers answer: started once,
            // it probed a server while the server restarted for another row, and never sent
            // that server a request again, although `GET /workers` called it healthy (two
            // sittings ran smg on two servers of three).
            let smg_run = match (front, &smg) {
                (Front::Smg, Some(smg)) => {
                    let log = format!("smg-{}-{rep}.log", workload.name());
                    let (p, addr) =
                        start_smg(smg, &fleet.fronts, &served_model, &out.path().join(log))?;
                    wait_for_smg(addr, args)?;
                    Some((p, addr))
                }
                (Front::Smg, None) => bail!("smg is not installed"),
                _ => None,
            };
            let (addrs, model) = match front {
                Front::Proxy(m) => (vec![proxy_addr], m),
                Front::Proxies(m, SlotPrompts::On) => (fleet_addrs.clone(), m),
                Front::Proxies(m, SlotPrompts::Off) => (hash_addrs.clone(), m),
                Front::Smg => (smg_run.iter().map(|s| s.1).collect(), "llm"),
            };
            let salt = format!("{rep} of run {salt}");
            let before = fleet.served();
            fleet.take_asked();
            let run = run_workload(&addrs, model, workload, &salt, args)?;
            let per_server: Vec<u64> = fleet
                .served()
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect();
            let name = match args.repeat {
                1 => format!("samples-{}-{label}.tsv", workload.name()),
                _ => format!("samples-{}-{label}-{rep}.tsv", workload.name()),
            };
            out.write(
                &name,
                samples_tsv(&run, workload, &fleet.take_asked(), args),
            )?;
            drop(smg_run);
            runs[c].push((run, per_server));
            let this_run = std::slice::from_ref(runs[c].last().expect("just pushed"));
            println!("{}", Row::new(workload, label, this_run).markdown());
        }
    }
    let rows: Vec<Row> = cells
        .iter()
        .zip(&runs)
        .map(|(&(workload, (label, _)), runs)| Row::new(workload, label, runs))
        .collect();
    let table = table(&rows, args, &served_model, fleet.cpu_share);
    out.write("results.md", &table)?;
    if let Ok(r) = http_request(admin, "GET", "/metrics", &[], b"") {
        out.write("proxy-metrics.txt", r.text())?;
    }
    println!("\n{table}\nraw output: {}", out.path().display());
    drop(proxies);
    drop(hash_proxies);
    drop(proxy);
    drop(fleet);
    Ok(())
}

/// Each request of a run, in order: its document (chat-with-doc), the server it reached, TTFT,
/// prompt and cached tokens and the proxy's route header, to see which requests missed the
/// cache and why.
fn samples_tsv(
    run: &Run,
    workload: Workload,
    servers: &HashMap<usize, usize>,
    args: &RealLlmBench,
) -> String {
    let mut samples: Vec<&workload::Sample> = run.samples.iter().collect();
    samples.sort_by_key(|s| s.index);
    let mut tsv =
        String::from("request\tdocument\tserver\tttft_s\tprompt_tokens\tcached_tokens\troute\n");
    for s in samples {
        let document = match workload {
            Workload::ChatWithDoc => workload::document(s.index, args).to_string(),
            Workload::HotPrompt => "-".to_owned(),
        };
        let server = servers
            .get(&s.index)
            .map_or_else(|| "-".to_owned(), |i| i.to_string());
        tsv.push_str(&format!(
            "{}\t{document}\t{server}\t{:.3}\t{}\t{}\t{}\n",
            s.index,
            s.ttft.as_secs_f64(),
            s.prompt_tokens,
            s.cached_tokens,
            s.route.as_deref().unwrap_or("-"),
        ));
    }
    tsv
}

/// The model servers, each behind a counting forwarder and, unless `--uncapped`, in a cgroup
/// of its own with an equal share of the CPU.
struct Fleet {
    servers: Vec<Server>,
    fronts: Vec<SocketAddr>,
    counters: Vec<Arc<AtomicU64>>,
    /// The request numbers each server's forwarder saw.
    asked: Vec<Arc<Mutex<Vec<usize>>>>,
    /// Dropped after the servers (fields drop in order): a cgroup goes once it is empty.
    caps: Vec<CpuCap>,
    /// Cores each server may use, when capped.
    cpu_share: Option<f64>,
    /// How a server starts: the venv's python, the launcher script, the model, the slots.
    python: PathBuf,
    launcher: PathBuf,
    model: PathBuf,
    slots: u32,
    out: PathBuf,
}

/// One llama.cpp server and the port it keeps across restarts (its forwarder's upstream).
struct Server {
    proc: Proc,
    addr: SocketAddr,
}

impl Fleet {
    fn start(python: &Path, model: &Path, out: &Path, args: &RealLlmBench) -> Result<Self> {
        let launcher = out.join("serve.py");
        std::fs::write(&launcher, LAUNCHER)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu_share = (!args.uncapped).then(|| cores as f64 / args.servers as f64);
        let mut fleet = Fleet {
            servers: Vec::new(),
            fronts: Vec::new(),
            counters: Vec::new(),
            asked: Vec::new(),
            caps: Vec::new(),
            cpu_share,
            python: python.to_path_buf(),
            launcher,
            model: model.to_path_buf(),
            slots: args.slots,
            out: out.to_path_buf(),
        };
        for i in 0..args.servers {
            if let Some(share) = cpu_share {
                let cap = CpuCap::create(&format!("flexinfer-real-llm-{i}"), share)
                    .context("capping the servers' CPU (run as root, or pass --uncapped)")?;
                fleet.caps.push(cap);
            }
            let addr = loopback(free_port());
            let proc = fleet.spawn_server(i, addr)?;
            fleet.servers.push(Server { proc, addr });
        }
        fleet.wait_healthy()?;
        for s in &fleet.servers {
            let f = counting_forwarder(s.addr)?;
            fleet.fronts.push(f.front);
            fleet.counters.push(f.count);
            fleet.asked.push(f.asked);
        }
        Ok(fleet)
    }

    /// Server `i` on `addr`, in its CPU cgroup when capped.
    fn spawn_server(&self, i: usize, addr: SocketAddr) -> Result<Proc> {
        let mut cmd = Command::new(&self.python);
        // Each slot's prompt in /slots, which the proxies read (smg does not).
        cmd.env("LLAMA_SERVER_SLOTS_DEBUG", "1")
            .arg(&self.launcher)
            .arg(&self.model)
            .arg(addr.ip().to_string())
            .arg(addr.port().to_string())
            .arg(self.slots.to_string());
        let log = self.out.join(format!("llama-{i}.log"));
        let p = Proc::spawn(&format!("llama-{i}"), cmd, &log)?.graceful(Duration::from_secs(5));
        if let Some(cap) = self.caps.get(i) {
            cap.add(p.pid())?;
        }
        Ok(p)
    }

    fn wait_healthy(&self) -> Result<()> {
        for s in &self.servers {
            wait_http_ok(s.addr, "/health", START_TIMEOUT).with_context(|| {
                format!("{} did not start:\n{}", s.proc.name(), s.proc.log_text())
            })?;
        }
        Ok(())
    }

    /// Every server stopped and started again on its port (its forwarder and the routers keep
    /// their addresses), then one short request straight to each: a row meets no prompt a
    /// row before it left, and no server that has never answered (the first answer of a fresh
    /// server ran twice as slow) or slots that hold nothing but the chat template.
    fn restart(&mut self, model: &str) -> Result<()> {
        for i in 0..self.servers.len() {
            let addr = self.servers[i].addr;
            self.servers[i].proc.terminate(Duration::from_secs(5));
            self.servers[i].proc = self.spawn_server(i, addr)?;
        }
        self.wait_healthy()?;
        for (i, front) in self.fronts.iter().enumerate() {
            let body = request_body(model, "Warm-up.", &format!("Say hello to server {i}."), 4);
            workload::stream_one(*front, 0, &body)
                .with_context(|| format!("warming up server {i}"))?;
        }
        Ok(())
    }

    /// Completions each server has served so far.
    fn served(&self) -> Vec<u64> {
        self.counters
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Which server each request number reached since the last call (the last one, for a
    /// request a router sent twice).
    fn take_asked(&self) -> HashMap<usize, usize> {
        let mut at = HashMap::new();
        for (server, asked) in self.asked.iter().enumerate() {
            for n in asked.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                at.insert(n, server);
            }
        }
        at
    }
}

/// flexinfer-proxy `name` with one model per routing over the same fronts, of rank `fleet.1`
/// in a fleet of `fleet.0`, reading the servers' slot prompts when `fleet.2`: (proxy, listen,
/// admin).
fn start_proxy(
    bin: &Path,
    name: &str,
    out: &Path,
    fronts: &[SocketAddr],
    (fleet_size, rank, slot_prompts): (usize, usize, bool),
    args: &RealLlmBench,
) -> Result<(Proc, SocketAddr, SocketAddr)> {
    let models = out.join(format!("{name}-models.yaml"));
    let entry = |name: &str| ModelEntry::new(name).endpoints(fronts);
    let bounded = |name: &str| match args.floor {
        Some(floor) => entry(name).hash_balance_floor(floor),
        None => entry(name),
    };
    ModelsFile::new()
        .model(entry("llm-default"))
        .model(
            entry("llm-prefix")
                .routing("prefix")
                .hash_balance_factor(0.0),
        )
        .model(bounded("llm-prefix-bounded").routing("prefix"))
        .model(bounded("llm-session").routing("session-affinity"))
        .model(bounded("llm-cache-aware").routing("cache-aware"))
        .write_to(&models)?;
    let (listen, admin) = (loopback(free_port()), loopback(free_port()));
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(&models)
        .args(["--listen", &listen.to_string()])
        .args(["--admin-listen", &admin.to_string()])
        .args(["--gauge", "userspace", "--route-header"])
        .args(["--fleet-size", &fleet_size.to_string()])
        .args(["--fleet-rank", &rank.to_string()])
        .args(["--engine-slot-prompts", &slot_prompts.to_string()]);
    let proxy =
        Proc::spawn(name, cmd, &out.join(format!("{name}.log")))?.graceful(Duration::from_secs(5));
    wait_http_ok(admin, "/readyz", START_TIMEOUT).with_context(|| proxy.log_text())?;
    Ok((proxy, listen, admin))
}

/// smg `--policy cache_aware` over the fronts, `llm` aliased to the served model.
fn start_smg(
    smg: &Path,
    fronts: &[SocketAddr],
    served_model: &str,
    log: &Path,
) -> Result<(Proc, SocketAddr)> {
    let (port, metrics) = (free_port(), free_port());
    let mut cmd = Command::new(smg);
    cmd.args(["launch", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--worker-urls")
        .args(fronts.iter().map(|f| format!("http://{f}")))
        .args(["--policy", "cache_aware", "--disable-tokenizer-autoload"])
        .arg("--model-alias")
        .arg(format!("llm={served_model}"))
        .args(["--log-level", "warn", "--prometheus-host", "127.0.0.1"])
        .arg("--prometheus-port")
        .arg(metrics.to_string());
    let p = Proc::spawn("smg", cmd, log)?.graceful(Duration::from_secs(5));
    Ok((p, loopback(port)))
}

/// Wait until every proxy at `admins` shows a fresh view of every pod's slots for `model`, read
/// within the last `within` (`/debug/routing`).
fn wait_for_slot_views(admins: &[SocketAddr], model: &str, within: Duration) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let start = Instant::now();
    for &admin in admins {
        loop {
            let within = within + start.elapsed();
            let fresh = http_request(admin, "GET", "/debug/routing", &[], b"")
                .ok()
                .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
                .is_some_and(|v| views_fresh(&v, model, within));
            if fresh {
                break;
            }
            if Instant::now() > deadline {
                bail!("proxy {admin} has no fresh view of every server's slots");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Whether `/debug/routing` shows `model` with every pod's slot view fresh, read within
/// `within`.
fn views_fresh(routing: &serde_json::Value, model: &str, within: Duration) -> bool {
    let Some(models) = routing["models"].as_array() else {
        return false;
    };
    let Some(m) = models.iter().find(|m| m["name"] == model) else {
        return false;
    };
    m["pods"].as_array().is_some_and(|pods| {
        !pods.is_empty()
            && pods.iter().all(|p| {
                let v = &p["slot_prompts"];
                v["fresh"] == true
                    && v["age_seconds"]
                        .as_f64()
                        .is_some_and(|age| age <= within.as_secs_f64())
            })
    })
}

/// smg registers its workers in the background: wait until a request goes through.
fn wait_for_smg(addr: SocketAddr, args: &RealLlmBench) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let body = request_body("llm", "Say ok.", "ok?", args.max_tokens);
    loop {
        match http_request(addr, "POST", PATH, &[], body.as_bytes()) {
            Ok(r) if r.status == 200 => break,
            r if Instant::now() > deadline => bail!("smg never answered 200: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
    // smg drops a server whose health probe failed while it restarted (connection reset) and
    // may not take it back: a sitting once ran smg on two servers of three. Its rows count only
    // with every server registered and healthy.
    loop {
        let healthy = smg_healthy_workers(addr);
        if healthy == Some(args.servers) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "smg sees {healthy:?} healthy servers of {} (GET /workers)",
                args.servers
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The servers smg lists as healthy (`GET /workers`), `None` when it does not answer.
fn smg_healthy_workers(addr: SocketAddr) -> Option<usize> {
    let r = http_request(addr, "GET", "/workers", &[], b"").ok()?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    let workers = v["workers"].as_array()?;
    Some(
        workers
            .iter()
            .filter(|w| w["is_healthy"].as_bool() == Some(true))
            .count(),
    )
}
