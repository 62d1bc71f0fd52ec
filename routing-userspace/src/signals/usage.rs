//! Usage in responses: how many prompt tokens the engine took from its prefix cache, read from
//! the response body as it streams through, so the router can compare what it predicted with
//! what the pod did.
//!
//! Where engines put it (read from their sources):
//! - OpenAI and vLLM: the body's top-level `usage`, with
//!   `usage.prompt_tokens_details.cached_tokens` (vLLM: with `--enable-prompt-tokens-details`);
//!   streamed, a chunk carrying `usage` (with `stream_options.include_usage` the one before
//!   `data: [DONE]`; with vLLM's `continuous_usage_stats` every chunk, the last one final).
//! - llama.cpp's server: the same `usage` (OpenAI shape), plus a `timings` object with
//!   `cache_n` (prompt tokens reused from the cache), `prompt_n` (prompt tokens computed) and
//!   `predicted_n`, on the final response and on the last streamed chunk, even without
//!   `include_usage`. (Its native `/completion` also has `tokens_cached`, but that counts the
//!   whole cached context after the request, not the prompt tokens reused, so it is not read.)
//! - The Responses API: `usage.input_tokens`, `input_tokens_details.cached_tokens`.
//!
//! This runs on the token stream, so [`UsageObserver::feed`] does per frame one memchr scan
//! (for the `g` of `"usage"` and `"timings"`) and a copy of the last few bytes (a key split
//! across frames); it allocates only when it finds one of them, and keeps at most [`MAX_CAPTURE`]
//! bytes of each: the latest `usage` and `timings` objects, copied as they pass (a run of
//! bytes at a time). Only [`UsageObserver::usage`] parses them, once, at the end of the body,
//! into a few integer fields (`counts`), not a JSON tree. JSON and
//! SSE bodies are read alike: the keys are searched for in the bytes, so no event framing is
//! needed, and a quoted key cannot match inside a JSON string (its quotes would be escaped).

use http::{header, HeaderMap, HeaderValue};

use counts::Counts;

mod counts;

/// Largest `usage` or `timings` object kept; a larger one is skipped.
pub const MAX_CAPTURE: usize = 4096;

/// Room made for a captured object when it starts (an OpenAI `usage` with its details is
/// about 200 bytes).
const CAPTURE_START: usize = 256;

/// The longest key, with its quotes.
const KEY_MAX: usize = b"\"timings\"".len();
const CARRY: usize = KEY_MAX - 1;

/// A response's token counts, as its engine reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens served from the engine's prefix cache, when it says.
    pub cached_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Usage,
    Timings,
}

impl Key {
    /// The key with its quotes, as it stands in the body.
    fn text(self) -> &'static [u8] {
        match self {
            Key::Usage => b"\"usage\"",
            Key::Timings => b"\"timings\"",
        }
    }

    fn len(self) -> usize {
        self.text().len()
    }

    /// Where the `g` both keys have stands in this one.
    fn g_at(self) -> usize {
        match self {
            Key::Usage => 4,
            Key::Timings => 6,
        }
    }
}

