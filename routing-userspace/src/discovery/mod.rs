//! Discovery: where models and their pods come from.
//!
//! Every source (the YAML file, Kubernetes) emits a stream of [`Update`]s. The reconciler folds
//! them into a [`ModelSet`] idempotently and, only when something really changed, rebuilds the
//! routing table. Sources know nothing about rings or gauges.

pub mod check;
pub mod file;
pub mod kube;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The routing strategy of one model (`flexinfer.ai/routing`, or `routing:` in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Kubernetes Service load balancing: always the Service URL.
    #[default]
    Default,
    SessionAffinity,
    Prefix,
    LeastLoaded,
}

impl Strategy {
    /// The spelling used in annotations, the file and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::SessionAffinity => "session-affinity",
            Strategy::Prefix => "prefix",
            Strategy::LeastLoaded => "least-loaded",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "default" => Ok(Strategy::Default),
            "session-affinity" | "session" => Ok(Strategy::SessionAffinity),
            "prefix" => Ok(Strategy::Prefix),
            "least-loaded" => Ok(Strategy::LeastLoaded),
            other => Err(format!(
                "unknown routing strategy {other:?} (expected default, session-affinity, prefix or least-loaded)"
            )),
        }
    }
}

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
        }
    }
}

/// One change from a discovery source.
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

/// Start the Kubernetes source (Model CRD, EndpointSlices, Services) in the background. A
/// source that cannot run at all (no cluster config) ends the process: a proxy that silently
/// never becomes ready helps nobody.
pub fn start_kubernetes(
    args: &crate::config::ServeArgs,
    updates: tokio::sync::mpsc::UnboundedSender<Update>,
) -> anyhow::Result<()> {
    let opts = kube::KubeOptions {
        namespace: Some(args.namespace.clone()).filter(|n| !n.is_empty()),
        kubeconfig: args.kubeconfig.clone(),
        service_label_key: args.service_label_key.clone(),
    };
    tokio::spawn(async move {
        if let Err(e) = kube::run(opts, updates).await {
            tracing::error!(error = format!("{e:#}"), "kubernetes discovery failed");
            std::process::exit(2);
        }
    });
    Ok(())
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

    #[test]
    fn strategy_spellings() {
        for s in [
            Strategy::Default,
            Strategy::SessionAffinity,
            Strategy::Prefix,
            Strategy::LeastLoaded,
        ] {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        }
        assert!("round-robin".parse::<Strategy>().is_err());
    }
}
