//! The eBPF gauge: per-pod connection bits kept by the kernel (see `routing_common::PodConns`),
//! read through a shared mapping of the PODS array, with no syscall per pick or per request.
//! A pod's load is the number of its connections that are claimed and busy: requests in flight
//! on registered (pooled) connections, plus every unregistered connection.
//!
//! A proxy registers each new upstream connection once ([`EbpfGauge::register`]: its socket
//! cookie names it in CONNS, one map lookup) and gets a [`ConnTrack`], whose busy and idle
//! marks are single atomic operations on the mapped words.
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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use routing_common::{BackendKey, LiveWord, PodConns, CONN_WORDS, MAX_PODS};

use super::{LoadGauge, Slot, MAX_SLOTS};
use crate::ebpf::addr::backend_key;
use crate::ebpf::pins::{map_data, PinnedSet};
use crate::ebpf::sys::{self, MappedWords};
use crate::ebpf::{EbpfError, EbpfOptions};

/// `u64` words per pod in the mapped PODS array: `CONN_WORDS` (claimed, busy) pairs, then
/// `CONN_WORDS` registered words (the layout of `PodConns`).
const POD_WORDS: usize = std::mem::size_of::<PodConns>() / 8;
const LIVE_WORDS: usize = 2 * CONN_WORDS;

/// The mapped PODS array, indexed by kernel slot.
struct Pods(MappedWords);

impl Pods {
    fn pod(&self, kslot: u32) -> Option<&[AtomicU64]> {
        let base = kslot as usize * POD_WORDS;
        self.0.as_slice().get(base..base + POD_WORDS)
    }

    /// Index of the busy word of `group` of `kslot` in the mapping.
    fn busy_index(kslot: u32, group: usize) -> usize {
        kslot as usize * POD_WORDS + 2 * group + 1
    }

    fn registered(&self, kslot: u32, group: usize) -> Option<&AtomicU64> {
        self.pod(kslot)?.get(LIVE_WORDS + group)
    }

    /// Connections claimed and busy: what least-loaded reads. Sixteen loads from two cache
    /// lines; words with no busy connection (most of them) cost no bit count.
    #[inline]
    fn in_flight(&self, kslot: u32) -> u64 {
        let Some(live) = self.pod(kslot).and_then(|p| p.first_chunk::<LIVE_WORDS>()) else {
            return 0;
        };
        let mut n = 0;
        for g in 0..CONN_WORDS {
            let both =
                live[2 * g].load(Ordering::Relaxed) & live[2 * g + 1].load(Ordering::Relaxed);
            if both != 0 {
                n += u64::from(both.count_ones());
            }
        }
        n
    }

    fn snapshot(&self, kslot: u32) -> PodConns {
        let mut p = PodConns::default();
        let Some(pod) = self.pod(kslot) else {
            return p;
        };
        for (g, w) in p.live.iter_mut().enumerate() {
            *w = LiveWord {
                claimed: pod[2 * g].load(Ordering::Relaxed),
                busy: pod[2 * g + 1].load(Ordering::Relaxed),
            };
            p.registered[g] = pod[LIVE_WORDS + g].load(Ordering::Relaxed);
        }
        p
    }
}

/// A registered upstream connection's bit: the proxy marks it busy when a request starts on
/// it and idle when the response has ended. Each mark is one atomic operation on the mapped
/// PODS array. The kernel clears the bit when the socket closes, whatever happened here.
pub struct ConnTrack {
    pods: Arc<Pods>,
    index: usize,
    mask: u64,
}

impl std::fmt::Debug for ConnTrack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTrack")
            .field("index", &self.index)
            .field("mask", &format_args!("{:#x}", self.mask))
            .finish()
    }
}

impl ConnTrack {
    fn busy_word(&self) -> Option<&AtomicU64> {
        self.pods.0.as_slice().get(self.index)
    }

    /// A request starts on the connection.
    #[inline]
    pub fn busy(&self) {
        if let Some(w) = self.busy_word() {
            w.fetch_or(self.mask, Ordering::SeqCst);
        }
    }

    /// The connection's response has ended; it idles in the pool.
    #[inline]
    pub fn idle(&self) {
        if let Some(w) = self.busy_word() {
            w.fetch_and(!self.mask, Ordering::SeqCst);
        }
    }
}

/// No kernel slot for this proxy slot.
const UNMAPPED: u32 = u32::MAX;

pub struct EbpfGauge {
    pods: Arc<Pods>,
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
    /// Open (or create and attach) the node's pinned set and map its PODS array.
    pub fn open(opts: &EbpfOptions) -> Result<Self, EbpfError> {
        let set = PinnedSet::open_or_create(opts)?;
        Self::from_set(set)
    }

    fn from_set(set: PinnedSet) -> Result<Self, EbpfError> {
        let words = MappedWords::map(
            map_data(&set.pods).fd().as_fd(),
            MAX_PODS as usize * POD_WORDS,
        )
        .map_err(|e| {
            EbpfError::classify("mapping PODS", e, |e| EbpfError::Map {
                map: routing_common::maps::PODS,
                source: Box::new(e),
            })
        })?;
        Ok(Self {
            pods: Arc::new(Pods(words)),
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

    /// Requests in flight of every kernel slot (for diagnostics and tests).
    pub fn kernel_loads(&self) -> Vec<u64> {
        (0..MAX_PODS).map(|k| self.pods.in_flight(k)).collect()
    }

    /// Register a new upstream connection: find the bit the kernel claimed for it (one map
    /// lookup by socket cookie) and mark it as pooled by this proxy. `None` when the kernel
    /// does not count it (the peer is not a known pod, or the pod has no free bit).
    pub fn register(&self, socket: std::os::fd::BorrowedFd<'_>) -> Option<ConnTrack> {
        let cookie = sys::socket_cookie(socket).ok()?;
        let entry = match self.lock().set.conn_slot(cookie) {
            Ok(e) => e?,
            Err(e) => {
                tracing::debug!(error = %e, "looking up an upstream connection in CONNS failed");
                return None;
            }
        };
        let group = (entry.bit / 64) as usize;
        let mask = 1u64 << (entry.bit % 64);
        if group >= CONN_WORDS {
            return None;
        }
        self.pods
            .registered(entry.slot, group)?
            .fetch_or(mask, Ordering::SeqCst);
        Some(ConnTrack {
            pods: Arc::clone(&self.pods),
            index: Pods::busy_index(entry.slot, group),
            mask,
        })
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
        self.lock()
            .set
            .pod_lookup(k)
            .map_or(0, |p| u64::from(p.in_flight()))
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
        // A slot with no claimed connection has drained (its last pod's connections closed).
        let drained = |k: u32| self.pods.snapshot(k).live.iter().all(|w| w.claimed == 0);
        let mut new_map: Vec<(Slot, u32)> = Vec::with_capacity(wanted.len());
        let mut sorted: Vec<(&BackendKey, &Slot)> = wanted.iter().collect();
        sorted.sort_by_key(|(_, s)| **s);
        for (key, slot) in sorted {
            let kslot = match existing.get(key) {
                Some(&k) => k,
                None => {
                    // Prefer a free slot that has drained; else any free slot.
                    let free = (0..MAX_PODS)
                        .filter(|k| !used.contains(k))
                        .find(|&k| drained(k))
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
        crate::lock::lock(&self.state)
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
        self.pods.in_flight(t.load(Ordering::Relaxed))
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
