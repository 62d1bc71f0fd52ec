//! One sample of `bench overhead`: fresh upstreams and proxy for a (configuration, case), a
//! pre-flight check, a wrk warm-up and a measured wrk run with the proxy's CPU time around it,
//! then evidence (the proxy's own view, `ebpf status`) and everything stopped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use flexinfer_test_support::{
    free_port, http_request, loopback, pin_to_cpu, wait_http_ok, wait_port, Cgroup, ModelEntry,
    ModelsFile, PinDir, Proc,
};

use super::configs::{haproxy_conf, nginx_proxy_conf, upstream_conf, wrk_script};
use super::targets::{Case, Target, MODEL, PATH};
use super::{Env, PREFIX};
use crate::bench::peers::{self, FxGauge, FxLaunch, LOAD_CPU, PROXY_CPU, START_TIMEOUT};

const UPSTREAMS: usize = 3;

/// One wrk run's numbers (from the Lua `done` hook) and the CPU use while it ran.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sample {
    pub requests: u64,
    pub duration_us: u64,
    pub errors: u64,
    pub non2xx: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// CPU time the proxy (with its child processes) used over the measured run.
    pub proxy_cpu: Option<Duration>,
}

impl Sample {
    pub(super) fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
    }

    /// The proxy's CPU microseconds per request.
    pub(super) fn cpu_us_per_request(&self) -> Option<f64> {
        self.proxy_cpu
            .map(|c| c.as_secs_f64() * 1e6 / self.requests.max(1) as f64)
    }

    /// The share of its core the proxy kept busy.
    pub(super) fn proxy_core_share(&self) -> Option<f64> {
        self.proxy_cpu
            .map(|c| c.as_secs_f64() * 1e6 / self.duration_us as f64)
    }

    pub(super) fn parse(out: &str) -> Result<Self> {
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

/// The processes of one sample, dropped in field order: proxy, upstreams, pins, cgroup.
pub(super) struct Running {
    proxy: Option<Proc>,
    _upstream: Proc,
    pins: Option<PinDir>,
    _cgroup: Option<Cgroup>,
    /// Where the proxy reports on itself: flexinfer's admin port, smg's metrics port.
    stats: Option<SocketAddr>,
    /// Where wrk sends its requests.
    url_addr: SocketAddr,
}

impl Running {
    /// The proxy's process, if the configuration has one.
    pub(super) fn proxy(&self) -> Option<&Proc> {
        self.proxy.as_ref()
    }

    pub(super) fn url_addr(&self) -> SocketAddr {
        self.url_addr
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}{PATH}", self.url_addr)
    }
}

/// Start the processes of one run, check one request, warm up, measure, stop everything.
pub(super) fn run_one(target: Target, case: Case, tag: &str, env: &Env) -> Result<Sample> {
    let dir = env.tmp.join(tag);
    std::fs::create_dir_all(&dir)?;
    let run = start(target, case, tag, &dir, env)?;
    let body = case.body();
    preflight(run.url_addr, case, &body, target, tag, env)?;
    let script = dir.join("load.lua");
    std::fs::write(&script, wrk_script(case, &body))?;
    let url = run.url();
    if env.args.warmup > 0 {
        wrk(env, &script, &url, env.args.warmup, None)?;
    }
    let cpu_before = run.proxy.as_ref().map(Proc::cpu_time);
    let save = env.out.join(format!("{tag}-wrk.txt"));
    let text = wrk(env, &script, &url, env.args.duration, Some(&save))?;
    let mut sample = Sample::parse(&text)?;
    if let (Some(p), Some(before)) = (&run.proxy, cpu_before) {
        sample.proxy_cpu = Some(p.cpu_time().saturating_sub(before));
    }
    evidence(&run, target, tag, env)?;
    Ok(sample)
}

pub(super) fn start(
    target: Target,
    case: Case,
    tag: &str,
    dir: &Path,
    env: &Env,
) -> Result<Running> {
    let log = |what: &str| env.out.join(format!("{tag}-{what}.log"));
    let cgroup = match target {
        Target::FxDefault => Some(Cgroup::create(PREFIX)?),
        _ => None,
    };
    let pins = cgroup.as_ref().map(|_| PinDir::new(PREFIX));
    let ports: Vec<u16> = (0..UPSTREAMS).map(|_| free_port()).collect();
    let upstreams: Vec<SocketAddr> = ports.iter().map(|&p| loopback(p)).collect();
    let collector = target.trace_ratio().map(|_| free_port());
    let upstream = start_upstreams(dir, &ports, collector, cgroup.as_ref(), &log("upstreams"))?;
    for &u in &upstreams {
        wait_http_ok(u, "/health", START_TIMEOUT)?;
    }
    let port = free_port();
    let addr = loopback(port);
    let mut stats = None;
    let proxy = match target {
        Target::Direct => None,
        Target::Nginx => {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_proxy_conf(dir, port, &upstreams, case))?;
            Some(peers::nginx(dir, &conf, PROXY_CPU, None, &log("nginx"))?)
        }
        Target::Haproxy => {
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_conf(port, &upstreams, case))?;
            Some(peers::haproxy(&conf, &log("haproxy"))?)
        }
        Target::Smg => {
            let metrics = loopback(free_port());
            stats = Some(metrics);
            Some(start_smg(
                env,
                port,
                metrics,
                &upstreams,
                case,
                &log("smg"),
            )?)
        }
        Target::FxUserspace
        | Target::FxDefault
        | Target::FxTrace0
        | Target::FxTraceTenth
        | Target::FxTrace1 => {
            let admin = loopback(free_port());
            stats = Some(admin);
            let gauge = match (&cgroup, &pins) {
                (Some(cgroup), Some(pins)) => FxGauge::Default { cgroup, pins },
                _ => FxGauge::Userspace,
            };
            let extra = trace_flags(target, collector);
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let fx = FxRun {
                dir,
                case,
                upstreams: &upstreams,
                listen: (addr, admin),
                gauge,
                extra: &extra,
            };
            Some(start_fx(env, &fx, &log("proxy"))?)
        }
    };
    let url_addr = if target == Target::Direct {
        upstreams[0]
    } else {
        addr
    };
    wait_port(url_addr, START_TIMEOUT)?;
    Ok(Running {
        _cgroup: cgroup,
        pins,
        _upstream: upstream,
        proxy,
        stats,
        url_addr,
    })
}

