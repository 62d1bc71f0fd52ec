//! Which requests get a trace: the OpenTelemetry SDK samplers by their standard names
//! (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
//!
//! The decision is a pure function of the incoming `traceparent` and the trace id, made before
//! anything is allocated, so an unsampled request costs a header lookup and a comparison.

use opentelemetry::trace::TraceId;

use super::propagation::TraceParent;

/// A sampler without the parent rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    /// `traceidratio`: a trace id whose low 63 bits fall under `ratio * 2^63`.
    Ratio(f64),
}

/// `OTEL_TRACES_SAMPLER`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub root: Root,
    /// `parentbased_*`: a request with a valid `traceparent` follows its sampled flag; only a
    /// request without one asks the root sampler.
    pub parent_based: bool,
}

/// A sampler name or argument that is not one of the standard ones.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("unknown sampler {0:?} (expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio)")]
    Unknown(String),
    #[error("sampler argument {0:?} is not a ratio from 0 to 1")]
    Ratio(String),
}

impl Sampler {
    /// The SDK's default, `parentbased_always_on`.
    pub const DEFAULT: Self = Self {
        root: Root::AlwaysOn,
        parent_based: true,
    };

    /// The sampler of `name` with its argument (the ratio of the `traceidratio` ones; a
    /// missing argument means 1.0, as the SDKs read it).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Self, SamplerError> {
        let name = name.trim().to_ascii_lowercase();
        let (parent_based, root) = match name.strip_prefix("parentbased_") {
            Some(rest) => (true, rest),
            None => (false, name.as_str()),
        };
        let root = match root {
            "always_on" => Root::AlwaysOn,
            "always_off" => Root::AlwaysOff,
            "traceidratio" => Root::Ratio(parse_ratio(arg)?),
            _ => return Err(SamplerError::Unknown(name.clone())),
        };
        Ok(Self { root, parent_based })
    }

    /// Whether the request (with this incoming `traceparent`, on this trace) is sampled.
    pub fn should_sample(&self, parent: Option<&TraceParent>, trace_id: TraceId) -> bool {
        match parent {
            Some(p) if self.parent_based => p.sampled,
            _ => self.root.should_sample(trace_id),
        }
    }

    /// No request can be sampled: the proxy then skips even the trace id.
    pub fn never(&self) -> bool {
        match self.root {
            Root::AlwaysOff => !self.parent_based,
            Root::Ratio(r) => r <= 0.0 && !self.parent_based,
            Root::AlwaysOn => false,
        }
    }

    /// Whether a request without a parent is sampled at all (a ratio may still say no).
    pub fn roots_may_sample(&self) -> bool {
        match self.root {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            Root::Ratio(r) => r > 0.0,
        }
    }
}

impl Root {
    fn should_sample(self, trace_id: TraceId) -> bool {
        match self {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            Root::Ratio(r) if r >= 1.0 => true,
            Root::Ratio(r) => {
                let bound = (r.max(0.0) * (1u64 << 63) as f64) as u64;
                let low = u128::from_be_bytes(trace_id.to_bytes()) as u64;
                (low >> 1) < bound
            }
        }
    }
}

fn parse_ratio(arg: Option<&str>) -> Result<f64, SamplerError> {
    let Some(arg) = arg.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(1.0);
    };
    match arg.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(SamplerError::Ratio(arg.to_owned())),
    }
}

impl std::fmt::Display for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.parent_based {
            f.write_str("parentbased_")?;
        }
        match self.root {
            Root::AlwaysOn => f.write_str("always_on"),
            Root::AlwaysOff => f.write_str("always_off"),
            Root::Ratio(r) => write!(f, "traceidratio({r})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::SpanId;

    fn parent(sampled: bool) -> TraceParent {
        TraceParent {
            trace_id: TraceId::from(7u128),
            parent_id: SpanId::from(9u64),
            sampled,
        }
    }

    #[test]
    fn parses_the_standard_names() {
        let s = |n, a| Sampler::parse(n, a).unwrap();
        assert_eq!(s("always_on", None).root, Root::AlwaysOn);
        assert_eq!(s("Always_Off", None).root, Root::AlwaysOff);
        assert_eq!(s("traceidratio", Some("0.25")).root, Root::Ratio(0.25));
        assert_eq!(s("traceidratio", None).root, Root::Ratio(1.0));
        let pb = s("parentbased_traceidratio", Some("0"));
        assert!(pb.parent_based);
        assert_eq!(pb.root, Root::Ratio(0.0));
        assert!(matches!(
            Sampler::parse("jaeger_remote", None),
            Err(SamplerError::Unknown(_))
        ));
        assert!(matches!(
            Sampler::parse("traceidratio", Some("1.5")),
            Err(SamplerError::Ratio(_))
        ));
    }

    #[test]
    fn parent_based_follows_the_parent() {
        let s = Sampler::parse("parentbased_always_off", None).unwrap();
        let id = TraceId::from(1u128);
        assert!(s.should_sample(Some(&parent(true)), id));
        assert!(!s.should_sample(Some(&parent(false)), id));
        assert!(!s.should_sample(None, id));
        assert!(!s.never());
        let plain = Sampler::parse("always_on", None).unwrap();
        assert!(plain.should_sample(Some(&parent(false)), id));
    }

    #[test]
    fn ratio_samples_about_its_share() {
        let s = Sampler::parse("traceidratio", Some("0.25")).unwrap();
        let n = 20_000u64;
        let kept = (0..n)
            .filter(|i| {
                let id = xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes());
                s.should_sample(None, TraceId::from(id))
            })
            .count() as f64;
        let share = kept / n as f64;
        assert!((0.23..0.27).contains(&share), "{share}");
        assert!(Sampler::parse("traceidratio", Some("0")).unwrap().never());
        assert!(!Sampler::parse("traceidratio", Some("1")).unwrap().never());
    }
}
