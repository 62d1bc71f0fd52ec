//! What the fuzz targets share: a readable input format for "headers + body" inputs, and the
//! split patterns incremental parsers are fed with.
//!
//! Inputs are plain bytes, not `arbitrary` structures, so the seed corpus is made of files a
//! person can read and write (a chat body, an HTTP response, a models file) and libFuzzer's
//! mutations stay close to what real peers send. Where a target needs a second degree of
//! freedom (how a stream is cut into reads), it is derived from a hash of the input: every
//! mutation then also tries a new split, and a crash reproduces from the input alone.

use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};

/// Whether checks for findings already reported (and committed under `regressions/`) are on.
/// Off by default, so a run explores past them; `FLEXINFER_FUZZ_STRICT=1` (what
/// `cargo xtask fuzz --strict` sets) turns them on, to replay the reproducers or to see that
/// a fix holds.
pub fn strict() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(|| std::env::var_os("FLEXINFER_FUZZ_STRICT").is_some_and(|v| v == "1"))
}

/// An input read as an HTTP-ish request: `name: value` lines, an empty line, then the body.
/// Lines that are not valid header fields are skipped; without an empty line everything is
/// headers and the body is empty. A leading empty line means "no headers".
pub fn headers_and_body(data: &[u8]) -> (HeaderMap, &[u8]) {
    let mut headers = HeaderMap::new();
    let mut rest = data;
    loop {
        let (line, after) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        rest = after;
        if line.is_empty() {
            return (headers, rest);
        }
        if let Some(colon) = line.iter().position(|&b| b == b':') {
            let name = HeaderName::from_bytes(line[..colon].trim_ascii());
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii_start());
            if let (Ok(name), Ok(value)) = (name, value) {
                headers.append(name, value);
            }
        }
        if rest.is_empty() {
            return (headers, rest);
        }
    }
}

/// Lines as libyaml counts them: a line break is LF, CRLF, a lone CR, NEL (U+0085), or
/// the line and paragraph separators (U+2028, U+2029).
pub fn yaml_lines(text: &str) -> usize {
    let mut breaks = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}' => breaks += 1,
            _ => {}
        }
    }
    breaks + 1
}

/// FNV-1a: a stable, dependency-free hash of the input to seed split patterns with.
pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Piece lengths (each 1..=`max`) that cut `len` bytes into reads, from a seed.
pub fn split_lengths(len: usize, seed: u64, max: usize) -> Vec<usize> {
    let mut state = seed | 1;
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Mostly small reads, sometimes a large one, as sockets deliver them.
        let cap = if state % 8 == 0 { max } else { 16.min(max) };
        let n = (1 + (state >> 8) as usize % cap.max(1)).min(left);
        out.push(n);
        left -= n;
    }
    out
}

/// The split patterns a stream parser is checked under: all at once, byte by byte (for short
/// inputs, where it is cheap) and one pseudo-random pattern seeded by the input.
pub fn split_patterns(data: &[u8]) -> Vec<Vec<usize>> {
    let mut patterns = vec![vec![data.len()]];
    if data.is_empty() {
        return patterns;
    }
    if data.len() <= 512 {
        patterns.push(vec![1; data.len()]);
    }
    patterns.push(split_lengths(data.len(), fnv1a(data), 512));
    patterns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_then_body() {
        let (h, body) = headers_and_body(b"x-session-id: abc\r\nbad line\nx-a:b\n\n{\"model\":1}");
        assert_eq!(h["x-session-id"], "abc");
        assert_eq!(h["x-a"], "b");
        assert_eq!(body, b"{\"model\":1}");
        let (h, body) = headers_and_body(b"\n{}");
        assert!(h.is_empty());
        assert_eq!(body, b"{}");
    }

    #[test]
    fn yaml_line_breaks() {
        assert_eq!(yaml_lines("a"), 1);
        assert_eq!(yaml_lines("a\nb\r\nc\rd"), 4);
        assert_eq!(yaml_lines("\r\r\n"), 3);
        assert_eq!(yaml_lines("a\u{85}b\u{2028}c"), 3);
    }

    #[test]
    fn splits_cover_the_input() {
        for len in [0, 1, 7, 1000] {
            for p in split_patterns(&vec![b'x'; len]) {
                assert_eq!(p.iter().sum::<usize>(), len);
                assert!(p.iter().all(|&n| n > 0) || len == 0);
            }
        }
    }
}
