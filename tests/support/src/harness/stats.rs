//! Order statistics for benchmark samples: the median and spread of a few rounds, quantiles of
//! latencies, and a log-bucketed histogram for millions of per-event delays.
//!
//! Quantiles are nearest-rank (the smallest sample with at least `q` of the samples at or below
//! it): every figure reported is a value that was measured, never an interpolation. The median
//! is the exception by convention: with an even count it is the midpoint of the middle two.
//! The histogram trades exactness for constant memory and cheap merging: each value lands in a
//! bucket no wider than 1/128 of it, so a reported quantile is within 0.8% of the true one.

/// The values sorted ascending (NaN last).
pub fn sorted(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Nearest-rank quantile of ascending `sorted` values; NaN when there are none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of `values` in any order (the midpoint of the middle two for an even count);
/// NaN when there are none.
pub fn median(values: &[f64]) -> f64 {
    let v = sorted(values.iter().copied());
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The smallest and largest of `values` (infinities when there are none).
pub fn min_max(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Values below this are counted exactly, one bucket each.
const EXACT: u64 = 256;
/// Sub-buckets per power of two above [`EXACT`] (relative width 1/128).
const SUB: u64 = 128;
const SUB_BITS: u32 = 7;
const BUCKETS: usize = (EXACT + (64 - 8) * SUB) as usize;

/// A histogram of non-negative integer samples (microseconds, say) in log-linear buckets.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram(n={}, max={})", self.total, self.max)
    }
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    fn bucket(v: u64) -> usize {
        if v < EXACT {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 8
        let shift = e - SUB_BITS;
        let mantissa = (v >> shift) - SUB; // 0..SUB
        (EXACT + u64::from(e - 8) * SUB + mantissa) as usize
    }

    /// The smallest value of bucket `i`, and its width.
    fn bounds(i: usize) -> (u64, u64) {
        let i = i as u64;
        if i < EXACT {
            return (i, 1);
        }
        let e = (i - EXACT) / SUB + 8;
        let mantissa = (i - EXACT) % SUB + SUB;
        let shift = e as u32 - SUB_BITS;
        (mantissa << shift, 1 << shift)
    }

    pub fn record(&mut self, v: u64) {
        self.counts[Self::bucket(v)] += 1;
        self.total += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean; NaN when empty.
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        self.sum as f64 / self.total as f64
    }

    /// Nearest-rank quantile, as the middle of its bucket (exact below 256, and never above
    /// the largest sample); NaN when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, width) = Self::bounds(i);
                let mid = lo as f64 + (width - 1) as f64 / 2.0;
                return mid.min(self.max as f64);
            }
        }
        self.max as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles_and_midpoint_medians() {
        let v = sorted([5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!(v, [1.0, 2.0, 3.0, 4.0, 5.0]);
        for (q, want) in [
            (0.0, 1.0),
            (0.2, 1.0),
            (0.21, 2.0),
            (0.5, 3.0),
            (0.99, 5.0),
            (1.0, 5.0),
        ] {
            assert_eq!(quantile(&v, q), want, "q {q}");
        }
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(min_max(&[2.0, -1.0, 7.5]), (-1.0, 7.5));
    }

    #[test]
    fn buckets_cover_every_value_once_and_stay_narrow() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 40) + 12345, u64::MAX]) {
            let b = Histogram::bucket(v);
            assert!(b < BUCKETS, "{v}");
            let (lo, width) = Histogram::bounds(b);
            assert!(lo <= v && v - lo < width, "{v} in [{lo}, +{width})");
            assert!(width == 1 || width as f64 / lo as f64 <= 1.0 / 128.0, "{v}");
            if v < 5000 {
                assert!(b >= last, "monotonic at {v}");
                last = b;
            }
        }
    }

    #[test]
    fn histogram_quantiles_match_exact_ones_closely() {
        let mut h = Histogram::new();
        let values: Vec<u64> = (1..=10_000).map(|i| i * 37 % 100_003).collect();
        for &v in &values {
            h.record(v);
        }
        let exact = sorted(values.iter().map(|&v| v as f64));
        for q in [0.5, 0.9, 0.99, 0.999] {
            let (got, want) = (h.quantile(q), quantile(&exact, q));
            assert!(
                (got - want).abs() <= want / 128.0 + 1.0,
                "q {q}: {got} vs {want}"
            );
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.max(), *values.iter().max().unwrap());
        let mut small = Histogram::new();
        for v in [3, 3, 200] {
            small.record(v);
        }
        assert_eq!((small.quantile(0.5), small.quantile(1.0)), (3.0, 200.0));
        let mut merged = Histogram::new();
        merged.merge(&h);
        merged.merge(&small);
        assert_eq!(merged.count(), 10_003);
        assert!(Histogram::new().quantile(0.5).is_nan() && Histogram::new().mean().is_nan());
    }
}
