//! A borrowed, top-level-only view of an OpenAI-style JSON request body.
//!
//! The proxy needs a handful of fields (model, session and cache keys, messages, documents) and
//! forwards the body untouched, so it never builds a JSON tree: one strict scan
//! ([`scan`]) validates the body and records where the interesting top-level values are; each
//! accessor then interprets only its own value, and texts are decoded lazily ([`text`]). A field
//! of an unexpected type reads as absent, so a strange body can never fail key extraction.
//!
//! The accessors keep the exact semantics of reading the body with `serde_json` into typed
//! structs (one malformed message hides all messages, as a failed `Vec<Message>` would); the
//! differential tests in `tests.rs` hold the two readings equal on generated bodies.

pub mod scan;
pub mod text;

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use scan::DEFAULT_MAX_DEPTH;
use scan::{elements, members, ScanError, Scanner};
pub use text::{JsonStr, Text};

/// Why a body gives no view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Not a JSON object (another JSON value, or not JSON at all).
    NotObject,
    /// Nested deeper than the limit.
    TooDeep,
}

/// The top-level fields a request body is read for.
const FIELDS: [&str; 12] = [
    "model",
    "session_id",
    "cache_key",
    "cacheKey",
    "prefix",
    "messages",
    "document_context",
    "documentContext",
    "context",
    "documents",
    "prompt",
    "stream",
];
const MODEL: usize = 0;
const SESSION_ID: usize = 1;
const CACHE_KEY: usize = 2;
const CACHE_KEY_CAMEL: usize = 3;
const PREFIX: usize = 4;
const MESSAGES: usize = 5;
const DOCUMENT_CONTEXT: usize = 6;
const DOCUMENT_CONTEXT_CAMEL: usize = 7;
const CONTEXT: usize = 8;
const DOCUMENTS: usize = 9;
const PROMPT: usize = 10;
/// Not a routing field: read so a cache-aware request knows whether its answer streams (see
/// `crate::router::teaching`); repeated, the last one counts, as for any key routing ignores.
const STREAM: usize = 11;

#[derive(Debug)]
pub struct BodyFields<'a> {
    /// Raw value text of each of [`FIELDS`], when present.
    raw: [Option<&'a str>; FIELDS.len()],
    /// `messages` read as a list of messages (in the scan that validates the body); `None`
    /// when it does not read so.
    messages: Option<Vec<Message<'a>>>,
}

/// A value that is `null` or absent reads as `None`; a string as its text; anything else is a
/// type error (`Err`), which invalidates the struct it is part of.
fn optional_string(raw: Option<&str>) -> Result<Option<JsonStr<'_>>, ()> {
    match raw {
        None | Some("null") => Ok(None),
        Some(r) => JsonStr::new(r).map(Some).ok_or(()),
    }
}

/// A value that must be a string.
fn as_str(raw: Option<&str>) -> Option<JsonStr<'_>> {
    JsonStr::new(raw?)
}

/// The named fields of a struct-shaped value: an object (keys decoded, unknown keys ignored,
/// a repeated field invalid) or an array read positionally with at most `N` elements (serde's
/// sequence form of a struct). `required` is the number of leading positions a sequence must
/// fill. `None` when the value is neither, or invalid.
fn struct_fields<'a, const N: usize>(
    raw: &'a str,
    names: [&str; N],
    required: usize,
) -> Option<[Option<&'a str>; N]> {
    let mut out = [None; N];
    match raw.as_bytes().first() {
        Some(b'{') => {
            for (k, v) in members(raw) {
                let key = JsonStr::new(k)?;
                if let Some(i) = names.iter().position(|n| key.eq_str(n)) {
                    if out[i].replace(v).is_some() {
                        return None;
                    }
                }
            }
        }
        Some(b'[') => {
            let mut n = 0;
            for v in elements(raw) {
                if n == N {
                    return None;
                }
                out[n] = Some(v);
                n += 1;
            }
            if n < required {
                return None;
            }
        }
        _ => return None,
    }
    Some(out)
}

