//! The least-loaded reservation ledger (spec: "Burst safety (reservations)") and the token a
//! decision carries for its reservation.
//!
//! A load gauge moves only once a request is being served upstream, so a burst of picks would
//! all see the same idle pod. Each least-loaded pick therefore records a reservation for what it
//! chose; later picks count unexpired reservations as load. The pick hands back a
//! [`Reservation`] token that travels with the decision. It ends exactly once:
//! - **consumed** when the request starts on what was reserved (the real load replaces its
//!   placeholder), or
//! - **expired** when its TTL passes first (the sweep), or when the token is dropped without
//!   being consumed (the request went elsewhere, failed, or its client left).
//!
//! Both ends are counted per model, so `reserved = consumed + expired + pending` holds at every
//! moment. The hand-over errs high, never low: the real count rises before the reservation
//! ends, and the eBPF gauge counts a new connection from its handshake, so between the
//! handshake and the request's start (one task wake-up) the pod counts twice. A TTL of zero disables the ledger. Time is passed in (`now`), never read here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::metrics::handles::ReservationCounters;

#[derive(Debug)]
struct Entry {
    id: u64,
    at: Instant,
    counters: Arc<ReservationCounters>,
}

/// Keys are already well-distributed integers (pod slots, member name hashes, chain links).
#[derive(Default)]
pub(crate) struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    pending: HashMap<u64, Vec<Entry>, BuildHasherDefault<Identity>>,
}

/// Reservations keyed by what was picked: a pod's gauge slot, or a label-group member.
#[derive(Debug)]
pub struct Ledger {
    ttl: Duration,
    inner: Mutex<Inner>,
}

