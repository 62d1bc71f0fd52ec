//! Least-loaded: fewest active connections first; ties rotate round-robin.

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