/// One chat message: its role and raw content (absent when `null`).
#[derive(Debug)]
struct Message<'a> {
    role: Option<JsonStr<'a>>,
    content: Option<&'a str>,
}

fn message(raw: &str) -> Option<Message<'_>> {
    let [role, content] = struct_fields(raw, ["role", "content"], 0)?;
    message_from(role, content)
}

fn message_from<'a>(role: Option<&'a str>, content: Option<&'a str>) -> Option<Message<'a>> {
    Some(Message {
        role: optional_string(role).ok()?,
        content: content.filter(|c| *c != "null"),
    })
}

/// The `messages` value at the scanner's cursor, scanned and validated exactly as
/// [`Scanner::value`] at depth 1 would, and read as messages in the same pass (each content
/// string is scanned once, for the whole body). Returns its raw text, and the messages unless
/// it is not an array of messages (as for a failed `Vec<Message>`: one malformed message hides
/// them all).
fn scan_messages<'a>(
    s: &mut Scanner<'a>,
) -> Result<(&'a str, Option<Vec<Message<'a>>>), ScanError> {
    s.skip_ws();
    let start = s.pos();
    if s.peek() != Some(b'[') {
        return s.value(1).map(|raw| (raw, None));
    }
    // The array is at depth 1, its elements at 2, their members' values at 3.
    s.check_depth(1)?;
    s.open();
    let mut out = Some(Vec::with_capacity(8));
    let mut first = true;
    while s.element_start(first)? {
        first = false;
        s.skip_ws();
        if s.peek() != Some(b'{') {
            // The sequence form of a struct, or not a message at all.
            let raw = s.value(2)?;
            read_into(&mut out, || message(raw));
            continue;
        }
        s.check_depth(2)?;
        s.open();
        let (mut role, mut content) = (None, None);
        let mut repeated = false;
        let mut first_member = true;
        while let Some((k, v)) = s.next_member(first_member, 3)? {
            first_member = false;
            let slot = match JsonStr::new(k).map(|key| (key, key.plain())) {
                Some((_, Some(b"role"))) => &mut role,
                Some((_, Some(b"content"))) => &mut content,
                // Escaped: decoded to compare.
                Some((key, None)) if key.eq_str("role") => &mut role,
                Some((key, None)) if key.eq_str("content") => &mut content,
                _ => continue,
            };
            repeated |= slot.replace(v).is_some();
        }
        read_into(&mut out, || match repeated {
            true => None,
            false => message_from(role, content),
        });
    }
    Ok((s.since(start), out))
}

/// Adds a message to the list, or drops the list when `read` finds none (once dropped, the
/// rest of the array is only scanned).
fn read_into<'a>(out: &mut Option<Vec<Message<'a>>>, read: impl FnOnce() -> Option<Message<'a>>) {
    if let Some(list) = out {
        match read() {
            Some(m) => list.push(m),
            None => *out = None,
        }
    }
}

/// One chat message as [`BodyFields::chat_messages`] hands it out.
#[derive(Debug, Clone)]
pub struct ChatMessage<'a> {
    pub role: Option<JsonStr<'a>>,
    pub text: Option<Text<'a>>,
}

impl ChatMessage<'_> {
    /// A `system` (or `developer`) message, as [`BodyFields::system_texts`] counts them.
    pub fn is_system(&self) -> bool {
        is_role(self.role, &["system", "developer"])
    }
}

/// Text of a message content: a plain string, or the text parts of an array (parts without a
/// type, or of type `text` / `input_text`) joined by spaces. Any malformed part hides them all.
fn content_text(raw: &str) -> Option<Text<'_>> {
    match raw.as_bytes().first() {
        Some(b'"') => JsonStr::new(raw).map(Text::One),
        Some(b'[') => {
            let mut texts = Vec::new();
            for part in elements(raw) {
                let [kind, text] = struct_fields(part, ["type", "text"], 0)?;
                let kind = optional_string(kind).ok()?;
                let text = optional_string(text).ok()?;
                let wanted = kind.is_none_or(|k| k.eq_str("text") || k.eq_str("input_text"));
                if let (true, Some(t)) = (wanted, text) {
                    texts.push(t);
                }
            }
            match texts.len() {
                0 => None,
                1 => Some(Text::One(texts[0])),
                _ => Some(Text::Parts(texts)),
            }
        }
        _ => None,
    }
}

