//! Pod and member selection, one strategy per file.
//!
//! Every strategy answers the same question through [`Selection`]: given `n` candidates, in
//! which order should they be tried? The first is the pick; the rest are the alternates a
//! connect failure moves on to, so retries never re-hash or re-rank. A strategy value is built
//! per request from its inputs (a key hash, loads, a round-robin ticket), which keeps each one a
//! pure function that tests can call directly.

pub mod least_loaded;
pub mod priority;
pub mod random;
pub mod ring;
pub mod round_robin;

/// An ordering of `n` candidates, best first.
pub trait Selection {
    fn order(&self, n: usize) -> Vec<usize>;
}
