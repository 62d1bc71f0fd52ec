//! The cache-aware strategy's memory: which prompt-chain links (see [`crate::keys::chain`]) this
//! proxy sent to which pod, recently.
//!
//! It is an approximation of the pods' prefix caches from the outside: it learns every chain
//! it routes (all links, for the pod it picked), and forgets the least recently used
//! `(link, pod)` entries once it holds as many as its memory budget allows. It can believe a pod
//! still holds a prefix its cache already evicted; the pod's answer says how much of the prompt
//! it found cached, and entries it evidently lost are forgotten (see [`super::feedback`]).
//!
//! Layout: a slab of entries threaded on two index lists (the link's pods, and one LRU order
//! over all entries), and an open-addressing table from link to the first entry of its list
//! (linear probing, deletion by backward shift, so churn leaves no tombstones and the table never
//! grows past twice the entry capacity). A lookup is one probe sequence per link, a touch O(1),
//! with no unsafe pointers. Pods are named by their gauge slot. The budget covers the whole
//! structure: [`BYTES_PER_ENTRY`] per entry of capacity, measured by a counting allocator in
//! `tests/prefix_index_memory.rs`.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::load::Slot;

/// What one `(link, pod)` entry of capacity costs at most: its 24-byte slab entry, and up to
/// four 4-byte slots of the link table (the table is a power of two of at least twice the
/// entries it may hold).
pub const BYTES_PER_ENTRY: usize = 40;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    link: u64,
    /// `NIL` while the entry is free.
    pod: Slot,
    /// The next entry of the same link (another pod); the next free entry while free.
    next_pod: u32,
    newer: u32,
    older: u32,
}

/// Link -> first entry of its list; slots hold entry indices.
#[derive(Debug, Default)]
struct LinkTable {
    slots: Vec<u32>,
    /// Links in the table.
    len: usize,
}

impl LinkTable {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Links are xxh3 hashes already: their low bits are the home slot.
    fn home(&self, link: u64) -> usize {
        (link as usize) & self.mask()
    }

