//! Publishing the routing table: discovery updates folded into the set of models, a new table
//! built and swapped in whole only when something really changed.
//!
//! Readers (every request) do one atomic load of the current snapshot and take no lock; the
//! writer (the discovery task) takes a mutex only to fold an update in. Whoever must follow the
//! pods (the load gauge, passive health, the cache-aware index) hears of each new table from
//! the `on_rebuild` callback, so this module depends on nothing above the table.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};

use super::RoutingTable;
use crate::discovery::{ModelSet, Update};
use crate::load::slots::SlotAllocator;
use crate::load::Slot;
use crate::metrics::Metrics;
use crate::vocab::LabelGroupMode;

/// The published table and what it is built from.
pub struct Published {
    table: ArcSwap<RoutingTable>,
    /// Set once discovery delivered its first complete view.
    synced: AtomicBool,
    discovered: Mutex<(ModelSet, SlotAllocator)>,
    metrics: Arc<Metrics>,
    label_group_mode: LabelGroupMode,
}

impl Published {
    /// An empty table, not synced yet; tables are built with `metrics`' handles and the label
    /// groups' `label_group_mode`.
    pub fn new(metrics: Arc<Metrics>, label_group_mode: LabelGroupMode) -> Self {
        Self {
            table: ArcSwap::from_pointee(RoutingTable::default()),
            synced: AtomicBool::new(false),
            discovered: Mutex::new((ModelSet::default(), SlotAllocator::default())),
            metrics,
            label_group_mode,
        }
    }

    /// The current table (a cheap guard for one request).
    pub fn load(&self) -> Guard<Arc<RoutingTable>> {
        self.table.load()
    }

    /// The current table, owned.
    pub fn load_full(&self) -> Arc<RoutingTable> {
        self.table.load_full()
    }

    /// Whether discovery has delivered its first complete view.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Fold one discovery update in; rebuild and publish the table only on a real change.
    /// `on_rebuild` hears the pods and their gauge slots, then the new table, before it is
    /// published.
    pub fn apply(
        &self,
        update: Update,
        on_rebuild: impl FnOnce(&[(SocketAddr, Slot)], &RoutingTable),
    ) {
        let is_reset = matches!(update, Update::Reset(_));
        let mut guard = crate::lock::lock(&self.discovered);
        let (set, slots) = &mut *guard;
        let changed = set.apply(update);
        if changed || (is_reset && !self.is_synced()) {
            let (table, assigned) =
                RoutingTable::rebuild(set, slots, &self.metrics, self.label_group_mode);
            self.metrics
                .table_rebuilt(table.models().map(|m| (&*m.name, m.pods.len())));
            on_rebuild(&assigned, &table);
            let pods: usize = table.models().map(|m| m.pods.len()).sum();
            tracing::info!(models = set.len(), pods, "routing table updated");
            self.table.store(Arc::new(table));
        }
        if is_reset && !self.synced.swap(true, Ordering::AcqRel) {
            tracing::info!("discovery synced; ready");
        }
    }
}
