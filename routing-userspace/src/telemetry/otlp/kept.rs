//! A bounded cache of encodings by identity: set-associative, least recently used out.
//!
//! A hash names a set of `WAYS` entries; an entry is found by its full hash, then its
//! identities compared; a newcomer takes the least recently used entry of its set. Why not
//! direct-mapped (one entry per hash): two encodings in use all the time whose hashes meet
//! would push each other out on every span, for as long as the process lives (addresses, and
//! so hashes, differ from run to run). Four ways make that need five of them in one set.

use std::sync::Arc;

/// Entries of a cache (a power of two, a multiple of `WAYS`).
pub(super) const ENTRIES: usize = 256;
const WAYS: usize = 4;
const SETS: usize = ENTRIES / WAYS;

/// Encodings by the hash and the identity words they were made from.
#[derive(Debug)]
pub(super) struct Kept {
    entries: Vec<Option<Entry>>,
    /// Counts lookups: an entry's `used` is the tick of its last hit.
    tick: u64,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    used: u64,
    id: Box<[u64]>,
    bytes: Box<[u8]>,
    /// The shared strings whose addresses `id` names, kept alive so no other can take them.
    _alive: Vec<Arc<str>>,
}

impl Default for Kept {
    fn default() -> Self {
        Self {
            entries: (0..ENTRIES).map(|_| None).collect(),
            tick: 0,
        }
    }
}

impl Kept {
    /// The encoding kept for hash `h` whose identity words `same` accepts.
    pub(super) fn get(&mut self, h: u64, same: impl Fn(&[u64]) -> bool) -> Option<&[u8]> {
        self.tick += 1;
        let tick = self.tick;
        let hit = self.entries[set(h)]
            .iter_mut()
            .flatten()
            .find(|e| e.hash == h && same(&e.id))?;
        hit.used = tick;
        Some(&hit.bytes)
    }

    /// Keep `bytes`, encoded from `id` (hash `h`), in place of the least recently used entry
    /// of its set.
    pub(super) fn put(&mut self, h: u64, id: &[u64], bytes: &[u8], alive: Vec<Arc<str>>) {
        self.tick += 1;
        // An empty entry (None) comes before any in use.
        let victim = self.entries[set(h)]
            .iter_mut()
            .min_by_key(|e| e.as_ref().map(|e| e.used))
            .expect("a set has entries");
        *victim = Some(Entry {
            hash: h,
            used: self.tick,
            id: id.into(),
            bytes: bytes.into(),
            _alive: alive,
        });
    }

    /// Encodings held (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.iter().flatten().count()
    }
}

/// The entries of hash `h`'s set: its high bits name it.
fn set(h: u64) -> std::ops::Range<usize> {
    let s = (h >> (64 - SETS.trailing_zeros())) as usize;
    s * WAYS..(s + 1) * WAYS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes that all name set 0.
    fn in_set_zero(n: u64) -> u64 {
        n
    }

    /// Four encodings in use in one set all stay; a fifth pushes out the least recently used.
    #[test]
    fn a_set_keeps_its_four_most_recently_used() {
        let mut k = Kept::default();
        for n in 1..=4u64 {
            k.put(in_set_zero(n), &[n], &[n as u8], Vec::new());
        }
        for round in 0..3 {
            for n in 1..=4u64 {
                let got = k.get(in_set_zero(n), |id| id == [n]).map(<[u8]>::to_vec);
                assert_eq!(got, Some(vec![n as u8]), "round {round}, {n}");
            }
        }
        // 1 is the least recently used now
        k.put(in_set_zero(5), &[5], &[5], Vec::new());
        assert_eq!(k.get(in_set_zero(1), |id| id == [1]), None);
        for n in 2..=5u64 {
            assert!(k.get(in_set_zero(n), |id| id == [n]).is_some(), "{n}");
        }
        assert_eq!(k.len(), 4);
    }

    /// An entry is found by its hash and its identities both.
    #[test]
    fn a_hash_alone_finds_nothing() {
        let mut k = Kept::default();
        k.put(7, &[1, 2], b"x", Vec::new());
        assert!(k.get(7, |id| id == [1, 2]).is_some());
        assert!(k.get(7, |id| id == [1, 3]).is_none());
        assert!(k.get(8, |id| id == [1, 2]).is_none());
    }
}
