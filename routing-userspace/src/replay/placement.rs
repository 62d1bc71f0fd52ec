//! Who picks the pod in a replay: the proxy's own router (the same `Router::decide`, table,
//! knobs and gauge type as `serve`), or the greedy oracle that looks inside the simulated caches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

use super::chat::ChatRenderer;
use super::fleet::{Placement, Pod};
use super::trace::TraceRequest;
use crate::balance::bounded::HashBalance;
use crate::body::BodyFields;
use crate::discovery::{ModelSet, ModelSpec, Update};
use crate::keys::{self, RequestParts};
use crate::load::slots::SlotAllocator;
use crate::load::userspace::{InFlight, UserspaceGauge};
use crate::metrics::Metrics;
use crate::router::RoutingKnobs;
use crate::router::{Attempt, Router};
use crate::table::{Route, RoutingTable};
use crate::vocab::{Outcome, Strategy};

/// The model name replayed requests carry.
pub const MODEL: &str = "replay";

/// The address of simulated pod `i` (sorted as the table sorts pods, so pod `i` is table pod `i`).
fn pod_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 77, (i / 250) as u8, (i % 250) as u8 + 1], 8000))
}

/// The real router deciding for simulated pods.
pub struct RouterPlacement {
    router: Router,
    gauge: Arc<UserspaceGauge>,
    route: Route,
    strategy: Strategy,
    chat: ChatRenderer,
    headers: HeaderMap,
    /// Simulated time zero.
    base: Instant,
    /// Requests in flight per request index (dropped when it finishes: the gauge goes down).
    in_flight: Vec<Option<InFlight>>,
    draws: u64,
    /// Decisions the hash-balance bound moved.
    pub spills: u64,
}

impl RouterPlacement {
    /// A router for one model of `strategy` over `pods` pods with no Service (default routing is
    /// then round-robin over the pods, as without a Service in `serve`).
    pub fn new(
        strategy: Strategy,
        pods: usize,
        knobs: RoutingKnobs,
        chat: ChatRenderer,
        requests: usize,
    ) -> Self {
        let mut spec = ModelSpec::new(MODEL);
        spec.routing = strategy;
        spec.endpoints = (0..pods).map(pod_addr).collect();
        let mut set = ModelSet::default();
        set.apply(Update::Reset(vec![spec]));
        let mut slots = SlotAllocator::default();
        slots.sync(&RoutingTable::pod_addrs(&set));
        let table =
            RoutingTable::build(&set, &slots, &Metrics::new(10_000), knobs.label_group_mode);
        let route = table.lookup(MODEL).expect("the replayed model");
        let gauge = Arc::new(UserspaceGauge::default());
        Self {
            router: Router::new(gauge.clone(), knobs),
            gauge,
            route,
            strategy,
            chat,
            headers: HeaderMap::new(),
            base: Instant::now(),
            in_flight: (0..requests).map(|_| None).collect(),
            draws: 0,
            spills: 0,
        }
    }

    fn at(&self, us: u64) -> Instant {
        self.base + Duration::from_micros(us)
    }
}

impl Placement for RouterPlacement {
    fn place(&mut self, index: usize, r: &TraceRequest, now_us: u64, _pods: &[Pod]) -> usize {
        let now = self.at(now_us);
        self.router.sweep(now);
        let limits = &self.router.knobs().limits;
        let body =
            keys::needs_body(self.strategy, &self.headers, limits).then(|| self.chat.body(r));
        let fields = body
            .as_deref()
            .and_then(|b| BodyFields::parse(b.as_bytes()));
        let parts = RequestParts {
            headers: &self.headers,
            body: fields.as_ref(),
            model: Some(MODEL),
        };
        // The random draw of session requests without a key: a fixed sequence, so runs repeat.
        self.draws = self.draws.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut d = self.router.decide(&self.route, &parts, self.draws, now);
        if d.outcome() == Outcome::Spill {
            self.spills += 1;
        }
        let attempt = match d.next_attempt() {
            Some(a @ Attempt::Pod(_)) => a,
            // No pod was picked (no key and no Service cannot happen here): the first pod.
            _ => Attempt::Pod(0),
        };
        // The request starts on its pod now, exactly as the proxy starts it.
        self.in_flight[index] = d.start_on(attempt, &self.gauge);
        match attempt {
            Attempt::Pod(i) => i,
            Attempt::Service => 0,
        }
    }

    fn finished(&mut self, index: usize, _pod: usize) {
        self.in_flight[index] = None;
    }
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

    fn finished(&mut self, _index: usize, _pod: usize) {}
}
