//! Content anchors: fingerprints of a text chosen by its content, not its position, so a
//! document inside a request and the same document inside an engine's rendered prompt (chat
//! template, special tokens and all) share them, in the same order.
//!
//! Why: llama.cpp can report each slot's prompt as text (`/slots` with
//! `LLAMA_SERVER_SLOTS_DEBUG=1`). That text is the template's rendering, so the request's
//! chain links (hashes over the request's fields) cannot be recomputed from it. Fingerprints
//! chosen by winnowing can: every [`KGRAM`]-byte window of the normalized text is hashed
//! (rolling), and of every [`WINNOW`] consecutive windows the one with the least hash is an
//! anchor. The choice depends only on the [`SPAN`] bytes around it, so inside a message's
//! content both sides choose alike, and every [`SPAN`] bytes hold an anchor: consecutive
//! anchors' windows overlap, so a run of the request's anchors found in the same order in a
//! slot's means the slot holds that text (a run that skips nothing of it), not just
//! sentences the two share. A request's anchors restart at every text field (a message, a
//! part), whose boundaries the template rewrites; [`held_chars`] lets a slot's run skip the
//! template's anchors between two fields.

use std::collections::HashMap;

/// Bytes a fingerprint covers.
pub const KGRAM: usize = 32;

/// Windows per winnowing choice: an anchor at least every `KGRAM + WINNOW - 1` bytes, about
/// one in `(WINNOW + 1) / 2` on average.
pub const WINNOW: usize = 16;

/// The longest stretch of text with no anchor.
pub const SPAN: usize = KGRAM + WINNOW - 1;

/// A slot's anchors a run may skip between two of the request's fields: the template's text
/// around a message and a short message with no anchor of its own.
pub const FIELD_GAP: usize = 32;

/// Where a slot's run may start: the occurrences of the request's first anchor tried.
const STARTS_TRIED: usize = 8;

/// The rolling hash's base (odd, so every byte of the window moves every bit above its own).
const BASE: u64 = 0x100_0000_01B3;

/// `BASE^KGRAM`: what the byte leaving the window weighs.
const BASE_K: u64 = {
    let mut p = 1u64;
    let mut i = 0;
    while i < KGRAM {
        p = p.wrapping_mul(BASE);
        i += 1;
    }
    p
};

/// Characters of a request's prompt that are anchored (about 8,000 tokens): past them a
/// slot's match is not told apart from a longer one, and a request costs at most this much
/// hashing (about 3.5 ns a byte, `cargo bench -p routing-userspace --bench route -- anchors`).
pub const MAX_ANCHORED: u32 = 32 << 10;

/// Winnowing over one run of text: feed bytes, get anchors.
#[derive(Debug, Clone)]
pub struct Winnower {
    window: [u8; KGRAM],
    hash: u64,
    /// Bytes since the last restart.
    bytes: u64,
    /// The last [`WINNOW`] windows' hashes, by window index modulo [`WINNOW`].
    recent: [u64; WINNOW],
    /// The least of them (the rightmost on a tie) and its window's index.
    least: (u64, u64),
    /// The index of the window last chosen.
    chosen: Option<u64>,
}

impl Default for Winnower {
    fn default() -> Self {
        Self {
            window: [0; KGRAM],
            hash: 0,
            bytes: 0,
            recent: [0; WINNOW],
            least: (u64::MAX, 0),
            chosen: None,
        }
    }
}

impl Winnower {
    /// Forget everything: the next anchor is at least [`SPAN`] bytes on.
    pub fn restart(&mut self) {
        self.window = [0; KGRAM];
        self.hash = 0;
        self.bytes = 0;
        self.least = (u64::MAX, 0);
        self.chosen = None;
    }

