//! Stable slot numbers for pod addresses.
//!
//! A pod keeps its slot for as long as it is known; a removed pod's slot goes to the back of a
//! FIFO free list, so the slot reused last is the one that had the most time to drain.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;

use super::{Slot, MAX_SLOTS};

#[derive(Debug)]
pub struct SlotAllocator {
    assigned: HashMap<SocketAddr, Slot>,
    free: VecDeque<Slot>,
}

impl Default for SlotAllocator {
    fn default() -> Self {
        Self {
            assigned: HashMap::new(),
            free: (0..MAX_SLOTS as Slot).collect(),
        }
    }
}

impl SlotAllocator {
    /// Assign slots to exactly `pods`: known pods keep theirs, new pods take free ones, pods
    /// no longer listed release theirs. Pods past capacity get no slot (they are still routed,
    /// but read as load 0).
    pub fn sync<'a>(&mut self, pods: impl IntoIterator<Item = &'a SocketAddr>) -> Vec<(SocketAddr, Slot)> {
        let wanted: HashSet<SocketAddr> = pods.into_iter().copied().collect();
        let gone: Vec<SocketAddr> = self
            .assigned
            .keys()
            .filter(|a| !wanted.contains(a))
            .copied()
            .collect();
        for addr in gone {
            if let Some(slot) = self.assigned.remove(&addr) {
                self.free.push_back(slot);
            }
        }
        let mut new: Vec<SocketAddr> = wanted
            .iter()
            .filter(|a| !self.assigned.contains_key(a))
            .copied()
            .collect();
        new.sort();
        for addr in new {
            match self.free.pop_front() {
                Some(slot) => {
                    self.assigned.insert(addr, slot);
                }
                None => tracing::warn!(pod = %addr, "no free load-gauge slot; pod reads as idle"),
            }
        }
        let mut out: Vec<(SocketAddr, Slot)> = self.assigned.iter().map(|(a, s)| (*a, *s)).collect();
        out.sort();
        out
    }

    pub fn get(&self, addr: &SocketAddr) -> Option<Slot> {
        self.assigned.get(addr).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn known_pods_keep_their_slot_and_freed_slots_are_reused_last() {
        let mut s = SlotAllocator::default();
        s.sync(&[a(1), a(2)]);
        let (s1, s2) = (s.get(&a(1)).unwrap(), s.get(&a(2)).unwrap());
        assert_ne!(s1, s2);
        s.sync(&[a(2), a(3)]);
        assert_eq!(s.get(&a(2)), Some(s2));
        assert_eq!(s.get(&a(1)), None);
        // a(1)'s slot went to the back of the queue, so a(3) did not get it.
        assert_ne!(s.get(&a(3)), Some(s1));
    }
}
