//! The fields of an OTLP `Span` around its attributes: its head (fields 1 to 8: ids, state,
//! name, kind, times) and its tail (15 and 16: status, flags).
//!
//! prost writes a message's fields in the order of their numbers, so a span is its head, its
//! attributes (field 9), then its tail, byte for byte the `Span` prost encodes (tested). Encoding
//! head and tail with prost cost more than copying a span's attributes from the cache, yet from
//! one span to the next only the ids and times change, and those are fixed-width (16 and 8
//! bytes of id, fixed64 times). So the encoding of a head is kept per layout (kind, name, with
//! or without a parent) and the next span's ids and times are written over the old ones. Where
//! each lies is found, not assumed: the head is encoded a second time with every id and time
//! inverted, and the bytes that differ are those fields', in the order of their numbers. A span
//! whose head has no kept layout (a `tracestate`, a time of zero) or whose tail is not the plain
//! one (an error status) is encoded by prost.

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_proto::tonic::trace::v1::{span, status, SpanFlags, Status};
use prost::Message;

use super::{set_bytes, set_str};
use crate::telemetry::span::{EndedSpan, SpanKind};

/// W3C trace flags of an exported span: sampled.
const SAMPLED: u32 = 0x01;

/// Head layouts kept at most (methods times kinds times with or without a parent fit).
const LAYOUTS: usize = 64;

/// The fields of an OTLP `Span` before its attributes.
#[derive(Clone, PartialEq, prost::Message)]
struct SpanHead {
    #[prost(bytes = "vec", tag = "1")]
    trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    name: String,
    #[prost(enumeration = "span::SpanKind", tag = "6")]
    kind: i32,
    #[prost(fixed64, tag = "7")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    end_time_unix_nano: u64,
}

/// The fields of an OTLP `Span` after its attributes.
#[derive(Clone, PartialEq, prost::Message)]
struct SpanTail {
    #[prost(message, optional, tag = "15")]
    status: Option<Status>,
    #[prost(fixed32, tag = "16")]
    flags: u32,
}

/// Writes heads and tails, from kept encodings where it can.
#[derive(Debug, Default)]
pub(super) struct SpanFields {
    /// The messages prost encodes when nothing is kept, reused.
    head: SpanHead,
    tail: SpanTail,
    heads: Vec<HeadLayout>,
    /// The encoded tail of a span without an error, by its flags.
    tails: Vec<(u32, Box<[u8]>)>,
}

/// What makes two heads the same but for their ids and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LayoutKey {
    kind: SpanKind,
    has_parent: bool,
    /// The name's address and length (names are static strings).
    name: (usize, usize),
}

/// A head's encoding, and where its ids and times lie in it.
#[derive(Debug)]
struct HeadLayout {
    key: LayoutKey,
    bytes: Box<[u8]>,
    trace_id: usize,
    span_id: usize,
    parent: Option<usize>,
    start: usize,
    end: usize,
}

impl SpanFields {
    /// Append `span`'s head to `out`.
    pub(super) fn write_head(&mut self, span: &EndedSpan<'_, '_>, out: &mut Vec<u8>) {
        let keepable =
            span.trace_state.is_none() && span.start_unix_nano != 0 && span.end_unix_nano != 0;
        if !keepable {
            return self.encode_head(span, out);
        }
        let key = LayoutKey {
            kind: span.kind,
            has_parent: span.parent != SpanId::INVALID,
            name: (span.name.as_ptr() as usize, span.name.len()),
        };
        if let Some(layout) = self.heads.iter().find(|l| l.key == key) {
            return layout.write(span, out);
        }
        match self.layout(span, key) {
            Some(layout) if self.heads.len() < LAYOUTS => {
                layout.write(span, out);
                self.heads.push(layout);
            }
            _ => self.encode_head(span, out),
        }
    }

    /// Append `span`'s tail to `out`.
    pub(super) fn write_tail(&mut self, span: &EndedSpan<'_, '_>, out: &mut Vec<u8>) {
        let flags = flags(span);
        if span.error.is_some() {
            return self.encode_tail(span, flags, out);
        }
        if let Some((_, bytes)) = self.tails.iter().find(|(f, _)| *f == flags) {
            out.extend_from_slice(bytes);
            return;
        }
        let start = out.len();
        self.encode_tail(span, flags, out);
        self.tails.push((flags, out[start..].into()));
    }

    /// The layout of `span`'s head, or `None` if its ids and times cannot be found in it.
    fn layout(&mut self, span: &EndedSpan<'_, '_>, key: LayoutKey) -> Option<HeadLayout> {
        let mut kept = Vec::new();
        self.encode_head(span, &mut kept);
        let inverted = EndedSpan {
            trace_id: TraceId::from(!u128::from_be_bytes(span.trace_id.to_bytes())),
            span_id: SpanId::from(!u64::from_be_bytes(span.span_id.to_bytes())),
            parent: match key.has_parent {
                true => SpanId::from(!u64::from_be_bytes(span.parent.to_bytes())),
                false => SpanId::INVALID,
            },
            start_unix_nano: !span.start_unix_nano,
            end_unix_nano: !span.end_unix_nano,
            ..*span
        };
        let mut other = Vec::new();
        self.encode_head(&inverted, &mut other);
        if other.len() != kept.len() {
            return None;
        }
        let runs = differing_runs(&kept, &other);
        let widths: &[usize] = match key.has_parent {
            true => &[16, 8, 8, 8, 8],
            false => &[16, 8, 8, 8],
        };
        if runs.len() != widths.len() || runs.iter().zip(widths).any(|(r, w)| r.1 != *w) {
            return None;
        }
        let at = |i: usize| runs[i].0;
        let (parent, times) = match key.has_parent {
            true => (Some(at(2)), 3),
            false => (None, 2),
        };
        Some(HeadLayout {
            key,
            bytes: kept.into(),
            trace_id: at(0),
            span_id: at(1),
            parent,
            start: at(times),
            end: at(times + 1),
        })
    }

