//! Folds the watch streams (Models, Services, EndpointSlices, InferencePools, Pods) into
//! [`Update`]s.
//!
//! Each stream feeds a cache that swaps in a relist only when the relist is complete (kube's
//! `Init .. InitDone`), so a broken watch never shows the router an empty or partial table. After
//! every change the desired specs of all Models are recomputed and diffed against what was last
//! emitted: only the Models that really changed produce an Upsert or Remove. Recomputing is
//! O(models) per event, plus O(pods of the namespace) per Model that names an InferencePool,
//! which is cheap at the scale of Models in a cluster and keeps cross-object rules (Service
//! overrides, pool selectors, name collisions across namespaces) trivially right; Service,
//! EndpointSlice, pool and Pod events that no Model depends on skip it.
//!
//! Pods are watched only while some Model names a pool ([`Discovery::wants_pods`]); the runner
//! starts and stops that watch.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::crd::Model;
use super::pods::PodInfo;
use super::pool::InferencePool;
use super::translate::{
    model_settings, model_spec, parse_pool_ref, translate, PodSource, SLICE_SERVICE_LABEL,
};
use crate::discovery::{ModelSpec, Update};

/// `(namespace, name)`; for EndpointSlices the name is `<service>/<slice>` so that one range
/// query finds all slices of a Service.
type Key = (String, String);

/// One event from one of the watchers.
// One short-lived value per watch event; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Ev {
    Model(Event<Model>),
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
    Pool(Event<InferencePool>),
    Pod(Event<PodInfo>),
    /// The API server does not serve InferencePools (the GIE CRD is not installed): there are
    /// no pools, which is a complete list.
    PoolsAbsent,
}

/// The objects of one kind, with a relist buffered aside until it completes.
struct Cache<K> {
    live: BTreeMap<Key, K>,
    relist: Option<BTreeMap<Key, K>>,
    synced: bool,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

/// What one event did to a cache.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Nothing visible yet (a relist in progress).
    Nothing,
    /// A relist completed and replaced the cache.
    Relisted,
    /// One object changed; the key of the object.
    Changed(Option<Key>),
}

/// What one event means for the Models.
#[derive(Debug, PartialEq, Eq)]
enum Effect {
    Nothing,
    Relisted,
    /// An object changed; `matters` is false when no Model depends on it.
    Changed {
        matters: bool,
    },
}

impl<K> Cache<K> {
    fn apply(&mut self, event: Event<K>, key: impl Fn(&K) -> Option<Key>) -> Step {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                Step::Nothing
            }
            Event::InitApply(obj) => {
                if let Some(k) = key(&obj) {
                    self.relist.get_or_insert_with(BTreeMap::new).insert(k, obj);
                }
                Step::Nothing
            }
            Event::InitDone => {
                self.live = self.relist.take().unwrap_or_default();
                self.synced = true;
                Step::Relisted
            }
            Event::Apply(obj) => match key(&obj) {
                Some(k) => {
                    self.live.insert(k.clone(), obj);
                    Step::Changed(Some(k))
                }
                None => Step::Nothing,
            },
            Event::Delete(obj) => match key(&obj) {
                Some(k) => {
                    self.live.remove(&k);
                    Step::Changed(Some(k))
                }
                None => Step::Nothing,
            },
        }
    }

    /// The kind does not exist: an empty, complete list.
    fn absent(&mut self) -> Step {
        let was = (self.synced, self.live.is_empty());
        self.live.clear();
        self.relist = None;
        self.synced = true;
        if was == (true, true) {
            Step::Nothing
        } else {
            Step::Relisted
        }
    }

    /// The objects of namespace `ns`.
    fn in_namespace<'a>(&'a self, ns: &'a str) -> impl Iterator<Item = (&'a Key, &'a K)> + 'a {
        self.live
            .range((ns.to_owned(), String::new())..)
            .take_while(move |((n, _), _)| n == ns)
    }
}

fn object_key<K: Resource>(obj: &K) -> Option<Key> {
    Some((
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone()?,
    ))
}

fn slice_key(slice: &EndpointSlice) -> Option<Key> {
    let service = slice.labels().get(SLICE_SERVICE_LABEL)?;
    Some((
        slice.namespace().unwrap_or_default(),
        format!("{service}/{}", slice.metadata.name.as_deref()?),
    ))
}

fn pod_key(pod: &PodInfo) -> Option<Key> {
    Some((pod.namespace.clone(), pod.name.clone())).filter(|(_, n)| !n.is_empty())
}

