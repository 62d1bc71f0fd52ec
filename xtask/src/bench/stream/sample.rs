//! One sample of `bench stream`: fresh upstreams (the `sse-upstream` bin, three ports) with
//! the mode's pacing, the target in front of them, a pre-flight stream, then the `sse-load`
//! bin for the mode, watching the proxy's and the upstreams' CPU and RSS around its window.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::http::{Conn, Request, Timeouts};
use flexinfer_test_support::stream::wire::{stamp_of, MODEL};
use flexinfer_test_support::{
    free_port, loopback, pin_to_cpu, wait_http_ok, wait_port, Cgroup, ModelEntry, ModelsFile,
    PinDir, Proc,
};

use super::modes::Mode;
use super::targets::{haproxy_conf, nginx_conf, Target};
use super::{Env, PREFIX};
use crate::bench::peers::{self, FxGauge, FxLaunch, LOAD_CPU, PROXY_CPU, START_TIMEOUT};

const UPSTREAMS: usize = 3;
pub(super) const PATH: &str = "/v1/chat/completions";

/// The request every stream sends.
pub(super) fn request_body() -> String {
    format!(
        r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"Tell me about parcels."}}],"max_tokens":50}}"#
    )
}

/// What `sse-load` reported (its `RESULT` line) for one (mode, target).
#[derive(Debug, Clone, Default)]
pub(super) struct Sample(pub BTreeMap<String, f64>);

impl Sample {
    pub(super) fn parse(out: &str) -> Result<Self> {
        let line = out
            .lines()
            .find(|l| l.starts_with("RESULT "))
            .with_context(|| format!("no RESULT line in the load generator's output:\n{out}"))?;
        let mut m = BTreeMap::new();
        for kv in line.split_whitespace().skip(1) {
            let (k, v) = kv.split_once('=').context("RESULT field without =")?;
            let v: f64 = v.parse().with_context(|| format!("RESULT field {kv}"))?;
            m.insert(k.to_owned(), v);
        }
        Ok(Self(m))
    }

    /// A field (NaN when missing: a direct run watches no proxy).
    pub(super) fn get(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or(f64::NAN)
    }

    pub(super) fn window_s(&self) -> f64 {
        self.get("window_us") / 1e6
    }

    pub(super) fn events_per_s(&self) -> f64 {
        self.get("events") / self.window_s()
    }

    /// The proxy's CPU microseconds per relayed event (NaN without events).
    pub(super) fn cpu_us_per_event(&self) -> f64 {
        match self.get("events") {
            e if e > 0.0 => self.get("proxy_cpu_us") / e,
            _ => f64::NAN,
        }
    }

    /// The share of a core `who` (proxy, upstream, self) used over the window.
    pub(super) fn core_share(&self, who: &str) -> f64 {
        self.get(&format!("{who}_cpu_us")) / self.get("window_us")
    }

    /// The proxy's RSS growth from idle to the end of the window, KiB per connection.
    pub(super) fn rss_kib_per_connection(&self) -> f64 {
        (self.get("proxy_rss_end_kib") - self.get("proxy_rss_idle_kib")) / self.get("connections")
    }

    /// Failures the load generator saw.
    pub(super) fn errors(&self) -> f64 {
        ["connect_errors", "bad_status", "decode_errors", "closed"]
            .iter()
            .filter_map(|k| self.0.get(*k))
            .sum()
    }
}

/// The processes of one sample, dropped in field order: proxy, upstreams, pins, cgroup.
struct Running {
    proxy: Option<Proc>,
    upstream: Proc,
    _pins: Option<PinDir>,
    _cgroup: Option<Cgroup>,
    /// Where the load generator connects.
    targets: Vec<SocketAddr>,
}

pub(super) fn run_one(mode: Mode, target: Target, tag: &str, env: &Env) -> Result<Sample> {
    // Configs and the peers' own logs stay with the raw output.
    let dir = env.out.join(tag);
    std::fs::create_dir_all(&dir)?;
    let mut run = start(mode, target, tag, &dir, env)?;
    if mode != Mode::Idle {
        preflight(run.targets[0])
            .with_context(|| format!("pre-flight stream through {}", target.name()))?;
    }
    let out = load(mode, &run, tag, env)?;
    let sample = Sample::parse(&out)?;
    if let Some(p) = run.proxy.as_mut() {
        if let Some(status) = p.exited() {
            bail!(
                "{} exited during the run ({status}):\n{}",
                p.name(),
                p.log_text()
            );
        }
    }
    Ok(sample)
}

fn start(mode: Mode, target: Target, tag: &str, dir: &Path, env: &Env) -> Result<Running> {
    let log = |what: &str| env.out.join(format!("{tag}-{what}.log"));
    let cgroup = match target {
        Target::FxDefault => Some(Cgroup::create(PREFIX)?),
        _ => None,
    };
    let pins = cgroup.as_ref().map(|_| PinDir::new(PREFIX));
    let upstreams: Vec<SocketAddr> = (0..UPSTREAMS).map(|_| loopback(free_port())).collect();
    let upstream = start_upstreams(env, mode, &upstreams, cgroup.as_ref(), &log("upstreams"))?;
    for &u in &upstreams {
        wait_http_ok(u, "/health", START_TIMEOUT).with_context(|| upstream.log_text())?;
    }
    let listen = loopback(free_port());
    let proxy = match target {
        Target::Direct => None,
        Target::Haproxy => {
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_conf(listen.port(), &upstreams))?;
            Some(peers::haproxy(&conf, &log("haproxy"))?)
        }
        Target::Nginx => {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(dir, listen.port(), &upstreams))?;
            Some(peers::nginx(dir, &conf, PROXY_CPU, None, &log("nginx"))?)
        }
        Target::FxUserspace | Target::FxDefault => {
            let gauge = match (&cgroup, &pins) {
                (Some(cgroup), Some(pins)) => FxGauge::Default { cgroup, pins },
                _ => FxGauge::Userspace,
            };
            Some(start_fx(
                env,
                dir,
                &upstreams,
                listen,
                gauge,
                &log("proxy"),
            )?)
        }
    };
    let targets = match target {
        Target::Direct => upstreams,
        _ => vec![listen],
    };
    wait_port(targets[0], START_TIMEOUT)?;
    Ok(Running {
        proxy,
        upstream,
        _pins: pins,
        _cgroup: cgroup,
        targets,
    })
}

