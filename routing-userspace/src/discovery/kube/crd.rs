//! The `Model` custom resource (`inference.flexinfer.ai/v1alpha2`), as far as the proxy reads it.
//!
//! The proxy only reads Models; the FlexInfer operator owns the rest of their shape. So the schema
//! keeps unknown fields (`x-kubernetes-preserve-unknown-fields`) instead of pruning them, and
//! deserialization is lenient: one odd object must not fail the whole list and stall discovery.
//! The chart's `crds/` file is generated from this type; a test keeps them equal.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::admission::{AdmissionSpec, Lenient, QueueSpec};

/// The part of a Model's `spec` the proxy knows about.
// Each printcolumn repeats `type_ = ...`; that is the derive's syntax, not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inference.flexinfer.ai",
    version = "v1alpha2",
    kind = "Model",
    plural = "models",
    namespaced,
    status = "ModelStatus",
    category = "flexinfer",
    doc = "A model served by one or more OpenAI-compatible pods behind a Service or an InferencePool.",
    printcolumn(name = "Backend", type_ = "string", json_path = ".spec.backend"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true), transform = require_backend_and_source)]
pub struct ModelResourceSpec {
    /// Serving backend, e.g. `ollama`, `vllm`, `llama.cpp`.
    #[serde(default)]
    pub backend: String,
    /// Where the weights come from, e.g. `ollama://llama3:8b`.
    #[serde(default)]
    pub source: String,
    /// When set, the proxy rewrites the request body's `model` to this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// When set, the Model's pods are the ready members of this Gateway API InferencePool (same
    /// namespace) instead of its Service's EndpointSlices; the Service stays the fallback.
    // Kept as raw JSON so that a malformed reference fails this Model only
    // (`ModelResourceSpec::inference_pool_ref`), not the whole list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<InferencePoolRef>")]
    pub inference_pool_ref: Option<serde_json::Value>,
    /// The model server the pods run, for reading their load: `auto` (detected from the
    /// metrics page; `backend` narrows it), `vllm`, `sglang`, `llamacpp` or `none` (no engine
    /// signals). The `flexinfer.ai/engine` annotation overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["auto", "vllm", "sglang", "llamacpp", "none"]))]
    pub engine: Option<String>,
    /// Requests in flight per pod before the pod counts as full and the proxy queues the rest
    /// (admission); unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::admission::count_schema")]
    pub max_concurrency: Option<Lenient<u32>>,
    /// The proxy's admission queue of this model while its pods are full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::admission::queue_schema")]
    pub queue: Option<Lenient<QueueSpec>>,
    /// Token budget of each tenant (per proxy): tokens a minute; unset: no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::admission::count_schema")]
    pub tokens_per_minute: Option<Lenient<u64>>,
    /// The most tokens a tenant's budget holds at once; unset: `tokensPerMinute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::admission::count_schema")]
    pub token_burst: Option<Lenient<u64>>,
}

/// A reference to an InferencePool in the Model's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = require_name)]
pub struct InferencePoolRef {
    /// The InferencePool's name (same namespace as the Model).
    pub name: String,
    /// The InferencePool's API group: `inference.networking.k8s.io` (the default), the only one
    /// supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

fn require_name(schema: &mut schemars::Schema) {
    require(schema, &["name"]);
}

impl ModelResourceSpec {
    /// The `inferencePoolRef`, parsed: `Ok(None)` when absent, an error message when it is not
    /// an object with a string `name` (and optional string `group`).
    pub fn inference_pool_ref(&self) -> Result<Option<InferencePoolRef>, String> {
        match &self.inference_pool_ref {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| format!("inferencePoolRef: {e}")),
        }
    }

    /// The admission fields, for [`super::admission::admission_settings`].
    pub fn admission(&self) -> AdmissionSpec<'_> {
        AdmissionSpec {
            max_concurrency: self.max_concurrency.as_ref(),
            queue: self.queue.as_ref(),
            tokens_per_minute: self.tokens_per_minute.as_ref(),
            token_burst: self.token_burst.as_ref(),
        }
    }
}

/// The API server requires `backend` and `source`; the proxy's reader does not (see module docs).
fn require_backend_and_source(schema: &mut schemars::Schema) {
    require(schema, &["backend", "source"]);
}

/// Marks fields required in the schema and drops the `default` serde's leniency put there.
fn require(schema: &mut schemars::Schema, fields: &[&str]) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(props) = obj.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for f in fields {
            if let Some(p) = props.get_mut(*f).and_then(|p| p.as_object_mut()) {
                p.remove("default");
            }
        }
    }
    let required = obj
        .entry("required")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let Some(list) = required.as_array_mut() {
        for f in fields {
            if !list.iter().any(|v| v == f) {
                list.push(serde_json::Value::from(*f));
            }
        }
    }
}

fn require_type_and_status(schema: &mut schemars::Schema) {
    require(schema, &["type", "status"]);
}

/// The part of a Model's `status` the proxy reads: its conditions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ModelStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ModelCondition>,
}

/// A standard Kubernetes condition. Every field is optional to the reader so that a controller that
/// leaves some out does not break discovery; the schema requires `type` and `status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = require_type_and_status)]
pub struct ModelCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Model {
    /// True when the `Ready` condition is `True`. No status or no Ready condition is not ready.
    pub fn is_ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True")
    }
}

/// The CRD as the chart ships it (YAML), generated from [`Model`].
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = serde_yaml_ng::to_string(&Model::crd()).expect("a CRD always serializes");
    format!("# Generated from routing-userspace/src/discovery/kube/crd.rs (Model::crd()); do not edit.\n# Regenerate: FLEXINFER_UPDATE_CRD=1 cargo test -p routing-userspace --lib discovery::kube::crd\n{crd}")
}

/// Where the chart keeps the CRD, relative to this crate.
pub const CHART_CRD_PATH: &str =
    "../charts/flexinfer-proxy/crds/models.inference.flexinfer.ai.yaml";

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn committed_crd_matches_the_derive() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRD_PATH);
        let generated = crd_yaml();
        if std::env::var_os("FLEXINFER_UPDATE_CRD").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "read {}: {e} (regenerate with FLEXINFER_UPDATE_CRD=1)",
                path.display()
            )
        });
        let a: serde_json::Value = serde_yaml_ng::from_str(&committed).unwrap();
        let b: serde_json::Value = serde_yaml_ng::from_str(&generated).unwrap();
        assert_eq!(
            a,
            b,
            "{} drifted from Model::crd(); regenerate with FLEXINFER_UPDATE_CRD=1",
            path.display()
        );
    }

    #[test]
    fn lenient_model_parsing_and_ready() {
        let m: Model = serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"backend": "vllm", "gpu": {"priority": 3}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}
        }))
        .unwrap();
        assert_eq!(m.spec.backend, "vllm");
        assert_eq!(m.spec.source, "");
        assert!(m.is_ready());
        let mut not = m.clone();
        not.status.as_mut().unwrap().conditions[0].status = "False".into();
        assert!(!not.is_ready());
        not.status = None;
        assert!(!not.is_ready());
    }
}
