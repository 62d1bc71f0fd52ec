//! `cargo xtask bench proxy`: what flexinfer-proxy costs per request on loopback, measured
//! against the backend alone, nginx and haproxy in the same run.
//!
//! The backend is `flexinfer-proxy sim` with every delay at zero and one output token, so the
//! proxy's own work dominates. wrk (one thread, fixed connections, a ~1.5 KB chat body with a
//! system prompt) runs on CPU 0; the proxy under test and the backend share CPU 1. Each
//! configuration gets fresh processes, a warm-up, then a measured run; the configurations are
//! interleaved round by round so drift hits every row alike. Median and min..max of the rounds
//! are printed as a markdown table; raw wrk output and process logs go to
//! `<target>/bench-proxy/<unix time>/`.
//!
//! eBPF rows (root only) run the proxy and the backend in a child cgroup of the cgroup2 root
//! that the harness creates, with their own pin directory; both are removed afterwards, also
//! on error. Only loopback addresses are used.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

use crate::ebpf::{self, BuildEbpf};

#[derive(clap::Args)]
pub struct ProxyBench {
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Warm-up seconds before each measured run (not recorded).
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// Concurrent connections wrk keeps open.
    #[arg(long, default_value_t = 32)]
    pub connections: u32,
    /// Rounds (each configuration once per round).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Only these configurations (names as in the table's first column); default all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
}

/// CPU of the load generator; everything measured shares the other one.
const LOAD_CPU: &str = "0";
const SERVER_CPU: &str = "1";
const MODEL: &str = "sim-model";
const PATH: &str = "/v1/chat/completions";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Direct,
    Nginx { keepalive: bool },
    Haproxy,
    Flexinfer(Flex),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Flex {
    routing: &'static str,
    keepalive: bool,
    ebpf: bool,
}

struct Config {
    name: &'static str,
    what: &'static str,
    kind: Kind,
}

fn configs() -> Vec<Config> {
    let flex = |routing, keepalive, ebpf| {
        Kind::Flexinfer(Flex {
            routing,
            keepalive,
            ebpf,
        })
    };
    vec![
        Config {
            name: "direct",
            what: "wrk -> sim (no proxy)",
            kind: Kind::Direct,
        },
        Config {
            name: "nginx",
            what: "nginx 1 worker, upstream keepalive pool",
            kind: Kind::Nginx { keepalive: true },
        },
        Config {
            name: "nginx-close",
            what: "nginx 1 worker, new upstream connection per request",
            kind: Kind::Nginx { keepalive: false },
        },
        Config {
            name: "haproxy",
            what: "haproxy nbthread 1, http mode, keep-alive",
            kind: Kind::Haproxy,
        },
        Config {
            name: "fx-prefix",
            what: "flexinfer 1 thread, prefix, userspace gauge, keep-alive",
            kind: flex("prefix", true, false),
        },
        Config {
            name: "fx-ll",
            what: "flexinfer 1 thread, least-loaded, userspace gauge, keep-alive",
            kind: flex("least-loaded", true, false),
        },
        Config {
            name: "fx-ll-close",
            what: "flexinfer 1 thread, least-loaded, userspace gauge, keep-alive off",
            kind: flex("least-loaded", false, false),
        },
        Config {
            name: "fx-ebpf",
            what: "flexinfer 1 thread, least-loaded, eBPF gauge (keep-alive off)",
            kind: flex("least-loaded", false, true),
        },
    ]
}

/// One wrk run's numbers (from the Lua `done` hook).
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    requests: u64,
    duration_us: u64,
    errors: u64,
    non2xx: u64,
    p50_us: u64,
    p99_us: u64,
}

