//! Folds the three watch streams (Models, Services, EndpointSlices) into [`Update`]s.
//!
//! Each stream feeds a cache that swaps in a relist only when the relist is complete (kube's
//! `Init .. InitDone`), so a broken watch never shows the router an empty or partial table. After
//! every change the desired specs of all Models are recomputed and diffed against what was last
//! emitted: only the Models that really changed produce an Upsert or Remove. Recomputing is
//! O(models) per event, which is cheap at the scale of Models in a cluster and keeps cross-object
//! rules (Service overrides, name collisions across namespaces) trivially right; Service and
//! EndpointSlice events that no Model references skip it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::crd::Model;
use super::translate::{model_settings, translate, SLICE_SERVICE_LABEL};
use crate::discovery::{ModelSpec, Update};

/// `(namespace, name)`; for EndpointSlices the name is `<service>/<slice>` so that one range
/// query finds all slices of a Service.
type Key = (String, String);

/// One event from one of the three watchers.
// One short-lived value per watch event; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Ev {
    Model(Event<Model>),
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
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
    /// One object changed; for Services and slices, the `(namespace, service)` it belongs to.
    Changed(Option<Key>),
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

/// Cached objects do not need their (large) managed-fields bookkeeping.
fn slim<K: Resource>(mut event: Event<K>) -> Event<K> {
    if let Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) = &mut event {
        o.meta_mut().managed_fields = None;
    }
    event
}

/// The discovery state: three caches and what was last emitted.
pub struct Discovery {
    label_key: String,
    models: Cache<Model>,
    services: Cache<Service>,
    slices: Cache<EndpointSlice>,
    /// None until the first Reset went out.
    emitted: Option<BTreeMap<String, ModelSpec>>,
}

impl Discovery {
    pub fn new(service_label_key: impl Into<String>) -> Self {
        Self {
            label_key: service_label_key.into(),
            models: Cache::default(),
            services: Cache::default(),
            slices: Cache::default(),
            emitted: None,
        }
    }

    /// True once all three watchers completed their first list and the first Reset went out.
    pub fn is_synced(&self) -> bool {
        self.emitted.is_some()
    }

    /// Folds one event in and returns the updates it causes (often none).
    pub fn handle(&mut self, ev: Ev) -> Vec<Update> {
        let step = match ev {
            Ev::Model(e) => {
                let e = slim(e);
                if let Event::Apply(m) | Event::InitApply(m) = &e {
                    self.warn_about(m);
                }
                match self.models.apply(e, object_key) {
                    // A Model event affects that Model whatever Service it names.
                    Step::Changed(_) => Step::Changed(None),
                    s => s,
                }
            }
            Ev::Service(e) => self.services.apply(slim(e), object_key),
            Ev::Slice(e) => match self.slices.apply(slim(e), slice_key) {
                Step::Changed(Some((ns, k))) => {
                    let service = k.split_once('/').map_or(k.as_str(), |(s, _)| s).to_owned();
                    Step::Changed(Some((ns, service)))
                }
                s => s,
            },
        };
        if !(self.models.synced && self.services.synced && self.slices.synced) {
            return Vec::new();
        }
        match step {
            Step::Nothing => Vec::new(),
            Step::Changed(Some((ns, svc)))
                if self.emitted.is_some() && !self.references(&ns, &svc) =>
            {
                Vec::new()
            }
            Step::Changed(_) | Step::Relisted => self.reconcile(step == Step::Relisted),
        }
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
            .live
            .range((ns.to_owned(), String::new())..)
            .take_while(|((n, _), _)| n == ns)
            .any(|(_, m)| model_settings(m, &self.label_key).0.service_name == svc)
    }

    /// The spec of every Model as the caches say now.
    pub fn desired(&self) -> BTreeMap<String, ModelSpec> {
        let mut out = BTreeMap::new();
        for ((ns, name), m) in &self.models.live {
            if out.contains_key(name) {
                continue;
            }
            let (settings, _) = model_settings(m, &self.label_key);
            let service = self
                .services
                .live
                .get(&(ns.clone(), settings.service_name.clone()));
            let prefix = format!("{}/", settings.service_name);
            let slices = self
                .slices
                .live
                .range((ns.clone(), prefix.clone())..)
                .take_while(|((n, k), _)| n == ns && k.starts_with(&prefix))
                .map(|(_, s)| s);
            out.insert(name.clone(), translate(m, &settings, service, slices));
        }
        out
    }

    fn reconcile(&mut self, relisted: bool) -> Vec<Update> {
        let desired = self.desired();
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
        let mut d = Discovery::new("flexinfer.ai/service");
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
        let mut d = Discovery::new("flexinfer.ai/service");
        assert_eq!(
            synced(&mut d, vec![], vec![], vec![]),
            vec![Update::Reset(vec![])]
        );
    }

    #[test]
    fn changes_are_per_model_and_unrelated_objects_are_quiet() {
        let mut d = Discovery::new("flexinfer.ai/service");
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
        let mut d = Discovery::new("flexinfer.ai/service");
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
        let mut d = Discovery::new("flexinfer.ai/service");
        let mut other = model("a", false);
        other.metadata.namespace = Some("aaa".into());
        let out = synced(&mut d, vec![model("a", true), other], vec![], vec![]);
        let [Update::Reset(list)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!((list.len(), list[0].ready), (1, false));
    }
}
