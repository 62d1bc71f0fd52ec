//! The prompt chain of the cache-aware strategy: a request's prompt as a chain of prefix
//! hashes, with no tokenizer.
//!
//! A model server caches the KV of prompt *prefixes*, so what matters for placing a request is
//! how long a leading part of its prompt a pod has seen. The chain cuts the prompt where chat
//! prompts naturally diverge (model + system messages, then the document context, then each
//! further message) and, inside long segments, every [`CUT_CHARS`] characters, and hashes each
//! cut point over *everything before it*. Link `i` therefore names the whole prefix up to cut
//! `i`, like a vLLM block hash, and two prompts share exactly their leading run of links.
//! Each turn of a conversation repeats the previous turns verbatim, so its chain extends the
//! previous turn's.
//!
//! Texts are normalized as the other keys normalize them (white-space runs collapse to one
//! space, ends trimmed); cuts count normalized characters. The first link is the request's
//! routing key (`prompt-chain`); with no match in the index, the ring pick is of the link past
//! the tie margin (see `crate::balance::cache_aware`).

use super::anchors::{AnchorBuilder, RequestAnchors, MAX_ANCHORED};
#[cfg(test)]
use super::canonical::normalize_chars;
use super::normalize::{Normalizer, Sink};
use super::{KeyHasher, KeySource, RequestParts, RoutingKey};
use crate::body::{JsonStr, Text};

/// Characters of a segment between extra cuts: about 256 tokens of English text.
pub const CUT_CHARS: usize = 1024;

/// Links kept per request (4 Mi characters of prompt); the rest of a longer prompt is ignored.
pub const MAX_LINKS: usize = 4096;

/// Separators mixed into the hash so segment boundaries cannot be faked by text.
const SEGMENT: char = '\u{1d}';
const PART: char = '\u{1e}';
const FIELD: char = '\u{1f}';

/// A request's prompt chain: at least one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptChain {
    links: Vec<u64>,
    /// Normalized prompt characters up to each link's cut (separators apart).
    ends: Vec<u32>,
    /// The prompt's content anchors (see [`super::anchors`]); empty unless asked for
    /// ([`chain_with_anchors`]).
    anchors: RequestAnchors,
}

impl PromptChain {
    pub fn links(&self) -> &[u64] {
        &self.links
    }

    /// Normalized prompt characters up to the cut of link `i` (`i` < the number of links).
    pub fn chars_up_to(&self, i: usize) -> u64 {
        self.ends.get(i).map_or(0, |&e| u64::from(e))
    }

    /// Leading links whose whole prefix fits in `chars` characters of prompt.
    pub fn links_within(&self, chars: u64) -> usize {
        self.ends.partition_point(|&e| u64::from(e) <= chars)
    }

    /// Normalized prompt characters the chain covers.
    pub fn chars(&self) -> u64 {
        self.ends.last().map_or(0, |&e| u64::from(e))
    }

    /// The prompt's content anchors; empty when the chain was built without them.
    pub fn anchors(&self) -> &RequestAnchors {
        &self.anchors
    }

    /// The routing key: the first link.
    pub fn key(&self) -> RoutingKey {
        RoutingKey {
            hash: self.links[0],
            source: KeySource::PromptChain,
        }
    }
}

/// A character count as the chain keeps it.
fn chars_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Hashes the rendered prompt as it is produced, keeping a link at every cut.
struct Builder {
    hasher: KeyHasher,
    links: Vec<u64>,
    ends: Vec<u32>,
    /// Normalized characters of the current segment.
    count: usize,
    /// Normalized characters of the whole prompt so far.
    total: usize,
    /// Content anchors, when asked for.
    anchors: Option<AnchorBuilder>,
    /// Tests only: normalize character by character (the reference the fast path must match).
    #[cfg(test)]
    by_char: bool,
}

/// The normalizer's output into the builder: runs of ASCII are hashed whole, split only at
/// cuts; `part` puts a part separator before the first character of a text.
struct Emit<'b> {
    b: &'b mut Builder,
    part: bool,
}

