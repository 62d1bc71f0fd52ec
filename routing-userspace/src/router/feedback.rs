//! The cache-aware index's closed loop: each answer says how much of its prompt the pod found
//! cached (`usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`), and the
//! index had predicted a depth. When the pod reports clearly less than predicted, it no longer
//! holds what the index believes (it evicted the prefix, restarted, or other proxies' traffic
//! pushed it out), and the links past what it evidently holds are forgotten for it, so the
//! next pick does not count on them. Reports that agree change nothing: the pick already taught
//! the index the whole chain.
//!
//! Tokens become prompt characters with the request's own ratio (the chain's characters over
//! the reported prompt tokens), since the proxy has no tokenizer. Engines cache whole blocks
//! (vLLM 16 tokens) and the chain cuts every 1,024 characters, so a report within
//! [`TOLERANCE_LINKS`] links of the prediction agrees.
//!
//! One shortfall alone forgets nothing either: the request that missed put the prefix back in
//! the pod's cache (an engine caches what it prefills), whatever had pushed it out (an
//! eviction, a restart, two requests racing for one llama.cpp slot). Only the second shortfall
//! in a row on a pod, with no answer that agreed in between, forgets: that pod keeps little of
//! what it is sent (prefix caching off, or a cache too small for its traffic). Forgetting on the
//! first made a lone proxy place the prefix afresh on another pod, which then held one prompt
//! too many (on three llama.cpp servers of two slots, one such miss moved a document and two
//! more misses followed). A report that falls short of a prediction resting on a prefix another
//! request in flight is still teaching the pod (see [`super::teaching`]) forgets nothing and
//! does not count toward the row: the pod has not lost it, it does not hold it yet.
//!
//! Per pod, predicted and reported cached tokens add up for `/debug/routing` (how well the
//! index's belief matches the fleet) beside the forgotten links.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use crate::keys::chain::PromptChain;
use crate::load::{Slot, MAX_SLOTS};
use crate::signals::Usage;

/// Links by which a report may fall short of the prediction and still agree.
pub const TOLERANCE_LINKS: usize = 1;

/// Shortfalls in a row on one pod (no agreeing answer between them) from which the index
/// forgets what the pod evidently lost (see the module doc).
pub const SHORT_IN_A_ROW_TO_FORGET: u64 = 2;

/// Characters per token when a report gives no prompt token count.
const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;

/// What one answer says about the index's belief.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The engine reported no cached count.
    Unknown,
    /// The report is about what the index predicted (or more).
    Agrees,
    /// The pod evidently holds only the first `held` links: forget the rest of the prediction.
    Lost { held: usize },
}

/// Judge one answer: `predicted` links were believed held by the pod that served it.
pub fn verdict(chain: &PromptChain, predicted: usize, usage: &Usage) -> Verdict {
    let Some(cached) = usage.cached_tokens else {
        return Verdict::Unknown;
    };
    let per_token = chars_per_token(chain, usage);
    let held = chain.links_within((cached as f64 * per_token).round() as u64);
    if held + TOLERANCE_LINKS >= predicted {
        Verdict::Agrees
    } else {
        Verdict::Lost { held }
    }
}

/// What one answer's report made of the index's prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// No report, or one that agrees.
    None,
    /// Short of the prediction, the first in a row on the pod: the request put the prefix back,
    /// nothing forgotten.
    Kept,
    /// Short of the prediction again: the index forgot this many links for the pod.
    Forgot(usize),
    /// Short of a prediction that rested on a prefix a request in flight was still teaching
    /// the pod (see [`super::teaching`]): nothing forgotten.
    StillTaught,
}

/// Predicted against reported, per pod.
#[derive(Debug)]
pub struct CacheFeedback {
    pods: Box<[PodFeedback]>,
}

#[derive(Debug, Default)]
struct PodFeedback {
    answers: AtomicU64,
    predicted_tokens: AtomicU64,
    reported_tokens: AtomicU64,
    /// Answers whose report fell short of the prediction.
    lost: AtomicU64,
    forgotten_links: AtomicU64,
    /// Of those, answers whose prediction rested on a prefix still being taught.
    still_taught: AtomicU64,
    /// Of those, first shortfalls in a row (nothing forgotten).
    kept: AtomicU64,
    /// Shortfalls since the last answer that agreed (prefixes still taught apart).
    short_in_a_row: AtomicU64,
}