impl Sample {
    fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
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

pub fn run(args: &ProxyBench) -> Result<()> {
    for tool in ["wrk", "nginx", "haproxy", "taskset"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            bail!("`{tool}` not found (Debian: apt-get install wrk nginx haproxy util-linux)");
        }
    }
    let root = is_root();
    if !args.no_build {
        if root {
            ebpf::build(&BuildEbpf { release: true })?;
        }
        let status = Command::new("cargo")
            .current_dir(ebpf::workspace_root())
            .args(["build", "--release", "-p", "routing-userspace"])
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("cargo build --release -p routing-userspace failed ({status})");
        }
    }
    let bin = ebpf::target_dir().join("release").join("flexinfer-proxy");
    if !bin.exists() {
        bail!("{} not found", bin.display());
    }

    if root {
        remove_stale(&bin);
    }

    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let out_dir = ebpf::target_dir()
        .join("bench-proxy")
        .join(stamp.to_string());
    std::fs::create_dir_all(&out_dir)?;
    let tmp = TempDir::new(&format!("flexinfer-bench-{}", std::process::id()))?;
    let body = chat_body();
    let script = tmp.path.join("chat.lua");
    std::fs::write(&script, wrk_script(&body))?;
    std::fs::write(out_dir.join("body.json"), &body)?;

    let mut selected: Vec<Config> = configs()
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|o| o == c.name))
        .collect();
    if !root {
        selected.retain(|c| {
            let ebpf = matches!(c.kind, Kind::Flexinfer(f) if f.ebpf);
            if ebpf {
                eprintln!("bench proxy: skipping {}: not running as root", c.name);
            }
            !ebpf
        });
    }
    if selected.is_empty() {
        bail!("no configuration selected");
    }
    // One child cgroup for the eBPF rows, created only if one of them runs.
    let cgroup = if selected
        .iter()
        .any(|c| matches!(c.kind, Kind::Flexinfer(f) if f.ebpf))
    {
        Some(Cgroup::new()?)
    } else {
        None
    };

    println!(
        "bench proxy: body {} bytes, {} connections, {}s warm-up + {}s measured, {} rounds; raw output in {}",
        body.len(),
        args.connections,
        args.warmup,
        args.duration,
        args.runs,
        out_dir.display()
    );
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); selected.len()];
    for round in 1..=args.runs {
        for (i, cfg) in selected.iter().enumerate() {
            let tag = format!("{}-r{round}", cfg.name);
            let s = run_one(
                cfg,
                &Env {
                    bin: &bin,
                    tmp: &tmp.path,
                    out: &out_dir,
                    script: &script,
                    body: &body,
                    cgroup: cgroup.as_ref(),
                    args,
                    tag: &tag,
                },
            )
            .with_context(|| format!("configuration {} (round {round})", cfg.name))?;
            println!(
                "  {:<18} round {round}: {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  errors {} non-2xx {}",
                cfg.name,
                s.rps(),
                s.p50_us as f64 / 1e3,
                s.p99_us as f64 / 1e3,
                s.errors,
                s.non2xx
            );
            samples[i].push(s);
        }
    }

    let table = render_table(&selected, &samples);
    std::fs::write(out_dir.join("table.md"), &table)?;
    println!("\n{table}");
    Ok(())
}

struct Env<'a> {
    bin: &'a Path,
    tmp: &'a Path,
    out: &'a Path,
    script: &'a Path,
    body: &'a str,
    cgroup: Option<&'a Cgroup>,
    args: &'a ProxyBench,
    tag: &'a str,
}