impl Sink for Emit<'_> {
    #[inline]
    fn put(&mut self, s: &str) {
        if std::mem::take(&mut self.part) {
            self.b.separator(PART);
        }
        if !s.is_ascii() {
            s.chars().for_each(|c| self.b.emit(c));
            return;
        }
        let mut rest = s;
        while !rest.is_empty() {
            let to_cut = CUT_CHARS - self.b.count % CUT_CHARS;
            let (head, tail) = rest.split_at(to_cut.min(rest.len()));
            self.b.hasher.push_str(head);
            if let Some(a) = self.b.anchors.as_mut() {
                let at = self.b.total;
                let room = (MAX_ANCHORED as usize).saturating_sub(at);
                for (i, &byte) in head.as_bytes().iter().take(room).enumerate() {
                    a.push(byte, chars_u32(at + i + 1));
                }
            }
            self.b.count += head.len();
            self.b.total += head.len();
            if head.len() == to_cut && !self.b.full() {
                self.b.link();
            }
            rest = tail;
        }
    }
}

impl Builder {
    fn new() -> Self {
        Self {
            hasher: KeyHasher::default(),
            links: Vec::new(),
            ends: Vec::new(),
            count: 0,
            total: 0,
            anchors: None,
            #[cfg(test)]
            by_char: false,
        }
    }

    fn with_anchors() -> Self {
        Self {
            anchors: Some(AnchorBuilder::default()),
            ..Self::new()
        }
    }

    /// A new text field: no anchor window spans the boundary.
    fn start_anchor_field(&mut self) {
        let at = chars_u32(self.total);
        if let Some(a) = self.anchors.as_mut() {
            a.start_field(at);
        }
    }

    /// A separator between the parts of a text: hashed and counted, not anchored, and the
    /// next part is a field of its own.
    fn separator(&mut self, c: char) {
        if let Some(a) = self.anchors.as_mut() {
            a.end_field(chars_u32(self.total));
        }
        let anchors = self.anchors.take();
        self.emit(c);
        self.anchors = anchors;
        self.start_anchor_field();
    }

    fn full(&self) -> bool {
        self.links.len() >= MAX_LINKS
    }

    /// A link here: the hash of everything so far, and where it ends.
    fn link(&mut self) {
        self.links.push(self.hasher.digest());
        self.ends
            .push(u32::try_from(self.total).unwrap_or(u32::MAX));
    }

    /// Characters the current segment may still take before the link cap.
    fn room(&self) -> usize {
        (MAX_LINKS - self.links.len()).saturating_mul(CUT_CHARS)
    }

    fn emit(&mut self, c: char) {
        self.hasher.push(c);
        if let Some(a) = self.anchors.as_mut() {
            let at = chars_u32(self.total + 1);
            for &byte in c.encode_utf8(&mut [0; 4]).as_bytes() {
                a.push(byte, at);
            }
        }
        self.count += 1;
        self.total += 1;
        if self.count.is_multiple_of(CUT_CHARS) && !self.full() {
            self.link();
        }
    }

    /// Normalizes `t` into the chain (at most `room` characters); true if it emitted any.
    fn normalized(&mut self, t: &Text<'_>, part: bool) -> bool {
        if !part {
            self.start_anchor_field();
        }
        let room = self.room();
        #[cfg(test)]
        if self.by_char {
            let mut first = true;
            let n = normalize_chars(t.chars(), room, |c| {
                if std::mem::take(&mut first) && part {
                    self.separator(PART);
                }
                self.emit(c);
            });
            return n > 0;
        }
        let mut n = Normalizer::new(room);
        n.feed_text(t, &mut Emit { b: self, part });
        n.emitted() > 0
    }

    /// End the current segment: a link at its end (unless a cut just made one), then the
    /// separator.
    fn close(&mut self) {
        if self.count > 0 && !self.count.is_multiple_of(CUT_CHARS) && !self.full() {
            self.link();
        }
        self.count = 0;
        self.hasher.push(SEGMENT);
    }

    /// A segment of one or more texts (the system messages, the document); nothing at all when
    /// they are empty after normalization.
    fn texts<'t>(&mut self, texts: impl Iterator<Item = Text<'t>>) {
        let mut started = false;
        for t in texts {
            if self.full() {
                return;
            }
            started |= self.normalized(&t, started);
        }
        if started {
            self.close();
        }
    }

    /// One further message: its role, then its text.
    fn message(&mut self, role: Option<JsonStr<'_>>, text: Option<Text<'_>>) {
        if self.full() {
            return;
        }
        if let Some(r) = role {
            r.chars().for_each(|c| self.hasher.push(c));
        }
        self.hasher.push(FIELD);
        // The role alone makes a segment, so an empty message still ends in a link.
        self.count = 0;
        if let Some(t) = text {
            self.normalized(&t, false);
        }
        if self.count == 0 && !self.full() {
            self.link();
            self.hasher.push(SEGMENT);
        } else {
            self.close();
        }
    }
}

