//! `cargo xtask bench overhead`: what flexinfer-proxy costs per request next to nginx, haproxy
//! and smg, in front of upstreams so fast that the proxy's own work is what gets measured.
//!
//! The upstreams are one nginx serving a fixed chat completion on three loopback ports (it
//! answers in microseconds; a simulated model server would hide the proxy). Every proxy runs
//! one worker thread and routes one model over the three upstreams, per case: a session header
//! with a small body (consistent hashing on `X-Session-ID`), a ~4 KB chat body (flexinfer
//! routes it by its prefix, the header proxies by the session header) and least-loaded.
//! wrk -t1 and the upstreams share CPU 0; the proxy under test has CPU 1 to itself, so its
//! requests per second are what one core of it serves. Configurations are interleaved round by
//! round so drift hits all alike; the table gives the median and min..max over rounds, and
//! raw output goes to `<target>/bench-overhead/<unix time>/`.
//!
//! The default-flags row runs as root with no `--gauge` flag, so the proxy loads its eBPF gauge;
//! it attaches to a child cgroup of this harness with a pin dir of its own, both removed after
//! the run (and, if a run was killed, by the next one). Only loopback addresses are used.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use flexinfer_test_support::{
    free_port, http_request, is_root, loopback, pin_to_cpu, wait_http_ok, wait_port, Cgroup,
    ModelEntry, ModelsFile, PinDir, Proc, TempDir,
};

use crate::ebpf;

#[derive(clap::Args)]
pub struct OverheadBench {
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Warm-up seconds before each measured run (not recorded).
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Rounds (each selected configuration and case once per round).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Connections wrk keeps open (closed loop: this many requests always in flight).
    #[arg(long, default_value_t = 32)]
    pub connections: u32,
    /// Only these configurations and/or cases, comma-separated (configurations: direct, nginx,
    /// haproxy, smg, fx-userspace, fx-default; cases: session, prefix, least-loaded). A kind
    /// not named is not filtered.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
}

/// wrk and the upstreams; the proxy under test runs alone on [`PROXY_CPU`].
const LOAD_CPU: usize = 0;
const PROXY_CPU: usize = 1;
const MODEL: &str = "bench-model";
const PATH: &str = "/v1/chat/completions";
const UPSTREAMS: usize = 3;
/// Prefix of the cgroups and pin dirs this harness creates (`<prefix>-<pid>-<n>`).
const PREFIX: &str = "flexinfer-bench";
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Direct,
    Nginx,
    Haproxy,
    Smg,
    FxUserspace,
    FxDefault,
}

const TARGETS: [Target; 6] = [
    Target::Direct,
    Target::Nginx,
    Target::Haproxy,
    Target::Smg,
    Target::FxUserspace,
    Target::FxDefault,
];

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Haproxy => "haproxy",
            Target::Smg => "smg",
            Target::FxUserspace => "fx-userspace",
            Target::FxDefault => "fx-default",
        }
    }

    fn what(self, case: Case) -> String {
        match (self, case) {
            (Target::Direct, _) => "wrk -> one upstream, no proxy".into(),
            (Target::Nginx, Case::LeastLoaded) => "nginx 1 worker, least_conn, keepalive".into(),
            (Target::Nginx, _) => {
                "nginx 1 worker, hash $http_x_session_id consistent, keepalive".into()
            }
            (Target::Haproxy, Case::LeastLoaded) => "haproxy nbthread 1, balance leastconn".into(),
            (Target::Haproxy, _) => {
                "haproxy nbthread 1, balance hdr(X-Session-ID), hash-type consistent".into()
            }
            (Target::Smg, c) => format!("smg, 1 tokio worker, --policy {}", c.smg_policy()),
            (Target::FxUserspace, c) => {
                format!("flexinfer --gauge userspace, routing {}", c.routing())
            }
            (Target::FxDefault, c) => format!(
                "flexinfer default flags as root (eBPF gauge, pooled connections), routing {}",
                c.routing()
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Session,
    Prefix,
    LeastLoaded,
}

const CASES: [Case; 3] = [Case::Session, Case::Prefix, Case::LeastLoaded];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Session => "session",
            Case::Prefix => "prefix",
            Case::LeastLoaded => "least-loaded",
        }
    }

    /// flexinfer's `routing:` for the case.
    fn routing(self) -> &'static str {
        match self {
            Case::Session => "session-affinity",
            Case::Prefix => "prefix",
            Case::LeastLoaded => "least-loaded",
        }
    }

    fn smg_policy(self) -> &'static str {
        match self {
            Case::Session => "consistent_hashing",
            Case::Prefix => "prefix_hash",
            Case::LeastLoaded => "least_load",
        }
    }

    /// Whether clients send a fresh `X-Session-ID` per request (the header proxies hash it).
    fn sends_session(self) -> bool {
        self != Case::LeastLoaded
    }

    fn body(self) -> String {
        match self {
            Case::Prefix => prefix_body(),
            Case::Session | Case::LeastLoaded => small_body(),
        }
    }
}

