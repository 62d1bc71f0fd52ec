//! Passive outlier ejection: pods that keep failing leave the candidates for a cool-down.
//!
//! Every attempt reports its outcome. Consecutive failures (connect errors, 5xx answers) past
//! a threshold eject the pod; a connect or first-byte timeout ejects it at once (each one
//! costs a client the whole timeout, so it is never worth paying twice). The cool-down doubles
//! with each repeat ejection. When it ends the pod is back and real traffic probes it: one more
//! failure ejects it again, a success clears its record. Never more than a set share of a
//! model's pods is ejected at once (at least one may always be), so a fleet-wide problem
//! degrades routing instead of emptying it.
//!
//! State is per gauge slot (one per pod address, stable across table rebuilds), in atomics: the
//! request path reads one word to skip an ejected pod and writes nothing on a success unless
//! the pod had failures.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::load::{Slot, MAX_SLOTS};

/// What went wrong with an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection was refused or reset before anything was sent.
    Connect,
    /// Connecting took the whole connect timeout.
    ConnectTimeout,
    /// The pod sent no response head within the first-byte timeout.
    FirstByteTimeout,
    /// The connection broke after the request was sent.
    Reset,
    /// The pod answered with a 5xx status.
    Status(u16),
}

impl Failure {
    /// A timeout ejects at once.
    fn is_timeout(self) -> bool {
        matches!(self, Failure::ConnectTimeout | Failure::FirstByteTimeout)
    }

    fn code(self) -> u8 {
        match self {
            Failure::Connect => 1,
            Failure::ConnectTimeout => 2,
            Failure::FirstByteTimeout => 3,
            Failure::Reset => 4,
            Failure::Status(_) => 5,
        }
    }

    /// Words for `/debug/routing` and logs.
    pub fn describe(code: u8) -> &'static str {
        match code {
            1 => "connect errors",
            2 => "connect timeout",
            3 => "first-byte timeout",
            4 => "connection resets",
            5 => "5xx answers",
            _ => "",
        }
    }
}

/// Ejection settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EjectionPolicy {
    /// Consecutive failures that eject (0: never eject).
    pub after_failures: u32,
    pub base_time: Duration,
    pub max_share: f64,
}

impl EjectionPolicy {
    /// Envoy's outlier-detection defaults: 5 consecutive failures, 10 s, half the pods.
    pub const DEFAULT: Self = Self {
        after_failures: 5,
        base_time: Duration::from_secs(10),
        max_share: 0.5,
    };
}

impl Default for EjectionPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[derive(Debug, Default)]
struct PodHealth {
    consecutive: AtomicU32,
    /// Milliseconds since the registry started until which the pod is out (0: in).
    ejected_until: AtomicU64,
    /// Ejections in a row (the cool-down doubles with each).
    ejections: AtomicU32,
    /// Back from a cool-down and not yet proven: one failure ejects again.
    probation: AtomicBool,
    /// What ejected it last ([`Failure::describe`]).
    reason: AtomicU8,
}

/// A pod that is out, for `/debug/routing`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ejected {
    pub for_ms: u64,
    pub reason: &'static str,
    pub ejections: u32,
}

/// Health of every pod, by slot.
#[derive(Debug)]
pub struct Health {
    policy: EjectionPolicy,
    start: Instant,
    pods: Box<[PodHealth]>,
    /// Which address each slot's record is about (a reused slot starts clean).
    owners: Mutex<Vec<Option<SocketAddr>>>,
}

/// The outcome of reporting a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Kept,
    /// Ejected for this long.
    Ejected(Duration),
    /// It would have been ejected, but the model has ejected its share of pods already.
    Spared,
}

impl Health {
    pub fn new(policy: EjectionPolicy) -> Self {
        Self {
            policy,
            start: Instant::now(),
            pods: (0..MAX_SLOTS).map(|_| PodHealth::default()).collect(),
            owners: Mutex::new(vec![None; MAX_SLOTS]),
        }
    }

    pub fn policy(&self) -> EjectionPolicy {
        self.policy
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_millis() as u64 + 1
    }

    fn pod(&self, slot: Option<Slot>) -> Option<&PodHealth> {
        self.pods.get(slot? as usize)
    }

    /// The pods and their slots changed: a slot now serving another address starts clean.
    pub fn pods_changed(&self, pods: &[(SocketAddr, Slot)]) -> Vec<Slot> {
        let mut owners = crate::lock::lock(&self.owners);
        let mut reassigned = Vec::new();
        for &(addr, slot) in pods {
            let Some(owner) = owners.get_mut(slot as usize) else {
                continue;
            };
            if *owner != Some(addr) {
                *owner = Some(addr);
                reassigned.push(slot);
                let h = &self.pods[slot as usize];
                h.consecutive.store(0, Ordering::Relaxed);
                h.ejected_until.store(0, Ordering::Relaxed);
                h.ejections.store(0, Ordering::Relaxed);
                h.probation.store(false, Ordering::Relaxed);
            }
        }
        reassigned
    }