/// The prompt chain of a chat (or completions) request; `None` when the body has no prompt.
pub fn chain(req: &RequestParts<'_, '_>) -> Option<PromptChain> {
    build(req, Builder::new())
}

/// [`chain`] with the prompt's content anchors ([`PromptChain::anchors`]), for a model whose
/// pods report their prompts' text: about 3.5 ns more per prompt byte, up to
/// [`MAX_ANCHORED`] characters.
pub fn chain_with_anchors(req: &RequestParts<'_, '_>) -> Option<PromptChain> {
    build(req, Builder::with_anchors())
}

fn build(req: &RequestParts<'_, '_>, mut b: Builder) -> Option<PromptChain> {
    let body = req.body?;
    b.hasher.push_str("chain");
    b.hasher.push(FIELD);
    match req.model {
        Some(m) => b.hasher.push_str(m),
        None => b.hasher.push_str(&body.model().unwrap_or_default()),
    }
    b.hasher.push(FIELD);
    let document = body.document_context().map(Text::One);
    if body.has_messages() {
        b.texts(body.system_texts());
        b.texts(document.into_iter());
        for m in body.chat_messages().filter(|m| !m.is_system()) {
            b.message(m.role, m.text);
        }
    } else {
        b.texts(body.prompt_text().map(Text::One).into_iter());
        b.texts(document.into_iter());
    }
    (!b.links.is_empty()).then_some(PromptChain {
        links: b.links,
        ends: b.ends,
        anchors: b
            .anchors
            .map(|a| a.finish(chars_u32(b.total)))
            .unwrap_or_default(),
    })
}

