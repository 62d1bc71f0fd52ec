//! Round-robin: each request starts one further along; the others follow in turn.

use super::Selection;

pub struct RoundRobin {
    /// A ticket from a shared counter, one per request.
    pub ticket: usize,
}

impl Selection for RoundRobin {
    fn order(&self, n: usize) -> Vec<usize> {
        if n == 0 {
            return Vec::new();
        }
        let start = self.ticket % n;
        (0..n).map(|i| (start + i) % n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates() {
        assert_eq!(RoundRobin { ticket: 0 }.order(3), vec![0, 1, 2]);
        assert_eq!(RoundRobin { ticket: 4 }.order(3), vec![1, 2, 0]);
        assert!(RoundRobin { ticket: 4 }.order(0).is_empty());
    }
}
