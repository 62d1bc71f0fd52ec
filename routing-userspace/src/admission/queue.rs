//! The waiting requests of one model, in the order they may leave: priority bands (higher
//! first); within a band, tenants take turns (deficit round-robin with unit cost: a tenant of
//! weight w takes up to w requests in a row, then the next tenant's turn comes; with every
//! weight 1, the default, that is plain round-robin); within a tenant, first come first served.
//!
//! Pure and synchronous: the gate ([`super::gate`]) decides when something leaves and what a
//! full queue does; time is passed in. Every operation is O(log bands) plus, for the rare ones
//! (a removal from the middle, picking a victim), O(tenants in one band). Empty tenants and
//! bands are dropped at once, so memory follows what is queued.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

/// Where a queued request sits: enough to find it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub priority: i32,
    pub tenant: u64,
    /// Arrival order over the whole queue.
    pub seq: u64,
}

/// A queued request.
#[derive(Debug)]
pub struct Queued<T> {
    pub key: Key,
    pub enqueued: Instant,
    pub value: T,
}

/// One tenant's requests in one band.
#[derive(Debug)]
struct Lane<T> {
    label: Arc<str>,
    entries: VecDeque<Queued<T>>,
    /// Requests per turn (at least 1).
    weight: u32,
    /// Requests left in the current turn (1..=weight).
    credit: u32,
}

/// One priority level.
#[derive(Debug)]
struct Band<T> {
    lanes: HashMap<u64, Lane<T>>,
    /// Tenants with queued requests, the next one to be served first.
    turns: VecDeque<u64>,
    len: usize,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Band<T> {
    /// Take `key` out of its lane; drops the lane when it empties.
    fn remove(&mut self, key: &Key) -> Option<Queued<T>> {
        let lane = self.lanes.get_mut(&key.tenant)?;
        let at = lane
            .entries
            .binary_search_by_key(&key.seq, |q| q.key.seq)
            .ok()?;
        let item = lane.entries.remove(at)?;
        if lane.entries.is_empty() {
            self.lanes.remove(&key.tenant);
            if let Some(i) = self.turns.iter().position(|t| *t == key.tenant) {
                self.turns.remove(i);
            }
        }
        self.len -= 1;
        Some(item)
    }
}

/// A tenant's share of one band, for `/debug/routing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneView {
    pub tenant: Arc<str>,
    pub depth: usize,
}

/// One band, for `/debug/routing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BandView {
    pub priority: i32,
    pub depth: usize,
    pub tenants: usize,
    pub oldest: Option<Instant>,
    /// The tenants with the most queued requests, most first (at most `top`).
    pub top_tenants: Vec<LaneView>,
}

#[derive(Debug)]
pub struct Queue<T> {
    bands: BTreeMap<Reverse<i32>, Band<T>>,
    len: usize,
    next_seq: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            bands: BTreeMap::new(),
            len: 0,
            next_seq: 0,
        }
    }
}

