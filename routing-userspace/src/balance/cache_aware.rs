//! Cache-aware choice: the pod that holds the longest leading run of the request's prompt chain
//! (by the proxy's own index of what it sent where), among the pods under the hash-balance
//! bound.
//!
//! Ties are common: a shared system prompt is on every pod that served it. Matches within
//! [`TIE_LINKS`] of the longest count as equal, and among tied pods the first in the bounded
//! ring walk of the link after the longest matched run wins. That choice depends on the request
//! alone, never on this proxy's loads, so the proxies of a fleet (each with its own index and
//! its own view of the loads) send a conversation's next turn to the pod its earlier turns went
//! to, even through a proxy that never saw them: behind a shared system prompt, every proxy
//! ties at the prompt and walks from the conversation's first own link. New conversations
//! spread by that hash; the bound moves a pick only when its pod is full. The walk never starts
//! inside the first [`walk_from`] links ([`WALK_LINKS`] for a chain of twice that or more,
//! [`TIE_LINKS`] for a shorter one): a match that short counts as no match, and every pod ties.
//! A proxy of a fleet has seen an eighth of the traffic with 8 routers: one that holds a shared
//! system prompt nowhere would otherwise walk from a link inside the prompt (the same link for
//! every conversation behind it), one that holds it on one pod would send it there, and one
//! that holds it on two would walk from the link past it, so a conversation's turns scattered
//! (generated rag-chat, 8 routers: 0.92x the limit at max/mean 1.23 with two links; 0.98x at
//! 1.16 with eight).
//! A run at least half the pods already hold counts as held by a pod that is [`IDLE_GAP`] less
//! busy than every holder (one more copy costs one prefill; without this, pods that never got
//! a shared prompt longer than the tie margin would never get its conversations, while a
//! document such pods hold stays with them when load is even). With no match at all the pick
//! is the bounded ring pick of that same link, so proxies that share no state still place new
//! prefixes alike. Alternates continue the same walk.
//!
//! A proxy that routes alone (a fleet of one) knows what it sent every pod, so it also keeps
//! the pods' new content even: among tied pods it passes over those that would then have been
//! sent more than [`HELD_FACTOR`] times the mean of the new links lately (see
//! [`under_held_bound`] and [`crate::router::inflow`]). A few documents over a few pods then land
//! evenly (six over three: two each), where the hash alone often puts three on one pod, more
//! than an engine with two slots keeps. A fleet cannot agree on what each proxy sent (each
//! proxy sees its own share of the traffic: with the rule in every proxy, the conversation
//! trace fell from 1.00x to 0.93x the limit with 8 routers), so its proxies keep the hash,
//! unless every pod reports what its slots hold (llama.cpp's `/slots` with the prompts shown,
//! [`crate::signals::slot_prompts`]): that report is the same in every proxy, and the rule
//! then reads it (plus what this proxy sent since), while the pods' own matches find a
//! document wherever another proxy put it; where the tied pods all hold the prompt, a tie is
//! a matter of queues, and goes to the less loaded of the walk's first two; where none holds it,
//! each proxy takes the pod its rank in the fleet names, in one order of the pods for every
//! prompt, so that proxies that get new prompts at once do not compute them on one pod (see
//! [`Ties`]).
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
    /// Links of the chain the pick holds (as the index says, before any common run is counted).
    pub depth: u32,
    /// The pod the longest match prefers when the bound turned it away.
    pub spilled_from: Option<usize>,
    /// The pick is the hash's alone: no pod holds a match that counts, the bound moved nothing
    /// and no proxy-local count took part, so every proxy of a fleet picks this pod for the
    /// request (see [`agreed_holder`]).
    pub by_hash_alone: bool,
    pub order: CacheAwareOrder,
}

/// Links by which a match must beat another to count as longer: about 512 tokens of prompt.
/// A pod that lacks only a short shared prefix (a system prompt most pods hold) is as good as
/// one that has it, so such pods are not starved of new conversations; a document or an earlier
/// turn is many links long and still decides.
pub const TIE_LINKS: u32 = 2;

/// Leading links a match must pass to count at all, and where the walk of a tie starts: 8 links
/// of [`CUT_CHARS`](crate::keys::chain::CUT_CHARS), about 2,000 tokens, longer than most shared
/// system prompts, so every proxy walks from a link of the conversation's own, whatever it
/// knows of the prompt (12 links cost the Mooncake conversation trace's short conversations
/// their earlier turns: 0.94x the limit with 4 and 8 routers). A chain shorter than twice that
/// walks from [`TIE_LINKS`], so a short conversation's earlier turn still decides, and its
/// walk link moves once, when it grows past the threshold, not at every turn (half the chain
/// moved it at every turn: 0.96x with 4 routers on the same trace).
pub const WALK_LINKS: u32 = 8;

