//! Test helper: a second "proxy process" for the eBPF tests. Opens the gauge with the given
//! pin dir and cgroup, registers the given pods (proxy slot = position), optionally waits for a
//! line on stdin (so several probes can be started together), then prints
//! `created=<bool>` and `active=<n>,<n>,...` and exits.
//!
//! usage: `gauge-probe <pin-dir> <cgroup> [--wait] POD...`
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use routing_userspace::ebpf::EbpfOptions;
use routing_userspace::load::ebpf::EbpfGauge;
use routing_userspace::load::LoadGauge;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let pin_dir = PathBuf::from(args.next().context("pin dir")?);
    let cgroup = PathBuf::from(args.next().context("cgroup")?);
    let mut wait = false;
    let mut pods: Vec<SocketAddr> = Vec::new();
    for a in args {
        if a == "--wait" {
            wait = true;
        } else {
            pods.push(a.parse().with_context(|| format!("pod {a}"))?);
        }
    }
    if wait {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
    }
    let opts = EbpfOptions {
        cgroup: Some(cgroup),
        pin_dir,
        ..EbpfOptions::default()
    };
    let gauge = EbpfGauge::open(&opts)?;
    let slots: Vec<(SocketAddr, u32)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i as u32))
        .collect();
    gauge.set_pods(&slots);
    let active: Vec<String> = (0..pods.len() as u32)
        .map(|s| gauge.active(s).to_string())
        .collect();
    println!("created={}", gauge.created());
    println!("active={}", active.join(","));
    Ok(())
}