/// One wrk run's numbers (from the Lua `done` hook) and the CPU use while it ran.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    requests: u64,
    duration_us: u64,
    errors: u64,
    non2xx: u64,
    p50_us: u64,
    p99_us: u64,
    /// CPU time the proxy (with its child processes) used over the measured run.
    proxy_cpu: Option<Duration>,
}

impl Sample {
    fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
    }

    /// The proxy's CPU microseconds per request.
    fn cpu_us_per_request(&self) -> Option<f64> {
        self.proxy_cpu
            .map(|c| c.as_secs_f64() * 1e6 / self.requests.max(1) as f64)
    }

    /// The share of its core the proxy kept busy.
    fn proxy_core_share(&self) -> Option<f64> {
        self.proxy_cpu
            .map(|c| c.as_secs_f64() * 1e6 / self.duration_us as f64)
    }

    fn parse(out: &str) -> Result<Self> {
        let line = out
            .lines()
            .find(|l| l.starts_with("BENCH "))
            .ok_or_else(|| anyhow!("no BENCH line in wrk output:\n{out}"))?;
        let mut s = Sample::default();
        for kv in line.split_whitespace().skip(1) {
            let (k, v) = kv.split_once('=').context("BENCH field without =")?;
            let v: u64 = v.parse().with_context(|| format!("BENCH field {kv}"))?;
            match k {
                "requests" => s.requests = v,
                "duration_us" => s.duration_us = v,
                "errors" => s.errors = v,
                "non2xx" => s.non2xx = v,
                "p50_us" => s.p50_us = v,
                "p99_us" => s.p99_us = v,
                _ => {}
            }
        }
        if s.duration_us == 0 {
            bail!("wrk reported a zero duration: {line}");
        }
        Ok(s)
    }
}

/// What the runs share.
struct Env<'a> {
    bin: &'a Path,
    smg: Option<&'a Path>,
    tmp: &'a Path,
    out: &'a Path,
    args: &'a OverheadBench,
}

