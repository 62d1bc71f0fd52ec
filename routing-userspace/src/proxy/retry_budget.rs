//! The retry budget: retries may add at most a set share of the requests seen over the last
//! ten seconds, plus a small allowance per second, so a failing fleet is not hit with a wave
//! of retries on top of its load. (Moving on after a failed connect sends nothing, so it is
//! not counted.)
//!
//! Counts live in ten one-second buckets of atomics, reused round-robin: deciding is a few
//! atomic loads, no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const BUCKETS: usize = 10;

#[derive(Debug, Default)]
struct Bucket {
    /// The second this bucket counts (since the budget started).
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: u64,
    start: Instant,
    buckets: [Bucket; BUCKETS],
}

impl RetryBudget {
    /// Retries may add this share of requests.
    pub const DEFAULT_SHARE: f64 = 0.2;
    /// Retries always allowed per second.
    pub const DEFAULT_MIN_PER_SECOND: u32 = 5;

    pub fn new(ratio: f64, min_per_second: u32) -> Self {
        Self {
            ratio: if ratio.is_finite() {
                ratio.max(0.0)
            } else {
                0.0
            },
            min_per_second: u64::from(min_per_second),
            start: Instant::now(),
            buckets: Default::default(),
        }
    }

    fn bucket(&self, now: Instant) -> &Bucket {
        let second = now.saturating_duration_since(self.start).as_secs() + 1;
        let b = &self.buckets[(second as usize) % BUCKETS];
        let seen = b.second.load(Ordering::Relaxed);
        if seen != second
            && b.second
                .compare_exchange(seen, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            b.requests.store(0, Ordering::Relaxed);
            b.retries.store(0, Ordering::Relaxed);
        }
        b
    }

    /// Count a request.
    pub fn request(&self, now: Instant) {
        self.bucket(now).requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Take a retry if the budget has room; returns whether it did.
    pub fn try_retry(&self, now: Instant) -> bool {
        let current = self.bucket(now);
        let second = current.second.load(Ordering::Relaxed);
        let (mut requests, mut retries) = (0u64, 0u64);
        for b in &self.buckets {
            if second.saturating_sub(b.second.load(Ordering::Relaxed)) < BUCKETS as u64 {
                requests += b.requests.load(Ordering::Relaxed);
                retries += b.retries.load(Ordering::Relaxed);
            }
        }
        let allowed = (self.ratio * requests as f64) as u64 + self.min_per_second * BUCKETS as u64;
        if retries >= allowed {
            return false;
        }
        current.retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_stay_within_the_share_of_requests() {
        let b = RetryBudget::new(0.2, 0);
        let t = Instant::now();
        for _ in 0..100 {
            b.request(t);
        }
        let granted = (0..100).filter(|_| b.try_retry(t)).count();
        assert_eq!(granted, 20);
        // Ten seconds later the window has moved on.
        let later = t + Duration::from_secs(11);
        assert!(!b.try_retry(later), "no requests in the window, no minimum");
    }

    #[test]
    fn a_quiet_model_may_still_retry_a_little() {
        let b = RetryBudget::new(0.2, 1);
        let t = Instant::now();
        let granted = (0..100).filter(|_| b.try_retry(t)).count();
        assert_eq!(granted, 10, "one per second over the ten-second window");
    }
}
