//! Pod and member selection, one strategy per file.
//!
//! Every strategy answers the same question: in which order should `n` candidates be tried?
//! The first is the pick; the rest are the alternates a failed attempt moves on to, so retries
//! never re-hash or re-rank. Each strategy produces its order lazily (an iterator, or a cursor
//! that is advanced on demand), so a request pays for the candidates it tries, not for all of
//! them, and nothing is allocated per request for fleets of up to [`SeenSet::INLINE`] pods.
//! Every strategy value is built per request from its inputs (a key hash, loads, a round-robin
//! ticket), which keeps each one a pure function that tests can call directly.

pub mod bounded;
pub mod cache_aware;
pub mod least_loaded;
pub mod priority;
pub mod random;
pub mod ring;
pub mod round_robin;

/// Which of `n` candidates were already handed out.
#[derive(Debug, Clone)]
pub enum SeenSet {
    Inline([u64; 2]),
    Heap(Vec<u64>),
}

impl SeenSet {
    /// Candidates tracked without allocating.
    pub const INLINE: usize = 128;

    pub fn new(n: usize) -> Self {
        if n <= Self::INLINE {
            SeenSet::Inline([0; 2])
        } else {
            SeenSet::Heap(vec![0; n.div_ceil(64)])
        }
    }

    fn words(&mut self) -> &mut [u64] {
        match self {
            SeenSet::Inline(w) => w,
            SeenSet::Heap(v) => v,
        }
    }

    /// Mark `i`; returns whether it was new.
    #[inline]
    pub fn insert(&mut self, i: usize) -> bool {
        let w = &mut self.words()[i / 64];
        let bit = 1u64 << (i % 64);
        let new = *w & bit == 0;
        *w |= bit;
        new
    }

    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        let w = match self {
            SeenSet::Inline(w) => w[i / 64],
            SeenSet::Heap(v) => v[i / 64],
        };
        w >> (i % 64) & 1 == 1
    }
}