/// The three upstreams: one `sse-upstream` process, a thread per port, on [`LOAD_CPU`].
fn start_upstreams(
    env: &Env,
    mode: Mode,
    addrs: &[SocketAddr],
    cgroup: Option<&Cgroup>,
    log: &Path,
) -> Result<Proc> {
    let (events, interval, bulk) = mode.pacing();
    let mut cmd = Command::new(&env.tools.upstream);
    for a in addrs {
        cmd.arg("--listen").arg(a.to_string());
    }
    cmd.args(["--events", &events.to_string()])
        .args(["--interval-ms", &interval.as_millis().to_string()]);
    if bulk {
        cmd.arg("--bulk");
    }
    pin_to_cpu(&mut cmd, LOAD_CPU);
    if let Some(cg) = cgroup {
        cg.spawn_inside(&mut cmd);
    }
    Ok(Proc::spawn("sse-upstream", cmd, log)?)
}

/// flexinfer-proxy routing the model least-loaded over the upstreams.
fn start_fx(
    env: &Env,
    dir: &Path,
    upstreams: &[SocketAddr],
    listen: SocketAddr,
    gauge: FxGauge,
    log: &Path,
) -> Result<Proc> {
    let models = dir.join("models.yaml");
    ModelsFile::new()
        .model(
            ModelEntry::new(MODEL)
                .routing("least-loaded")
                .endpoints(upstreams),
        )
        .write_to(&models)?;
    let fx = FxLaunch {
        bin: env.bin,
        models: &models,
        listen,
        admin: loopback(free_port()),
        gauge,
        extra: &[],
    };
    peers::flexinfer(&fx, log)
}

/// One stream through the target must answer 200 and deliver a stamped event.
fn preflight(addr: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let body = request_body();
    loop {
        let attempt = || -> Result<()> {
            let mut c = Conn::connect(addr, Timeouts::default())?;
            c.send(&Request::post(PATH, body.as_bytes()))?;
            let head = c.head()?;
            if head.status != 200 {
                let status = head.status;
                bail!("status {status}: {}", c.reply(head).text());
            }
            let mut events = c.events(&head);
            let ev = events.next_event()?.context("no event")?;
            stamp_of(ev.data.as_bytes()).context("the first event carries no stamp")?;
            Ok(())
        };
        match attempt() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Run `sse-load` for the mode on [`LOAD_CPU`]; its output (also saved as `<tag>-load.txt`).
fn load(mode: Mode, run: &Running, tag: &str, env: &Env) -> Result<String> {
    let a = env.args;
    let duration = if mode.is_scale() {
        a.scale_duration
    } else {
        a.duration
    };
    let mut cmd = Command::new(&env.tools.load);
    for t in &run.targets {
        cmd.arg("--target").arg(t.to_string());
    }
    cmd.args([
        "--connections",
        &mode
            .connections(a.idle_connections, a.paced_streams)
            .to_string(),
    ])
    .args(["--threads", &a.threads.to_string()])
    .args(["--body", &request_body()])
    .args(["--warmup-ms", &(u64::from(a.warmup) * 1000).to_string()])
    .args(["--duration-ms", &(u64::from(duration) * 1000).to_string()])
    .args(["--watch", &format!("upstream={}", run.upstream.pid())]);
    if let Some(p) = &run.proxy {
        cmd.args(["--watch", &format!("proxy={}", p.pid())]);
    }
    match mode {
        Mode::Idle => drop(cmd.arg("--idle")),
        Mode::IdleUsed => drop(cmd.arg("--idle-after-answer")),
        _ => {}
    }
    pin_to_cpu(&mut cmd, LOAD_CPU);
    let out = cmd.output().context("running sse-load")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(env.out.join(format!("{tag}-load.txt")), &text)?;
    if !out.status.success() {
        bail!("sse-load failed ({}):\n{text}", out.status);
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_result_line() {
        let s = Sample::parse(
            "noise\nRESULT connections=10 window_us=2000000 events=4000 proxy_cpu_us=8000 proxy_rss_idle_kib=1000 proxy_rss_end_kib=1500 self_cpu_us=500000 closed=1 bad_status=0 delay_p99_us=nan\n",
        )
        .unwrap();
        assert_eq!(s.events_per_s(), 2000.0);
        assert_eq!(s.cpu_us_per_event(), 2.0);
        assert_eq!(s.rss_kib_per_connection(), 50.0);
        assert_eq!(s.core_share("self"), 0.25);
        assert_eq!(s.errors(), 1.0);
        assert!(s.get("delay_p99_us").is_nan() && s.get("missing").is_nan());
        assert!(Sample::parse("no line").is_err());
        assert!(Sample::parse("RESULT x=y").is_err());
    }

    #[test]
    fn the_request_streams_the_bench_model() {
        let v: serde_json::Value = serde_json::from_str(&request_body()).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["stream"].as_bool()),
            (Some(MODEL), Some(true))
        );
    }
}
