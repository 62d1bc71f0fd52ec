//! Routing keys: what a request is pinned by, and where that came from.
//!
//! Extraction is a pure function of (strategy, headers, body, limits). It walks the spec's
//! precedence list for the strategy and returns the first usable key with its [`KeySource`];
//! malformed candidates are skipped (and reported in [`Extraction::ignored`]), never fatal.
//! Keys are hashed immediately: only the 64-bit hash travels further, so no raw key text ends up
//! in memory, labels or logs.

pub mod canonical;
pub mod explicit;
pub mod session;

use std::fmt;

use http::HeaderMap;

use crate::body::BodyFields;
use crate::discovery::Strategy;

pub const HEADER_CACHE_KEY: &str = "x-flexinfer-cache-key";
pub const HEADER_SESSION_ID: &str = "x-session-id";
pub const HEADER_CONVERSATION_ID: &str = "x-conversation-id";

/// Where a routing key came from; the string form is the `key_source` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySource {
    /// `X-Flexinfer-Cache-Key` header.
    ExplicitHeader,
    /// Body `cache_key` / `cacheKey`.
    ExplicitBody,
    /// Body `prefix` (legacy explicit field).
    PrefixField,
    /// Hash of model identity + system messages + document context.
    Canonical,
    /// `X-Session-ID` header.
    SessionHeader,
    /// `X-Conversation-ID` header.
    ConversationHeader,
    /// Body `session_id`.
    SessionBody,
    /// Hash of the conversation's opening messages.
    ImplicitSession,
    /// No key.
    None,
}

impl KeySource {
    pub const ALL: [KeySource; 9] = [
        KeySource::ExplicitHeader,
        KeySource::ExplicitBody,
        KeySource::PrefixField,
        KeySource::Canonical,
        KeySource::SessionHeader,
        KeySource::ConversationHeader,
        KeySource::SessionBody,
        KeySource::ImplicitSession,
        KeySource::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::ExplicitHeader => "explicit-header",
            KeySource::ExplicitBody => "explicit-body",
            KeySource::PrefixField => "prefix-field",
            KeySource::Canonical => "canonical",
            KeySource::SessionHeader => "session-header",
            KeySource::ConversationHeader => "conversation-header",
            KeySource::SessionBody => "session-body",
            KeySource::ImplicitSession => "implicit-session",
            KeySource::None => "none",
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Operator knobs bounding keys (spec: "Operator Keying Knobs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLimits {
    pub explicit_key_max_length: usize,
    pub system_segment_max_length: usize,
    pub document_segment_max_length: usize,
}

impl Default for KeyLimits {
    fn default() -> Self {
        Self {
            explicit_key_max_length: 128,
            system_segment_max_length: 512,
            document_segment_max_length: 256,
        }
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
    };
    Extraction { key, ignored }
}

/// A header's value as text, if present and valid UTF-8.
fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests;