/// The links a match must pass to count, and where a tie walks from, for a chain of `links`
/// links (see [`WALK_LINKS`]).
pub fn walk_from(links: usize) -> u32 {
    match links >= 2 * WALK_LINKS as usize {
        true => WALK_LINKS,
        false => TIE_LINKS,
    }
}

/// Whether a match of `depth` links counts for a chain of `chain_links` (it passes
/// [`walk_from`]): the rule of the choice, the sole holder, the agreed holder and the wait for
/// a prefill in progress.
pub fn counts(depth: u32, chain_links: usize) -> bool {
    depth > walk_from(chain_links)
}

/// How much less loaded than every holder of the common run a pod must be to count as holding
/// it (see [`common_depth`]).
pub const IDLE_GAP: u64 = 2;

/// How much more than the mean of what the pods were sent lately a pod may have been sent (with
/// the request's new links) and still take a tie, when the proxy routes alone: 1.25, as a
/// fraction. Replay, one router, 32 settings (the conversation trace and three generated
/// rag-chat traces, 4 and 8 pods, 16 to 48 in flight): hits 0.616 against the hash alone's
/// 0.616, max/mean 1.136 against 1.142; 1.1 cost the conversation trace 2% of its hits, 1.5
/// moved little.
pub const HELD_FACTOR: (u64, u64) = (5, 4);

/// Whether a pod that would have been sent `held` of `total` over `n` pods is under the bound
/// of [`HELD_FACTOR`] times the mean.
pub fn under_held_bound(held: u64, total: u64, n: usize) -> bool {
    let (num, den) = HELD_FACTOR;
    u128::from(held) * u128::from(den) * n as u128 <= u128::from(total) * u128::from(num)
}

/// The longest run held by at least half of the `n` pods, and by two at least (with two pods,
/// by both): a prefix that half the pods already hold counts as held by all, since one more
/// copy costs one prefill and keeps the other pods from starving (a shared prompt longer than
/// the tie margin would otherwise keep its conversations off every pod that never got it). Half, not a strict majority: a prompt
/// shared by a quarter of the traffic settles on two pods of four long before a third one
/// gets it by a spill, and with two such prompts on different pairs one pod serves both while
/// another gets neither (a generated rag-chat trace, one router: 472 and 253 requests of
/// 1,500 on 4 pods; a strict majority never applied there, nor on the Mooncake trace).
pub fn common_depth(depths: &[u32], n: usize) -> u32 {
    let mut sorted: Vec<u32> = depths.to_vec();
    sorted.resize(n, 0);
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    // The ceil(n/2)-th longest run is held by at least half of the pods; the second longest by
    // two (one pod's run is its own, not a shared one).
    let holders = n.div_ceil(2).max(2);
    sorted.get(holders - 1).copied().unwrap_or(0)
}

/// The pod that alone holds the request's prompt: its match counts (past [`walk_from`]) and
/// beats every other pod's by more than [`TIE_LINKS`]. A request sent anywhere else pays that
/// whole match again as prefill, so waiting in this pod's queue is the cheaper choice (see
/// `crate::router::room`); a prompt several pods hold has no sole holder, and its requests
/// spread over the holders as before.
pub fn sole_holder(depths: &[u32], chain_links: usize) -> Option<usize> {
    let (best, &depth) = depths.iter().enumerate().max_by_key(|&(_, d)| *d)?;
    let counted = counts(depth, chain_links);
    let alone = depths
        .iter()
        .enumerate()
        .all(|(i, &d)| i == best || d + TIE_LINKS < depth);
    (counted && alone).then_some(best)
}

/// In a fleet, the pod a proxy that knows no holder of the request's prompt sends it to by the
/// hash alone, when the prompt is long enough for a holder's match to count (see
/// [`sole_holder`]): the fleet's other proxies send the same prompt to the same pod, so it
/// probably holds it already (a document's earlier question went through another proxy), and
/// is kept like a sole holder. Anywhere else the request pays its prompt again, and the pod it
/// lands on then holds a copy no other proxy will send to (three proxies in front of three
/// llama.cpp servers: every document question that missed through a proxy that had not seen
/// the document had been passed over this way).
pub fn agreed_holder(choice: &CacheAwareChoice, chain_links: usize) -> Option<usize> {
    // A holder's match is the prompt but its last link at most.
    let longest_held = u32::try_from(chain_links.saturating_sub(1)).unwrap_or(u32::MAX);
    let long = counts(longest_held, chain_links);
    choice.pick.filter(|_| choice.by_hash_alone && long)
}

