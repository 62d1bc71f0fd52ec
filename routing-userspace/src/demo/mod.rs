//! `flexinfer-proxy demo`: the spec's Chat-with-Doc scenario on this machine, end to end.
//!
//! It starts simulated replicas (this binary's `sim`), a per-connection round-robin balancer
//! standing in for the Kubernetes Service, and a real proxy process whose models file has the
//! same replicas three times: `chat-default` (default routing: the Service), `chat-prefix`
//! (`routing: prefix`) and `chat-cache-aware` (`routing: cache-aware`). Each strategy runs the
//! spec's three phases and a hot-prompt phase (one shared system prompt, many users, more
//! requests in flight) on freshly started replicas (cold caches), and a table compares them.
//! Nothing here is mocked: every request crosses real sockets through the proxy.

mod balancer;
pub mod scenario;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use scenario::{documents, hot_system_prompt, run_phase, Phase, PhaseReport};

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Simulated replicas.
    #[arg(long, default_value_t = 4)]
    pub replicas: usize,
    /// Requests per phase.
    #[arg(long, default_value_t = 60)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Requests in flight at once in the hot-prompt phase.
    #[arg(long, default_value_t = 16)]
    pub hot_concurrency: usize,
    /// Words of the hot-prompt phase's shared system prompt (about one token each).
    #[arg(long, default_value_t = 1000)]
    pub hot_prompt_words: usize,
    /// Tenant documents (explicit keys tenant-a/doc-1..N).
    #[arg(long, default_value_t = 12)]
    pub documents: usize,
    /// Words per document (about one token each).
    #[arg(long, default_value_t = 1000)]
    pub document_words: usize,
    /// Prefix-cache capacity of each replica, in 16-token blocks (320 holds about 5 documents).
    #[arg(long, default_value_t = 320)]
    pub cache_blocks: usize,
    /// Prefill cost of an uncached prompt token on a replica, in microseconds.
    #[arg(long, default_value_t = 400)]
    pub prefill_us_per_token: u64,
    /// Keep the scratch directory (models file, logs) instead of deleting it.
    #[arg(long)]
    pub keep: bool,
}

/// A child process killed when dropped.
struct Kid {
    child: Child,
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn spawn(args: &[String], log: &Path) -> anyhow::Result<Kid> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "info,routing_userspace=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()
        .context("starting a child process")?;
    Ok(Kid { child })
}

