//! Least-loaded: fewest active connections first; ties rotate round-robin.
//!
//! Loads are read from the gauge plus unexpired reservations (see `load::reservations`,
//! which calls [`order`] under its lock so that concurrent picks see each other).

use super::Selection;

/// Least-loaded over precomputed loads.
pub struct LeastLoaded<'a> {
    pub loads: &'a [u64],
    pub ticket: usize,
}

impl Selection for LeastLoaded<'_> {
    fn order(&self, n: usize) -> Vec<usize> {
        debug_assert_eq!(n, self.loads.len());
        order(self.loads, self.ticket)
    }
}

/// Indices of `loads` in preference order: ascending load; among equal loads, starting from
/// index `rr % len` and wrapping, so successive calls with an increasing `rr` share ties out.
pub fn order(loads: &[u64], rr: usize) -> Vec<usize> {
    let n = loads.len();
    if n == 0 {
        return Vec::new();
    }
    let start = rr % n;
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by_key(|&i| (loads[i], (i + n - start) % n));
    idx
}

#[cfg(test)]
mod tests {
    use super::order;

    #[test]
    fn lowest_load_first_then_rotating_ties() {
        assert_eq!(order(&[3, 1, 2], 0), vec![1, 2, 0]);
        assert_eq!(order(&[0, 0, 0], 0), vec![0, 1, 2]);
        assert_eq!(order(&[0, 0, 0], 1), vec![1, 2, 0]);
        assert_eq!(order(&[0, 5, 0], 1), vec![2, 0, 1]);
        assert!(order(&[], 3).is_empty());
    }
}
