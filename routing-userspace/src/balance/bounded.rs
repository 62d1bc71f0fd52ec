//! Bounded-load consistent hashing (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
//! with Bounded Loads", SODA 2018), for every ring strategy.
//!
//! Affinity alone sends every request that shares a key to one pod: with one hot system prompt
//! that pod queues while the others idle. A bound caps that: a pod takes a new request only
//! while its load is under the bound; a pod at the bound is passed over and the walk goes on
//! clockwise to the next distinct member under it. Nothing is re-hashed, so a key's spill target
//! is as stable as its first choice, and under the bound the pick is exactly the plain ring's.
//!
//! **The bound.** For `n` candidates whose loads add up to `m` (load = requests in flight by
//! the gauge plus unexpired reservations, as least-loaded reads it), the mean load counts the
//! request being placed, as in the paper: `mean = (m + 1) / n`. The bound is
//! `max(ceil(c * mean), floor)`. With `c >= 1`, `n * bound >= m + 1 > m`, so some candidate is
//! always under it. `c = 0` turns the bound off: the walk is the spec's plain ring.
//!
//! The walk is a pure function of (ring, hash, loads, bound): the loads are read once, when the
//! decision is made, and alternates after a spill continue the same walk (members under the
//! bound first, in ring order, then the members at it, in ring order).

use super::ring::{Ring, WalkState};
use super::SeenSet;

/// Thousandths: the factor is kept as an integer so settings compare exactly.
const MILLI: u64 = 1000;

/// The largest factor accepted (beyond it the bound never bites in practice).
pub const MAX_FACTOR_MILLI: u32 = 100_000;

/// The hash-balance settings of one ring: the factor `c` and the floor of the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashBalance {
    /// `c` in thousandths; 0 = off.
    pub factor_milli: u32,
    /// The least bound: a pod under this many in flight always takes its keys.
    pub floor: u64,
}

impl HashBalance {
    /// The spec's plain ring.
    pub const OFF: HashBalance = HashBalance {
        factor_milli: 0,
        floor: 0,
    };

    /// Whether the bound applies at all.
    pub fn is_on(&self) -> bool {
        self.factor_milli > 0
    }

    /// `c` as a number (for logs and `/debug/routing`).
    pub fn factor(&self) -> f64 {
        f64::from(self.factor_milli) / MILLI as f64
    }

    /// The bound for `n` candidates whose loads add up to `total`, or `None` when the bound is
    /// off (or there is no candidate): `max(ceil(c * (total + 1) / n), floor)`.
    pub fn bound(&self, total: u64, n: usize) -> Option<u64> {
        if !self.is_on() || n == 0 {
            return None;
        }
        let num = u128::from(self.factor_milli) * (u128::from(total) + 1);
        let den = u128::from(MILLI) * n as u128;
        let ceil = num.div_ceil(den);
        Some(u64::try_from(ceil).unwrap_or(u64::MAX).max(self.floor))
    }

    /// These settings with a model's own overrides applied.
    pub fn overridden(self, o: &BalanceOverride) -> HashBalance {
        HashBalance {
            factor_milli: o.factor_milli.unwrap_or(self.factor_milli),
            floor: o.floor.unwrap_or(self.floor),
        }
    }
}

/// A model's own hash-balance settings (models file, Model annotations); `None` = the proxy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BalanceOverride {
    pub factor_milli: Option<u32>,
    pub floor: Option<u64>,
}

/// A factor or floor that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBalance {
    #[error("hash balance factor {0:?} must be 0 (off) or a number from 1 to 100")]
    Factor(String),
    #[error("hash balance floor {0:?} must be a whole number of requests (0 or more)")]
    Floor(String),
}

/// `"1.25"` -> 1250 thousandths; `"0"` turns the bound off. A factor below 1 would leave every
/// pod at the bound at once, so it is refused, as is anything that is not a plain number.
pub fn parse_factor(s: &str) -> Result<u32, BadBalance> {
    let bad = || BadBalance::Factor(s.to_owned());
    let v: f64 = s.trim().parse().map_err(|_| bad())?;
    if v == 0.0 {
        return Ok(0);
    }
    if !v.is_finite() || v < 1.0 {
        return Err(bad());
    }
    let milli = (v * MILLI as f64).round();
    if milli > f64::from(MAX_FACTOR_MILLI) {
        return Err(bad());
    }
    Ok(milli as u32)
}