    /// Whether the pod in `slot` is out of the candidates at `now`.
    #[inline]
    pub fn is_ejected(&self, slot: Option<Slot>, now: Instant) -> bool {
        let Some(h) = self.pod(slot) else {
            return false;
        };
        let until = h.ejected_until.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if self.ms(now) < until {
            return true;
        }
        // The cool-down is over: back in, on probation.
        if h.ejected_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            h.probation.store(true, Ordering::Relaxed);
        }
        false
    }

    /// An attempt on the pod succeeded.
    #[inline]
    pub fn success(&self, slot: Option<Slot>) {
        let Some(h) = self.pod(slot) else {
            return;
        };
        if h.consecutive.load(Ordering::Relaxed) != 0 {
            h.consecutive.store(0, Ordering::Relaxed);
        }
        if h.probation.load(Ordering::Relaxed) {
            h.probation.store(false, Ordering::Relaxed);
            h.ejections.store(0, Ordering::Relaxed);
        }
    }

    /// An attempt on the pod in `slot` failed. `peers` are the slots of the model's pods, to
    /// keep the ejected share bounded.
    pub fn failure(
        &self,
        slot: Option<Slot>,
        failure: Failure,
        peers: impl Iterator<Item = Option<Slot>>,
        now: Instant,
    ) -> Verdict {
        let p = self.policy;
        let Some(h) = self.pod(slot) else {
            return Verdict::Kept;
        };
        if p.after_failures == 0 {
            return Verdict::Kept;
        }
        let n = h.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        let due =
            failure.is_timeout() || h.probation.load(Ordering::Relaxed) || n >= p.after_failures;
        if !due || self.is_ejected(slot, now) {
            return Verdict::Kept;
        }
        let (mut total, mut out) = (0usize, 0usize);
        for peer in peers {
            total += 1;
            if peer != slot && self.is_ejected(peer, now) {
                out += 1;
            }
        }
        let allowed = ((p.max_share * total as f64).floor() as usize).max(1);
        if out + 1 > allowed {
            return Verdict::Spared;
        }
        let times = h.ejections.fetch_add(1, Ordering::Relaxed).min(5);
        let cool = p.base_time.saturating_mul(1 << times);
        h.ejected_until
            .store(self.ms(now) + cool.as_millis() as u64, Ordering::Relaxed);
        h.consecutive.store(0, Ordering::Relaxed);
        h.probation.store(false, Ordering::Relaxed);
        h.reason.store(failure.code(), Ordering::Relaxed);
        Verdict::Ejected(cool)
    }

    /// The pod's ejection, if it is out.
    pub fn ejected(&self, slot: Option<Slot>, now: Instant) -> Option<Ejected> {
        let h = self.pod(slot)?;
        let until = h.ejected_until.load(Ordering::Relaxed);
        let now_ms = self.ms(now);
        (until > now_ms).then(|| Ejected {
            for_ms: until - now_ms,
            reason: Failure::describe(h.reason.load(Ordering::Relaxed)),
            ejections: h.ejections.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(after: u32) -> Health {
        Health::new(EjectionPolicy {
            after_failures: after,
            base_time: Duration::from_secs(10),
            max_share: 0.5,
        })
    }

    const PEERS: [Option<Slot>; 4] = [Some(0), Some(1), Some(2), Some(3)];

    #[test]
    fn consecutive_failures_eject_and_the_cool_down_doubles() {
        let h = health(3);
        let t0 = Instant::now();
        let fail = |t| h.failure(Some(1), Failure::Status(503), PEERS.into_iter(), t);
        assert_eq!(fail(t0), Verdict::Kept);
        h.success(Some(1));
        assert_eq!(fail(t0), Verdict::Kept);
        assert_eq!(fail(t0), Verdict::Kept);
        assert_eq!(fail(t0), Verdict::Ejected(Duration::from_secs(10)));
        assert!(h.is_ejected(Some(1), t0));
        assert!(!h.is_ejected(Some(2), t0));
        assert_eq!(h.ejected(Some(1), t0).unwrap().reason, "5xx answers");
        // Back after the cool-down, on probation: one failure ejects again, for twice as long.
        let t1 = t0 + Duration::from_secs(11);
        assert!(!h.is_ejected(Some(1), t1));
        assert_eq!(fail(t1), Verdict::Ejected(Duration::from_secs(20)));
        // A success after the next return clears the record.
        let t2 = t1 + Duration::from_secs(21);
        assert!(!h.is_ejected(Some(1), t2));
        h.success(Some(1));
        assert_eq!(fail(t2), Verdict::Kept);
    }

    #[test]
    fn a_timeout_ejects_at_once_and_the_share_is_bounded() {
        let h = health(5);
        let t = Instant::now();
        let timeout = |slot| h.failure(Some(slot), Failure::ConnectTimeout, PEERS.into_iter(), t);
        assert!(matches!(timeout(0), Verdict::Ejected(_)));
        assert!(matches!(timeout(1), Verdict::Ejected(_)));
        assert_eq!(timeout(2), Verdict::Spared, "half of four pods is the most");
        assert!(!h.is_ejected(Some(2), t));
        // With two pods, one may go.
        let h = health(1);
        let two = [Some(0), Some(1)];
        assert!(matches!(
            h.failure(Some(0), Failure::Connect, two.into_iter(), t),
            Verdict::Ejected(_)
        ));
        assert_eq!(
            h.failure(Some(1), Failure::Connect, two.into_iter(), t),
            Verdict::Spared
        );
    }

    #[test]
    fn a_reused_slot_starts_clean_and_zero_disables() {
        let h = health(1);
        let t = Instant::now();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        h.pods_changed(&[(a, 0)]);
        h.failure(Some(0), Failure::Connect, PEERS.into_iter(), t);
        assert!(h.is_ejected(Some(0), t));
        h.pods_changed(&[(b, 0)]);
        assert!(!h.is_ejected(Some(0), t), "another pod took the slot");
        let off = health(0);
        off.failure(Some(0), Failure::ConnectTimeout, PEERS.into_iter(), t);
        assert!(!off.is_ejected(Some(0), t));
    }
}
