//! When a model's pods are full, for admission and for the decision.
//!
//! A pod is full at its model's `maxConcurrency` (its load as picks read it: requests in
//! flight, node-wide or as the pod reports, plus picks and reservations not started yet), or
//! when its fresh engine report says it queues or its KV cache is nearly full
//! ([`FullWhen`]). Admission lets a request in while some pod has room (free slots beyond the
//! requests it admitted that no load counts yet); the decision then passes over full pods, as
//! it passes over ejected ones, so a request never lands on a pod at its limit while another
//! has room.

use std::time::Instant;

use super::Router;
use crate::admission::{EngineQueue, FullWhen};
use crate::table::{ModelRoute, Pod};

impl Router {
    /// A pod's load as admission counts it: picks' load plus unexpired reservations.
    fn admission_load(&self, pod: &Pod, now: Instant) -> u64 {
        self.bounded_load(pod, now) + self.pod_reservations(pod, now)
    }

    /// What the pod's fresh engine report says of its queue.
    fn engine_queue(&self, pod: &Pod, now: Instant) -> Option<EngineQueue> {
        let (waiting, kv_usage) = self.signals().queue_state(pod.slot?, now);
        (waiting.is_some() || kv_usage.is_some()).then(|| EngineQueue {
            waiting: waiting.unwrap_or(0),
            kv_usage,
        })
    }

    /// Whether `pod` of `m` takes no new request now, and its load (read only when the model
    /// has a `maxConcurrency`: without one, only the engine's report can say full).
    fn fullness(&self, m: &ModelRoute, pod: &Pod, now: Instant) -> (bool, u64) {
        self.fullness_by(&self.full_when, m, pod, now)
    }

    /// [`Router::fullness`] under `rule` instead of the proxy's.
    fn fullness_by(&self, rule: &FullWhen, m: &ModelRoute, pod: &Pod, now: Instant) -> (bool, u64) {
        let max = m.spec.admission.max_concurrency;
        let report = self.engine_queue(pod, now);
        let load = match max {
            Some(_) => self.admission_load(pod, now),
            None => 0,
        };
        (rule.is_full(max, load, report.as_ref()), load)
    }

    /// Whether `pod` of `m` takes no new request now.
    pub fn is_full(&self, m: &ModelRoute, pod: &Pod, now: Instant) -> bool {
        self.fullness(m, pod, now).0
    }

    /// Whether `pod` is full by its `maxConcurrency` or its KV cache, whatever its queue.
    fn full_by_limit_or_cache(&self, m: &ModelRoute, pod: &Pod, now: Instant) -> bool {
        let rule = FullWhen {
            waiting_above: crate::admission::Above(None),
            ..self.full_when
        };
        self.fullness_by(&rule, m, pod, now).0
    }

    /// Whether `m` can take one more request, `starting` requests being admitted already but
    /// not counted by any load. A model without pods always can (its requests go to the
    /// Service).
    pub fn has_room(&self, m: &ModelRoute, starting: usize, now: Instant) -> bool {
        if m.pods.is_empty() {
            return true;
        }
        let max = m.spec.admission.max_concurrency;
        let mut free = 0u64;
        for pod in &m.pods {
            let (full, load) = self.fullness(m, pod, now);
            if full {
                continue;
            }
            match max {
                // Room without a limit: only an engine report could have said full.
                None => return true,
                Some(max) => free += u64::from(max) - load,
            }
        }
        free > starting as u64
    }

    /// The pods of `m` that are full now, when some are and some are not (then the decision
    /// passes over them); `None` when none is full, or all are (nothing to prefer). Runs per
    /// decision, so the flags are allocated only once a pod is full.
    #[cfg(test)]
    pub(super) fn full_pods(&self, m: &ModelRoute, now: Instant) -> Option<Box<[bool]>> {
        self.full_pods_keeping(m, now, None)
    }

    /// [`Router::full_pods`], where `holder` (the pod that alone holds a cache-aware request's
    /// prompt, [`crate::balance::cache_aware::sole_holder`], or in a fleet the hash's pick for
    /// a prompt this proxy knows no holder of, [`crate::balance::cache_aware::agreed_holder`])
    /// is full only at its
    /// `maxConcurrency` or by its KV cache, not because its engine reports a queue: anywhere
    /// else the request pays its whole prompt again as prefill, which costs more than the wait
    /// (three llama.cpp servers behind three proxies: 8 of the 10 requests that missed a
    /// document the fleet had placed had been passed over this way, 8 s of prefill against
    /// about 1 s in the queue).
    pub(super) fn full_pods_keeping(
        &self,
        m: &ModelRoute,
        now: Instant,
        holder: Option<usize>,
    ) -> Option<Box<[bool]>> {
        let mut full: Option<Box<[bool]>> = None;
        for (i, pod) in m.pods.iter().enumerate() {
            let is_full = match holder == Some(i) {
                true => self.full_by_limit_or_cache(m, pod, now),
                false => self.is_full(m, pod, now),
            };
            if is_full {
                full.get_or_insert_with(|| vec![false; m.pods.len()].into_boxed_slice())[i] = true;
            }
        }
        full.filter(|f| !f.iter().all(|&f| f))
    }

    /// The proxy-wide rule of when a pod's engine report makes it full.
    pub fn set_full_when(&mut self, full_when: FullWhen) {
        self.full_when = full_when;
    }
}
