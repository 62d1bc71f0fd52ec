//! The routing table: an immutable snapshot of every model, its pods and ring, and the label
//! groups, rebuilt whenever discovery changes and published with `ArcSwap`. The request path
//! does one atomic load and takes no lock.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::balance::priority::Member;
use crate::balance::ring::{Ring, DEFAULT_VNODES};
use crate::discovery::{ModelSet, ModelSpec};
use crate::load::slots::SlotAllocator;
use crate::load::Slot;

/// One ready pod of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub addr: SocketAddr,
    /// Its slot in the load gauges (`None` only past gauge capacity).
    pub slot: Option<Slot>,
    /// `ip:port`, the `target` metric label.
    pub label: Arc<str>,
}

/// A model as the router sees it.
#[derive(Debug)]
pub struct ModelRoute {
    pub name: Arc<str>,
    pub spec: ModelSpec,
    /// Ready pods, sorted by address; ring member `i` is `pods[i]`.
    pub pods: Vec<Pod>,
    pub ring: Ring,
    pub service: Option<Arc<str>>,
    ticket: AtomicUsize,
}

impl ModelRoute {
    fn new(spec: ModelSpec, slots: &SlotAllocator, vnodes: u32) -> Self {
        let pods: Vec<Pod> = spec
            .endpoints
            .iter()
            .map(|&addr| Pod {
                addr,
                slot: slots.get(&addr),
                label: Arc::from(addr.to_string()),
            })
            .collect();
        let ids: Vec<&str> = pods.iter().map(|p| &*p.label).collect();
        Self {
            name: Arc::from(spec.name.as_str()),
            ring: Ring::new(&ids, vnodes),
            service: spec.service.as_deref().map(Arc::from),
            pods,
            spec,
            ticket: AtomicUsize::new(0),
        }
    }

    /// A round-robin ticket for this model.
    pub fn next_ticket(&self) -> usize {
        self.ticket.fetch_add(1, Ordering::Relaxed)
    }
}

impl Member for Arc<ModelRoute> {
    fn name(&self) -> &str {
        &self.name
    }
    fn priority(&self) -> i64 {
        self.spec.route_priority
    }
    fn ready(&self) -> bool {
        self.spec.ready
    }
}

/// Several models sharing one service label.
#[derive(Debug)]
pub struct LabelGroup {
    pub label: Arc<str>,
    /// Members sorted by name; ring member `i` is `members[i]`.
    pub members: Vec<Arc<ModelRoute>>,
    pub ring: Ring,
    ticket: AtomicUsize,
}

impl LabelGroup {
    pub fn next_ticket(&self) -> usize {
        self.ticket.fetch_add(1, Ordering::Relaxed)
    }
}

/// What a requested model name resolves to.
#[derive(Debug, Clone)]
pub enum Route {
    Model(Arc<ModelRoute>),
    Group(Arc<LabelGroup>),
}

#[derive(Debug, Default)]
pub struct RoutingTable {
    models: BTreeMap<String, Arc<ModelRoute>>,
    groups: HashMap<String, Arc<LabelGroup>>,
}

impl RoutingTable {
    /// Build from the current models; pods take the slots `slots` assigned them.
    pub fn build(set: &ModelSet, slots: &SlotAllocator) -> Self {
        Self::build_with_vnodes(set, slots, DEFAULT_VNODES)
    }

    pub fn build_with_vnodes(set: &ModelSet, slots: &SlotAllocator, vnodes: u32) -> Self {
        let models: BTreeMap<String, Arc<ModelRoute>> = set
            .models()
            .map(|m| {
                (
                    m.name.clone(),
                    Arc::new(ModelRoute::new(m.clone(), slots, vnodes)),
                )
            })
            .collect();
        let mut by_label: BTreeMap<String, Vec<Arc<ModelRoute>>> = BTreeMap::new();
        for m in models.values() {
            if let Some(label) = &m.spec.service_label {
                by_label
                    .entry(label.clone())
                    .or_default()
                    .push(Arc::clone(m));
            }
        }
        let groups = by_label
            .into_iter()
            .map(|(label, members)| {
                let names: Vec<&str> = members.iter().map(|m| &*m.name).collect();
                let ring = Ring::new(&names, vnodes);
                let group = LabelGroup {
                    label: Arc::from(label.as_str()),
                    members,
                    ring,
                    ticket: AtomicUsize::new(0),
                };
                (label, Arc::new(group))
            })
            .collect();
        Self { models, groups }
    }

    /// A model by exact name first, then a label group.
    pub fn lookup(&self, name: &str) -> Option<Route> {
        if let Some(m) = self.models.get(name) {
            return Some(Route::Model(Arc::clone(m)));
        }
        self.groups.get(name).map(|g| Route::Group(Arc::clone(g)))
    }

    /// The route used when a request names no model and exactly one model is configured.
    pub fn only_model(&self) -> Option<Route> {
        if self.models.len() == 1 {
            return self
                .models
                .values()
                .next()
                .map(|m| Route::Model(Arc::clone(m)));
        }
        None
    }

    pub fn models(&self) -> impl Iterator<Item = &Arc<ModelRoute>> {
        self.models.values()
    }

    pub fn groups(&self) -> impl Iterator<Item = &Arc<LabelGroup>> {
        self.groups.values()
    }

    /// Every pod address of every model (for slot assignment).
    pub fn pod_addrs(set: &ModelSet) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = set
            .models()
            .flat_map(|m| m.endpoints.iter().copied())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}
