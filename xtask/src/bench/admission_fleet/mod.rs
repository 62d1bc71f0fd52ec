//! `cargo xtask bench admission-fleet`: what tenant fairness buys a light tenant next to a
//! heavy one when the fleet is full (issue 18's targets).
//!
//! Two pods of one model with `maxConcurrency: 2`, each a holding upstream
//! (`flexinfer_test_support::holding`) that takes the service time (0.5 s) per request and
//! counts the most requests it ever held. Tenant A keeps 40 requests in flight (ten times the
//! four slots, so the model's queue never empties); tenant B sends one request every 200 ms for
//! 30 s. Four scenarios: `tenants` (each sends its own `x-flexinfer-tenant`, so they take
//! turns), `shared` (neither does: one tenant, arrival order: what B would wait without
//! fairness), `priority` (own tenants, and B sends `x-flexinfer-priority: 1`) and `weighted`
//! (own tenants, and the model gives B `queue.tenantWeights: {tenant-b: --b-weight}`). Equal
//! turns give B at most half the slots; whether that covers its rate decides its wait: with
//! the defaults B offers 5 of the 8 requests a second the pods serve, more than its half; at
//! weight 2 its share is two thirds (5.3 a second). Reported: B's wait (latency minus service time) p50 / p95 against
//! the service time, both tenants' answers by status, the most any pod held, the slowest
//! 429, the proxy's rejections by reason. Raw records:
//! `<target>/bench-admission-fleet/<unix time>/`.

mod load;
mod summary;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::report::{date_utc, RunDir};
use flexinfer_test_support::holding::{Hold, HoldingUpstream};
use flexinfer_test_support::{
    free_port, http_request, loopback, ModelEntry, ModelsFile, QueueEntry,
};

use crate::bench::peers::{self, FxGauge, FxLaunch};
use crate::ebpf;
use load::{Clients, Record, Tenant};
use summary::{Figures, TenantFigures};

#[derive(clap::Args)]
pub(crate) struct AdmissionFleetBench {
    /// Seconds tenant B sends for.
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// The backend's service time per request, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub service_ms: u64,
    /// Requests tenant A keeps in flight.
    #[arg(long, default_value_t = 40)]
    pub a_in_flight: usize,
    /// Milliseconds between two of tenant B's requests.
    #[arg(long, default_value_t = 200)]
    pub b_every_ms: u64,
    /// Tenant B's weight in the `weighted` scenario (turns per round; A has 1).
    #[arg(long, default_value_t = 2)]
    pub b_weight: u32,
    /// Scenarios, comma-separated: tenants, shared, priority, weighted. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Skip building (use the release binary already in the target directory).
    #[arg(long)]
    pub no_build: bool,
    /// Run this flexinfer-proxy binary instead of the release build (the figures are queueing
    /// times of a 0.5 s backend, which a dev build's per-request cost barely moves).
    #[arg(long)]
    pub proxy_bin: Option<std::path::PathBuf>,
}

/// Pods, and the `maxConcurrency` of each.
const PODS: usize = 2;
const MAX_CONCURRENCY: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// A and B send their own tenant ids: turns between them.
    Tenants,
    /// Neither sends one: one shared tenant, first come first served.
    Shared,
    /// Their own tenant ids, and B sends `x-flexinfer-priority: 1`: B's band is served first.
    Priority,
    /// Their own tenant ids, and B has a tenant weight: B takes that many turns to A's one.
    Weighted,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::Tenants,
        Scenario::Shared,
        Scenario::Priority,
        Scenario::Weighted,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Tenants => "tenants",
            Scenario::Shared => "shared",
            Scenario::Priority => "priority",
            Scenario::Weighted => "weighted",
        }
    }

    fn headers(self) -> (Option<&'static str>, Option<&'static str>) {
        match self {
            Scenario::Tenants | Scenario::Priority | Scenario::Weighted => {
                (Some("tenant-a"), Some("tenant-b"))
            }
            Scenario::Shared => (None, None),
        }
    }

    fn b_priority(self) -> Option<&'static str> {
        (self == Scenario::Priority).then_some("1")
    }

    /// The model's `queue:` block: B's weight in `weighted`, else none (the defaults).
    fn queue(self, b_weight: u32) -> Option<QueueEntry> {
        (self == Scenario::Weighted)
            .then(|| QueueEntry::default().tenant_weight("tenant-b", b_weight))
    }
}

fn select(names: &[String]) -> Result<Vec<Scenario>> {
    if names.is_empty() {
        return Ok(Scenario::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            Scenario::ALL
                .into_iter()
                .find(|s| s.name() == n)
                .with_context(|| {
                    format!("unknown scenario {n:?} (tenants, shared, priority, weighted)")
                })
        })
        .collect()
}

pub(crate) fn run(args: &AdmissionFleetBench) -> Result<()> {
    let scenarios = select(&args.scenarios)?;
    let bin = match &args.proxy_bin {
        Some(p) => p.clone(),
        None => ebpf::release_proxy(!args.no_build, false)?,
    };
    let out = RunDir::create(&ebpf::target_dir().join("bench-admission-fleet"))?;
    out.stamp(&peers::versions(&[], None))?;
    println!(
        "bench admission-fleet: {PODS} pods, maxConcurrency {MAX_CONCURRENCY}, service {} ms, A keeps {} in flight, B every {} ms for {} s (weight {} in weighted); raw output in {}",
        args.service_ms,
        args.a_in_flight,
        args.b_every_ms,
        args.duration,
        args.b_weight,
        out.path().display()
    );
    let mut rows = Vec::new();
    for s in scenarios {
        let f =
            run_scenario(s, args, &bin, &out).with_context(|| format!("scenario {}", s.name()))?;
        println!(
            "  {:<8} B wait p50 {:.0} ms p95 {:.0} ms; B {}; A {}; max per pod {:?}",
            s.name(),
            f.b.wait_p50 * 1000.0,
            f.b.wait_p95 * 1000.0,
            f.b.statuses(),
            f.a.statuses(),
            f.max_per_pod
        );
        rows.push(f);
    }
    let report = format!(
        "date: {}\ncommand: {}\n\n{}",
        date_utc(),
        flexinfer_test_support::harness::report::command_line(),
        summary::render(&rows)
    );
    out.write("table.md", &report)?;
    println!("\n{report}");
    Ok(())
}

