//! The latency model: what a replica's time to first token and inter-token delay would be.
//!
//! Prefill cost grows with the uncached prompt; cached tokens cost a little, as reading KV blocks
//! does. Kept pure (token counts in, durations out) so tests need no clock.

use std::time::Duration;

/// Per-replica timing knobs, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttft_base_us: u64,
    pub prefill_us_per_token: u64,
    pub cached_prefill_us_per_token: u64,
    pub inter_token_us: u64,
}

impl Timing {
    /// Time from admission to the first output token.
    pub fn ttft(&self, uncached_tokens: u64, cached_tokens: u64) -> Duration {
        let us = self
            .ttft_base_us
            .saturating_add(uncached_tokens.saturating_mul(self.prefill_us_per_token))
            .saturating_add(cached_tokens.saturating_mul(self.cached_prefill_us_per_token));
        Duration::from_micros(us)
    }

    /// When output token `index` (0-based) is due, measured from admission.
    pub fn token_due(&self, ttft: Duration, index: u64) -> Duration {
        ttft.saturating_add(Duration::from_micros(
            index.saturating_mul(self.inter_token_us),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        ttft_base_us: 5_000,
        prefill_us_per_token: 200,
        cached_prefill_us_per_token: 5,
        inter_token_us: 2_000,
    };

    #[test]
    fn ttft_is_base_plus_per_token_costs() {
        assert_eq!(T.ttft(0, 0), Duration::from_millis(5));
        assert_eq!(T.ttft(100, 0), Duration::from_micros(5_000 + 20_000));
        assert_eq!(T.ttft(36, 64), Duration::from_micros(5_000 + 7_200 + 320));
    }

    #[test]
    fn cached_tokens_make_ttft_cheaper() {
        assert!(T.ttft(4, 96) < T.ttft(100, 0));
    }

    #[test]
    fn tokens_follow_at_the_inter_token_delay() {
        let ttft = T.ttft(10, 0);
        assert_eq!(T.token_due(ttft, 0), ttft);
        assert_eq!(T.token_due(ttft, 3), ttft + Duration::from_millis(6));
    }

    #[test]
    fn huge_inputs_saturate() {
        assert_eq!(T.ttft(u64::MAX, u64::MAX), Duration::from_micros(u64::MAX));
    }
}
