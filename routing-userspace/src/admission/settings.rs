//! Admission settings: a model's own (models file, Model CRD, annotations) over the proxy's
//! (flags), turned into what one gate runs with.
//!
//! Every value is parsed by one function here, whichever source it comes from, so the models
//! file, the CRD and the annotations accept the same spellings and say the same thing when a
//! value is wrong.

use std::time::Duration;

use super::budget::{TokenBudget, DEFAULT_MAX_BUCKETS};
use super::capacity::{FullWhen, DEFAULT_FULL_WHEN};
use super::metrics::DEFAULT_TENANT_LABEL_CAP;
use super::weights::TenantWeights;
use crate::config::parse_duration;

/// A model's own admission settings; unset fields take the proxy's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelAdmission {
    /// Requests in flight per pod before the pod is full (unset: no limit).
    pub max_concurrency: Option<u32>,
    /// `queue.maxSize`: requests waiting at most (0: never queue).
    pub queue_max_size: Option<u32>,
    /// `queue.timeout`: longest wait.
    pub queue_timeout: Option<Duration>,
    /// `queue.sheddableTimeout`: longest wait of a sheddable (negative priority) request.
    pub queue_sheddable_timeout: Option<Duration>,
    /// The token budget per tenant (unset: none).
    pub tokens_per_minute: Option<u64>,
    /// The most a tenant's bucket holds (unset: `tokens_per_minute`).
    pub token_burst: Option<u64>,
    /// `queue.tenantWeights`: turns per round of the tenants named (others: 1). Model-only.
    pub tenant_weights: TenantWeights,
}

impl ModelAdmission {
    /// The token budget these settings ask for.
    pub fn budget(&self) -> Option<TokenBudget> {
        self.tokens_per_minute.map(|tpm| TokenBudget {
            tokens_per_minute: tpm,
            burst: self.token_burst.unwrap_or(tpm),
        })
    }
}

/// The proxy-wide admission settings (validated flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionDefaults {
    pub queue_max_size: u32,
    pub queue_timeout: Duration,
    pub sheddable_timeout: Duration,
    pub full_when: FullWhen,
    /// Distinct tenant labels of the token counter per model.
    pub tenant_label_cap: usize,
    /// Token buckets kept per model.
    pub max_buckets: usize,
}

pub const DEFAULT_QUEUE_MAX_SIZE: u32 = 1_000;
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_SHEDDABLE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for AdmissionDefaults {
    fn default() -> Self {
        Self {
            queue_max_size: DEFAULT_QUEUE_MAX_SIZE,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            sheddable_timeout: DEFAULT_SHEDDABLE_TIMEOUT,
            full_when: DEFAULT_FULL_WHEN,
            tenant_label_cap: DEFAULT_TENANT_LABEL_CAP,
            max_buckets: DEFAULT_MAX_BUCKETS,
        }
    }
}

/// What one model's gate runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSettings {
    pub max_size: usize,
    pub timeout: Duration,
    /// At most `timeout`.
    pub sheddable_timeout: Duration,
    pub budget: Option<TokenBudget>,
    /// Read only when a tenant's lane is made in the queue.
    pub tenant_weights: TenantWeights,
}

impl Default for GateSettings {
    fn default() -> Self {
        AdmissionDefaults::default().settings(&ModelAdmission::default())
    }
}

impl GateSettings {
    /// How long a request of `priority` may wait.
    pub fn timeout_for(&self, priority: i32) -> Duration {
        if super::priority::is_sheddable(priority) {
            self.sheddable_timeout
        } else {
            self.timeout
        }
    }
}

impl AdmissionDefaults {
    /// A model's gate settings: its own values, else these.
    pub fn settings(&self, own: &ModelAdmission) -> GateSettings {
        let timeout = own.queue_timeout.unwrap_or(self.queue_timeout);
        GateSettings {
            max_size: own.queue_max_size.unwrap_or(self.queue_max_size) as usize,
            timeout,
            sheddable_timeout: own
                .queue_sheddable_timeout
                .unwrap_or(self.sheddable_timeout)
                .min(timeout),
            budget: own.budget(),
            tenant_weights: own.tenant_weights.clone(),
        }
    }

