//! The file source: a YAML list of models and pods (the local and test setup), polled for
//! changes. A file that fails to read or parse is logged and the last good table stays.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc::UnboundedSender;

use super::{BalanceOverride, EngineKind, ModelSpec, Strategy, Update};
use crate::admission::settings::{check_budget, ModelAdmission};

mod fields;
pub use fields::ParseError;
use fields::{
    BalanceFactor, BalanceFloor, Checked, HttpUrl, MaxConcurrency, NonEmpty, QueueMaxSize,
    QueueTimeout, TenantWeightMap, Tokens,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default, deserialize_with = "fields::unique_by_name")]
    models: Vec<FileModel>,
}

// Every field is validated while it is deserialized, so each error carries the line and column
// of the offending value (serde_yaml_ng attaches the position of the event being read).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileModel {
    name: Checked<NonEmpty>,
    #[serde(default)]
    routing: Option<Checked<Strategy>>,
    #[serde(default)]
    served_model_name: Option<String>,
    #[serde(default)]
    service_label: Option<String>,
    #[serde(default)]
    route_priority: i64,
    #[serde(default = "yes")]
    ready: bool,
    #[serde(default)]
    service: Option<Checked<HttpUrl>>,
    #[serde(default)]
    endpoints: Vec<Checked<SocketAddr>>,
    #[serde(default)]
    hash_balance_factor: Option<Checked<BalanceFactor>>,
    #[serde(default)]
    hash_balance_floor: Option<Checked<BalanceFloor>>,
    #[serde(default)]
    engine: Option<Checked<EngineKind>>,
    #[serde(default)]
    max_concurrency: Option<Checked<MaxConcurrency>>,
    #[serde(default)]
    queue: Option<FileQueue>,
    #[serde(default)]
    tokens_per_minute: Option<Checked<Tokens>>,
    #[serde(default)]
    token_burst: Option<Checked<Tokens>>,
}

/// A model's `queue:` block (admission).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileQueue {
    #[serde(default)]
    max_size: Option<Checked<QueueMaxSize>>,
    #[serde(default)]
    timeout: Option<Checked<QueueTimeout>>,
    #[serde(default)]
    sheddable_timeout: Option<Checked<QueueTimeout>>,
    #[serde(default)]
    tenant_weights: Option<TenantWeightMap>,
}

impl FileModel {
    /// The model's own admission settings.
    fn admission(&self) -> Result<ModelAdmission, ParseError> {
        let queue = self.queue.as_ref();
        let own = ModelAdmission {
            max_concurrency: self.max_concurrency.as_ref().map(|c| c.0),
            queue_max_size: queue.and_then(|q| q.max_size.as_ref()).map(|c| c.0),
            queue_timeout: queue.and_then(|q| q.timeout.as_ref()).map(|c| c.0),
            queue_sheddable_timeout: queue
                .and_then(|q| q.sheddable_timeout.as_ref())
                .map(|c| c.0),
            tokens_per_minute: self.tokens_per_minute.as_ref().map(|c| c.0),
            token_burst: self.token_burst.as_ref().map(|c| c.0),
            tenant_weights: queue
                .and_then(|q| q.tenant_weights.as_ref())
                .map(|w| w.0.clone())
                .unwrap_or_default(),
        };
        check_budget(&own).map_err(|e| ParseError {
            message: format!("model {:?}: {e}", self.name.0),
            line: None,
            column: None,
        })?;
        Ok(own)
    }
}

fn yes() -> bool {
    true
}

/// Parse the models file text; errors say where (line and column, when the parser knows).
pub fn parse(text: &str) -> Result<Vec<ModelSpec>, ParseError> {
    let cfg: FileConfig = serde_yaml_ng::from_str(text)?;
    cfg.models
        .into_iter()
        .map(|m| {
            let admission = m.admission()?;
            Ok(ModelSpec {
                name: m.name.0,
                routing: m.routing.map_or(Strategy::Default, |r| r.0),
                served_model_name: m.served_model_name,
                service_label: m.service_label,
                route_priority: m.route_priority,
                ready: m.ready,
                service: m.service.map(|s| s.0),
                endpoints: m.endpoints.into_iter().map(|e| e.0).collect(),
                hash_balance: BalanceOverride {
                    factor_milli: m.hash_balance_factor.map(|f| f.0),
                    floor: m.hash_balance_floor.map(|f| f.0),
                },
                engine: m.engine.map_or(EngineKind::Auto, |e| e.0),
                admission,
            })
        })
        .collect()
}

