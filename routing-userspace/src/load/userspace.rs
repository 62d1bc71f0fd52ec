//! The in-process gauge: one atomic counter per slot, bumped around each upstream request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{LoadGauge, Slot, MAX_SLOTS};

#[derive(Debug)]
pub struct UserspaceGauge {
    counts: Box<[AtomicU64]>,
}

impl Default for UserspaceGauge {
    fn default() -> Self {
        Self {
            counts: (0..MAX_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl UserspaceGauge {
    /// Count one request in flight to `slot` until the returned guard drops.
    pub fn enter(self: &Arc<Self>, slot: Slot) -> InFlight {
        if let Some(c) = self.counts.get(slot as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        InFlight {
            gauge: Arc::clone(self),
            slot,
        }
    }
}

impl LoadGauge for UserspaceGauge {
    fn name(&self) -> &'static str {
        "userspace"
    }

    fn set_pods(&self, _pods: &[(SocketAddr, Slot)]) {}

    fn active(&self, slot: Slot) -> u64 {
        self.counts
            .get(slot as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// A request in flight; decrements its pod's counter on drop.
pub struct InFlight {
    gauge: Arc<UserspaceGauge>,
    slot: Slot,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(c) = self.gauge.counts.get(self.slot as usize) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
