//! Cache-aware choice: the pod that holds the longest leading run of the request's prompt chain
//! (by the proxy's own index of what it sent where), among the pods under the hash-balance
//! bound.
//!
//! Ties are common: a shared system prompt is on every pod that served it. They break by the
//! bounded ring walk of the first link that did *not* match everywhere it could (the link after
//! the matched run), so a new conversation behind a shared system prompt lands where the hash of
//! its own first message says, the same on every proxy, and conversations spread like session
//! affinity instead of piling on whichever pod saw the system prompt first. With no match at all
//! this is the bounded ring pick of the chain's first link, so proxies that share no state still
//! place new prefixes alike. Alternates continue that same walk.
//!
//! Pure: the matched depths come from the index, the loads from the gauge, both read once.

use super::bounded::BoundedWalk;
use super::ring::Ring;

/// The order a cache-aware decision tries pods in: the pick, then the rest of the walk.
#[derive(Debug, Clone)]
pub struct CacheAwareOrder {
    pick: Option<usize>,
    handed_out_pick: bool,
    walk: BoundedWalk,
}

impl CacheAwareOrder {
    pub fn next(&mut self, ring: &Ring) -> Option<usize> {
        if !self.handed_out_pick {
            self.handed_out_pick = true;
            if self.pick.is_some() {
                return self.pick;
            }
        }
        loop {
            let m = self.walk.next(ring)?;
            if Some(m) != self.pick {
                return Some(m);
            }
        }
    }
}

/// What the index and the loads decided for one request.
#[derive(Debug, Clone)]
pub struct CacheAwareChoice {
    /// The pick (`None` only for an empty ring).
    pub pick: Option<usize>,
    /// Links of the chain the pick holds.
    pub depth: u32,
    /// The pod the longest match prefers when the bound turned it away.
    pub spilled_from: Option<usize>,
    pub order: CacheAwareOrder,
}

/// Choose among the ring's members. `chain` is the request's prompt chain (at least one link),
/// `depths[i]` how many of its leading links member `i` holds, `loads[i]` its load, `bound` the
/// hash-balance bound (`None` = off).
pub fn choose(
    ring: &Ring,
    chain: &[u64],
    depths: &[u32],
    loads: &[u64],
    bound: Option<u64>,
) -> CacheAwareChoice {
    let n = ring.members();
    let depth = |i: usize| depths.get(i).copied().unwrap_or(0);
    let limit = bound.unwrap_or(u64::MAX);
    let load = |i: usize| loads.get(i).copied().unwrap_or(0);
    let under = |i: usize| load(i) < limit;
    // With c >= 1 some pod is always under the bound; if loads say otherwise, ignore it.
    let any_under = (0..n).any(under);
    let eligible = |i: usize| !any_under || under(i);
    let best = (0..n)
        .filter(|&i| eligible(i))
        .map(depth)
        .max()
        .unwrap_or(0);
    let tie_link = |d: u32| chain[(d as usize).min(chain.len().saturating_sub(1))];

    let walk_limit = if any_under { limit } else { u64::MAX };
    let walk = BoundedWalk::new(ring, tie_link(best), loads, walk_limit);
    let pick = walk
        .clone()
        .iter(ring)
        .find(|&i| eligible(i) && depth(i) == best);
    // Where the longest match would go without the bound.
    let best_all = (0..n).map(depth).max().unwrap_or(0);
    let preferred = ring
        .walk(tie_link(best_all))
        .find(|&i| depth(i) == best_all);
    let spilled_from = match (preferred, pick) {
        (Some(p), Some(q)) if p != q => Some(p),
        _ => None,
    };
    CacheAwareChoice {
        pick,
        depth: pick.map_or(0, depth),
        spilled_from,
        order: CacheAwareOrder {
            pick,
            handed_out_pick: false,
            walk,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::ring::DEFAULT_VNODES;
    use super::*;
    use proptest::prelude::*;

    fn ring(n: usize) -> Ring {
        let ids: Vec<String> = (0..n).map(|i| format!("10.2.0.{}:8000", i + 1)).collect();
        Ring::new(&ids, DEFAULT_VNODES)
    }

    fn all(ring: &Ring, mut c: CacheAwareChoice) -> Vec<usize> {
        std::iter::from_fn(|| c.order.next(ring)).collect()
    }

    #[test]
    fn no_match_is_the_bounded_ring_pick_of_the_first_link() {
        let r = ring(5);
        let chain = [11, 22, 33];
        let c = choose(&r, &chain, &[0; 5], &[0; 5], Some(2));
        assert_eq!(c.pick, r.pick(11));
        assert_eq!(c.depth, 0);
        assert_eq!(c.spilled_from, None);
        assert_eq!(all(&r, c), r.walk(11).collect::<Vec<_>>());
    }

    #[test]
    fn the_longest_match_wins_and_a_full_pod_spills_to_the_next_longest() {
        let r = ring(4);
        let chain = [1, 2, 3, 4];
        let depths = [1, 3, 2, 1];
        let c = choose(&r, &chain, &depths, &[0; 4], Some(5));
        assert_eq!((c.pick, c.depth, c.spilled_from), (Some(1), 3, None));
        // Pod 1 at the bound: pod 2 holds the next longest run.
        let c = choose(&r, &chain, &depths, &[0, 5, 0, 0], Some(5));
        assert_eq!((c.pick, c.depth, c.spilled_from), (Some(2), 2, Some(1)));
        let order = all(&r, c);
        assert_eq!(order[0], 2);
        assert_eq!(*order.last().unwrap(), 1, "the full pod comes last");
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3]);
    }

    #[test]
    fn ties_break_by_the_walk_of_the_first_unmatched_link() {
        let r = ring(6);
        // Every pod holds the shared first link; the second decides.
        let chain = [7, 0xfeed_beef, 9];
        let c = choose(&r, &chain, &[1; 6], &[0; 6], None);
        assert_eq!(c.pick, r.pick(0xfeed_beef));
        assert_eq!(c.depth, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The pick holds the longest run among the pods under the bound, and it is under the
        /// bound whenever any pod is; every pod appears once in the order.
        #[test]
        fn the_longest_match_among_pods_under_the_bound_wins(
            n in 1usize..12,
            chain in proptest::collection::vec(any::<u64>(), 1..8),
            raw_depths in proptest::collection::vec(0u32..8, 12),
            raw_loads in proptest::collection::vec(0u64..6, 12),
            bound in 1u64..6,
        ) {
            let r = ring(n);
            let depths: Vec<u32> = raw_depths[..n].iter().map(|&d| d.min(chain.len() as u32)).collect();
            let loads = &raw_loads[..n];
            let c = choose(&r, &chain, &depths, loads, Some(bound));
            let pick = c.pick.unwrap();
            let under: Vec<usize> = (0..n).filter(|&i| loads[i] < bound).collect();
            if !under.is_empty() {
                prop_assert!(loads[pick] < bound);
                let best = under.iter().map(|&i| depths[i]).max().unwrap();
                prop_assert_eq!(depths[pick], best);
                prop_assert_eq!(c.depth, best);
            }
            let order = all(&r, c);
            prop_assert_eq!(order[0], pick);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }
    }
}
