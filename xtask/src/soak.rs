//! `cargo xtask soak`: many clients through one proxy while its pods come and go, and an honest
//! account of every request.
//!
//! The promise under test is "never a dropped request": a pod taken out of rotation gracefully
//! (out of the models file first, stopped only once its requests finished) must cost no request,
//! and a pod that dies (SIGKILL) may cost only the requests it was serving at that moment. So
//! the harness runs `--clients` blocking clients (half of them streaming, half on a
//! least-loaded model, half on a prefix model) against one release-built proxy with
//! file discovery, in front of `flexinfer-proxy sim` pods, while a churn thread adds, gracefully
//! removes and kills pods every few seconds. Each request is recorded with its outcome (status
//! and OpenAI error code; for streams complete, SSE error event or cut) and the pod that served
//! it (`x-sim-pod`); failures are then matched to the churn events they overlapped. Afterwards
//! the proxy's gauges and reservations must read 0 and its RSS is reported (start, peak, end).
//!
//! As root the proxy runs its default eBPF gauge, attached to a child cgroup of this harness
//! with a pin dir of its own (as `bench overhead` does); otherwise `--gauge userspace`. Only
//! loopback addresses are used, and every loop is bounded by `--duration`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::{
    free_port, http_request, is_root, loopback, wait_http_ok, Cgroup, ModelEntry, ModelsFile,
    PinDir, Proc,
};
use serde_json::Value;

use crate::ebpf;

#[derive(clap::Args)]
pub struct Soak {
    /// Concurrent clients (half stream; half use the least-loaded model, half the prefix one).
    #[arg(long, default_value_t = 200)]
    pub clients: usize,
    /// How long clients send requests (`120`, `90s`, `2m`).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Seed of every random choice (bodies, think times, churn order and timing).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Mean time between churn events (each +-30%).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub churn_every: Duration,
    /// Pods per model at the start.
    #[arg(long, default_value_t = 4)]
    pub pods: usize,
    /// `ebpf` (needs root), `userspace`, or `auto`: eBPF as root, else userspace.
    #[arg(long, default_value = "auto")]
    pub gauge: String,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
}

const LEAST_LOADED: &str = "soak-least-loaded";
const PREFIX: &str = "soak-prefix";
const MODELS: [(&str, &str); 2] = [(LEAST_LOADED, "least-loaded"), (PREFIX, "prefix")];
const PATH: &str = "/v1/chat/completions";
/// Pods per model never drop below this (so a removal or kill leaves somewhere to go) nor
/// rise above the maximum.
const MIN_PODS: usize = 2;
const MAX_PODS: usize = 6;
/// Sim timing: a request takes ttft + max_tokens x inter-token (about 0.2 to 0.5 s).
const SIM_FLAGS: [&str; 6] = [
    "--inter-token-ms",
    "15",
    "--ttft-base-ms",
    "30",
    "--max-concurrency",
    "64",
];
/// Prefix cgroups and pin dirs this harness creates carry (`<prefix>-<pid>-<n>`).
const RUN_PREFIX: &str = "flexinfer-soak";
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client waits on one read before it calls the request timed out.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: not a duration"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: use s, ms or m")),
    }
}

/// splitmix64: small, seedable, good enough to vary bodies and timings reproducibly.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

/// How one request ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// A non-200 answer (its OpenAI error code, or `-`).
    Http {
        status: u16,
        code: String,
    },
    /// A 200 stream that carried an SSE error event.
    SseError {
        code: String,
    },
    /// A 200 stream whose body ended cleanly but without `data: [DONE]`.
    Ended,
    /// The body stopped before its end (connection closed or reset mid-body).
    Cut {
        stream: bool,
    },
    /// A 200 whose body is not a completion.
    Unreadable,
    /// No response head at all.
    NoResponse {
        what: String,
    },
}

impl Outcome {
    fn is_ok(&self) -> bool {
        *self == Outcome::Ok
    }

    fn cause(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Http { status, code } => format!("HTTP {status} {code}"),
            Outcome::SseError { code } => format!("stream: SSE error event ({code})"),
            Outcome::Ended => "stream: ended without [DONE]".into(),
            Outcome::Cut { stream: true } => "stream: cut".into(),
            Outcome::Cut { stream: false } => "body: cut".into(),
            Outcome::Unreadable => "HTTP 200, not a completion".into(),
            Outcome::NoResponse { what } => format!("no response: {what}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Record {
    model: usize,
    stream: bool,
    /// Since the run started.
    start: Duration,
    end: Duration,
    pod: Option<String>,
    outcome: Outcome,
}

/// A response as read off the wire: the head, the body bytes, and whether the body's framing
/// reached its end.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    complete: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn io_kind(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".into(),
        std::io::ErrorKind::ConnectionReset => "reset".into(),
        std::io::ErrorKind::ConnectionRefused => "refused".into(),
        std::io::ErrorKind::BrokenPipe => "broken pipe".into(),
        k => format!("{k:?}"),
    }
}

/// Read a body framed by chunked coding; returns whether it reached the last chunk.
fn read_chunked(r: &mut impl BufRead, body: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            return Ok(false);
        }
        let text = String::from_utf8_lossy(&line);
        let hex = text.split(';').next().unwrap_or_default().trim();
        let Ok(size) = usize::from_str_radix(hex, 16) else {
            return Ok(false);
        };
        if size == 0 {
            // Trailers until the empty line.
            loop {
                line.clear();
                if r.read_until(b'\n', &mut line)? == 0 {
                    return Ok(false);
                }
                if line == b"\r\n" || line == b"\n" {
                    return Ok(true);
                }
            }
        }
        let before = body.len();
        r.take(size as u64).read_to_end(body)?;
        if body.len() - before < size {
            return Ok(false);
        }
        line.clear();
        r.read_until(b'\n', &mut line)?;
        if line != b"\r\n" {
            return Ok(false);
        }
    }
}