/// Cached objects do not need their (large) managed-fields bookkeeping.
pub fn slim<K: Resource>(mut event: Event<K>) -> Event<K> {
    if let Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) = &mut event {
        o.meta_mut().managed_fields = None;
    }
    event
}

/// The tail of every warning about a Model that gets no pods from its pool.
const NO_PODS: &str = "the Model has no pods and its requests go to its Service";

/// The discovery state: the caches and what was last emitted.
pub struct Discovery {
    label_key: String,
    /// `--inference-pools`: watch InferencePools (and, when Models name them, Pods).
    pools_enabled: bool,
    models: Cache<Model>,
    services: Cache<Service>,
    slices: Cache<EndpointSlice>,
    pools: Cache<InferencePool>,
    pods: Cache<PodInfo>,
    /// The API server answered 404 for InferencePools (no GIE CRD).
    pools_absent: bool,
    /// Some Model names a pool (kept up to date on Model events).
    wants_pods: bool,
    /// Why each pool-Model (by namespace and name) has no pods, as last logged.
    pool_notes: BTreeMap<Key, String>,
    /// None until the first Reset went out.
    emitted: Option<BTreeMap<String, ModelSpec>>,
}

impl Discovery {
    pub fn new(service_label_key: impl Into<String>, inference_pools: bool) -> Self {
        // Without pool discovery there are no pools: a complete list from the start.
        let pools = Cache {
            synced: !inference_pools,
            ..Cache::default()
        };
        Self {
            label_key: service_label_key.into(),
            pools_enabled: inference_pools,
            models: Cache::default(),
            services: Cache::default(),
            slices: Cache::default(),
            pools,
            pods: Cache::default(),
            pools_absent: false,
            wants_pods: false,
            pool_notes: BTreeMap::new(),
            emitted: None,
        }
    }

    /// True once every watcher completed its first list and the first Reset went out.
    pub fn is_synced(&self) -> bool {
        self.emitted.is_some()
    }

    /// True while pool discovery is on and some Model names an InferencePool: the Pods of the
    /// watched namespaces must be watched.
    pub fn wants_pods(&self) -> bool {
        self.wants_pods
    }

    /// The Pod watch stopped (no Model names a pool any more): forget the pods.
    pub fn stop_pods(&mut self) {
        self.pods = Cache::default();
    }

    /// Folds one event in and returns the updates it causes (often none).
    pub fn handle(&mut self, ev: Ev) -> Vec<Update> {
        let effect = self.apply(ev);
        if !self.lists_done() {
            return Vec::new();
        }
        match effect {
            Effect::Nothing => Vec::new(),
            Effect::Changed { matters: false } if self.emitted.is_some() => Vec::new(),
            Effect::Changed { .. } => self.reconcile(false),
            Effect::Relisted => self.reconcile(true),
        }
    }

    /// Every list the table depends on is complete. Pods count only before the first Reset: a
    /// Model that starts naming a pool later has no pods until they are listed, rather than
    /// holding every other Model's updates back.
    fn lists_done(&self) -> bool {
        self.models.synced
            && self.services.synced
            && self.slices.synced
            && self.pools.synced
            && (self.pods.synced || !self.wants_pods || self.emitted.is_some())
    }

    fn apply(&mut self, ev: Ev) -> Effect {
        match ev {
            Ev::Model(e) => {
                let e = slim(e);
                if let Event::Apply(m) | Event::InitApply(m) = &e {
                    self.warn_about(m);
                }
                let step = self.models.apply(e, object_key);
                self.wants_pods = self.pools_enabled
                    && self
                        .models
                        .live
                        .values()
                        .any(|m| matches!(parse_pool_ref(&m.spec).0, PodSource::Pool(_)));
                // A Model event affects that Model whatever it depends on.
                effect(step, |_| true)
            }
            Ev::Service(e) => {
                let step = self.services.apply(slim(e), object_key);
                effect(step, |(ns, svc)| self.references(ns, svc))
            }
            Ev::Slice(e) => {
                let step = self.slices.apply(slim(e), slice_key);
                effect(step, |(ns, k)| {
                    self.references(ns, k.split_once('/').map_or(k.as_str(), |(s, _)| s))
                })
            }
            Ev::Pool(e) => {
                if matches!(e, Event::InitDone) {
                    self.pools_absent = false;
                }
                let step = self.pools.apply(slim(e), object_key);
                effect(step, |(ns, pool)| self.names_pool(ns, pool))
            }
            Ev::Pod(e) => self.apply_pod(e),
            Ev::PoolsAbsent => {
                if !self.pools_absent {
                    info!("the API server does not serve InferencePools (inferencepools.inference.networking.k8s.io/v1 is not installed); Models that name a pool have no pods until it is");
                }
                self.pools_absent = true;
                effect(self.pools.absent(), |_| true)
            }
        }
    }