pub fn run(args: &OverheadBench) -> Result<()> {
    let (targets, cases) = select(&args.only)?;
    crate::setup::ensure_apt(&["nginx", "haproxy", "wrk"])?;
    let root = is_root();
    let bin = ebpf::release_proxy(!args.no_build, root)?;
    if root {
        for p in Cgroup::remove_stale(PREFIX)
            .into_iter()
            .chain(PinDir::remove_stale(PREFIX))
        {
            eprintln!(
                "bench overhead: removed {} of a run that was killed",
                p.display()
            );
        }
    }

    let base = ebpf::target_dir().join("bench-overhead");
    let mut skipped: Vec<String> = Vec::new();
    let smg = if targets.contains(&Target::Smg) {
        match install_smg(&base) {
            Ok(p) => Some(p),
            Err(e) => {
                skipped.push(format!("smg: not measured, it did not install: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    let targets: Vec<Target> = targets
        .into_iter()
        .filter(|t| match t {
            Target::Smg => smg.is_some(),
            Target::FxDefault if !root => {
                skipped.push(
                    "fx-default: not measured, not running as root (it loads the eBPF gauge)"
                        .into(),
                );
                false
            }
            _ => true,
        })
        .collect();
    if targets.is_empty() || cases.is_empty() {
        bail!("nothing to run: {}", skipped.join("; "));
    }

    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let out = base.join(stamp.to_string());
    std::fs::create_dir_all(&out)?;
    let tmp = TempDir::try_new("bench")?;
    std::fs::write(out.join("command.txt"), command_line())?;
    std::fs::write(out.join("versions.txt"), versions(smg.as_deref()))?;
    let env = Env {
        bin: &bin,
        smg: smg.as_deref(),
        tmp: tmp.path(),
        out: &out,
        args,
    };
    println!(
        "bench overhead: {} connections, {}s warm-up + {}s measured, {} rounds; raw output in {}",
        args.connections,
        args.warmup,
        args.duration,
        args.rounds,
        out.display()
    );
    let mut rows: Vec<(Case, Target, Vec<Sample>)> = Vec::new();
    for &case in &cases {
        for &t in &targets {
            rows.push((case, t, Vec::new()));
        }
    }
    for round in 1..=args.rounds {
        for (case, target, samples) in rows.iter_mut() {
            let tag = format!("{}-{}-r{round}", case.name(), target.name());
            let s = run_one(*target, *case, &tag, &env)
                .with_context(|| format!("{} / {} (round {round})", case.name(), target.name()))?;
            println!(
                "  {:<13} {:<13} round {round}: {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  proxy CPU {}  errors {} non-2xx {}",
                case.name(),
                target.name(),
                s.rps(),
                s.p50_us as f64 / 1e3,
                s.p99_us as f64 / 1e3,
                cpu_cell(&[s]),
                s.errors,
                s.non2xx
            );
            samples.push(s);
        }
    }
    let mut table = render_table(&rows);
    for s in &skipped {
        let _ = writeln!(table, "\n{s}");
    }
    std::fs::write(out.join("table.md"), &table)?;
    println!("\n{table}");
    Ok(())
}

/// Split `--only` into the configurations and cases it names (all of a kind it does not name).
fn select(only: &[String]) -> Result<(Vec<Target>, Vec<Case>)> {
    for o in only {
        let known = TARGETS.iter().any(|t| t.name() == o) || CASES.iter().any(|c| c.name() == o);
        if !known {
            let names: Vec<&str> = TARGETS
                .iter()
                .map(|t| t.name())
                .chain(CASES.iter().map(|c| c.name()))
                .collect();
            bail!("--only {o}: not one of {}", names.join(", "));
        }
    }
    let named = |n: &str| only.iter().any(|o| o == n);
    let mut targets: Vec<Target> = TARGETS.into_iter().filter(|t| named(t.name())).collect();
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let mut cases: Vec<Case> = CASES.into_iter().filter(|c| named(c.name())).collect();
    if cases.is_empty() {
        cases = CASES.to_vec();
    }
    Ok((targets, cases))
}

/// Start the processes of one run, check one request, warm up, measure, stop everything.
fn run_one(target: Target, case: Case, tag: &str, env: &Env) -> Result<Sample> {
    let dir = env.tmp.join(tag);
    std::fs::create_dir_all(&dir)?;
    let log = |what: &str| env.out.join(format!("{tag}-{what}.log"));
    // Drop order (reverse of declaration): proxy, upstreams, pins, cgroup.
    let cgroup = match target {
        Target::FxDefault => Some(Cgroup::create(PREFIX)?),
        _ => None,
    };
    let pins = cgroup.as_ref().map(|_| PinDir::new(PREFIX));
    let ports: Vec<u16> = (0..UPSTREAMS).map(|_| free_port()).collect();
    let upstreams: Vec<SocketAddr> = ports.iter().map(|&p| loopback(p)).collect();
    let _upstream = start_upstreams(&dir, &ports, cgroup.as_ref(), &log("upstreams"))?;
    for &u in &upstreams {
        wait_http_ok(u, "/health", START_TIMEOUT)?;
    }

    let port = free_port();
    let addr = loopback(port);
    // Where the proxy reports on itself: flexinfer's admin port, smg's metrics port.
    let mut stats = None;
    let proxy: Option<Proc> = match target {
        Target::Direct => None,
        Target::Nginx => {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_proxy_conf(&dir, port, &upstreams, case))?;
            Some(nginx(&dir, &conf, &log("nginx"))?)
        }
        Target::Haproxy => {
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_conf(port, &upstreams, case))?;
            let mut cmd = Command::new("haproxy");
            cmd.args(["-db", "-f"]).arg(&conf);
            pin_to_cpu(&mut cmd, PROXY_CPU);
            Some(Proc::spawn("haproxy", cmd, &log("haproxy"))?.graceful(Duration::from_secs(5)))
        }
        Target::Smg => {
            let smg = env.smg.context("smg row without smg")?;
            let metrics = free_port();
            stats = Some(loopback(metrics));
            let mut cmd = Command::new(smg);
            cmd.args(["launch", "--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .arg("--worker-urls")
                .args(upstreams.iter().map(|u| format!("http://{u}")))
                .args(["--policy", case.smg_policy()]);
            if case == Case::Session {
                cmd.args(["--routing-key-headers", "X-Session-ID"]);
            }
            cmd.args([
                "--disable-tokenizer-autoload",
                "--log-level",
                "warn",
                "--shutdown-grace-period-secs",
                "1",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
            ])
            .arg(metrics.to_string())
            // smg has no worker-thread flag; tokio reads this (and the affinity mask alone
            // would give one worker too). The metrics file of the run shows smg_tokio_workers.
            .env("TOKIO_WORKER_THREADS", "1");
            pin_to_cpu(&mut cmd, PROXY_CPU);
            Some(Proc::spawn("smg", cmd, &log("smg"))?.graceful(Duration::from_secs(10)))
        }
        Target::FxUserspace | Target::FxDefault => {
            let models = dir.join("models.yaml");
            ModelsFile::new()
                .model(
                    ModelEntry::new(MODEL)
                        .routing(case.routing())
                        .endpoints(&upstreams),
                )
                .write_to(&models)?;
            let admin_port = free_port();
            stats = Some(loopback(admin_port));
            let mut cmd = Command::new(env.bin);
            cmd.arg("serve")
                .arg("--config")
                .arg(&models)
                .args(["--listen", &addr.to_string()])
                .args(["--admin-listen", &loopback(admin_port).to_string()])
                .args(["--worker-threads", "1", "--drain-timeout", "1s"]);
            if target == Target::FxUserspace {
                cmd.args(["--gauge", "userspace"]);
            }
            if let (Some(cg), Some(pins)) = (&cgroup, &pins) {
                cmd.arg("--cgroup-path")
                    .arg(cg.path())
                    .arg("--bpf-pin-dir")
                    .arg(pins.path());
                cg.spawn_inside(&mut cmd);
            }
            pin_to_cpu(&mut cmd, PROXY_CPU);
            let p = Proc::spawn("flexinfer-proxy", cmd, &log("proxy"))?
                .graceful(Duration::from_secs(5));
            wait_http_ok(loopback(admin_port), "/readyz", START_TIMEOUT)
                .with_context(|| p.log_text())?;
            Some(p)
        }
    };
    let url_addr = if target == Target::Direct {
        upstreams[0]
    } else {
        addr
    };
    wait_port(url_addr, START_TIMEOUT)?;
    let body = case.body();
    preflight(url_addr, case, &body, target, tag, env)?;
    if target == Target::FxDefault {
        let m = http_request(stats.context("admin port")?, "GET", "/metrics", &[], b"")?.text();
        if !m.contains("flexinfer_proxy_ebpf_enabled 1") {
            bail!(
                "default flags as root did not load the eBPF gauge:\n{}",
                proxy.as_ref().map(Proc::log_text).unwrap_or_default()
            );
        }
    }

    let script = dir.join("load.lua");
    std::fs::write(&script, wrk_script(&body, case.sends_session()))?;
    let url = format!("http://{url_addr}{PATH}");
    if env.args.warmup > 0 {
        wrk(env, &script, &url, env.args.warmup, None)?;
    }
    let cpu_before = proxy.as_ref().map(Proc::cpu_time);
    let text = wrk(
        env,
        &script,
        &url,
        env.args.duration,
        Some(&env.out.join(format!("{tag}-wrk.txt"))),
    )?;
    let mut sample = Sample::parse(&text)?;
    if let (Some(p), Some(before)) = (&proxy, cpu_before) {
        sample.proxy_cpu = Some(p.cpu_time().saturating_sub(before));
    }
    // Evidence next to the numbers: the proxy's own view after the run.
    if let Some(a) = stats {
        let path = if target == Target::Smg {
            "/metrics"
        } else {
            "/debug/routing"
        };
        if let Ok(r) = http_request(a, "GET", path, &[], b"") {
            std::fs::write(env.out.join(format!("{tag}-after.txt")), r.text())?;
        }
    }
    if let Some(pins) = &pins {
        let status = Command::new(env.bin)
            .args(["ebpf", "status", "--bpf-pin-dir"])
            .arg(pins.path())
            .output()?;
        std::fs::write(
            env.out.join(format!("{tag}-ebpf-status.txt")),
            &status.stdout,
        )?;
    }
    drop(proxy);
    Ok(sample)
}

/// One request through the configuration must answer 200 with the completion, then a few
/// sessions show which upstreams it spreads over (written to `<tag>-preflight.txt`).
fn preflight(
    addr: SocketAddr,
    case: Case,
    body: &str,
    target: Target,
    tag: &str,
    env: &Env,
) -> Result<()> {
    // smg registers its workers in the background after it starts listening.
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    let headers = [("X-Session-ID", "preflight")];
    loop {
        let r = http_request(addr, "POST", PATH, &headers, body.as_bytes());
        match r {
            Ok(r) if r.status == 200 && r.text().contains("chat.completion") => break,
            Ok(r) if std::time::Instant::now() >= deadline => {
                bail!(
                    "{}: pre-flight POST answered {}: {}",
                    target.name(),
                    r.status,
                    r.text()
                )
            }
            Err(e) if std::time::Instant::now() >= deadline => {
                bail!("{}: pre-flight POST failed: {e}", target.name())
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..30 {
        let id = format!("preflight-{i}");
        let h: &[(&str, &str)] = if case.sends_session() {
            &[("X-Session-ID", id.as_str())]
        } else {
            &[]
        };
        let r = http_request(addr, "POST", PATH, h, body.as_bytes())?;
        let up = r.header("x-upstream").unwrap_or("(no x-upstream header)");
        *seen.entry(up.to_string()).or_default() += 1;
    }
    std::fs::write(
        env.out.join(format!("{tag}-preflight.txt")),
        format!("30 requests, served by: {seen:?}\n"),
    )?;
    Ok(())
}

/// The three static upstreams: one nginx, one worker, three ports.
fn start_upstreams(dir: &Path, ports: &[u16], cgroup: Option<&Cgroup>, log: &Path) -> Result<Proc> {
    let up = dir.join("upstreams");
    std::fs::create_dir_all(&up)?;
    let conf = up.join("nginx.conf");
    std::fs::write(&conf, upstream_conf(&up, ports))?;
    let mut cmd = Command::new("nginx");
    cmd.arg("-p")
        .arg(&up)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(up.join("error.log"));
    pin_to_cpu(&mut cmd, LOAD_CPU);
    if let Some(cg) = cgroup {
        cg.spawn_inside(&mut cmd);
    }
    Ok(Proc::spawn("upstream nginx", cmd, log)?.graceful(Duration::from_secs(5)))
}

fn nginx(dir: &Path, conf: &Path, log: &Path) -> Result<Proc> {
    let mut cmd = Command::new("nginx");
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(conf)
        .arg("-e")
        .arg(dir.join("error.log"));
    pin_to_cpu(&mut cmd, PROXY_CPU);
    Ok(Proc::spawn("nginx", cmd, log)?.graceful(Duration::from_secs(5)))
}

fn wrk(env: &Env, script: &Path, url: &str, secs: u32, save: Option<&Path>) -> Result<String> {
    let mut cmd = Command::new("wrk");
    cmd.arg("-t1")
        .arg(format!("-c{}", env.args.connections))
        .arg(format!("-d{secs}s"))
        .args(["--timeout", "5s", "-s"])
        .arg(script)
        .arg(url);
    let out = pin_to_cpu(&mut cmd, LOAD_CPU)
        .output()
        .context("running wrk")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(p) = save {
        std::fs::write(p, &text)?;
    }
    if !out.status.success() {
        bail!("wrk failed ({}):\n{text}", out.status);
    }
    Ok(text)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Median CPU microseconds per request of the proxy and the share of its core it used, e.g.
/// `33.4 (99%)`; `-` without a proxy.
fn cpu_cell(s: &[Sample]) -> String {
    let per_req: Vec<f64> = s.iter().filter_map(Sample::cpu_us_per_request).collect();
    let share: Vec<f64> = s.iter().filter_map(Sample::proxy_core_share).collect();
    if per_req.is_empty() {
        return "-".into();
    }
    format!("{:.1} ({:.0}%)", median(per_req), median(share) * 100.0)
}

fn render_table(rows: &[(Case, Target, Vec<Sample>)]) -> String {
    let med = |s: &[Sample], f: fn(&Sample) -> f64| median(s.iter().map(f).collect());
    let rps = |s: &Sample| s.rps();
    let p50 = |s: &Sample| s.p50_us as f64 / 1e3;
    let p99 = |s: &Sample| s.p99_us as f64 / 1e3;
    let mut t = String::new();
    t.push_str("| case | config | what | req/s median [min, max] | p50 ms median [min, max] | p99 ms median [min, max] | req/s / haproxy | p50 / haproxy | p99 / haproxy | proxy CPU us/req (core busy) | errors + non-2xx |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (case, target, s) in rows {
        let haproxy = rows
            .iter()
            .find(|(c, t, _)| c == case && *t == Target::Haproxy)
            .map(|(_, _, h)| h.as_slice());
        let cell = |f: fn(&Sample) -> f64, digits: usize| {
            let v: Vec<f64> = s.iter().map(f).collect();
            let (lo, hi) = spread(&v);
            format!(
                "{:.*} [{:.*}, {:.*}]",
                digits,
                median(v.clone()),
                digits,
                lo,
                digits,
                hi
            )
        };
        let ratio = |f: fn(&Sample) -> f64| match haproxy {
            Some(h) if !h.is_empty() => format!("{:.2}", med(s, f) / med(h, f)),
            _ => "-".into(),
        };
        let bad: u64 = s.iter().map(|x| x.errors + x.non2xx).sum();
        let _ = writeln!(
            t,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.name(),
            target.name(),
            target.what(*case),
            cell(rps, 0),
            cell(p50, 3),
            cell(p99, 3),
            ratio(rps),
            ratio(p50),
            ratio(p99),
            cpu_cell(s),
            bad
        );
    }
    t
}

/// The fixed completion every upstream answers (about 300 bytes).
const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1764547200,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Your parcel ships today."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;

/// A one-turn chat request of about 150 bytes.
fn small_body() -> String {
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Where is my parcel? Order NW-48213."}}],"max_tokens":16}}"#
    )
}

/// A chat request of about 4 KB: a long system prompt (the shared prefix) and one user turn.
fn prefix_body() -> String {
    const RULES: [&str; 6] = [
        "Standard parcels ship within two business days; express parcels ship the same day when ordered before 14:00 local time.",
        "Freight bookings need a confirmed pallet count and a loading-dock time window before a truck is assigned.",
        "Commercial invoices list the HS code, the country of origin and the value of each line item.",
        "Invoices are issued monthly, payment terms are thirty days and disputes must be raised within sixty days.",
        "Never invent tracking numbers, prices or dates; when unsure, say so and name the form or team that can help.",
        "Answer in the customer's language, in short paragraphs, and use a numbered list only for step-by-step instructions.",
    ];
    let mut system =
        String::from("You are the support assistant of Northwind Logistics. Company policy:");
    let mut i = 0;
    while system.len() < 3800 {
        let _ = write!(system, " ({}) {}", i + 1, RULES[i % RULES.len()]);
        i += 1;
    }
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"My express parcel NW-48213 still says label created. When will it ship?"}}],"max_tokens":16}}"#
    )
}

/// POSTs `body`; with `session`, every request carries a new `X-Session-ID` (a counter, so
/// about 10 000 distinct values cycle).
fn wrk_script(body: &str, session: bool) -> String {
    let request = if session {
        r#"
local n = 0
request = function()
  n = n + 1
  wrk.headers["X-Session-ID"] = "session-" .. (n % 10000)
  return wrk.format()
end
"#
    } else {
        ""
    };
    format!(
        r#"wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]
{request}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d duration_us=%d errors=%d non2xx=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

/// The part of an nginx config every instance here shares: pid, logs and temp paths in its
/// own dir (nginx as root otherwise writes under /var/lib/nginx), no access log, and client
/// keep-alive connections that are never closed for their request count.
fn nginx_common(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
"#
    )
}

fn upstream_conf(dir: &Path, ports: &[u16]) -> String {
    let models = format!(
        r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model","owned_by":"bench"}}]}}"#
    );
    let mut s = nginx_common(dir);
    for (i, p) in ports.iter().enumerate() {
        let _ = write!(
            s,
            r#"    server {{
        listen 127.0.0.1:{p};
        default_type application/json;
        add_header X-Upstream u{i};
        location = /health {{ return 200 '{{"status":"ok"}}'; }}
        location = /v1/models {{ return 200 '{models}'; }}
        location / {{ return 200 '{COMPLETION}'; }}
    }}
"#
        );
    }
    s.push_str("}\n");
    s
}

fn nginx_proxy_conf(dir: &Path, port: u16, upstreams: &[SocketAddr], case: Case) -> String {
    let balance = match case {
        Case::LeastLoaded => "least_conn;",
        Case::Session | Case::Prefix => "hash $http_x_session_id consistent;",
    };
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u};\n"))
        .collect();
    let mut s = nginx_common(dir);
    let _ = write!(
        s,
        r#"    upstream be {{
        {balance}
{servers}        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://be;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#
    );
    s
}