    /// The `config check` lines of a model: (label, text).
    pub fn describe(&self, own: &ModelAdmission) -> [(&'static str, String); 4] {
        let s = self.settings(own);
        let from = |own: bool| if own { "this model" } else { "proxy" };
        let fw = self.full_when;
        let mut signals = Vec::new();
        if let Some(n) = fw.waiting_above.0 {
            signals.push(format!("more than {n} waiting"));
        }
        if let Some(x) = fw.kv_usage_above.0 {
            signals.push(format!("KV cache above {x}"));
        }
        let engine = (!signals.is_empty()).then(|| {
            format!(
                "a fresh engine report with {} (proxy)",
                signals.join(" or ")
            )
        });
        let full = match (own.max_concurrency, engine) {
            (Some(n), Some(e)) => format!("{n} requests in flight (this model), or {e}"),
            (Some(n), None) => {
                format!("{n} requests in flight (this model); engine reports ignored (proxy)")
            }
            (None, Some(e)) => format!("{e}; no concurrency limit"),
            (None, None) => "never: no concurrency limit, engine reports ignored (proxy)".into(),
        };
        let queue = if s.max_size == 0 {
            format!(
                "none: a full model answers 429 queue_full at once ({})",
                from(own.queue_max_size.is_some())
            )
        } else {
            format!(
                "up to {} requests ({}), waiting {} ({}), sheddable {} ({})",
                s.max_size,
                from(own.queue_max_size.is_some()),
                secs(s.timeout),
                from(own.queue_timeout.is_some()),
                secs(s.sheddable_timeout),
                from(own.queue_sheddable_timeout.is_some()),
            )
        };
        let budget = match s.budget {
            Some(b) => format!(
                "{} tokens a minute per tenant, burst {} (this model; per proxy)",
                b.tokens_per_minute, b.burst
            ),
            None => "none".to_owned(),
        };
        let weights = if own.tenant_weights.is_empty() {
            "none: tenants take equal turns".to_owned()
        } else {
            format!(
                "{} turns per round (this model); other tenants 1",
                own.tenant_weights.describe()
            )
        };
        [
            ("pods full at", full),
            ("queue", queue),
            ("token budget", budget),
            ("tenant weights", weights),
        ]
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// `maxConcurrency`: a whole number from 1.
pub fn parse_max_concurrency(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "maxConcurrency {s:?} must be a whole number of requests from 1 (leave it out for no limit)"
        )),
    }
}

/// Largest `queue.maxSize` accepted.
pub const MAX_QUEUE_SIZE: u32 = 1_000_000;

/// `queue.maxSize`: 0 (no queue) to 1,000,000.
pub fn parse_queue_max_size(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= MAX_QUEUE_SIZE => Ok(n),
        _ => Err(format!(
            "queue size {s:?} must be a whole number from 0 (no queue) to {MAX_QUEUE_SIZE}"
        )),
    }
}

/// Longest queue timeout accepted.
pub const MAX_QUEUE_TIMEOUT: Duration = Duration::from_secs(3600);

/// `queue.timeout`, `queue.sheddableTimeout`: a duration above 0, at most an hour.
pub fn parse_queue_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() || d > MAX_QUEUE_TIMEOUT {
        return Err(format!(
            "queue timeout {s:?} must be above 0 and at most 1h (use a queue size of 0 for no queue)"
        ));
    }
    Ok(d)
}

/// `tokensPerMinute`, `tokenBurst`: a whole number of tokens from 1.
pub fn parse_tokens(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("token count {s:?} must be a whole number from 1")),
    }
}