    fn encode_head(&mut self, span: &EndedSpan<'_, '_>, out: &mut Vec<u8>) {
        let head = &mut self.head;
        set_bytes(&mut head.trace_id, &span.trace_id.to_bytes());
        set_bytes(&mut head.span_id, &span.span_id.to_bytes());
        if span.parent == SpanId::INVALID {
            head.parent_span_id.clear();
        } else {
            set_bytes(&mut head.parent_span_id, &span.parent.to_bytes());
        }
        set_str(&mut head.trace_state, span.trace_state.unwrap_or(""));
        set_str(&mut head.name, span.name);
        head.kind = match span.kind {
            SpanKind::Server => span::SpanKind::Server,
            SpanKind::Client => span::SpanKind::Client,
        } as i32;
        head.start_time_unix_nano = span.start_unix_nano;
        head.end_time_unix_nano = span.end_unix_nano;
        head.encode(out).expect("a Vec grows to fit the message");
    }

    fn encode_tail(&mut self, span: &EndedSpan<'_, '_>, flags: u32, out: &mut Vec<u8>) {
        let tail = &mut self.tail;
        let status = tail.status.get_or_insert_with(Status::default);
        match span.error {
            Some(message) => {
                status.code = status::StatusCode::Error as i32;
                set_str(&mut status.message, message);
            }
            None => {
                status.code = status::StatusCode::Unset as i32;
                status.message.clear();
            }
        }
        tail.flags = flags;
        tail.encode(out).expect("a Vec grows to fit the message");
    }
}

impl HeadLayout {
    fn write(&self, span: &EndedSpan<'_, '_>, out: &mut Vec<u8>) {
        let base = out.len();
        out.extend_from_slice(&self.bytes);
        let head = &mut out[base..];
        head[self.trace_id..self.trace_id + 16].copy_from_slice(&span.trace_id.to_bytes());
        head[self.span_id..self.span_id + 8].copy_from_slice(&span.span_id.to_bytes());
        if let Some(at) = self.parent {
            head[at..at + 8].copy_from_slice(&span.parent.to_bytes());
        }
        head[self.start..self.start + 8].copy_from_slice(&span.start_unix_nano.to_le_bytes());
        head[self.end..self.end + 8].copy_from_slice(&span.end_unix_nano.to_le_bytes());
    }
}

/// The span's W3C flags: sampled, and whether its parent is remote (known, so flagged known).
fn flags(span: &EndedSpan<'_, '_>) -> u32 {
    let mut flags = SAMPLED | SpanFlags::ContextHasIsRemoteMask as u32;
    if span.parent_is_remote {
        flags |= SpanFlags::ContextIsRemoteMask as u32;
    }
    flags
}

/// The runs of bytes where `a` and `b` (of one length) differ: (start, length).
fn differing_runs(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, _) in a.iter().zip(b).enumerate().filter(|(_, (x, y))| x != y) {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == i => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::span::Attributes;

    fn fresh(f: &mut SpanFields, span: &EndedSpan<'_, '_>) -> Vec<u8> {
        let mut out = Vec::new();
        f.encode_head(span, &mut out);
        f.encode_tail(span, flags(span), &mut out);
        out
    }

    /// Heads and tails written from kept layouts are what prost writes, whatever the ids,
    /// times, kinds, names, parents, states and errors of the spans, in any order.
    #[test]
    fn kept_layouts_write_what_prost_writes() {
        let attributes = Attributes::default();
        let names = ["GET", "POST", "_OTHER"];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut kept = SpanFields::default();
        let mut reference = SpanFields::default();
        for i in 0..2000 {
            let r = next();
            let time = |v: u64| match r % 29 {
                0 => 0,
                1 => u64::MAX,
                _ => v,
            };
            let span = EndedSpan {
                trace_id: TraceId::from(u128::from(next()) << 64 | u128::from(next())),
                span_id: SpanId::from(next() | 1),
                parent: match r % 3 {
                    0 => SpanId::INVALID,
                    1 => SpanId::from(u64::MAX),
                    _ => SpanId::from(next() | 1),
                },
                parent_is_remote: r % 5 == 0,
                trace_state: (r % 7 == 0).then_some("vendor=abc"),
                kind: [SpanKind::Server, SpanKind::Client][(r >> 8) as usize % 2],
                name: names[(r >> 12) as usize % 3],
                start_unix_nano: time(next() >> 1),
                end_unix_nano: time(next()),
                error: (r % 11 == 0).then_some("answered 503"),
                attributes: &attributes,
            };
            let mut out = Vec::new();
            kept.write_head(&span, &mut out);
            kept.write_tail(&span, &mut out);
            assert_eq!(out, fresh(&mut reference, &span), "span {i}: {span:?}");
        }
        // every layout of the spans above without a state or a time of zero or MAX
        assert!(kept.heads.len() >= 3 * 2 * 2, "{}", kept.heads.len());
        assert_eq!(kept.tails.len(), 2);
    }

    #[test]
    fn differing_runs_are_the_bytes_that_differ_in_order() {
        assert_eq!(
            differing_runs(b"aXXbcYdZ", b"aQQbcRdS"),
            vec![(1, 2), (5, 1), (7, 1)]
        );
        assert!(differing_runs(b"same", b"same").is_empty());
    }
}