fn haproxy_conf(port: u16, upstreams: &[SocketAddr], case: Case) -> String {
    let balance = match case {
        Case::LeastLoaded => "balance leastconn",
        Case::Session | Case::Prefix => "balance hdr(X-Session-ID)\n    hash-type consistent",
    };
    let servers: String = upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| format!("    server u{i} {u}\n"))
        .collect();
    format!(
        r#"global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    http-reuse safe
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    {balance}
{servers}"#
    )
}

/// smg from PyPI in a venv of its own under the target dir: `pip download --no-deps smg`, then
/// the wheel is installed with its (small, pure-Python or prebuilt) dependencies. Idempotent.
pub(crate) fn install_smg(base: &Path) -> Result<PathBuf> {
    let root = base.join("smg");
    let venv = root.join("venv");
    let smg = venv.join("bin").join("smg");
    let works = |p: &Path| {
        Command::new(p)
            .arg("--help")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&smg) {
        return Ok(smg);
    }
    std::fs::create_dir_all(&root)?;
    let run = |cmd: &mut Command| crate::setup::run_logged("bench overhead", cmd);
    if run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).is_err() {
        crate::setup::ensure_apt(&["python3-venv"])?;
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let wheels = root.join("wheels");
    run(Command::new(venv.join("bin").join("pip"))
        .args(["download", "--no-deps", "--quiet", "smg", "-d"])
        .arg(&wheels))?;
    let wheel = std::fs::read_dir(&wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("smg-"))
                && p.extension().is_some_and(|e| e == "whl")
        })
        .context("pip download left no smg wheel")?;
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet"])
        .arg(&wheel))?;
    if !works(&smg) {
        bail!(
            "{} does not run after installing {}",
            smg.display(),
            wheel.display()
        );
    }
    Ok(smg)
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo xtask {}\n", args.join(" "))
}