/// A burst needs a rate.
pub fn check_budget(own: &ModelAdmission) -> Result<(), String> {
    if own.token_burst.is_some() && own.tokens_per_minute.is_none() {
        return Err("tokenBurst is set without tokensPerMinute".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_model_overrides_what_it_sets_and_sheddable_never_outwaits_the_queue() {
        let d = AdmissionDefaults::default();
        let s = d.settings(&ModelAdmission::default());
        assert_eq!(
            s,
            GateSettings {
                max_size: 1000,
                timeout: 30 * S,
                sheddable_timeout: 5 * S,
                budget: None,
                tenant_weights: TenantWeights::default(),
            }
        );
        assert_eq!((s.timeout_for(0), s.timeout_for(-1)), (30 * S, 5 * S));
        let own = ModelAdmission {
            queue_max_size: Some(0),
            queue_timeout: Some(2 * S),
            tokens_per_minute: Some(600),
            ..ModelAdmission::default()
        };
        let s = d.settings(&own);
        assert_eq!(
            (s.max_size, s.timeout, s.sheddable_timeout),
            (0, 2 * S, 2 * S)
        );
        assert_eq!(
            s.budget,
            Some(TokenBudget {
                tokens_per_minute: 600,
                burst: 600
            })
        );
        let own = ModelAdmission {
            tokens_per_minute: Some(600),
            token_burst: Some(50),
            ..own.clone()
        };
        assert_eq!(own.budget().unwrap().burst, 50);
    }

    #[test]
    fn parsers_table() {
        assert_eq!(parse_max_concurrency("4"), Ok(4));
        assert!(parse_max_concurrency("0").is_err());
        assert!(parse_max_concurrency("-1").is_err());
        assert!(parse_max_concurrency("two").is_err());
        assert_eq!(parse_queue_max_size("0"), Ok(0));
        assert_eq!(parse_queue_max_size("1000000"), Ok(1_000_000));
        assert!(parse_queue_max_size("1000001").is_err());
        assert_eq!(parse_queue_timeout("250ms"), Ok(S / 4));
        assert_eq!(parse_queue_timeout("30"), Ok(30 * S));
        for bad in ["0", "0s", "2h", "-1s", "soon"] {
            assert!(parse_queue_timeout(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_tokens("6000"), Ok(6000));
        assert!(parse_tokens("0").is_err() && parse_tokens("1.5").is_err());
        let burst_only = ModelAdmission {
            token_burst: Some(5),
            ..ModelAdmission::default()
        };
        assert!(check_budget(&burst_only).is_err());
        assert!(check_budget(&ModelAdmission::default()).is_ok());
    }

    #[test]
    fn describe_says_where_each_value_comes_from() {
        let d = AdmissionDefaults::default();
        let lines = d.describe(&ModelAdmission::default());
        assert_eq!(
            lines[0].1,
            "a fresh engine report with more than 0 waiting or KV cache above 0.95 (proxy); no concurrency limit"
        );
        assert_eq!(
            lines[1].1,
            "up to 1000 requests (proxy), waiting 30s (proxy), sheddable 5s (proxy)"
        );
        assert_eq!(lines[2].1, "none");
        assert_eq!(lines[3].1, "none: tenants take equal turns");
        let own = ModelAdmission {
            max_concurrency: Some(2),
            queue_max_size: Some(0),
            tokens_per_minute: Some(6000),
            token_burst: Some(12000),
            tenant_weights: TenantWeights::new([("tenant-b".into(), 2)]).unwrap(),
            ..ModelAdmission::default()
        };
        let lines = d.describe(&own);
        assert_eq!(
            lines[3].1,
            "tenant-b 2 turns per round (this model); other tenants 1"
        );
        assert_eq!(
            lines[0].1,
            "2 requests in flight (this model), or a fresh engine report with more than 0 waiting or KV cache above 0.95 (proxy)"
        );
        assert!(lines[1].1.starts_with("none: "), "{}", lines[1].1);
        assert_eq!(
            lines[2].1,
            "6000 tokens a minute per tenant, burst 12000 (this model; per proxy)"
        );
    }
}