/// How a tie among the pods that hold the longest run (within [`TIE_LINKS`]) is broken.
#[derive(Debug, Clone, Copy)]
pub enum Ties<'a> {
    /// The first tied pod of the walk: a function of the request alone, so a fleet's proxies
    /// that share nothing pick alike.
    Walk,
    /// A proxy alone: `sent[i]` is what pod `i` was sent lately, in
    /// [`crate::router::inflow::UNITS_PER_LINK`] per link. The first tied pod that stays under
    /// the held bound ([`under_held_bound`]) with the request's new links, else the one sent
    /// least.
    Sent(&'a [u64]),
    /// A fleet whose pods all report what their slots hold: `held[i]` is what pod `i` holds
    /// plus what this proxy sent it since, in the same units (for a prompt no pod holds, what
    /// it holds alone: see `crate::signals::slot_prompts::held_alone_units`); `rank` is this
    /// proxy's place in the fleet (0-based). The first tied pod under the held bound, else the
    /// one that holds least; but when the tied pods hold a run that counts, the less loaded of
    /// the first two under the bound (the first on equal loads), and when none does, the
    /// `rank`-th (modulo their number) of the pods under the bound (else of all), those that
    /// hold least first, and on equal holdings in the walk of [`NEW_PROMPT_LINK`], the same
    /// for every request.
    ///
    /// When every pod holds the request's prompt (one hot prompt on every pod: every request
    /// ties and the bound passes all), the walk alone spreads requests by the hash, blind to
    /// the queues; two choices and the less loaded keep them even, and still differ request
    /// by request, so the proxies do not all turn to the pod that looked idlest at once.
    ///
    /// When no pod holds it, the prompt is new to every view, and proxies that place it
    /// before their next read of the pages place it blind to each other: by the walk alone,
    /// all of them would send it to one pod, which then computes it once per proxy, side by
    /// side (a hot prompt three proxies got at once: two copies computing in the pod's two
    /// slots and one queued, everything behind them waiting 17 to 28 s). By rank, each proxy
    /// computes it on a pod of its own, and the pages show every proxy where it went from
    /// the next read on. The order is the same for every prompt, so that proxies placing
    /// *different* new prompts at once do not meet on one pod either: in the request's own
    /// walk, two documents three proxies got at once met on one pod in 6 runs of 8 (first
    /// answers after 11 s, against 5.5 s apart; runs 1796657032 and 1796660830).
    Held { held: &'a [u64], rank: usize },
}

/// The link whose ring walk orders the pods a new prompt may go to in a fleet (see
/// [`Ties::Held`]): any fixed value; every proxy walks the same ring from it alike.
pub const NEW_PROMPT_LINK: u64 = 0x6e65_775f_7072_6f6d;

/// Choose among the ring's members. `chain` is the request's prompt chain (at least one link),
/// `depths[i]` how many of its leading links member `i` holds, `loads[i]` its load, `bound` the
/// hash-balance bound (`None` = off), `ties` how pods that hold the same run part.
pub fn choose(
    ring: &Ring,
    chain: &[u64],
    depths: &[u32],
    loads: &[u64],
    bound: Option<u64>,
    ties: Ties<'_>,
) -> CacheAwareChoice {
    let n = ring.members();
    let common = common_depth(&depths[..n.min(depths.len())], n);
    let held = |i: usize| depths.get(i).copied().unwrap_or(0);
    let load = |i: usize| loads.get(i).copied().unwrap_or(0);
    // A pod counts as holding the common run only while every pod that holds it is busier by
    // IDLE_GAP: then the holders queue while it idles, and one more copy is worth a prefill.
    let least_busy_holder = (0..n)
        .filter(|&i| common > 0 && held(i) >= common)
        .map(load)
        .min()
        .unwrap_or(0);
    let shallow = walk_from(chain.len());
    let depth = |i: usize| {
        let d = match load(i) + IDLE_GAP <= least_busy_holder {
            true => held(i).max(common),
            false => held(i),
        };
        // A match inside the first links is a shared prompt's, known to some proxies only.
        if d <= shallow {
            0
        } else {
            d
        }
    };
    // With c >= 1 some pod is always under the bound; if loads say otherwise, ignore it.
    let limit = bound
        .filter(|&b| (0..n).any(|i| load(i) < b))
        .unwrap_or(u64::MAX);
    // The candidates a walk of the best run's next link takes first, under `limit`.
    let best_under = |limit: u64| -> (Option<usize>, u32, BoundedWalk) {
        let eligible = |i: usize| load(i) < limit;
        let best = (0..n)
            .filter(|&i| eligible(i))
            .map(depth)
            .max()
            .unwrap_or(0);
        // Past the match, but never inside the first `shallow` links (`depth` counts such a
        // match as none): a router that holds a shared prompt and one that holds nothing yet
        // must walk from the same link.
        let tie_at = best.max(shallow);
        let tie_link = chain[(tie_at as usize).min(chain.len().saturating_sub(1))];
        let walk = BoundedWalk::new(ring, tie_link, loads, limit);
        let tied = || {
            walk.clone()
                .iter(ring)
                .filter(|&i| eligible(i) && depth(i) + TIE_LINKS >= best)
        };
        // The first tied pod in the walk of that link: a function of the request alone, so
        // proxies that share nothing pick alike (with no match at all, the bounded ring pick
        // of that link); what the pods hold or were sent may pass over it (see `Ties`).
        let pick = match ties {
            Ties::Walk => tied().next(),
            Ties::Sent(sent) | Ties::Held { held: sent, .. } => {
                let count = |i: usize| sent.get(i).copied().unwrap_or(0);
                let units = crate::router::inflow::UNITS_PER_LINK as u64;
                let adds =
                    |i: usize| (chain.len() as u64).saturating_sub(u64::from(held(i))) * units;
                let total: u64 = (0..n).map(count).sum();
                let is_under = |i: usize| under_held_bound(count(i) + adds(i), total + adds(i), n);
                let under = || tied().filter(|&i| is_under(i));
                match ties {
                    // Every tied pod holds a run that counts: no copy is at stake, only a
                    // queue. (A first version that placed new documents by load too took 1.30x
                    // smg's time on chat-with-doc with three proxies, run 1796643817.)
                    Ties::Held { .. } if best > 0 => {
                        let mut two = under();
                        match (two.next(), two.next()) {
                            (Some(a), Some(b)) if load(b) < load(a) => Some(b),
                            (first, _) => first,
                        }
                    }
                    // No pod holds it: the pods under the bound (else every eligible one),
                    // those that hold least first, in an order no prompt changes: the same
                    // list in every proxy that reads the same pages, of which each takes the
                    // pod its rank names.
                    Ties::Held { rank, .. } => {
                        let fixed = || {
                            BoundedWalk::new(ring, NEW_PROMPT_LINK, loads, limit)
                                .iter(ring)
                                .filter(|&i| eligible(i))
                        };
                        let mut order: Vec<usize> = fixed().filter(|&i| is_under(i)).collect();
                        if order.is_empty() {
                            order = fixed().collect();
                        }
                        order.sort_by_key(|&i| count(i));
                        order.get(rank % order.len().max(1)).copied()
                    }
                    _ => under().next(),
                }
                .or_else(|| tied().min_by_key(|&i| count(i)))
            }
        };
        (pick, best, walk)
    };
    let (pick, _, walk) = best_under(limit);
    let (preferred, best, _) = best_under(u64::MAX);
    let spilled_from = match (preferred, pick) {
        (Some(p), Some(q)) if p != q => Some(p),
        _ => None,
    };
    CacheAwareChoice {
        pick,
        depth: pick.map_or(0, held),
        spilled_from,
        by_hash_alone: best == 0 && spilled_from.is_none() && matches!(ties, Ties::Walk),
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

    /// Inflow units per link.
    const U: u64 = crate::router::inflow::UNITS_PER_LINK as u64;

    fn all(ring: &Ring, mut c: CacheAwareChoice) -> Vec<usize> {
        std::iter::from_fn(|| c.order.next(ring)).collect()
    }

    #[test]
    fn a_run_half_the_pods_hold_counts_as_held_by_all() {
        assert_eq!(common_depth(&[6, 6, 6, 0], 4), 6);
        assert_eq!(common_depth(&[6, 6, 0, 0], 4), 6, "half is enough");
        assert_eq!(common_depth(&[6, 0, 0, 0], 4), 0, "a quarter is not");
        assert_eq!(common_depth(&[9, 6, 7, 0, 1], 5), 6);
        assert_eq!(
            common_depth(&[9, 6, 0, 0, 1], 5),
            1,
            "two of five are under half"
        );
        assert_eq!(
            common_depth(&[4, 4, 0, 0, 0, 0], 6),
            0,
            "two of six are not"
        );
        assert_eq!(common_depth(&[4, 4, 4, 0, 0, 0], 6), 4);
        // One pod's run is its own (a conversation's), never shared: two pods hold it at least.
        assert_eq!(common_depth(&[4, 4], 2), 4);
        assert_eq!(common_depth(&[4, 0], 2), 0, "one of two");
        assert_eq!(common_depth(&[4], 1), 0);
        assert_eq!(common_depth(&[], 0), 0);
        // The idle pod without the shared system prompt is not starved: it ties with the
        // holders, so the requests whose next link walks to it first go there.
        let r = ring(4);
        // Links are hashes, spread over the whole ring.
        let next = (0u64..1000)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .find(|&h| r.pick(h) == Some(3))
            .expect("some link walks to pod 3 first");
        let chain = [1, 2, 3, 4, 5, 6, next];
        let c = choose(
            &r,
            &chain,
            &[6, 6, 6, 0],
            &[3, 3, 3, 0],
            Some(10),
            Ties::Walk,
        );
        assert_eq!((c.pick, c.depth), (Some(3), 0));
        // ... but only while every holder is busier by IDLE_GAP: a document most pods hold
        // stays with them when the pod without it is about as busy.
        let c = choose(
            &r,
            &chain,
            &[6, 6, 6, 0],
            &[1, 2, 1, 0],
            Some(10),
            Ties::Walk,
        );
        assert!(matches!(c.pick, Some(0..=2)), "{:?}", c.pick);
        assert_eq!(c.depth, 6);
    }

    #[test]
    fn a_prompt_two_pods_of_four_hold_reaches_the_other_two_while_its_holders_are_busier() {
        let r = ring(4);
        // A shared prompt of 6 links on pods 0 and 1; each conversation's own link decides.
        let chains: Vec<[u64; 8]> = (0u64..64)
            .map(|c| [1, 2, 3, 4, 5, 6, c.wrapping_mul(0x9E37_79B9_7F4A_7C15), 99])
            .collect();
        let picks = |loads: [u64; 4]| -> std::collections::BTreeSet<usize> {
            chains
                .iter()
                .map(|chain| {
                    choose(&r, chain, &[6, 6, 0, 0], &loads, Some(12), Ties::Walk)
                        .pick
                        .unwrap()
                })
                .collect()
        };
        // Its holders busier by IDLE_GAP: new conversations go to all four pods by the walk.
        assert_eq!(picks([5, 5, 3, 2]), (0..4).collect());
        // Load about even: they stay with the holders.
        assert_eq!(picks([5, 4, 3, 5]), [0, 1].into_iter().collect());
        // One holder only is that pod's own run (an earlier turn): it keeps it.
        let c = choose(
            &r,
            &chains[0],
            &[6, 0, 0, 0],
            &[5, 0, 0, 0],
            Some(12),
            Ties::Walk,
        );
        assert_eq!((c.pick, c.depth), (Some(0), 6));
    }

    #[test]
    fn no_match_is_the_bounded_ring_pick_of_the_link_past_the_tie_margin() {
        let r = ring(5);
        let chain = [11, 22, 33, 44];
        let c = choose(&r, &chain, &[0; 5], &[0; 5], Some(2), Ties::Walk);
        assert_eq!(c.pick, r.pick(33));
        assert_eq!(c.depth, 0);
        assert_eq!(c.spilled_from, None);
        assert_eq!(all(&r, c), r.walk(33).collect::<Vec<_>>());
        // A chain that short: its last link.
        let c = choose(&r, &[11, 22], &[0; 5], &[0; 5], Some(2), Ties::Walk);
        assert_eq!(c.pick, r.pick(22));
    }

    #[test]
    fn the_longest_match_wins_and_a_full_pod_spills_to_the_next_longest() {
        let r = ring(4);
        let chain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let depths = [1, 9, 5, 1];
        let c = choose(&r, &chain, &depths, &[0; 4], Some(5), Ties::Walk);
        assert_eq!((c.pick, c.depth, c.spilled_from), (Some(1), 9, None));
        // Pod 1 at the bound: pod 2 holds the next longest run.
        let c = choose(&r, &chain, &depths, &[0, 5, 0, 0], Some(5), Ties::Walk);
        assert_eq!((c.pick, c.depth, c.spilled_from), (Some(2), 5, Some(1)));
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
        // Every pod holds the shared first two links; the third decides.
        let chain = [7, 8, 0xfeed_beef, 9];
        let c = choose(&r, &chain, &[2; 6], &[0; 6], None, Ties::Walk);
        assert_eq!(c.pick, r.pick(0xfeed_beef));
        assert_eq!(c.depth, 2);
        // Loads under the bound change nothing: tied holders go by the walk, and with no match
        // the ring walks from the same link, whatever the loads (proxies with different views,
        // and a proxy that has seen the shared prefix and one that has not, pick alike).
        for loads in [[3, 1, 2, 3, 3, 3], [0, 9, 0, 2, 7, 1], [5; 6]] {
            for shared in [0, 1, 2] {
                let c = choose(&r, &chain, &[shared; 6], &loads, Some(10), Ties::Walk);
                assert_eq!(c.pick, r.pick(0xfeed_beef), "{loads:?} {shared}");
            }
        }
        // Past the margin the walk starts past the match.
        let long = [7, 8, 9, 10, 0xabc, 11];
        let c = choose(&r, &long, &[4; 6], &[0; 6], None, Ties::Walk);
        assert_eq!(c.pick, r.pick(0xabc));
        // A pod lacking only a short shared prefix ties with those that hold it, so it is not
        // starved of new conversations: the walk decides.
        for hash in [0xfeed_beef_u64, 0x1234, 0xdead, 0xabcdef] {
            let chain = [7, 8, hash, 9];
            let mut depths = [2; 6];
            let skipped = r.pick(hash).unwrap();
            depths[skipped] = 0;
            let c = choose(&r, &chain, &depths, &[0; 6], None, Ties::Walk);
            assert_eq!(c.pick, Some(skipped), "{hash:x}");
        }
    }

    #[test]
    fn a_shared_prompt_some_routers_know_and_others_do_not_walks_from_the_same_link() {
        let r = ring(4);
        // A 6-link system prompt, then 30 links of the conversation's own.
        for c in 0u64..32 {
            let mut chain: Vec<u64> = (1..=6).collect();
            chain.extend((0..30).map(|i| (c * 100 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            let expected = r.pick(chain[WALK_LINKS as usize]);
            // Knows the prompt nowhere, on one pod, on two, on all four: one pick.
            for depths in [[0, 0, 0, 0], [6, 0, 0, 0], [0, 6, 6, 0], [6; 4]] {
                let c = choose(&r, &chain, &depths, &[1, 1, 1, 1], Some(10), Ties::Walk);
                assert_eq!(c.pick, expected, "{depths:?}");
            }
            // A pod that holds an earlier turn (past the prompt) keeps the conversation.
            let c = choose(
                &r,
                &chain,
                &[6, 20, 6, 0],
                &[1, 1, 1, 1],
                Some(10),
                Ties::Walk,
            );
            assert_eq!((c.pick, c.depth), (Some(1), 20));
        }
        // A short chain walks from the tie margin, so its earlier turn still decides.
        assert_eq!(walk_from(2 * WALK_LINKS as usize - 1), TIE_LINKS);
        assert_eq!(walk_from(3), TIE_LINKS);
        assert_eq!(walk_from(2 * WALK_LINKS as usize), WALK_LINKS);
        assert_eq!(walk_from(100), WALK_LINKS);
        let chain: Vec<u64> = (1..=10).collect();
        let c = choose(
            &r,
            &chain,
            &[0, 0, 3, 0],
            &[1, 1, 1, 1],
            Some(10),
            Ties::Walk,
        );
        assert_eq!((c.pick, c.depth), (Some(2), 3));
    }

    #[test]
    fn only_a_pick_by_the_hash_alone_of_a_long_prompt_is_an_agreed_holder() {
        let r = ring(3);
        let chain: Vec<u64> = (1..=6)
            .map(|i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let hashed = choose(&r, &chain, &[0, 0, 0], &[1, 1, 1], Some(10), Ties::Walk);
        assert!(hashed.by_hash_alone);
        assert_eq!(agreed_holder(&hashed, chain.len()), hashed.pick);
        assert!(hashed.pick.is_some());
        // Too short for a holder's match to count (walk_from(3) + 1 links or fewer).
        assert_eq!(agreed_holder(&hashed, 3), None);
        // A match that counts decides instead (that is the sole holder's rule).
        let matched = choose(&r, &chain, &[5, 0, 0], &[1, 1, 1], Some(10), Ties::Walk);
        assert!(!matched.by_hash_alone);
        assert_eq!(agreed_holder(&matched, chain.len()), None);
        // The bound moved the pick: other proxies may have moved it elsewhere.
        let p = hashed.pick.unwrap();
        let mut loads = [0u64; 3];
        loads[p] = 10;
        let spilled = choose(&r, &chain, &[0, 0, 0], &loads, Some(5), Ties::Walk);
        assert!(spilled.spilled_from.is_some());
        assert_eq!(agreed_holder(&spilled, chain.len()), None);
        // A proxy alone reads its own counts: no fleet agrees on that pick.
        let alone = choose(
            &r,
            &chain,
            &[0, 0, 0],
            &[1, 1, 1],
            Some(10),
            Ties::Sent(&[0, 0, 0]),
        );
        assert_eq!(agreed_holder(&alone, chain.len()), None);
    }

    #[test]
    fn a_sole_holder_holds_a_match_that_counts_and_beats_every_other_by_the_margin() {
        // A 3-link document on one pod of three (a short chain: matches count past 2 links).
        assert_eq!(sole_holder(&[3, 0, 0], 4), Some(0));
        assert_eq!(sole_holder(&[0, 0, 5], 6), Some(2));
        // Past the margin only: 3 against 1 is a tie.
        assert_eq!(sole_holder(&[3, 1, 0], 4), None);
        assert_eq!(sole_holder(&[4, 1, 0], 5), Some(0));
        // Two holders: none alone.
        assert_eq!(sole_holder(&[3, 3, 0], 4), None);
        // A match inside the shared-prompt links does not count.
        assert_eq!(sole_holder(&[2, 0, 0], 3), None);
        assert_eq!(sole_holder(&[8, 0, 0], 20), None);
        assert_eq!(sole_holder(&[9, 0, 0], 20), Some(0));
        assert_eq!(sole_holder(&[], 4), None);
    }

    #[test]
    fn the_held_bound_is_a_quarter_over_the_mean() {
        assert!(under_held_bound(0, 0, 4), "an empty index bounds nothing");
        // 16 sent over 4 pods: a mean of 4, a bound of 5.
        assert!(under_held_bound(5, 16, 4));
        assert!(!under_held_bound(6, 16, 4));
        assert!(under_held_bound(u64::MAX, u64::MAX, 1), "no overflow");
    }

    #[test]
    fn alone_a_tie_passes_over_pods_sent_more_than_their_share() {
        let r = ring(3);
        let doc = |d: u64| -> [u64; 3] {
            let h = d.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            [h, h ^ 1, h ^ 2]
        };
        let docs: Vec<[u64; 3]> = (1u64..200).map(doc).collect();
        let picks = |ties: Ties<'_>| -> Vec<usize> {
            docs.iter()
                .map(|d| choose(&r, d, &[0; 3], &[0; 3], Some(4), ties))
                .map(|c| c.pick.unwrap())
                .collect()
        };
        let fleet = picks(Ties::Walk);
        assert!(fleet.contains(&0));
        // Pod 0 was sent three documents' links lately, pods 1 and 2 one each (in sixteenths
        // of a link): with a new document's three links pod 0 would have been sent over 1.25x
        // the mean (12 x 3 > 1.25 x 18), so no new document goes there; the others take theirs
        // by the walk, as a fleet's proxies would.
        let alone = picks(Ties::Sent(&[9 * U, 3 * U, 3 * U]));
        assert!(!alone.contains(&0));
        for (a, f) in alone.iter().zip(&fleet) {
            if *f != 0 {
                assert_eq!(a, f, "a pod under the bound keeps the walk's pick");
            }
        }
        // Content about even: the walk alone decides.
        assert_eq!(picks(Ties::Sent(&[30 * U, 30 * U, 30 * U])), fleet);
        // A pod that holds the request's run keeps it, however much else it was sent.
        let c = choose(
            &r,
            &docs[0],
            &[3, 0, 0],
            &[0; 3],
            Some(4),
            Ties::Sent(&[30 * U, U, U]),
        );
        assert_eq!((c.pick, c.depth), (Some(0), 3));
        // Every tied pod over the bound: the one sent least (pod 2 is at the load bound, no
        // candidate).
        let c = choose(
            &r,
            &docs[0],
            &[3, 3, 0],
            &[0, 0, 9],
            Some(4),
            Ties::Sent(&[12 * U, 10 * U, 0]),
        );
        assert_eq!(c.pick, Some(1));
    }

    #[test]
    fn in_a_fleet_whose_pods_report_what_they_hold_a_tie_takes_the_less_loaded_of_two() {
        let r = ring(3);
        // One hot prompt of five links on every pod, then each request's own link.
        let loads = [4, 1, 2];
        let held = [5 * U, 5 * U, 5 * U];
        let mut on = [0usize; 3];
        for q in 1u64..300 {
            let mut chain = vec![11, 22, 33, 44, 55];
            chain.push(q.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let walked = choose(&r, &chain, &[5; 3], &loads, None, Ties::Walk);
            let first_two: Vec<usize> = all(&r, walked).into_iter().take(2).collect();
            let c = choose(
                &r,
                &chain,
                &[5; 3],
                &loads,
                None,
                Ties::Held {
                    held: &held,
                    rank: 0,
                },
            );
            let less = *first_two.iter().min_by_key(|&&i| loads[i]).unwrap();
            assert_eq!(c.pick, Some(less), "request {q}");
            assert!(!c.by_hash_alone, "loads took part: no fleet agrees on it");
            on[less] += 1;
        }
        // The busiest pod is never the less loaded of two; the idlest is whenever it is one.
        assert_eq!(on[0], 0);
        assert!(on[1] > on[2], "{on:?}");
        // Equal loads: the walk's first, as the walk alone would pick.
        let chain = [11, 22, 33, 44, 55, 66];
        let walked = choose(&r, &chain, &[5; 3], &[2; 3], None, Ties::Walk);
        let held_tie = choose(
            &r,
            &chain,
            &[5; 3],
            &[2; 3],
            None,
            Ties::Held {
                held: &held,
                rank: 0,
            },
        );
        assert_eq!(held_tie.pick, walked.pick);
        // No pod holds the request's prompt: where it lands decides who holds it next, so the
        // loads do not decide, nor does the prompt: the proxy's rank does, in one order for
        // every prompt, so that ranks 0, 1 and 2 take three pods whatever each places.
        let order: Vec<usize> = r.walk(NEW_PROMPT_LINK).collect();
        for q in 1u64..100 {
            let new_prompt: Vec<u64> = (0..6).map(|l| q.wrapping_mul(0x9E37_79B9) ^ l).collect();
            for rank in 0..6 {
                let held = Ties::Held { held: &held, rank };
                let c = choose(&r, &new_prompt, &[0; 3], &loads, None, held);
                assert_eq!(c.pick, Some(order[rank % 3]), "request {q}, rank {rank}");
            }
        }
        // A pod that holds more than its share is passed over first, however idle.
        let c = choose(
            &r,
            &chain,
            &[5; 3],
            &[0, 3, 3],
            None,
            Ties::Held {
                held: &[40 * U, 5 * U, 5 * U],
                rank: 0,
            },
        );
        assert_ne!(c.pick, Some(0));
    }

    #[test]
    fn alone_six_documents_land_two_on_each_of_three_pods_whatever_their_hashes() {
        let r = ring(3);
        let mut lumpy = 0;
        for set in 0u64..64 {
            let docs: Vec<Vec<u64>> = (0..6u64)
                .map(|d| {
                    let h = (set * 100 + d + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    (0..3).map(|l| h ^ l).collect()
                })
                .collect();
            // Each document's first request, in order; the index learns its links on the pick.
            let place = |alone: bool| -> [usize; 3] {
                let mut sent = [0u64; 3];
                let mut docs_on = [0usize; 3];
                for d in &docs {
                    let c = choose(
                        &r,
                        d,
                        &[0; 3],
                        &[0; 3],
                        None,
                        match alone {
                            true => Ties::Sent(&sent),
                            false => Ties::Walk,
                        },
                    );
                    let p = c.pick.unwrap();
                    sent[p] += d.len() as u64 * U;
                    docs_on[p] += 1;
                }
                docs_on
            };
            assert_eq!(place(true), [2, 2, 2], "set {set}");
            if place(false).iter().any(|&k| k > 2) {
                lumpy += 1;
            }
        }
        // The walk alone (a fleet's rule) puts three or more on one pod most of the time.
        assert!(lumpy > 32, "{lumpy} of 64 sets lumpy by the hash");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The pick holds the longest run among the pods under the bound (within the tie margin),
        /// a run longer than every other by more than the margin always wins, the pick is under
        /// the bound whenever any pod is, and every pod appears once in the order.
        #[test]
        fn the_longest_match_among_pods_under_the_bound_wins(
            n in 1usize..12,
            chain in proptest::collection::vec(any::<u64>(), 1..16),
            raw_depths in proptest::collection::vec(0u32..16, 12),
            raw_loads in proptest::collection::vec(0u64..6, 12),
            bound in 1u64..6,
            raw_sent in proptest::option::of(proptest::collection::vec(0u64..100, 12)),
            fleet_views in any::<bool>(),
            rank in 0usize..8,
        ) {
            let r = ring(n);
            let depths: Vec<u32> = raw_depths[..n].iter().map(|&d| d.min(chain.len() as u32)).collect();
            let loads = &raw_loads[..n];
            // Alone (with what the pods were sent lately), in a fleet whose pods report what
            // they hold, or in one whose pods do not: the same guarantees.
            let ties = match (&raw_sent, fleet_views) {
                (Some(e), false) => Ties::Sent(&e[..n]),
                (Some(e), true) => Ties::Held { held: &e[..n], rank },
                (None, _) => Ties::Walk,
            };
            let c = choose(&r, &chain, &depths, loads, Some(bound), ties);
            let pick = c.pick.unwrap();
            prop_assert_eq!(c.depth, depths[pick]);
            // A run half the pods hold counts as held by all.
            let common = common_depth(&depths, n);
            let shallow = walk_from(chain.len());
            let eff = |i: usize| Some(depths[i].max(common)).filter(|&d| d > shallow).unwrap_or(0);
            let under: Vec<usize> = (0..n).filter(|&i| loads[i] < bound).collect();
            if !under.is_empty() {
                prop_assert!(loads[pick] < bound);
                let best = under.iter().map(|&i| eff(i)).max().unwrap();
                prop_assert!(eff(pick) + TIE_LINKS >= best);
                let clear_winner = under
                    .iter()
                    .filter(|&&i| eff(i) + TIE_LINKS >= best)
                    .count() == 1;
                if clear_winner {
                    prop_assert_eq!(eff(pick), best);
                }
            }
            let order = all(&r, c);
            prop_assert_eq!(order[0], pick);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }
    }
}
