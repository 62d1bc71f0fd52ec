//! `cargo xtask bench <group>`: named criterion runs with the exact flags docs/benchmarks.md uses,
//! the proxy-level loopback benchmark against peer proxies (`bench overhead`, in
//! `bench_overhead`), and routing quality on real model servers (`bench real-llm`, in
//! `bench_real_llm`).

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Bench {
    #[command(subcommand)]
    pub group: Group,
}

#[derive(clap::Subcommand)]
pub enum Group {
    /// Gauge read per pod: mmapped BPF array vs map-lookup syscall vs userspace atomic.
    /// Builds the eBPF object first; needs root for the BPF rows.
    Gauge,
    /// The per-request routing cost: body view, key extraction, decision.
    Route,
    /// The admission cost when no queue forms: classify, admit and release a permit.
    Admission,
    /// Proxy overhead on loopback: wrk against fast static upstreams directly and through
    /// nginx, haproxy, smg and flexinfer-proxy (userspace gauge, and default flags as root).
    /// Installs what it needs. Not criterion: see xtask/src/bench_overhead.rs.
    Overhead(crate::bench_overhead::OverheadBench),
    /// Routing quality on three real llama.cpp servers (xllamacpp + SmolLM2 from PyPI):
    /// chat-with-doc and hot-prompt workloads through flexinfer-proxy's routings and smg's
    /// cache_aware policy; TTFT, cached prompt tokens, requests per server, wall time.
    RealLlm(crate::bench_real_llm::RealLlmBench),
}

pub fn run(args: &Bench) -> Result<()> {
    let (package, bench) = match &args.group {
        Group::Overhead(o) => return crate::bench_overhead::run(o),
        Group::RealLlm(r) => return crate::bench_real_llm::run(r),
        Group::Gauge => ("routing-userspace", "gauge_read"),
        Group::Route => ("routing-userspace", "route"),
        Group::Admission => ("routing-userspace", "admission"),
    };
    // Both benches read the embedded object, so build it first.
    crate::ebpf::build(&crate::ebpf::BuildEbpf { release: true })?;
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
