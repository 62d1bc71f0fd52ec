//! Consistent hashing with virtual nodes (spec: "Consistent Hashing").
//!
//! Each member is placed on a 64-bit ring at `vnodes` points derived only from its own id, so
//! adding or removing a member moves only the keys whose nearest point changes: about 1/N of
//! them, and only to (or from) that member. A key walks clockwise from its hash; the distinct
//! members met in order are the candidates (the first is the pick, the rest are alternates).

use super::SeenSet;

/// Virtual nodes per member. 160 keeps the busiest of 8 pods within about 1.3x of the mean
/// share (see the property tests) while the ring of a 64-pod model stays ~10k points.
pub const DEFAULT_VNODES: u32 = 160;

#[derive(Debug, Clone, Default)]
pub struct Ring {
    /// (point, member index), sorted by point.
    points: Vec<(u64, u32)>,
    /// First-level index: `starts[b]` is the first point whose top `index_bits` bits are `>= b`,
    /// so a lookup searches only the few points of one bucket instead of the whole ring (a
    /// binary search over a 1,000-pod ring of 160,000 points misses the cache at most steps).
    starts: Vec<u32>,
    index_bits: u32,
    members: usize,
}

/// Buckets of the first-level index: about one per point, at most 2^16 (256 KiB).
fn index_bits(points: usize) -> u32 {
    (usize::BITS - points.max(1).leading_zeros()).clamp(1, 16)
}

fn point(id: &str, vnode: u32) -> u64 {
    let mut buf = Vec::with_capacity(id.len() + 5);
    buf.extend_from_slice(id.as_bytes());
    buf.push(b'#');
    buf.extend_from_slice(&vnode.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&buf)
}

impl Ring {
    /// A ring over `ids` (member `i` is `ids[i]`), `vnodes` points each.
    pub fn new<S: AsRef<str>>(ids: &[S], vnodes: u32) -> Self {
        let mut points = Vec::with_capacity(ids.len() * vnodes as usize);
        for (i, id) in ids.iter().enumerate() {
            for v in 0..vnodes {
                points.push((point(id.as_ref(), v), i as u32));
            }
        }
        // Ties (astronomically rare) break by member index, so the ring is deterministic.
        points.sort_unstable();
        let bits = index_bits(points.len());
        let mut starts = Vec::with_capacity((1 << bits) + 1);
        let mut i = 0;
        for b in 0..=(1u64 << bits) {
            while i < points.len() && (points[i].0 >> (64 - bits)) < b {
                i += 1;
            }
            starts.push(i as u32);
        }
        Self {
            points,
            starts,
            index_bits: bits,
            members: ids.len(),
        }
    }

    /// The first point at or after `hash` (`points.len()` past the last one).
    #[inline]
    fn first_at(&self, hash: u64) -> usize {
        let b = (hash >> (64 - self.index_bits)) as usize;
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        lo + self.points[lo..hi].partition_point(|&(p, _)| p < hash)
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn members(&self) -> usize {
        self.members
    }

    pub fn points(&self) -> usize {
        self.points.len()
    }

    /// The member a key maps to.
    pub fn pick(&self, hash: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.first_at(hash) % self.points.len();
        Some(self.points[i].1 as usize)
    }

    /// Distinct members in clockwise order from `hash`, produced lazily.
    pub fn walk(&self, hash: u64) -> RingWalk<'_> {
        RingWalk {
            ring: self,
            state: WalkState::new(self, hash),
        }
    }
}

/// Where a walk around the ring stands, kept apart from the ring so that a decision can own it
/// while the ring lives in the shared routing table.
#[derive(Debug, Clone)]
pub struct WalkState {
    pos: usize,
    steps: usize,
    found: usize,
    seen: SeenSet,
}

impl WalkState {
    pub fn new(ring: &Ring, hash: u64) -> Self {
        let pos = if ring.points.is_empty() {
            0
        } else {
            ring.first_at(hash)
        };
        Self {
            pos,
            steps: 0,
            found: 0,
            seen: SeenSet::new(ring.members),
        }
    }

    /// The next member not met before, or `None` once every member was met.
    #[inline]
    pub fn next(&mut self, ring: &Ring) -> Option<usize> {
        let len = ring.points.len();
        while self.found < ring.members && self.steps < len {
            let m = ring.points[(self.pos + self.steps) % len].1 as usize;
            self.steps += 1;
            if self.seen.insert(m) {
                self.found += 1;
                return Some(m);
            }
        }
        None
    }
}

/// A walk for one key, as an iterator.
pub struct RingWalk<'r> {
    ring: &'r Ring,
    state: WalkState,
}

