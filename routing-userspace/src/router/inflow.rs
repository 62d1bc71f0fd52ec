//! What each pod was sent to cache lately: the prompt links new to it (the prefill it was
//! given), per pod, decayed with a half-life of [`HALF_LIFE`]. A proxy that routes alone keeps
//! this even over its pods on cache-aware ties (see [`crate::balance::cache_aware`]), so new
//! documents spread as they arrive.
//!
//! Not the index's entries: the index remembers what it sent for as long as its budget lasts
//! (minutes to hours of traffic), long after the engines evicted it or restarted. Counted that
//! way, a pod that held many prefixes an hour ago looked full to every new one: on three
//! llama.cpp servers restarted between runs, the runs after the first put three documents on
//! one server (16 7 13 and 17 7 12 requests per server, against 12 12 12 in the first run).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::load::Slot;

/// How fast what a pod was sent fades: 30 s, about what an engine that holds a few prompts
/// (llama.cpp, one per slot) keeps, and short beside a vLLM cache, whose content a fresh burst
/// of new prefixes should still spread over.
pub const HALF_LIFE: Duration = Duration::from_secs(30);

/// Units per link in [`Inflow::per_pod`]: the decayed values are compared, so they keep a
/// sixteenth of a link.
pub const UNITS_PER_LINK: f64 = 16.0;

/// New links per pod, decayed.
#[derive(Debug, Default)]
pub struct Inflow {
    pods: Mutex<HashMap<Slot, (f64, Instant)>>,
}

/// `value` as of `then`, decayed to `now`.
fn decayed(value: f64, then: Instant, now: Instant) -> f64 {
    let age = now.saturating_duration_since(then).as_secs_f64();
    value * (-age / HALF_LIFE.as_secs_f64()).exp2()
}

impl Inflow {
    fn lock(&self) -> MutexGuard<'_, HashMap<Slot, (f64, Instant)>> {
        crate::lock::lock(&self.pods)
    }

    /// The pod in `slot` was sent `links` links it did not hold, at `now`.
    pub fn add(&self, slot: Slot, links: usize, now: Instant) {
        if links == 0 {
            return;
        }
        let mut pods = self.lock();
        let (value, then) = pods.entry(slot).or_insert((0.0, now));
        *value = decayed(*value, *then, now) + links as f64;
        *then = now.max(*then);
    }

    /// Each pod's inflow at `now`, in [`UNITS_PER_LINK`]: `out[i]` for the pod that
    /// `index_of` maps to `i`, 0 for the rest.
    pub fn per_pod(&self, index_of: impl Fn(Slot) -> Option<usize>, now: Instant, out: &mut [u64]) {
        out.fill(0);
        let pods = self.lock();
        for (&slot, &(value, then)) in pods.iter() {
            if let Some(o) = index_of(slot).and_then(|i| out.get_mut(i)) {
                *o = (decayed(value, then, now) * UNITS_PER_LINK).round() as u64;
            }
        }
    }

    /// Forget the pods `keep` says are gone (a slot that comes back stands for another pod).
    pub fn retain_pods(&self, keep: impl Fn(Slot) -> bool) {
        self.lock().retain(|&s, _| keep(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_pod_was_sent_halves_every_half_life() {
        let f = Inflow::default();
        let t0 = Instant::now();
        f.add(3, 4, t0);
        f.add(5, 0, t0);
        let at = |now: Instant| {
            let mut out = [u64::MAX; 2];
            f.per_pod(|s| [3, 5].iter().position(|&x| x == s), now, &mut out);
            out
        };
        assert_eq!(
            at(t0),
            [64, 0],
            "4 links, 16 units each; nothing sent is nothing"
        );
        assert_eq!(at(t0 + HALF_LIFE), [32, 0]);
        assert_eq!(at(t0 + 2 * HALF_LIFE), [16, 0]);
        // More sent later adds to what is left.
        f.add(3, 2, t0 + HALF_LIFE);
        assert_eq!(at(t0 + HALF_LIFE), [64, 0]);
        assert_eq!(at(t0 + 2 * HALF_LIFE), [32, 0]);
        // A report from before the last one (a decision that raced) counts as of the last.
        f.add(3, 1, t0);
        assert_eq!(at(t0 + HALF_LIFE), [80, 0]);
        // Long gone is nothing.
        assert_eq!(at(t0 + 40 * HALF_LIFE), [0, 0]);
        f.retain_pods(|s| s != 3);
        assert_eq!(at(t0), [0, 0]);
    }
}