/// Start the processes of one configuration, warm up, measure, stop everything.
fn run_one(cfg: &Config, env: &Env) -> Result<Sample> {
    let ebpf_flex = match cfg.kind {
        Kind::Flexinfer(f) if f.ebpf => Some(f),
        _ => None,
    };
    // The backend joins the eBPF cgroup too, as on a node with the cgroup2 root attached.
    let sim_cgroup = ebpf_flex.and(env.cgroup);
    let sim_port = free_port()?;
    let _sim = Proc::spawn(
        "sim",
        env.bin,
        &[
            "sim",
            "--listen",
            &format!("127.0.0.1:{sim_port}"),
            "--ttft-base-ms",
            "0",
            "--prefill-us-per-token",
            "0",
            "--cached-prefill-us-per-token",
            "0",
            "--inter-token-ms",
            "0",
            "--default-max-tokens",
            "1",
            "--max-concurrency",
            "1024",
            "--drain-timeout-ms",
            "100",
        ],
        sim_cgroup,
        &env.out.join(format!("{}-sim.log", env.tag)),
    )?;
    wait_port(sim_port)?;

    let mut pins: Option<Pins> = None;
    let (port, _proxy) = match cfg.kind {
        Kind::Direct => (sim_port, None),
        Kind::Nginx { keepalive } => {
            let port = free_port()?;
            let dir = env.tmp.join(env.tag);
            std::fs::create_dir_all(&dir)?;
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&dir, port, sim_port, keepalive))?;
            let p = Proc::spawn(
                "nginx",
                Path::new("nginx"),
                &[
                    "-p",
                    &dir.display().to_string(),
                    "-c",
                    &conf.display().to_string(),
                    "-e",
                    &dir.join("error.log").display().to_string(),
                ],
                None,
                &env.out.join(format!("{}-nginx.log", env.tag)),
            )?;
            (port, Some(p))
        }
        Kind::Haproxy => {
            let port = free_port()?;
            let dir = env.tmp.join(env.tag);
            std::fs::create_dir_all(&dir)?;
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_conf(port, sim_port))?;
            let p = Proc::spawn(
                "haproxy",
                Path::new("haproxy"),
                &["-db", "-f", &conf.display().to_string()],
                None,
                &env.out.join(format!("{}-haproxy.log", env.tag)),
            )?;
            (port, Some(p))
        }
        Kind::Flexinfer(f) => {
            let port = free_port()?;
            let admin = free_port()?;
            let models = env.tmp.join(format!("{}-models.yaml", env.tag));
            std::fs::write(
                &models,
                format!(
                    "models:\n  - name: {MODEL}\n    routing: {}\n    service: http://127.0.0.1:{sim_port}\n    endpoints: [127.0.0.1:{sim_port}]\n",
                    f.routing
                ),
            )?;
            let mut a: Vec<String> = [
                "serve",
                "--config",
                &models.display().to_string(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--worker-threads",
                "1",
                "--drain-timeout",
                "1s",
                "--upstream-keepalive",
                if f.keepalive { "on" } else { "off" },
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if f.ebpf {
                let cg = env.cgroup.context("eBPF row without a cgroup")?;
                let p = Pins {
                    bin: env.bin.to_path_buf(),
                    dir: PathBuf::from(format!(
                        "/sys/fs/bpf/flexinfer-bench-{}-{}",
                        std::process::id(),
                        env.tag
                    )),
                };
                a.extend([
                    "--gauge".into(),
                    "ebpf".into(),
                    "--require-ebpf".into(),
                    "--cgroup-path".into(),
                    cg.path.display().to_string(),
                    "--bpf-pin-dir".into(),
                    p.dir.display().to_string(),
                ]);
                pins = Some(p);
            } else {
                a.extend(["--gauge".into(), "userspace".into()]);
            }
            let refs: Vec<&str> = a.iter().map(String::as_str).collect();
            let p = Proc::spawn(
                "flexinfer-proxy",
                env.bin,
                &refs,
                ebpf_flex.and(env.cgroup),
                &env.out.join(format!("{}-proxy.log", env.tag)),
            )?;
            wait_http(admin, "/readyz")?;
            if f.ebpf {
                let metrics = http_get(admin, "/metrics")?;
                if !metrics.contains("flexinfer_proxy_ebpf_enabled 1") {
                    bail!("the proxy did not report flexinfer_proxy_ebpf_enabled 1");
                }
            }
            (port, Some(p))
        }
    };
    wait_port(port)?;
    // Every row must answer the body with a 200 before it is measured.
    let status = http_post(port, env.body)?;
    if status != 200 {
        bail!("pre-flight POST through {} answered {status}", cfg.name);
    }

    let url = format!("http://127.0.0.1:{port}{PATH}");
    wrk(env, &url, env.args.warmup, None)?;
    let out = wrk(
        env,
        &url,
        env.args.duration,
        Some(&env.out.join(format!("{}-wrk.txt", env.tag))),
    )?;
    let sample = Sample::parse(&out)?;

    if let Some(p) = &pins {
        // Evidence for the table: the pinned set's view.
        let status = Command::new(env.bin)
            .args(["ebpf", "status", "--bpf-pin-dir"])
            .arg(&p.dir)
            .output()?;
        std::fs::write(
            env.out.join(format!("{}-ebpf-status.txt", env.tag)),
            &status.stdout,
        )?;
    }
    Ok(sample)
    // Drop order: proxy (declared last) stops first, then pins are detached, then the sim.
}

