//! Routing keys: what a request is pinned by, and where that came from.
//!
//! Extraction is a pure function of (strategy, headers, body, limits). It walks the spec's
//! precedence list for the strategy and returns the first usable key with its [`KeySource`];
//! malformed candidates are skipped (and reported in [`Extraction::ignored`]), never fatal.
//! Keys are hashed immediately: only the 64-bit hash travels further, so no raw key text ends up
//! in memory, labels or logs.

pub mod anchors;
pub mod canonical;
pub mod chain;
pub mod explicit;
pub mod normalize;
pub mod session;

use http::{HeaderMap, HeaderName};

use crate::body::BodyFields;
pub use crate::vocab::KeySource;
use crate::vocab::Strategy;

pub const HEADER_CACHE_KEY: HeaderName = HeaderName::from_static("x-flexinfer-cache-key");
pub const HEADER_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
pub const HEADER_CONVERSATION_ID: HeaderName = HeaderName::from_static("x-conversation-id");

/// A routing key: the hash a ring is walked with, and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingKey {
    pub hash: u64,
    pub source: KeySource,
}

impl RoutingKey {
    pub fn new(text: &str, source: KeySource) -> Self {
        Self {
            hash: hash_key(text),
            source,
        }
    }
}

/// The one hash every key goes through (stable across versions and machines).
pub fn hash_key(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// [`hash_key`] of a text produced piece by piece: the same hash, without the text in memory.
pub struct KeyHasher {
    state: xxhash_rust::xxh3::Xxh3,
    buf: [u8; 256],
    len: usize,
}

impl normalize::Sink for KeyHasher {
    #[inline]
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

impl Default for KeyHasher {
    fn default() -> Self {
        Self {
            state: xxhash_rust::xxh3::Xxh3::new(),
            buf: [0; 256],
            len: 0,
        }
    }
}

impl KeyHasher {
    fn flush(&mut self) {
        self.state.update(&self.buf[..self.len]);
        self.len = 0;
    }

    #[inline]
    pub fn push(&mut self, c: char) {
        if self.len + 4 > self.buf.len() {
            self.flush();
        }
        self.len += c.encode_utf8(&mut self.buf[self.len..]).len();
    }

    pub fn push_str(&mut self, s: &str) {
        let b = s.as_bytes();
        if self.len + b.len() > self.buf.len() {
            self.flush();
            if b.len() > self.buf.len() {
                self.state.update(b);
                return;
            }
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    pub fn finish(mut self) -> u64 {
        self.digest()
    }

    /// The hash of everything pushed so far; more can be pushed after it.
    pub fn digest(&mut self) -> u64 {
        // (xxh3's streaming digest depends only on the bytes, not on how they were split.)
        self.flush();
        self.state.digest()
    }
}

/// Operator knobs bounding keys (spec: "Operator Keying Knobs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLimits {
    pub explicit_key_max_length: usize,
    pub system_segment_max_length: usize,
    pub document_segment_max_length: usize,
}

impl KeyLimits {
    /// The spec's defaults.
    pub const DEFAULT: Self = Self {
        explicit_key_max_length: 128,
        system_segment_max_length: 512,
        document_segment_max_length: 256,
    };
}

impl Default for KeyLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A candidate key that was present but not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    pub source: KeySource,
    pub reason: explicit::Malformed,
}

/// The result of walking a precedence list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extraction {
    pub key: Option<RoutingKey>,
    pub ignored: Vec<Ignored>,
}

/// What the key is derived from for one request.
pub struct RequestParts<'r, 'b> {
    pub headers: &'r HeaderMap,
    pub body: Option<&'r BodyFields<'b>>,
    /// The routed model identity (the resolved model name), used by canonical context.
    pub model: Option<&'r str>,
}

/// The hashing key for `strategy`, walking the spec's precedence list.
pub fn extract(strategy: Strategy, req: &RequestParts<'_, '_>, limits: &KeyLimits) -> Extraction {
    let mut ignored = Vec::new();
    let key = match strategy {
        Strategy::Default | Strategy::LeastLoaded => None,
        Strategy::SessionAffinity => session::key(req),
        Strategy::Prefix => explicit::key(req, limits, &mut ignored)
            .or_else(|| canonical::key(req, limits))
            .or_else(|| session::key(req)),
        Strategy::CacheAware => return extract_with_chain(req, limits, false).0,
    };
    Extraction { key, ignored }
}

/// Cache-aware extraction: an explicit key (as prefix routing reads it) wins; else the prompt
/// chain, whose first link is the key. The chain comes back too, for the index lookup, with
/// its content anchors when `anchors` (pods that report their prompts' text).
pub fn extract_with_chain(
    req: &RequestParts<'_, '_>,
    limits: &KeyLimits,
    anchors: bool,
) -> (Extraction, Option<chain::PromptChain>) {
    let mut ignored = Vec::new();
    if let Some(key) = explicit::key(req, limits, &mut ignored) {
        return (
            Extraction {
                key: Some(key),
                ignored,
            },
            None,
        );
    }
    let chain = match anchors {
        true => chain::chain_with_anchors(req),
        false => chain::chain(req),
    };
    let key = chain.as_ref().map(chain::PromptChain::key);
    (Extraction { key, ignored }, chain)
}

/// Whether key extraction for `strategy` would read the body, given these headers: false when
/// the strategy uses no key or a header that beats every body source supplies it (session
/// headers for session affinity; only `X-Flexinfer-Cache-Key` for prefix and cache-aware). The proxy then streams the body through without reading it.
pub fn needs_body(strategy: Strategy, headers: &HeaderMap, limits: &KeyLimits) -> bool {
    match strategy {
        Strategy::Default | Strategy::LeastLoaded => false,
        Strategy::SessionAffinity | Strategy::Prefix | Strategy::CacheAware => {
            let parts = RequestParts {
                headers,
                body: None,
                model: None,
            };
            match strategy {
                // Session headers come before every body source.
                Strategy::SessionAffinity => session::key(&parts).is_none(),
                // Only the explicit header beats the body: body keys and the canonical
                // context (or the prompt chain) come before the session headers.
                _ => explicit::key(&parts, limits, &mut Vec::new()).is_none(),
            }
        }
    }
}

/// A header's value as text, if present and valid UTF-8.
fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    crate::header_lookup::header(headers, name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests;