/// A floor: a non-negative whole number.
pub fn parse_floor(s: &str) -> Result<u64, BadBalance> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| BadBalance::Floor(s.to_owned()))
}

/// A ring walk that passes over the members at or over the bound: those under it come first,
/// in ring order from the key's hash, then the others, in ring order.
#[derive(Debug, Clone)]
pub struct BoundedWalk {
    hash: u64,
    /// Members whose load is at or over the bound.
    full: SeenSet,
    first: WalkState,
    second: Option<WalkState>,
}

impl BoundedWalk {
    /// The walk for `hash`; `loads[i]` is member `i`'s load (missing members count as idle).
    pub fn new(ring: &Ring, hash: u64, loads: &[u64], bound: u64) -> Self {
        let mut full = SeenSet::new(ring.members());
        for (i, &load) in loads.iter().enumerate().take(ring.members()) {
            if load >= bound {
                full.insert(i);
            }
        }
        Self {
            hash,
            full,
            first: WalkState::new(ring, hash),
            second: None,
        }
    }

    /// The next candidate, or `None` once every member was handed out.
    pub fn next(&mut self, ring: &Ring) -> Option<usize> {
        while let Some(m) = self.first.next(ring) {
            if !self.full.contains(m) {
                return Some(m);
            }
        }
        let hash = self.hash;
        let second = self
            .second
            .get_or_insert_with(|| WalkState::new(ring, hash));
        while let Some(m) = second.next(ring) {
            if self.full.contains(m) {
                return Some(m);
            }
        }
        None
    }

    /// The walk as an iterator over `ring`.
    pub fn iter(self, ring: &Ring) -> BoundedIter<'_> {
        BoundedIter { ring, walk: self }
    }
}

/// A [`BoundedWalk`] with its ring, as an iterator.
pub struct BoundedIter<'r> {
    ring: &'r Ring,
    walk: BoundedWalk,
}

impl Iterator for BoundedIter<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.walk.next(self.ring)
    }
}

/// The member the plain ring picks for `hash` when the bound turns it away (the spill's origin),
/// or `None` when the plain pick is under the bound.
pub fn spilled_from(ring: &Ring, hash: u64, loads: &[u64], bound: u64) -> Option<usize> {
    let plain = ring.pick(hash)?;
    (loads.get(plain).copied().unwrap_or(0) >= bound).then_some(plain)
}

#[cfg(test)]
mod tests {
    use super::super::ring::DEFAULT_VNODES;
    use super::*;
    use proptest::prelude::*;

    fn pods(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.1.0.{}:8000", i + 1)).collect()
    }

    fn order(ring: &Ring, hash: u64, loads: &[u64], bound: u64) -> Vec<usize> {
        BoundedWalk::new(ring, hash, loads, bound)
            .iter(ring)
            .collect()
    }

    #[test]
    fn the_bound_counts_the_request_being_placed() {
        let b = HashBalance {
            factor_milli: 1250,
            floor: 0,
        };
        // 4 pods, nothing in flight: mean (0 + 1) / 4, ceil(1.25 * 0.25) = 1.
        assert_eq!(b.bound(0, 4), Some(1));
        // 11 in flight over 4 pods: mean 3, ceil(3.75) = 4.
        assert_eq!(b.bound(11, 4), Some(4));
        // 7 over 4: mean 2, exactly 2.5 -> 3.
        assert_eq!(b.bound(7, 4), Some(3));
        let floored = HashBalance { floor: 2, ..b };
        assert_eq!(floored.bound(0, 4), Some(2));
        assert_eq!(floored.bound(11, 4), Some(4));
        assert_eq!(HashBalance::OFF.bound(11, 4), None);
        assert_eq!(b.bound(3, 0), None);
    }

