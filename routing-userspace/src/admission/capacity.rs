//! When a pod is full: the rule the caller's [`super::Room`] applies per pod.
//!
//! A pod takes no new request when its load (requests in flight, as the fleet signals count
//! them) has reached the model's `maxConcurrency`, or when its fresh engine report says it is
//! queueing (more than `--full-when-waiting-above` requests waiting) or its KV cache is nearly
//! full (above `--full-when-kv-usage-above`). A stale report says nothing: only the
//! concurrency limit applies then.
//!
//! Defaults: full when the engine reports *any* waiting request (above 0): a request sent to
//! an engine that queues waits there in arrival order, where no priority or tenant turn can
//! reorder it, so it is better off waiting here. KV use above 0.95: near the top of its cache
//! an engine starts preempting (and recomputing) running sequences to make room, which costs
//! more than a short wait here; below that, the waiting count is the better signal.

use std::str::FromStr;

/// What a fresh engine report says about a pod (a stale one is `None` to [`FullWhen::is_full`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineQueue {
    /// Requests the engine holds waiting (vLLM `num_requests_waiting`, llama.cpp deferred).
    pub waiting: u64,
    /// KV-cache use, 0 to 1, when the engine reports it.
    pub kv_usage: Option<f64>,
}

/// A threshold that can be turned off (`off`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Above<T>(pub Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for Above<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => write!(f, "{v}"),
            None => f.write_str("off"),
        }
    }
}

/// `--full-when-waiting-above`: a count, or `off`.
impl FromStr for Above<u64> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(Above(None));
        }
        t.parse()
            .map(|n| Above(Some(n)))
            .map_err(|_| format!("{s:?} is not a whole number of waiting requests or off"))
    }
}

/// `--full-when-kv-usage-above`: a share from 0 to 1 (below 1: at 1 the cache is full
/// anyway), or `off`.
impl FromStr for Above<f64> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(Above(None));
        }
        match t.parse::<f64>() {
            Ok(x) if (0.0..1.0).contains(&x) => Ok(Above(Some(x))),
            _ => Err(format!(
                "{s:?} is not a KV-cache share from 0 up to (not including) 1, or off"
            )),
        }
    }
}

/// The engine-report half of "full" (the proxy-wide knobs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FullWhen {
    pub waiting_above: Above<u64>,
    pub kv_usage_above: Above<f64>,
}

pub const DEFAULT_FULL_WHEN: FullWhen = FullWhen {
    waiting_above: Above(Some(0)),
    kv_usage_above: Above(Some(0.95)),
};

impl Default for FullWhen {
    fn default() -> Self {
        DEFAULT_FULL_WHEN
    }
}

impl FullWhen {
    /// Whether one pod takes no new request. `load` is its requests in flight as the caller
    /// counts them (fleet-wide when it knows), `report` its engine report if fresh.
    pub fn is_full(
        &self,
        max_concurrency: Option<u32>,
        load: u64,
        report: Option<&EngineQueue>,
    ) -> bool {
        if max_concurrency.is_some_and(|max| load >= u64::from(max)) {
            return true;
        }
        let Some(r) = report else { return false };
        self.waiting_above.0.is_some_and(|n| r.waiting > n)
            || matches!((self.kv_usage_above.0, r.kv_usage), (Some(x), Some(kv)) if kv > x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(waiting: u64, kv: Option<f64>) -> Option<EngineQueue> {
        Some(EngineQueue {
            waiting,
            kv_usage: kv,
        })
    }

    #[test]
    fn fullness_table() {
        let d = DEFAULT_FULL_WHEN;
        let off = FullWhen {
            waiting_above: Above(None),
            kv_usage_above: Above(None),
        };
        for (rule, max, load, r, full) in [
            // No limit, no report: never full (today's behaviour).
            (d, None, 1000, None, false),
            (d, Some(2), 1, None, false),
            (d, Some(2), 2, None, true),
            (d, Some(2), 5, None, true),
            (d, None, 0, report(0, Some(0.5)), false),
            (d, None, 0, report(1, None), true),
            (d, None, 0, report(0, Some(0.96)), true),
            (d, None, 0, report(0, Some(0.95)), false),
            (off, None, 0, report(50, Some(0.99)), false),
            (off, Some(1), 1, report(0, None), true),
            (
                FullWhen {
                    waiting_above: Above(Some(4)),
                    kv_usage_above: Above(None),
                },
                None,
                0,
                report(4, Some(1.0)),
                false,
            ),
        ] {
            assert_eq!(
                rule.is_full(max, load, r.as_ref()),
                full,
                "{rule:?} {max:?} {load} {r:?}"
            );
        }
    }

    #[test]
    fn thresholds_parse_or_say_why() {
        assert_eq!("0".parse::<Above<u64>>(), Ok(Above(Some(0))));
        assert_eq!(" OFF ".parse::<Above<u64>>(), Ok(Above(None)));
        assert!("-1".parse::<Above<u64>>().is_err());
        assert_eq!("0.8".parse::<Above<f64>>(), Ok(Above(Some(0.8))));
        assert_eq!("off".parse::<Above<f64>>(), Ok(Above(None)));
        for bad in ["1", "1.5", "-0.1", "NaN", "lots"] {
            assert!(bad.parse::<Above<f64>>().is_err(), "{bad}");
        }
        assert_eq!(Above(Some(0.95)).to_string(), "0.95");
        assert_eq!(Above::<u64>(None).to_string(), "off");
    }
}