impl fields::Named for FileModel {
    fn name(&self) -> &str {
        &self.name.0
    }
}

/// A models file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse { path: PathBuf, source: ParseError },
}

fn load(path: &Path) -> Result<(String, Vec<ModelSpec>), LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let models = parse(&text).map_err(|source| LoadError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((text, models))
}

/// Load `path` now (an error here is fatal to the caller), then watch it forever.
/// How often the file is checked for changes unless `--config-poll` says otherwise.
pub const DEFAULT_POLL: std::time::Duration = std::time::Duration::from_millis(500);

pub fn start(
    path: PathBuf,
    poll: Duration,
    updates: UnboundedSender<Update>,
) -> Result<(), LoadError> {
    let (mut last, models) = load(&path)?;
    let _ = updates.send(Update::Reset(models));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // A file that stays unreadable is reported once, not at every poll.
        let mut unreadable = false;
        loop {
            tick.tick().await;
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    if !unreadable {
                        tracing::error!(path = %path.display(), error = %e, "cannot read models file; keeping the last good table until it is back");
                        unreadable = true;
                    }
                    continue;
                }
            };
            if std::mem::take(&mut unreadable) {
                tracing::info!(path = %path.display(), "models file readable again");
            }
            if text == last {
                continue;
            }
            last = text;
            match parse(&last) {
                Ok(models) => {
                    tracing::info!(path = %path.display(), models = models.len(), "models file changed");
                    if updates.send(Update::Reset(models)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "invalid models file; keeping the last good table")
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_the_documented_format() {
        let m = parse(
            r#"
models:
  - name: my-model
    routing: prefix
    servedModelName: llama3:8b
    serviceLabel: chat
    routePriority: 100
    ready: true
    service: http://127.0.0.1:9000
    endpoints: [127.0.0.1:9001, "[::1]:9002"]
  - name: plain
"#,
        )
        .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].routing, Strategy::Prefix);
        assert_eq!(m[0].served_model_name.as_deref(), Some("llama3:8b"));
        assert_eq!(m[0].route_priority, 100);
        assert_eq!(m[0].endpoints[1], "[::1]:9002".parse().unwrap());
        assert_eq!(m[1].routing, Strategy::Default);
        assert!(m[1].ready);
    }

    #[test]
    fn hash_balance_overrides_parse_and_bad_ones_point_at_the_value() {
        let m = parse(
            "models:\n  - name: a\n    routing: prefix\n    hashBalanceFactor: 1.5\n    hashBalanceFloor: 3\n  - name: b\n    hashBalanceFactor: 0\n  - name: c\n",
        )
        .unwrap();
        assert_eq!(
            m[0].hash_balance,
            BalanceOverride {
                factor_milli: Some(1500),
                floor: Some(3)
            }
        );
        assert_eq!(m[1].hash_balance.factor_milli, Some(0));
        assert_eq!(m[2].hash_balance, BalanceOverride::default());
        let e = parse("models:\n  - name: a\n    hashBalanceFactor: 0.5\n").unwrap_err();
        assert!(
            e.message
                .contains("must be 0 (off) or a number from 1 to 100"),
            "{e}"
        );
        assert_eq!((e.line, e.column), (Some(3), Some(24)));
        let e = parse("models:\n  - name: a\n    hashBalanceFloor: -2\n").unwrap_err();
        assert!(e.message.contains("whole number"), "{e}");
        assert_eq!((e.line, e.column), (Some(3), Some(23)));
    }

    #[test]
    fn engine_kinds_parse_and_a_bad_one_points_at_the_value() {
        let m = parse(
            "models:\n  - name: a\n    engine: vllm\n  - name: b\n    engine: llama.cpp\n  - name: c\n    engine: none\n  - name: d\n",
        )
        .unwrap();
        let kinds: Vec<EngineKind> = m.iter().map(|m| m.engine).collect();
        assert_eq!(
            kinds,
            [
                EngineKind::Vllm,
                EngineKind::LlamaCpp,
                EngineKind::None,
                EngineKind::Auto
            ]
        );
        let e = parse("models:\n  - name: a\n    engine: tgi\n").unwrap_err();
        assert!(e.message.contains("unknown engine \"tgi\""), "{e}");
        assert_eq!((e.line, e.column), (Some(3), Some(13)));
    }

    #[test]
    fn admission_settings_parse_and_bad_ones_point_at_the_value() {
        let m = parse(
            "models:\n  - name: a\n    maxConcurrency: 2\n    queue:\n      maxSize: 50\n      timeout: 10s\n      sheddableTimeout: 500ms\n    tokensPerMinute: 6000\n    tokenBurst: 12000\n  - name: b\n    queue: {maxSize: 0}\n  - name: c\n",
        )
        .unwrap();
        assert_eq!(
            m[0].admission,
            ModelAdmission {
                max_concurrency: Some(2),
                queue_max_size: Some(50),
                queue_timeout: Some(Duration::from_secs(10)),
                queue_sheddable_timeout: Some(Duration::from_millis(500)),
                tokens_per_minute: Some(6000),
                token_burst: Some(12000),
                tenant_weights: Default::default(),
            }
        );
        assert_eq!(m[1].admission.queue_max_size, Some(0));
        assert_eq!(m[2].admission, ModelAdmission::default());
        let err = |text: &str| parse(text).unwrap_err();
        let e = err("models:\n  - name: a\n    maxConcurrency: 0\n");
        assert!(e.message.contains("from 1"), "{e}");
        assert_eq!((e.line, e.column), (Some(3), Some(21)));
        let e = err("models:\n  - name: a\n    queue:\n      timeout: 0s\n");
        assert!(e.message.contains("above 0"), "{e}");
        assert_eq!((e.line, e.column), (Some(4), Some(16)));
        let e = err("models:\n  - name: a\n    queue:\n      maxsize: 5\n");
        assert!(e.message.contains("unknown field `maxsize`"), "{e}");
        let e = err("models:\n  - name: a\n    tokensPerMinute: -5\n");
        assert!(e.message.contains("from 1"), "{e}");
        let e = err("models:\n  - name: a\n    tokenBurst: 100\n");
        assert_eq!(
            e.message,
            "model \"a\": tokenBurst is set without tokensPerMinute"
        );
    }

    #[test]
    fn tenant_weights_parse_and_bad_ones_point_at_the_entry() {
        let m = parse(
            "models:\n  - name: a\n    queue:\n      tenantWeights: {tenant-b: 2, \" c \": 100}\n",
        )
        .unwrap();
        assert_eq!(
            m[0].admission.tenant_weights.describe(),
            "c 100, tenant-b 2"
        );
        let err = |text: &str| parse(text).unwrap_err();
        let e = err("models:\n  - name: a\n    queue:\n      tenantWeights:\n        b: 0\n");
        assert!(e.message.contains("from 1 to 100"), "{e}");
        assert_eq!((e.line, e.column), (Some(5), Some(12)));
        let e = err("models:\n  - name: a\n    queue:\n      tenantWeights:\n        team a: 2\n");
        assert!(e.message.contains("outside A-Za-z0-9"), "{e}");
        assert_eq!(e.line, Some(5));
        let e =
            err("models:\n  - name: a\n    queue:\n      tenantWeights: {bearer:00ff00ff: 2}\n");
        assert!(e.message.contains("bearer token cannot be weighted"), "{e}");
        let many: String = (0..65).map(|i| format!("t{i}: 1, ")).collect();
        let e = err(&format!(
            "models:\n  - name: a\n    queue:\n      tenantWeights: {{{many}}}\n"
        ));
        assert!(e.message.contains("at most 64"), "{e}");
        // Trimmed ids that collide are one tenant listed twice.
        let e = err("models:\n  - name: a\n    queue:\n      tenantWeights: {b: 2, \" b\": 3}\n");
        assert!(e.message.contains("twice"), "{e}");
    }

    #[test]
    fn errors_are_clear() {
        let e = |text: &str| parse(text).unwrap_err().to_string();
        assert!(
            e("models:\n  - name: a\n    routing: fastest\n").contains("unknown routing strategy")
        );
        assert!(e("models:\n  - name: a\n    endpoints: [localhost]\n").contains("not IP:port"));
        assert!(e("models:\n  - name: a\n  - name: a\n").contains("twice"));
        assert!(e("models:\n  - name: a\n    sevice: http://x\n").contains("unknown field"));
    }

    #[test]
    fn errors_point_at_the_value() {
        let at = |text: &str| {
            let e = parse(text).unwrap_err();
            (e.line, e.column)
        };
        // The bad scalar itself.
        assert_eq!(
            at("models:\n  - name: a\n    routing: fastest\n"),
            (Some(3), Some(14))
        );
        assert_eq!(
            at("models:\n  - name: a\n    endpoints: [127.0.0.1:1, nohost]\n"),
            (Some(3), Some(30))
        );
        // The second entry of a duplicate.
        assert_eq!(
            at("models:\n  - name: a\n  - name: b\n  - name: a\n"),
            (Some(4), Some(5))
        );
    }
}