fn wrk(env: &Env, url: &str, secs: u32, save: Option<&Path>) -> Result<String> {
    let out = Command::new("taskset")
        .args(["-c", LOAD_CPU, "wrk", "-t1"])
        .arg(format!("-c{}", env.args.connections))
        .arg(format!("-d{secs}s"))
        .args(["--timeout", "5s", "-s"])
        .arg(env.script)
        .arg(url)
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

fn render_table(cfgs: &[Config], samples: &[Vec<Sample>]) -> String {
    let direct_rps = cfgs
        .iter()
        .position(|c| c.kind == Kind::Direct)
        .map(|i| median(samples[i].iter().map(Sample::rps).collect()));
    let mut t = String::new();
    t.push_str("| row | what | req/s median [min, max] | p50 ms median [min, max] | p99 ms median [min, max] | CPU-1 us/req over direct | errors + non-2xx |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for (c, s) in cfgs.iter().zip(samples) {
        let rps: Vec<f64> = s.iter().map(Sample::rps).collect();
        let p50: Vec<f64> = s.iter().map(|x| x.p50_us as f64 / 1e3).collect();
        let p99: Vec<f64> = s.iter().map(|x| x.p99_us as f64 / 1e3).collect();
        let (rl, rh) = spread(&rps);
        let (p50l, p50h) = spread(&p50);
        let (p99l, p99h) = spread(&p99);
        let m = median(rps.clone());
        let over = match (direct_rps, c.kind) {
            (_, Kind::Direct) | (None, _) => "-".to_string(),
            (Some(d), _) => format!("{:.1}", (1.0 / m - 1.0 / d) * 1e6),
        };
        let bad: u64 = s.iter().map(|x| x.errors + x.non2xx).sum();
        let _ = writeln!(
            t,
            "| `{}` | {} | {:.0} [{:.0}, {:.0}] | {:.3} [{:.3}, {:.3}] | {:.3} [{:.3}, {:.3}] | {} | {} |",
            c.name,
            c.what,
            m,
            rl,
            rh,
            median(p50.clone()),
            p50l,
            p50h,
            median(p99.clone()),
            p99l,
            p99h,
            over,
            bad
        );
    }
    t
}

/// A chat request of about 1.5 KB: a system prompt, one user turn, one output token.
fn chat_body() -> String {
    let system = "You are a support assistant for Northwind Logistics. Answer questions about \
        shipments, customs paperwork, delivery windows and billing. Be concise and factual; \
        when you are unsure, say so and point the customer to the right form or team. Never \
        invent tracking numbers, prices or dates. Company policy: standard parcels ship within \
        two business days; express parcels ship the same day when ordered before 14:00 local \
        time; freight bookings need a confirmed pallet count and a loading-dock time window. \
        Customs: commercial invoices must list the HS code, the country of origin and the value \
        of each line item; shipments above the de-minimis value need an EORI number. Billing: \
        invoices are issued monthly, payment terms are thirty days, disputes must be raised \
        within sixty days of the invoice date. Tone: polite, plain language, no marketing. \
        Format answers as short paragraphs; use a numbered list only for step-by-step \
        instructions. If the customer writes in another language, answer in that language.";
    let user = "Hello, my express parcel was ordered at 13:40 yesterday but the tracking page \
        still says label created. Order reference NW-48213. Can you tell me when it will ship \
        and whether I can still change the delivery address to our second warehouse?";
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}],"max_tokens":1,"temperature":0.2,"stream":false}}"#
    )
}

fn wrk_script(body: &str) -> String {
    format!(
        r#"wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d duration_us=%d errors=%d non2xx=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

fn nginx_conf(dir: &Path, port: u16, sim: u16, keepalive: bool) -> String {
    let d = dir.display();
    let (pool, conn) = if keepalive {
        ("keepalive 64;", "proxy_set_header Connection \"\";")
    } else {
        ("", "")
    };
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
    upstream sim {{
        server 127.0.0.1:{sim};
        {pool}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            {conn}
        }}
    }}
}}
"#
    )
}