    /// A Pod event matters when a pool some Model names selects the pod before or after it.
    fn apply_pod(&mut self, e: Event<PodInfo>) -> Effect {
        let matters = match &e {
            Event::Apply(p) | Event::Delete(p) => {
                let before = pod_key(p).and_then(|k| self.pods.live.get(&k));
                before.is_some_and(|old| self.pod_matters(old)) || self.pod_matters(p)
            }
            _ => false,
        };
        effect(self.pods.apply(e, pod_key), |_| matters)
    }

    fn warn_about(&self, m: &Model) {
        let (_, warnings) = model_settings(m, &self.label_key);
        let (ns, name) = (m.namespace().unwrap_or_default(), m.name_any());
        for w in warnings {
            warn!(namespace = %ns, model = %name, "{w}");
        }
        if let Some(((other, _), _)) = self
            .models
            .live
            .iter()
            .find(|((n, k), _)| k == &name && n != &ns)
        {
            warn!(
                model = %name, namespace = %ns, other_namespace = %other,
                "a Model of this name exists in two namespaces; the alphabetically first namespace wins"
            );
        }
    }

    /// Does any Model in `ns` use Service `svc`?
    fn references(&self, ns: &str, svc: &str) -> bool {
        self.models
            .in_namespace(ns)
            .any(|(_, m)| model_settings(m, &self.label_key).0.service_name == svc)
    }

    /// The pools the Models of `ns` name.
    fn named_pools<'a>(&'a self, ns: &'a str) -> impl Iterator<Item = String> + 'a {
        self.models
            .in_namespace(ns)
            .filter_map(|(_, m)| match parse_pool_ref(&m.spec).0 {
                PodSource::Pool(p) => Some(p),
                _ => None,
            })
    }

    /// Does any Model in `ns` name pool `pool`?
    fn names_pool(&self, ns: &str, pool: &str) -> bool {
        self.named_pools(ns).any(|p| p == pool)
    }

    /// Is `pod` selected by a pool that a Model of its namespace names?
    fn pod_matters(&self, pod: &PodInfo) -> bool {
        self.named_pools(&pod.namespace).any(|p| {
            self.pools
                .live
                .get(&(pod.namespace.clone(), p))
                .is_some_and(|pool| pool.selects(pod))
        })
    }

    /// The spec of every Model as the caches say now.
    pub fn desired(&self) -> BTreeMap<String, ModelSpec> {
        self.resolve().0
    }

    /// The spec of every Model, and why each Model that names a pool has no pods, where a
    /// pool problem is the reason.
    fn resolve(&self) -> (BTreeMap<String, ModelSpec>, BTreeMap<Key, String>) {
        let mut out = BTreeMap::new();
        let mut notes = BTreeMap::new();
        for ((ns, name), m) in &self.models.live {
            if out.contains_key(name) {
                continue;
            }
            let (settings, _) = model_settings(m, &self.label_key);
            let service = self
                .services
                .live
                .get(&(ns.clone(), settings.service_name.clone()));
            let spec = match &settings.pods {
                PodSource::Slices => {
                    let prefix = format!("{}/", settings.service_name);
                    let slices = self
                        .slices
                        .live
                        .range((ns.clone(), prefix.clone())..)
                        .take_while(|((n, k), _)| n == ns && k.starts_with(&prefix))
                        .map(|(_, s)| s);
                    translate(m, &settings, service, slices)
                }
                PodSource::Unusable => model_spec(m, &settings, service, Vec::new()),
                PodSource::Pool(pool) => {
                    let (endpoints, note) = self.pool_endpoints(ns, pool);
                    if let Some(n) = note {
                        notes.insert((ns.clone(), name.clone()), n);
                    }
                    model_spec(m, &settings, service, endpoints)
                }
            };
            out.insert(name.clone(), spec);
        }
        (out, notes)
    }