/// Where an object being copied stands.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// After the key: whitespace, then `:`.
    Colon,
    /// After the colon: whitespace, then `{` (anything else, `null` included, ends it).
    Value,
    /// Inside the object.
    Object {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

/// Watches a response body for its `usage` (and llama.cpp's `timings`).
#[derive(Debug, Default)]
pub struct UsageObserver {
    /// The last bytes before the current frame (a key may start there).
    carry: [u8; CARRY],
    carry_len: usize,
    capture: Option<(Key, Phase)>,
    scratch: Vec<u8>,
    usage: Vec<u8>,
    timings: Vec<u8>,
}

impl UsageObserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// An observer for a response whose body can carry usage (JSON or SSE), else `None`.
    pub fn for_response(headers: &HeaderMap) -> Option<Self> {
        Self::for_content_type(
            crate::header_lookup::header(headers, &header::CONTENT_TYPE).map(HeaderValue::as_bytes),
        )
    }

    /// [`UsageObserver::for_response`] from the response's `Content-Type`, already looked up.
    pub fn for_content_type(content_type: Option<&[u8]>) -> Option<Self> {
        let ct = content_type?;
        let essence = ct.split(|&b| b == b';').next()?.trim_ascii();
        let readable = essence.eq_ignore_ascii_case(b"application/json")
            || essence.eq_ignore_ascii_case(b"text/event-stream");
        readable.then(Self::new)
    }

    /// Look at the next body frame.
    pub fn feed(&mut self, frame: &[u8]) {
        let mut at = 0;
        if self.capture.is_some() {
            at = self.advance(frame, 0);
        } else if let Some((key, end)) = self.key_across_boundary(frame) {
            self.start(key);
            at = self.advance(frame, end);
        }
        while at < frame.len() {
            let Some((key, end)) = key_from(frame, at) else {
                break;
            };
            self.start(key);
            at = self.advance(frame, end);
        }
        self.keep_tail(frame);
    }

    /// The usage seen so far (the latest report wins), or `None` when the body carried none
    /// that makes sense.
    pub fn usage(&self) -> Option<Usage> {
        let u = Counts::parse(&self.usage).unwrap_or_default();
        let t = Counts::parse(&self.timings).unwrap_or_default();
        let prompt = u
            .prompt_tokens
            .or(u.input_tokens)
            .or_else(|| t.cache_n?.checked_add(t.prompt_n?))?;
        let completion = u
            .completion_tokens
            .or(u.output_tokens)
            .or(t.predicted_n)
            .unwrap_or(0);
        let cached = u
            .prompt_cached
            .or(u.input_cached)
            .or(t.cache_n)
            .filter(|&c| c <= prompt);
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
        })
    }

    fn start(&mut self, key: Key) {
        self.scratch.clear();
        self.capture = Some((key, Phase::Colon));
    }

    /// A key that starts in the carried bytes and ends in `frame`: which, and where in `frame`
    /// it ends.
    fn key_across_boundary(&self, frame: &[u8]) -> Option<(Key, usize)> {
        if self.carry_len == 0 || frame.is_empty() {
            return None;
        }
        let mut window = [0u8; 2 * CARRY];
        let head = frame.len().min(CARRY);
        window[..self.carry_len].copy_from_slice(&self.carry[..self.carry_len]);
        window[self.carry_len..self.carry_len + head].copy_from_slice(&frame[..head]);
        let window = &window[..self.carry_len + head];
        let (key, end) = next_key(window)?;
        let start = end - key.len();
        (start < self.carry_len && end > self.carry_len).then(|| (key, end - self.carry_len))
    }

    /// Copy the object being captured from `frame[at..]`; returns where scanning goes on.
    fn advance(&mut self, frame: &[u8], mut at: usize) -> usize {
        while let Some((key, phase)) = self.capture {
            if let Phase::Object {
                depth,
                in_string,
                escaped,
            } = phase
            {
                return self.copy_object(key, frame, at, (depth, in_string, escaped));
            }
            let Some(&b) = frame.get(at) else {
                return at;
            };
            at += 1;
            self.capture = match phase {
                _ if b.is_ascii_whitespace() => Some((key, phase)),
                Phase::Colon if b == b':' => Some((key, Phase::Value)),
                Phase::Value if b == b'{' => {
                    // Room for a usual `usage` object at once, not grown byte run by run.
                    self.scratch.reserve(CAPTURE_START);
                    self.scratch.push(b);
                    Some((
                        key,
                        Phase::Object {
                            depth: 1,
                            in_string: false,
                            escaped: false,
                        },
                    ))
                }
                // Not an object after all (a string value "usage", `null`, a number): the
                // byte that said so may start a key, so it is looked at again.
                _ => {
                    at -= 1;
                    None
                }
            };
        }
        at
    }

    /// Inside the object: walk `frame[at..]` until the object closes, grows past
    /// [`MAX_CAPTURE`] (it is dropped) or the frame ends, then copy the run in one go. Inside a
    /// string the walk jumps to the next quote or backslash (most of a `usage` object is its
    /// keys), so the bytes looked at one by one are the few between the strings.
    fn copy_object(
        &mut self,
        key: Key,
        frame: &[u8],
        at: usize,
        (mut depth, mut in_string, mut escaped): (u32, bool, bool),
    ) -> usize {
        let room = (MAX_CAPTURE + 1).saturating_sub(self.scratch.len());
        // Bytes past `at + room - 1` are never looked at: the object is dropped there.
        let limit = at.saturating_add(room);
        let end = frame.len().min(limit);
        let mut i = at;
        while i < end {
            let b = frame[i];
            if in_string && !escaped && b != b'"' && b != b'\\' {
                match memchr::memchr2(b'"', b'\\', &frame[i..end]) {
                    Some(k) => {
                        i += k;
                        continue;
                    }
                    None => {
                        i = end;
                        break;
                    }
                }
            }
            (depth, in_string, escaped) = object_step(depth, in_string, escaped, b);
            i += 1;
            if depth == 0 {
                self.scratch.extend_from_slice(&frame[at..i]);
                self.complete(key);
                self.capture = None;
                return i;
            }
        }
        if i >= limit {
            self.scratch.clear();
            self.capture = None;
            return i;
        }
        self.scratch.extend_from_slice(&frame[at..]);
        let phase = Phase::Object {
            depth,
            in_string,
            escaped,
        };
        self.capture = Some((key, phase));
        frame.len()
    }

    fn complete(&mut self, key: Key) {
        let keep = match key {
            Key::Usage => &mut self.usage,
            Key::Timings => &mut self.timings,
        };
        std::mem::swap(keep, &mut self.scratch);
        self.scratch.clear();
    }

    /// Remember the last bytes seen, unless an object is being copied (a key cannot start
    /// inside it).
    fn keep_tail(&mut self, frame: &[u8]) {
        if self.capture.is_some() {
            self.carry_len = 0;
            return;
        }
        if frame.len() >= CARRY {
            self.carry.copy_from_slice(&frame[frame.len() - CARRY..]);
            self.carry_len = CARRY;
            return;
        }
        let keep = self.carry_len.min(CARRY - frame.len());
        self.carry
            .copy_within(self.carry_len - keep..self.carry_len, 0);
        self.carry[keep..keep + frame.len()].copy_from_slice(frame);
        self.carry_len = keep + frame.len();
    }
}