/// One pod's counters, for `/debug/routing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FeedbackView {
    pub answers: u64,
    pub predicted_cached_tokens: u64,
    pub reported_cached_tokens: u64,
    pub fell_short: u64,
    pub forgotten_links: u64,
    /// Fell short while a request in flight was still teaching the prefix (nothing forgotten).
    pub fell_short_while_taught: u64,
    /// Fell short for the first time in a row (the request put the prefix back: kept).
    pub fell_short_kept: u64,
}

impl Default for CacheFeedback {
    fn default() -> Self {
        Self {
            pods: (0..MAX_SLOTS).map(|_| PodFeedback::default()).collect(),
        }
    }
}

impl CacheFeedback {
    /// Count an answer of `slot`'s pod: the prediction in tokens, the report, and what fell
    /// short of the prediction.
    pub fn record(&self, slot: Slot, predicted_tokens: u64, usage: &Usage, short: Shortfall) {
        let Some(p) = self.pods.get(slot as usize) else {
            return;
        };
        p.answers.fetch_add(1, Relaxed);
        p.predicted_tokens.fetch_add(predicted_tokens, Relaxed);
        p.reported_tokens
            .fetch_add(usage.cached_tokens.unwrap_or(0), Relaxed);
        match short {
            Shortfall::None => {}
            Shortfall::Kept => {
                p.lost.fetch_add(1, Relaxed);
                p.kept.fetch_add(1, Relaxed);
            }
            Shortfall::Forgot(n) => {
                p.lost.fetch_add(1, Relaxed);
                p.forgotten_links.fetch_add(n as u64, Relaxed);
            }
            Shortfall::StillTaught => {
                p.lost.fetch_add(1, Relaxed);
                p.still_taught.fetch_add(1, Relaxed);
            }
        }
    }

    /// An answer of `slot`'s pod fell short of its prediction: whether it is the
    /// [`SHORT_IN_A_ROW_TO_FORGET`]th or later in a row, so the index should forget.
    pub fn short_again(&self, slot: Slot) -> bool {
        self.pods
            .get(slot as usize)
            .is_some_and(|p| p.short_in_a_row.fetch_add(1, Relaxed) + 1 >= SHORT_IN_A_ROW_TO_FORGET)
    }

    /// An answer of `slot`'s pod agreed with its prediction: the row of shortfalls ends.
    pub fn agreed(&self, slot: Slot) {
        if let Some(p) = self.pods.get(slot as usize) {
            p.short_in_a_row.store(0, Relaxed);
        }
    }

    /// `slot`'s counters (`None` before its first answer).
    pub fn view(&self, slot: Slot) -> Option<FeedbackView> {
        let p = self.pods.get(slot as usize)?;
        let answers = p.answers.load(Relaxed);
        (answers > 0).then(|| FeedbackView {
            answers,
            predicted_cached_tokens: p.predicted_tokens.load(Relaxed),
            reported_cached_tokens: p.reported_tokens.load(Relaxed),
            fell_short: p.lost.load(Relaxed),
            forgotten_links: p.forgotten_links.load(Relaxed),
            fell_short_while_taught: p.still_taught.load(Relaxed),
            fell_short_kept: p.kept.load(Relaxed),
        })
    }

    /// A slot that now stands for another pod starts from nothing.
    pub fn reset(&self, slot: Slot) {
        if let Some(p) = self.pods.get(slot as usize) {
            for c in [
                &p.answers,
                &p.predicted_tokens,
                &p.reported_tokens,
                &p.lost,
                &p.forgotten_links,
                &p.still_taught,
                &p.kept,
                &p.short_in_a_row,
            ] {
                c.store(0, Relaxed);
            }
        }
    }
}

/// The prediction in tokens: the characters of the predicted links at the request's ratio.
pub fn predicted_tokens(chain: &PromptChain, predicted: usize, usage: &Usage) -> u64 {
    if predicted == 0 {
        return 0;
    }
    (chain.chars_up_to(predicted - 1) as f64 / chars_per_token(chain, usage)) as u64
}

/// The request's prompt characters per reported prompt token.
fn chars_per_token(chain: &PromptChain, usage: &Usage) -> f64 {
    match usage.prompt_tokens {
        0 => DEFAULT_CHARS_PER_TOKEN,
        _ if chain.chars() == 0 => DEFAULT_CHARS_PER_TOKEN,
        t => chain.chars() as f64 / t as f64,
    }
}

#[cfg(test)]
mod tests;
