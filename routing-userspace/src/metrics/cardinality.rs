//! Approximate unique routing keys per series, in bounded memory.
//!
//! Each (model, strategy, key_source) series keeps the hashes of the first `cap` distinct keys
//! exactly (small sets, the common case, are then counted without error) and a HyperLogLog
//! sketch of every key (4096 one-byte registers, about 1.6% standard error) that keeps
//! estimating once the exact set is full. A key that arrives while the exact set is full and
//! does not already hold it counts as an overflow. Only 64-bit key hashes are ever stored.

use std::collections::HashSet;

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

/// One series' tracker.
#[derive(Debug, Clone)]
pub struct CardinalityTracker {
    cap: usize,
    exact: HashSet<u64>,
    sketch: Hll,
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
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            exact: HashSet::new(),
            sketch: Hll::default(),
        }
    }

    pub fn observe(&mut self, hash: u64) -> Observed {
        self.sketch.insert(hash);
        if self.exact.contains(&hash) {
            return Observed::Known;
        }
        if self.exact.len() < self.cap {
            self.exact.insert(hash);
            return Observed::New;
        }
        Observed::Overflow
    }

    /// Exact below the cap, the sketch's estimate beyond it.
    pub fn estimate(&self) -> f64 {
        if self.exact.len() < self.cap {
            self.exact.len() as f64
        } else {
            self.sketch.estimate().max(self.exact.len() as f64)
        }
    }

    /// Bytes this tracker can hold at most (the exact set at cap plus the sketch).
    pub fn memory_bound(&self) -> usize {
        // A HashSet<u64> at capacity: 8 bytes a key + 1 control byte, over a 7/8 load factor.
        self.cap * 9 * 8 / 7 + REGISTERS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::hash_key;

    #[test]
    fn small_sets_are_exact() {
        let mut t = CardinalityTracker::new(100);
        for i in 0..30 {
            let o = t.observe(hash_key(&format!("k{}", i % 3)));
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
    }

    #[test]
    fn past_the_cap_overflow_is_reported_and_the_estimate_keeps_working() {
        let mut t = CardinalityTracker::new(1000);
        let mut overflows = 0;
        for i in 0..50_000 {
            if t.observe(hash_key(&format!("key-{i}"))) == Observed::Overflow {
                overflows += 1;
            }
        }
        assert_eq!(overflows, 49_000);
        let e = t.estimate();
        assert!((e - 50_000.0).abs() / 50_000.0 < 0.05, "estimate {e}");
        assert!(t.exact.len() <= 1000);
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
