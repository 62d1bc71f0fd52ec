//! `cargo xtask bench <group>`: named criterion runs with the exact flags docs/benchmarks.md uses,
//! and the benches that run whole processes: the proxy's per-request cost against peer proxies
//! on loopback (`bench overhead`, in `overhead/`), what relaying SSE streams costs against the
//! same peers (`bench stream`, in `stream/`), routing quality on real model servers
//! (`bench real-llm`, in `real_llm/`), and tenant fairness when the fleet is full
//! (`bench admission-fleet`, in `admission_fleet/`). How the peer proxies start is shared, in `peers`.

pub(crate) mod admission_fleet;
pub(crate) mod overhead;
pub(crate) mod peers;
pub(crate) mod real_llm;
pub(crate) mod stream;

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub(crate) struct Bench {
    #[command(subcommand)]
    pub group: Group,
}

#[derive(clap::Subcommand)]
pub(crate) enum Group {
    /// Gauge read per pod: mmapped BPF array vs map-lookup syscall vs userspace atomic.
    /// Builds the eBPF object first; needs root for the BPF rows.
    Gauge,
    /// The per-request routing cost: body view, key extraction, decision.
    Route,
    /// The per-request cost of engine signals: load-report header, usage observer per body
    /// frame, the signal store's marks and load read; and a metrics page parse.
    Signals,
    /// The admission cost when no queue forms: classify, admit and release a permit.
    Admission,
    /// What a sampled request costs in tracing: its two spans on the request path, and their
    /// share of an OTLP export batch's encoding.
    Trace,
    /// Tenant fairness when the fleet is full: two pods with maxConcurrency 2 and a 0.5 s
    /// backend, tenant A keeping 40 requests in flight, tenant B one every 200 ms; B's wait
    /// against the service time, answers by status, the most any pod held.
    /// See xtask/src/bench/admission_fleet/.
    AdmissionFleet(admission_fleet::AdmissionFleetBench),
    /// Proxy overhead on loopback: wrk against fast static upstreams directly and through
    /// nginx, haproxy, smg and flexinfer-proxy (userspace gauge, and default flags as root).
    /// Installs what it needs. Not criterion: see xtask/src/bench/overhead/.
    Overhead(overhead::OverheadBench),
    /// Routing quality on three real llama.cpp servers (xllamacpp + SmolLM2 from PyPI):
    /// chat-with-doc and hot-prompt workloads through flexinfer-proxy's routings and smg's
    /// cache_aware policy; TTFT, cached prompt tokens, requests per server, wall time.
    RealLlm(real_llm::RealLlmBench),
    /// SSE relay on loopback: fast stamped-event upstreams directly and through haproxy, nginx
    /// (proxy_buffering off) and flexinfer-proxy; events/s and CPU per event (paced, bulk),
    /// RSS per open stream and added per-event delay at 1,000 and 8,000 streams, RSS per idle
    /// connection. Installs what it needs. See xtask/src/bench/stream/.
    Stream(stream::StreamBench),
}

pub(crate) fn run(args: &Bench) -> Result<()> {
    let (package, bench) = match &args.group {
        Group::Overhead(o) => return overhead::run(o),
        Group::RealLlm(r) => return real_llm::run(r),
        Group::Stream(s) => return stream::run(s),
        Group::AdmissionFleet(a) => return admission_fleet::run(a),
        Group::Gauge => ("routing-userspace", "gauge_read"),
        Group::Route => ("routing-userspace", "route"),
        Group::Signals => ("routing-userspace", "signals"),
        Group::Admission => ("routing-userspace", "admission"),
        Group::Trace => ("routing-userspace", "trace"),
    };
    // The gauge and route benches read the embedded object, so build it first.
    if !matches!(args.group, Group::Signals | Group::Admission | Group::Trace) {
        crate::ebpf::build()?;
    }
    let status = Command::new("cargo")
        .current_dir(crate::ebpf::workspace_root())
        .args(["bench", "-p", package, "--bench", bench])
        .status()
        .context("running cargo bench")?;
    if !status.success() {
        bail!("cargo bench failed ({status})");
    }
    Ok(())
}