fn versions(smg: Option<&Path>) -> String {
    let first_line = |cmd: &mut Command| {
        cmd.output()
            .map(|o| {
                let t = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                t.lines().next().unwrap_or_default().to_string()
            })
            .unwrap_or_else(|e| format!("unavailable: {e}"))
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kernel: {}",
        first_line(Command::new("uname").arg("-sr"))
    );
    let _ = writeln!(s, "nginx: {}", first_line(Command::new("nginx").arg("-v")));
    let _ = writeln!(
        s,
        "haproxy: {}",
        first_line(Command::new("haproxy").arg("-v"))
    );
    let _ = writeln!(s, "wrk: {}", first_line(Command::new("wrk").arg("-v")));
    if let Some(p) = smg {
        let python = p.with_file_name("python3");
        let version = first_line(Command::new(python).args([
            "-c",
            "import importlib.metadata as m; print(m.version('smg'))",
        ]));
        let _ = writeln!(s, "smg: {version}");
    }
    let _ = writeln!(
        s,
        "git: {}",
        first_line(
            Command::new("git")
                .current_dir(ebpf::workspace_root())
                .args(["log", "-1", "--format=%h %s"])
        )
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_done_line() {
        let s = Sample::parse(
            "Running 10s test\nBENCH requests=1000 duration_us=2000000 errors=1 non2xx=2 p50_us=900 p99_us=3000\n",
        )
        .unwrap();
        assert_eq!(s.requests, 1000);
        assert_eq!(s.rps(), 500.0);
        assert_eq!((s.errors, s.non2xx, s.p50_us, s.p99_us), (1, 2, 900, 3000));
        assert!(Sample::parse("no line").is_err());
    }

    #[test]
    fn bodies_have_the_issues_sizes_and_quote_safely() {
        let p = prefix_body();
        assert!((3900..=4300).contains(&p.len()), "{}", p.len());
        let s = small_body();
        assert!(s.len() < 200, "{}", s.len());
        for b in [&p, &s] {
            assert!(
                !b.contains("]==]"),
                "the Lua long string must not end early"
            );
            let v: serde_json::Value = serde_json::from_str(b).unwrap();
            assert_eq!(v["model"], MODEL);
        }
        // nginx's return '...' needs the completion free of single quotes.
        assert!(!COMPLETION.contains('\''));
        serde_json::from_str::<serde_json::Value>(COMPLETION).unwrap();
    }

    #[test]
    fn only_filters_each_kind_it_names() {
        let (t, c) = select(&[]).unwrap();
        assert_eq!((t.len(), c.len()), (6, 3));
        let (t, c) = select(&["haproxy".into(), "fx-default".into()]).unwrap();
        assert_eq!(t, vec![Target::Haproxy, Target::FxDefault]);
        assert_eq!(c.len(), 3);
        let (t, c) = select(&["prefix".into()]).unwrap();
        assert_eq!((t.len(), c), (6, vec![Case::Prefix]));
        assert!(select(&["fx-ebpf".into()]).is_err());
    }

    #[test]
    fn the_header_proxies_hash_the_session_header_consistently() {
        let ups = [loopback(1), loopback(2), loopback(3)];
        let n = nginx_proxy_conf(Path::new("/t"), 9, &ups, Case::Session);
        assert!(n.contains("hash $http_x_session_id consistent;") && n.contains("keepalive 64;"));
        assert_eq!(n.matches("server 127.0.0.1:").count(), 3);
        assert!(
            nginx_proxy_conf(Path::new("/t"), 9, &ups, Case::LeastLoaded).contains("least_conn;")
        );
        let h = haproxy_conf(9, &ups, Case::Prefix);
        assert!(h.contains("balance hdr(X-Session-ID)") && h.contains("hash-type consistent"));
        assert!(haproxy_conf(9, &ups, Case::LeastLoaded).contains("balance leastconn"));
    }
}
