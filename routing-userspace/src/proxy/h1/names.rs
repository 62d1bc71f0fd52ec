//! Header names as a client's heads spell them, kept per thread: the same client sends the
//! same names on every request (an SDK's dozen `X-Stainless-*`, `X-Session-ID`), and
//! `HeaderName::from_bytes` lowercases and checks each one again, and copies any name outside
//! the standard set into an allocation of its own. A name kept here is found by comparing the
//! bytes as sent, and cloned (a standard name is a number, any other a shared buffer counted
//! once more): about half of what `from_bytes` costs (450 instructions against 906 for the four
//! names of the overhead bench's head, one of them outside the standard set). Kept by spelling,
//! not case-folded: comparing without case costs more than `from_bytes` itself. The table holds
//! 256 names, two to a set (about 18 KB a worker thread).

use std::cell::RefCell;

use http::header::{HeaderName, InvalidHeaderName};

use crate::proxy::relayed::is_read;

/// Sets of kept names per thread (a power of two), each of [`WAYS`] names: an SDK's 15 names
/// in a direct-mapped table of 64 slots collided (its `X-Stainless-Package-Version` and
/// `X-Stainless-Runtime-Version` took each other's slot on every request).
const SETS: usize = 128;
const WAYS: usize = 2;
/// Longer names are made afresh each time.
const LONGEST: usize = 32;

/// A name as a head spelled it, the name, and whether the proxy reads it.
struct Kept {
    len: u8,
    spelled: [u8; LONGEST],
    name: HeaderName,
    read: bool,
}

type Table = [[Option<Kept>; WAYS]; SETS];

thread_local! {
    static KEPT: RefCell<Table> = const { RefCell::new([const { [const { None }; WAYS] }; SETS]) };
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

/// `pick` of the name `raw` spells and whether it is read, the name kept for the next time (the
/// newest first in its set, the older one second, any before that dropped).
fn find<R>(raw: &[u8], pick: impl Fn(&HeaderName, bool) -> R) -> Result<R, InvalidHeaderName> {
    if raw.is_empty() || raw.len() > LONGEST {
        return HeaderName::from_bytes(raw).map(|n| pick(&n, is_read(&n)));
    }
    let set = set_of(raw);
    KEPT.with_borrow_mut(|kept| {
        for k in kept[set].iter().flatten() {
            if &k.spelled[..usize::from(k.len)] == raw {
                return Ok(pick(&k.name, k.read));
            }
        }
        let name = HeaderName::from_bytes(raw)?;
        let read = is_read(&name);
        let mut spelled = [0; LONGEST];
        spelled[..raw.len()].copy_from_slice(raw);
        let picked = pick(&name, read);
        let ways = &mut kept[set];
        ways.rotate_right(1);
        ways[0] = Some(Kept {
            len: raw.len() as u8,
            spelled,
            name,
            read,
        });
        Ok(picked)
    })
}

/// The set of a name (1 to [`LONGEST`] bytes): its length, its first and last eight bytes and
/// its middle byte, mixed (an SDK's names share their start, `X-Stainless-`, and often their end
/// and length). Whole words, so no copy of a varying length.
fn set_of(raw: &[u8]) -> usize {
    let n = raw.len();
    let h = match n >= 8 {
        true => {
            let word = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
            word(0) ^ word(n - 8).rotate_left(29) ^ u64::from(raw[n / 2]).rotate_left(47)
        }
        false => raw.iter().fold(0, |h, &b| h << 8 | u64::from(b)),
    };
    ((h ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SETS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever names come, in whatever case and order, each is what `from_bytes` makes of it
    /// (names that share a set displace each other; invalid ones are refused alike).
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
        // Beside them, more names than the table keeps, so sets overflow and names displace
        // each other.
        let generated: Vec<String> = (0..3 * SETS * WAYS).map(|i| format!("X-Gen-{i}")).collect();
        let names: Vec<&str> = names
            .iter()
            .copied()
            .chain(generated.iter().map(String::as_str))
            .collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
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

    /// The names an OpenAI SDK client and the overhead bench send all stay kept together (a
    /// pair that shares a set would be made afresh on every request).
    #[test]
    fn a_clients_names_stay_kept() {
        let names = [
            "Host",
            "Content-Type",
            "Content-Length",
            "Accept",
            "User-Agent",
            "X-Stainless-Lang",
            "X-Stainless-Package-Version",
            "X-Stainless-OS",
            "X-Stainless-Arch",
            "X-Stainless-Runtime",
            "X-Stainless-Runtime-Version",
            "x-stainless-retry-count",
            "x-stainless-read-timeout",
            "Authorization",
            "X-Session-ID",
            "traceparent",
        ];
        let mut sets = [0usize; SETS];
        for n in names {
            sets[set_of(n.as_bytes())] += 1;
        }
        assert!(
            sets.iter().all(|&n| n <= WAYS),
            "no set holds more of them than its ways"
        );
        for n in names {
            name(n.as_bytes()).unwrap();
        }
        KEPT.with_borrow(|kept| {
            for n in names {
                let kept_here = kept[set_of(n.as_bytes())]
                    .iter()
                    .flatten()
                    .any(|k| &k.spelled[..usize::from(k.len)] == n.as_bytes());
                assert!(kept_here, "{n}");
            }
        });
    }
}
