//! Manual check of the eBPF data plane without the proxy (until the CLI wires it in):
//!
//! ```text
//! ebpf_probe open [--cgroup PATH] [--pin-dir DIR] POD...   # open/attach, register pods, print status
//! ebpf_probe status [--pin-dir DIR]
//! ebpf_probe detach [--pin-dir DIR]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use routing_userspace::ebpf::{cli, EbpfGauge, EbpfOptions};
use routing_userspace::load::LoadGauge;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args
        .next()
        .context("usage: ebpf_probe open|status|detach ...")?;
    let mut opts = EbpfOptions::default();
    let mut pods: Vec<SocketAddr> = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cgroup" => opts.cgroup = Some(PathBuf::from(args.next().context("--cgroup PATH")?)),
            "--pin-dir" => opts.pin_dir = PathBuf::from(args.next().context("--pin-dir DIR")?),
            pod => pods.push(pod.parse().with_context(|| format!("pod address {pod}"))?),
        }
    }
    match cmd.as_str() {
        "open" => {
            let g = EbpfGauge::open(&opts)?;
            let slots: Vec<(SocketAddr, u32)> = pods
                .iter()
                .enumerate()
                .map(|(i, p)| (*p, i as u32))
                .collect();
            g.set_pods(&slots);
            println!("created={} pin_dir={}", g.created(), g.pin_dir().display());
            cli::status(&opts)
        }
        "status" => cli::status(&opts),
        "detach" => cli::detach(&opts),
        other => bail!("unknown command {other}"),
    }
}
