//! White-space normalization of body texts, fast: every key that reads a system prompt or a
//! user message runs it, over up to the whole prompt (implicit sessions), so it works on byte
//! runs, not characters.
//!
//! Normalizing collapses every run of white space (Unicode `White_Space`, as
//! `char::is_whitespace`) to one space, drops it at the ends, and stops after `max`
//! characters. Runs of ASCII words with single spaces between them are already normalized:
//! they are found eight bytes at a time (`skip_words`) and copied whole; only non-ASCII
//! characters, other white space and JSON escapes are looked at one by one. The result is the
//! same as feeding the decoded characters through [`super::canonical::normalize_chars`] (a
//! property test holds the two together).

use crate::body::{JsonStr, Text};

/// Where normalized text goes: a string, or a hasher.
pub trait Sink {
    /// Always whole characters.
    fn put(&mut self, s: &str);
}

impl Sink for String {
    #[inline]
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

/// ASCII white space as `char::is_whitespace` sees it: `\t \n \x0b \x0c \r` and space.
#[inline]
fn ascii_space(b: u8) -> bool {
    matches!(b, b'\t'..=b'\r' | b' ')
}

/// ASCII that is not white space.
#[inline]
fn word_byte(b: u8) -> bool {
    b < 0x80 && !ascii_space(b)
}

const LANES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Bit 7 of each byte of `w` set where that byte is in `0x21..=0x7f` (printable ASCII that is
/// not a space; no carry crosses a byte: `0x7f + 0x5f < 0x100`).
#[inline]
fn printable_lanes(w: u64) -> u64 {
    ((w & !HIGH) + 0x5f * LANES) & !w & HIGH
}

/// Bit 7 of each byte of `w` set where that byte is a space (an exact zero-byte test of
/// `w ^ spaces`, with no borrow between bytes).
#[inline]
fn space_lanes(w: u64) -> u64 {
    let t = w ^ (0x20 * LANES);
    !(((t & !HIGH) + !HIGH) | t) & HIGH
}

/// Skips eight bytes at a time from `i` while every byte is printable ASCII or a space followed
/// by one: text that is already normalized, as most of a prompt is. Stops at or before the
/// first byte the byte loop of [`Normalizer::feed_str`] must look at (a tab, a second space,
/// non-ASCII, `end`); it may stop earlier (a control character that is not white space), and
/// the byte loop then goes on from there, so the result is the byte loop's.
#[inline]
fn skip_words(b: &[u8], mut i: usize, end: usize) -> usize {
    // A space in the last lane is checked against the byte after the word: it must exist.
    while i + 8 < end {
        let w = u64::from_le_bytes(b[i..i + 8].try_into().expect("eight bytes"));
        let words = printable_lanes(w);
        let next_is_word = u64::from(word_byte(b[i + 8]));
        // Lane k's next byte is lane k + 1 (little endian: the next byte up), the last lane's
        // is b[i + 8].
        let followed_by_word = (words >> 8) | (next_is_word << 63);
        let stop = !(words | (space_lanes(w) & followed_by_word)) & HIGH;
        if stop != 0 {
            return i + (stop.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

/// Normalization state across the pieces of one text.
pub struct Normalizer {
    max: usize,
    emitted: usize,
    gap: bool,
}

impl Normalizer {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            emitted: 0,
            gap: false,
        }
    }

    /// Characters emitted so far.
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// Emits the pending gap before a non-space; false when `max` is reached.
    #[inline]
    fn open(&mut self, sink: &mut impl Sink) -> bool {
        if self.gap {
            if self.emitted >= self.max {
                return false;
            }
            sink.put(" ");
            self.emitted += 1;
            self.gap = false;
        }
        self.emitted < self.max
    }

    /// Feeds decoded text; false once `max` characters are out (the rest does not matter).
    pub fn feed_str(&mut self, s: &str, sink: &mut impl Sink) -> bool {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c < 0x80 {
                if ascii_space(c) {
                    self.gap = self.emitted > 0;
                    i += 1;
                    continue;
                }
                // A span of ASCII words with single spaces between them is already
                // normalized: it goes out in one piece. It never reaches past what may still
                // go out (a pending gap takes one), so a cut text costs its cut, not its length.
                let start = i;
                let room = self
                    .max
                    .saturating_sub(self.emitted + usize::from(self.gap));
                let end = b.len().min(start.saturating_add(room));
                loop {
                    i = skip_words(b, i, end);
                    while i < end && word_byte(b[i]) {
                        i += 1;
                    }
                    if i + 1 < end && b[i] == b' ' && word_byte(b[i + 1]) {
                        i += 1;
                        continue;
                    }
                    break;
                }
                if !self.open(sink) {
                    return false;
                }
                let room = self.max - self.emitted;
                if i - start > room {
                    sink.put(&s[start..start + room]);
                    self.emitted = self.max;
                    return false;
                }
                sink.put(&s[start..i]);
                self.emitted += i - start;
            } else {
                let ch = s[i..].chars().next().unwrap_or(' ');
                let len = ch.len_utf8();
                if !self.feed_char_at(ch, &s[i..i + len], sink) {
                    return false;
                }
                i += len;
            }
        }
        true
    }

    /// Feeds one decoded character (`text` is its UTF-8).
    #[inline]
    fn feed_char_at(&mut self, ch: char, text: &str, sink: &mut impl Sink) -> bool {
        if ch.is_whitespace() {
            self.gap = self.emitted > 0;
            return true;
        }
        if !self.open(sink) {
            return false;
        }
        sink.put(text);
        self.emitted += 1;
        true
    }

    /// Feeds one decoded character.
    pub fn feed_char(&mut self, ch: char, sink: &mut impl Sink) -> bool {
        let mut buf = [0u8; 4];
        let text = ch.encode_utf8(&mut buf);
        self.feed_char_at(ch, text, sink)
    }

    /// Feeds a raw JSON string: literal runs as they are, escapes decoded.
    pub fn feed_json(&mut self, s: &JsonStr<'_>, sink: &mut impl Sink) -> bool {
        let mut rest = s.raw_inner();
        loop {
            match memchr::memchr(b'\\', rest.as_bytes()) {
                None => return self.feed_str(rest, sink),
                Some(at) => {
                    if !self.feed_str(&rest[..at], sink) {
                        return false;
                    }
                    let (ch, after) = JsonStr::decode_escape(&rest[at..]);
                    if !self.feed_char(ch, sink) {
                        return false;
                    }
                    rest = after;
                }
            }
        }
    }

    /// Feeds a body text (parts read as joined by a space, which is a gap).
    pub fn feed_text(&mut self, t: &Text<'_>, sink: &mut impl Sink) -> bool {
        for (i, piece) in t.pieces().iter().enumerate() {
            if i > 0 {
                self.gap = self.emitted > 0;
            }
            if !self.feed_json(piece, sink) {
                return false;
            }
        }
        true
    }
}

/// The first `max` characters of the normalized text.
pub fn text_prefix(t: &Text<'_>, max: usize) -> String {
    let mut out = String::new();
    Normalizer::new(max).feed_text(t, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::canonical::normalize_chars;
    use super::*;
    use proptest::prelude::*;

    fn slow(t: &Text<'_>, max: usize) -> String {
        let mut out = String::new();
        normalize_chars(t.chars(), max, |c| out.push(c));
        out
    }

    /// Texts rich in what the fast path treats specially: ASCII and Unicode white space,
    /// multi-byte characters, JSON escapes of each kind.
    fn piece() -> impl Strategy<Value = String> {
        let atom = prop_oneof![
            Just(" ".to_string()),
            Just("  \t\n".to_string()),
            Just("\u{a0}".to_string()),
            Just("\u{3000}".to_string()),
            Just("\u{85}".to_string()),
            Just("é".to_string()),
            Just("😀".to_string()),
            Just("\\n".to_string()),
            Just("\\t".to_string()),
            Just("\\u00a0".to_string()),
            Just("\\u00e9".to_string()),
            Just("\\ud83d\\ude00".to_string()),
            Just("\\\"".to_string()),
            Just("\\\\".to_string()),
            Just("\\/".to_string()),
            "[a-zA-Z0-9.,]{1,12}",
            "[a-z]{1,9}( [a-z]{1,9}){0,8}",
        ];
        prop::collection::vec(atom, 0..40).prop_map(|v| v.concat())
    }

    /// The byte loop alone: the end of the run of word bytes and single spaces before one.
    fn run_by_bytes(b: &[u8], mut i: usize, end: usize) -> usize {
        loop {
            while i < end && word_byte(b[i]) {
                i += 1;
            }
            if i + 1 < end && b[i] == b' ' && word_byte(b[i + 1]) {
                i += 1;
                continue;
            }
            return i;
        }
    }

    /// Bytes rich in what ends a run: spaces, tabs, controls, high bytes.
    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            8 => b'a'..=b'z',
            3 => Just(b' '),
            1 => Just(b'\t'),
            1 => Just(b'\n'),
            1 => Just(0x01u8),
            1 => Just(0x7fu8),
            1 => Just(b'!'),
            1 => 0x80u8..=0xff,
        ];
        prop::collection::vec(byte, 0..80)
    }

    #[test]
    fn a_long_normalized_run_is_skipped_whole() {
        let text = "You are a careful assistant. Answer briefly. ".repeat(20);
        let b = text.as_bytes();
        // Whole words to within eight bytes of the end (the last lane needs a byte after it);
        // the trailing space, with no word after it, ends the run.
        let skipped = skip_words(b, 0, b.len());
        assert!(skipped + 9 >= b.len(), "{skipped} of {}", b.len());
        assert_eq!(run_by_bytes(b, skipped, b.len()), b.len() - 1);
        let tab = text.replacen(". ", ".\t", 3);
        let at = tab.find('\t').unwrap();
        assert!(skip_words(tab.as_bytes(), 0, tab.len()) <= at);
    }

    proptest! {
        #[test]
        fn skipping_by_words_ends_where_the_byte_loop_does(b in bytes(), cut in 0usize..80) {
            let end = cut.min(b.len());
            let skipped = skip_words(&b, 0, end);
            let whole = run_by_bytes(&b, 0, end);
            prop_assert!(skipped <= whole);
            prop_assert_eq!(run_by_bytes(&b, skipped, end), whole);
        }

        #[test]
        fn the_fast_path_equals_the_character_path(
            pieces in prop::collection::vec(piece(), 1..4),
            max in prop_oneof![0usize..20, Just(usize::MAX)],
        ) {
            let raws: Vec<String> = pieces.iter().map(|p| format!("\"{p}\"")).collect();
            let strs: Vec<JsonStr<'_>> =
                raws.iter().map(|r| JsonStr::new(r).unwrap()).collect();
            let text = if strs.len() == 1 { Text::One(strs[0]) } else { Text::Parts(strs) };
            prop_assert_eq!(text_prefix(&text, max), slow(&text, max));
        }
    }
}
