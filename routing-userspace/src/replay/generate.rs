//! Synthetic traces in the Mooncake format, for shapes the public trace lacks.
//!
//! `rag-chat`: a few shared system prompts (skewed popularity), a library of long documents
//! behind them (Zipf popularity), and multi-turn conversations on top: turn `k` repeats the
//! system prompt, the document and every earlier question and answer, then asks again. Block ids
//! follow the Mooncake rule (an id names its whole prefix), so a document read behind two system
//! prompts is two different runs of blocks. Deterministic for a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::trace::TraceRequest;
use std::collections::HashMap;

/// The shapes `--generate` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Shared system prompts + documents + multi-turn conversations.
    RagChat,
}

/// Knobs of the `rag-chat` shape.
#[derive(Debug, Clone, Copy)]
pub struct RagChat {
    pub seed: u64,
    pub conversations: usize,
    /// Seconds over which conversations start (Poisson arrivals).
    pub duration_s: f64,
    pub systems: usize,
    pub documents: usize,
    pub block_tokens: u64,
}

impl Default for RagChat {
    fn default() -> Self {
        Self {
            seed: 7,
            conversations: 700,
            duration_s: 500.0,
            systems: 4,
            documents: 200,
            block_tokens: 512,
        }
    }
}

/// Draws `0..n` with probability proportional to `1 / (i + 1)^s`.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let cumulative = (0..n)
            .map(|i| {
                acc += 1.0 / ((i + 1) as f64).powf(s);
                acc
            })
            .collect();
        Self { cumulative }
    }

    fn draw(&self, rng: &mut StdRng) -> usize {
        let total = *self.cumulative.last().unwrap_or(&1.0);
        let x = rng.random::<f64>() * total;
        self.cumulative
            .partition_point(|&c| c < x)
            .min(self.cumulative.len() - 1)
    }
}

/// A `rag-chat` trace, sorted by arrival.
pub fn rag_chat(k: &RagChat) -> Vec<TraceRequest> {
    let mut rng = StdRng::seed_from_u64(k.seed);
    let mut next_id = 0u64;
    let mut fresh = |n: u64| {
        let ids: Vec<u64> = (next_id..next_id + n).collect();
        next_id += n;
        ids
    };
    let system_sizes: Vec<u64> = (0..k.systems).map(|i| 1 + (i as u64 % 3)).collect();
    let systems: Vec<Vec<u64>> = system_sizes.iter().map(|&n| fresh(n)).collect();
    let doc_sizes: Vec<u64> = (0..k.documents).map(|_| rng.random_range(8..=40)).collect();
    let system_pick = Zipf::new(k.systems.max(1), 1.0);
    let doc_pick = Zipf::new(k.documents.max(1), 1.0);
    // (system, document) -> its blocks behind that system prompt.
    let mut doc_blocks: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
    let mut out = Vec::new();
    let mut start_ms = 0.0f64;
    let mean_gap_ms = k.duration_s * 1000.0 / k.conversations.max(1) as f64;
    for _ in 0..k.conversations {
        start_ms += -mean_gap_ms * (1.0 - rng.random::<f64>()).ln();
        let s = system_pick.draw(&mut rng);
        let mut prompt = systems[s].clone();
        if rng.random::<f64>() < 0.8 {
            let d = doc_pick.draw(&mut rng);
            let blocks = doc_blocks
                .entry((s, d))
                .or_insert_with(|| fresh(doc_sizes[d]));
            prompt.extend_from_slice(blocks);
        }
        let turns = 1 + (0..7).take_while(|_| rng.random::<f64>() < 0.6).count();
        let mut at = start_ms;
        let mut answer_tokens = 0u64;
        for _ in 0..turns {
            // The previous answer and this question join the prompt.
            let new_tokens = answer_tokens + rng.random_range(40..400);
            prompt.extend(fresh(new_tokens.div_ceil(k.block_tokens)));
            let output = rng.random_range(32..=512);
            let input =
                prompt.len() as u64 * k.block_tokens - rng.random_range(0..k.block_tokens / 2);
            out.push(TraceRequest {
                timestamp: at as u64,
                input_length: input,
                output_length: output,
                hash_ids: prompt.clone(),
            });
            answer_tokens = output;
            // Reading the answer and typing the next question.
            at += 15_000.0 - 25_000.0 * (1.0 - rng.random::<f64>()).ln();
        }
    }
    out.sort_by_key(|r| r.timestamp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rag_chat_is_deterministic_and_has_its_shape() {
        let k = RagChat {
            conversations: 200,
            ..RagChat::default()
        };
        let a = rag_chat(&k);
        assert_eq!(a, rag_chat(&k));
        assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        assert!(a.len() > 300, "multi-turn: {} requests", a.len());
        // Every request starts with one of the shared system prompts.
        let heads: std::collections::BTreeSet<u64> = a.iter().map(|r| r.hash_ids[0]).collect();
        assert!(heads.len() <= k.systems, "{heads:?}");
        // A later turn extends an earlier one: its prompt starts with the earlier prompt.
        let extends = a.iter().any(|r| {
            a.iter()
                .any(|e| e.hash_ids.len() < r.hash_ids.len() && r.hash_ids.starts_with(&e.hash_ids))
        });
        assert!(extends);
        assert!(a
            .iter()
            .all(|r| r.input_length <= r.hash_ids.len() as u64 * 512));
    }
}
