//! The eBPF gauge: per-pod established-connection counts kept by the kernel, read through a
//! shared mapping of the LOAD array (one atomic load per pick, no syscall).
//!
//! The kernel side is node-wide and shared by every proxy process, so its slots ("kernel
//! slots", the index into LOAD) are node-wide too: a pod keeps the kernel slot recorded in
//! BACKENDS for as long as it is listed there, whichever process added it. Each process maps
//! its own [`Slot`]s (from its `SlotAllocator`) to kernel slots in a small table of atomics,
//! so the proxy's slot numbers never need to agree across processes.
//!
//! A kernel slot whose pod was removed keeps counting that pod's remaining connections until
//! they close (each connection counts down on the slot it counted up). New pods therefore
//! get a free slot whose count is zero when there is one.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use routing_common::{BackendKey, MAX_PODS};

use super::{LoadGauge, Slot, MAX_SLOTS};
use crate::ebpf::pins::{map_data, PinnedSet};
use crate::ebpf::sys::MappedCounters;
use crate::ebpf::{EbpfError, EbpfOptions};

/// No kernel slot for this proxy slot.
const UNMAPPED: u32 = u32::MAX;

/// `BackendKey` for a socket address, as the kernel builds it from a connecting socket.
pub fn backend_key(addr: &SocketAddr) -> BackendKey {
    match addr {
        SocketAddr::V4(a) => BackendKey::from_octets_v4(a.ip().octets(), a.port()),
        SocketAddr::V6(a) => BackendKey::from_octets_v6(a.ip().octets(), a.port()),
    }
}

pub struct EbpfGauge {
    counters: MappedCounters,
    /// proxy slot -> kernel slot (or [`UNMAPPED`]).
    translate: Box<[AtomicU32]>,
    state: Mutex<State>,
}

struct State {
    set: PinnedSet,
    /// Pods this process put in (or found in) BACKENDS, with their kernel slots.
    mine: HashMap<BackendKey, u32>,
    /// Proxy slots currently mapped, to unmap the ones that disappear.
    mapped: HashSet<Slot>,
}

impl EbpfGauge {
    /// Open (or create and attach) the node's pinned set and map its LOAD array.
    pub fn open(opts: &EbpfOptions) -> Result<Self, EbpfError> {
        let set = PinnedSet::open_or_create(opts)?;
        Self::from_set(set)
    }

    fn from_set(set: PinnedSet) -> Result<Self, EbpfError> {
        let counters = MappedCounters::map(map_data(&set.load).fd().as_fd(), MAX_PODS as usize)
            .map_err(|e| {
                EbpfError::classify("mapping LOAD", e, |e| EbpfError::Map {
                    map: routing_common::maps::LOAD,
                    source: Box::new(e),
                })
            })?;
        Ok(Self {
            counters,
            translate: (0..MAX_SLOTS).map(|_| AtomicU32::new(UNMAPPED)).collect(),
            state: Mutex::new(State {
                set,
                mine: HashMap::new(),
                mapped: HashSet::new(),
            }),
        })
    }

    /// Whether this gauge created and attached the pinned set (false: it reopened one).
    pub fn created(&self) -> bool {
        self.lock().set.created
    }

    /// The pin directory in use.
    pub fn pin_dir(&self) -> std::path::PathBuf {
        self.lock().set.pin_dir.clone()
    }

