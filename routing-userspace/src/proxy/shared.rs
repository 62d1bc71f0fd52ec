//! What every request of the proxy shares: the published routing table, the router, the
//! metrics, the upstream pools, the per-request bounds, the retry budget and the shutdown
//! state. Built once by `app` for `serve`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::retry_budget::RetryBudget;
use super::server::ServeOptions;
use super::stream::DrainCut;
use crate::admission::Admission;
use crate::discovery::Update;
use crate::load::userspace::UserspaceGauge;
use crate::metrics::Metrics;
use crate::router::Router;
use crate::signals::{scrape, Fleet, ScrapeTargets};
use crate::table::publish::Published;
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

impl RequestLimits {
    /// The defaults (each a `serve` flag).
    pub const DEFAULT: Self = Self {
        max_body_bytes: 32 * 1024 * 1024,
        max_header_bytes: ServeOptions::PROXY.max_head_bytes,
        max_json_depth: crate::body::DEFAULT_MAX_DEPTH,
        first_byte_timeout: Duration::from_secs(300),
        stream_idle_timeout: Duration::from_secs(60),
        request_timeout: Duration::ZERO,
    };
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

pub struct Shared {
    pub table: Published,
    pub router: Arc<Router>,
    /// Each model's (and label group's) admission gate.
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    /// This process's in-flight requests per pod (always kept, whichever gauge picks read).
    pub inflight: Arc<UserspaceGauge>,
    pub upstream: Upstream,
    pub limits: RequestLimits,
    pub retry_budget: RetryBudget,
    /// The pod answers retried on the next candidate (within the budget).
    pub retry_on: super::retry_on::RetryOn,
    /// Set when shutdown began: `/readyz` answers 503 from then on.
    draining: AtomicBool,
    /// Triggered when the drain timeout passes: streams still running end with an error event.
    pub drain_cut: Arc<DrainCut>,
    /// Ask engines for an in-band load report on each request.
    pub engine_load_reports: bool,
    /// The engine scraper's pods (`None`: no scraper).
    pub scrape_targets: Option<ScrapeTargets>,
    /// The fleet size the scraper spreads its reads by (one proxy until `app` sets it).
    pub fleet: Fleet,
    /// Starts request traces (`None`: tracing off).
    pub tracer: Option<Arc<crate::telemetry::Tracer>>,
}

impl Shared {
    pub fn new(
        router: Router,
        admission: Admission,
        metrics: Arc<Metrics>,
        inflight: Arc<UserspaceGauge>,
        upstream: Upstream,
        limits: RequestLimits,
        retry_budget: RetryBudget,
    ) -> Self {
        Self {
            table: Published::new(Arc::clone(&metrics), router.knobs().label_group_mode),
            router: Arc::new(router),
            admission,
            metrics,
            inflight,
            upstream,
            limits,
            retry_budget,
            retry_on: Default::default(),
            draining: AtomicBool::new(false),
            drain_cut: Arc::default(),
            engine_load_reports: false,
            scrape_targets: None,
            fleet: Fleet::new(0, 0, false, None),
            tracer: None,
        }
    }

    /// Discovery has synced and shutdown has not begun.
    pub fn is_ready(&self) -> bool {
        self.table.is_synced() && !self.is_draining()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Shutdown began: not ready from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Fold one discovery update in: a new table when something changed, which the router
    /// (gauge slots, health records, the cache-aware index) follows.
    pub fn apply(&self, update: Update) {
        self.table.apply(update, |pods, table| {
            self.router.pods_changed(pods);
            self.router.table_rebuilt(table);
            super::queue::gates_for(self, &self.router, table);
            if let Some(t) = &self.scrape_targets {
                t.set(scrape::targets_of(table, &self.metrics.engine));
            }
        });
    }
}