    /// Take one byte; a new anchor, if this byte completes a choice: its fingerprint and how
    /// many bytes before this one its window ends.
    #[inline]
    pub fn push(&mut self, b: u8) -> Option<(u64, usize)> {
        let slot = (self.bytes % KGRAM as u64) as usize;
        let out = std::mem::replace(&mut self.window[slot], b);
        // Until the window is full, the byte that "leaves" is the restart's zero.
        self.hash = self
            .hash
            .wrapping_mul(BASE)
            .wrapping_add(u64::from(b))
            .wrapping_sub(u64::from(out).wrapping_mul(BASE_K));
        self.bytes += 1;
        if self.bytes < KGRAM as u64 {
            return None;
        }
        let idx = self.bytes - KGRAM as u64;
        self.recent[(idx % WINNOW as u64) as usize] = self.hash;
        if idx == 0 || self.hash <= self.least.0 {
            self.least = (self.hash, idx);
        } else if self.least.1 + WINNOW as u64 <= idx {
            // The least left the window: find the window's least again, the rightmost on a
            // tie (16 compares, once every few bytes).
            let first = idx + 1 - WINNOW as u64;
            let mut least = (u64::MAX, first);
            for at in first..=idx {
                let h = self.recent[(at % WINNOW as u64) as usize];
                if h <= least.0 {
                    least = (h, at);
                }
            }
            self.least = least;
        }
        if idx + 1 < WINNOW as u64 || self.chosen == Some(self.least.1) {
            return None;
        }
        self.chosen = Some(self.least.1);
        Some((self.least.0, (idx - self.least.1) as usize))
    }
}

/// Every anchor of `text` (already normalized), in order.
pub fn anchors(text: &str) -> Vec<u64> {
    let mut w = Winnower::default();
    text.bytes()
        .filter_map(|b| w.push(b).map(|a| a.0))
        .collect()
}

/// A request's anchors: in order, each with where its window ends (in the chain's normalized
/// characters), grouped by text field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAnchors {
    anchors: Vec<u64>,
    ends: Vec<u32>,
    /// Per field: its first anchor's index and where the field ends.
    fields: Vec<(u32, u32)>,
}

/// Builds [`RequestAnchors`] as the chain builder emits the prompt.
#[derive(Debug, Default)]
pub struct AnchorBuilder {
    winnower: Winnower,
    out: RequestAnchors,
    open: bool,
}

impl AnchorBuilder {
    /// A new text field begins (the last one, if any, ended at `at` characters).
    pub fn start_field(&mut self, at: u32) {
        self.end_field(at);
        self.winnower.restart();
        let first = u32::try_from(self.out.anchors.len()).unwrap_or(u32::MAX);
        self.out.fields.push((first, at));
        self.open = true;
    }

    /// The current field, if any, ends at `at` characters.
    pub fn end_field(&mut self, at: u32) {
        if std::mem::take(&mut self.open) {
            if let Some(f) = self.out.fields.last_mut() {
                // A field past the anchored part counts as held up to it, no further.
                f.1 = at.min(MAX_ANCHORED);
            }
        }
    }

    /// One byte of the field; `at`: characters up to and including it.
    #[inline]
    pub fn push(&mut self, b: u8, at: u32) {
        if at > MAX_ANCHORED {
            return;
        }
        if let Some((hash, back)) = self.winnower.push(b) {
            self.out.anchors.push(hash);
            self.out
                .ends
                .push(at.saturating_sub(u32::try_from(back).unwrap_or(u32::MAX)));
        }
    }

    pub fn finish(mut self, at: u32) -> RequestAnchors {
        self.end_field(at);
        self.out
    }
}

impl RequestAnchors {
    pub fn is_empty(&self) -> bool {
        self.anchors.is_empty()
    }

    /// The anchors of field `f`.
    fn field(&self, f: usize) -> std::ops::Range<usize> {
        let start = self.fields[f].0 as usize;
        let end = self
            .fields
            .get(f + 1)
            .map_or(self.anchors.len(), |n| n.0 as usize);
        start..end
    }
}

/// A slot's prompt as anchors, with where each fingerprint first occurs.
#[derive(Debug, Clone, Default)]
pub struct SlotAnchors {
    seq: Vec<u64>,
    first: HashMap<u64, u32>,
    /// The next occurrence of the same fingerprint (`u32::MAX`: none).
    next: Vec<u32>,
}