    #[test]
    fn factors_and_floors_parse_or_are_refused() {
        assert_eq!(parse_factor("1.25"), Ok(1250));
        assert_eq!(parse_factor(" 2 "), Ok(2000));
        assert_eq!(parse_factor("0"), Ok(0));
        assert_eq!(parse_factor("1"), Ok(1000));
        for bad in ["0.5", "-1", "abc", "", "NaN", "inf", "1000"] {
            assert!(parse_factor(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_floor("2"), Ok(2));
        assert_eq!(parse_floor("0"), Ok(0));
        for bad in ["-1", "1.5", "two", ""] {
            assert!(parse_floor(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_full_pick_spills_to_the_next_member_under_the_bound_then_comes_last() {
        let ring = Ring::new(&pods(4), DEFAULT_VNODES);
        let hash = 0x1234_5678_9abc_def0;
        let plain: Vec<usize> = ring.walk(hash).collect();
        let mut loads = [0u64; 4];
        loads[plain[0]] = 3;
        let got = order(&ring, hash, &loads, 3);
        assert_eq!(got, [plain[1], plain[2], plain[3], plain[0]]);
        assert_eq!(spilled_from(&ring, hash, &loads, 3), Some(plain[0]));
        assert_eq!(spilled_from(&ring, hash, &loads, 4), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Under the bound, the bounded walk is the plain ring walk, member for member.
        #[test]
        fn under_the_bound_it_is_the_plain_ring(
            n in 1usize..24,
            hash in any::<u64>(),
            raw in proptest::collection::vec(0u64..50, 24),
            headroom in 1u64..5,
        ) {
            let ring = Ring::new(&pods(n), DEFAULT_VNODES);
            let loads = &raw[..n];
            let bound = loads.iter().max().unwrap() + headroom;
            let plain: Vec<usize> = ring.walk(hash).collect();
            prop_assert_eq!(order(&ring, hash, loads, bound), plain);
            prop_assert_eq!(spilled_from(&ring, hash, loads, bound), None);
        }

        /// The pick is the plain ring's pick whenever that pod is under the bound, whatever the
        /// other pods carry.
        #[test]
        fn a_pick_under_the_bound_is_the_plain_pick(
            n in 1usize..24,
            hash in any::<u64>(),
            raw in proptest::collection::vec(0u64..50, 24),
            bound in 1u64..40,
        ) {
            let ring = Ring::new(&pods(n), DEFAULT_VNODES);
            let loads = &raw[..n];
            let plain = ring.pick(hash).unwrap();
            let pick = order(&ring, hash, loads, bound)[0];
            if loads[plain] < bound {
                prop_assert_eq!(pick, plain);
            } else if loads.iter().any(|&l| l < bound) {
                prop_assert!(loads[pick] < bound);
                // The spill goes to the first member under the bound in the plain walk order.
                let first_under = ring.walk(hash).find(|&m| loads[m] < bound).unwrap();
                prop_assert_eq!(pick, first_under);
            }
        }

        /// Placing requests one by one with the real bound (the mean counts the request being
        /// placed): no pod ever goes past the bound while another is under it, every order lists
        /// each member once, and with `c >= 1` someone is always under the bound.
        #[test]
        fn no_pod_exceeds_the_bound_while_another_is_under_it(
            n in 1usize..16,
            keys in proptest::collection::vec(any::<u64>(), 1..200),
            factor_milli in 1000u32..3000,
            floor in 0u64..4,
            finish_every in 2usize..7,
        ) {
            let ring = Ring::new(&pods(n), DEFAULT_VNODES);
            let balance = HashBalance { factor_milli, floor };
            let mut loads = vec![0u64; n];
            for (k, &hash) in keys.iter().enumerate() {
                let total: u64 = loads.iter().sum();
                let bound = balance.bound(total, n).unwrap();
                prop_assert!(loads.iter().any(|&l| l < bound), "nobody under {} in {:?}", bound, loads);
                let all = order(&ring, hash, &loads, bound);
                let mut sorted = all.clone();
                sorted.sort_unstable();
                prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                let pick = all[0];
                prop_assert!(loads[pick] < bound, "pick at {} with bound {}", loads[pick], bound);
                loads[pick] += 1;
                prop_assert!(loads[pick] <= bound);
                // Some requests finish, so loads go down as well as up.
                if k % finish_every == 0 {
                    if let Some(i) = (0..n).max_by_key(|&i| loads[i]) {
                        loads[i] = loads[i].saturating_sub(1);
                    }
                }
            }
        }

        /// `c = 0` is the spec's plain ring: no bound at all.
        #[test]
        fn factor_zero_is_the_plain_ring(total in any::<u32>(), n in 0usize..64, floor in 0u64..10) {
            let off = HashBalance { factor_milli: 0, floor };
            prop_assert_eq!(off.bound(u64::from(total), n), None);
            prop_assert!(!off.is_on());
        }
    }
}
