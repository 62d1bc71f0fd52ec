//! Label groups (spec: "Shared service-label routing"): narrow the members to the highest
//! ready priority tier, pick one by the group mode, then let that member route by its own
//! strategy. No ready member: the deterministic cold-start member.

use std::sync::Arc;
use std::time::Instant;

use super::{Decision, GroupChoice, Router};
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
    let (member, outcome, reservation) = match top_ready_tier(&g.members) {
        None => {
            let i = cold_start(&g.members).expect("a label group has at least one member");
            (i, GroupOutcome::ColdStart, None)
        }
        Some(tier) => {
            let (pick, reservation) = pick_in_tier(router, g, &tier.members, req, draw, now);
            let outcome = if tier.narrowed {
                GroupOutcome::PriorityPick
            } else {
                GroupOutcome::Mode(mode)
            };
            (pick, outcome, reservation)
        }
    };
    let mut d = router.decide_model(&g.members[member], req, draw, now);
    d.member_reservation = reservation;
    d.group = Some(GroupChoice {
        group: Arc::clone(g),
        member,
        mode,
        outcome,
    });
    d
}

/// The member (index into `g.members`) the group mode picks among `tier`, and its
/// reservation (least-loaded mode).
fn pick_in_tier(
    router: &Router,
    g: &LabelGroup,
    tier: &[usize],
    req: &RequestParts<'_, '_>,
    draw: u64,
    now: Instant,
) -> (usize, Option<super::reservation::Reservation>) {
    let mode = router.knobs.label_group_mode;
    // Least-loaded still reserves a lone member, so its gauge story stays consistent.
    if tier.len() == 1 && mode != LabelGroupMode::LeastLoaded {
        return (tier[0], None);
    }
    match mode {
        LabelGroupMode::RoundRobin => {
            let k = round_robin(g.next_ticket(), tier.len()).next().unwrap_or(0);
            (tier[k], None)
        }
        LabelGroupMode::LeastLoaded => {
            let rr = g.next_ticket();
            let member = |k: usize| &g.members[tier[k]];
            let (mut order, token) = router.members.pick(
                tier.len(),
                |k| Some(member(k).name_hash),
                |k| member(k).pods.iter().map(|p| router.pod_load(p)).sum(),
                |loads| rank(loads, rr, 1),
                |order| order.clone().next(),
                // A member's reservations are reported under its own name.
                |k| Arc::clone(&member(k).metrics.reservations),
                now,
            );
            let k = order.next().unwrap_or(0);
            (tier[k], token)
        }
        LabelGroupMode::Prefix | LabelGroupMode::Session => {
            let strategy = if mode == LabelGroupMode::Prefix {
                Strategy::Prefix
            } else {
                Strategy::SessionAffinity
            };
            match keys::extract(strategy, req, &router.knobs.limits).key {
                // Walk the group ring (built over all members) to the first one in the tier.
                Some(k) => (
                    g.ring
                        .walk(k.hash)
                        .find(|i| tier.contains(i))
                        .unwrap_or(tier[0]),
                    None,
                ),
                None => {
                    let k = random(draw, tier.len()).next().unwrap_or(0);
                    (tier[k], None)
                }
            }
        }
    }
}
