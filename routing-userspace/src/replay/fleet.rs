//! The simulated fleet: pods with a prefix cache of 512-token blocks (LRU, a block hits only
//! when its whole prefix is cached, as in vLLM), a limit of requests running at once (the rest
//! queue, first come first served), a prefill time proportional to the uncached prompt and a
//! decode time proportional to the output. Time is simulated (microseconds from the start of
//! the trace); nothing sleeps.
//!
//! A [`Placement`] picks the pod of each arriving request, and hears when each one starts
//! running and finishes (what a router learns from the engine's answers). Requests arrive at
//! the trace's timestamps, or, closed loop, as many at once as a client keeps in flight.
//! The fleet keeps the count a router reads as its gauge: requests routed to a pod and not
//! finished (running plus queued).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::trace::TraceRequest;
use crate::sim::cache::PrefixCache;

/// How fast a simulated pod works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodTiming {
    pub block_tokens: u64,
    pub prefill_us_per_token: u64,
    pub decode_us_per_token: u64,
    /// Requests a pod runs at once; later ones queue.
    pub max_running: usize,
}

/// When requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// At the trace's timestamps, this many times faster.
    Trace { speedup: f64 },
    /// Closed loop: this many requests in flight, the next sent as one finishes (the trace's
    /// order, not its timestamps).
    Closed { in_flight: usize },
}

/// The simulated fleet: how many pods, how big their caches, how fast, when requests come.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetSpec {
    pub pods: usize,
    /// Prefix-cache capacity of each pod, in blocks.
    pub cache_blocks: usize,
    pub timing: PodTiming,
    pub arrivals: Arrivals,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub pod: usize,
    pub blocks: u64,
    pub hit_blocks: u64,
    /// Arrival to first token (queueing plus prefill), microseconds.
    pub ttft_us: u64,
    pub queued: bool,
}

/// One pod of the fleet.
#[derive(Debug)]
pub struct Pod {
    pub cache: PrefixCache,
    running: usize,
    queue: VecDeque<usize>,
}

impl Pod {
    /// Requests routed here and not finished: the load the router's gauge reports.
    pub fn in_flight(&self) -> usize {
        self.running + self.queue.len()
    }

    /// Requests the pod runs now (what an engine reports as running).
    pub fn running(&self) -> usize {
        self.running
    }

    /// Requests queued on the pod for a running slot (what an engine reports as waiting).
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

/// Picks a pod for each arriving request. Calls come in simulated-time order.
pub trait Placement {
    /// The pod request `index` (arriving at `now_us`) goes to.
    fn place(&mut self, index: usize, r: &TraceRequest, now_us: u64, pods: &[Pod]) -> usize;
    /// The pod took request `index` at `now_us` (to run or to queue): a streaming engine
    /// sends the response head, with its load report, then.
    fn accepted(&mut self, _index: usize, _now_us: u64, _pods: &[Pod]) {}
    /// Request `index` finished at `now_us` (the gauge goes down): `served` is what its
    /// answer reports.
    fn finished(&mut self, index: usize, served: &Served, now_us: u64, pods: &[Pod]);
}

/// Run `requests` through the fleet, each placed by `placement`, arriving as `spec` says.
pub fn run(
    requests: &[TraceRequest],
    spec: &FleetSpec,
    placement: &mut dyn Placement,
) -> Vec<Served> {
    let mut fleet = Fleet {
        pods: (0..spec.pods)
            .map(|_| Pod {
                cache: PrefixCache::new(spec.cache_blocks),
                running: 0,
                queue: VecDeque::new(),
            })
            .collect(),
        done: BinaryHeap::new(),
        arrival: Vec::with_capacity(requests.len()),
        served: vec![None; requests.len()],
        completions: Vec::new(),
        timing: spec.timing,
    };
    for (i, r) in requests.iter().enumerate() {
        let now = fleet.arrival_of(i, r, spec.arrivals, requests, placement);
        fleet.finish_until(now, requests, placement);
        fleet.arrival.push(now);
        let pod = placement
            .place(i, r, now, &fleet.pods)
            .min(spec.pods.saturating_sub(1));
        let p = &mut fleet.pods[pod];
        if p.running < spec.timing.max_running.max(1) {
            fleet.start(i, pod, now, requests);
        } else {
            p.queue.push_back(i);
        }
        placement.accepted(i, now, &fleet.pods);
    }
    fleet.finish_until(u64::MAX, requests, placement);
    fleet
        .served
        .into_iter()
        .map(|s| s.expect("every request was served"))
        .collect()
}

struct Fleet {
    pods: Vec<Pod>,
    /// (completion time, request, pod).
    done: BinaryHeap<Reverse<(u64, usize, usize)>>,
    arrival: Vec<u64>,
    served: Vec<Option<Served>>,
    /// Completion times, in order (a closed loop sends its next request at each).
    completions: Vec<u64>,
    timing: PodTiming,
}

impl Fleet {
    /// When request `i` arrives: its timestamp, or, closed loop, when the request `in_flight`
    /// before it finished (the first `in_flight` at once).
    fn arrival_of(
        &mut self,
        i: usize,
        r: &TraceRequest,
        arrivals: Arrivals,
        requests: &[TraceRequest],
        placement: &mut dyn Placement,
    ) -> u64 {
        match arrivals {
            Arrivals::Trace { speedup } => {
                (r.timestamp as f64 * 1000.0 / speedup.max(1e-9)).round() as u64
            }
            Arrivals::Closed { in_flight } if i < in_flight.max(1) => 0,
            Arrivals::Closed { in_flight } => {
                let freed = i - in_flight.max(1);
                while self.completions.len() <= freed {
                    let Some(&Reverse((at, ..))) = self.done.peek() else {
                        break;
                    };
                    self.finish_until(at, requests, placement);
                }
                self.completions.get(freed).copied().unwrap_or(0)
            }
        }
    }

    fn start(&mut self, i: usize, pod: usize, now: u64, requests: &[TraceRequest]) {
        let r = &requests[i];
        let t = self.timing;
        let p = &mut self.pods[pod];
        let hits = p.cache.cached_prefix_blocks(&r.hash_ids) as u64;
        p.cache.insert(&r.hash_ids);
        p.running += 1;
        let cached_tokens = (hits * t.block_tokens).min(r.input_length);
        let prefill = (r.input_length - cached_tokens) * t.prefill_us_per_token;
        let decode = r.output_length * t.decode_us_per_token;
        let arrived = self.arrival[i];
        self.served[i] = Some(Served {
            pod,
            blocks: r.hash_ids.len() as u64,
            hit_blocks: hits,
            ttft_us: now - arrived + prefill,
            queued: now > arrived,
        });
        self.done.push(Reverse((now + prefill + decode, i, pod)));
    }

    /// Complete every request due by `until`, starting queued ones as room frees up.
    fn finish_until(
        &mut self,
        until: u64,
        requests: &[TraceRequest],
        placement: &mut dyn Placement,
    ) {
        while let Some(&Reverse((at, i, pod))) = self.done.peek() {
            if at > until {
                break;
            }
            self.done.pop();
            self.pods[pod].running -= 1;
            self.completions.push(at);
            let served = self.served[i].expect("a finished request started");
            placement.finished(i, &served, at, &self.pods);
            if let Some(next) = self.pods[pod].queue.pop_front() {
                self.start(next, pod, at, requests);
            }
        }
    }
}
