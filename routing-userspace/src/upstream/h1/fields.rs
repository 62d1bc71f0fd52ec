//! A pod's response header fields as they came: the head's bytes, and where each end-to-end
//! field's name and value lie in them.
//!
//! The proxy reads two of a response's fields (its content type and the pod's load report) and
//! relays the rest. Made into a `HeaderMap` (a name looked up or copied, a value checked and
//! shared, a hash insert, per field) only to be written out again at once, they cost about
//! 1,800 instructions a response more than kept as spans, relayed byte for byte, in the pod's own
//! name casing (field names are case-insensitive, RFC 9110 section 5.1). The parser that made
//! them ([`super::head`]) checked every name and value as `HeaderName` and `HeaderValue` would,
//! so [`Fields::append_to`] makes a map of them unchanged where one is needed (an HTTP/2
//! client).

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

/// Fields kept in the box itself, without a second allocation: most responses have fewer
/// (uvicorn and nginx send four or five, one of them hop-by-hop).
const INLINE: usize = 8;

/// Where one field's name and value lie in the head (offset, length; a head is at most
/// [`super::head::MAX_HEAD`] bytes, so both fit).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Span {
    pub(super) name: (u32, u32),
    pub(super) value: (u32, u32),
}

/// A response head's end-to-end header fields, in their order, sharing the head's memory.
///
/// Boxed: a response passes through several futures' states on its way to the client, and
/// each move copied the fields inline (about 1,300 instructions a request, more than the box
/// costs).
#[derive(Debug, Default)]
pub struct Fields(Option<Box<Inner>>);

#[derive(Debug)]
struct Inner {
    head: Bytes,
    spans: SmallVec<[Span; INLINE]>,
}

fn range((start, len): (u32, u32)) -> std::ops::Range<usize> {
    start as usize..(start + len) as usize
}

impl Inner {
    /// Whether the field at `s` is named `lowercase` (the lengths compared first: most are
    /// not).
    fn named(&self, s: &Span, lowercase: &str) -> bool {
        s.name.1 as usize == lowercase.len()
            && self.head[range(s.name)].eq_ignore_ascii_case(lowercase.as_bytes())
    }
}

impl Fields {
    /// The fields at `spans` of `head`; names and values already checked.
    pub(super) fn new(head: Bytes, spans: SmallVec<[Span; INLINE]>) -> Self {
        Self(Some(Box::new(Inner { head, spans })))
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |f| f.spans.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every field, name (as sent) and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.0.iter().flat_map(|f| {
            f.spans
                .iter()
                .map(|s| (&f.head[range(s.name)], &f.head[range(s.value)]))
        })
    }

    /// The values of the fields named `name` (lowercase, as `HeaderName::as_str` gives it), in
    /// order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.iter().flat_map(move |f| {
            f.spans
                .iter()
                .filter(move |s| f.named(s, name))
                .map(|s| &f.head[range(s.value)])
        })
    }

    /// The first value of the field named `name` (lowercase).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let f = self.0.as_deref()?;
        let s = f.spans.iter().find(|s| f.named(s, name))?;
        Some(&f.head[range(s.value)])
    }

    /// Every field's name, value and line in the head, the line from the name to the
    /// value's end (the pod's own spacing around the colon, always valid: `name ":" OWS
    /// value`), without the line end.
    pub fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8], &[u8])> + '_ {
        self.0.iter().flat_map(|f| {
            f.spans.iter().map(|s| {
                let (start, _) = s.name;
                let (value, len) = s.value;
                let line = &f.head[start as usize..(value + len) as usize];
                (&f.head[range(s.name)], &f.head[range(s.value)], line)
            })
        })
    }

    /// Append every field to `map` (names lowercased, values sharing the head's memory).
    pub fn append_to(self, map: &mut HeaderMap) {
        let Some(f) = self.0 else {
            return;
        };
        for s in &f.spans {
            let name = HeaderName::from_bytes(&f.head[range(s.name)]);
            let value = HeaderValue::from_maybe_shared(f.head.slice(range(s.value)));
            // Both were checked by the parser as these constructors check them.
            if let (Ok(name), Ok(value)) = (name, value) {
                map.append(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &'static str, at: &[(&str, &str)]) -> Fields {
        let head = Bytes::from_static(text.as_bytes());
        let find = |s: &str| (text.find(s).unwrap() as u32, s.len() as u32);
        let spans = at
            .iter()
            .map(|(n, v)| Span {
                name: find(n),
                value: find(v),
            })
            .collect();
        Fields::new(head, spans)
    }

    #[test]
    fn finds_names_in_any_case_and_keeps_the_order() {
        let f = fields(
            "Content-Type: a\r\nX-Two: b\r\nx-two: c\r\n",
            &[("Content-Type", "a"), ("X-Two", "b"), ("x-two", "c")],
        );
        assert_eq!(f.get("content-type"), Some(&b"a"[..]));
        assert_eq!(f.get_all("x-two").collect::<Vec<_>>(), [&b"b"[..], b"c"]);
        assert_eq!(f.get("x-tw"), None);
        assert_eq!(f.iter().next(), Some((&b"Content-Type"[..], &b"a"[..])));
        let mut map = HeaderMap::new();
        f.append_to(&mut map);
        assert_eq!(map.len(), 3);
        assert_eq!(map["content-type"], "a");
        assert_eq!(map.get_all("x-two").iter().count(), 2);
    }
}