fn is_role(role: Option<JsonStr<'_>>, names: &[&str]) -> bool {
    role.is_some_and(|r| names.iter().any(|n| r.eq_str(n)))
}

/// The first of `keys` present at the top level of a JSON object body, as a whole number
/// (`max_tokens`, `max_completion_tokens`); `None` when absent or not a whole number. A scan of
/// its own, run only when a token budget needs it.
pub fn top_level_count(body: &[u8], keys: &[&str]) -> Option<u64> {
    let mut s = Scanner::new(std::str::from_utf8(body).ok()?, DEFAULT_MAX_DEPTH);
    if s.open() != Some(true) {
        return None;
    }
    let mut first = true;
    let mut found: Option<(usize, u64)> = None;
    while let Ok(Some((key, value))) = s.next_member(first, 1) {
        first = false;
        let Some(key) = JsonStr::new(key) else { break };
        let Some(rank) = keys.iter().position(|k| key.eq_str(k)) else {
            continue;
        };
        let n = value.trim().parse().ok();
        if let Some(n) = n.filter(|_| found.is_none_or(|(r, _)| rank < r)) {
            found = Some((rank, n));
        }
    }
    found.map(|(_, n)| n)
}

impl<'a> BodyFields<'a> {
    /// `None` when the body is not a JSON object.
    pub fn parse(body: &'a [u8]) -> Option<Self> {
        Self::parse_with_depth(body, DEFAULT_MAX_DEPTH).ok()
    }

    /// Read a body, rejecting nesting deeper than `max_depth`.
    pub fn parse_with_depth(body: &'a [u8], max_depth: u32) -> Result<Self, BodyError> {
        let invalid = |e: ScanError| match e {
            ScanError::TooDeep => BodyError::TooDeep,
            ScanError::Syntax => BodyError::NotObject,
        };
        // The one UTF-8 check of the body: every value read from it is a slice of this `str`.
        let Ok(text) = std::str::from_utf8(body) else {
            return Err(BodyError::NotObject);
        };
        let mut s = Scanner::new(text, max_depth);
        if s.open() != Some(true) {
            return Err(BodyError::NotObject);
        }
        let mut raw = [None; FIELDS.len()];
        let mut messages = None;
        let mut seen = 0u32;
        let mut first = true;
        while let Some(key) = s.next_key(first).map_err(invalid)? {
            first = false;
            let key = JsonStr::new(key).ok_or(BodyError::NotObject)?;
            let field = match key.plain() {
                Some(k) => FIELDS.iter().position(|f| f.as_bytes() == k),
                None => FIELDS.iter().position(|f| key.eq_str(f)),
            };
            let Some(i) = field else {
                s.value(1).map_err(invalid)?;
                continue;
            };
            let value = match i {
                MESSAGES => {
                    let (value, list) = scan_messages(&mut s).map_err(invalid)?;
                    messages = list;
                    value
                }
                _ => s.value(1).map_err(invalid)?,
            };
            // After the value: a repeated field whose value is too deep is reported as too deep.
            if i == STREAM {
                raw[i] = Some(value);
                continue;
            }
            if seen & (1 << i) != 0 {
                // A repeated field is an error for a typed reading of the body.
                return Err(BodyError::NotObject);
            }
            seen |= 1 << i;
            // `null` reads as absent, as for an optional field.
            raw[i] = (value != "null").then_some(value);
        }
        if !s.at_end() {
            return Err(BodyError::NotObject);
        }
        Ok(Self { raw, messages })
    }

