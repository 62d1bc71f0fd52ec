//! What every request shares: the published routing table, gauges, ledgers, metrics and the
//! upstream client; and the one place discovery updates turn into a new table.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::config::RoutingKnobs;
use crate::decide::{GroupOutcome, Outcome};
use crate::discovery::{ModelSet, Strategy, Update};
use crate::keys::KeySource;
use crate::load::reservations::ReservationLedger;
use crate::load::slots::SlotAllocator;
use crate::load::userspace::UserspaceGauge;
use crate::load::LoadGauge;
use crate::metrics::keys::sources_for;
use crate::metrics::Metrics;
use crate::proxy::upstream::Upstream;
use crate::table::RoutingTable;

/// Per-request bounds.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Largest request body buffered (413 past it).
    pub max_body_bytes: usize,
    /// Pods tried on connect failure before the Service.
    pub max_pod_attempts: usize,
}

pub struct Shared {
    pub table: ArcSwap<RoutingTable>,
    pub knobs: RoutingKnobs,
    pub metrics: Arc<Metrics>,
    /// The gauge least-loaded picks read (eBPF or userspace).
    pub pick_gauge: Arc<dyn LoadGauge>,
    /// This process's in-flight requests per pod (always kept).
    pub inflight: Arc<UserspaceGauge>,
    pub pod_ledger: Arc<ReservationLedger<SocketAddr>>,
    pub group_ledger: ReservationLedger<Arc<str>>,
    pub upstream: Upstream,
    pub limits: RequestLimits,
    /// Set once discovery delivered its first complete view.
    pub ready: AtomicBool,
    discovered: Mutex<(ModelSet, SlotAllocator)>,
}

impl Shared {
    pub fn new(
        knobs: RoutingKnobs,
        metrics: Arc<Metrics>,
        pick_gauge: Arc<dyn LoadGauge>,
        inflight: Arc<UserspaceGauge>,
        pod_ledger: Arc<ReservationLedger<SocketAddr>>,
        upstream: Upstream,
        limits: RequestLimits,
    ) -> Self {
        Self {
            table: ArcSwap::from_pointee(RoutingTable::default()),
            pod_ledger,
            group_ledger: ReservationLedger::new(knobs.reservation_ttl),
            knobs,
            metrics,
            pick_gauge,
            inflight,
            upstream,
            limits,
            ready: AtomicBool::new(false),
            discovered: Mutex::new((ModelSet::default(), SlotAllocator::default())),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Fold one discovery update in; rebuild and publish the table only on a real change.
    pub fn apply(&self, update: Update) {
        let is_reset = matches!(update, Update::Reset(_));
        let mut guard = self.discovered.lock().expect("discovery lock");
        let (set, slots) = &mut *guard;
        let changed = set.apply(update);
        if changed || (is_reset && !self.is_ready()) {
            let assigned = slots.sync(&RoutingTable::pod_addrs(set));
            self.pick_gauge.set_pods(&assigned);
            let table = RoutingTable::build(set, slots);
            self.touch_metrics(&table);
            let pods: usize = table.models().map(|m| m.pods.len()).sum();
            tracing::info!(models = set.len(), pods, "routing table updated");
            self.table.store(Arc::new(table));
        }
        if is_reset && !self.ready.swap(true, Ordering::AcqRel) {
            tracing::info!("discovery synced; ready");
        }
    }

    /// Per-model series exist from the start (so `rate()` and the spec's ratios work from zero),
    /// but only for label values that can occur: the key sources the model's strategy reports,
    /// both decision outcomes, its pods (and `service-dns` when it has a Service), the outcomes
    /// of each label group's mode. The ready endpoint count follows the table.
    fn touch_metrics(&self, table: &RoutingTable) {
        let m = &self.metrics;
        let now = Instant::now();
        m.ready_endpoints.reset();
        for model in table.models() {
            let name = &*model.name;
            let strategy = model.spec.routing;
            m.ready_endpoints
                .with_label_values(&[name])
                .set(model.pods.len() as i64);
            m.active_connections.with_label_values(&[name]);
            m.least_loaded_reservations_total.with_label_values(&[name]);
            m.least_loaded_reservations_expired_total
                .with_label_values(&[name]);
            m.request_duration_seconds.with_label_values(&[name]);
            m.time_to_first_byte_seconds.with_label_values(&[name]);
            // A keyless request of a default or prefix model with a Service always goes to the
            // Service; everything else can reach a pod, and anything falls back without pods.
            let keyless_to_service =
                model.service.is_some() && matches!(strategy, Strategy::Default | Strategy::Prefix);
            for &source in sources_for(strategy) {
                for outcome in [Outcome::Pod, Outcome::ServiceFallback] {
                    if source == KeySource::None && outcome == Outcome::Pod && keyless_to_service {
                        continue;
                    }
                    m.routing_decisions_total.with_label_values(&[
                        name,
                        strategy.as_str(),
                        source.as_str(),
                        outcome.as_str(),
                    ]);
                }
            }
            for pod in &model.pods {
                m.routing_target_hits_total.with_label_values(&[
                    name,
                    strategy.as_str(),
                    &pod.label,
                ]);
            }
            if model.service.is_some() {
                m.routing_target_hits_total.with_label_values(&[
                    name,
                    strategy.as_str(),
                    "service-dns",
                ]);
            }
            m.keys.touch(&model.name, strategy, now);
        }
        m.keys
            .retain(|name| table.models().any(|model| &*model.name == name));
        let mode = self.knobs.label_group_mode;
        for g in table.groups() {
            for outcome in [
                GroupOutcome::Mode(mode),
                GroupOutcome::PriorityPick,
                GroupOutcome::ColdStart,
            ] {
                m.label_group_route_decisions_total.with_label_values(&[
                    &g.label,
                    mode.as_str(),
                    outcome.as_str(),
                ]);
            }
            for member in &g.members {
                m.label_group_route_target_hits_total.with_label_values(&[
                    &g.label,
                    mode.as_str(),
                    &member.name,
                ]);
            }
        }
    }

    /// Count reservations that expired unconsumed (run every second or so).
    pub fn sweep_reservations(&self, now: Instant) {
        for (model, n) in self
            .pod_ledger
            .sweep(now)
            .into_iter()
            .chain(self.group_ledger.sweep(now))
        {
            self.metrics
                .least_loaded_reservations_expired_total
                .with_label_values(&[&model])
                .inc_by(n);
        }
    }
}