    /// The endpoints of pool `ns/pool`, or none and why.
    fn pool_endpoints(&self, ns: &str, pool: &str) -> (Vec<SocketAddr>, Option<String>) {
        let none = |why: String| (Vec::new(), Some(format!("{why}; {NO_PODS}")));
        if !self.pools_enabled {
            return none(format!(
                "InferencePool {ns}/{pool} is not watched: InferencePool discovery is off (--inference-pools false)"
            ));
        }
        if self.pools_absent {
            return none(format!(
                "InferencePool {ns}/{pool} cannot exist: the API server does not serve InferencePools"
            ));
        }
        let Some(p) = self.pools.live.get(&(ns.to_owned(), pool.to_owned())) else {
            return none(format!("InferencePool {ns}/{pool} does not exist"));
        };
        match p.endpoints(self.pods.in_namespace(ns).map(|(_, pod)| pod)) {
            Ok(endpoints) => (endpoints, None),
            Err(why) => none(format!("InferencePool {ns}/{pool} is refused: {why}")),
        }
    }

    /// Logs each pool problem once, when it appears or changes.
    fn log_pool_notes(&mut self, notes: BTreeMap<Key, String>) {
        for ((ns, model), note) in &notes {
            if self.pool_notes.get(&(ns.clone(), model.clone())) != Some(note) {
                warn!(namespace = %ns, model = %model, "{note}");
            }
        }
        self.pool_notes = notes;
    }

    fn reconcile(&mut self, relisted: bool) -> Vec<Update> {
        let (desired, notes) = self.resolve();
        self.log_pool_notes(notes);
        let Some(prev) = &self.emitted else {
            info!(models = desired.len(), "kubernetes discovery synced");
            let reset = Update::Reset(desired.values().cloned().collect());
            self.emitted = Some(desired);
            return vec![reset];
        };
        if *prev == desired {
            return Vec::new();
        }
        let updates = if relisted {
            // After a relist, say the whole (complete) state once.
            info!(
                models = desired.len(),
                "kubernetes discovery relisted with changes"
            );
            vec![Update::Reset(desired.values().cloned().collect())]
        } else {
            let mut updates: Vec<Update> = prev
                .keys()
                .filter(|k| !desired.contains_key(*k))
                .map(|k| Update::Remove(k.clone()))
                .collect();
            updates.extend(
                desired
                    .iter()
                    .filter(|(k, v)| prev.get(*k) != Some(*v))
                    .map(|(_, v)| Update::Upsert(v.clone())),
            );
            updates
        };
        for u in &updates {
            debug!(update = ?u, "kubernetes discovery update");
        }
        self.emitted = Some(desired);
        updates
    }
}

