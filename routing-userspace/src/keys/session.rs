//! Session keys (spec: "Session Affinity"): `X-Session-ID` > `X-Conversation-ID` > body
//! `session_id` > an implicit session derived from the conversation itself.
//!
//! The implicit key must stay the same on every turn of one conversation: turn 1 sends
//! `[system, user1]`, turn 2 `[system, user1, assistant, user2]`, and so on. Hashing "the first
//! N messages" changes between turns 1 and 2. Instead the key is the conversation's *opening*:
//! every system message plus the first user message. Those are exactly the messages every later
//! turn repeats verbatim, so all turns map to one key (and to the pod holding their KV-cache).
//! Two conversations that open identically share a pod, which is what their shared prompt prefix
//! wants anyway.

use super::normalize::Normalizer;
use super::{
    header, KeyHasher, KeySource, RequestParts, RoutingKey, HEADER_CONVERSATION_ID,
    HEADER_SESSION_ID,
};

/// A session id from a header or the body: trimmed, non-empty.
fn usable(v: &str) -> Option<&str> {
    let v = v.trim();
    (!v.is_empty()).then_some(v)
}

pub fn key(req: &RequestParts<'_, '_>) -> Option<RoutingKey> {
    if let Some(v) = header(req.headers, &HEADER_SESSION_ID).and_then(usable) {
        return Some(RoutingKey::new(v, KeySource::SessionHeader));
    }
    if let Some(v) = header(req.headers, &HEADER_CONVERSATION_ID).and_then(usable) {
        return Some(RoutingKey::new(v, KeySource::ConversationHeader));
    }
    let body = req.body?;
    if let Some(v) = body.session_id() {
        if let Some(v) = usable(&v) {
            return Some(RoutingKey::new(v, KeySource::SessionBody));
        }
    }
    implicit(req)
}

/// The implicit session key: system messages + first user message, normalized. The texts are
/// hashed as they are normalized, however long they are; the key is the hash of
/// `implicit\x1f` + each system text + `\x1e` ... + `\x1f` + the first user text.
pub fn implicit(req: &RequestParts<'_, '_>) -> Option<RoutingKey> {
    let body = req.body?;
    let first_user = body.first_user_text()?;
    let mut h = KeyHasher::default();
    h.push_str("implicit\x1f");
    for s in body.system_texts() {
        Normalizer::new(usize::MAX).feed_text(&s, &mut h);
        h.push('\x1e');
    }
    h.push('\x1f');
    Normalizer::new(usize::MAX).feed_text(&first_user, &mut h);
    Some(RoutingKey {
        hash: h.finish(),
        source: KeySource::ImplicitSession,
    })
}