/// One POST on a new connection; `Err` (with what failed) when no response head came back.
fn exchange(addr: SocketAddr, body: &[u8]) -> Result<Reply, String> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {}", io_kind(&e)))?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(READ_TIMEOUT)).ok();
    s.set_write_timeout(Some(Duration::from_secs(10))).ok();
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut w = &s;
    w.write_all(head.as_bytes())
        .and_then(|()| w.write_all(body))
        .map_err(|e| format!("write {}", io_kind(&e)))?;
    let mut r = BufReader::with_capacity(16 * 1024, &s);
    let mut line = Vec::new();
    let mut status = None;
    let mut headers = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Err("closed before the head".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("head {}", io_kind(&e))),
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        if status.is_none() {
            status = Some(
                text.split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse::<u16>().ok())
                    .ok_or_else(|| format!("bad status line {text:?}"))?,
            );
            continue;
        }
        if text.is_empty() {
            break;
        }
        if let Some((k, v)) = text.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let mut reply = Reply {
        status: status.unwrap_or_default(),
        headers,
        body: Vec::new(),
        complete: false,
    };
    let chunked = reply
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = reply
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = Vec::new();
    reply.complete = if chunked {
        read_chunked(&mut r, &mut body).unwrap_or(false)
    } else if let Some(n) = length {
        let got = (&mut r).take(n).read_to_end(&mut body);
        got.is_ok() && body.len() as u64 == n
    } else {
        r.read_to_end(&mut body).is_ok()
    };
    reply.body = body;
    Ok(reply)
}

/// The `error.code` of an OpenAI-shaped error object (or its type, or `-`).
fn error_code(v: &Value) -> String {
    let e = &v["error"];
    match (&e["code"], &e["type"]) {
        (Value::String(c), _) => c.clone(),
        (Value::Number(n), _) => n.to_string(),
        (_, Value::String(t)) => t.clone(),
        _ => "-".into(),
    }
}

fn classify(stream: bool, reply: Result<Reply, String>) -> (Outcome, Option<String>) {
    let reply = match reply {
        Ok(r) => r,
        Err(what) => return (Outcome::NoResponse { what }, None),
    };
    let pod = reply.header("x-sim-pod").map(str::to_owned);
    if reply.status != 200 {
        let code = serde_json::from_slice::<Value>(&reply.body)
            .map(|v| error_code(&v))
            .unwrap_or_else(|_| "-".into());
        return (
            Outcome::Http {
                status: reply.status,
                code,
            },
            pod,
        );
    }
    if !stream {
        if !reply.complete {
            return (Outcome::Cut { stream: false }, pod);
        }
        let ok = serde_json::from_slice::<Value>(&reply.body)
            .is_ok_and(|v| v["choices"].is_array() && v.get("error").is_none());
        let o = if ok { Outcome::Ok } else { Outcome::Unreadable };
        return (o, pod);
    }
    let text = String::from_utf8_lossy(&reply.body);
    let mut done = false;
    let mut error = None;
    for event in text.split("\n\n") {
        let mut is_error = false;
        for line in event.lines() {
            if line.trim() == "event: error" {
                is_error = true;
            }
            if let Some(data) = line.strip_prefix("data:") {
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                } else if let Ok(v) = serde_json::from_str::<Value>(data) {
                    if v.get("error").is_some() {
                        error.get_or_insert_with(|| error_code(&v));
                    }
                }
            }
        }
        if is_error && error.is_none() {
            error = Some("-".into());
        }
    }
    let o = match (error, done, reply.complete) {
        (Some(code), _, _) => Outcome::SseError { code },
        (None, true, true) => Outcome::Ok,
        (None, false, true) => Outcome::Ended,
        (None, _, false) => Outcome::Cut { stream: true },
    };
    (o, pod)
}

/// Six tenants' system prompts: prefix routing pins each to a pod.
fn system_prompt(tenant: u64) -> String {
    let mut s =
        format!("You are the assistant of tenant {tenant}. Answer from the tenant handbook only.");
    for i in 0..12 {
        let _ = write!(
            s,
            " Rule {i}: requests of tenant {tenant} about topic {i} go to desk {}.",
            (tenant * 7 + i) % 13
        );
    }
    s
}

const WORDS: [&str; 12] = [
    "parcel", "invoice", "pallet", "customs", "route", "delay", "refund", "label", "depot",
    "truck", "order", "status",
];

fn request_body(rng: &mut Rng, model: usize, stream: bool) -> Vec<u8> {
    let words: Vec<&str> = (0..rng.range(4, 12))
        .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
        .collect();
    let mut messages = Vec::new();
    let mut body = serde_json::Map::new();
    if MODELS[model].0 == PREFIX {
        let tenant = rng.below(6);
        messages.push(serde_json::json!({"role": "system", "content": system_prompt(tenant)}));
        if rng.below(4) == 0 {
            body.insert("cache_key".into(), format!("tenant-{tenant}").into());
        }
    }
    messages.push(serde_json::json!({"role": "user", "content": words.join(" ")}));
    body.insert("model".into(), MODELS[model].0.into());
    body.insert("messages".into(), messages.into());
    body.insert("max_tokens".into(), rng.range(8, 24).into());
    body.insert("stream".into(), stream.into());
    Value::Object(body).to_string().into_bytes()
}

