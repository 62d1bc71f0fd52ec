//! Token budgets: one token bucket per tenant of a model (`tokensPerMinute`, refilled
//! continuously, holding at most `tokenBurst`).
//!
//! A request is charged an estimate when it arrives ([`estimate`]: prompt characters / 4 plus
//! `max_tokens`), and the charge is corrected from the response's `usage` when it ends (a
//! refund or an extra charge; a bucket may go into debt, which later refills repay). A request
//! is admitted while its tenant's bucket holds the estimate, or the whole burst for an estimate
//! larger than the burst (so a large request is slow, never impossible); otherwise it is
//! refused with the time until the bucket will hold it.
//!
//! Memory is bounded: a bucket that has refilled to its burst is the same as no bucket, so
//! those are dropped (a sweep at most once a minute, and whenever the map is at its cap);
//! if the map is still over three quarters of the cap, the least recently used buckets go, so
//! a flood of new tenants costs amortised O(1) each. Time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The token budget of every tenant of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    pub tokens_per_minute: u64,
    /// Most tokens a bucket holds (what an idle tenant may spend at once).
    pub burst: u64,
}

impl TokenBudget {
    fn per_second(&self) -> f64 {
        self.tokens_per_minute as f64 / 60.0
    }
}

/// The estimate charged when a request arrives: prompt characters / 4 plus its `max_tokens`
/// (0 when absent; the correction charges what it really generated).
pub fn estimate(prompt_chars: usize, max_tokens: Option<u64>) -> u64 {
    (prompt_chars / 4) as u64 + max_tokens.unwrap_or(0)
}

/// Buckets kept per model at most.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000;

/// How often full buckets are dropped without pressure.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Tokens taken from one tenant's bucket, to correct or give back.
#[derive(Debug, PartialEq, Eq)]
pub struct Charge {
    pub tenant: u64,
    pub estimate: u64,
}

/// The buckets of one model.
#[derive(Debug)]
pub struct Buckets {
    budget: TokenBudget,
    cap: usize,
    map: HashMap<u64, Bucket>,
    last_sweep: Instant,
    evicted: u64,
}

impl Buckets {
    pub fn new(budget: TokenBudget, cap: usize, now: Instant) -> Self {
        Self {
            budget,
            cap: cap.max(4),
            map: HashMap::new(),
            last_sweep: now,
            evicted: 0,
        }
    }

    pub fn budget(&self) -> TokenBudget {
        self.budget
    }

    /// A changed budget keeps every balance (capped at the new burst).
    pub fn set_budget(&mut self, budget: TokenBudget) {
        self.budget = budget;
        let burst = budget.burst as f64;
        for b in self.map.values_mut() {
            b.tokens = b.tokens.min(burst);
        }
    }

    /// Buckets held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Buckets dropped before they refilled, because of the cap.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// What `tenant` holds at `now` (a full burst when it has no bucket).
    pub fn balance(&self, tenant: u64, now: Instant) -> f64 {
        self.map
            .get(&tenant)
            .map_or(self.budget.burst as f64, |b| self.refilled(*b, now).tokens)
    }

    fn refilled(&self, b: Bucket, now: Instant) -> Bucket {
        let secs = now.saturating_duration_since(b.at).as_secs_f64();
        Bucket {
            tokens: (b.tokens + secs * self.budget.per_second()).min(self.budget.burst as f64),
            at: now.max(b.at),
        }
    }

