//! Approximate unique routing keys per series, in bounded memory, over a sliding window.
//!
//! Each (model, strategy, key_source) series keeps the hashes of up to `cap` distinct keys
//! exactly, so the common small sets are counted without error. When a key arrives that the full
//! exact set does not hold, that is an *overflow* (counted once per such observation): from then
//! on a HyperLogLog sketch (4096 one-byte registers, about 1.6% standard error) keeps estimating.
//! The sketch is allocated only at the first overflow and seeded from the exact set, which at that
//! moment holds every key of the generation, so it is the same sketch as one fed from the start.
//!
//! A long-lived proxy with session keys would otherwise count forever, so keys live in two
//! rotating generations of `window` each: the estimate is the number of distinct keys seen in the
//! current and the previous generation (between one and two windows back). `window = None` keeps
//! one generation forever. Memory per series is at most two exact sets at `cap` plus two sketches
//! ([`CardinalityTracker::memory_bound`]), whatever the traffic. Only 64-bit key hashes are kept.
//! The sets hash those with foldhash (one multiply, seeded per process), not SipHash: this runs
//! per request, and a per-process seed still keeps crafted keys from piling into one bucket.
//! Time is passed in (`now`), so the rotation is tested without sleeping.

use std::collections::HashSet;

use foldhash::fast::RandomState;
use std::time::{Duration, Instant};

const P: u32 = 12;
const REGISTERS: usize = 1 << P;

#[derive(Debug, Clone)]
pub struct Hll {
    registers: Box<[u8; REGISTERS]>,
}

impl Default for Hll {
    fn default() -> Self {
        Self {
            registers: Box::new([0; REGISTERS]),
        }
    }
}

impl Hll {
    pub fn insert(&mut self, hash: u64) {
        let idx = (hash >> (64 - P)) as usize;
        let rest = hash << P;
        let rank = (rest.leading_zeros() + 1).min(64 - P + 1) as u8;
        let r = &mut self.registers[idx];
        if rank > *r {
            *r = rank;
        }
    }

    /// Fold `other` in (the sketch of the union).
    pub fn merge(&mut self, other: &Hll) {
        for (a, b) in self.registers.iter_mut().zip(other.registers.iter()) {
            *a = (*a).max(*b);
        }
    }

    pub fn estimate(&self) -> f64 {
        let m = REGISTERS as f64;
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let sum: f64 = self.registers.iter().map(|&r| 2f64.powi(-(r as i32))).sum();
        let raw = alpha * m * m / sum;
        let zeros = self.registers.iter().filter(|&&r| r == 0).count();
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }
}

/// The keys of one window.
#[derive(Debug, Clone, Default)]
struct Generation {
    exact: HashSet<u64, RandomState>,
    /// Present once the exact set overflowed in this generation.
    sketch: Option<Hll>,
    /// Keys of `exact` the previous generation did not hold (for the exact union count).
    fresh: usize,
}

/// One series' tracker.
#[derive(Debug, Clone)]
pub struct CardinalityTracker {
    cap: usize,
    window: Option<Duration>,
    /// Start of the current generation.
    epoch: Instant,
    current: Generation,
    previous: Generation,
}

/// What an observation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    Known,
    New,
    /// The exact set was full and did not hold this key.
    Overflow,
}

impl CardinalityTracker {
    /// `cap` distinct hashes kept exactly per generation (at least 1); generations of `window`
    /// (`None` or zero: one generation forever).
    pub fn new(cap: usize, window: Option<Duration>, now: Instant) -> Self {
        Self {
            cap: cap.max(1),
            window: window.filter(|w| !w.is_zero()),
            epoch: now,
            current: Generation::default(),
            previous: Generation::default(),
        }
    }

    /// Rotate the generations `now` calls for (also run before reading the estimate, so keys
    /// age out without traffic).
    pub fn roll(&mut self, now: Instant) {
        let Some(w) = self.window else { return };
        let age = now.saturating_duration_since(self.epoch);
        if age < w {
            return;
        }
        let windows = (age.as_nanos() / w.as_nanos()) as u32;
        let old = std::mem::take(&mut self.current);
        // One window on: the current generation becomes the previous one. More: the window
        // before now saw no traffic at all (or it would have rolled), so nothing is recent.
        self.previous = if windows == 1 {
            old
        } else {
            Generation::default()
        };
        self.epoch += w * windows;
    }

    pub fn observe(&mut self, hash: u64, now: Instant) -> Observed {
        self.roll(now);
        let g = &mut self.current;
        if let Some(s) = g.sketch.as_mut() {
            s.insert(hash);
        }
        if g.exact.contains(&hash) {
            return Observed::Known;
        }
        if g.exact.len() < self.cap {
            g.exact.insert(hash);
            if !self.previous.exact.contains(&hash) {
                g.fresh += 1;
            }
            return Observed::New;
        }
        if g.sketch.is_none() {
            let mut s = Hll::default();
            for &h in &g.exact {
                s.insert(h);
            }
            s.insert(hash);
            g.sketch = Some(s);
        }
        Observed::Overflow
    }