/// The tracing rows' exporter and sampler flags (none for the other rows).
pub(super) fn trace_flags(target: Target, collector: Option<u16>) -> Vec<String> {
    let (Some(port), Some(ratio)) = (collector, target.trace_ratio()) else {
        return Vec::new();
    };
    [
        "--otlp-endpoint".to_string(),
        format!("http://{}", loopback(port)),
        "--otel-traces-sampler".into(),
        "parentbased_traceidratio".into(),
        "--otel-traces-sampler-arg".into(),
        ratio.into(),
    ]
    .into()
}

/// What one flexinfer row runs with.
struct FxRun<'a> {
    dir: &'a Path,
    case: Case,
    upstreams: &'a [SocketAddr],
    listen: (SocketAddr, SocketAddr),
    gauge: FxGauge<'a>,
    /// More `serve` flags (the tracing rows' exporter and sampler).
    extra: &'a [&'a str],
}

/// flexinfer-proxy routing one model over `upstreams` with the case's routing.
fn start_fx(env: &Env, run: &FxRun, log: &Path) -> Result<Proc> {
    let models = run.dir.join("models.yaml");
    ModelsFile::new()
        .model(
            ModelEntry::new(MODEL)
                .routing(run.case.routing())
                .endpoints(run.upstreams),
        )
        .write_to(&models)?;
    let (listen, admin) = run.listen;
    let fx = FxLaunch {
        bin: env.bin,
        models: &models,
        listen,
        admin,
        gauge: run.gauge,
        extra: run.extra,
    };
    peers::flexinfer(&fx, log)
}

/// smg with one tokio worker on [`PROXY_CPU`], its metrics on `metrics`.
fn start_smg(
    env: &Env,
    port: u16,
    metrics: SocketAddr,
    upstreams: &[SocketAddr],
    case: Case,
    log: &Path,
) -> Result<Proc> {
    let smg = env.smg.context("smg row without smg")?;
    let mut cmd = Command::new(smg);
    cmd.args(["launch", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--worker-urls")
        .args(upstreams.iter().map(|u| format!("http://{u}")))
        .args(["--policy", case.smg_policy()]);
    if matches!(case, Case::Session | Case::Sdk) {
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
    .arg(metrics.port().to_string())
    // smg has no worker-thread flag; tokio reads this (and the affinity mask alone would give
    // one worker too). The metrics file of the run shows smg_tokio_workers.
    .env("TOKIO_WORKER_THREADS", "1");
    pin_to_cpu(&mut cmd, PROXY_CPU);
    Ok(Proc::spawn("smg", cmd, log)?.graceful(Duration::from_secs(10)))
}

/// Evidence next to the numbers: the proxy's own view after the run, `ebpf status`.
pub(super) fn evidence(run: &Running, target: Target, tag: &str, env: &Env) -> Result<()> {
    if let Some(a) = run.stats {
        let path = if target == Target::Smg {
            "/metrics"
        } else {
            "/debug/routing"
        };
        if let Some(text) = peers::admin_text(a, path) {
            std::fs::write(env.out.join(format!("{tag}-after.txt")), text)?;
        }
        // The tracing rows: spans exported and dropped over the run.
        if target.trace_ratio().is_some() {
            if let Some(text) = peers::admin_text(a, "/metrics") {
                let trace: String = text
                    .lines()
                    .filter(|l| l.starts_with("flexinfer_proxy_trace_spans"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                std::fs::write(env.out.join(format!("{tag}-trace-spans.txt")), trace)?;
            }
        }
    }
    if let Some(pins) = &run.pins {
        let status = peers::ebpf_status(env.bin, pins)?;
        std::fs::write(env.out.join(format!("{tag}-ebpf-status.txt")), status)?;
    }
    Ok(())
}

/// One request through the configuration must answer 200 with the completion, then a few
/// sessions show which upstreams it spreads over (written to `<tag>-preflight.txt`).
pub(super) fn preflight(
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

/// The three static upstreams: one nginx, one worker, three ports, on [`LOAD_CPU`].
fn start_upstreams(
    dir: &Path,
    ports: &[u16],
    collector: Option<u16>,
    cgroup: Option<&Cgroup>,
    log: &Path,
) -> Result<Proc> {
    let up = dir.join("upstreams");
    std::fs::create_dir_all(&up)?;
    let conf = up.join("nginx.conf");
    std::fs::write(&conf, upstream_conf(&up, ports, collector))?;
    peers::nginx(&up, &conf, LOAD_CPU, cgroup, log)
}

pub(super) fn wrk(
    env: &Env,
    script: &Path,
    url: &str,
    secs: u32,
    save: Option<&Path>,
) -> Result<String> {
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
