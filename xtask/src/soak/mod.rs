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
//!
//! The files: `workload` (bodies, randomness), `clients` (the client loop and how an answer is
//! judged), `churn` (pods and churn events), `gauges` (reading the proxy's and pods' state),
//! `report`.

mod churn;
mod clients;
mod gauges;
mod report;
mod workload;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::os::vm_rss_kib;
use flexinfer_test_support::harness::report::{date_utc, RunDir};
use flexinfer_test_support::{
    free_port, http_request, is_root, loopback, wait_http_ok, Cgroup, PinDir, Proc,
};

use crate::ebpf;
use churn::{Churn, Fleet, PodState};
use clients::{classify, client, exchange, Record};
use gauges::{gauges, upstream_failures, Gauges};
use report::{events_text, records_csv, report, Summary};
use workload::{request_body, Rng};

#[derive(clap::Args)]
pub(crate) struct Soak {
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

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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

/// Whether the proxy runs its eBPF gauge, from `--gauge`; and the other arguments checked.
fn ebpf_mode(args: &Soak) -> Result<bool> {
    if args.clients == 0 || args.pods < MIN_PODS || args.pods > MAX_PODS {
        bail!("--clients must be positive and --pods within {MIN_PODS}..={MAX_PODS}");
    }
    Ok(match args.gauge.as_str() {
        "auto" => is_root(),
        "ebpf" if is_root() => true,
        "ebpf" => bail!("--gauge ebpf needs root"),
        "userspace" => false,
        g => bail!("--gauge {g}: use auto, ebpf or userspace"),
    })
}

pub(crate) fn run(args: &Soak) -> Result<()> {
    let ebpf_mode = ebpf_mode(args)?;
    let bin = ebpf::release_proxy(!args.no_build, ebpf_mode)?;
    if ebpf_mode {
        crate::bench::peers::remove_stale(RUN_PREFIX, "soak");
    }
    let out = RunDir::create(&ebpf::target_dir().join("soak"))?;
    let command = format!(
        "{}\n",
        flexinfer_test_support::harness::report::command_line()
    );
    out.write("command.txt", &command)?;
    // Drop order: the proxy (in `sut`), the pods (in the churn), pins, cgroup.
    let cgroup = ebpf_mode.then(|| Cgroup::create(RUN_PREFIX)).transpose()?;
    let pins = cgroup.as_ref().map(|_| PinDir::new(RUN_PREFIX));
    let (sut, fleet) = Sut::start(&bin, out.path(), args, cgroup.as_ref().zip(pins.as_ref()))?;
    preflight(sut.addr, args.seed)?;
    println!(
        "soak: {} clients for {:?} through {} ({}); {} pods per model; output in {}",
        args.clients,
        args.duration,
        sut.addr,
        sut.mode,
        args.pods,
        out.path().display()
    );
    let rss_start = vm_rss_kib(sut.proxy.pid()).unwrap_or(0);
    let (mut records, churn, wall, peak) = load(args, &sut, fleet, rss_start)?;
    let (gauges_after, settled_after) = settle(sut.admin, &bin, pins.as_ref())?;
    let rss_end = vm_rss_kib(sut.proxy.pid()).unwrap_or(0);
    records.sort_by_key(|r| r.start);
    let summary = Summary {
        upstream_failures: upstream_failures(&sut.proxy.log_text()),
        records,
        events: churn.events.clone(),
        gauges_after,
        settled_after,
        rss_kib: (rss_start, peak.max(rss_end), rss_end),
        killed_addrs: killed_addrs(&churn.fleet),
        mode: sut.mode.clone(),
    };
    let (table, pass) = report(&summary, args, wall);
    out.write("events.txt", events_text(&summary.events))?;
    out.write("records.csv", records_csv(&summary.records))?;
    let full = format!("command: {command}date: {}\n\n{table}", date_utc());
    out.write("report.md", &full)?;
    println!("\n{full}");
    drop(sut);
    drop(churn);
    if !pass {
        bail!("soak targets missed (report in {})", out.path().display());
    }
    Ok(())
}

/// The system under test: the proxy in front of the fleet.
struct Sut {
    proxy: Proc,
    addr: SocketAddr,
    admin: SocketAddr,
    mode: String,
}

impl Sut {
    /// The initial pods (returned, for the churn), the models file, and the proxy with file
    /// discovery over it.
    fn start(
        bin: &Path,
        out: &Path,
        args: &Soak,
        ebpf: Option<(&Cgroup, &PinDir)>,
    ) -> Result<(Self, Fleet)> {
        let (admin, addr) = (loopback(free_port()), loopback(free_port()));
        let mut fleet = Fleet {
            pods: Vec::new(),
            next: 0,
            bin: bin.to_path_buf(),
            out: out.to_path_buf(),
            models_file: out.join("models.yaml"),
            admin,
        };
        for m in 0..MODELS.len() {
            for _ in 0..args.pods {
                fleet.start_pod(m)?;
            }
        }
        fleet.write()?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--config")
            .arg(&fleet.models_file)
            .args(["--discovery", "file", "--config-poll", "100ms"])
            .args(["--listen", &addr.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .args(["--drain-timeout", "2s"]);
        if let Some((cg, pins)) = ebpf {
            cmd.arg("--cgroup-path")
                .arg(cg.path())
                .arg("--bpf-pin-dir")
                .arg(pins.path());
            cg.spawn_inside(&mut cmd);
        } else {
            cmd.args(["--gauge", "userspace"]);
        }
        let proxy = Proc::spawn("flexinfer-proxy", cmd, &out.join("proxy.log"))?
            .graceful(Duration::from_secs(5));
        wait_http_ok(admin, "/readyz", START_TIMEOUT).with_context(|| proxy.log_text())?;
        let metrics = http_request(admin, "GET", "/metrics", &[], b"")?.text();
        let ebpf_on = metrics.contains("flexinfer_proxy_ebpf_enabled 1");
        if ebpf.is_some() && !ebpf_on {
            bail!(
                "the proxy did not load its eBPF gauge:\n{}",
                proxy.log_text()
            );
        }
        let mode = if ebpf_on {
            "eBPF gauge (child cgroup, own pin dir)"
        } else {
            "--gauge userspace"
        };
        let mode = mode.to_owned();
        Ok((
            Self {
                proxy,
                addr,
                admin,
                mode,
            },
            fleet,
        ))
    }
}

/// One request per model must work before the load starts.
fn preflight(proxy: SocketAddr, seed: u64) -> Result<()> {
    let mut rng = Rng::new(seed);
    for (m, (name, _)) in MODELS.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (o, _) = classify(false, exchange(proxy, &request_body(&mut rng, m, false)));
            if o.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("pre-flight request for {} failed: {}", name, o.cause());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// The clients and the churn until `--duration` is over, with the proxy's RSS sampled: the
/// records, the churn (with the fleet and its events), the wall time and the peak RSS in KiB.
fn load(
    args: &Soak,
    sut: &Sut,
    fleet: Fleet,
    rss_start: u64,
) -> Result<(Vec<Record>, Churn, Duration, u64)> {
    let t0 = Instant::now();
    let deadline = t0 + args.duration;
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(rss_start));
    let pid = sut.proxy.pid();
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
        let rng = Rng::new(args.seed.wrapping_mul(31).wrapping_add(7));
        let churn = Churn {
            fleet,
            rng,
            t0,
            events: Vec::new(),
        };
        let every = args.churn_every;
        std::thread::spawn(move || churn.run(every, deadline, &stop))
    };
    let proxy = sut.addr;
    let clients: Vec<_> = (0..args.clients)
        .map(|id| {
            let seed = args.seed;
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || client(id, proxy, seed, t0, deadline))
        })
        .collect::<std::io::Result<_>>()?;
    let mut records = Vec::new();
    for c in clients {
        let got = c
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        records.extend(got);
    }
    let wall = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let churn = churn
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))?
        .context("churn")?;
    let _ = sampler.join();
    Ok((records, churn, wall, peak.load(Ordering::Relaxed)))
}

/// Reservations expire after their TTL (10 s by default): give the gauges 20 s to read 0.
/// The last reading, and how long after the load it read all zero.
fn settle(
    admin: SocketAddr,
    bin: &Path,
    pins: Option<&PinDir>,
) -> Result<(Gauges, Option<Duration>)> {
    let idle_at = Instant::now();
    let mut last = Gauges::default();
    while idle_at.elapsed() < Duration::from_secs(20) {
        last = gauges(admin, bin, pins)?;
        if last.zero() {
            return Ok((last, Some(idle_at.elapsed())));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok((last, None))
}

fn killed_addrs(fleet: &Fleet) -> Vec<String> {
    fleet
        .pods
        .iter()
        .filter(|p| p.state == PodState::Killed)
        .map(|p| p.addr.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("2h").is_err() && parse_duration("x").is_err());
    }
}
