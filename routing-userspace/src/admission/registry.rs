//! Every model's gate, kept across routing-table rebuilds: a rebuild updates a gate's settings
//! and room rule in place, so requests waiting in it keep their place. A model that goes away
//! answers its waiting requests (404, as a new request for it gets) and drops its gate.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tokio::time::Instant;

use super::gate::{ModelGate, Room};
use super::metrics::AdmissionFamilies;
use super::settings::{AdmissionDefaults, ModelAdmission};
use super::view::GateView;

pub struct Admission {
    defaults: AdmissionDefaults,
    families: AdmissionFamilies,
    gates: RwLock<HashMap<Arc<str>, Arc<ModelGate>>>,
}

impl Admission {
    pub fn new(defaults: AdmissionDefaults, families: AdmissionFamilies) -> Self {
        Self {
            defaults,
            families,
            gates: RwLock::new(HashMap::new()),
        }
    }

    pub fn defaults(&self) -> &AdmissionDefaults {
        &self.defaults
    }

    pub fn families(&self) -> &AdmissionFamilies {
        &self.families
    }

    /// The gate of `model` with its own settings `own` and the room rule `room`: created the
    /// first time, updated in place after (call it for every model when a table is built).
    pub fn gate(
        &self,
        model: &Arc<str>,
        own: &ModelAdmission,
        room: Arc<dyn Room>,
    ) -> Arc<ModelGate> {
        let settings = self.defaults.settings(own);
        if let Some(g) = self.get(model) {
            g.update(settings, room);
            return g;
        }
        let (g, created) = {
            let mut gates = self.gates.write().expect("admission gates lock");
            match gates.get(model) {
                Some(g) => (Arc::clone(g), false),
                None => {
                    let g = ModelGate::new(
                        Arc::clone(model),
                        settings.clone(),
                        Arc::clone(&room),
                        &self.families,
                        &self.defaults,
                    );
                    gates.insert(Arc::clone(model), Arc::clone(&g));
                    (g, true)
                }
            }
        };
        if !created {
            g.update(settings, room);
        }
        g
    }

    pub fn get(&self, model: &str) -> Option<Arc<ModelGate>> {
        self.gates
            .read()
            .expect("admission gates lock")
            .get(model)
            .cloned()
    }

    /// Keep the gates of the models `keep` says yes to; the others answer their waiting
    /// requests and go. Returns how many requests were answered so.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> usize {
        let gone: Vec<Arc<ModelGate>> = {
            let mut gates = self.gates.write().expect("admission gates lock");
            let names: Vec<Arc<str>> = gates.keys().filter(|m| !keep(m)).cloned().collect();
            names.iter().filter_map(|m| gates.remove(m)).collect()
        };
        gone.iter().map(|g| g.remove()).sum()
    }

    /// Drain every model (see [`ModelGate::close`]), concurrently; the number of waiting
    /// requests answered `proxy_shutdown` at `deadline`.
    pub async fn close(&self, deadline: Instant) -> usize {
        let gates: Vec<Arc<ModelGate>> = self
            .gates
            .read()
            .expect("admission gates lock")
            .values()
            .cloned()
            .collect();
        let closing = gates.iter().map(|g| g.close(deadline));
        futures::future::join_all(closing).await.into_iter().sum()
    }

    /// Every model's queue and budget, by model name.
    pub fn view(&self) -> Vec<GateView> {
        let gates: Vec<Arc<ModelGate>> = self
            .gates
            .read()
            .expect("admission gates lock")
            .values()
            .cloned()
            .collect();
        let mut views: Vec<GateView> = gates.iter().map(|g| g.view()).collect();
        views.sort_by(|a, b| a.model.cmp(&b.model));
        views
    }
}