    /// The slot holding `link`, or the empty slot where it would go.
    fn find(&self, entries: &[Entry], link: u64) -> (usize, bool) {
        let mut i = self.home(link);
        loop {
            match self.slots[i] {
                NIL => return (i, false),
                e if entries[e as usize].link == link => return (i, true),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    fn get(&self, entries: &[Entry], link: u64) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        match self.find(entries, link) {
            (i, true) => Some(self.slots[i]),
            _ => None,
        }
    }

    /// Point `link` at entry `e` (the link is already in `entries[e]`).
    fn set(&mut self, entries: &[Entry], link: u64, e: u32, max_slots: usize) {
        if (self.len + 1) * 2 > self.slots.len() && self.slots.len() < max_slots {
            self.grow(entries, (self.slots.len() * 2).clamp(16, max_slots));
        }
        let (i, found) = self.find(entries, link);
        if !found {
            self.len += 1;
        }
        self.slots[i] = e;
    }

    fn grow(&mut self, entries: &[Entry], size: usize) {
        let old = std::mem::replace(&mut self.slots, vec![NIL; size]);
        for e in old.into_iter().filter(|&e| e != NIL) {
            let (i, _) = self.find(entries, entries[e as usize].link);
            self.slots[i] = e;
        }
    }

    /// Drop `link`; later slots of its probe run move back, so no tombstone is left.
    fn remove(&mut self, entries: &[Entry], link: u64) {
        let (mut hole, found) = self.find(entries, link);
        if !found {
            return;
        }
        self.len -= 1;
        self.slots[hole] = NIL;
        let mut i = (hole + 1) & self.mask();
        while self.slots[i] != NIL {
            let home = self.home(entries[self.slots[i] as usize].link);
            // Move the entry back if its home is not in (hole, i] (cyclically).
            let between = if hole <= i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !between {
                self.slots[hole] = self.slots[i];
                self.slots[i] = NIL;
                hole = i;
            }
            i = (i + 1) & self.mask();
        }
    }
}

#[derive(Debug)]
struct Inner {
    links: LinkTable,
    entries: Vec<Entry>,
    /// Entries freed by a pod that left, threaded through `next_pod`.
    free: u32,
    newest: u32,
    oldest: u32,
    len: usize,
    /// Entries per pod slot.
    per_pod: HashMap<Slot, u64>,
}

/// The index: see the module docs.
#[derive(Debug)]
pub struct PrefixIndex {
    budget: usize,
    capacity: usize,
    /// The link table's largest size (a power of two, at least twice the capacity).
    max_slots: usize,
    inner: Mutex<Inner>,
}

impl PrefixIndex {
    /// An index that keeps within `budget_bytes` (0 remembers nothing).
    pub fn new(budget_bytes: usize) -> Self {
        let capacity = (budget_bytes / BYTES_PER_ENTRY).min(NIL as usize / 4);
        Self {
            budget: budget_bytes,
            capacity,
            max_slots: (capacity * 2).next_power_of_two().max(16),
            inner: Mutex::new(Inner {
                links: LinkTable::default(),
                entries: Vec::new(),
                free: NIL,
                newest: NIL,
                oldest: NIL,
                len: 0,
                per_pod: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::lock::lock(&self.inner)
    }

    pub fn budget_bytes(&self) -> usize {
        self.budget
    }

    /// Most entries held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries held for the pod in `slot`.
    pub fn entries_of(&self, slot: Slot) -> u64 {
        self.lock().per_pod.get(&slot).copied().unwrap_or(0)
    }

    /// For each pod, how many leading links of `chain` it holds: `depths[i]` for the pod that
    /// `index_of` maps to `i` (pods it maps to nothing are not candidates). Reads only.
    pub fn depths(
        &self,
        chain: &[u64],
        index_of: impl Fn(Slot) -> Option<usize>,
        depths: &mut [u32],
    ) {
        depths.fill(0);
        let inner = self.lock();
        for (d, &link) in chain.iter().enumerate() {
            let Some(head) = inner.links.get(&inner.entries, link) else {
                break;
            };
            let mut extended = false;
            let mut e = head;
            while e != NIL {
                let entry = inner.entries[e as usize];
                if let Some(i) = index_of(entry.pod) {
                    // A pod's run is contiguous from the first link.
                    if depths.get(i) == Some(&(d as u32)) {
                        depths[i] = d as u32 + 1;
                        extended = true;
                    }
                }
                e = entry.next_pod;
            }
            if !extended {
                break;
            }
        }
    }

    /// The pod in `slot` was sent a request with this chain: remember (or refresh) every link
    /// for it, the last link first, so the leading links are the freshest and eviction eats
    /// chains from their tails, as a prefix cache does.
    pub fn learn(&self, slot: Slot, chain: &[u64]) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.lock();
        for &link in chain.iter().rev() {
            inner.touch(link, slot, self.capacity, self.max_slots);
        }
    }

    /// The pod in `slot` does not hold these links (its own report says so): drop their
    /// entries for it; returns how many there were.
    pub fn forget(&self, slot: Slot, links: &[u64]) -> usize {
        let mut inner = self.lock();
        let mut dropped = 0;
        for &link in links {
            let mut e = inner.links.get(&inner.entries, link).unwrap_or(NIL);
            while e != NIL {
                let entry = inner.entries[e as usize];
                if entry.pod == slot {
                    inner.remove(e);
                    inner.entries[e as usize].next_pod = inner.free;
                    inner.free = e;
                    dropped += 1;
                    break;
                }
                e = entry.next_pod;
            }
        }
        dropped
    }

    /// Forget the pods `keep` says are gone (after a routing-table rebuild).
    pub fn retain_pods(&self, keep: impl Fn(Slot) -> bool) {
        let mut inner = self.lock();
        if inner.per_pod.keys().all(|&s| keep(s)) {
            return;
        }
        for e in 0..inner.entries.len() as u32 {
            let pod = inner.entries[e as usize].pod;
            if pod != NIL && !keep(pod) {
                inner.remove(e);
                inner.entries[e as usize].next_pod = inner.free;
                inner.free = e;
            }
        }
        inner.per_pod.retain(|s, _| keep(*s));
    }

    /// Bytes the slab and the link table hold now (the per-pod counters are a few words per
    /// pod and left out).
    pub fn memory_bytes(&self) -> usize {
        let inner = self.lock();
        inner.entries.capacity() * std::mem::size_of::<Entry>()
            + inner.links.slots.capacity() * std::mem::size_of::<u32>()
    }
}

impl Inner {
    fn touch(&mut self, link: u64, pod: Slot, capacity: usize, max_slots: usize) {
        let head = self.links.get(&self.entries, link).unwrap_or(NIL);
        let mut e = head;
        while e != NIL {
            if self.entries[e as usize].pod == pod {
                self.unlink_lru(e);
                self.push_newest(e);
                return;
            }
            e = self.entries[e as usize].next_pod;
        }
        let slot = if self.free != NIL {
            let f = self.free;
            self.free = self.entries[f as usize].next_pod;
            f
        } else if self.len >= capacity {
            let victim = self.oldest;
            self.remove(victim);
            victim
        } else {
            if self.entries.len() == self.entries.capacity() {
                // Grow exactly, never past the capacity the budget allows.
                let want = (self.entries.len() * 2).max(1024).min(capacity) - self.entries.len();
                self.entries.reserve_exact(want);
            }
            self.entries.push(Entry {
                link: 0,
                pod: NIL,
                next_pod: NIL,
                newer: NIL,
                older: NIL,
            });
            (self.entries.len() - 1) as u32
        };
        // The victim may have been this link's only entry (its head is gone now).
        let head = self.links.get(&self.entries, link).unwrap_or(NIL);
        self.entries[slot as usize] = Entry {
            link,
            pod,
            next_pod: head,
            newer: NIL,
            older: NIL,
        };
        self.links.set(&self.entries, link, slot, max_slots);
        self.push_newest(slot);
        self.len += 1;
        *self.per_pod.entry(pod).or_default() += 1;
    }

    /// Unlink entry `e` from its link's list and from the LRU order.
    fn remove(&mut self, e: u32) {
        let Entry {
            link,
            pod,
            next_pod,
            ..
        } = self.entries[e as usize];
        self.unlink_lru(e);
        match self.links.get(&self.entries, link) {
            Some(h) if h == e => {
                if next_pod == NIL {
                    self.links.remove(&self.entries, link);
                } else {
                    let (i, _) = self.links.find(&self.entries, link);
                    self.links.slots[i] = next_pod;
                }
            }
            Some(mut p) => {
                while p != NIL {
                    let next = self.entries[p as usize].next_pod;
                    if next == e {
                        self.entries[p as usize].next_pod = next_pod;
                        break;
                    }
                    p = next;
                }
            }
            None => {}
        }
        self.entries[e as usize].pod = NIL;
        self.entries[e as usize].next_pod = NIL;
        self.len -= 1;
        if let Some(n) = self.per_pod.get_mut(&pod) {
            *n -= 1;
        }
    }

    fn unlink_lru(&mut self, e: u32) {
        let Entry { newer, older, .. } = self.entries[e as usize];
        match newer {
            NIL => self.newest = older,
            n => self.entries[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.entries[o as usize].newer = newer,
        }
        self.entries[e as usize].newer = NIL;
        self.entries[e as usize].older = NIL;
    }

    fn push_newest(&mut self, e: u32) {
        self.entries[e as usize].older = self.newest;
        self.entries[e as usize].newer = NIL;
        match self.newest {
            NIL => self.oldest = e,
            n => self.entries[n as usize].newer = e,
        }
        self.newest = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depths(ix: &PrefixIndex, chain: &[u64], slots: &[Slot]) -> Vec<u32> {
        let mut d = vec![0; slots.len()];
        ix.depths(chain, |s| slots.iter().position(|&x| x == s), &mut d);
        d
    }

    #[test]
    fn depths_are_leading_runs_per_pod() {
        let ix = PrefixIndex::new(1 << 20);
        ix.learn(7, &[1, 2, 3]);
        ix.learn(9, &[1, 5]);
        assert_eq!(depths(&ix, &[1, 2, 3, 4], &[7, 9]), [3, 1]);
        assert_eq!(depths(&ix, &[1, 5], &[7, 9]), [1, 2]);
        // A run ends at the first link a pod lacks, whatever it holds after it.
        assert_eq!(
            depths(&ix, &[1, 9, 3], &[7, 9]),
            [1, 1],
            "only leading runs count"
        );
        assert_eq!(depths(&ix, &[4, 1], &[7, 9]), [0, 0]);
        assert_eq!(
            depths(&ix, &[1, 2], &[9]),
            [1],
            "pods not asked about are ignored"
        );
        assert_eq!((ix.entries_of(7), ix.entries_of(9), ix.len()), (3, 2, 5));
        // Learning again refreshes, it does not duplicate.
        ix.learn(7, &[1, 2, 3]);
        assert_eq!(ix.len(), 5);
    }

    #[test]
    fn the_least_recently_used_entries_go_first_tails_before_heads() {
        // Room for four entries exactly.
        let ix = PrefixIndex::new(4 * BYTES_PER_ENTRY);
        assert_eq!(ix.capacity(), 4);
        ix.learn(1, &[10, 11]);
        ix.learn(2, &[20, 21]);
        ix.learn(1, &[10, 11]); // refresh: pod 2's chain is the oldest now
        ix.learn(3, &[30]);
        assert_eq!(ix.len(), 4);
        // Pod 2 lost its tail link (21) first; its head (20) survives.
        assert_eq!(depths(&ix, &[20, 21], &[2]), [1]);
        assert_eq!(depths(&ix, &[10, 11], &[1]), [2]);
        assert_eq!(depths(&ix, &[30], &[3]), [1]);
        assert_eq!(
            (ix.entries_of(1), ix.entries_of(2), ix.entries_of(3)),
            (2, 1, 1)
        );
    }

    #[test]
    fn pods_that_leave_are_forgotten_and_their_room_reused() {
        let ix = PrefixIndex::new(1 << 20);
        ix.learn(1, &[1, 2]);
        ix.learn(2, &[1, 3]);
        ix.retain_pods(|s| s != 1);
        assert_eq!(depths(&ix, &[1, 2], &[1, 2]), [0, 1]);
        assert_eq!((ix.entries_of(1), ix.len()), (0, 2));
        ix.learn(3, &[1, 2]);
        assert_eq!(depths(&ix, &[1, 2], &[2, 3]), [1, 2]);
        assert_eq!(ix.len(), 4);
    }

    #[test]
    fn a_zero_budget_remembers_nothing() {
        let ix = PrefixIndex::new(0);
        ix.learn(1, &[1, 2]);
        assert!(ix.is_empty());
        assert_eq!(depths(&ix, &[1], &[1]), [0]);
    }

    #[test]
    fn many_distinct_prefixes_stay_within_the_budget_by_its_own_count() {
        // The counting-allocator test in tests/ runs a million; this one checks the arithmetic.
        let budget = 1 << 20;
        let ix = PrefixIndex::new(budget);
        for i in 0..200_000u64 {
            let head = crate::keys::hash_key(&i.to_string());
            ix.learn((i % 8) as Slot, &[head, head ^ 0x5555]);
        }
        assert_eq!(ix.len(), ix.capacity());
        assert!(
            ix.memory_bytes() <= budget,
            "{} > {budget}",
            ix.memory_bytes()
        );
        let per_pod: u64 = (0..8).map(|s| ix.entries_of(s)).sum();
        assert_eq!(per_pod as usize, ix.len());
        // The newest prefixes are the ones remembered.
        let last = crate::keys::hash_key("199999");
        assert_eq!(depths(&ix, &[last, last ^ 0x5555], &[199_999 % 8]), [2]);
        let first = crate::keys::hash_key("0");
        assert_eq!(depths(&ix, &[first], &[0]), [0]);
    }
}
