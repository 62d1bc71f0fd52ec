//! The file source: a YAML list of models and pods (the local and test setup), polled for
//! changes. A file that fails to read or parse is logged and the last good table stays.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc::UnboundedSender;

use super::{ModelSpec, Strategy, Update};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    models: Vec<FileModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileModel {
    name: String,
    #[serde(default)]
    routing: Option<String>,
    #[serde(default)]
    served_model_name: Option<String>,
    #[serde(default)]
    service_label: Option<String>,
    #[serde(default)]
    route_priority: i64,
    #[serde(default = "yes")]
    ready: bool,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    endpoints: Vec<String>,
}

fn yes() -> bool {
    true
}

/// What is wrong with a models file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not the documented YAML shape (a typo in a field, a wrong type); the YAML parser's
    /// message names the line and column.
    #[error("{0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("a model has an empty name")]
    EmptyName,
    #[error("model {0:?} is listed twice")]
    Duplicate(String),
    #[error("model {model:?}: {source}")]
    Routing {
        model: String,
        source: crate::vocab::UnknownStrategy,
    },
    #[error("model {model:?}: endpoint {endpoint:?} is not IP:port")]
    Endpoint { model: String, endpoint: String },
    #[error("model {model:?}: service {url:?} must be an http:// URL")]
    Service { model: String, url: String },
}

impl FileError {
    /// The model the error is about, when it is about one.
    pub fn model(&self) -> Option<&str> {
        match self {
            FileError::Duplicate(m)
            | FileError::Routing { model: m, .. }
            | FileError::Endpoint { model: m, .. }
            | FileError::Service { model: m, .. } => Some(m),
            _ => None,
        }
    }
}

/// Parse the models file text.
pub fn parse(text: &str) -> Result<Vec<ModelSpec>, FileError> {
    let cfg: FileConfig = serde_yaml_ng::from_str(text)?;
    let mut seen = std::collections::HashSet::new();
    cfg.models
        .into_iter()
        .map(|m| {
            if m.name.trim().is_empty() {
                return Err(FileError::EmptyName);
            }
            if !seen.insert(m.name.clone()) {
                return Err(FileError::Duplicate(m.name));
            }
            let routing = match m.routing.as_deref() {
                None => Strategy::Default,
                Some(r) => r.parse::<Strategy>().map_err(|source| FileError::Routing {
                    model: m.name.clone(),
                    source,
                })?,
            };
            let endpoints = m
                .endpoints
                .iter()
                .map(|e| {
                    e.parse::<SocketAddr>().map_err(|_| FileError::Endpoint {
                        model: m.name.clone(),
                        endpoint: e.clone(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(s) = &m.service {
                if !(s.starts_with("http://") && s.len() > 7) {
                    return Err(FileError::Service {
                        model: m.name.clone(),
                        url: s.clone(),
                    });
                }
            }
            Ok(ModelSpec {
                name: m.name,
                routing,
                served_model_name: m.served_model_name,
                service_label: m.service_label,
                route_priority: m.route_priority,
                ready: m.ready,
                service: m.service,
                endpoints,
            })
        })
        .collect()
}

/// A models file that failed, with its path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub source: FileError,
}

fn load(path: &Path) -> Result<(String, Vec<ModelSpec>), LoadError> {
    let err = |source| LoadError {
        path: path.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(|source| {
        err(FileError::Read {
            path: path.to_path_buf(),
            source,
        })
    })?;
    let models = parse(&text).map_err(err)?;
    Ok((text, models))
}

/// Load `path` now (an error here is fatal to the caller), then watch it forever.
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
        loop {
            tick.tick().await;
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "cannot read models file; keeping the last good table");
                    continue;
                }
            };
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
    fn errors_are_clear() {
        let e = |text: &str| parse(text).unwrap_err().to_string();
        assert!(
            e("models:\n  - name: a\n    routing: fastest\n").contains("unknown routing strategy")
        );
        assert!(e("models:\n  - name: a\n    endpoints: [localhost]\n").contains("not IP:port"));
        assert!(e("models:\n  - name: a\n  - name: a\n").contains("twice"));
        let typo = e("models:\n  - name: a\n    sevice: http://x\n");
        assert!(typo.contains("unknown field"), "{typo}");
        assert!(
            typo.contains("line 3"),
            "the YAML error names the line: {typo}"
        );
    }
}