impl Ledger {
    pub fn new(ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            ttl,
            inner: Mutex::new(Inner::default()),
        })
    }

    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::lock::lock(&self.inner)
    }

    fn live(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.at) < self.ttl
    }

    fn pending_in(&self, inner: &Inner, key: u64, now: Instant) -> u64 {
        inner
            .pending
            .get(&key)
            .map_or(0, |q| q.iter().filter(|e| self.live(e, now)).count() as u64)
    }

    /// Rank `n` candidates atomically with respect to other picks, by
    /// `active(i) + unexpired reservations of key_of(i)`, and reserve the best one (when it
    /// has a key), counting it in `counters_of(best)`. `rank` turns the loads into an order,
    /// `first_of` reads the best candidate of it. With the ledger disabled the loads are the
    /// active counts alone and nothing is reserved.
    #[allow(clippy::too_many_arguments)]
    pub fn pick<R>(
        self: &Arc<Self>,
        n: usize,
        key_of: impl Fn(usize) -> Option<u64>,
        active: impl Fn(usize) -> u64,
        rank: impl FnOnce(&[u64]) -> R,
        first_of: impl Fn(&R) -> Option<usize>,
        counters_of: impl Fn(usize) -> Arc<ReservationCounters>,
        now: Instant,
    ) -> (R, Option<Reservation>) {
        let loads_of = |pending: &dyn Fn(u64) -> u64| -> Loads {
            Loads::collect(n, |i| active(i) + key_of(i).map_or(0, pending))
        };
        if !self.enabled() {
            let loads = loads_of(&|_| 0);
            return (rank(loads.as_slice()), None);
        }
        let mut inner = self.lock();
        let loads = loads_of(&|k| self.pending_in(&inner, k, now));
        let order = rank(loads.as_slice());
        let Some((best, key)) = first_of(&order).and_then(|i| Some((i, key_of(i)?))) else {
            return (order, None);
        };
        let counters = counters_of(best);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.pending.entry(key).or_default().push(Entry {
            id,
            at: now,
            counters: Arc::clone(&counters),
        });
        drop(inner);
        counters.made.inc();
        let token = Reservation {
            ledger: Arc::clone(self),
            key,
            id,
            settled: false,
        };
        (order, Some(token))
    }

    /// `active(i) +` unexpired reservations of `key_of(i)` for each of `n` candidates, read
    /// under one lock: the loads a bounded ring pick compares with its bound. Nothing is
    /// reserved.
    pub fn loads(
        &self,
        n: usize,
        key_of: impl Fn(usize) -> Option<u64>,
        active: impl Fn(usize) -> u64,
        now: Instant,
    ) -> Loads {
        if !self.enabled() {
            return Loads::collect(n, active);
        }
        let inner = self.lock();
        Loads::collect(n, |i| {
            active(i) + key_of(i).map_or(0, |k| self.pending_in(&inner, k, now))
        })
    }

    /// Unexpired reservations held for `key`.
    pub fn pending(&self, key: u64, now: Instant) -> u64 {
        let inner = self.lock();
        self.pending_in(&inner, key, now)
    }

    /// End reservation `id` of `key` if it is still pending; returns whether it was.
    fn settle(&self, key: u64, id: u64, consumed: bool) -> bool {
        let mut inner = self.lock();
        let Some(q) = inner.pending.get_mut(&key) else {
            return false;
        };
        let Some(i) = q.iter().position(|e| e.id == id) else {
            return false;
        };
        let e = q.swap_remove(i);
        if q.is_empty() {
            inner.pending.remove(&key);
        }
        drop(inner);
        if consumed {
            e.counters.consumed.inc();
        } else {
            e.counters.expired.inc();
        }
        true
    }

    /// Expire every reservation older than the TTL; returns how many expired.
    pub fn sweep(&self, now: Instant) -> u64 {
        let mut inner = self.lock();
        let mut expired = 0;
        inner.pending.retain(|_, q| {
            q.retain(|e| {
                let live = now.saturating_duration_since(e.at) < self.ttl;
                if !live {
                    e.counters.expired.inc();
                    expired += 1;
                }
                live
            });
            !q.is_empty()
        });
        expired
    }

    /// Reservations pending in all (tests and `/debug/routing`).
    pub fn len(&self) -> usize {
        self.lock().pending.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Loads of the candidates of one pick, on the stack for up to 64 of them (it lives for one
/// pick, on the stack, so its size is the point).
#[allow(clippy::large_enum_variant)]
pub enum Loads {
    Inline([u64; 64], usize),
    Heap(Vec<u64>),
}

impl Loads {
    fn collect(n: usize, load: impl Fn(usize) -> u64) -> Self {
        if n <= 64 {
            let mut a = [0u64; 64];
            for (i, v) in a.iter_mut().enumerate().take(n) {
                *v = load(i);
            }
            Loads::Inline(a, n)
        } else {
            Loads::Heap((0..n).map(load).collect())
        }
    }

    pub fn as_slice(&self) -> &[u64] {
        match self {
            Loads::Inline(a, n) => &a[..*n],
            Loads::Heap(v) => v,
        }
    }

    /// The loads added up.
    pub fn total(&self) -> u64 {
        self.as_slice().iter().sum()
    }
}

/// A reservation held by a decision. Consume it when the request starts on what it reserved;
/// dropping it unconsumed expires it at once (counted), so it never lingers as phantom load.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Ledger>,
    key: u64,
    id: u64,
    settled: bool,
}

impl Reservation {
    /// What was reserved (a pod slot or a member key).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The request started on the reserved target: the real load replaces the placeholder.
    /// Returns false if the reservation had already expired (then nothing changes).
    pub fn consume(mut self) -> bool {
        self.settled = true;
        self.ledger.settle(self.key, self.id, true)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.ledger.settle(self.key, self.id, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::least_loaded::{rank, Ranked};

    fn pick(
        l: &Arc<Ledger>,
        keys: &[u64],
        c: &Arc<ReservationCounters>,
        now: Instant,
    ) -> (Ranked, Option<Reservation>) {
        l.pick(
            keys.len(),
            |i| Some(keys[i]),
            |_| 0,
            |loads| rank(loads, 0, 3),
            |r| r.clone().next(),
            |_| Arc::clone(c),
            now,
        )
    }

    #[test]
    fn a_burst_spreads_across_idle_members() {
        let l = Ledger::new(Duration::from_secs(10));
        let c = ReservationCounters::detached();
        let now = Instant::now();
        let mut hits = [0; 4];
        let mut held = Vec::new();
        for _ in 0..12 {
            let (mut order, token) = pick(&l, &[0, 1, 2, 3], &c, now);
            hits[order.next().unwrap()] += 1;
            held.push(token.unwrap());
        }
        assert_eq!(hits, [3, 3, 3, 3]);
        assert_eq!(c.made.get(), 12);
    }

    #[test]
    fn each_reservation_ends_once_consumed_or_expired() {
        let l = Ledger::new(Duration::from_secs(10));
        let c = ReservationCounters::detached();
        let t0 = Instant::now();
        let (_, a) = pick(&l, &[7], &c, t0);
        let (_, b) = pick(&l, &[7], &c, t0);
        let (_, d) = pick(&l, &[7], &c, t0);
        assert_eq!(l.pending(7, t0), 3);
        assert!(a.unwrap().consume());
        assert_eq!(l.pending(7, t0), 2);
        drop(b);
        assert_eq!(
            (c.consumed.get(), c.expired.get()),
            (1, 1),
            "dropped = expired"
        );
        let later = t0 + Duration::from_secs(10);
        assert_eq!(l.pending(7, later), 0, "expired ones stop counting as load");
        assert_eq!(l.sweep(later), 1);
        assert_eq!(l.sweep(later), 0);
        assert!(!d.unwrap().consume(), "already expired by the sweep");
        assert_eq!((c.made.get(), c.consumed.get(), c.expired.get()), (3, 1, 2));
        assert!(l.is_empty());
    }

    #[test]
    fn ttl_zero_disables_the_ledger() {
        let l = Ledger::new(Duration::ZERO);
        let c = ReservationCounters::detached();
        let now = Instant::now();
        for _ in 0..5 {
            let (mut order, token) = pick(&l, &[0, 1], &c, now);
            assert_eq!(
                order.next(),
                Some(0),
                "no reservations: ties break by rr only"
            );
            assert!(token.is_none());
        }
        assert_eq!(l.pending(0, now), 0);
        assert_eq!(c.made.get(), 0);
    }
}