/// The chain of a JSON request body for model `m`, with anchors when `anchors` (tests).
#[cfg(test)]
pub(crate) fn chain_of_json(body: &str, anchors: bool) -> Option<PromptChain> {
    let fields = crate::body::BodyFields::parse(body.as_bytes());
    let headers = http::HeaderMap::new();
    let req = RequestParts {
        headers: &headers,
        body: fields.as_ref(),
        model: Some("m"),
    };
    match anchors {
        true => chain_with_anchors(&req),
        false => chain(&req),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BodyFields;
    use http::HeaderMap;
    use serde_json::json;

    fn links(body: &serde_json::Value) -> Vec<u64> {
        chain_of_json(&body.to_string(), false)
            .map(|c| c.links)
            .unwrap_or_default()
    }

    fn chat(messages: serde_json::Value) -> serde_json::Value {
        json!({"model": "m", "messages": messages})
    }

    #[test]
    fn each_turn_extends_the_previous_turns_chain() {
        let sys = json!({"role": "system", "content": "You are terse."});
        let u1 = json!({"role": "user", "content": "What is a ring?"});
        let a1 = json!({"role": "assistant", "content": "A circle of points."});
        let u2 = json!({"role": "user", "content": "And a vnode?"});
        let t1 = links(&chat(json!([sys, u1])));
        let t2 = links(&chat(json!([sys, u1, a1, u2])));
        assert_eq!(t1.len(), 2, "system, user");
        assert_eq!(t2.len(), 4);
        assert_eq!(t2[..2], t1[..]);
        // Another user after the same system shares only the first link.
        let other = links(&chat(json!([sys, {"role": "user", "content": "Hello"}])));
        assert_eq!(other[0], t1[0]);
        assert_ne!(other[1], t1[1]);
    }

    #[test]
    fn long_messages_get_a_link_every_cut_and_white_space_does_not_matter() {
        let long = "word ".repeat(CUT_CHARS); // 5 * 1024 characters, 5119 after trimming
        let a = links(&chat(json!([{"role": "user", "content": long}])));
        assert_eq!(a.len(), 5, "cuts at 1024, 2048, 3072, 4096, then the end");
        let spaced = long.replace(' ', "  \n ");
        assert_eq!(
            links(&chat(json!([{"role": "user", "content": spaced}]))),
            a
        );
        // The same text with a different tail shares the links before the divergence.
        let mut changed = long.clone();
        changed.replace_range(3000..3004, "WORD");
        let b = links(&chat(json!([{"role": "user", "content": changed}])));
        assert_eq!(b[..2], a[..2]);
        assert_ne!(b[2], a[2]);
    }

    #[test]
    fn segments_are_model_system_document_then_messages() {
        let base = json!({"model": "m", "document_context": "Doc A",
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]});
        let l = links(&base);
        assert_eq!(l.len(), 3, "system, document, user");
        let mut other_doc = base.clone();
        other_doc["document_context"] = json!("Doc B");
        let o = links(&other_doc);
        assert_eq!(o[0], l[0]);
        assert_ne!(o[1], l[1]);
        // The routed model is part of every link.
        let text = base.to_string();
        let fields = BodyFields::parse(text.as_bytes());
        let headers = HeaderMap::new();
        let req = RequestParts {
            headers: &headers,
            body: fields.as_ref(),
            model: Some("another-model"),
        };
        assert_ne!(chain(&req).unwrap().links[0], l[0]);
        // A role cannot be faked by text: a user message saying "assistant" differs.
        let a = links(&chat(json!([{"role": "assistant", "content": "x"}])));
        let u = links(&chat(json!([{"role": "user", "content": "x"}])));
        assert_ne!(a, u);
    }

    #[test]
    fn completions_prompts_chain_and_bodies_without_a_prompt_do_not() {
        let p = links(&json!({"model": "m", "prompt": "Once upon a time"}));
        assert_eq!(p.len(), 1);
        assert!(links(&json!({"model": "m"})).is_empty());
        assert!(links(&json!({"model": "m", "messages": []})).is_empty());
        let empty = links(&chat(json!([{"role": "user", "content": ""}])));
        assert_eq!(
            empty.len(),
            1,
            "a message with no text still ends in a link"
        );
    }

    /// Bodies rich in what the fast path treats specially: long ASCII runs across cuts,
    /// white-space runs, multi-byte characters, escapes, several system texts and parts.
    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let atom = prop_oneof![
            "[a-z]{1,12}".prop_map(|w| w),
            Just(" ".to_string()),
            Just("  \n\t ".to_string()),
            Just("\u{a0}".to_string()),
            Just("é".to_string()),
            Just("日本".to_string()),
            Just("\u{1f600}".to_string()),
            Just("x".repeat(700)),
            Just("y ".repeat(400)),
        ];
        proptest::collection::vec(atom, 0..12).prop_map(|v| v.concat())
    }

    proptest::proptest! {
        #[test]
        fn the_fast_chain_is_the_character_chain(
            systems in proptest::collection::vec(text(), 0..3),
            doc in proptest::option::of(text()),
            turns in proptest::collection::vec((text(), proptest::bool::ANY), 0..4),
            parts in proptest::collection::vec(text(), 2..3),
        ) {
            let mut messages: Vec<serde_json::Value> = systems
                .iter()
                .map(|s| json!({"role": "system", "content": s}))
                .collect();
            messages.push(json!({"role": "system", "content":
                parts.iter().map(|p| json!({"type": "text", "text": p})).collect::<Vec<_>>()}));
            for (t, user) in &turns {
                messages.push(json!({"role": if *user { "user" } else { "assistant" }, "content": t}));
            }
            let mut body = chat(json!(messages));
            if let Some(d) = doc {
                body["document_context"] = json!(d);
            }
            let text = body.to_string();
            let fields = BodyFields::parse(text.as_bytes());
            let headers = HeaderMap::new();
            let req = RequestParts { headers: &headers, body: fields.as_ref(), model: Some("m") };
            let mut slow = Builder::new();
            slow.by_char = true;
            proptest::prop_assert_eq!(chain(&req), build(&req, slow));
            let mut slow = Builder::with_anchors();
            slow.by_char = true;
            let fast = chain_with_anchors(&req);
            proptest::prop_assert_eq!(&fast, &build(&req, slow));
            // Anchors change no link.
            let plain = chain(&req);
            proptest::prop_assert_eq!(fast.map(|c| c.links), plain.map(|c| c.links));
        }
    }

    #[test]
    fn the_chain_is_capped() {
        let huge = "x".repeat(CUT_CHARS * (MAX_LINKS + 10));
        let l = links(&chat(json!([{"role": "user", "content": huge}])));
        assert_eq!(l.len(), MAX_LINKS);
    }
}