fn client(id: usize, proxy: SocketAddr, seed: u64, t0: Instant, deadline: Instant) -> Vec<Record> {
    let mut rng = Rng::new(seed ^ (id as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let model = id % 2;
    let stream = (id / 2) % 2 == 1;
    // Spread the first requests over a second, so clients do not start in lock step.
    std::thread::sleep(Duration::from_millis(rng.below(1000)));
    let mut out = Vec::new();
    while Instant::now() < deadline {
        let body = request_body(&mut rng, model, stream);
        let start = t0.elapsed();
        let (outcome, pod) = classify(stream, exchange(proxy, &body));
        out.push(Record {
            model,
            stream,
            start,
            end: t0.elapsed(),
            pod,
            outcome,
        });
        std::thread::sleep(Duration::from_millis(rng.below(100)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Pods and churn

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodState {
    Live,
    /// SIGKILLed. The models file still lists it until the next change rewrites the file.
    Killed,
    Gone,
}

struct Pod {
    name: String,
    model: usize,
    addr: SocketAddr,
    proc: Option<Proc>,
    state: PodState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Add,
    Remove,
    Kill,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Add => "add",
            Kind::Remove => "graceful removal",
            Kind::Kill => "SIGKILL",
        }
    }
}

#[derive(Debug, Clone)]
struct Event {
    kind: Kind,
    model: usize,
    pod: String,
    /// When it started (add: sim started; removal: models file written; kill: the signal).
    at: Duration,
    /// When it was over (add: the proxy routes to it; removal: the sim exited; kill: = at).
    done: Duration,
    /// The sim's own in-flight gauge when it left rotation (removal) or died (kill).
    sim_in_flight: Option<u64>,
    note: String,
}

struct Fleet {
    pods: Vec<Pod>,
    next: usize,
    bin: PathBuf,
    out: PathBuf,
    models_file: PathBuf,
    admin: SocketAddr,
}

impl Fleet {
    fn live(&self, model: usize) -> Vec<usize> {
        (0..self.pods.len())
            .filter(|&i| self.pods[i].model == model && self.pods[i].state == PodState::Live)
            .collect()
    }

    fn models_file(&self) -> ModelsFile {
        MODELS
            .iter()
            .enumerate()
            .map(|(m, (name, routing))| {
                let eps = self
                    .pods
                    .iter()
                    .filter(|p| p.model == m && p.state == PodState::Live);
                ModelEntry::new(name)
                    .routing(routing)
                    .endpoints(eps.map(|p| p.addr))
            })
            .collect()
    }

    /// Write the models file: the live pods. A pod killed since the last write was still
    /// listed until now (a kill alone does not touch the file, as a crashed pod would not).
    fn write(&self) -> Result<()> {
        self.models_file().write_to(&self.models_file)?;
        Ok(())
    }

    fn start_pod(&mut self, model: usize) -> Result<usize> {
        let name = format!("{}-{}", &MODELS[model].0["soak-".len()..], self.next);
        self.next += 1;
        let mut last = String::new();
        for _ in 0..3 {
            let addr = loopback(free_port());
            let mut cmd = Command::new(&self.bin);
            cmd.args(["sim", "--listen", &addr.to_string(), "--name", &name])
                .args(SIM_FLAGS);
            let log = self.out.join(format!("sim-{name}.log"));
            let mut p = Proc::spawn(&format!("sim {name}"), cmd, &log)?;
            match wait_http_ok(addr, "/health", Duration::from_secs(10)) {
                Ok(()) => {
                    self.pods.push(Pod {
                        name,
                        model,
                        addr,
                        proc: Some(p),
                        state: PodState::Live,
                    });
                    return Ok(self.pods.len() - 1);
                }
                Err(e) => {
                    last = format!("{e}: {}", p.log_text());
                    let _ = p.kill();
                }
            }
        }
        bail!("sim {name} did not start: {last}")
    }

    /// Wait until the proxy's table lists (or no longer lists) `addr` for `model`.
    fn wait_table(&self, model: usize, addr: SocketAddr, listed: bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let want = addr.to_string();
        loop {
            let has = routing_view(self.admin).ok().is_some_and(|v| {
                v["models"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|m| m["name"] == MODELS[model].0)
                    .flat_map(|m| m["pods"].as_array().cloned().unwrap_or_default())
                    .any(|p| p["address"].as_str() == Some(want.as_str()))
            });
            if has == listed {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the proxy did not apply the models file change for {addr} in 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn routing_view(admin: SocketAddr) -> Result<Value> {
    let r = http_request(admin, "GET", "/debug/routing", &[], b"")?;
    Ok(serde_json::from_slice(&r.body)?)
}

/// `sim_requests_in_flight` from a sim's /metrics.
fn sim_in_flight(addr: SocketAddr) -> Option<u64> {
    let r = http_request(addr, "GET", "/metrics", &[], b"").ok()?;
    r.text()
        .lines()
        .find(|l| l.starts_with("sim_requests_in_flight{"))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

struct Churn {
    fleet: Fleet,
    rng: Rng,
    t0: Instant,
    events: Vec<Event>,
}

impl Churn {
    fn add(&mut self, model: usize) -> Result<()> {
        let at = self.t0.elapsed();
        let i = self.fleet.start_pod(model)?;
        self.fleet.write()?;
        let (name, addr) = (self.fleet.pods[i].name.clone(), self.fleet.pods[i].addr);
        self.fleet.wait_table(model, addr, true)?;
        self.events.push(Event {
            kind: Kind::Add,
            model,
            pod: name,
            at,
            done: self.t0.elapsed(),
            sim_in_flight: None,
            note: String::new(),
        });
        Ok(())
    }

    /// Out of the models file, wait for the proxy to drop it and for its requests to finish,
    /// then SIGTERM.
    fn remove(&mut self, i: usize) -> Result<()> {
        let (model, addr) = (self.fleet.pods[i].model, self.fleet.pods[i].addr);
        let at = self.t0.elapsed();
        self.fleet.pods[i].state = PodState::Gone;
        self.fleet.write()?;
        self.fleet.wait_table(model, addr, false)?;
        let in_flight_at_removal = sim_in_flight(addr);
        // Drained: two readings of 0, 100 ms apart (a request picked just before the table
        // changed may still be on its way).
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut zeros = 0;
        while zeros < 2 && Instant::now() < deadline {
            zeros = if sim_in_flight(addr) == Some(0) {
                zeros + 1
            } else {
                0
            };
            std::thread::sleep(Duration::from_millis(100));
        }
        let note = if zeros < 2 {
            "still busy after 30 s; terminated anyway".to_owned()
        } else {
            String::new()
        };
        let pod = &mut self.fleet.pods[i];
        if let Some(mut p) = pod.proc.take() {
            if p.terminate(Duration::from_secs(10)).is_none() {
                let _ = p.kill();
            }
        }
        self.events.push(Event {
            kind: Kind::Remove,
            model,
            pod: pod.name.clone(),
            at,
            done: self.t0.elapsed(),
            sim_in_flight: in_flight_at_removal,
            note,
        });
        Ok(())
    }

    fn kill(&mut self, i: usize) -> Result<()> {
        let pod = &mut self.fleet.pods[i];
        let in_flight = sim_in_flight(pod.addr);
        // The kill spans from the signal to the reaped process: streams break inside it.
        let at = self.t0.elapsed();
        if let Some(p) = pod.proc.as_mut() {
            p.kill()?;
        }
        let done = self.t0.elapsed();
        pod.proc = None;
        pod.state = PodState::Killed;
        self.events.push(Event {
            kind: Kind::Kill,
            model: pod.model,
            pod: pod.name.clone(),
            at,
            done,
            sim_in_flight: in_flight,
            note: String::new(),
        });
        Ok(())
    }

    /// One churn event: kinds in a shuffled round of (add, remove, kill), held to the pod
    /// bounds.
    fn step(&mut self, kind: Kind) -> Result<()> {
        let model = self.rng.below(MODELS.len() as u64) as usize;
        let live = self.fleet.live(model);
        let kind = match kind {
            Kind::Remove | Kind::Kill if live.len() <= MIN_PODS => Kind::Add,
            Kind::Add if live.len() >= MAX_PODS => Kind::Remove,
            k => k,
        };
        match kind {
            Kind::Add => self.add(model),
            Kind::Remove => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.remove(i)
            }
            Kind::Kill => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.kill(i)
            }
        }
    }

    fn run(mut self, every: Duration, deadline: Instant, stop: &AtomicBool) -> Result<Self> {
        // A few seconds of steady state first.
        let mut next = Instant::now() + every;
        let mut round: Vec<Kind> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            if round.is_empty() {
                round = vec![Kind::Add, Kind::Remove, Kind::Kill];
                for i in (1..round.len()).rev() {
                    round.swap(i, self.rng.below(i as u64 + 1) as usize);
                }
            }
            let kind = round.pop().expect("refilled");
            self.step(kind)?;
            let ms = every.as_millis() as u64;
            next =
                Instant::now() + Duration::from_millis(self.rng.range(ms * 7 / 10, ms * 13 / 10));
        }
        Ok(self)
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy and its state afterwards

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The proxy's counts that must come back to zero once no request is in flight.
#[derive(Debug, Default, Clone, PartialEq)]
struct Gauges {
    /// Per pod in /debug/routing: `active` (what least-loaded reads), `in_flight_here`,
    /// `reservations`; and `reservations_pending`.
    active: u64,
    in_flight_here: u64,
    reservations: u64,
    reservations_pending: u64,
    /// `flexinfer_proxy_active_connections`, summed over models.
    active_connections: f64,
    /// `ebpf status`: (tracked connections, active, in_flight), eBPF mode only.
    ebpf: Option<(u64, u64, u64)>,
}

impl Gauges {
    fn zero(&self) -> bool {
        self.active == 0
            && self.in_flight_here == 0
            && self.reservations == 0
            && self.reservations_pending == 0
            && self.active_connections == 0.0
            && self.ebpf.is_none_or(|(_, a, f)| a == 0 && f == 0)
    }
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `ebpf status` output: `tracked connections: N` and the per-pod table.
fn parse_ebpf_status(text: &str) -> Option<(u64, u64, u64)> {
    let tracked = text
        .lines()
        .find_map(|l| l.strip_prefix("tracked connections:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut rows = text.lines().skip_while(|l| !l.starts_with("slot"));
    rows.next()?;
    let (mut active, mut in_flight) = (0, 0);
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        if f.len() >= 3 {
            active += f[1].parse::<u64>().unwrap_or(0);
            in_flight += f[2].parse::<u64>().unwrap_or(0);
        }
    }
    Some((tracked, active, in_flight))
}

fn gauges(admin: SocketAddr, bin: &Path, pins: Option<&PinDir>) -> Result<Gauges> {
    let view = routing_view(admin)?;
    let mut g = Gauges::default();
    for p in view["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["pods"].as_array().cloned().unwrap_or_default())
    {
        g.active += p["active"].as_u64().unwrap_or(0);
        g.in_flight_here += p["in_flight_here"].as_u64().unwrap_or(0);
        g.reservations += p["reservations"].as_u64().unwrap_or(0);
    }
    g.reservations_pending = view["reservations_pending"].as_u64().unwrap_or(0);
    let metrics = http_request(admin, "GET", "/metrics", &[], b"")?.text();
    g.active_connections = metric_sum(&metrics, "flexinfer_proxy_active_connections");
    if let Some(pins) = pins {
        let out = Command::new(bin)
            .args(["ebpf", "status", "--bpf-pin-dir"])
            .arg(pins.path())
            .output()
            .context("running ebpf status")?;
        g.ebpf = parse_ebpf_status(&String::from_utf8_lossy(&out.stdout));
    }
    Ok(g)
}

// ---------------------------------------------------------------------------------------------
// The report

/// Why a failed request failed, as far as the churn explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Blame {
    /// `x-sim-pod` names a pod that was SIGKILLed while the request was in flight.
    KilledPod,
    /// No `x-sim-pod` (no head from the pod), and a pod of its model was killed meanwhile.
    KillUnreported,
    /// In flight while a pod of its model was being removed gracefully.
    Removal,
    /// In flight while a pod of its model was being added.
    Add,
    /// No churn event of its model while it was in flight.
    Steady,
}

impl Blame {
    fn name(self) -> &'static str {
        match self {
            Blame::KilledPod => "on a killed pod (x-sim-pod)",
            Blame::KillUnreported => "during a kill, pod not reported",
            Blame::Removal => "during a graceful removal",
            Blame::Add => "during an add",
            Blame::Steady => "no churn in flight",
        }
    }
}

fn overlaps(r: &Record, e: &Event) -> bool {
    r.model == e.model && r.start <= e.done && e.at <= r.end
}

fn blame(r: &Record, events: &[Event]) -> Blame {
    let in_flight_at = |e: &Event| r.start <= e.done && e.at <= r.end;
    let kills = || events.iter().filter(|e| e.kind == Kind::Kill);
    if let Some(pod) = &r.pod {
        if kills().any(|e| e.pod == *pod && in_flight_at(e)) {
            return Blame::KilledPod;
        }
    } else if kills().any(|e| e.model == r.model && in_flight_at(e)) {
        return Blame::KillUnreported;
    }
    let by = |k: Kind| events.iter().any(|e| e.kind == k && overlaps(r, e));
    if by(Kind::Remove) {
        Blame::Removal
    } else if by(Kind::Add) {
        Blame::Add
    } else {
        Blame::Steady
    }
}

struct Summary {
    records: Vec<Record>,
    events: Vec<Event>,
    gauges_after: Gauges,
    settled_after: Option<Duration>,
    rss_kib: (u64, u64, u64),
    upstream_failures: BTreeMap<String, u64>,
    killed_addrs: Vec<String>,
    mode: String,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn report(s: &Summary, args: &Soak, wall: Duration) -> (String, bool) {
    let mut t = String::new();
    let total = s.records.len();
    let ok = s.records.iter().filter(|r| r.outcome.is_ok()).count();
    let _ = writeln!(
        t,
        "{} clients ({} streaming), {:.0} s of load, seed {}, {}; {} requests, {} ok, {} failed",
        args.clients,
        args.clients / 2,
        wall.as_secs_f64(),
        args.seed,
        s.mode,
        total,
        ok,
        total - ok
    );
    t.push_str("\n| model | mode | requests | ok | failed | p50 s | p99 s |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for (m, (name, _)) in MODELS.iter().enumerate() {
        for stream in [false, true] {
            let rs: Vec<&Record> = s
                .records
                .iter()
                .filter(|r| r.model == m && r.stream == stream)
                .collect();
            let mut lat: Vec<Duration> = rs
                .iter()
                .filter(|r| r.outcome.is_ok())
                .map(|r| r.end - r.start)
                .collect();
            lat.sort();
            let good = rs.iter().filter(|r| r.outcome.is_ok()).count();
            let _ = writeln!(
                t,
                "| {name} | {} | {} | {good} | {} | {:.3} | {:.3} |",
                if stream { "stream (SSE)" } else { "non-stream" },
                rs.len(),
                rs.len() - good,
                percentile(&lat, 0.5).as_secs_f64(),
                percentile(&lat, 0.99).as_secs_f64()
            );
        }
    }

    // Failures by cause and by what the churn says about them.
    let blames = [
        Blame::KilledPod,
        Blame::KillUnreported,
        Blame::Removal,
        Blame::Add,
        Blame::Steady,
    ];
    let mut by_cause: BTreeMap<String, [usize; 5]> = BTreeMap::new();
    let mut blame_totals = [0usize; 5];
    for r in s.records.iter().filter(|r| !r.outcome.is_ok()) {
        let b = blame(r, &s.events);
        let i = blames.iter().position(|x| *x == b).expect("listed");
        by_cause.entry(r.outcome.cause()).or_default()[i] += 1;
        blame_totals[i] += 1;
    }
    t.push_str("\n| outcome | requests |");
    for b in blames {
        let _ = write!(t, " {} |", b.name());
    }
    t.push_str("\n| --- | --- |");
    t.push_str(&" --- |".repeat(blames.len()));
    t.push('\n');
    let _ = writeln!(t, "| ok | {ok} |{}", " |".repeat(blames.len()));
    for (cause, counts) in &by_cause {
        let n: usize = counts.iter().sum();
        let _ = write!(t, "| {cause} | {n} |");
        for c in counts {
            let _ = write!(t, " {c} |");
        }
        t.push('\n');
    }

    // Per churn kind.
    t.push_str("\n| churn | events | sim in flight at the event | requests in flight on the pod (x-sim-pod) | requests of its model in flight | failed of those |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for kind in [Kind::Add, Kind::Remove, Kind::Kill] {
        let evs: Vec<&Event> = s.events.iter().filter(|e| e.kind == kind).collect();
        let sim: u64 = evs.iter().filter_map(|e| e.sim_in_flight).sum();
        let on_pod = s
            .records
            .iter()
            .filter(|r| {
                evs.iter().any(|e| {
                    r.pod.as_deref() == Some(e.pod.as_str()) && r.start <= e.at && e.at <= r.end
                })
            })
            .count();
        let of_model: Vec<&Record> = s
            .records
            .iter()
            .filter(|r| evs.iter().any(|e| overlaps(r, e)))
            .collect();
        let failed = of_model.iter().filter(|r| !r.outcome.is_ok()).count();
        let sim_cell = if kind == Kind::Add {
            "-".to_owned()
        } else {
            sim.to_string()
        };
        let _ = writeln!(
            t,
            "| {} | {} | {sim_cell} | {on_pod} | {} | {failed} |",
            kind.name(),
            evs.len(),
            of_model.len()
        );
    }
    let notes: Vec<String> = s
        .events
        .iter()
        .filter(|e| !e.note.is_empty())
        .map(|e| {
            format!(
                "{} {} at {:.1} s: {}",
                e.kind.name(),
                e.pod,
                e.at.as_secs_f64(),
                e.note
            )
        })
        .collect();
    for n in &notes {
        let _ = writeln!(t, "\nnote: {n}");
    }

    // The proxy's own account of upstream failures, by target.
    let (mut on_killed, mut on_others) = (0u64, 0u64);
    for (target, n) in &s.upstream_failures {
        if s.killed_addrs.contains(target) {
            on_killed += n;
        } else {
            on_others += n;
        }
    }
    let _ = writeln!(
        t,
        "\nproxy log, `upstream request failed` warnings: {on_killed} on killed pods, {on_others} on other targets"
    );

    let g = &s.gauges_after;
    let _ = writeln!(
        t,
        "\nafter the run{}: /debug/routing active {} in_flight_here {} reservations {} reservations_pending {}; /metrics flexinfer_proxy_active_connections {}{}",
        match s.settled_after {
            Some(d) => format!(" (all zero {:.1} s after the last client finished)", d.as_secs_f64()),
            None => " (NOT all zero within 20 s)".to_owned(),
        },
        g.active,
        g.in_flight_here,
        g.reservations,
        g.reservations_pending,
        g.active_connections,
        match g.ebpf {
            Some((tracked, a, f)) => format!(
                "; ebpf status: tracked connections {tracked}, active {a}, in_flight {f}"
            ),
            None => String::new(),
        }
    );
    let (start, peak, end) = s.rss_kib;
    let _ = writeln!(
        t,
        "\nproxy RSS (VmRSS): start {:.1} MiB, peak {:.1} MiB, end {:.1} MiB",
        start as f64 / 1024.0,
        peak as f64 / 1024.0,
        end as f64 / 1024.0
    );

    let removal_failures = blame_totals[2];
    let unexplained = blame_totals[2] + blame_totals[3] + blame_totals[4];
    let mut verdict = Vec::new();
    if removal_failures > 0 {
        verdict.push(format!(
            "{removal_failures} failures during graceful removals (target 0)"
        ));
    }
    if unexplained > removal_failures {
        verdict.push(format!(
            "{} failures not on a killed pod (target 0)",
            unexplained - removal_failures
        ));
    }
    if s.settled_after.is_none() {
        verdict.push("gauges or reservations did not return to 0".into());
    }
    let pass = verdict.is_empty();
    let _ = writeln!(
        t,
        "\nverdict: {}",
        if pass {
            "PASS: no failure outside requests in flight on killed pods; gauges back to 0"
                .to_owned()
        } else {
            format!("FAIL: {}", verdict.join("; "))
        }
    );
    (t, pass)
}

fn records_csv(records: &[Record]) -> String {
    let mut s = String::from("model,stream,start_ms,end_ms,pod,outcome\n");
    for r in records {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            MODELS[r.model].0,
            r.stream,
            r.start.as_millis(),
            r.end.as_millis(),
            r.pod.as_deref().unwrap_or(""),
            r.outcome.cause().replace(',', ";")
        );
    }
    s
}

/// `target=<addr>` of every `upstream request failed` line of the proxy's log.
fn upstream_failures(log: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains("upstream request failed"))
    {
        if let Some(t) = l.split_whitespace().find_map(|w| w.strip_prefix("target=")) {
            *out.entry(t.to_owned()).or_default() += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------

pub fn run(args: &Soak) -> Result<()> {
    if args.clients == 0 || args.pods < MIN_PODS || args.pods > MAX_PODS {
        bail!("--clients must be positive and --pods within {MIN_PODS}..={MAX_PODS}");
    }
    let ebpf_mode = match args.gauge.as_str() {
        "auto" => is_root(),
        "ebpf" if is_root() => true,
        "ebpf" => bail!("--gauge ebpf needs root"),
        "userspace" => false,
        g => bail!("--gauge {g}: use auto, ebpf or userspace"),
    };
    let bin = ebpf::release_proxy(!args.no_build, ebpf_mode)?;
    if ebpf_mode {
        for p in Cgroup::remove_stale(RUN_PREFIX)
            .into_iter()
            .chain(PinDir::remove_stale(RUN_PREFIX))
        {
            eprintln!("soak: removed {} of a run that was killed", p.display());
        }
    }
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let out = ebpf::target_dir().join("soak").join(stamp.to_string());
    std::fs::create_dir_all(&out)?;
    let command = format!(
        "cargo xtask {}\n",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    std::fs::write(out.join("command.txt"), &command)?;

    // Drop order (reverse of declaration): proxy, pods, pins, cgroup.
    let cgroup = ebpf_mode.then(|| Cgroup::create(RUN_PREFIX)).transpose()?;
    let pins = cgroup.as_ref().map(|_| PinDir::new(RUN_PREFIX));
    let admin = loopback(free_port());
    let proxy_addr = loopback(free_port());
    let mut fleet = Fleet {
        pods: Vec::new(),
        next: 0,
        bin: bin.clone(),
        out: out.clone(),
        models_file: out.join("models.yaml"),
        admin,
    };
    for m in 0..MODELS.len() {
        for _ in 0..args.pods {
            fleet.start_pod(m)?;
        }
    }
    fleet.write()?;
    let mut cmd = Command::new(&bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(&fleet.models_file)
        .args(["--discovery", "file", "--config-poll", "100ms"])
        .args(["--listen", &proxy_addr.to_string()])
        .args(["--admin-listen", &admin.to_string()])
        .args(["--drain-timeout", "2s"]);
    if let (Some(cg), Some(pins)) = (&cgroup, &pins) {
        cmd.arg("--cgroup-path")
            .arg(cg.path())
            .arg("--bpf-pin-dir")
            .arg(pins.path());
        cg.spawn_inside(&mut cmd);
    } else {
        cmd.args(["--gauge", "userspace"]);
    }
    let proxy_log = out.join("proxy.log");
    let proxy = Proc::spawn("flexinfer-proxy", cmd, &proxy_log)?.graceful(Duration::from_secs(5));
    wait_http_ok(admin, "/readyz", START_TIMEOUT).with_context(|| proxy.log_text())?;
    let metrics = http_request(admin, "GET", "/metrics", &[], b"")?.text();
    let ebpf_on = metrics.contains("flexinfer_proxy_ebpf_enabled 1");
    if ebpf_mode && !ebpf_on {
        bail!(
            "the proxy did not load its eBPF gauge:\n{}",
            proxy.log_text()
        );
    }
    let mode = if ebpf_on {
        "eBPF gauge (child cgroup, own pin dir)".to_owned()
    } else {
        "--gauge userspace".to_owned()
    };
    // One request per model must work before the load starts.
    let mut rng = Rng::new(args.seed);
    for (m, (name, _)) in MODELS.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (o, _) = classify(
                false,
                exchange(proxy_addr, &request_body(&mut rng, m, false)),
            );
            if o.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("pre-flight request for {} failed: {}", name, o.cause());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let pid = proxy.pid();
    let rss_start = vm_rss_kib(pid).unwrap_or(0);
    println!(
        "soak: {} clients for {:?} through {proxy_addr} ({mode}); {} pods per model; output in {}",
        args.clients,
        args.duration,
        args.pods,
        out.display()
    );

    let t0 = Instant::now();
    let deadline = t0 + args.duration;
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(rss_start));
    let sampler = {
        let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = vm_rss_kib(pid) {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let churn = {
        let stop = Arc::clone(&stop);
        let churn = Churn {
            fleet,
            rng: Rng::new(args.seed.wrapping_mul(31).wrapping_add(7)),
            t0,
            events: Vec::new(),
        };
        let every = args.churn_every;
        std::thread::spawn(move || churn.run(every, deadline, &stop))
    };
    let clients: Vec<_> = (0..args.clients)
        .map(|id| {
            let seed = args.seed;
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || client(id, proxy_addr, seed, t0, deadline))
        })
        .collect::<std::io::Result<_>>()?;
    let mut records = Vec::new();
    for c in clients {
        records.extend(
            c.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?,
        );
    }
    let wall = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let churn = churn
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))?
        .context("churn")?;
    let _ = sampler.join();
    let idle_at = Instant::now();
    // Reservations expire after their TTL (10 s by default): give the gauges 20 s to settle.
    let mut settled_after = None;
    let mut last = Gauges::default();
    while idle_at.elapsed() < Duration::from_secs(20) {
        last = gauges(admin, &bin, pins.as_ref())?;
        if last.zero() {
            settled_after = Some(idle_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let rss_end = vm_rss_kib(pid).unwrap_or(0);
    let killed_addrs: Vec<String> = churn
        .fleet
        .pods
        .iter()
        .filter(|p| p.state == PodState::Killed)
        .map(|p| p.addr.to_string())
        .collect();
    records.sort_by_key(|r| r.start);
    let summary = Summary {
        upstream_failures: upstream_failures(&proxy.log_text()),
        records,
        events: churn.events.clone(),
        gauges_after: last,
        settled_after,
        rss_kib: (
            rss_start,
            peak.load(Ordering::Relaxed).max(rss_end),
            rss_end,
        ),
        killed_addrs,
        mode,
    };
    let (table, pass) = report(&summary, args, wall);
    let mut events_text = String::new();
    for e in &summary.events {
        let _ = writeln!(
            events_text,
            "{:>7.2}s {:>7.2}s {:<16} {:<20} {:<8} sim_in_flight={:?} {}",
            e.at.as_secs_f64(),
            e.done.as_secs_f64(),
            e.kind.name(),
            MODELS[e.model].0,
            e.pod,
            e.sim_in_flight,
            e.note
        );
    }
    std::fs::write(out.join("events.txt"), &events_text)?;
    std::fs::write(out.join("records.csv"), records_csv(&summary.records))?;
    let full = format!("command: {command}date: {}\n\n{table}", date());
    std::fs::write(out.join("report.md"), &full)?;
    println!("\n{full}");
    drop(proxy);
    drop(churn);
    if !pass {
        bail!("soak targets missed (report in {})", out.display());
    }
    Ok(())
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str, complete: bool) -> Result<Reply, String> {
        Ok(Reply {
            status,
            headers: vec![("x-sim-pod".into(), "ll-1".into())],
            body: body.as_bytes().to_vec(),
            complete,
        })
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("2h").is_err() && parse_duration("x").is_err());
    }

    #[test]
    fn classifies_what_clients_see() {
        let done = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(classify(true, reply(200, done, true)).0, Outcome::Ok);
        assert_eq!(
            classify(true, reply(200, done, true)).1.as_deref(),
            Some("ll-1")
        );
        assert_eq!(
            classify(true, reply(200, "data: {\"choices\":[]}\n\n", false)).0,
            Outcome::Cut { stream: true }
        );
        assert_eq!(
            classify(true, reply(200, "data: {\"choices\":[]}\n\n", true)).0,
            Outcome::Ended
        );
        let err = "data: {\"choices\":[]}\n\nevent: error\ndata: {\"error\":{\"message\":\"m\",\"type\":\"upstream_error\",\"code\":\"upstream_failed\"}}\n\n";
        assert_eq!(
            classify(true, reply(200, err, true)).0,
            Outcome::SseError {
                code: "upstream_failed".into()
            }
        );
        let e502 = r#"{"error":{"message":"m","type":"upstream_error","code":"upstream_failed"}}"#;
        assert_eq!(
            classify(false, reply(502, e502, true)).0.cause(),
            "HTTP 502 upstream_failed"
        );
        assert_eq!(
            classify(false, reply(200, r#"{"choices":[{}]}"#, true)).0,
            Outcome::Ok
        );
        assert_eq!(
            classify(false, reply(200, r#"{"choi"#, false)).0,
            Outcome::Cut { stream: false }
        );
        assert_eq!(
            classify(false, Err("head reset".into())).0.cause(),
            "no response: head reset"
        );
    }

    #[test]
    fn reads_chunked_bodies_and_notices_cuts() {
        let mut body = Vec::new();
        let mut r = &b"5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n"[..];
        assert!(read_chunked(&mut r, &mut body).unwrap());
        assert_eq!(body, b"hello!");
        let mut body = Vec::new();
        let mut r = &b"5\r\nhel"[..];
        assert!(!read_chunked(&mut r, &mut body).unwrap());
    }

    #[test]
    fn blames_failures_on_the_churn_they_overlap() {
        let s = |ms| Duration::from_millis(ms);
        let rec = |pod: Option<&str>, start, end| Record {
            model: 0,
            stream: true,
            start: s(start),
            end: s(end),
            pod: pod.map(str::to_owned),
            outcome: Outcome::Cut { stream: true },
        };
        let ev = |kind, pod: &str, at, done| Event {
            kind,
            model: 0,
            pod: pod.into(),
            at: s(at),
            done: s(done),
            sim_in_flight: None,
            note: String::new(),
        };
        let events = [
            ev(Kind::Kill, "ll-1", 1000, 1010),
            ev(Kind::Remove, "ll-2", 3000, 4000),
            ev(Kind::Add, "ll-3", 6000, 6500),
        ];
        assert_eq!(
            blame(&rec(Some("ll-1"), 900, 1100), &events),
            Blame::KilledPod
        );
        // The kill spans from the signal to the reaped process: a stream that broke inside
        // it, or a request that reached the dying pod then, is on the killed pod.
        assert_eq!(
            blame(&rec(Some("ll-1"), 1004, 1008), &events),
            Blame::KilledPod
        );
        assert_eq!(blame(&rec(None, 900, 1100), &events), Blame::KillUnreported);
        assert_eq!(blame(&rec(Some("ll-4"), 900, 1100), &events), Blame::Steady);
        assert_eq!(
            blame(&rec(Some("ll-2"), 3500, 3600), &events),
            Blame::Removal
        );
        assert_eq!(blame(&rec(None, 6400, 7000), &events), Blame::Add);
        assert_eq!(blame(&rec(None, 8000, 9000), &events), Blame::Steady);
    }

    #[test]
    fn reads_ebpf_status_and_metrics() {
        let status = "pinned set: /sys/fs/bpf/x/v2\ntracked connections: 4   pods: 2\nslot   active in_flight  idle unregistered  pod\n0           2         2     0            0  127.0.0.1:18080\n1           1         0     1            1  127.0.0.1:18081\n";
        assert_eq!(parse_ebpf_status(status), Some((4, 3, 2)));
        let m = "# HELP x\nflexinfer_proxy_active_connections{model=\"a\"} 2\nflexinfer_proxy_active_connections{model=\"b\"} 1\nflexinfer_proxy_active_connections_other 9\n";
        assert_eq!(metric_sum(m, "flexinfer_proxy_active_connections"), 3.0);
        let log = "WARN routing_userspace::proxy::forward: upstream request failed model=m target=127.0.0.1:5 error=x\nINFO other target=1\n";
        assert_eq!(
            upstream_failures(log),
            BTreeMap::from([("127.0.0.1:5".to_owned(), 1)])
        );
    }

    #[test]
    fn bodies_name_their_model_and_stream_flag() {
        let mut rng = Rng::new(3);
        for (m, (name, _)) in MODELS.iter().enumerate() {
            for stream in [false, true] {
                let v: Value = serde_json::from_slice(&request_body(&mut rng, m, stream)).unwrap();
                assert_eq!(v["model"], *name);
                assert_eq!(v["stream"], stream);
                let has_system = v["messages"][0]["role"] == "system";
                assert_eq!(has_system, *name == PREFIX);
            }
        }
    }
}
