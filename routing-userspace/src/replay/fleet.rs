//! The simulated fleet: pods with a prefix cache of 512-token blocks (LRU, a block hits only
//! when its whole prefix is cached, as in vLLM), a limit of requests running at once (the rest
//! queue, first come first served), a prefill time proportional to the uncached prompt and a
//! decode time proportional to the output. Time is simulated (microseconds from the start of
//! the trace); nothing sleeps.
//!
//! A [`Placement`] picks the pod of each arriving request. The fleet keeps the count the router
//! reads as its gauge: requests routed to a pod and not finished (running plus queued).

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

/// The simulated fleet: how many pods, how big their caches, how fast, how fast time runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetSpec {
    pub pods: usize,
    /// Prefix-cache capacity of each pod, in blocks.
    pub cache_blocks: usize,
    pub timing: PodTiming,
    /// Arrivals this many times faster than the trace's timestamps.
    pub speedup: f64,
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
}

/// Picks a pod for each arriving request.
pub trait Placement {
    /// The pod request `index` (arriving at `now_us`) goes to.
    fn place(&mut self, index: usize, r: &TraceRequest, now_us: u64, pods: &[Pod]) -> usize;
    /// Request `index` finished on `pod` (the gauge goes down).
    fn finished(&mut self, index: usize, pod: usize);
}

/// Run `requests` through the fleet, each placed by `placement`. Arrival times are the trace's
/// timestamps divided by the speedup.
pub fn run(
    requests: &[TraceRequest],
    spec: &FleetSpec,
    placement: &mut dyn Placement,
) -> Vec<Served> {
    let FleetSpec {
        pods,
        cache_blocks,
        timing,
        speedup,
    } = *spec;
    let mut fleet = Fleet {
        pods: (0..pods)
            .map(|_| Pod {
                cache: PrefixCache::new(cache_blocks),
                running: 0,
                queue: VecDeque::new(),
            })
            .collect(),
        done: BinaryHeap::new(),
        arrival: Vec::with_capacity(requests.len()),
        served: vec![None; requests.len()],
        timing,
    };
    for (i, r) in requests.iter().enumerate() {
        let now = (r.timestamp as f64 * 1000.0 / speedup.max(1e-9)).round() as u64;
        fleet.finish_until(now, requests, placement);
        fleet.arrival.push(now);
        let pod = placement
            .place(i, r, now, &fleet.pods)
            .min(pods.saturating_sub(1));
        let p = &mut fleet.pods[pod];
        if p.running < timing.max_running.max(1) {
            fleet.start(i, pod, now, requests);
        } else {
            p.queue.push_back(i);
        }
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
    timing: PodTiming,
}

impl Fleet {
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
            placement.finished(i, pod);
            if let Some(next) = self.pods[pod].queue.pop_front() {
                self.start(next, pod, at, requests);
            }
        }
    }
}
