//! The models file the proxy reads with `--discovery file` (README, "The models file"), built
//! in code instead of YAML text written by hand at every call site.
//!
//! One struct per level with serde `Serialize`: an unset optional field is left out, so the
//! proxy's default applies, and a new field is one more member with `skip_serializing_if`.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io;
use std::path::Path;

use serde::Serialize;

/// `models: [...]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelsFile {
    models: Vec<ModelEntry>,
}

/// One entry of `models:`. Only `name` is required.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelEntry {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    served_model_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    route_priority: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    endpoints: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash_balance_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash_balance_floor: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_concurrency: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<QueueEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_burst: Option<u64>,
}

/// A model's `queue:` block; unset fields take the proxy's values.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u32>,
    /// A duration such as `2s` or `500ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sheddable_timeout: Option<String>,
    /// `tenantWeights`: turns per round by `x-flexinfer-tenant` id (others take one).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tenant_weights: BTreeMap<String, u32>,
}

impl QueueEntry {
    /// Give `tenant` `weight` turns per round.
    pub fn tenant_weight(mut self, tenant: &str, weight: u32) -> Self {
        self.tenant_weights.insert(tenant.to_string(), weight);
        self
    }
}

impl ModelsFile {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a model.
    pub fn model(mut self, m: ModelEntry) -> Self {
        self.models.push(m);
        self
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).expect("a models file always serializes")
    }

    /// Write the file so that a reader polling it sees the old or the new text, never half of
    /// one (a temporary file next to it, then a rename).
    pub fn write_to(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, self.to_yaml())?;
        std::fs::rename(&tmp, path)
    }
}

impl FromIterator<ModelEntry> for ModelsFile {
    fn from_iter<I: IntoIterator<Item = ModelEntry>>(iter: I) -> Self {
        Self {
            models: iter.into_iter().collect(),
        }
    }
}

impl ModelEntry {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            routing: None,
            served_model_name: None,
            service_label: None,
            route_priority: None,
            ready: None,
            service: None,
            endpoints: Vec::new(),
            hash_balance_factor: None,
            hash_balance_floor: None,
            engine: None,
            max_concurrency: None,
            queue: None,
            tokens_per_minute: None,
            token_burst: None,
        }
    }

    /// Requests in flight per pod before the pod is full (`maxConcurrency`).
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = Some(n);
        self
    }

    /// The model's `queue:` block.
    pub fn queue(mut self, q: QueueEntry) -> Self {
        self.queue = Some(q);
        self
    }

    /// A token budget per tenant (`tokensPerMinute`, `tokenBurst`).
    pub fn token_budget(mut self, per_minute: u64, burst: Option<u64>) -> Self {
        self.tokens_per_minute = Some(per_minute);
        self.token_burst = burst;
        self
    }

    /// This model's bounded-load factor (`hashBalanceFactor`; 0 = the plain ring).
    pub fn hash_balance_factor(mut self, factor: f64) -> Self {
        self.hash_balance_factor = Some(factor);
        self
    }

    /// This model's bound floor (`hashBalanceFloor`).
    pub fn hash_balance_floor(mut self, floor: u64) -> Self {
        self.hash_balance_floor = Some(floor);
        self
    }

    /// `session-affinity`, `prefix`, `least-loaded`, ... (not checked here: tests also write
    /// invalid files on purpose).
    /// The engine kind (`auto`, `vllm`, `sglang`, `llamacpp`, `none`): `none` for backends that
    /// are not model servers, so the proxy never reads a metrics page of theirs.
    pub fn engine(mut self, kind: &str) -> Self {
        self.engine = Some(kind.to_string());
        self
    }

    pub fn routing(mut self, strategy: &str) -> Self {
        self.routing = Some(strategy.to_string());
        self
    }

    pub fn served_model_name(mut self, name: &str) -> Self {
        self.served_model_name = Some(name.to_string());
        self
    }

    pub fn service_label(mut self, label: &str) -> Self {
        self.service_label = Some(label.to_string());
        self
    }

    pub fn route_priority(mut self, priority: i64) -> Self {
        self.route_priority = Some(priority);
        self
    }

    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = Some(ready);
        self
    }

    /// The Service fallback as a URL.
    pub fn service(mut self, url: &str) -> Self {
        self.service = Some(url.to_string());
        self
    }

    /// The Service fallback at `http://<addr>`.
    pub fn service_at(self, addr: impl Display) -> Self {
        self.service(&format!("http://{addr}"))
    }

    /// Add one ready pod (`IP:port`).
    pub fn endpoint(mut self, addr: impl Display) -> Self {
        self.endpoints.push(addr.to_string());
        self
    }

    /// Add ready pods (`IP:port` each).
    pub fn endpoints<I>(mut self, addrs: I) -> Self
    where
        I: IntoIterator,
        I::Item: Display,
    {
        self.endpoints
            .extend(addrs.into_iter().map(|a| a.to_string()));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml_ng::Value;

    fn parse(f: &ModelsFile) -> Value {
        serde_yaml_ng::from_str(&f.to_yaml()).unwrap()
    }

    #[test]
    fn every_field_renders_under_the_files_camel_case_name() {
        let f = ModelsFile::new().model(
            ModelEntry::new("my-model")
                .routing("prefix")
                .served_model_name("llama3:8b")
                .service_label("chat")
                .route_priority(100)
                .ready(false)
                .service_at("127.0.0.1:9000")
                .endpoint("127.0.0.1:9001")
                .endpoints(["[::1]:9002"])
                .hash_balance_factor(1.5)
                .hash_balance_floor(3)
                .max_concurrency(2)
                .queue(
                    QueueEntry {
                        max_size: Some(5),
                        timeout: Some("2s".into()),
                        sheddable_timeout: Some("500ms".into()),
                        ..QueueEntry::default()
                    }
                    .tenant_weight("tenant-b", 2),
                )
                .token_budget(60, Some(100)),
        );
        let want: Value = serde_yaml_ng::from_str(
            r#"
models:
  - name: my-model
    routing: prefix
    servedModelName: llama3:8b
    serviceLabel: chat
    routePriority: 100
    ready: false
    service: http://127.0.0.1:9000
    endpoints: [127.0.0.1:9001, "[::1]:9002"]
    hashBalanceFactor: 1.5
    hashBalanceFloor: 3
    maxConcurrency: 2
    queue: {maxSize: 5, timeout: 2s, sheddableTimeout: 500ms, tenantWeights: {tenant-b: 2}}
    tokensPerMinute: 60
    tokenBurst: 100
"#,
        )
        .unwrap();
        assert_eq!(parse(&f), want);
    }

    #[test]
    fn unset_fields_are_left_out_so_the_defaults_apply() {
        let f: ModelsFile = [
            ModelEntry::new("a"),
            ModelEntry::new("b").routing("least-loaded"),
        ]
        .into_iter()
        .collect();
        let want: Value = serde_yaml_ng::from_str(
            "models:\n  - name: a\n  - name: b\n    routing: least-loaded\n",
        )
        .unwrap();
        assert_eq!(parse(&f), want);
        assert_eq!(
            parse(&ModelsFile::new()),
            serde_yaml_ng::from_str::<Value>("models: []").unwrap()
        );
    }

    #[test]
    fn write_to_replaces_the_file_whole() {
        let dir = crate::TempDir::new("models");
        let path = dir.path().join("models.yaml");
        ModelsFile::new()
            .model(ModelEntry::new("a"))
            .write_to(&path)
            .unwrap();
        ModelsFile::new()
            .model(ModelEntry::new("b"))
            .write_to(&path)
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "models:\n- name: b\n"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }
}
