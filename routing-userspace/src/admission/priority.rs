//! `x-flexinfer-priority: <int>`: which band of a model's queue a request waits in.
//!
//! Higher is served first; absent means 0; negative means sheddable (dropped first when the
//! queue is full, and never queued past the shorter sheddable timeout). A value that is not
//! one integer in `i32` is the default, and the reason comes back so the caller can log it at
//! debug: a bad header never fails a request.

use http::{HeaderMap, HeaderName};

pub const HEADER_PRIORITY: HeaderName = HeaderName::from_static("x-flexinfer-priority");

/// The priority of a request without the header.
pub const DEFAULT_PRIORITY: i32 = 0;

/// Why a priority header was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPriority {
    /// Present but empty (or only white space).
    Empty,
    /// Not a decimal integer (including a list such as `1, 2`, and non-UTF-8 bytes).
    NotAnInteger,
    /// An integer outside `i32`.
    OutOfRange,
    /// The header was sent more than once.
    Several,
}

impl BadPriority {
    pub fn as_str(self) -> &'static str {
        match self {
            BadPriority::Empty => "empty",
            BadPriority::NotAnInteger => "not an integer",
            BadPriority::OutOfRange => "out of range",
            BadPriority::Several => "sent more than once",
        }
    }
}

/// Whether a priority is sheddable.
pub fn is_sheddable(priority: i32) -> bool {
    priority < 0
}

/// The request's priority, and why the header was ignored if it was.
pub fn priority(headers: &HeaderMap) -> (i32, Option<BadPriority>) {
    let name = HEADER_PRIORITY;
    let mut values = crate::header_lookup::values(headers, &name);
    let Some(first) = values.next() else {
        return (DEFAULT_PRIORITY, None);
    };
    if values.next().is_some() {
        return (DEFAULT_PRIORITY, Some(BadPriority::Several));
    }
    match parse(first.as_bytes()) {
        Ok(p) => (p, None),
        Err(bad) => (DEFAULT_PRIORITY, Some(bad)),
    }
}

/// One header value as a priority.
pub fn parse(raw: &[u8]) -> Result<i32, BadPriority> {
    let text = std::str::from_utf8(raw).map_err(|_| BadPriority::NotAnInteger)?;
    let text = text.trim();
    if text.is_empty() {
        return Err(BadPriority::Empty);
    }
    text.parse::<i32>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            BadPriority::OutOfRange
        }
        _ => BadPriority::NotAnInteger,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn header_values_table() {
        for (raw, want) in [
            (&b"10"[..], Ok(10)),
            (b"0", Ok(0)),
            (b"-3", Ok(-3)),
            (b"+7", Ok(7)),
            (b" 5 ", Ok(5)),
            (b"2147483647", Ok(i32::MAX)),
            (b"-2147483648", Ok(i32::MIN)),
            (b"2147483648", Err(BadPriority::OutOfRange)),
            (b"-99999999999999999999", Err(BadPriority::OutOfRange)),
            (b"", Err(BadPriority::Empty)),
            (b"   ", Err(BadPriority::Empty)),
            (b"high", Err(BadPriority::NotAnInteger)),
            (b"1.5", Err(BadPriority::NotAnInteger)),
            (b"1, 2", Err(BadPriority::NotAnInteger)),
            (b"0x10", Err(BadPriority::NotAnInteger)),
            (b"\xff", Err(BadPriority::NotAnInteger)),
        ] {
            assert_eq!(parse(raw), want, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn absent_one_and_several_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(priority(&h), (0, None));
        h.insert(HEADER_PRIORITY, HeaderValue::from_static("-1"));
        assert_eq!(priority(&h), (-1, None));
        assert!(is_sheddable(priority(&h).0));
        h.append(HEADER_PRIORITY, HeaderValue::from_static("5"));
        assert_eq!(priority(&h), (0, Some(BadPriority::Several)));
        h.insert(HEADER_PRIORITY, HeaderValue::from_static("soon"));
        assert_eq!(priority(&h), (0, Some(BadPriority::NotAnInteger)));
        h.insert(HEADER_PRIORITY, HeaderValue::from_bytes(b"\xfe9").unwrap());
        assert_eq!(priority(&h), (0, Some(BadPriority::NotAnInteger)));
    }
}
