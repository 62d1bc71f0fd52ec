//! The least-loaded reservation ledger (spec: "Burst safety (reservations)").
//!
//! A connection gauge moves only once a request is being served upstream, so a burst of picks
//! would all see the same idle pod. Each least-loaded pick therefore records a reservation for
//! what it chose; later picks count unexpired reservations as load. The real upstream request
//! consumes one reservation (the connection replaces its placeholder); reservations nobody
//! consumes expire after the TTL and are counted as expired. A TTL of zero disables the ledger.
//!
//! Time is passed in (`now`), never read here, so tests drive it directly.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One reservation: when it was made and which model it is reported under.
#[derive(Debug, Clone)]
struct Entry {
    at: Instant,
    model: Arc<str>,
}

/// Reservations keyed by what was picked (a pod slot, or a label-group member).
#[derive(Debug)]
pub struct ReservationLedger<K> {
    ttl: Duration,
    entries: Mutex<HashMap<K, VecDeque<Entry>>>,
}

impl<K: Hash + Eq + Clone> ReservationLedger<K> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn live(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.at) < self.ttl
    }

    /// Pick among `members` atomically with respect to other picks: rank them by
    /// `active(member) + unexpired reservations`, and reserve the first. Returns the indices
    /// of `members` in preference order (ties rotate from `rr`), or plain active-load order
    /// when the ledger is disabled (nothing is reserved then).
    pub fn pick_and_reserve(
        &self,
        members: &[K],
        active: impl Fn(usize) -> u64,
        rr: usize,
        model_of: impl Fn(usize) -> Arc<str>,
        now: Instant,
    ) -> Vec<usize> {
        if !self.enabled() {
            let loads: Vec<u64> = (0..members.len()).map(&active).collect();
            return crate::balance::least_loaded::order(&loads, rr);
        }
        let mut entries = self.entries.lock().expect("ledger lock");
        let loads: Vec<u64> = members
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let pending = entries
                    .get(k)
                    .map_or(0, |q| q.iter().filter(|e| self.live(e, now)).count() as u64);
                active(i) + pending
            })
            .collect();
        let order = crate::balance::least_loaded::order(&loads, rr);
        if let Some(&first) = order.first() {
            entries
                .entry(members[first].clone())
                .or_default()
                .push_back(Entry {
                    at: now,
                    model: model_of(first),
                });
        }
        order
    }

    /// Unexpired reservations held for `key`.
    pub fn pending(&self, key: &K, now: Instant) -> u64 {
        let entries = self.entries.lock().expect("ledger lock");
        entries
            .get(key)
            .map_or(0, |q| q.iter().filter(|e| self.live(e, now)).count() as u64)
    }

    /// The real connection to `key` has begun: drop its oldest unexpired reservation.
    /// Returns whether there was one.
    pub fn consume(&self, key: &K, now: Instant) -> bool {
        let mut entries = self.entries.lock().expect("ledger lock");
        let Some(q) = entries.get_mut(key) else {
            return false;
        };
        let found = q.iter().position(|e| self.live(e, now));
        if let Some(i) = found {
            q.remove(i);
        }
        if q.is_empty() {
            entries.remove(key);
        }
        found.is_some()
    }

    /// Remove expired reservations and report how many expired, per model.
    pub fn sweep(&self, now: Instant) -> Vec<(Arc<str>, u64)> {
        let mut entries = self.entries.lock().expect("ledger lock");
        let mut expired: HashMap<Arc<str>, u64> = HashMap::new();
        entries.retain(|_, q| {
            q.retain(|e| {
                let live = now.saturating_duration_since(e.at) < self.ttl;
                if !live {
                    *expired.entry(Arc::clone(&e.model)).or_default() += 1;
                }
                live
            });
            !q.is_empty()
        });
        let mut out: Vec<_> = expired.into_iter().collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(_: usize) -> Arc<str> {
        Arc::from("m")
    }

    #[test]
    fn a_burst_spreads_across_idle_members() {
        let l = ReservationLedger::new(Duration::from_secs(10));
        let now = Instant::now();
        let members = [0u32, 1, 2, 3];
        let mut hits = [0; 4];
        for _ in 0..12 {
            let order = l.pick_and_reserve(&members, |_| 0, 0, model, now);
            hits[order[0]] += 1;
        }
        assert_eq!(hits, [3, 3, 3, 3]);
    }

    #[test]
    fn consume_replaces_the_placeholder_and_expiry_is_counted() {
        let l = ReservationLedger::new(Duration::from_secs(10));
        let t0 = Instant::now();
        l.pick_and_reserve(&[7u32], |_| 0, 0, model, t0);
        l.pick_and_reserve(&[7u32], |_| 0, 0, model, t0);
        assert_eq!(l.pending(&7, t0), 2);
        assert!(l.consume(&7, t0));
        assert_eq!(l.pending(&7, t0), 1);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(l.pending(&7, later), 0, "expired reservations stop counting as load");
        assert_eq!(l.sweep(later), vec![(Arc::from("m"), 1)]);
        assert_eq!(l.sweep(later), vec![]);
        assert!(!l.consume(&7, later));
    }

    #[test]
    fn ttl_zero_disables_the_ledger() {
        let l = ReservationLedger::new(Duration::ZERO);
        let now = Instant::now();
        for _ in 0..5 {
            let order = l.pick_and_reserve(&[0u32, 1], |_| 0, 0, model, now);
            assert_eq!(order[0], 0, "no reservations: ties break by rr only");
        }
        assert_eq!(l.pending(&0, now), 0);
    }
}
