//! What every request shares: the published routing table, the router, the metrics and the
//! upstream pools; and the one place discovery updates turn into a new table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::discovery::{ModelSet, Update};
use crate::load::slots::SlotAllocator;
use crate::load::userspace::UserspaceGauge;
use crate::metrics::Metrics;
use crate::router::Router;
use crate::table::RoutingTable;
use crate::upstream::Upstream;

/// Per-request bounds.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Largest request body read or streamed (413 past it).
    pub max_body_bytes: usize,
    /// Largest request head (431 past it).
    pub max_header_bytes: usize,
    /// Deepest JSON nesting parsed (400 past it).
    pub max_json_depth: u32,
    /// From a request sent to its response head (0: none).
    pub first_byte_timeout: Duration,
    /// Longest pause inside a response body (0: none).
    pub stream_idle_timeout: Duration,
    /// A whole request, body included (0: none).
    pub request_timeout: Duration,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            max_json_depth: crate::body::DEFAULT_MAX_DEPTH,
            first_byte_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::ZERO,
        }
    }
}

pub struct Shared {
    pub table: ArcSwap<RoutingTable>,
    pub router: Router,
    pub metrics: Arc<Metrics>,
    /// This process's in-flight requests per pod (always kept, whichever gauge picks read).
    pub inflight: Arc<UserspaceGauge>,
    pub upstream: Upstream,
    pub limits: RequestLimits,
    pub retry_budget: crate::proxy::retry_budget::RetryBudget,
    /// Set once discovery delivered its first complete view.
    pub ready: AtomicBool,
    /// Set when shutdown began: `/readyz` answers 503 from then on.
    pub draining: AtomicBool,
    /// Triggered when the drain timeout passes: streams still running end with an error event.
    pub drain_cut: Arc<crate::proxy::stream::DrainCut>,
    discovered: Mutex<(ModelSet, SlotAllocator)>,
}

impl Shared {
    pub fn new(
        router: Router,
        metrics: Arc<Metrics>,
        inflight: Arc<UserspaceGauge>,
        upstream: Upstream,
        limits: RequestLimits,
        retry_budget: crate::proxy::retry_budget::RetryBudget,
    ) -> Self {
        Self {
            retry_budget,
            draining: AtomicBool::new(false),
            drain_cut: Arc::default(),
            table: ArcSwap::from_pointee(RoutingTable::default()),
            router,
            metrics,
            inflight,
            upstream,
            limits,
            ready: AtomicBool::new(false),
            discovered: Mutex::new((ModelSet::default(), SlotAllocator::default())),
        }
    }

    /// Discovery has synced and shutdown has not begun.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Fold one discovery update in; rebuild and publish the table only on a real change.
    pub fn apply(&self, update: Update) {
        let is_reset = matches!(update, Update::Reset(_));
        let mut guard = self.discovered.lock().expect("discovery lock");
        let (set, slots) = &mut *guard;
        let changed = set.apply(update);
        if changed || (is_reset && !self.ready.load(Ordering::Acquire)) {
            let assigned = slots.sync(&RoutingTable::pod_addrs(set));
            self.router.pods_changed(&assigned);
            let table = RoutingTable::build(
                set,
                slots,
                &self.metrics,
                self.router.knobs().label_group_mode,
            );
            self.metrics.table_rebuilt(&table);
            self.router.table_rebuilt(&table);
            let pods: usize = table.models().map(|m| m.pods.len()).sum();
            tracing::info!(models = set.len(), pods, "routing table updated");
            self.table.store(Arc::new(table));
        }
        if is_reset && !self.ready.swap(true, Ordering::AcqRel) {
            tracing::info!("discovery synced; ready");
        }
    }
}
