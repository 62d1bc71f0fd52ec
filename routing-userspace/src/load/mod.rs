//! Per-pod load gauges: how many requests each pod is serving right now.
//!
//! Least-loaded picks read a gauge on every request, so a read must be a plain memory load.
//! Two gauges implement [`LoadGauge`]: [`userspace::UserspaceGauge`] (atomics this process
//! bumps around each upstream request) and the eBPF gauge (a kernel-maintained, node-wide,
//! mmapped BPF array). Pods are addressed by a [`Slot`], assigned by [`slots::SlotAllocator`]
//! when the routing table is rebuilt, so a pick never hashes an address.

pub mod ebpf;
pub mod slots;
pub mod userspace;

use std::net::SocketAddr;

/// Index of a pod in the gauge arrays (the eBPF gauge translates it to the kernel's slot in
/// `PODS`).
pub type Slot = u32;

/// Number of pod slots a gauge holds.
pub const MAX_SLOTS: usize = routing_common::MAX_PODS as usize;

/// A source of per-pod counts of requests in flight.
pub trait LoadGauge: Send + Sync + 'static {
    /// Short name for logs and `/debug/routing` (`"ebpf"` or `"userspace"`).
    fn name(&self) -> &'static str;
    /// The complete set of pods and their slots, called after every routing-table rebuild.
    fn set_pods(&self, pods: &[(SocketAddr, Slot)]);
    /// Requests in flight on the pod in `slot`. Must not block or make a syscall.
    fn active(&self, slot: Slot) -> u64;
}
