//! What goes over the wire in `bench stream`: the upstream's OpenAI-shaped
//! `chat.completion.chunk` events, each stamped with its send time and framed as one HTTP chunk,
//! and the client side's push decoder that turns arriving bytes back into stamped events
//! (response head, chunked or length framing, SSE event boundaries) without blocking.
//!
//! The stamp is a JSON field `"sent_ns":<CLOCK_MONOTONIC ns>` (clients of the OpenAI API ignore
//! fields they do not know). Proxies may re-chunk or coalesce what they relay, so the decoder
//! never assumes one event per chunk or per read.

use crate::harness::http::{event_end, read_head, Framing};

pub const MODEL: &str = "bench-model";

/// The response head of a stream (chunked, so the body's end is explicit).
pub fn stream_head(upstream: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nX-Upstream: {upstream}\r\n\r\n"
    )
}

/// Append `payload` as one HTTP chunk.
fn chunk(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Append content event `i` of an answer, stamped `sent_ns`, as one chunk.
pub fn content_event(out: &mut Vec<u8>, i: u32, sent_ns: u64) {
    let payload = format!(
        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,\"model\":\"{MODEL}\",\"sent_ns\":{sent_ns},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"finish_reason\":null}}]}}\n\n"
    );
    chunk(out, payload.as_bytes());
}

/// Append the end of an answer of `events` content events: the usage event (stamped), then
/// `data: [DONE]`, then the last chunk.
pub fn answer_end(out: &mut Vec<u8>, events: u32, sent_ns: u64) {
    let payload = format!(
        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,\"model\":\"{MODEL}\",\"sent_ns\":{sent_ns},\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{events},\"total_tokens\":{}}}}}\n\n",
        12 + events
    );
    chunk(out, payload.as_bytes());
    chunk(out, b"data: [DONE]\n\n");
    out.extend_from_slice(b"0\r\n\r\n");
}

/// The stamp of one event's bytes, if it has one.
pub fn stamp_of(event: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"sent_ns\":";
    let at = event.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = event[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&event[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// What the decoder reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// The response head arrived with this status.
    Head(u16),
    /// A whole SSE event: its stamp, if any, and whether it is `data: [DONE]`.
    Event { sent_ns: Option<u64>, done: bool },
    /// The response's body ended as its framing promised (the connection may carry another).
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    ChunkSize,
    ChunkData(u64),
    ChunkCrlf,
    Trailers,
    Length(u64),
    UntilClose,
}

/// A push decoder of one connection's responses, one after another.
pub struct Decoder {
    state: State,
    raw: Vec<u8>,
    sse: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Malformed input: the decoder cannot go on with this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl Decoder {
    pub fn new() -> Self {
        Self {
            state: State::Head,
            raw: Vec::new(),
            sse: Vec::new(),
        }
    }

    /// Feed bytes as they arrived; `on` gets every item they complete, in order.
    pub fn feed(&mut self, bytes: &[u8], on: &mut impl FnMut(Item)) -> Result<(), DecodeError> {
        self.raw.extend_from_slice(bytes);
        let mut at = 0;
        while let Some(used) = self.step(at, on)? {
            at += used;
        }
        self.raw.drain(..at);
        Ok(())
    }

    /// Decode one piece from `raw[at..]`: how many bytes it used, `None` when more are needed.
    fn step(&mut self, at: usize, on: &mut impl FnMut(Item)) -> Result<Option<usize>, DecodeError> {
        let buf = &self.raw[at..];
        let line = || buf.windows(2).position(|w| w == b"\r\n");
        match self.state {
            State::Head => {
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    return Ok(None);
                };
                let head =
                    read_head(&mut &buf[..end + 4]).map_err(|e| DecodeError(e.to_string()))?;
                on(Item::Head(head.status));
                self.state = match head.framing() {
                    Framing::Chunked => State::ChunkSize,
                    Framing::Length(0) => {
                        on(Item::End);
                        State::Head
                    }
                    Framing::Length(n) => State::Length(n),
                    Framing::UntilClose => State::UntilClose,
                };
                Ok(Some(end + 4))
            }
            State::ChunkSize => {
                let Some(eol) = line() else { return Ok(None) };
                let text = String::from_utf8_lossy(&buf[..eol]);
                let hex = text.split(';').next().unwrap_or_default().trim();
                let size = u64::from_str_radix(hex, 16)
                    .map_err(|_| DecodeError(format!("bad chunk size {hex:?}")))?;
                self.state = if size == 0 {
                    State::Trailers
                } else {
                    State::ChunkData(size)
                };
                Ok(Some(eol + 2))
            }
            State::ChunkData(left) | State::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                self.sse_bytes(n, at, on);
                let left = left - n as u64;
                self.state = match self.state {
                    State::ChunkData(_) if left == 0 => State::ChunkCrlf,
                    State::ChunkData(_) => State::ChunkData(left),
                    _ if left == 0 => {
                        on(Item::End);
                        State::Head
                    }
                    _ => State::Length(left),
                };
                Ok(Some(n))
            }
            State::ChunkCrlf => match buf {
                [b'\r', b'\n', ..] => {
                    self.state = State::ChunkSize;
                    Ok(Some(2))
                }
                [] | [b'\r'] => Ok(None),
                _ => Err(DecodeError("chunk data longer than its size".into())),
            },
            State::Trailers => {
                let Some(eol) = line() else { return Ok(None) };
                if eol == 0 {
                    on(Item::End);
                    self.state = State::Head;
                }
                Ok(Some(eol + 2))
            }
            State::UntilClose => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = buf.len();
                self.sse_bytes(n, at, on);
                Ok(Some(n))
            }
        }
    }

    /// Body bytes `raw[at..at + n]`: split into events.
    fn sse_bytes(&mut self, n: usize, at: usize, on: &mut impl FnMut(Item)) {
        self.sse.extend_from_slice(&self.raw[at..at + n]);
        let mut start = 0;
        while let Some(end) = event_end(&self.sse[start..]) {
            let ev = &self.sse[start..start + end];
            let done = ev.windows(12).any(|w| w == b"data: [DONE]");
            on(Item::Event {
                sent_ns: stamp_of(ev),
                done,
            });
            start += end;
        }
        self.sse.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(events: u32) -> Vec<u8> {
        let mut out = stream_head("u0").into_bytes();
        for i in 0..events {
            content_event(&mut out, i, 1000 + u64::from(i));
        }
        answer_end(&mut out, events, 5000);
        out
    }

    fn decode(pieces: &[&[u8]]) -> Vec<Item> {
        let mut d = Decoder::new();
        let mut items = Vec::new();
        for p in pieces {
            d.feed(p, &mut |i| items.push(i)).unwrap();
        }
        items
    }

    #[test]
    fn the_upstreams_answer_is_valid_sse_of_openai_chunks() {
        let mut out = Vec::new();
        content_event(&mut out, 3, 42);
        let text = String::from_utf8(out).unwrap();
        let (size, rest) = text.split_once("\r\n").unwrap();
        let payload = rest.strip_suffix("\r\n").unwrap();
        assert_eq!(usize::from_str_radix(size, 16).unwrap(), payload.len());
        let json = payload.strip_prefix("data: ").unwrap().trim_end();
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(json).unwrap();
        assert_eq!(v["object"].as_str(), Some("chat.completion.chunk"));
        assert_eq!(v["sent_ns"].as_u64(), Some(42));
        assert_eq!(stamp_of(payload.as_bytes()), Some(42));
        assert_eq!(stamp_of(b"data: [DONE]\n\n"), None);
    }

    #[test]
    fn decodes_answers_whole_and_byte_by_byte_alike() {
        let mut two = answer(3);
        two.extend(answer(1));
        let whole = decode(&[&two]);
        let bytes: Vec<&[u8]> = two.chunks(1).collect();
        assert_eq!(decode(&bytes), whole);
        let stamps: Vec<Option<u64>> = whole
            .iter()
            .filter_map(|i| match i {
                Item::Event { sent_ns, .. } => Some(*sent_ns),
                _ => None,
            })
            .collect();
        // 3 content events + usage + [DONE], then 1 + usage + [DONE].
        let want = [
            Some(1000),
            Some(1001),
            Some(1002),
            Some(5000),
            None,
            Some(1000),
            Some(5000),
            None,
        ];
        assert_eq!(stamps, want);
        assert_eq!(whole.iter().filter(|i| **i == Item::End).count(), 2);
        assert_eq!(whole[0], Item::Head(200));
        assert!(whole.contains(&Item::Event {
            sent_ns: None,
            done: true
        }));
    }

    #[test]
    fn rechunked_and_length_framed_bodies_and_bad_input() {
        // A proxy that coalesced two events into one chunk.
        let body = "data: {\"sent_ns\":7}\n\ndata: {\"sent_ns\":8}\n\n";
        let raw = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        );
        let items = decode(&[raw.as_bytes()]);
        assert_eq!(items.len(), 4, "{items:?}");
        let raw = format!(
            "HTTP/1.1 503 Busy\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let items = decode(&[raw.as_bytes()]);
        assert_eq!((items[0], items[3]), (Item::Head(503), Item::End));
        let mut d = Decoder::new();
        let bad = d.feed(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            &mut |_| {},
        );
        assert!(bad.is_err());
        assert!(Decoder::new()
            .feed(b"garbage\r\n\r\n", &mut |_| {})
            .is_err());
    }
}
