//! `flexinfer-proxy ebpf status|detach`: inspect or remove the node's pinned set from any
//! process (the proxy need not be running).

use std::io::Write;
use std::net::SocketAddr;

use routing_common::PodConns;

use super::addr::key_addr;
use super::pins::{self, PinnedSet};
use super::EbpfOptions;

/// One pod as the kernel sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLoad {
    pub addr: SocketAddr,
    pub slot: u32,
    /// What least-loaded reads: requests in flight on registered connections, plus every
    /// unregistered connection.
    pub active: u64,
    /// Requests in flight on registered (pooled) connections: its registered busy connections.
    pub in_flight: u64,
    /// Registered connections idle in a pool.
    pub registered_idle: u64,
    /// Connections nobody registered (one request each: another client, or no pooling).
    pub unregistered: u64,
}

impl PodLoad {
    pub fn new(addr: SocketAddr, slot: u32, p: &PodConns) -> Self {
        // (claimed, busy, registered) of each group of 64 connections.
        let count = |f: &dyn Fn(u64, u64, u64) -> u64| -> u64 {
            (0..p.live.len())
                .map(|g| f(p.live[g].claimed, p.live[g].busy, p.registered[g]))
                .map(|bits| u64::from(bits.count_ones()))
                .sum()
        };
        Self {
            addr,
            slot,
            active: count(&|c, b, _| c & b),
            in_flight: count(&|c, b, r| c & b & r),
            registered_idle: count(&|c, b, r| c & !b & r),
            unregistered: count(&|c, _, r| c & !r),
        }
    }
}

/// Every pod in BACKENDS with its kernel slot and connections, sorted by slot.
pub fn pod_loads(set: &PinnedSet) -> anyhow::Result<Vec<PodLoad>> {
    let mut out = Vec::new();
    for (k, slot) in set.backend_entries()? {
        out.push(PodLoad::new(key_addr(&k), slot, &set.pod_lookup(slot)?));
    }
    out.sort_by_key(|p| p.slot);
    Ok(out)
}

/// Print the pinned set's pods, slots and connections to `out`.
pub fn status_to(opts: &EbpfOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    let set = PinnedSet::open_existing(&opts.pin_dir)?;
    let pods = pod_loads(&set)?;
    writeln!(out, "pinned set: {}", set.pin_dir.display())?;
    writeln!(
        out,
        "tracked connections: {}   pods: {}",
        set.tracked_connections()?,
        pods.len(),
    )?;
    // Registered connections: `in_flight` of them carry a request, `idle` wait in a pool.
    writeln!(
        out,
        "{:<5} {:>7} {:>9} {:>5} {:>12}  pod",
        "slot", "active", "in_flight", "idle", "unregistered"
    )?;
    for p in &pods {
        writeln!(
            out,
            "{:<5} {:>7} {:>9} {:>5} {:>12}  {}",
            p.slot, p.active, p.in_flight, p.registered_idle, p.unregistered, p.addr
        )?;
    }
    Ok(())
}

/// `flexinfer-proxy ebpf status`: print per pod its slot, load and connections.
pub fn status(opts: &EbpfOptions) -> anyhow::Result<()> {
    status_to(opts, &mut std::io::stdout().lock())
}

/// `flexinfer-proxy ebpf detach`: unpin everything (which detaches sock_ops from its cgroup).
pub fn detach(opts: &EbpfOptions) -> anyhow::Result<()> {
    let removed = pins::remove_pins(&opts.pin_dir)?;
    if removed.files.is_empty() {
        println!("nothing pinned at {}", opts.pin_dir.display());
    }
    for f in &removed.files {
        println!("removed {}", f.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::addr::backend_key;

    #[test]
    fn key_addr_round_trips() {
        for s in ["127.0.0.1:8080", "[fd00::5]:1", "10.1.2.3:65535"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(key_addr(&backend_key(&a)), a);
        }
    }

    #[test]
    fn status_tells_nothing_pinned_from_a_broken_set() {
        let dir = std::env::temp_dir().join(format!("flexinfer-status-{}", std::process::id()));
        let opts = |d: &std::path::Path| crate::ebpf::EbpfOptions {
            pin_dir: d.to_path_buf(),
            ..crate::ebpf::EbpfOptions::default()
        };
        let err = status_to(&opts(&dir), &mut Vec::new()).unwrap_err();
        assert!(
            err.to_string().starts_with("nothing pinned at "),
            "no directory: {err}"
        );
        // A set directory without its link is a broken set, which detach removes.
        std::fs::create_dir_all(dir.join(routing_common::LAYOUT)).unwrap();
        let err = status_to(&opts(&dir), &mut Vec::new()).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.to_string().contains("is unusable"), "no link: {err}");
    }
}