impl Iterator for RingWalk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.state.next(self.ring)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pods(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("10.0.{}.{}:8000", i / 200, i % 200 + 1))
            .collect()
    }

    fn keys(n: u64, salt: u64) -> impl Iterator<Item = u64> {
        (0..n).map(move |i| crate::keys::hash_key(&format!("key-{salt}-{i}")))
    }

    #[test]
    fn empty_ring_picks_nothing() {
        let r = Ring::new::<String>(&[], DEFAULT_VNODES);
        assert!(r.is_empty());
        assert_eq!(r.pick(42), None);
        assert_eq!(r.walk(42).count(), 0);
    }

    #[test]
    fn candidates_start_with_the_pick_and_list_every_member_once() {
        let r = Ring::new(&pods(5), DEFAULT_VNODES);
        for h in keys(200, 1) {
            let c: Vec<usize> = r.walk(h).collect();
            assert_eq!(c[0], r.pick(h).unwrap());
            let mut s = c.clone();
            s.sort();
            assert_eq!(s, vec![0, 1, 2, 3, 4]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn the_index_finds_what_a_search_of_the_whole_ring_finds(
            n in 1usize..40,
            vnodes in 1u32..200,
            keys in proptest::collection::vec(any::<u64>(), 1..64),
        ) {
            let r = Ring::new(&pods(n), vnodes);
            let firsts = r.points.first().map(|p| p.0).into_iter();
            let lasts = r.points.last().map(|p| p.0).into_iter();
            let edges = [0, 1, u64::MAX, u64::MAX - 1, 1 << 63];
            for k in keys.into_iter().chain(edges).chain(firsts).chain(lasts) {
                let want = r.points.partition_point(|&(p, _)| p < k);
                prop_assert_eq!(r.first_at(k), want, "key {:#x}", k);
            }
        }

        #[test]
        fn same_key_same_member(n in 1usize..20, key in any::<u64>()) {
            let a = Ring::new(&pods(n), DEFAULT_VNODES);
            let b = Ring::new(&pods(n), DEFAULT_VNODES);
            prop_assert_eq!(a.pick(key), b.pick(key));
            prop_assert_eq!(a.pick(key), a.pick(key));
        }

        /// On join, a key either stays or moves to the new pod; about 1/(N+1) move.
        #[test]
        fn join_moves_only_to_the_new_pod(n in 2usize..16, salt in any::<u64>()) {
            let ids = pods(n + 1);
            let before = Ring::new(&ids[..n], DEFAULT_VNODES);
            let after = Ring::new(&ids, DEFAULT_VNODES);
            let total = 4000u64;
            let mut moved = 0u64;
            for h in keys(total, salt) {
                let (b, a) = (before.pick(h).unwrap(), after.pick(h).unwrap());
                if a != b {
                    prop_assert_eq!(a, n, "a key moved between two old pods");
                    moved += 1;
                }
            }
            let expect = total as f64 / (n + 1) as f64;
            prop_assert!((moved as f64) < expect * 1.6 && (moved as f64) > expect * 0.5,
                "moved {} of {}, expected about {:.0}", moved, total, expect);
        }

        /// On leave, only the removed pod's keys move.
        #[test]
        fn leave_moves_only_the_removed_pods_keys(n in 3usize..16, gone in 0usize..16, salt in any::<u64>()) {
            let gone = gone % n;
            let ids = pods(n);
            let kept: Vec<String> = ids.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, s)| s.clone()).collect();
            let before = Ring::new(&ids, DEFAULT_VNODES);
            let after = Ring::new(&kept, DEFAULT_VNODES);
            for h in keys(3000, salt) {
                let b = &ids[before.pick(h).unwrap()];
                let a = &kept[after.pick(h).unwrap()];
                if b != &ids[gone] {
                    prop_assert_eq!(a, b, "a key of a surviving pod moved");
                }
            }
        }

        /// With the default vnode count, no pod gets more than 1.45x its fair share.
        #[test]
        fn bounded_spread(n in 2usize..12, salt in any::<u64>()) {
            let r = Ring::new(&pods(n), DEFAULT_VNODES);
            let total = 20_000u64;
            let mut hits = vec![0u64; n];
            for h in keys(total, salt) {
                hits[r.pick(h).unwrap()] += 1;
            }
            let mean = total as f64 / n as f64;
            let max = *hits.iter().max().unwrap() as f64;
            prop_assert!(max / mean < 1.45, "max/mean = {:.2} for {:?}", max / mean, hits);
        }
    }
}
