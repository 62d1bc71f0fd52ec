//! W3C Trace Context (`traceparent`, `tracestate`): reading the client's, writing ours.
//!
//! Parsing works on the header's bytes without allocating, because it runs for every request
//! while tracing is on, sampled or not. A header that is not a valid `traceparent` is ignored
//! (the request is then treated as having none), as the W3C recommendation says; the proxy
//! never repairs it.

use http::header::{HeaderMap, HeaderName};
use opentelemetry::trace::{SpanId, TraceId};

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The sampled bit of `trace-flags`.
const SAMPLED: u8 = 0x01;

/// A valid incoming `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    /// The caller's span: the parent of ours.
    pub parent_id: SpanId,
    pub sampled: bool,
}

impl TraceParent {
    /// The request's `traceparent`, if it has exactly one and it is valid.
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        let mut all = headers.get_all(TRACEPARENT).iter();
        let first = all.next()?;
        if all.next().is_some() {
            // Two of them: which one is meant cannot be told.
            return None;
        }
        parse(first.as_bytes())
    }
}

/// Parse a `traceparent` value: `version-traceid-parentid-flags`, lowercase hex.
///
/// Version `00` is exactly 55 bytes; a higher version may carry more fields after a `-`, which
/// are ignored (forward compatibility); `ff` is invalid, as are all-zero ids.
pub fn parse(v: &[u8]) -> Option<TraceParent> {
    let v = v.trim_ascii();
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let trace_id = u128::from_be_bytes(hex_array::<16>(&v[3..35])?);
    let parent_id = u64::from_be_bytes(hex_array::<8>(&v[36..52])?);
    let flags = hex_byte(&v[53..55])?;
    if trace_id == 0 || parent_id == 0 {
        return None;
    }
    Some(TraceParent {
        trace_id: TraceId::from(trace_id),
        parent_id: SpanId::from(parent_id),
        sampled: flags & SAMPLED != 0,
    })
}

/// A `traceparent` value: `00-<trace>-<span>-<flags>`, 55 ASCII bytes.
pub type Encoded = [u8; 55];

/// Our `traceparent` for the pod: version 00, the trace, our span as the parent. The bytes,
/// not a header value: the upstream encoder writes them as a line of their own.
pub fn format(trace_id: TraceId, span_id: SpanId, sampled: bool) -> Encoded {
    let mut out = [0u8; 55];
    out[..3].copy_from_slice(b"00-");
    write_hex(&mut out[3..35], &trace_id.to_bytes());
    out[35] = b'-';
    write_hex(&mut out[36..52], &span_id.to_bytes());
    out[52] = b'-';
    write_hex(&mut out[53..55], &[u8::from(sampled)]);
    out
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        // Uppercase is invalid in traceparent.
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(hex_digit(two[0])? << 4 | hex_digit(two[1])?)
}

fn hex_array<const N: usize>(hex: &[u8]) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = hex_byte(&hex[2 * i..2 * i + 2])?;
    }
    Some(out)
}

/// Each byte's two lowercase hex digits.
const HEX: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut table = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = [DIGITS[b >> 4], DIGITS[b & 0x0f]];
        b += 1;
    }
    table
};

fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX[usize::from(b)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example() {
        let p = parse(VALID.as_bytes()).unwrap();
        assert_eq!(
            p.trace_id,
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(p.parent_id, SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert!(p.sampled);
        let unsampled = parse(VALID.replace("-01", "-00").as_bytes()).unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn format_round_trips() {
        let p = parse(VALID.as_bytes()).unwrap();
        let v = format(p.trace_id, p.parent_id, true);
        assert_eq!(std::str::from_utf8(&v).unwrap(), VALID);
        assert_eq!(parse(&v), Some(p));
        assert!(HeaderValue::from_bytes(&v).is_ok());
    }

    /// Every byte value's two digits, as formatting writes them.
    #[test]
    fn format_writes_ids_in_lowercase_hex() {
        for n in 0..=255u8 {
            let trace = u128::from_be_bytes([n; 16]) ^ u128::from(n).rotate_left(7);
            let span = u64::from(n) << 56 | u64::from(n.wrapping_mul(37)) | 1;
            let v = format(TraceId::from(trace), SpanId::from(span), n % 2 == 0);
            let flags = if n % 2 == 0 { "01" } else { "00" };
            assert_eq!(
                std::str::from_utf8(&v).unwrap(),
                std::format!("00-{trace:032x}-{span:016x}-{flags}")
            );
        }
    }

    #[test]
    fn malformed_values_are_ignored() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert_eq!(parse(b.as_bytes()), None, "{b:?}");
        }
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let v = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse(v.as_bytes()).is_some());
        let glued = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(parse(glued.as_bytes()), None);
    }

    #[test]
    fn two_headers_are_none() {
        let mut h = HeaderMap::new();
        h.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert!(TraceParent::of(&h).is_some());
        h.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert_eq!(TraceParent::of(&h), None);
    }
}
