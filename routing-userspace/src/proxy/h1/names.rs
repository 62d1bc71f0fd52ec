//! Header names as a client's heads spell them, kept per thread: the same client sends the
//! same names on every request (an SDK's dozen `X-Stainless-*`, `X-Session-ID`), and
//! `HeaderName::from_bytes` lowercases and checks each one again, and copies any name outside
//! the standard set into an allocation of its own. A name kept here is found by comparing the
//! bytes as sent, and cloned (a standard name is a number, any other a shared buffer counted
//! once more): about half of what `from_bytes` costs (450 instructions against 906 for the four
//! names of the overhead bench's head, one of them outside the standard set). Kept by spelling,
//! not case-folded: comparing without case costs more than `from_bytes` itself.

use std::cell::RefCell;

use http::header::{HeaderName, InvalidHeaderName};

use crate::proxy::relayed::is_read;

/// Names kept per thread (a power of two): direct-mapped by length and first and last byte.
const SLOTS: usize = 64;
/// Longer names are made afresh each time.
const LONGEST: usize = 32;

/// A name as a head spelled it, the name, and whether the proxy reads it.
struct Kept {
    len: u8,
    spelled: [u8; LONGEST],
    name: HeaderName,
    read: bool,
}

thread_local! {
    static KEPT: RefCell<[Option<Kept>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// What `HeaderName::from_bytes(raw)` gives.
pub(super) fn name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    find(raw, |name, _| name.clone())
}

/// The name, if the proxy reads fields of that name (`proxy::relayed::READ`); `None` for a
/// field it relays unread. Refused as `HeaderName::from_bytes(raw)` refuses it.
pub(super) fn read_name(raw: &[u8]) -> Result<Option<HeaderName>, InvalidHeaderName> {
    find(raw, |name, read| read.then(|| name.clone()))
}

/// `pick` of the name `raw` spells and whether it is read, the name kept for the next time.
fn find<R>(raw: &[u8], pick: impl Fn(&HeaderName, bool) -> R) -> Result<R, InvalidHeaderName> {
    let (Some(&first), Some(&last)) = (raw.first(), raw.last()) else {
        return HeaderName::from_bytes(raw).map(|n| pick(&n, is_read(&n)));
    };
    if raw.len() > LONGEST {
        return HeaderName::from_bytes(raw).map(|n| pick(&n, is_read(&n)));
    }
    let slot = slot(raw.len(), first, last);
    KEPT.with_borrow_mut(|kept| {
        if let Some(k) = &kept[slot] {
            if &k.spelled[..usize::from(k.len)] == raw {
                return Ok(pick(&k.name, k.read));
            }
        }
        let name = HeaderName::from_bytes(raw)?;
        let read = is_read(&name);
        let mut spelled = [0; LONGEST];
        spelled[..raw.len()].copy_from_slice(raw);
        let picked = pick(&name, read);
        kept[slot] = Some(Kept {
            len: raw.len() as u8,
            spelled,
            name,
            read,
        });
        Ok(picked)
    })
}

/// The slot of a name of `len` bytes from `first` to `last`.
fn slot(len: usize, first: u8, last: u8) -> usize {
    (len ^ (usize::from(first) << 1) ^ (usize::from(last) << 3)) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever names come, in whatever case and order, each is what `from_bytes` makes of it
    /// (names that share a slot take it from each other; invalid ones are refused alike).
    #[test]
    fn every_name_is_what_from_bytes_makes_of_it() {
        let names = [
            "Host",
            "host",
            "HOST",
            "Content-Type",
            "content-length",
            "X-Session-ID",
            "x-session-id",
            "X-Stainless-Lang",
            "X-Stainless-Package-Version",
            "X-Stainless-OS",
            "X-Stainless-Arch",
            "x-stainless-retry-count",
            "Authorization",
            "a",
            "A",
            "x",
            "bad name",
            "bad:name",
            "",
            "\u{e9}t\u{e9}",
            "X-Session-Id ",
            "x-sessionid",
            "y-session-id",
            "X-Stainless-Runtime-Version-And-More",
            "x-stainless-runtime-version-and-more",
        ];
        let slots: Vec<usize> = names
            .iter()
            .filter_map(|n| Some(slot(n.len(), *n.as_bytes().first()?, *n.as_bytes().last()?)))
            .collect();
        let shared = (1..slots.len()).any(|i| slots[..i].contains(&slots[i]));
        assert!(
            shared,
            "some names share a slot, so the test sees them displace each other"
        );
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let raw = names[(x % names.len() as u64) as usize].as_bytes();
            let want = HeaderName::from_bytes(raw);
            let (got, read) = match x % 2 {
                0 => (name(raw), None),
                _ => match read_name(raw) {
                    Ok(Some(n)) => (Ok(n), Some(true)),
                    // Relayed unread: `from_bytes` accepts it, and the proxy does not read it.
                    Ok(None) => (HeaderName::from_bytes(raw), Some(false)),
                    Err(e) => (Err(e), None),
                },
            };
            assert_eq!(got.is_ok(), want.is_ok(), "{raw:?}");
            if let (Ok(got), Ok(want)) = (got, want) {
                assert_eq!(got, want);
                assert_eq!(got.as_str(), want.as_str());
                if let Some(read) = read {
                    assert_eq!(read, is_read(&want), "{raw:?}");
                }
            }
        }
    }
}