fn haproxy_conf(port: u16, sim: u16) -> String {
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
    server sim 127.0.0.1:{sim}
"#
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_port(port: u16) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on 127.0.0.1:{port} after 20s")
}

fn wait_http(port: u16, path: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok((200, _)) = http(port, "GET", path, "") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("GET 127.0.0.1:{port}{path} did not answer 200 within 20s")
}

fn http_get(port: u16, path: &str) -> Result<String> {
    let (status, body) = http(port, "GET", path, "")?;
    if status != 200 {
        bail!("GET {path} answered {status}");
    }
    Ok(body)
}

fn http_post(port: u16, body: &str) -> Result<u16> {
    Ok(http(port, "POST", PATH, body)?.0)
}

/// A minimal HTTP/1.1 exchange (`Connection: close`) for readiness checks and pre-flights.
fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no HTTP status in {resp:?}"))?;
    Ok((status, resp))
}

/// A child process pinned to the server CPU; SIGTERM then SIGKILL on drop.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn spawn(
        name: &'static str,
        exe: &Path,
        args: &[&str],
        cgroup: Option<&Cgroup>,
        log: &Path,
    ) -> Result<Self> {
        let logf = std::fs::File::create(log)?;
        // `sh` joins the cgroup first (cgroup v2 membership is per process), then becomes
        // taskset, which becomes the program: the PID we hold is the program's.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"if [ -n "$1" ]; then echo $$ > "$1/cgroup.procs" || exit 1; fi; shift; exec taskset -c "$@""#)
            .arg("sh")
            .arg(cgroup.map(|c| c.path.display().to_string()).unwrap_or_default())
            .arg(SERVER_CPU)
            .arg(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Self { name, child })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "bench proxy: {} ({pid}) ignored SIGTERM; killing",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pin directory of the bench's own; detached and removed on drop.
struct Pins {
    bin: PathBuf,
    dir: PathBuf,
}

impl Drop for Pins {
    fn drop(&mut self) {
        if !self.dir.exists() {
            return;
        }
        match Command::new(&self.bin)
            .args(["ebpf", "detach", "--bpf-pin-dir"])
            .arg(&self.dir)
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "bench proxy: ebpf detach {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("bench proxy: ebpf detach {}: {e}", self.dir.display()),
        }
    }
}

/// A child cgroup of the cgroup2 root; removed on drop (after its processes are gone).
struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    fn new() -> Result<Self> {
        let root = cgroup2_root().context("no cgroup2 mount in /proc/self/mounts")?;
        let path = root.join(format!("flexinfer-bench-{}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.path).is_err() {
            if Instant::now() > deadline {
                eprintln!("bench proxy: could not remove {}", self.path.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Remove the cgroups and pin dirs of earlier runs whose harness process is gone (a run
/// killed by Ctrl-C never reaches its drop guards). Names carry the harness PID.
fn remove_stale(bin: &Path) {
    let dead = |name: &str| {
        name.strip_prefix("flexinfer-bench-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| {
                pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
            })
    };
    let entries = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| dead(&e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    for dir in entries(Path::new("/sys/fs/bpf")) {
        eprintln!("bench proxy: removing stale {}", dir.display());
        drop(Pins {
            bin: bin.to_path_buf(),
            dir,
        });
    }
    if let Some(root) = cgroup2_root() {
        for cg in entries(&root) {
            eprintln!("bench proxy: removing stale {}", cg.display());
            if let Err(e) = std::fs::remove_dir(&cg) {
                eprintln!("bench proxy: {}: {e}", cg.display());
            }
        }
    }
}

fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
}

struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(name: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(Self { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
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
    }

    #[test]
    fn body_is_realistic_and_quoted_safely() {
        let b = chat_body();
        assert!((1000..=2048).contains(&b.len()), "{}", b.len());
        assert!(!b.contains("]==]"));
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
