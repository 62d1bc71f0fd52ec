//! Text inside a request body, decoded lazily from raw JSON strings.
//!
//! Routing keys use only a bounded prefix of long texts (a system prompt is cut to its segment
//! length) or stream whole texts into a hash, so a text is a sequence of characters produced on
//! demand, never a `String` the size of the prompt. The raw strings have passed the scanner, so
//! their escapes are valid and decoding cannot fail.

use std::borrow::Cow;

/// A raw JSON string (with its quotes) that passed [`super::scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonStr<'a>(&'a str);

impl<'a> JsonStr<'a> {
    /// `raw` if it is a JSON string (starts with a quote); scanned input only.
    pub fn new(raw: &'a str) -> Option<Self> {
        (raw.len() >= 2 && raw.as_bytes()[0] == b'"').then_some(Self(raw))
    }

    fn inner(&self) -> &'a str {
        &self.0[1..self.0.len() - 1]
    }

    /// The decoded text; borrowed when it has no escapes.
    pub fn decode(&self) -> Cow<'a, str> {
        let inner = self.inner();
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            return Cow::Borrowed(inner);
        }
        Cow::Owned(self.chars().collect())
    }

    /// The text between the quotes when it has no escapes (so it is the decoded text).
    #[inline]
    pub fn plain(&self) -> Option<&'a [u8]> {
        let inner = self.inner().as_bytes();
        memchr::memchr(b'\\', inner).is_none().then_some(inner)
    }

    /// Whether the decoded text equals `s` (keys are compared this way, escapes and all).
    pub fn eq_str(&self, s: &str) -> bool {
        let inner = self.inner();
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            return inner == s;
        }
        self.chars().eq(s.chars())
    }

    pub fn chars(&self) -> StrChars<'a> {
        StrChars {
            rest: self.raw_inner(),
        }
    }

    /// The text between the quotes, escapes not decoded.
    pub fn raw_inner(&self) -> &'a str {
        self.inner()
    }

    /// Decodes the escape `s` starts with (`\n`, `\u00e9`, a surrogate pair...), returning the
    /// character and what follows it.
    pub fn decode_escape(s: &str) -> (char, &str) {
        let after = &s[1..];
        let (decoded, used) = match after.as_bytes().first() {
            Some(b'n') => ('\n', 1),
            Some(b't') => ('\t', 1),
            Some(b'r') => ('\r', 1),
            Some(b'b') => ('\u{8}', 1),
            Some(b'f') => ('\u{c}', 1),
            Some(b'u') => {
                let hi = hex(&after[1..]);
                let lo = match after.get(5..7) {
                    Some("\\u") => hex(after.get(7..).unwrap_or("")),
                    _ => 0,
                };
                if (0xD800..0xDC00).contains(&hi) && (0xDC00..0xE000).contains(&lo) {
                    let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    (char::from_u32(cp).unwrap_or('\u{fffd}'), 11)
                } else {
                    // A lone surrogate is no character: U+FFFD.
                    (char::from_u32(hi).unwrap_or('\u{fffd}'), 5)
                }
            }
            Some(&b) => (b as char, 1),
            None => ('\\', 0),
        };
        (decoded, after.get(used..).unwrap_or(""))
    }
}

/// The decoded characters of a [`JsonStr`].
pub struct StrChars<'a> {
    rest: &'a str,
}

fn hex(s: &str) -> u32 {
    u32::from_str_radix(s.get(..4).unwrap_or("0"), 16).unwrap_or(0)
}

impl Iterator for StrChars<'_> {
    type Item = char;

    #[inline]
    fn next(&mut self) -> Option<char> {
        let mut it = self.rest.chars();
        let c = it.next()?;
        if c != '\\' {
            self.rest = it.as_str();
            return Some(c);
        }
        if self.rest.len() < 2 {
            self.rest = "";
            return None;
        }
        let (decoded, after) = JsonStr::decode_escape(self.rest);
        self.rest = after;
        Some(decoded)
    }
}

/// A text made of one or more JSON strings, read as if joined by single spaces (the text parts
/// of a structured message content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text<'a> {
    One(JsonStr<'a>),
    Parts(Vec<JsonStr<'a>>),
}

impl<'a> Text<'a> {
    pub fn pieces(&self) -> &[JsonStr<'a>] {
        match self {
            Text::One(s) => std::slice::from_ref(s),
            Text::Parts(v) => v,
        }
    }

    /// The characters of the text, parts joined by a space.
    pub fn chars(&self) -> impl Iterator<Item = char> + '_ {
        self.pieces()
            .iter()
            .enumerate()
            .flat_map(|(i, s)| (i > 0).then_some(' ').into_iter().chain(s.chars()))
    }

    /// The whole text as a string.
    pub fn to_text(&self) -> Cow<'a, str> {
        match self {
            Text::One(s) => s.decode(),
            Text::Parts(_) => Cow::Owned(self.chars().collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_surrogate_pairs() {
        let raw = r#""a\"b\\c\/d\n\u00e9\ud83d\ude00 z""#;
        let s = JsonStr::new(raw).unwrap();
        let want: String = serde_json::from_str(raw).unwrap();
        assert_eq!(s.decode(), want);
        assert!(s.eq_str(&want));
        assert!(!s.eq_str("a"));
        let plain = JsonStr::new(r#""model""#).unwrap();
        assert!(matches!(plain.decode(), Cow::Borrowed("model")));
        assert!(JsonStr::new(r#""mod\u0065l""#).unwrap().eq_str("model"));
    }

    #[test]
    fn unpaired_surrogates_decode_to_the_replacement_character() {
        for (raw, want) in [
            (r#""cut \ud83d""#, "cut \u{fffd}"),
            (r#""\udc00x""#, "\u{fffd}x"),
            (r#""\ud800\u0041""#, "\u{fffd}A"),
            (r#""\ude00\ud83d\ude00""#, "\u{fffd}\u{1f600}"),
        ] {
            let s = JsonStr::new(raw).unwrap();
            assert_eq!(s.decode(), want, "{raw}");
            assert!(s.eq_str(want), "{raw}");
            assert_eq!(s.chars().collect::<String>(), want, "{raw}");
        }
    }

    #[test]
    fn parts_join_with_a_space() {
        let t = Text::Parts(vec![
            JsonStr::new(r#""a""#).unwrap(),
            JsonStr::new(r#""b c""#).unwrap(),
        ]);
        assert_eq!(t.chars().collect::<String>(), "a b c");
        assert_eq!(t.to_text(), "a b c");
    }
}
