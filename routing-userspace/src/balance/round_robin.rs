//! Round-robin: each request starts one further along; the others follow in turn.

/// All `n` candidates once, starting at `start % n` and wrapping.
#[derive(Debug, Clone)]
pub struct Rotation {
    start: usize,
    n: usize,
    i: usize,
}

impl Rotation {
    pub fn new(start: usize, n: usize) -> Self {
        Self {
            start: if n == 0 { 0 } else { start % n },
            n,
            i: 0,
        }
    }
}

impl Iterator for Rotation {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.i == self.n {
            return None;
        }
        let v = (self.start + self.i) % self.n;
        self.i += 1;
        Some(v)
    }
}

/// The round-robin order for a ticket from a shared counter (one ticket per request).
pub fn round_robin(ticket: usize, n: usize) -> Rotation {
    Rotation::new(ticket, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates() {
        assert_eq!(round_robin(0, 3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(round_robin(4, 3).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(round_robin(4, 0).count(), 0);
    }
}
