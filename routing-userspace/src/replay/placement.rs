//! The greedy oracle that looks inside the simulated caches (the routers are in
//! [`super::routers`]), and the replayed model's name and pod addresses.

use std::net::SocketAddr;

use super::fleet::{Placement, Pod, Served};
use super::trace::TraceRequest;
use crate::balance::bounded::HashBalance;

/// The model name replayed requests carry.
pub const MODEL: &str = "replay";

/// The address of simulated pod `i` (sorted as the table sorts pods, so pod `i` is table pod `i`).
pub fn pod_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 77, (i / 250) as u8, (i % 250) as u8 + 1], 8000))
}

/// The oracle: the pod whose simulated cache holds the longest prefix of the request, among the
/// pods under the hash-balance bound (the same bound, on the same in-flight counts, as the
/// bounded rows; a pure longest-prefix greedy sends every request behind a shared first block to
/// one pod); ties go to the pod with fewest requests in flight, then the lowest index. No router
/// can see inside the caches like this.
#[derive(Debug)]
pub struct Greedy {
    pub balance: HashBalance,
}

impl Placement for Greedy {
    fn place(&mut self, _index: usize, r: &TraceRequest, _now_us: u64, pods: &[Pod]) -> usize {
        let total: u64 = pods.iter().map(|p| p.in_flight() as u64).sum();
        let bound = self.balance.bound(total, pods.len()).unwrap_or(u64::MAX);
        let under = |i: usize| (pods[i].in_flight() as u64) < bound;
        let any_under = (0..pods.len()).any(under);
        (0..pods.len())
            .filter(|&i| !any_under || under(i))
            .min_by_key(|&i| {
                let hit = pods[i].cache.cached_prefix_blocks(&r.hash_ids);
                (std::cmp::Reverse(hit), pods[i].in_flight(), i)
            })
            .unwrap_or(0)
    }

    fn finished(&mut self, _index: usize, _served: &Served, _now_us: u64, _pods: &[Pod]) {}
}