/// A cache step as an effect; `matters` says whether the changed object is one a Model uses.
fn effect(step: Step, matters: impl FnOnce(&Key) -> bool) -> Effect {
    match step {
        Step::Nothing => Effect::Nothing,
        Step::Relisted => Effect::Relisted,
        Step::Changed(None) => Effect::Changed { matters: true },
        Step::Changed(Some(k)) => Effect::Changed {
            matters: matters(&k),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Strategy;
    use serde_json::json;

    fn model(name: &str, ready: bool) -> Model {
        serde_json::from_value(json!({
            "apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
            "metadata": {"name": name, "namespace": "ns", "annotations": {"flexinfer.ai/routing": "prefix"}},
            "spec": {"backend": "vllm", "source": "hf://x"},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn service(name: &str) -> Service {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8000}]}}))
        .unwrap()
    }

    fn slice(svc: &str, name: &str, ips: &[(&str, bool)]) -> EndpointSlice {
        let eps: Vec<_> = ips
            .iter()
            .map(|(ip, r)| json!({"addresses": [ip], "conditions": {"ready": r}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {SLICE_SERVICE_LABEL: svc}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}], "endpoints": eps
        }))
        .unwrap()
    }

    fn synced(
        d: &mut Discovery,
        models: Vec<Model>,
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
    ) -> Vec<Update> {
        let mut out = Vec::new();
        out.extend(d.handle(Ev::Model(Event::Init)));
        for m in models {
            out.extend(d.handle(Ev::Model(Event::InitApply(m))));
        }
        out.extend(d.handle(Ev::Model(Event::InitDone)));
        out.extend(d.handle(Ev::Service(Event::Init)));
        for s in services {
            out.extend(d.handle(Ev::Service(Event::InitApply(s))));
        }
        out.extend(d.handle(Ev::Service(Event::InitDone)));
        assert!(out.is_empty(), "nothing before all three lists: {out:?}");
        out.extend(d.handle(Ev::Slice(Event::Init)));
        for s in slices {
            out.extend(d.handle(Ev::Slice(Event::InitApply(s))));
        }
        out.extend(d.handle(Ev::Slice(Event::InitDone)));
        out
    }

    #[test]
    fn first_reset_waits_for_all_three_lists() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        let out = synced(
            &mut d,
            vec![model("a", true)],
            vec![service("a")],
            vec![slice("a", "a-1", &[("10.0.0.1", true)])],
        );
        assert!(d.is_synced());
        let [Update::Reset(list)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].routing, Strategy::Prefix);
        assert_eq!(list[0].endpoints, vec!["10.0.0.1:8000".parse().unwrap()]);
    }

    #[test]
    fn an_empty_cluster_still_syncs() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        assert_eq!(
            synced(&mut d, vec![], vec![], vec![]),
            vec![Update::Reset(vec![])]
        );
    }

    #[test]
    fn changes_are_per_model_and_unrelated_objects_are_quiet() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        synced(
            &mut d,
            vec![model("a", true), model("b", true)],
            vec![service("a"), service("b")],
            vec![],
        );
        let out = d.handle(Ev::Slice(Event::Apply(slice(
            "a",
            "a-1",
            &[("10.0.0.1", true), ("10.0.0.2", false)],
        ))));
        let [Update::Upsert(a)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((a.name.as_str(), a.endpoints.len()), ("a", 1));
        // Objects no Model uses change nothing.
        assert!(d
            .handle(Ev::Service(Event::Apply(service("unrelated"))))
            .is_empty());
        assert!(d
            .handle(Ev::Slice(Event::Apply(slice(
                "unrelated",
                "u-1",
                &[("10.9.9.9", true)]
            ))))
            .is_empty());
        // Same object again: no change, no update.
        assert!(d
            .handle(Ev::Slice(Event::Apply(slice(
                "a",
                "a-1",
                &[("10.0.0.1", true)]
            ))))
            .is_empty());
        assert_eq!(
            d.handle(Ev::Model(Event::Delete(model("b", true)))),
            vec![Update::Remove("b".into())]
        );
    }

    #[test]
    fn a_relist_swaps_in_whole_and_resets_only_on_change() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        synced(
            &mut d,
            vec![model("a", true)],
            vec![service("a")],
            vec![slice("a", "a-1", &[("10.0.0.1", true)])],
        );
        // A relist that finds the same objects says nothing, and no partial state leaks mid-relist.
        assert!(d.handle(Ev::Model(Event::Init)).is_empty());
        assert_eq!(d.desired().len(), 1, "the old table stays while relisting");
        assert!(d
            .handle(Ev::Model(Event::InitApply(model("a", true))))
            .is_empty());
        assert!(d.handle(Ev::Model(Event::InitDone)).is_empty());
        // A relist that finds a change resets once, with the full state.
        d.handle(Ev::Slice(Event::Init));
        d.handle(Ev::Slice(Event::InitApply(slice(
            "a",
            "a-1",
            &[("10.0.0.1", true), ("10.0.0.3", true)],
        ))));
        let out = d.handle(Ev::Slice(Event::InitDone));
        let [Update::Reset(list)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(list[0].endpoints.len(), 2);
    }

    #[test]
    fn duplicate_names_pick_the_first_namespace() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        let mut other = model("a", false);
        other.metadata.namespace = Some("aaa".into());
        let out = synced(&mut d, vec![model("a", true), other], vec![], vec![]);
        let [Update::Reset(list)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((list.len(), list[0].ready), (1, false));
    }

    fn pool_model(name: &str, pool: &str) -> Model {
        let mut m = model(name, true);
        m.spec.inference_pool_ref = Some(json!({"name": pool}));
        m
    }

    fn pool(name: &str, app: &str) -> InferencePool {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": app}}, "targetPorts": [{"number": 8000}]}
        }))
        .unwrap()
    }

    fn pod(name: &str, app: &str, ip: &str, ready: bool) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            labels: [("app".to_owned(), app.to_owned())].into(),
            ip: ip.parse().ok(),
            ready,
            terminating: false,
        }
    }

    fn list<K>(d: &mut Discovery, wrap: fn(Event<K>) -> Ev, items: Vec<K>) -> Vec<Update> {
        let mut out = d.handle(wrap(Event::Init));
        for i in items {
            out.extend(d.handle(wrap(Event::InitApply(i))));
        }
        out.extend(d.handle(wrap(Event::InitDone)));
        out
    }

    #[test]
    fn with_pools_the_first_reset_waits_for_pools_and_for_pods_a_model_needs() {
        let mut d = Discovery::new("flexinfer.ai/service", true);
        assert!(synced(
            &mut d,
            vec![pool_model("m", "p")],
            vec![service("m")],
            vec![]
        )
        .is_empty());
        assert!(d.wants_pods());
        assert!(list(&mut d, Ev::Pool, vec![pool("p", "vllm")]).is_empty());
        let out = list(
            &mut d,
            Ev::Pod,
            vec![
                pod("a", "vllm", "10.0.0.1", true),
                pod("b", "other", "10.0.0.2", true),
            ],
        );
        let [Update::Reset(models)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(models[0].endpoints, vec!["10.0.0.1:8000".parse().unwrap()]);
        assert_eq!(
            models[0].service.as_deref(),
            Some("http://m.ns.svc.cluster.local:80")
        );
    }

    #[test]
    fn no_model_naming_a_pool_needs_no_pods_and_a_missing_crd_is_no_pools() {
        let mut d = Discovery::new("flexinfer.ai/service", true);
        assert!(synced(&mut d, vec![model("a", true)], vec![], vec![]).is_empty());
        assert!(!d.wants_pods());
        assert_eq!(
            d.handle(Ev::PoolsAbsent),
            vec![Update::Reset(d.desired().into_values().collect())]
        );
        // The watcher retries the list; another 404 changes nothing.
        assert!(d.handle(Ev::PoolsAbsent).is_empty());
        // A Model naming a pool then has no pods, and Pods are wanted (the CRD may come later).
        let out = d.handle(Ev::Model(Event::Apply(pool_model("b", "p"))));
        let [Update::Upsert(b)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert!(b.endpoints.is_empty());
        assert!(d.wants_pods());
    }

    #[test]
    fn pod_events_only_matter_for_selected_pods() {
        let mut d = Discovery::new("flexinfer.ai/service", true);
        synced(&mut d, vec![pool_model("m", "p")], vec![], vec![]);
        list(
            &mut d,
            Ev::Pool,
            vec![pool("p", "vllm"), pool("unused", "other")],
        );
        list(&mut d, Ev::Pod, vec![]);
        assert!(d.is_synced());
        // A pod no named pool selects (here: one only an unused pool selects) is quiet.
        assert!(d
            .handle(Ev::Pod(Event::Apply(pod("x", "other", "10.0.0.9", true))))
            .is_empty());
        let out = d.handle(Ev::Pod(Event::Apply(pod("a", "vllm", "10.0.0.1", true))));
        assert!(
            matches!(out.as_slice(), [Update::Upsert(m)] if m.endpoints.len() == 1),
            "{out:?}"
        );
        // Relabelled out of the pool: the old version was selected, so it matters.
        let out = d.handle(Ev::Pod(Event::Apply(pod("a", "other", "10.0.0.1", true))));
        assert!(
            matches!(out.as_slice(), [Update::Upsert(m)] if m.endpoints.is_empty()),
            "{out:?}"
        );
        // Dropping the reference: Pods are no longer wanted, and the Model uses its slices.
        d.handle(Ev::Pod(Event::Apply(pod("a", "vllm", "10.0.0.1", true))));
        let out = d.handle(Ev::Model(Event::Apply(model("m", true))));
        assert!(
            matches!(out.as_slice(), [Update::Upsert(m)] if m.endpoints.is_empty()),
            "{out:?}"
        );
        assert!(!d.wants_pods());
        d.stop_pods();
        assert!(d.pods.live.is_empty() && !d.pods.synced);
        // Still synced for everything else.
        assert_eq!(
            d.handle(Ev::Model(Event::Delete(model("m", true)))),
            vec![Update::Remove("m".into())]
        );
    }

    #[test]
    fn pools_off_means_no_pool_watch_and_no_pods_for_pool_models() {
        let mut d = Discovery::new("flexinfer.ai/service", false);
        let out = synced(
            &mut d,
            vec![pool_model("m", "p")],
            vec![service("m")],
            vec![slice("m", "m-1", &[("10.0.0.1", true)])],
        );
        assert!(!d.wants_pods());
        let [Update::Reset(models)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert!(
            models[0].endpoints.is_empty(),
            "a pool-Model ignores its slices"
        );
        assert_eq!(
            models[0].service.as_deref(),
            Some("http://m.ns.svc.cluster.local:80")
        );
        assert!(d
            .pool_notes
            .values()
            .any(|n| n.contains("--inference-pools false")));
    }
}
