//! The routing table: an immutable snapshot of every model, its pods and ring, the label groups,
//! and the metric handles of each, rebuilt whenever discovery changes and published with
//! `ArcSwap`. The request path does one atomic load and takes no lock; everything it needs
//! per model or pod (a ring, a `Host` header, a counter) was built here, once.

pub mod publish;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;

use crate::balance::priority::Member;
use crate::balance::ring::{Ring, DEFAULT_VNODES};
use crate::discovery::{ModelSet, ModelSpec};
use crate::keys::hash_key;
use crate::load::slots::SlotAllocator;
use crate::load::Slot;
use crate::metrics::handles::{GroupMetrics, ModelMetrics};
use crate::metrics::Metrics;
use crate::vocab::LabelGroupMode;

mod rebuild;

/// One ready pod of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub addr: SocketAddr,
    /// Its slot in the load gauges (`None` only past gauge capacity).
    pub slot: Option<Slot>,
    /// `ip:port`, the `target` metric label.
    pub label: Arc<str>,
    /// The `Host` header of requests to it.
    pub host: HeaderValue,
}

impl Pod {
    pub fn new(addr: SocketAddr, slot: Option<Slot>) -> Self {
        let label = addr.to_string();
        Self {
            addr,
            slot,
            host: HeaderValue::from_str(&label).expect("a socket address is a valid header"),
            label: Arc::from(label),
        }
    }
}

/// A model's Service fallback, parsed once: where to connect and what to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceTarget {
    /// The URL as configured (logs, `/debug/routing`).
    pub url: Arc<str>,
    /// `host:port` to connect to (resolved at connect time).
    pub authority: Arc<str>,
    /// The `Host` header of requests to it.
    pub host: HeaderValue,
    /// A path the URL carries, put in front of every request path (`None` for `/`).
    pub base_path: Option<Arc<str>>,
}

/// A Service URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service URL {url:?} is not a usable http:// URL: {why}")]
pub struct BadServiceUrl {
    pub url: String,
    pub why: String,
}

impl ServiceTarget {
    pub fn parse(url: &str) -> Result<Self, BadServiceUrl> {
        let bad = |why: &str| BadServiceUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("the scheme must be http"));
        }
        let auth = uri.authority().ok_or_else(|| bad("no host"))?;
        let authority = match auth.port_u16() {
            Some(_) => auth.as_str().to_owned(),
            None => format!("{}:80", auth.host()),
        };
        let path = uri.path().trim_end_matches('/');
        Ok(Self {
            url: Arc::from(url),
            host: HeaderValue::from_str(auth.as_str()).map_err(|e| bad(&e.to_string()))?,
            authority: Arc::from(authority),
            base_path: (!path.is_empty()).then(|| Arc::from(path)),
        })
    }
}

/// A model as the router sees it.
#[derive(Debug)]
pub struct ModelRoute {
    pub name: Arc<str>,
    /// Stable identity of the model across table rebuilds (member reservations use it).
    pub name_hash: u64,
    pub spec: ModelSpec,
    /// Ready pods, sorted by address; ring member `i` is `pods[i]`.
    pub pods: Vec<Pod>,
    pub ring: Ring,
    pub service: Option<ServiceTarget>,
    pub metrics: ModelMetrics,
    /// `(gauge slot, pod index)`, sorted by slot: the cache-aware index names pods by slot.
    slot_index: Vec<(Slot, usize)>,
    ticket: AtomicUsize,
}

impl ModelRoute {
    fn new(spec: ModelSpec, slots: &SlotAllocator, metrics: &Metrics, now: Instant) -> Self {
        let pods: Vec<Pod> = spec
            .endpoints
            .iter()
            .map(|&addr| Pod::new(addr, slots.get(&addr)))
            .collect();
        let labels: Vec<Arc<str>> = pods.iter().map(|p| Arc::clone(&p.label)).collect();
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let service = spec
            .service
            .as_deref()
            .and_then(|url| match ServiceTarget::parse(url) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(model = %name, error = %e, "ignoring the model's Service fallback");
                    None
                }
            });
        let mut slot_index: Vec<(Slot, usize)> = pods
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((p.slot?, i)))
            .collect();
        slot_index.sort_unstable();
        Self {
            slot_index,
            metrics: ModelMetrics::resolve(
                metrics,
                &name,
                spec.routing,
                &labels,
                service.is_some(),
                now,
            ),
            name_hash: hash_key(&name),
            ring: Ring::new(&labels, DEFAULT_VNODES),
            name,
            service,
            pods,
            spec,
            ticket: AtomicUsize::new(0),
        }
    }

    /// A round-robin ticket for this model.
    pub fn next_ticket(&self) -> usize {
        self.ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// The index of the pod in gauge slot `slot`, if it is one of this model's.
    pub fn pod_of_slot(&self, slot: Slot) -> Option<usize> {
        self.slot_index
            .binary_search_by_key(&slot, |&(s, _)| s)
            .ok()
            .map(|k| self.slot_index[k].1)
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
    pub metrics: GroupMetrics,
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
    /// Build from the current models; pods take the slots `slots` assigned them, and every
    /// metric handle a request can touch is resolved in `metrics`.
    pub fn build(
        set: &ModelSet,
        slots: &SlotAllocator,
        metrics: &Metrics,
        group_mode: LabelGroupMode,
    ) -> Self {
        let now = Instant::now();
        let models: BTreeMap<String, Arc<ModelRoute>> = set
            .models()
            .map(|m| {
                (
                    m.name.clone(),
                    Arc::new(ModelRoute::new(m.clone(), slots, metrics, now)),
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
                let group = LabelGroup {
                    label: Arc::from(label.as_str()),
                    ring: Ring::new(&names, DEFAULT_VNODES),
                    metrics: GroupMetrics::resolve(metrics, &label, group_mode, &names),
                    members,
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