/// One byte inside the object: the next (depth, in a string, after a backslash), with depth 0
/// once it closed.
#[inline]
fn object_step(depth: u32, in_string: bool, escaped: bool, b: u8) -> (u32, bool, bool) {
    match (in_string, escaped, b) {
        (true, true, _) => (depth, true, false),
        (true, false, b'\\') => (depth, true, true),
        (true, false, b'"') => (depth, false, false),
        (true, false, _) => (depth, true, false),
        (false, _, b'"') => (depth, true, false),
        (false, _, b'{' | b'[') => (depth + 1, false, false),
        (false, _, b'}' | b']') => (depth - 1, false, false),
        (false, _, _) => (depth, false, false),
    }
}

/// The first key in `hay`: which, and the index just past it.
fn next_key(hay: &[u8]) -> Option<(Key, usize)> {
    key_from(hay, 0)
}

/// The first key starting at or after `from` in `hay`, and the index just past it; found by
/// one scan for the byte both keys have (`g`, rare in the JSON around them): a memchr over the
/// frame, and each `g` checked against the bytes of `"usage"` and `"timings"` around it. With a
/// memmem search per key instead (whose setup dominates at an SSE event's length), the
/// observer's pass over a 200-byte event cost about 1,000 instructions; with this one, 340.
fn key_from(hay: &[u8], from: usize) -> Option<(Key, usize)> {
    // The first `g` that could belong to a key starting at `from`.
    let first = from.checked_add(Key::Usage.g_at())?;
    for g in memchr::memchr_iter(b'g', hay.get(first..)?).map(|i| first + i) {
        for key in [Key::Usage, Key::Timings] {
            let Some(start) = g.checked_sub(key.g_at()).filter(|&s| s >= from) else {
                continue;
            };
            if hay.get(start..start + key.len()) == Some(key.text()) {
                return Some((key, start + key.len()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