impl SlotAnchors {
    /// The anchors of `text` (already normalized).
    pub fn of(text: &str) -> Self {
        let seq = anchors(text);
        let mut first: HashMap<u64, u32> = HashMap::with_capacity(seq.len());
        let mut last: HashMap<u64, u32> = HashMap::with_capacity(seq.len());
        let mut next = vec![u32::MAX; seq.len()];
        for (i, &a) in seq.iter().enumerate() {
            let i = i as u32;
            first.entry(a).or_insert(i);
            if let Some(prev) = last.insert(a, i) {
                next[prev as usize] = i;
            }
        }
        Self { seq, first, next }
    }

    pub fn len(&self) -> usize {
        self.seq.len()
    }

    /// A hash of the first `n` anchors: what names a prompt by its beginning (a document
    /// asked another question keeps it).
    pub fn head(&self, n: usize) -> u64 {
        let bytes: Vec<u8> = self
            .seq
            .iter()
            .take(n)
            .flat_map(|a| a.to_le_bytes())
            .collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    fn occurrences(&self, a: u64) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.first.get(&a).copied().unwrap_or(u32::MAX);
        std::iter::from_fn(move || {
            let here = (at != u32::MAX).then_some(at as usize)?;
            at = self.next[here];
            Some(here)
        })
    }
}

/// How much of the request's prompt, in the chain's characters, the slot holds from the start
/// of its first field with an anchor: the longest run of the request's anchors found in the
/// slot's in the same order, skipping at most [`FIELD_GAP`] of the slot's between two fields
/// and none inside one. A field matched whole counts to its end; a run that stops inside a
/// field counts to its last matched anchor's window.
pub fn held_chars(req: &RequestAnchors, slot: &SlotAnchors) -> u32 {
    let Some(f0) = (0..req.fields.len()).find(|&f| !req.field(f).is_empty()) else {
        return 0;
    };
    let first = req.anchors[req.field(f0).start];
    slot.occurrences(first)
        .take(STARTS_TRIED)
        .map(|p| run_from(req, f0, slot, p))
        .max()
        .unwrap_or(0)
}

fn run_from(req: &RequestAnchors, f0: usize, slot: &SlotAnchors, start: usize) -> u32 {
    let mut held = 0;
    let mut p = start;
    for f in f0..req.fields.len() {
        let range = req.field(f);
        if range.is_empty() {
            continue;
        }
        if f != f0 {
            let want = req.anchors[range.start];
            let gap_end = (p + FIELD_GAP).min(slot.seq.len());
            match (p..gap_end).find(|&q| slot.seq[q] == want) {
                Some(q) => p = q,
                None => return held,
            }
        }
        for i in range {
            if slot.seq.get(p) != Some(&req.anchors[i]) {
                return held;
            }
            held = req.ends[i];
            p += 1;
        }
        held = req.fields[f].1;
    }
    held
}

