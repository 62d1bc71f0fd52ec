//! A set of models into a routing table in one step: sync the pod slots, then build.
//!
//! The order matters and is easy to get wrong at a call site (a table built before the sync
//! gives new pods no slot, so they read as load 0), so the proxy's publisher, the replay, the
//! benches and the tests all go through here instead of repeating the two calls.

use std::net::SocketAddr;

use super::RoutingTable;
use crate::discovery::{ModelSet, ModelSpec, Update};
use crate::load::slots::SlotAllocator;
use crate::load::Slot;
use crate::metrics::Metrics;
use crate::vocab::LabelGroupMode;

impl RoutingTable {
    /// Syncs `slots` to every pod of `set` (known pods keep their slots, gone ones release
    /// theirs), then builds the table. Also returns the assignments, which per-pod state
    /// elsewhere (health, reservations) follows.
    pub fn rebuild(
        set: &ModelSet,
        slots: &mut SlotAllocator,
        metrics: &Metrics,
        group_mode: LabelGroupMode,
    ) -> (RoutingTable, Vec<(SocketAddr, Slot)>) {
        let assigned = slots.sync(&RoutingTable::pod_addrs(set));
        let table = RoutingTable::build(set, slots, metrics, group_mode);
        (table, assigned)
    }

    /// The table of `models` alone, as one discovery reset would report them, its pods given
    /// slots by a fresh allocator (returned, for a later [`RoutingTable::rebuild`]). What a
    /// replay, a bench or a test routes with.
    pub fn of_models(
        models: Vec<ModelSpec>,
        metrics: &Metrics,
        group_mode: LabelGroupMode,
    ) -> (RoutingTable, SlotAllocator) {
        let mut set = ModelSet::default();
        set.apply(Update::Reset(models));
        let mut slots = SlotAllocator::default();
        let (table, _) = RoutingTable::rebuild(&set, &mut slots, metrics, group_mode);
        (table, slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, ports: &[u16]) -> ModelSpec {
        let mut m = ModelSpec::new(name);
        m.endpoints = ports
            .iter()
            .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        m
    }

    #[test]
    fn every_pod_has_a_slot_and_a_rebuild_keeps_them() {
        let metrics = Metrics::new(10);
        let (table, mut slots) = RoutingTable::of_models(
            vec![spec("a", &[1, 2]), spec("b", &[2, 3])],
            &metrics,
            LabelGroupMode::RoundRobin,
        );
        let slot_of = |t: &RoutingTable, model: &str, port: u16| {
            t.models()
                .find(|m| &*m.name == model)
                .and_then(|m| m.pods.iter().find(|p| p.addr.port() == port))
                .and_then(|p| p.slot)
                .unwrap_or_else(|| panic!("{model} has no slotted pod on port {port}"))
        };
        // A pod shared by two models is one pod: one slot.
        assert_eq!(slot_of(&table, "a", 2), slot_of(&table, "b", 2));
        let kept = slot_of(&table, "b", 3);

        let mut set = ModelSet::default();
        set.apply(Update::Reset(vec![spec("b", &[3, 4])]));
        let (table, assigned) =
            RoutingTable::rebuild(&set, &mut slots, &metrics, LabelGroupMode::RoundRobin);
        assert_eq!(slot_of(&table, "b", 3), kept, "a known pod keeps its slot");
        slot_of(&table, "b", 4);
        assert!(table.models().all(|m| &*m.name != "a"), "a is gone");
        let ports: Vec<u16> = assigned.iter().map(|(a, _)| a.port()).collect();
        assert!(ports.contains(&4), "the new pod is assigned: {assigned:?}");
    }
}
