//! Least-loaded: fewest active requests first; ties rotate round-robin.
//!
//! Loads are read from the gauge plus unexpired reservations (see `router::reservation`, which
//! ranks under its lock so that concurrent picks see each other). Only the first `k` of the
//! order are computed (the pick and the alternates a request may try), `k` passes over the
//! loads, with no allocation.

/// Most candidates a ranking holds (the ceiling of `--max-pod-attempts`).
pub const MAX_RANKED: usize = 16;

/// The best candidates of a ranking, best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    idx: [u32; MAX_RANKED],
    len: u8,
    next: u8,
}

impl Iterator for Ranked {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.next == self.len {
            return None;
        }
        let i = self.idx[self.next as usize] as usize;
        self.next += 1;
        Some(i)
    }
}

/// The first `k` indices of `loads` in preference order: ascending load; among equal loads,
/// starting from index `rr % len` and wrapping, so successive calls with an increasing `rr`
/// share ties out.
pub fn rank(loads: &[u64], rr: usize, k: usize) -> Ranked {
    let n = loads.len();
    let k = k.min(n).min(MAX_RANKED);
    let mut out = Ranked {
        idx: [0; MAX_RANKED],
        len: 0,
        next: 0,
    };
    if n == 0 {
        return out;
    }
    let start = rr % n;
    // The tie-break distance of index i from the rotation's start.
    let dist = |i: usize| (i + n - start) % n;
    for slot in 0..k {
        let taken = &out.idx[..slot];
        let best = (0..n)
            .filter(|&i| !taken.contains(&(i as u32)))
            .min_by_key(|&i| (loads[i], dist(i)))
            .expect("k <= n leaves a candidate");
        out.idx[slot] = best as u32;
        out.len += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::rank;

    fn order(loads: &[u64], rr: usize) -> Vec<usize> {
        rank(loads, rr, loads.len()).collect()
    }

    #[test]
    fn lowest_load_first_then_rotating_ties() {
        assert_eq!(order(&[3, 1, 2], 0), vec![1, 2, 0]);
        assert_eq!(order(&[0, 0, 0], 0), vec![0, 1, 2]);
        assert_eq!(order(&[0, 0, 0], 1), vec![1, 2, 0]);
        assert_eq!(order(&[0, 5, 0], 1), vec![2, 0, 1]);
        assert!(order(&[], 3).is_empty());
        assert_eq!(rank(&[4, 3, 2, 1], 0, 2).collect::<Vec<_>>(), vec![3, 2]);
    }
}