    fn string(&self, field: usize) -> Option<Cow<'a, str>> {
        as_str(self.raw[field]).map(|s| s.decode())
    }

    pub fn model(&self) -> Option<Cow<'a, str>> {
        self.string(MODEL)
    }

    /// The byte range of the top-level `model` value inside `body` (the slice this view was
    /// parsed from), so it can be replaced without touching any other byte.
    pub fn model_span(&self, body: &[u8]) -> Option<std::ops::Range<usize>> {
        let raw = self.raw[MODEL]?;
        let start = (raw.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
        let end = start + raw.len();
        (end <= body.len()).then_some(start..end)
    }

    /// Whether the request asks for a streamed answer (`"stream": true`).
    pub fn streams(&self) -> bool {
        self.raw[STREAM] == Some("true")
    }

    pub fn session_id(&self) -> Option<Cow<'a, str>> {
        self.string(SESSION_ID)
    }

    pub fn cache_key(&self) -> Option<Cow<'a, str>> {
        self.string(CACHE_KEY)
    }

    pub fn cache_key_camel(&self) -> Option<Cow<'a, str>> {
        self.string(CACHE_KEY_CAMEL)
    }

    pub fn prefix(&self) -> Option<Cow<'a, str>> {
        self.string(PREFIX)
    }

    /// The messages, if `messages` is a list of well-formed messages (else none at all).
    fn messages(&self) -> impl Iterator<Item = &Message<'a>> {
        self.messages.iter().flatten()
    }

    /// Whether the body carries a non-empty `messages` array (a chat request).
    pub fn has_messages(&self) -> bool {
        self.messages().next().is_some()
    }

    /// The text of every `role: "system"` message, in order (`developer` counts as system).
    pub fn system_texts(&self) -> impl Iterator<Item = Text<'a>> + '_ {
        self.messages()
            .filter(|m| is_role(m.role, &["system", "developer"]))
            .filter_map(|m| m.content.and_then(content_text))
    }

    /// Every message in order: its role and its text (`None` when it has none), for keys that
    /// follow the whole conversation (the cache-aware prompt chain).
    pub fn chat_messages(&self) -> impl Iterator<Item = ChatMessage<'a>> + '_ {
        self.messages().map(|m| ChatMessage {
            role: m.role,
            text: m.content.and_then(content_text),
        })
    }

    /// The text of the first `role: "user"` message.
    pub fn first_user_text(&self) -> Option<Text<'a>> {
        self.messages()
            .find(|m| is_role(m.role, &["user"]))
            .and_then(|m| m.content.and_then(content_text))
    }

    /// Document context: `document_context`, `documentContext`, `context`, or the text of the
    /// first entry of `documents[]` (a string, or an object's `text` / `content`), in that order.
    pub fn document_context(&self) -> Option<JsonStr<'a>> {
        let direct = [DOCUMENT_CONTEXT, DOCUMENT_CONTEXT_CAMEL, CONTEXT]
            .into_iter()
            .find_map(|f| as_str(self.raw[f]));
        direct.or_else(|| {
            let docs = self.raw[DOCUMENTS].filter(|d| d.starts_with('['))?;
            let first = elements(docs).next()?;
            if let Some(s) = JsonStr::new(first) {
                return Some(s);
            }
            let [text, content] = struct_fields(first, ["text", "content"], 2)?;
            let (text, content) = (optional_string(text).ok()?, optional_string(content).ok()?);
            text.or(content)
        })
    }

    /// A completions `prompt`: the string, or the first string of an array of strings.
    pub fn prompt_text(&self) -> Option<JsonStr<'a>> {
        let raw = self.raw[PROMPT]?;
        if let Some(s) = JsonStr::new(raw) {
            return Some(s);
        }
        if !raw.starts_with('[') {
            return None;
        }
        let mut list = elements(raw).map(JsonStr::new);
        let first = list.next()?;
        // Every element must be a string, as for a `Vec<String>`.
        if list.any(|s| s.is_none()) {
            return None;
        }
        first
    }
}

/// `body` with its top-level `model` value replaced by the JSON string `model`; `None` when the
/// body has no `model` field.
pub fn rewrite_model(body: &[u8], fields: &BodyFields<'_>, model: &str) -> Option<Vec<u8>> {
    let span = fields.model_span(body)?;
    let value = serde_json::to_string(model).expect("a string serializes");
    let mut out = Vec::with_capacity(body.len() + value.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(&body[span.end..]);
    Some(out)
}
