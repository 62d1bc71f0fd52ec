//! What an engine says about its own load, whichever way it said it (an in-band header or a
//! scraped metrics page), reduced to the three numbers routing reads.
//!
//! Engines and pods are not trusted: every number goes through [`count`] or [`ratio`], which
//! turn NaN, infinities, negatives and absurd magnitudes into "not reported" rather than into a
//! load. A report can therefore only ever lack fields, never carry a nonsense one.

/// Requests an engine can plausibly report as running or queued; more is nonsense.
pub const MAX_COUNT: u64 = 1 << 20;

/// How far above 1 a KV-cache fraction may be and still be read as full (rounding), not junk.
const RATIO_SLACK: f64 = 0.01;

/// One engine load report. `None` = the engine did not say (or said something insane).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineReport {
    /// Requests the engine is generating for.
    pub running: Option<u64>,
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: Option<u64>,
    /// KV-cache use, 0 to 1.
    pub kv_usage: Option<f64>,
}

impl EngineReport {
    /// Carries no field at all.
    pub fn is_empty(&self) -> bool {
        self.running.is_none() && self.waiting.is_none() && self.kv_usage.is_none()
    }

    /// Carries both request counts, so it gives the engine's whole load.
    pub fn has_counts(&self) -> bool {
        self.running.is_some() && self.waiting.is_some()
    }
}

/// Where a report came from (the `source` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The `endpoint-load-metrics` header of a response this proxy forwarded.
    InBand,
    /// The pod's metrics page, read by the scraper.
    Scrape,
}

impl Source {
    pub const ALL: [Source; 2] = [Source::InBand, Source::Scrape];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::InBand => "inband",
            Source::Scrape => "scrape",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A request count from an engine's (floating point) number: finite, not negative, at most
/// [`MAX_COUNT`]; rounded to the nearest whole request.
pub fn count(v: f64) -> Option<u64> {
    if !(0.0..=MAX_COUNT as f64).contains(&v) {
        return None;
    }
    Some(v.round() as u64)
}

/// A KV-cache fraction: finite, from 0 to 1 (a hair above 1 reads as 1).
pub fn ratio(v: f64) -> Option<f64> {
    if !(0.0..=1.0 + RATIO_SLACK).contains(&v) {
        return None;
    }
    Some(v.min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ratios_reject_nonsense() {
        for (v, want) in [
            (0.0, Some(0)),
            (-0.0, Some(0)),
            (3.0, Some(3)),
            (2.6, Some(3)),
            (MAX_COUNT as f64, Some(MAX_COUNT)),
            (MAX_COUNT as f64 + 1.0, None),
            (-1.0, None),
            (1e300, None),
            (f64::NAN, None),
            (f64::INFINITY, None),
            (f64::NEG_INFINITY, None),
        ] {
            assert_eq!(count(v), want, "{v}");
        }
        for (v, want) in [
            (0.0, Some(0.0)),
            (0.42, Some(0.42)),
            (1.0, Some(1.0)),
            (1.005, Some(1.0)),
            (1.5, None),
            (42.0, None),
            (-0.1, None),
            (f64::NAN, None),
            (f64::INFINITY, None),
        ] {
            assert_eq!(ratio(v), want, "{v}");
        }
    }

    #[test]
    fn report_shape() {
        assert!(EngineReport::default().is_empty());
        let r = EngineReport {
            running: Some(1),
            waiting: None,
            kv_usage: None,
        };
        assert!(!r.is_empty() && !r.has_counts());
        assert_eq!(Source::ALL.map(Source::as_str), ["inband", "scrape"]);
        assert_eq!(Source::Scrape.index(), 1);
    }
}
