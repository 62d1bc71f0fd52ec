//! Discovery: where models and their pods come from.
//!
//! Every source (the YAML file, Kubernetes) emits a stream of [`Update`]s. The reconciler folds
//! them into a [`ModelSet`] idempotently and, only when something really changed, rebuilds the
//! routing table. Sources know nothing about rings or gauges.

pub mod check;
pub mod file;
pub mod kube;

use std::collections::BTreeMap;
use std::net::SocketAddr;

pub use crate::admission::ModelAdmission;
pub use crate::balance::bounded::BalanceOverride;
pub use crate::vocab::{EngineKind, Strategy};

/// Everything the router needs to know about one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Matched against `X-Model-ID`, the `/model/<name>/` path prefix and the body `model`.
    pub name: String,
    pub routing: Strategy,
    /// When set, the body's `model` is rewritten to this before forwarding.
    pub served_model_name: Option<String>,
    /// Shared service label: a request for this name goes to the label group.
    pub service_label: Option<String>,
    /// `flexinfer.ai/route-priority`: higher wins inside a label group; absent = 0.
    pub route_priority: i64,
    /// The Model's `Ready` condition.
    pub ready: bool,
    /// The Service URL used as the fallback target (`http://<svc>.<ns>.svc.cluster.local:<port>`).
    pub service: Option<String>,
    /// Ready (and not terminating) pod endpoints.
    pub endpoints: Vec<SocketAddr>,
    /// The model's own hash-balance factor and floor (`hashBalanceFactor` / `hashBalanceFloor`,
    /// `flexinfer.ai/hash-balance-factor` / `-floor`); unset = the proxy's.
    pub hash_balance: BalanceOverride,
    /// The model server its pods run, for reading their load (`engine:` in the file,
    /// `spec.engine` or `flexinfer.ai/engine` on a Model; `auto` = detected).
    pub engine: EngineKind,
    /// The model's own admission settings (`maxConcurrency`, `queue.*`, `tokensPerMinute`,
    /// `tokenBurst`; unset = the proxy's).
    pub admission: ModelAdmission,
}

impl ModelSpec {
    /// A ready model with no label, priority 0, default routing.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            routing: Strategy::Default,
            served_model_name: None,
            service_label: None,
            route_priority: 0,
            ready: true,
            service: None,
            endpoints: Vec::new(),
            hash_balance: BalanceOverride::default(),
            engine: EngineKind::Auto,
            admission: ModelAdmission::default(),
        }
    }
}

/// One change from a discovery source.
// One short-lived value per discovery event; boxing the spec would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The complete set of models (a first sync or a relist). Marks discovery as synced.
    Reset(Vec<ModelSpec>),
    /// A model was added or changed.
    Upsert(ModelSpec),
    /// A model is gone.
    Remove(String),
}

/// The current models, by name. Applying an update reports whether anything changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModelSet {
    models: BTreeMap<String, ModelSpec>,
}

impl ModelSet {
    pub fn apply(&mut self, update: Update) -> bool {
        match update {
            Update::Reset(list) => {
                let next: BTreeMap<String, ModelSpec> = list
                    .into_iter()
                    .map(|mut m| {
                        normalize(&mut m);
                        (m.name.clone(), m)
                    })
                    .collect();
                let changed = next != self.models;
                self.models = next;
                changed
            }
            Update::Upsert(mut m) => {
                normalize(&mut m);
                if self.models.get(&m.name) == Some(&m) {
                    return false;
                }
                self.models.insert(m.name.clone(), m);
                true
            }
            Update::Remove(name) => self.models.remove(&name).is_some(),
        }
    }

    pub fn models(&self) -> impl Iterator<Item = &ModelSpec> {
        self.models.values()
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

/// Endpoint order does not matter and duplicates mean nothing.
fn normalize(m: &mut ModelSpec) {
    m.endpoints.sort();
    m.endpoints.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_are_idempotent_and_report_real_changes_only() {
        let mut set = ModelSet::default();
        let mut m = ModelSpec::new("a");
        m.endpoints = vec![
            "127.0.0.1:2".parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
        ];
        assert!(set.apply(Update::Reset(vec![m.clone()])));
        assert!(!set.apply(Update::Reset(vec![m.clone()])));
        m.endpoints.reverse();
        assert!(
            !set.apply(Update::Upsert(m.clone())),
            "order is not a change"
        );
        m.ready = false;
        assert!(set.apply(Update::Upsert(m)));
        assert!(set.apply(Update::Remove("a".into())));
        assert!(!set.apply(Update::Remove("a".into())));
    }
}