async fn wait_ready(addr: SocketAddr, path: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            if s.write_all(req.as_bytes()).await.is_ok() {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf).await;
                if buf.starts_with(b"HTTP/1.1 200") {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("{addr}{path} did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_replicas(
    args: &DemoArgs,
    addrs: &[SocketAddr],
    dir: &Path,
) -> anyhow::Result<Vec<Kid>> {
    let mut kids = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let a = vec![
            "sim".to_string(),
            "--listen".into(),
            addr.to_string(),
            "--name".into(),
            format!("pod-{i}"),
            "--cache-blocks".into(),
            args.cache_blocks.to_string(),
            "--prefill-us-per-token".into(),
            args.prefill_us_per_token.to_string(),
            "--inter-token-ms".into(),
            "1".into(),
        ];
        kids.push(spawn(&a, &dir.join(format!("sim-{i}.log")))?);
    }
    for addr in addrs {
        wait_ready(*addr, "/health").await?;
    }
    Ok(kids)
}

/// The demo's strategies: the row label and the model that runs it.
const STRATEGIES: [(&str, &str); 3] = [
    ("default", "chat-default"),
    ("prefix", "chat-prefix"),
    ("cache-aware", "chat-cache-aware"),
];

fn models_yaml(service: SocketAddr, pods: &[SocketAddr]) -> String {
    let eps: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
    format!(
        "models:\n  - name: chat-default\n    service: http://{service}\n    endpoints: [{eps}]\n  - name: chat-prefix\n    routing: prefix\n    service: http://{service}\n    endpoints: [{eps}]\n  - name: chat-cache-aware\n    routing: cache-aware\n    service: http://{service}\n    endpoints: [{eps}]\n",
        eps = eps.join(", ")
    )
}

fn row(strategy: &str, r: &PhaseReport) -> String {
    let pods: Vec<String> = r.pods().iter().map(|(p, n)| format!("{p}:{n}")).collect();
    format!(
        "{strategy:<11} {:<18} {:>3}/{:<3} {:>7.3}s {:>7.3}s {:>8.1}%   {}",
        r.phase.name(),
        r.ok(),
        r.samples.len(),
        r.quantile(0.50).as_secs_f64(),
        r.quantile(0.95).as_secs_f64(),
        r.cache_hit_share() * 100.0,
        pods.join(" ")
    )
}

/// Sum of a counter's samples whose line contains every `label="value"` pair.
fn counter_sum(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

async fn fetch_metrics(admin: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(admin).await else {
        return String::new();
    };
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.replicas == 0 || args.requests == 0 || args.documents == 0 {
        bail!("--replicas, --requests and --documents must be positive");
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("flexinfer-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&args, &dir).await;
    if args.keep {
        println!("\nscratch directory kept: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The proxy under demonstration, in front of `pods` with `service` as the Service fallback:
/// its process, its listener and its admin address.
async fn start_proxy(
    dir: &Path,
    service: SocketAddr,
    pods: &[SocketAddr],
) -> anyhow::Result<(Kid, SocketAddr, SocketAddr)> {
    let config = dir.join("models.yaml");
    std::fs::write(&config, models_yaml(service, pods))?;
    let (listen, admin) = (free_addr()?, free_addr()?);
    let proxy = spawn(
        &[
            "serve".to_string(),
            "--listen".into(),
            listen.to_string(),
            "--admin-listen".into(),
            admin.to_string(),
            "--config".into(),
            config.display().to_string(),
            "--gauge".into(),
            "userspace".into(),
        ],
        &dir.join("proxy.log"),
    )?;
    wait_ready(admin, "/readyz")
        .await
        .context("the proxy did not start (see proxy.log)")?;
    Ok((proxy, listen, admin))
}

/// What the demo is about to show, and the table's header.
fn print_header(args: &DemoArgs, listen: SocketAddr) {
    println!(
        "flexinfer-proxy demo: Chat-with-Doc through a real proxy ({listen}) to {} simulated replicas",
        args.replicas
    );
    println!(
        "{} documents of ~{} tokens, {} requests per phase, {} in flight; each replica caches ~{} documents",
        args.documents,
        args.document_words,
        args.requests,
        args.concurrency,
        (args.cache_blocks * 16) / (args.document_words + 40).max(1)
    );
    println!(
        "hot-prompt: one ~{}-token system prompt, a different user per request, {} in flight",
        args.hot_prompt_words, args.hot_concurrency
    );
    println!("default = Kubernetes Service round-robin baseline; prefix = flexinfer.ai/routing: prefix; cache-aware = flexinfer.ai/routing: cache-aware\n");
    println!(
        "{:<11} {:<18} {:>7} {:>8} {:>8} {:>9}   pods served",
        "routing", "phase", "ok", "p50", "p95", "cache-hit"
    );
}

/// Every phase through every strategy's model, each strategy on fresh replicas (cold caches)
/// at the same addresses; one table row per phase. Returns the requests that failed.
async fn run_strategies(
    args: &DemoArgs,
    pods: &[SocketAddr],
    dir: &Path,
    listen: SocketAddr,
) -> anyhow::Result<usize> {
    let docs = documents(args.documents, args.document_words);
    let hot_system = hot_system_prompt(args.hot_prompt_words);
    let mut failed = 0;
    for (strategy, model) in STRATEGIES {
        let replicas = start_replicas(args, pods, dir).await?;
        for phase in Phase::ALL.into_iter().chain([Phase::HotPrompt]) {
            let concurrency = if phase == Phase::HotPrompt {
                args.hot_concurrency
            } else {
                args.concurrency
            };
            let report = run_phase(
                listen,
                model,
                phase,
                &docs,
                &hot_system,
                args.requests,
                concurrency,
            )
            .await;
            failed += report.samples.len() - report.ok();
            println!("{}", row(strategy, &report));
        }
        drop(replicas);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(failed)
}

/// What the proxy's own metrics say: key sources, spills, fallbacks, cardinality overflow.
fn print_proxy_metrics(m: &str) {
    let by_source = |model: &str, source: &str| {
        counter_sum(
            m,
            "flexinfer_proxy_routing_decisions_total",
            &[("model", model), ("key_source", source)],
        )
    };
    println!(
        "\nproxy metrics for chat-prefix (flexinfer_proxy_routing_decisions_total by key_source):"
    );
    for source in [
        "explicit-header",
        "canonical",
        "session-header",
        "implicit-session",
        "none",
    ] {
        let n = by_source("chat-prefix", source);
        if n > 0.0 {
            println!("  {source:<18} {n}");
        }
    }
    for model in ["chat-prefix", "chat-cache-aware"] {
        let spills = counter_sum(
            m,
            "flexinfer_proxy_routing_spills_total",
            &[("model", model)],
        );
        println!("  {model}: spills past a pod at the load bound: {spills}");
    }
    let fallback = counter_sum(
        m,
        "flexinfer_proxy_routing_decisions_total",
        &[("model", "chat-prefix"), ("outcome", "service-fallback")],
    );
    println!("  service-fallback   {fallback}");
    let overflow = counter_sum(
        m,
        "flexinfer_proxy_routing_key_cardinality_overflow_total",
        &[("model", "chat-prefix")],
    );
    println!("  cardinality overflow {overflow}");
}

async fn run_in(args: &DemoArgs, dir: &Path) -> anyhow::Result<()> {
    let pods: Vec<SocketAddr> = (0..args.replicas)
        .map(|_| free_addr())
        .collect::<Result<_, _>>()?;
    let service_listener = TcpListener::bind("127.0.0.1:0").await?;
    let service = service_listener.local_addr()?;
    tokio::spawn(balancer::run(service_listener, pods.clone()));
    let (_proxy, listen, admin) = start_proxy(dir, service, &pods).await?;
    print_header(args, listen);
    let failed = run_strategies(args, &pods, dir, listen).await?;
    print_proxy_metrics(&fetch_metrics(admin).await);
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(())
}