impl<T> Queue<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queue `value` at the end of its tenant's lane; a tenant new to the band takes the last
    /// turn, with `weight` requests in it and each turn after (1 or more). `label` and
    /// `weight` are called only when the tenant has no lane in the band yet.
    pub fn push(
        &mut self,
        priority: i32,
        tenant: u64,
        label: impl FnOnce() -> Arc<str>,
        weight: impl FnOnce() -> u32,
        now: Instant,
        value: T,
    ) -> Key {
        let key = Key {
            priority,
            tenant,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let band = self.bands.entry(Reverse(priority)).or_default();
        let lane = band.lanes.entry(tenant).or_insert_with(|| {
            band.turns.push_back(tenant);
            let weight = weight().max(1);
            Lane {
                label: label(),
                entries: VecDeque::new(),
                weight,
                credit: weight,
            }
        });
        lane.entries.push_back(Queued {
            key,
            enqueued: now,
            value,
        });
        band.len += 1;
        self.len += 1;
        key
    }

    /// The priority of the request that would leave next.
    pub fn next_priority(&self) -> Option<i32> {
        self.bands.keys().next().map(|Reverse(p)| *p)
    }

    /// The next request out: the highest band, the tenant whose turn it is, its oldest. The
    /// turn passes on when the tenant used its weight's worth or has nothing left.
    pub fn pop(&mut self) -> Option<Queued<T>> {
        let mut entry = self.bands.first_entry()?;
        let band = entry.get_mut();
        let tenant = *band.turns.front().expect("a band with requests has turns");
        let lane = band.lanes.get_mut(&tenant).expect("a turn has a lane");
        let item = lane.entries.pop_front().expect("a lane is never empty");
        lane.credit -= 1;
        if lane.entries.is_empty() {
            band.lanes.remove(&tenant);
            band.turns.pop_front();
        } else if lane.credit == 0 {
            lane.credit = lane.weight;
            band.turns.rotate_left(1);
        }
        band.len -= 1;
        if band.len == 0 {
            entry.remove();
        }
        self.len -= 1;
        Some(item)
    }

    /// New weights for the tenants already queued (`weight` of a tenant's hash, 1 or more):
    /// their next turns are the new weight; a turn in progress keeps what it has left, up to
    /// the new weight.
    pub fn reweigh(&mut self, weight: impl Fn(u64) -> u32) {
        for band in self.bands.values_mut() {
            let current = band.turns.front().copied();
            for (tenant, lane) in &mut band.lanes {
                lane.weight = weight(*tenant).max(1);
                lane.credit = if current == Some(*tenant) {
                    lane.credit.min(lane.weight)
                } else {
                    lane.weight
                };
            }
        }
    }

    /// Take one request out of the middle (it left: cancelled, timed out, shed).
    pub fn remove(&mut self, key: &Key) -> Option<Queued<T>> {
        let band = self.bands.get_mut(&Reverse(key.priority))?;
        let item = band.remove(key)?;
        if band.len == 0 {
            self.bands.remove(&Reverse(key.priority));
        }
        self.len -= 1;
        Some(item)
    }

    /// The request to drop so that one of priority `incoming` fits a full queue: in the lowest
    /// band, if it is sheddable (negative) and below `incoming`, the newest request of the
    /// tenant with the most queued there (ties: the newest request). None: nothing may go.
    pub fn shed_victim(&self, incoming: i32) -> Option<Key> {
        let (Reverse(lowest), band) = self.bands.iter().next_back()?;
        if *lowest >= 0 || *lowest >= incoming {
            return None;
        }
        band.lanes
            .values()
            .filter_map(|lane| lane.entries.back().map(|q| (lane.entries.len(), q.key)))
            .max_by_key(|(len, key)| (*len, key.seq))
            .map(|(_, key)| key)
    }

    /// Everything, in the order it would have left.
    pub fn drain(&mut self) -> Vec<Queued<T>> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(q) = self.pop() {
            out.push(q);
        }
        out
    }

    /// When the longest-waiting request arrived.
    pub fn oldest(&self) -> Option<Instant> {
        self.bands.values().filter_map(oldest_in).min()
    }

    /// Every band, highest first, with its `top` biggest tenants.
    pub fn bands(&self, top: usize) -> Vec<BandView> {
        self.bands
            .iter()
            .map(|(Reverse(priority), band)| {
                let mut lanes: Vec<LaneView> = band
                    .lanes
                    .values()
                    .map(|l| LaneView {
                        tenant: Arc::clone(&l.label),
                        depth: l.entries.len(),
                    })
                    .collect();
                lanes.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.tenant.cmp(&b.tenant)));
                lanes.truncate(top);
                BandView {
                    priority: *priority,
                    depth: band.len,
                    tenants: band.lanes.len(),
                    oldest: oldest_in(band),
                    top_tenants: lanes,
                }
            })
            .collect()
    }
}

fn oldest_in<T>(band: &Band<T>) -> Option<Instant> {
    band.lanes
        .values()
        .filter_map(|l| l.entries.front().map(|q| q.enqueued))
        .min()
}

#[cfg(test)]
mod tests;
