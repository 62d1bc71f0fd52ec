//! Other nodes' part of a pod's load, between two reports.
//!
//! A report gives a pod's whole count (running + waiting) at one moment, and this node knows
//! its own part then, so the rest is what the other nodes had on the pod: one sample of a
//! quantity that moves every time one of their requests starts or ends, seconds apart for LLM
//! requests. With N nodes, a node hears of a pod only when it sends it a request or scrapes
//! it, seconds apart too, and by then most of the sample's deviation from the pod's usual
//! level is gone. Read as it stands, an old sample sends the node's requests after a moment
//! that has passed: a pod caught busy looks busy for seconds and loses its conversations to
//! spills it did not need, a pod caught idle takes a herd.
//!
//! So the prediction leans on the sample while it is young and on the pod's usual level as it
//! ages, as for any quantity that reverts to its mean: `others(age) = mean + (sample - mean) *
//! exp(-age / T)` (the exponential approximated, see `decay`), with `T` = [`MEMORY_NS`] and
//! the mean a running average of the samples (each new one weighs [`SAMPLE_WEIGHT`]). One node
//! alone has no others: its samples are 0 and so is the prediction. The fleet replays measured
//! it (docs/routing-quality.md has the tables); `T` from 1 to 4 s, a `T / (T + age)` decay
//! instead of the exponential and weights from 1/10 to 1/2 gave the same within the replays'
//! noise, reading the last sample alone clearly less.
//!
//! The average is kept in thousandths of a request; the prediction is a few multiplies and a
//! division per pod of a bounded pick.

/// How fast a sample's deviation from the pod's usual level is forgotten: after this long,
/// 0.4 of it is left (`1/e` for the exponential). About an LLM request's time in a pod: other nodes' requests start and
/// end at that pace.
pub const MEMORY_NS: u64 = 2_000_000_000;

/// What a new sample weighs in the running average (a quarter: about the last four reports).
pub const SAMPLE_WEIGHT: (i64, i64) = (1, 4);

/// The average before any sample.
pub const NO_MEAN: u64 = u64::MAX;

const MILLI: i64 = 1000;

/// The running average (thousandths of a request) after `sample` (requests), from `mean`
/// ([`NO_MEAN`] before the first sample).
pub fn next_mean(mean: u64, sample: u64) -> u64 {
    let s = milli(sample);
    if mean == NO_MEAN {
        return s as u64;
    }
    let m = i128::from(mean);
    let (num, den) = SAMPLE_WEIGHT;
    let next = m + (i128::from(s) - m) * i128::from(num) / i128::from(den);
    u64::try_from(next.max(0)).unwrap_or(NO_MEAN - 1)
}

/// Other nodes' requests on the pod now, `age_ns` after a report whose sample was `sample`,
/// with `mean` the running average ([`NO_MEAN`]: the sample stands).
#[inline]
pub fn predict(sample: u64, mean: u64, age_ns: u64) -> u64 {
    let s = milli(sample);
    // The sample is the average (one node alone: both 0): nothing to forget.
    if mean == NO_MEAN || s as u64 == mean {
        return sample;
    }
    let left = decay(age_ns as f64 / MEMORY_NS as f64);
    let (s, m) = (s as f64, mean as f64);
    let p = (m + (s - m) * left) / MILLI as f64;
    // Between the sample and the average, so never negative; `as` saturates anyway.
    (p + 0.5) as u64
}

/// `exp(-x)` for `x >= 0`, close enough for a forgetting curve and a few times cheaper than
/// libm's `exp` (it runs for every pod of every bounded pick): the exponential's first three
/// terms in the denominator, `1 / (1 + x + x^2 / 2)`. It is `exp(-x)` at 0, 9% above it at 1,
/// and falls off as `2 / x^2` after.
#[inline]
fn decay(x: f64) -> f64 {
    1.0 / (1.0 + x + 0.5 * x * x)
}

fn milli(requests: u64) -> i64 {
    i64::try_from(requests)
        .unwrap_or(i64::MAX / MILLI)
        .min(i64::MAX / MILLI)
        * MILLI
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_young_sample_stands_and_an_old_one_gives_way_to_the_average() {
        let mean = next_mean(next_mean(NO_MEAN, 8), 0); // 8 then 0: average 6
        assert_eq!(mean, 6_000);
        assert_eq!(predict(0, mean, 0), 0, "a report just taken is the truth");
        assert_eq!(predict(0, mean, S / 2), 1, "6 - 6 x 0.78: 1.3");
        assert_eq!(
            predict(0, mean, 2 * S),
            4,
            "after MEMORY, 0.4 of the way left: 3.6"
        );
        assert_eq!(
            predict(0, mean, 60 * S),
            6,
            "long after, the pod's usual level"
        );
        assert_eq!(predict(12, mean, 2 * S), 8, "both directions: 8.4");
    }

    #[test]
    fn the_first_sample_is_the_average_and_one_node_alone_predicts_nothing() {
        assert_eq!(predict(5, NO_MEAN, 10 * S), 5);
        let mean = next_mean(NO_MEAN, 5);
        assert_eq!(predict(5, mean, 10 * S), 5);
        let mut alone = NO_MEAN;
        for _ in 0..10 {
            alone = next_mean(alone, 0);
        }
        assert_eq!(predict(0, alone, 30 * S), 0);
    }

    #[test]
    fn the_average_follows_a_quarter_of_each_sample() {
        let mut m = next_mean(NO_MEAN, 0);
        m = next_mean(m, 4);
        assert_eq!(m, 1_000);
        m = next_mean(m, 4);
        assert_eq!(m, 1_750);
    }

    #[test]
    fn the_decay_is_near_the_exponential_where_it_matters() {
        for (x, within) in [(0.0, 1e-12), (0.25, 0.01), (0.5, 0.03), (1.0, 0.04)] {
            let (d, e) = (decay(x), f64::exp(-x));
            assert!((d - e).abs() <= within, "x {x}: {d} against {e}");
        }
        let mut last = 1.0;
        for i in 1..1000 {
            let d = decay(f64::from(i) * 0.05);
            assert!(d < last && d > 0.0, "falls and stays positive");
            last = d;
        }
    }

    proptest! {
        #[test]
        fn the_prediction_lies_between_the_sample_and_the_average(
            samples in proptest::collection::vec(0u64..1_000_000, 1..20),
            last in 0u64..1_000_000,
            age in 0u64..(3600 * S),
        ) {
            let mut mean = NO_MEAN;
            for s in samples {
                mean = next_mean(mean, s);
            }
            mean = next_mean(mean, last);
            let p = predict(last, mean, age);
            let avg = (mean + 500) / 1000;
            prop_assert!(p + 1 >= last.min(avg) && p <= last.max(avg) + 1, "{p} outside {last}..{avg}");
        }

        #[test]
        fn hostile_counts_never_overflow(sample in any::<u64>(), mean in any::<u64>(), age in any::<u64>()) {
            let _ = predict(sample, mean, age);
            let _ = next_mean(mean, sample);
        }
    }
}
