//! Picks the gauge cannot see yet. A bounded ring or cache-aware pick, and every pick of a
//! model with a `maxConcurrency`, counts on its pod from the decision until the request starts
//! upstream (from then on the gauge counts it), so a burst of picks for one hot key sees itself
//! instead of stampeding the pod the gauge still shows idle, and admission's room rule counts
//! a request it let in while its upstream connection is still being made. Unlike least-loaded reservations this needs no TTL and is not a spec metric:
//! the count is held by a token the decision carries and ends exactly once, when the token
//! drops (the request started, went elsewhere, or ended).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::load::{Slot, MAX_SLOTS};

/// Pending picks per gauge slot.
#[derive(Debug)]
pub struct PendingPicks {
    counts: Box<[AtomicU64]>,
}

impl PendingPicks {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            counts: (0..MAX_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Picks of the pod in `slot` whose requests have not started yet.
    pub fn get(&self, slot: Slot) -> u64 {
        self.counts
            .get(slot as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Count one pick of `slot` until the token drops.
    pub fn hold(self: &Arc<Self>, slot: Slot) -> PendingPick {
        if let Some(c) = self.counts.get(slot as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        PendingPick {
            picks: Arc::clone(self),
            slot,
        }
    }
}

/// One pending pick; dropping it ends the count.
#[derive(Debug)]
pub struct PendingPick {
    picks: Arc<PendingPicks>,
    slot: Slot,
}

impl PendingPick {
    pub fn slot(&self) -> Slot {
        self.slot
    }
}

impl Drop for PendingPick {
    fn drop(&mut self) {
        if let Some(c) = self.picks.counts.get(self.slot as usize) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pick_counts_until_its_token_drops() {
        let p = PendingPicks::new();
        let a = p.hold(3);
        let b = p.hold(3);
        assert_eq!((p.get(3), p.get(4), a.slot()), (2, 0, 3));
        drop(a);
        assert_eq!(p.get(3), 1);
        drop(b);
        assert_eq!(p.get(3), 0);
        // Past the gauge's slots nothing is counted, and nothing breaks.
        let far = p.hold(u32::MAX);
        assert_eq!(p.get(u32::MAX), 0);
        drop(far);
    }
}
