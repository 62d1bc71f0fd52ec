//! The `/debug/routing` view of admission: per model, the queue by band (depth, tenants, the
//! biggest tenants, the oldest wait) and the token budget's state. Labels only, never tokens.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantShare {
    pub tenant: String,
    pub depth: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BandSnapshot {
    pub priority: i32,
    pub depth: usize,
    pub tenants: usize,
    pub oldest_wait_ms: Option<u64>,
    /// The tenants with the most waiting requests (at most 10).
    pub top_tenants: Vec<TenantShare>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetSnapshot {
    pub tokens_per_minute: u64,
    pub burst: u64,
    /// Tenants whose bucket is not full (a full one is not kept).
    pub buckets: usize,
    /// Buckets dropped by the cap before they refilled.
    pub evicted: u64,
    /// Tenants with their own `tokens_charged_total` series.
    pub tenant_labels: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateView {
    pub model: String,
    pub queued: usize,
    /// Requests admitted here and not ended.
    pub admitted: usize,
    pub max_size: usize,
    pub timeout_ms: u64,
    pub sheddable_timeout_ms: u64,
    pub oldest_wait_ms: Option<u64>,
    /// Draining: nothing new is queued.
    pub closing: bool,
    /// Highest priority first.
    pub bands: Vec<BandSnapshot>,
    pub budget: Option<BudgetSnapshot>,
}
