//! The hottest routing keys of a model, in fixed memory: space-saving top-k with decay.
//!
//! Space-saving keeps `k` counters. A key that has one adds to it; a new key takes the smallest
//! counter over and inherits its count as possible overcount (`error`). Any key whose true share
//! is above 1/k is guaranteed to be listed, and a listed count overestimates by at most its
//! `error`. Counts decay exponentially (halving every `half_life`), so shares describe recent
//! traffic and a key that cooled down is displaced. Cost per observation: a scan of `k` hashes
//! and, for a key not listed, of `k` counts (each kept in an array of its own, so a scan reads
//! only what it compares).
//! Only key hashes are kept. Time is passed in, so tests need no sleeping.

use std::time::{Duration, Instant};

use crate::vocab::KeySource;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotKey {
    pub hash: u64,
    /// The key source of its latest observation.
    pub source: KeySource,
    /// Decayed count (an overestimate by at most `error`).
    pub count: f64,
    pub error: f64,
}

#[derive(Debug, Clone)]
pub struct SpaceSaving {
    k: usize,
    half_life: Option<Duration>,
    /// The listed keys' hashes, counts, and sources and errors, entry by entry.
    hashes: Vec<u64>,
    counts: Vec<f64>,
    rest: Vec<(KeySource, f64)>,
    /// Decayed count of every observation.
    total: f64,
    decayed_at: Instant,
}

impl SpaceSaving {
    /// `k` counters (0 disables); `half_life` of `None` or zero never decays.
    pub fn new(k: usize, half_life: Option<Duration>, now: Instant) -> Self {
        Self {
            k,
            half_life: half_life.filter(|h| !h.is_zero()),
            hashes: Vec::with_capacity(k),
            counts: Vec::with_capacity(k),
            rest: Vec::with_capacity(k),
            total: 0.0,
            decayed_at: now,
        }
    }

    fn decay(&mut self, now: Instant) {
        let Some(h) = self.half_life else { return };
        let dt = now.saturating_duration_since(self.decayed_at);
        // Decaying in small steps costs a scan; a 1/16 half-life granularity is plenty.
        if dt < h / 16 {
            return;
        }
        let f = 0.5f64.powf(dt.as_secs_f64() / h.as_secs_f64());
        for count in &mut self.counts {
            *count *= f;
        }
        for (_, error) in &mut self.rest {
            *error *= f;
        }
        self.total *= f;
        self.decayed_at = now;
    }

    pub fn observe(&mut self, hash: u64, source: KeySource, now: Instant) {
        if self.k == 0 {
            return;
        }
        self.decay(now);
        self.total += 1.0;
        if let Some(i) = self.hashes.iter().position(|&h| h == hash) {
            self.counts[i] += 1.0;
            self.rest[i].0 = source;
            return;
        }
        if self.hashes.len() < self.k {
            self.hashes.push(hash);
            self.counts.push(1.0);
            self.rest.push((source, 0.0));
            return;
        }
        // The first of the smallest counts (all are finite and not negative).
        let (mut min, mut least) = (0, f64::INFINITY);
        for (i, &count) in self.counts.iter().enumerate() {
            if count < least {
                (min, least) = (i, count);
            }
        }
        self.hashes[min] = hash;
        self.counts[min] = least + 1.0;
        self.rest[min] = (source, least);
    }

    /// The listed keys, hottest first, with the decayed total they are shares of.
    pub fn top(&mut self, now: Instant) -> (Vec<HotKey>, f64) {
        self.decay(now);
        let mut v: Vec<HotKey> = (self.hashes.iter().zip(&self.counts).zip(&self.rest))
            .map(|((&hash, &count), &(source, error))| HotKey {
                hash,
                source,
                count,
                error,
            })
            .collect();
        v.sort_by(|a, b| b.count.total_cmp(&a.count).then(a.hash.cmp(&b.hash)));
        (v, self.total)
    }

    /// Bytes this structure holds at most.
    pub fn memory_bound(&self) -> usize {
        let entry = std::mem::size_of::<u64>()
            + std::mem::size_of::<f64>()
            + std::mem::size_of::<(KeySource, f64)>();
        std::mem::size_of::<Self>() + self.k * entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: KeySource = KeySource::ExplicitHeader;

    /// Space-saving as its definition reads, one record per counter (no decay).
    fn reference(k: usize, stream: &[(u64, KeySource)]) -> Vec<HotKey> {
        let mut entries: Vec<HotKey> = Vec::new();
        for &(hash, source) in stream {
            if let Some(e) = entries.iter_mut().find(|e| e.hash == hash) {
                e.count += 1.0;
                e.source = source;
            } else if entries.len() < k {
                entries.push(HotKey {
                    hash,
                    source,
                    count: 1.0,
                    error: 0.0,
                });
            } else {
                let min = entries
                    .iter_mut()
                    .min_by(|a, b| a.count.total_cmp(&b.count))
                    .unwrap();
                *min = HotKey {
                    hash,
                    source,
                    count: min.count + 1.0,
                    error: min.count,
                };
            }
        }
        entries.sort_by(|a, b| b.count.total_cmp(&a.count).then(a.hash.cmp(&b.hash)));
        entries
    }

    #[test]
    fn lists_what_the_definition_lists() {
        let t0 = Instant::now();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for k in [1, 2, 5, 20] {
            let stream: Vec<(u64, KeySource)> = (0..5_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // a few hot keys among many cold ones
                    let hash = if x.is_multiple_of(3) { x % 4 } else { x % 500 };
                    let source = [SRC, KeySource::SessionHeader][(x >> 20) as usize % 2];
                    (hash, source)
                })
                .collect();
            let mut s = SpaceSaving::new(k, None, t0);
            for &(hash, source) in &stream {
                s.observe(hash, source, t0);
            }
            assert_eq!(s.top(t0), (reference(k, &stream), 5_000.0), "k = {k}");
        }
    }

    #[test]
    fn heavy_keys_are_found_among_many_light_ones() {
        let t0 = Instant::now();
        let mut s = SpaceSaving::new(10, None, t0);
        for i in 0..10_000u64 {
            // Key 1 gets 30%, key 2 gets 15%, the rest is spread over thousands of keys.
            let h = match i % 20 {
                0..=5 => 1,
                6..=8 => 2,
                _ => 1000 + i,
            };
            s.observe(h, SRC, t0);
        }
        let (top, total) = s.top(t0);
        assert_eq!(total, 10_000.0);
        assert_eq!(top[0].hash, 1);
        assert_eq!(top[1].hash, 2);
        let share = top[0].count / total;
        assert!((0.30..0.32).contains(&share), "share {share}");
        assert!((top[0].count - top[0].error) / total <= 0.30 + 1e-9);
        assert!(top.len() <= 10);
    }

    #[test]
    fn a_key_that_cools_down_is_displaced() {
        let t0 = Instant::now();
        let h = Duration::from_secs(10);
        let mut s = SpaceSaving::new(2, Some(h), t0);
        for _ in 0..100 {
            s.observe(7, SRC, t0);
        }
        // A minute later (six half-lives) another key is the hot one.
        let t1 = t0 + Duration::from_secs(60);
        for _ in 0..20 {
            s.observe(8, SRC, t1);
        }
        let (top, total) = s.top(t1);
        assert_eq!(top[0].hash, 8);
        assert!(top[0].count / total > 0.8, "{top:?} of {total}");
    }

    #[test]
    fn zero_k_keeps_nothing() {
        let t0 = Instant::now();
        let mut s = SpaceSaving::new(0, None, t0);
        s.observe(1, SRC, t0);
        assert!(s.top(t0).0.is_empty());
    }
}
