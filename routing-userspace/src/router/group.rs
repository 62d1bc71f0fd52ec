//! Label groups (spec: "Shared service-label routing"): narrow the members to the highest
//! ready priority tier, pick one by the group mode, then let that member route by its own
//! strategy. No ready member: the deterministic cold-start member. The hashing modes (prefix,
//! session) walk the group ring under the hash-balance bound, with a member's load being its
//! pods' loads plus its reservations, as least-loaded mode reads it.

use std::sync::Arc;
use std::time::Instant;

use super::{Decision, GroupChoice, Router, Spill};
use crate::balance::bounded::BoundedWalk;
use crate::balance::least_loaded::rank;
use crate::balance::priority::{cold_start, top_ready_tier};
use crate::balance::random::random;
use crate::balance::round_robin::round_robin;
use crate::keys::{self, RequestParts};
use crate::table::LabelGroup;
use crate::vocab::{GroupOutcome, LabelGroupMode, Strategy};

/// Pick a member of a label group, then pods of that member.
pub fn decide(
    router: &Router,
    g: &Arc<LabelGroup>,
    req: &RequestParts<'_, '_>,
    draw: u64,
    now: Instant,
) -> Decision {
    let mode = router.knobs.label_group_mode;
    let (member, outcome, reservation, spill) = match top_ready_tier(&g.members) {
        None => {
            let i = cold_start(&g.members).expect("a label group has at least one member");
            (i, GroupOutcome::ColdStart, None, None)
        }
        Some(tier) => {
            let TierPick {
                member,
                reservation,
                spill,
            } = pick_in_tier(router, g, &tier.members, req, draw, now);
            let outcome = if tier.narrowed {
                GroupOutcome::PriorityPick
            } else {
                GroupOutcome::Mode(mode)
            };
            (member, outcome, reservation, spill)
        }
    };
    let mut d = router.decide_model(&g.members[member], req, draw, now);
    let choice = GroupChoice {
        group: Arc::clone(g),
        member,
        mode,
        outcome,
        spill,
    };
    d.set_group(choice, reservation);
    d
}

/// A member picked in the top tier, what it reserved and whether the bound moved it.
struct TierPick {
    member: usize,
    reservation: Option<super::reservation::Reservation>,
    spill: Option<Spill>,
}

impl TierPick {
    fn plain(member: usize) -> Self {
        Self {
            member,
            reservation: None,
            spill: None,
        }
    }
}

/// The member (index into `g.members`) the group mode picks among `tier`, its reservation
/// (least-loaded mode) and its spill (hashing modes under the bound).
fn pick_in_tier(
    router: &Router,
    g: &LabelGroup,
    tier: &[usize],
    req: &RequestParts<'_, '_>,
    draw: u64,
    now: Instant,
) -> TierPick {
    let mode = router.knobs.label_group_mode;
    // Least-loaded still reserves a lone member, so its gauge story stays consistent.
    if tier.len() == 1 && mode != LabelGroupMode::LeastLoaded {
        return TierPick::plain(tier[0]);
    }
    match mode {
        LabelGroupMode::RoundRobin => {
            let k = round_robin(g.next_ticket(), tier.len()).next().unwrap_or(0);
            TierPick::plain(tier[k])
        }
        LabelGroupMode::LeastLoaded => {
            let rr = g.next_ticket();
            let member = |k: usize| &g.members[tier[k]];
            let (mut order, token) = router.members.pick(
                tier.len(),
                |k| Some(member(k).name_hash),
                |k| member_load(router, member(k), now),
                |loads| rank(loads, rr, 1),
                |order| order.clone().next(),
                // A member's reservations are reported under its own name.
                |k| Arc::clone(&member(k).metrics.reservations),
                now,
            );
            let k = order.next().unwrap_or(0);
            TierPick {
                member: tier[k],
                reservation: token,
                spill: None,
            }
        }
        LabelGroupMode::Prefix | LabelGroupMode::Session => {
            let strategy = if mode == LabelGroupMode::Prefix {
                Strategy::Prefix
            } else {
                Strategy::SessionAffinity
            };
            match keys::extract(strategy, req, &router.knobs.limits).key {
                // Walk the group ring (built over all members) to the first one in the tier.
                Some(k) => {
                    let plain = g
                        .ring
                        .walk(k.hash)
                        .find(|i| tier.contains(i))
                        .unwrap_or(tier[0]);
                    if !router.knobs.hash_balance.is_on() {
                        return TierPick::plain(plain);
                    }
                    bounded_member(router, g, tier, k.hash, plain, now)
                }
                None => {
                    let k = random(draw, tier.len()).next().unwrap_or(0);
                    TierPick::plain(tier[k])
                }
            }
        }
    }
}

/// A member's load: its pods' loads (as least-loaded mode reads them), without reservations.
fn member_load(router: &Router, m: &crate::table::ModelRoute, now: Instant) -> u64 {
    m.pods.iter().map(|p| router.pod_load(p, now)).sum()
}

/// A member's load for the bound: its pods' loads and their pending bounded picks.
fn member_bounded_load(router: &Router, m: &crate::table::ModelRoute, now: Instant) -> u64 {
    m.pods.iter().map(|p| router.bounded_load(p, now)).sum()
}

/// The bounded walk of the group ring over the tier: members outside the tier never qualify,
/// the bound is taken over the tier's loads (pods' gauge plus member reservations).
fn bounded_member(
    router: &Router,
    g: &LabelGroup,
    tier: &[usize],
    hash: u64,
    plain: usize,
    now: Instant,
) -> TierPick {
    let n = g.members.len();
    let loads = router.members.loads(
        n,
        |i| Some(g.members[i].name_hash),
        |i| member_bounded_load(router, &g.members[i], now),
        now,
    );
    let mut loads = loads.as_slice().to_vec();
    let total: u64 = tier.iter().map(|&i| loads[i]).sum();
    let bound = router
        .knobs
        .hash_balance
        .bound(total, tier.len())
        .expect("a bound that is on, over a tier");
    let plain_load = loads[plain];
    for (i, l) in loads.iter_mut().enumerate() {
        if !tier.contains(&i) {
            *l = u64::MAX;
        }
    }
    let member = BoundedWalk::new(&g.ring, hash, &loads, bound)
        .iter(&g.ring)
        .find(|i| tier.contains(i))
        .unwrap_or(plain);
    TierPick {
        member,
        reservation: None,
        spill: (member != plain).then_some(Spill {
            preferred: plain,
            load: plain_load,
            bound,
        }),
    }
}