    /// The tenant's bucket, refilled to `now` (a new one is full).
    fn bucket(&mut self, tenant: u64, now: Instant) -> &mut Bucket {
        if now.saturating_duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.sweep(now);
        }
        if !self.map.contains_key(&tenant) && self.map.len() >= self.cap {
            self.make_room(now);
        }
        let full = Bucket {
            tokens: self.budget.burst as f64,
            at: now,
        };
        let b = self.map.get(&tenant).copied().unwrap_or(full);
        let b = self.refilled(b, now);
        let slot = self.map.entry(tenant).or_insert(b);
        *slot = b;
        slot
    }

    /// Charge `estimate` to `tenant`, or say how long until its bucket holds it.
    pub fn try_charge(
        &mut self,
        tenant: u64,
        estimate: u64,
        now: Instant,
    ) -> Result<Charge, Duration> {
        let need = estimate.min(self.budget.burst) as f64;
        let rate = self.budget.per_second();
        let b = self.bucket(tenant, now);
        if b.tokens >= need {
            b.tokens -= estimate as f64;
            return Ok(Charge { tenant, estimate });
        }
        let wait = (need - b.tokens) / rate;
        Err(Duration::from_secs_f64(wait.min(1e9)))
    }

    /// The request used `actual` tokens: give back or take the difference from its estimate.
    pub fn correct(&mut self, charge: Charge, actual: u64, now: Instant) {
        let burst = self.budget.burst as f64;
        let b = self.bucket(charge.tenant, now);
        b.tokens = (b.tokens + charge.estimate as f64 - actual as f64).min(burst);
    }

    /// The request was never served: the whole estimate goes back.
    pub fn refund(&mut self, charge: Charge, now: Instant) {
        self.correct(charge, 0, now);
    }

    /// Drop the buckets that refilled to the burst (they hold nothing a new one would not).
    fn sweep(&mut self, now: Instant) {
        self.last_sweep = now;
        let burst = self.budget.burst as f64;
        let rate = self.budget.per_second();
        self.map.retain(|_, b| {
            let secs = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens + secs * rate < burst
        });
    }

    /// At the cap: drop full buckets, then the least recently used down to 3/4 of the cap.
    fn make_room(&mut self, now: Instant) {
        self.sweep(now);
        let keep = self.cap * 3 / 4;
        if self.map.len() <= keep {
            return;
        }
        let mut by_age: Vec<(Instant, u64)> = self.map.iter().map(|(k, b)| (b.at, *k)).collect();
        let n = by_age.len() - keep;
        by_age.select_nth_unstable(n - 1);
        for (_, k) in &by_age[..n] {
            self.map.remove(k);
        }
        self.evicted += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn budget(tpm: u64, burst: u64) -> TokenBudget {
        TokenBudget {
            tokens_per_minute: tpm,
            burst,
        }
    }

    #[test]
    fn the_estimate_is_a_quarter_of_the_prompt_plus_max_tokens() {
        assert_eq!(estimate(4000, Some(256)), 1256);
        assert_eq!(estimate(7, None), 1);
        assert_eq!(estimate(0, Some(10)), 10);
    }

    #[test]
    fn charge_until_empty_then_retry_after_is_the_refill_time() {
        let t0 = Instant::now();
        // 600 a minute = 10 a second; burst 100.
        let mut b = Buckets::new(budget(600, 100), 100, t0);
        let c1 = b.try_charge(7, 60, t0).unwrap();
        assert_eq!(
            c1,
            Charge {
                tenant: 7,
                estimate: 60
            }
        );
        assert_eq!(b.balance(7, t0), 40.0);
        // 60 more needs 20 more tokens: 2 s.
        assert_eq!(b.try_charge(7, 60, t0), Err(2 * S));
        // Another tenant has its own bucket.
        assert!(b.try_charge(8, 100, t0).is_ok());
        // After the refill it fits.
        assert!(b.try_charge(7, 60, t0 + 2 * S).is_ok());
        assert_eq!(b.balance(7, t0 + 2 * S), 0.0);
    }

    #[test]
    fn corrections_refund_or_charge_the_difference() {
        let t0 = Instant::now();
        let mut b = Buckets::new(budget(60, 1000), 100, t0);
        let c = b.try_charge(1, 500, t0).unwrap();
        b.correct(c, 200, t0);
        assert_eq!(b.balance(1, t0), 800.0, "300 refunded");
        let c = b.try_charge(1, 500, t0).unwrap();
        b.correct(c, 900, t0);
        assert_eq!(b.balance(1, t0), -100.0, "400 more charged: in debt");
        // Debt is repaid by refills before anything is admitted: 1 token/s.
        assert_eq!(b.try_charge(1, 50, t0), Err(150 * S));
        let c = b.try_charge(2, 10, t0).unwrap();
        b.refund(c, t0);
        assert_eq!(b.balance(2, t0), 1000.0);
        // Never above the burst.
        let c = b.try_charge(3, 10, t0).unwrap();
        b.correct(c, 0, t0 + 3600 * S);
        assert_eq!(b.balance(3, t0 + 3600 * S), 1000.0);
    }

    #[test]
    fn an_estimate_above_the_burst_needs_a_full_bucket_not_an_impossible_one() {
        let t0 = Instant::now();
        let mut b = Buckets::new(budget(6000, 1000), 100, t0);
        assert!(b.try_charge(1, 5000, t0).is_ok());
        assert_eq!(b.balance(1, t0), -4000.0);
        // 5000 tokens at 100/s until the bucket is full again.
        assert_eq!(b.try_charge(1, 5000, t0), Err(50 * S));
        assert!(b.try_charge(1, 5000, t0 + 50 * S).is_ok());
    }

    #[test]
    fn full_buckets_expire_and_the_cap_evicts_the_least_recently_used() {
        let t0 = Instant::now();
        let mut b = Buckets::new(budget(60, 10), 8, t0);
        for t in 0..8 {
            b.try_charge(t, 10, t0 + t as u32 * S).unwrap();
        }
        assert_eq!(b.len(), 8);
        // At the cap nothing has refilled yet (10 s each): the 2 oldest go (down to 3/4).
        b.try_charge(100, 1, t0 + 8 * S).unwrap();
        assert_eq!(b.evicted(), 2);
        assert_eq!(b.len(), 7);
        assert_eq!(
            b.balance(0, t0 + 8 * S),
            10.0,
            "evicted: a new, full bucket"
        );
        // A minute on, every bucket is full and the sweep drops them all, losslessly.
        let later = t0 + 120 * S;
        b.try_charge(200, 1, later).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b.evicted(), 2);
    }

    #[test]
    fn a_new_budget_keeps_balances_under_the_new_burst() {
        let t0 = Instant::now();
        let mut b = Buckets::new(budget(60, 100), 10, t0);
        b.try_charge(1, 30, t0).unwrap();
        b.set_budget(budget(60, 50));
        assert_eq!(b.balance(1, t0), 50.0);
        assert_eq!(b.balance(2, t0), 50.0);
        assert_eq!(b.budget().burst, 50);
    }
}