/// Test text: `words` words drawn from a small vocabulary by `seed`.
#[cfg(test)]
pub(crate) fn prose(seed: u64, words: usize) -> String {
    let vocab = [
        "the", "cache", "of", "a", "pod", "holds", "prompt", "tokens", "while", "router", "sends",
        "each", "document", "question", "slot", "engine", "answer", "stream",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vocab[(x % vocab.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request side of `fields` (already normalized), as the chain builder feeds it.
    fn request(fields: &[&str]) -> RequestAnchors {
        let mut b = AnchorBuilder::default();
        let mut at = 0u32;
        for f in fields {
            b.start_field(at);
            for byte in f.bytes() {
                at += 1;
                b.push(byte, at);
            }
        }
        b.finish(at)
    }

    #[test]
    fn every_span_of_text_holds_an_anchor() {
        let text = prose(1, 3000);
        let mut w = Winnower::default();
        let mut last = 0usize;
        for (i, b) in text.bytes().enumerate() {
            if let Some((_, back)) = w.push(b) {
                let end = i + 1 - back;
                assert!(end - last <= SPAN + 1 || last == 0, "{last} -> {end}");
                last = end;
            }
        }
        let n = anchors(&text).len();
        let per = text.len() / n;
        assert!((WINNOW / 4..WINNOW).contains(&per), "{per} bytes an anchor");
    }

    #[test]
    fn a_text_anchors_alike_whatever_surrounds_it() {
        let doc = prose(7, 2000);
        let alone = anchors(&doc);
        let rendered = format!("<|im_start|>system {doc}<|im_end|> <|im_start|>user Why?");
        let inside = anchors(&rendered);
        // The document's anchors, in order, as one run of the rendering's.
        let start = inside.iter().position(|a| *a == alone[0]).expect("found");
        assert_eq!(&inside[start..start + alone.len()], &alone[..]);
    }

    #[test]
    fn a_slot_holds_the_run_of_the_fields_it_has_in_order() {
        let doc = prose(2, 1500);
        let question = "and what does the slot say about the engine, in one short line?";
        let req = request(&[&doc, question]);
        let doc_end = doc.len() as u32;
        let total = (doc.len() + question.len()) as u32;
        let slot = |text: &str| SlotAnchors::of(text);
        // The same document and question, rendered.
        let same = slot(&format!("<|im_start|>system {doc}<|im_end|> <|im_start|>user {question}<|im_end|> <|im_start|>assistant"));
        assert_eq!(held_chars(&req, &same), total);
        // The document, another question: the document, to its end.
        let other_q = slot(&format!("<|im_start|>system {doc}<|im_end|> <|im_start|>user a different question about something else entirely, longer<|im_end|>"));
        assert_eq!(held_chars(&req, &other_q), doc_end);
        // Another document: nothing.
        assert_eq!(held_chars(&req, &slot(&prose(3, 1500))), 0);
        // The document cut short (a slot that stopped reading it): up to the cut.
        let half = &doc[..doc.len() / 2];
        let h = held_chars(&req, &slot(half));
        assert!(h > 0 && h <= half.len() as u32, "{h}");
        assert!(h + SPAN as u32 >= half.len() as u32, "{h}");
    }

    #[test]
    fn documents_that_share_all_but_their_first_line_are_told_apart() {
        // The bench's documents: one heading each, then the same sentences in another order.
        let sentences = [
            "Routing keeps a conversation on the replica that holds its cache.",
            "A shared system prompt is computed once per replica that serves it.",
            "Bounded loads stop one replica from queueing while others idle.",
            "Every answer must cite the section of the document it comes from.",
        ];
        let doc = |d: usize| {
            let body: Vec<&str> = (0..40).map(|i| sentences[(d + i * 3) % 4]).collect();
            format!(
                "[run 7] Answer from the document only. Document {d}: {}",
                body.join(" ")
            )
        };
        for d in 0..4 {
            let req = request(&[&doc(d), "Question 1: what about replicas?"]);
            for e in 0..4 {
                let held = held_chars(
                    &req,
                    &SlotAnchors::of(&format!("<s>system {} </s>", doc(e))),
                );
                match d == e {
                    true => assert_eq!(held, doc(d).len() as u32, "{d}"),
                    // At most the heading before the document's number.
                    false => assert!(held < 64, "{d} in {e}: {held}"),
                }
            }
        }
    }

    #[test]
    fn only_the_first_anchored_characters_count() {
        let doc = prose(9, 12_000); // about 70,000 characters
        assert!(doc.len() as u32 > 2 * MAX_ANCHORED);
        let req = request(&[&doc]);
        let held = held_chars(&req, &SlotAnchors::of(&doc));
        assert_eq!(held, MAX_ANCHORED, "held up to the cap, not past it");
    }

    #[test]
    fn a_restart_forgets_the_bytes_before_it() {
        let text = prose(3, 400);
        let mut a = Winnower::default();
        "some earlier text that is long enough to fill a window or two of it"
            .bytes()
            .for_each(|b| {
                a.push(b);
            });
        a.restart();
        let after: Vec<u64> = text
            .bytes()
            .filter_map(|b| a.push(b).map(|x| x.0))
            .collect();
        assert_eq!(after, anchors(&text));
        assert!(held_chars(&RequestAnchors::default(), &SlotAnchors::of(&text)) == 0);
    }
}