/// One scenario on a fresh proxy and fresh pods.
fn run_scenario(
    s: Scenario,
    args: &AdmissionFleetBench,
    bin: &Path,
    out: &RunDir,
) -> Result<Figures> {
    let service = Duration::from_millis(args.service_ms);
    let pods: Vec<HoldingUpstream> = (0..PODS)
        .map(|i| HoldingUpstream::start(&format!("pod-{i}"), Hold::For(service)))
        .collect::<std::io::Result<_>>()?;
    let models = out.file(&format!("models-{}.yaml", s.name()));
    let mut chat = ModelEntry::new("chat")
        .engine("none")
        .max_concurrency(MAX_CONCURRENCY)
        .endpoints(pods.iter().map(|p| p.addr()));
    if let Some(q) = s.queue(args.b_weight) {
        chat = chat.queue(q);
    }
    ModelsFile::new().model(chat).write_to(&models)?;
    let (listen, admin) = (loopback(free_port()), loopback(free_port()));
    let launch = FxLaunch {
        bin,
        models: &models,
        listen,
        admin,
        gauge: FxGauge::Userspace,
        extra: &[],
    };
    let log = out.file(&format!("proxy-{}.log", s.name()));
    let proxy = peers::flexinfer(&launch, &log)?;
    let (tenant_a, tenant_b) = s.headers();
    let clients = Clients {
        proxy: listen,
        start: Instant::now(),
        tenant_a,
        tenant_b,
        priority_b: s.b_priority(),
        records: Arc::new(Mutex::new(Vec::new())),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let a = clients.keep_in_flight(args.a_in_flight);
    let slots = PODS * MAX_CONCURRENCY as usize;
    wait_queued(admin, args.a_in_flight.saturating_sub(slots))?;
    clients.steady(
        Duration::from_millis(args.b_every_ms),
        Duration::from_secs(args.duration),
    );
    clients.stop.store(true, Ordering::SeqCst);
    for t in a {
        let _ = t.join();
    }
    let metrics = http_request(admin, "GET", "/metrics", &[], b"")?.text();
    drop(proxy);
    let records = clients.take_records();
    out.write(&format!("records-{}.csv", s.name()), csv(&records))?;
    Ok(Figures {
        scenario: s.name(),
        service,
        a: TenantFigures::of(&records, Tenant::A, service),
        b: TenantFigures::of(&records, Tenant::B, service),
        max_per_pod: pods.iter().map(HoldingUpstream::max_in_flight).collect(),
        rejections: rejections(&metrics),
    })
}

/// Wait until the model's queue holds `depth` requests (A's backlog formed), at most 30 s.
fn wait_queued(admin: SocketAddr, depth: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = http_request(admin, "GET", "/debug/routing", &[], b"")?.text();
        let v: serde_json::Value = serde_json::from_str(&view).context("/debug/routing")?;
        let queued = v["admission"][0]["queued"].as_u64().unwrap_or(0) as usize;
        if queued >= depth {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("tenant A's backlog did not form: {queued} queued after 30 s, want {depth}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The non-zero `flexinfer_proxy_admission_rejections_total` series, by reason.
fn rejections(metrics: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("flexinfer_proxy_admission_rejections_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let reason = labels.split("reason=\"").nth(1)?.split('"').next()?;
            let n: f64 = value.parse().ok()?;
            (n > 0.0).then(|| (reason.to_string(), n))
        })
        .collect()
}

fn csv(records: &[Record]) -> String {
    let mut s = String::from("tenant,sent_ms,latency_ms,status\n");
    for r in records {
        let status = r.status.map_or("none".to_string(), |c| c.to_string());
        let _ = writeln!(
            s,
            "{},{},{:.1},{status}",
            r.tenant.name(),
            r.sent.as_millis(),
            r.latency.as_secs_f64() * 1000.0
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_read_by_reason_and_zeros_left_out() {
        let m = "# HELP x\n\
flexinfer_proxy_admission_rejections_total{model=\"chat\",reason=\"queue_full\"} 0\n\
flexinfer_proxy_admission_rejections_total{model=\"chat\",reason=\"queue_timeout\"} 7\n\
flexinfer_proxy_requests_total{model=\"chat\"} 3\n";
        assert_eq!(rejections(m), [("queue_timeout".to_string(), 7.0)]);
    }

    #[test]
    fn scenarios_are_picked_by_name() {
        assert_eq!(select(&[]).unwrap(), Scenario::ALL);
        assert_eq!(select(&["shared".into()]).unwrap(), [Scenario::Shared]);
        assert_eq!(select(&["weighted".into()]).unwrap(), [Scenario::Weighted]);
        assert!(Scenario::Tenants.queue(2).is_none());
        let q = Scenario::Weighted.queue(3).unwrap();
        assert_eq!(q.tenant_weights.get("tenant-b"), Some(&3));
        assert!(select(&["fifo".into()]).is_err());
    }
}
