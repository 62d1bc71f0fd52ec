//! One header of a request's or response's map, found by comparing names instead of hashing
//! one.
//!
//! `HeaderMap::get` hashes the name it looks for on every call (a custom name byte by byte).
//! A request is looked up for about eight names on its way (model, session, tenant,
//! authorization, length, content type...), most of them absent, in a map of a handful of
//! headers: comparing each name there is cheaper than one hash. A larger map goes to `get`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Past this many values, a map is searched by hash.
const COMPARED: usize = 12;

/// The first value of `name` in `headers`, as `HeaderMap::get` gives it.
#[inline]
pub fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h HeaderValue> {
    if headers.len() > COMPARED {
        return headers.get(name);
    }
    headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// Whether `headers` has `name`.
#[inline]
pub fn contains(headers: &HeaderMap, name: &HeaderName) -> bool {
    header(headers, name).is_some()
}

/// Every value of `name` in `headers`, in order, as `HeaderMap::get_all` gives them.
pub fn values<'h, 'n>(headers: &'h HeaderMap, name: &'n HeaderName) -> Values<'h, 'n> {
    if headers.len() > COMPARED {
        return Values::Hashed(headers.get_all(name).iter());
    }
    Values::Compared {
        all: headers.iter(),
        name,
    }
}

/// The values [`values`] finds.
pub enum Values<'h, 'n> {
    Compared {
        all: http::header::Iter<'h, HeaderValue>,
        name: &'n HeaderName,
    },
    Hashed(http::header::ValueIter<'h, HeaderValue>),
}

impl<'h> Iterator for Values<'h, '_> {
    type Item = &'h HeaderValue;

    fn next(&mut self) -> Option<&'h HeaderValue> {
        match self {
            Values::Compared { all, name } => all.find(|(k, _)| *k == *name).map(|(_, v)| v),
            Values::Hashed(values) => values.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the map's size, names and repeats: what `get`, `contains_key` and `get_all`
    /// find.
    #[test]
    fn finds_what_get_finds() {
        let names = [
            "content-type",
            "x-session-id",
            "authorization",
            "x-flexinfer-tenant",
            "x-model-id",
            "x-other",
            "content-length",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut h = HeaderMap::new();
            for i in 0..(x % 20) as usize {
                let n = names[(x as usize >> (i % 32)) % names.len()];
                h.append(
                    HeaderName::from_static(n),
                    HeaderValue::from_str(&format!("v{i}")).unwrap(),
                );
            }
            for n in names.iter().chain(["host", "x-absent"].iter()) {
                let name = HeaderName::from_static(n);
                assert_eq!(
                    header(&h, &name),
                    h.get(&name),
                    "round {round}: {n} in {h:?}"
                );
                assert_eq!(contains(&h, &name), h.contains_key(&name));
                let all: Vec<_> = values(&h, &name).collect();
                let expected: Vec<_> = h.get_all(&name).iter().collect();
                assert_eq!(all, expected, "round {round}: {n} in {h:?}");
            }
        }
    }
}
