//! Whether a proxy's routing table is the models file a test just wrote: the test waits for
//! that instead of sleeping past the proxy's poll interval and hoping.
//!
//! The check reads `/debug/routing`, the table the proxy routes with, and compares what the
//! file states: the set of model names, and per model its endpoints and every field the file
//! sets (strategy, readiness, priority, Service). Fields the file leaves out take the proxy's
//! defaults and are not compared, so the check needs no copy of those defaults. A file that
//! changes nothing the view shows cannot be told from the old one; every rewrite in the tests
//! changes a model, an endpoint or a field.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::Value;

use crate::ModelsFile;

/// The log line the proxy writes when it refuses a rewritten models file.
pub const REFUSED_LINE: &str = "invalid models file; keeping the last good table";

/// `Ok` if `view` (a `/debug/routing` answer) routes by `file`, else what differs.
pub fn view_shows(view: &Value, file: &ModelsFile) -> Result<(), String> {
    let declared: Value = serde_yaml_ng::from_str(&file.to_yaml()).expect("a models file is YAML");
    let declared = declared["models"].as_array().cloned().unwrap_or_default();
    let shown = view["models"].as_array().cloned().unwrap_or_default();
    let names = |models: &[Value]| -> BTreeSet<String> {
        models
            .iter()
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect()
    };
    if names(&declared) != names(&shown) {
        return Err(format!(
            "models {:?}, the file has {:?}",
            names(&shown),
            names(&declared)
        ));
    }
    for want in &declared {
        let name = want["name"].as_str().unwrap_or_default();
        let got = shown
            .iter()
            .find(|m| m["name"] == name)
            .expect("names compared above");
        model_shows(got, want).map_err(|why| format!("model {name}: {why}"))?;
    }
    Ok(())
}

/// One model of the view against its entry in the file (camelCase keys, as written).
fn model_shows(got: &Value, want: &Value) -> Result<(), String> {
    let pods: BTreeSet<String> = got["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["address"].as_str().map(normalize))
        .collect();
    let endpoints: BTreeSet<String> = want["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(normalize))
        .collect();
    if pods != endpoints {
        return Err(format!("pods {pods:?}, the file has {endpoints:?}"));
    }
    for (file_key, view_key) in [
        ("routing", "strategy"),
        ("ready", "ready"),
        ("routePriority", "route_priority"),
        ("service", "service"),
    ] {
        let stated = &want[file_key];
        if !stated.is_null() && &got[view_key] != stated {
            return Err(format!(
                "{view_key} {}, the file has {file_key}: {stated}",
                got[view_key]
            ));
        }
    }
    Ok(())
}

/// An endpoint as the view prints it (`SocketAddr` display), whatever spelling the file used.
fn normalize(addr: &str) -> String {
    addr.parse::<SocketAddr>()
        .map_or_else(|_| addr.to_owned(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelEntry;
    use serde_json::json;

    fn view(models: Value) -> Value {
        json!({ "ready": true, "models": models })
    }

    #[test]
    fn a_view_matches_the_fields_its_file_states() {
        let file = ModelsFile::new()
            .model(
                ModelEntry::new("chat")
                    .routing("prefix")
                    .endpoint("127.0.0.1:9001")
                    .endpoint("127.0.0.1:9002"),
            )
            .model(
                ModelEntry::new("tts")
                    .ready(false)
                    .route_priority(100)
                    .service_at("127.0.0.1:9000"),
            );
        let live = view(json!([
            {"name": "tts", "strategy": "least-loaded", "ready": false, "route_priority": 100,
             "service": "http://127.0.0.1:9000", "pods": []},
            {"name": "chat", "strategy": "prefix", "ready": true, "route_priority": 0,
             "service": null, "pods": [{"address": "127.0.0.1:9002"}, {"address": "127.0.0.1:9001"}]},
        ]));
        assert_eq!(view_shows(&live, &file), Ok(()));
    }

    #[test]
    fn each_difference_is_named() {
        let file = ModelsFile::new().model(
            ModelEntry::new("chat")
                .ready(true)
                .endpoint("127.0.0.1:9001"),
        );
        let one = |model: Value| view(json!([model]));
        for (live, says) in [
            (view(json!([])), "models {}"),
            (
                one(json!({"name": "chat", "ready": true, "pods": []})),
                "model chat: pods {}",
            ),
            (
                one(json!({"name": "chat", "ready": false,
                           "pods": [{"address": "127.0.0.1:9001"}]})),
                "model chat: ready false",
            ),
            (
                view(json!([
                    {"name": "chat", "ready": true, "pods": [{"address": "127.0.0.1:9001"}]},
                    {"name": "old", "ready": true, "pods": []},
                ])),
                "models {\"chat\", \"old\"}",
            ),
        ] {
            let err = view_shows(&live, &file).unwrap_err();
            assert!(err.starts_with(says), "{err:?} should start with {says:?}");
        }
    }
}