    /// Distinct keys in the current and previous generation: exact while neither overflowed,
    /// the merged sketches' estimate (never below the exact union) otherwise.
    pub fn estimate(&self) -> f64 {
        let exact_union = (self.previous.exact.len() + self.current.fresh) as f64;
        if self.current.sketch.is_none() && self.previous.sketch.is_none() {
            return exact_union;
        }
        let mut merged = Hll::default();
        for g in [&self.current, &self.previous] {
            match &g.sketch {
                Some(s) => merged.merge(s),
                None => g.exact.iter().for_each(|&h| merged.insert(h)),
            }
        }
        merged.estimate().max(exact_union)
    }

    /// Hashes held exactly right now (both generations).
    pub fn exact_keys(&self) -> usize {
        self.current.exact.len() + self.previous.exact.len()
    }

    /// Bytes this tracker can hold at most, whatever the traffic: per generation an exact set
    /// at cap and a sketch.
    pub fn memory_bound(&self) -> usize {
        Self::memory_bound_for(self.cap)
    }

    /// [`Self::memory_bound`] for a given cap.
    pub fn memory_bound_for(cap: usize) -> usize {
        // hashbrown: a power of two of buckets above cap * 8/7, 8 bytes a hash + 1 control byte
        // each, plus one group of trailing control bytes.
        let buckets = (cap.max(1) * 8 / 7 + 1).next_power_of_two().max(4);
        let set = buckets * 9 + 16;
        2 * (set + REGISTERS + std::mem::size_of::<Generation>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::hash_key;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn small_sets_are_exact() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(100, None, t0);
        for i in 0..30 {
            let o = t.observe(hash_key(&format!("k{}", i % 3)), t0);
            assert_eq!(
                o,
                if i < 3 {
                    Observed::New
                } else {
                    Observed::Known
                }
            );
        }
        assert_eq!(t.estimate(), 3.0);
        assert!(t.current.sketch.is_none(), "no sketch below the cap");
    }

    #[test]
    fn past_the_cap_overflow_is_reported_and_the_estimate_keeps_working() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(1000, None, t0);
        let mut overflows = 0;
        for i in 0..50_000 {
            if t.observe(hash_key(&format!("key-{i}")), t0) == Observed::Overflow {
                overflows += 1;
            }
        }
        assert_eq!(overflows, 49_000);
        let e = t.estimate();
        assert!((e - 50_000.0).abs() / 50_000.0 < 0.05, "estimate {e}");
        assert!(t.exact_keys() <= 1000);
    }

    #[test]
    fn just_past_the_cap_the_lazily_seeded_sketch_is_accurate() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(100, None, t0);
        for i in 0..2000 {
            t.observe(hash_key(&format!("k-{i}")), t0);
        }
        let e = t.estimate();
        assert!((e - 2000.0).abs() / 2000.0 < 0.05, "estimate {e}");
    }

    #[test]
    fn keys_age_out_after_two_windows() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(100, Some(MIN), t0);
        for i in 0..10 {
            t.observe(hash_key(&format!("old-{i}")), t0);
        }
        // One window on: old keys still count, new ones add.
        let t1 = t0 + MIN + Duration::from_secs(1);
        for i in 0..5 {
            t.observe(hash_key(&format!("new-{i}")), t1);
        }
        // A key seen in both generations counts once.
        t.observe(hash_key("old-0"), t1);
        assert_eq!(t.estimate(), 15.0);
        // Two windows on: only the keys of the previous window remain.
        t.roll(t0 + 2 * MIN + Duration::from_secs(1));
        assert_eq!(t.estimate(), 6.0);
        // A long silence: nothing is recent.
        t.roll(t0 + 10 * MIN);
        assert_eq!(t.estimate(), 0.0);
    }

    #[test]
    fn overflow_state_resets_with_the_window_and_the_union_is_estimated() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(50, Some(MIN), t0);
        for i in 0..1000 {
            t.observe(hash_key(&format!("a-{i}")), t0);
        }
        let t1 = t0 + MIN;
        assert_eq!(t.observe(hash_key("b-0"), t1), Observed::New);
        for i in 1..40 {
            t.observe(hash_key(&format!("b-{i}")), t1);
        }
        let e = t.estimate();
        assert!((e - 1040.0).abs() / 1040.0 < 0.05, "estimate {e}");
        t.roll(t0 + 2 * MIN);
        assert_eq!(t.estimate(), 40.0);
    }

    #[test]
    fn memory_bound_covers_a_full_generation() {
        let t0 = Instant::now();
        let mut t = CardinalityTracker::new(1000, None, t0);
        for i in 0..5000 {
            t.observe(hash_key(&format!("k-{i}")), t0);
        }
        let held = t.current.exact.capacity() * 9 + REGISTERS;
        assert!(held <= t.memory_bound(), "{held} > {}", t.memory_bound());
    }

    #[test]
    fn hll_is_close_on_its_own() {
        let mut h = Hll::default();
        for i in 0..200_000 {
            h.insert(hash_key(&format!("x{i}")));
        }
        let e = h.estimate();
        assert!((e - 200_000.0).abs() / 200_000.0 < 0.05, "estimate {e}");
    }
}