    /// Every LOAD counter, by kernel slot (for diagnostics and tests).
    pub fn kernel_loads(&self) -> Vec<u64> {
        self.counters
            .as_slice()
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// The kernel slot serving `slot`, if any.
    pub fn kernel_slot(&self, slot: Slot) -> Option<u32> {
        let k = self.translate.get(slot as usize)?.load(Ordering::Relaxed);
        (k != UNMAPPED).then_some(k)
    }

    /// `active(slot)` through a BPF map-lookup syscall instead of the mapping (benchmarks).
    pub fn active_by_syscall(&self, slot: Slot) -> u64 {
        let Some(k) = self.kernel_slot(slot) else {
            return 0;
        };
        self.lock().set.load_lookup(k).unwrap_or(0)
    }

    /// Make BACKENDS hold exactly this process's view, allocating node-wide kernel slots.
    pub fn try_set_pods(&self, pods: &[(SocketAddr, Slot)]) -> Result<(), EbpfError> {
        let mut st = self.lock();
        let wanted: HashMap<BackendKey, Slot> =
            pods.iter().map(|(a, s)| (backend_key(a), *s)).collect();

        // Remove pods this process added and no longer lists. (Pods another process added are
        // that process's to remove; all proxies on a node watch the same discovery.)
        let gone: Vec<BackendKey> = st
            .mine
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            st.mine.remove(&key);
            match st.set.backends()?.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(e)),
            }
        }

        let existing: HashMap<BackendKey, u32> = st.set.backend_entries()?.into_iter().collect();
        let mut used: HashSet<u32> = existing.values().copied().collect();
        let loads = self.counters.as_slice();
        let mut new_map: Vec<(Slot, u32)> = Vec::with_capacity(wanted.len());
        let mut sorted: Vec<(&BackendKey, &Slot)> = wanted.iter().collect();
        sorted.sort_by_key(|(_, s)| **s);
        for (key, slot) in sorted {
            let kslot = match existing.get(key) {
                Some(&k) => k,
                None => {
                    // Prefer a free slot that reads zero; else any free slot.
                    let free = (0..MAX_PODS)
                        .filter(|k| !used.contains(k))
                        .find(|k| loads[*k as usize].load(Ordering::Relaxed) == 0)
                        .or_else(|| (0..MAX_PODS).find(|k| !used.contains(k)));
                    let Some(k) = free else {
                        tracing::warn!(?key, "no free kernel load slot; pod reads as idle");
                        continue;
                    };
                    let flags = 1; // BPF_NOEXIST: another process may have just added it.
                    match st.set.backends()?.insert(key, k, flags) {
                        Ok(()) => k,
                        Err(_) => match st.set.backends()?.get(key, 0) {
                            Ok(k) => k,
                            Err(e) => return Err(map_err(e)),
                        },
                    }
                }
            };
            used.insert(kslot);
            st.mine.insert(*key, kslot);
            new_map.push((*slot, kslot));
        }

        let now: HashSet<Slot> = new_map.iter().map(|(s, _)| *s).collect();
        for s in st.mapped.difference(&now) {
            if let Some(t) = self.translate.get(*s as usize) {
                t.store(UNMAPPED, Ordering::Relaxed);
            }
        }
        for (s, k) in &new_map {
            if let Some(t) = self.translate.get(*s as usize) {
                t.store(*k, Ordering::Relaxed);
            }
        }
        st.mapped = now;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn map_err(e: aya::maps::MapError) -> EbpfError {
    EbpfError::Map {
        map: routing_common::maps::BACKENDS,
        source: Box::new(e),
    }
}

impl LoadGauge for EbpfGauge {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn set_pods(&self, pods: &[(SocketAddr, Slot)]) {
        if let Err(e) = self.try_set_pods(pods) {
            tracing::error!(error = %e, "updating the eBPF BACKENDS map failed; some pods read as idle");
        }
    }

    #[inline]
    fn active(&self, slot: Slot) -> u64 {
        let Some(t) = self.translate.get(slot as usize) else {
            return 0;
        };
        let k = t.load(Ordering::Relaxed);
        self.counters
            .as_slice()
            .get(k as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_encode_like_the_kernel() {
        let v4: SocketAddr = "10.0.0.7:8000".parse().unwrap();
        let k = backend_key(&v4);
        assert_eq!(k.family, routing_common::FAMILY_V4);
        assert_eq!(k.port, 8000);
        assert_eq!(k.addr[0].to_ne_bytes(), [10, 0, 0, 7]);
        assert_eq!(&k.addr[1..], &[0, 0, 0]);

        let mapped: SocketAddr = "[::ffff:10.0.0.7]:8000".parse().unwrap();
        assert_eq!(backend_key(&mapped), k, "v4-mapped v6 is the same pod");

        let v6: SocketAddr = "[fd00::1]:9000".parse().unwrap();
        let k6 = backend_key(&v6);
        assert_eq!(k6.family, routing_common::FAMILY_V6);
        assert_eq!(k6.addr[0].to_ne_bytes(), [0xfd, 0, 0, 0]);
        assert_eq!(k6.addr[3].to_ne_bytes(), [0, 0, 0, 1]);
    }
}
