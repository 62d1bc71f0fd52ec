//! The knobs the router decides with, validated: key bounds, the reservation TTL, the label
//! group mode, attempts per request, bounded-load hashing and the cache-aware index. The CLI's
//! raw text becomes these in `config::settings`; here they are plain values with their
//! defaults, declared once.

use std::time::Duration;

use crate::balance::bounded::HashBalance;
use crate::discovery::ModelSpec;
use crate::keys::KeyLimits;
use crate::vocab::{LabelGroupMode, Strategy};

/// Validated routing knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingKnobs {
    pub limits: KeyLimits,
    pub reservation_ttl: Duration,
    pub label_group_mode: LabelGroupMode,
    /// Pods a request tries before the Service (the pick and its alternates).
    pub max_pod_attempts: usize,
    /// Bounded-load hashing of the prefix and label-group rings, and the floor of all (models
    /// may override it).
    pub hash_balance: HashBalance,
    /// The bounded-load factor of cache-aware models, thousandths (0 = off); the floor is
    /// `hash_balance.floor`.
    pub cache_aware_factor_milli: u32,
    /// The bounded-load factor of session-affinity models, thousandths (0 = off); the floor
    /// is `hash_balance.floor`.
    pub session_factor_milli: u32,
    /// Memory budget of the cache-aware prefix index, in bytes.
    pub cache_aware_index_budget: usize,
    /// Longest a cache-aware request waits for another request's prefill of its prompt on its
    /// pod (see `router::teaching`); zero: never waits.
    pub cache_aware_prefill_wait: Duration,
    /// Whether routed responses carry `x-flexinfer-route`.
    pub route_header: bool,
}

impl RoutingKnobs {
    /// The defaults: the spec's (key bounds, a 10 s reservation TTL, round-robin label
    /// groups), then ours (see docs/routing-quality.md for the bound's factor and floor).
    pub const DEFAULT: Self = Self {
        limits: KeyLimits::DEFAULT,
        reservation_ttl: Duration::from_secs(10),
        label_group_mode: LabelGroupMode::RoundRobin,
        max_pod_attempts: 3,
        hash_balance: HashBalance {
            factor_milli: 1150,
            floor: 4,
        },
        cache_aware_factor_milli: 1600,
        session_factor_milli: 1500,
        cache_aware_index_budget: 16 << 20,
        cache_aware_prefill_wait: Duration::from_secs(30),
        route_header: false,
    };
}

impl RoutingKnobs {
    /// The hash-balance settings of a model: the proxy's, with the model's own overrides.
    /// Cache-aware and session-affinity models start from their own factors
    /// (`--cache-aware-balance-factor`, `--session-balance-factor`).
    pub fn balance_for(&self, spec: &ModelSpec) -> HashBalance {
        let own = |factor_milli| HashBalance {
            factor_milli,
            ..self.hash_balance
        };
        let base = match spec.routing {
            Strategy::CacheAware => own(self.cache_aware_factor_milli),
            Strategy::SessionAffinity => own(self.session_factor_milli),
            _ => self.hash_balance,
        };
        base.overridden(&spec.hash_balance)
    }
}

impl Default for RoutingKnobs {
    fn default() -> Self {
        Self::DEFAULT
    }
}
