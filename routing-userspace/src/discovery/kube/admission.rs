//! A Model's admission settings: the spec fields `maxConcurrency`, `queue.maxSize`,
//! `queue.timeout`, `queue.sheddableTimeout`, `tokensPerMinute` and `tokenBurst`, else the
//! annotations `flexinfer.ai/max-concurrency`, `flexinfer.ai/queue-max-size`,
//! `flexinfer.ai/queue-timeout`, `flexinfer.ai/queue-sheddable-timeout`,
//! `flexinfer.ai/tokens-per-minute` and `flexinfer.ai/token-burst` (for Models whose spec
//! another controller owns). The spec wins when both are set. `queue.tenantWeights` (a
//! mapping) has the annotation `flexinfer.ai/queue-tenant-weights: tenant-b=2,tenant-c=3`.
//!
//! Like the rest of the Model, reading is lenient: a value of the wrong type or out of range
//! is dropped with a warning (the proxy's default applies), never an error that would stall
//! discovery. The CRD schema still states the types, so the API server refuses them first.

use std::collections::BTreeMap;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::admission::settings::{
    check_budget, parse_max_concurrency, parse_queue_max_size, parse_queue_timeout, parse_tokens,
    ModelAdmission,
};
use crate::admission::weights::{self, TenantWeights, MAX_TENANT_WEIGHTS, MAX_WEIGHT};

pub const MAX_CONCURRENCY_ANNOTATION: &str = "flexinfer.ai/max-concurrency";
pub const QUEUE_MAX_SIZE_ANNOTATION: &str = "flexinfer.ai/queue-max-size";
pub const QUEUE_TIMEOUT_ANNOTATION: &str = "flexinfer.ai/queue-timeout";
pub const QUEUE_SHEDDABLE_TIMEOUT_ANNOTATION: &str = "flexinfer.ai/queue-sheddable-timeout";
pub const TOKENS_PER_MINUTE_ANNOTATION: &str = "flexinfer.ai/tokens-per-minute";
pub const TOKEN_BURST_ANNOTATION: &str = "flexinfer.ai/token-burst";
pub const QUEUE_TENANT_WEIGHTS_ANNOTATION: &str = "flexinfer.ai/queue-tenant-weights";

/// A spec value kept whatever its type, so that one odd Model does not fail the whole list;
/// the reader warns about an `Invalid` one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Lenient<T> {
    Valid(T),
    Invalid(serde_json::Value),
}

/// `spec.queue`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Requests that wait at most while the pods are full (0: none wait); unset: the proxy's
    /// `--queue-max-size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "queue_size_schema")]
    pub max_size: Option<Lenient<u32>>,
    /// Longest wait, e.g. `30s`; unset: the proxy's `--queue-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Option<Lenient<String>>,
    /// Longest wait of a sheddable (negative priority) request, at most `timeout`; unset: the
    /// proxy's `--queue-sheddable-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub sheddable_timeout: Option<Lenient<String>>,
    /// Turns per round of the tenants named (`x-flexinfer-tenant` ids), 1 to 100, at most 64
    /// tenants; every other tenant takes one. A tenant known only by its bearer token cannot
    /// be named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "tenant_weights_schema")]
    pub tenant_weights: Option<Lenient<BTreeMap<String, Lenient<u32>>>>,
}

pub(super) fn count_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 1, "nullable": true})
}

fn queue_size_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 0, "maximum": 1_000_000, "nullable": true})
}

fn tenant_weights_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_WEIGHT},
        "maxProperties": MAX_TENANT_WEIGHTS,
        "nullable": true
    })
}

fn duration_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*(ms|s|m|h)?\\s*$",
        "nullable": true
    })
}

pub(super) fn queue_schema(g: &mut SchemaGenerator) -> Schema {
    let mut s = g.subschema_for::<QueueSpec>();
    s.insert("nullable".into(), true.into());
    s
}

/// The text of a spec value (numbers as written), or a warning for any other type.
fn spec_text<T: ToString>(v: &Lenient<T>) -> Result<String, String> {
    match v {
        Lenient::Valid(t) => Ok(t.to_string()),
        Lenient::Invalid(serde_json::Value::String(s)) => Ok(s.clone()),
        Lenient::Invalid(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Lenient::Invalid(other) => Err(format!("{other} is not a scalar")),
    }
}

/// The spec fields of admission, as the CRD holds them.
pub struct AdmissionSpec<'a> {
    pub max_concurrency: Option<&'a Lenient<u32>>,
    pub queue: Option<&'a Lenient<QueueSpec>>,
    pub tokens_per_minute: Option<&'a Lenient<u64>>,
    pub token_burst: Option<&'a Lenient<u64>>,
}

/// One setting: the spec value, else the annotation, parsed; warnings for what was dropped.
fn setting<T: PartialEq>(
    spec: (&str, Option<Result<String, String>>),
    annotation: (&str, Option<&String>),
    parse: impl Fn(&str) -> Result<T, String>,
    warnings: &mut Vec<String>,
) -> Option<T> {
    let (field, spec_value) = spec;
    let (key, annotation_value) = annotation;
    let from_annotation = annotation_value.and_then(|v| match parse(v) {
        Ok(t) => Some(t),
        Err(e) => {
            warnings.push(format!("{key}: {e}; using the proxy's setting"));
            None
        }
    });
    let from_spec = spec_value.and_then(|v| match v.and_then(|text| parse(&text)) {
        Ok(t) => Some(t),
        Err(e) => {
            warnings.push(format!("spec.{field}: {e}; using the proxy's setting"));
            None
        }
    });
    match (from_spec, from_annotation) {
        (Some(s), Some(a)) => {
            if s != a {
                warnings.push(format!(
                    "spec.{field} and {key} disagree; using spec.{field}"
                ));
            }
            Some(s)
        }
        (s, a) => s.or(a),
    }
}

/// A Model's admission settings from its spec and annotations, with warnings for the values
/// that had to be dropped.
pub fn admission_settings(
    spec: &AdmissionSpec<'_>,
    annotations: &BTreeMap<String, String>,
) -> (ModelAdmission, Vec<String>) {
    let mut w = Vec::new();
    let queue = match spec.queue {
        Some(Lenient::Valid(q)) => Some(q),
        Some(Lenient::Invalid(v)) => {
            w.push(format!(
                "spec.queue: {v} is not an object; using the proxy's queue settings"
            ));
            None
        }
        None => None,
    };
    let text = |v: Option<&Lenient<u32>>| v.map(spec_text);
    let text64 = |v: Option<&Lenient<u64>>| v.map(spec_text);
    let text_s = |v: Option<&Lenient<String>>| v.map(spec_text);
    let ann = |k: &'static str| (k, annotations.get(k));
    let mut own = ModelAdmission {
        max_concurrency: setting(
            ("maxConcurrency", text(spec.max_concurrency)),
            ann(MAX_CONCURRENCY_ANNOTATION),
            parse_max_concurrency,
            &mut w,
        ),
        queue_max_size: setting(
            (
                "queue.maxSize",
                text(queue.and_then(|q| q.max_size.as_ref())),
            ),
            ann(QUEUE_MAX_SIZE_ANNOTATION),
            parse_queue_max_size,
            &mut w,
        ),
        queue_timeout: setting(
            (
                "queue.timeout",
                text_s(queue.and_then(|q| q.timeout.as_ref())),
            ),
            ann(QUEUE_TIMEOUT_ANNOTATION),
            parse_queue_timeout,
            &mut w,
        ),
        queue_sheddable_timeout: setting(
            (
                "queue.sheddableTimeout",
                text_s(queue.and_then(|q| q.sheddable_timeout.as_ref())),
            ),
            ann(QUEUE_SHEDDABLE_TIMEOUT_ANNOTATION),
            parse_queue_timeout,
            &mut w,
        ),
        tokens_per_minute: setting(
            ("tokensPerMinute", text64(spec.tokens_per_minute)),
            ann(TOKENS_PER_MINUTE_ANNOTATION),
            parse_tokens,
            &mut w,
        ),
        token_burst: setting(
            ("tokenBurst", text64(spec.token_burst)),
            ann(TOKEN_BURST_ANNOTATION),
            parse_tokens,
            &mut w,
        ),
        tenant_weights: tenant_weights(queue, annotations, &mut w),
    };
    if let Err(e) = check_budget(&own) {
        w.push(format!("{e}; the burst is ignored"));
        own.token_burst = None;
    }
    (own, w)
}

/// `spec.queue.tenantWeights`, else the annotation. A bad spec entry is dropped alone; past
/// [`MAX_TENANT_WEIGHTS`] the first ids (sorted) are kept. A bad annotation is dropped whole.
fn tenant_weights(
    queue: Option<&QueueSpec>,
    annotations: &BTreeMap<String, String>,
    w: &mut Vec<String>,
) -> TenantWeights {
    const FIELD: &str = "spec.queue.tenantWeights";
    let key = QUEUE_TENANT_WEIGHTS_ANNOTATION;
    let from_annotation = annotations
        .get(key)
        .and_then(|v| match weights::parse_list(v) {
            Ok(t) => Some(t),
            Err(e) => {
                w.push(format!("{key}: {e}; every tenant takes equal turns"));
                None
            }
        });
    let from_spec = match queue.and_then(|q| q.tenant_weights.as_ref()) {
        None => None,
        Some(Lenient::Invalid(v)) => {
            w.push(format!("{FIELD}: {v} is not a mapping; ignored"));
            None
        }
        Some(Lenient::Valid(map)) => {
            let mut pairs = Vec::new();
            for (id, value) in map {
                let entry = weights::tenant_id(id)
                    .and_then(|id| Ok((id, spec_text(value).and_then(|t| weights::weight(&t))?)));
                match entry {
                    Ok(pair) if pairs.len() < MAX_TENANT_WEIGHTS => pairs.push(pair),
                    Ok((id, _)) => w.push(format!(
                        "{FIELD}: more than {MAX_TENANT_WEIGHTS} tenants; {id:?} is ignored"
                    )),
                    Err(e) => w.push(format!("{FIELD}: {e}; that tenant takes equal turns")),
                }
            }
            // Two ids that trim alike: the first is kept.
            pairs.dedup_by(|b, a| a.0 == b.0);
            Some(TenantWeights::new(pairs).expect("bounded and unique"))
        }
    };
    match (from_spec, from_annotation) {
        (Some(s), Some(a)) => {
            if s != a {
                w.push(format!("{FIELD} and {key} disagree; using {FIELD}"));
            }
            s
        }
        (s, a) => s.or(a).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::kube::crd::Model;
    use serde_json::json;
    use std::time::Duration;

    fn read(
        spec: serde_json::Value,
        annotations: &[(&str, &str)],
    ) -> (ModelAdmission, Vec<String>) {
        let mut base = json!({"backend": "vllm", "source": "hf://x"});
        for (k, v) in spec.as_object().unwrap() {
            base[k] = v.clone();
        }
        let m: Model = serde_json::from_value(json!({
            "apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": base,
        }))
        .expect("an odd value never fails the Model");
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        admission_settings(&m.spec.admission(), &annotations)
    }

    #[test]
    fn spec_fields_are_read() {
        let (a, w) = read(
            json!({"maxConcurrency": 2, "queue": {"maxSize": 50, "timeout": "10s", "sheddableTimeout": "1s"},
                   "tokensPerMinute": 6000, "tokenBurst": 9000}),
            &[],
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            a,
            ModelAdmission {
                max_concurrency: Some(2),
                queue_max_size: Some(50),
                queue_timeout: Some(Duration::from_secs(10)),
                queue_sheddable_timeout: Some(Duration::from_secs(1)),
                tokens_per_minute: Some(6000),
                token_burst: Some(9000),
                tenant_weights: TenantWeights::default(),
            }
        );
    }

    #[test]
    fn annotations_fill_in_and_the_spec_wins() {
        let (a, w) = read(
            json!({"maxConcurrency": 2}),
            &[
                (MAX_CONCURRENCY_ANNOTATION, "3"),
                (QUEUE_MAX_SIZE_ANNOTATION, "0"),
                (QUEUE_TIMEOUT_ANNOTATION, "5s"),
                (QUEUE_SHEDDABLE_TIMEOUT_ANNOTATION, "250ms"),
                (TOKENS_PER_MINUTE_ANNOTATION, "100"),
                (TOKEN_BURST_ANNOTATION, "10"),
            ],
        );
        assert_eq!(a.max_concurrency, Some(2));
        assert_eq!(a.queue_max_size, Some(0));
        assert_eq!(a.queue_timeout, Some(Duration::from_secs(5)));
        assert_eq!(a.queue_sheddable_timeout, Some(Duration::from_millis(250)));
        assert_eq!((a.tokens_per_minute, a.token_burst), (Some(100), Some(10)));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("disagree; using spec.maxConcurrency"),
            "{w:?}"
        );
    }

    #[test]
    fn tenant_weights_from_the_spec_or_the_annotation_and_bad_entries_dropped_alone() {
        let (a, w) = read(
            json!({"queue": {"tenantWeights": {"tenant-b": 2, "c": "3", "bad id": 2, "d": 0, "bearer:0a0b0c0d": 5}}}),
            &[(QUEUE_TENANT_WEIGHTS_ANNOTATION, "tenant-b=4")],
        );
        assert_eq!(a.tenant_weights.describe(), "c 3, tenant-b 2");
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w.iter().any(|m| m.contains("\"bad id\"")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("from 1 to 100")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("bearer token")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("disagree")), "{w:?}");
        let (a, w) = read(json!({}), &[(QUEUE_TENANT_WEIGHTS_ANNOTATION, "b=2, c=5")]);
        assert_eq!(
            (a.tenant_weights.describe(), w.len()),
            ("b 2, c 5".into(), 0)
        );
        let (a, w) = read(json!({}), &[(QUEUE_TENANT_WEIGHTS_ANNOTATION, "b=2,c")]);
        assert!(a.tenant_weights.is_empty());
        assert!(w[0].contains(QUEUE_TENANT_WEIGHTS_ANNOTATION), "{w:?}");
        let (a, w) = read(json!({"queue": {"tenantWeights": [1]}}), &[]);
        assert!(a.tenant_weights.is_empty());
        assert!(w[0].contains("not a mapping"), "{w:?}");
        let many: serde_json::Map<String, serde_json::Value> =
            (0..70).map(|i| (format!("t{i:02}"), json!(1))).collect();
        let (a, w) = read(json!({"queue": {"tenantWeights": many}}), &[]);
        assert_eq!(a.tenant_weights.names().count(), MAX_TENANT_WEIGHTS);
        assert_eq!(w.len(), 6, "{w:?}");
        assert!(w[0].contains("more than 64 tenants; \"t64\""), "{w:?}");
    }

    #[test]
    fn odd_values_are_dropped_with_a_warning_never_fatal() {
        for (spec, annotations, field) in [
            (json!({"maxConcurrency": 0}), vec![], "spec.maxConcurrency"),
            (json!({"maxConcurrency": -3}), vec![], "spec.maxConcurrency"),
            (
                json!({"maxConcurrency": "lots"}),
                vec![],
                "spec.maxConcurrency",
            ),
            (
                json!({"maxConcurrency": [1]}),
                vec![],
                "spec.maxConcurrency",
            ),
            (json!({"queue": 7}), vec![], "spec.queue"),
            (
                json!({"queue": {"maxSize": 2000000}}),
                vec![],
                "spec.queue.maxSize",
            ),
            (
                json!({"queue": {"timeout": "0s"}}),
                vec![],
                "spec.queue.timeout",
            ),
            (
                json!({"tokensPerMinute": 1.5}),
                vec![],
                "spec.tokensPerMinute",
            ),
            (
                json!({}),
                vec![(MAX_CONCURRENCY_ANNOTATION, "x")],
                MAX_CONCURRENCY_ANNOTATION,
            ),
            (
                json!({}),
                vec![(TOKEN_BURST_ANNOTATION, "5")],
                "tokenBurst is set without",
            ),
        ] {
            let (a, w) = read(spec.clone(), &annotations);
            assert_eq!(w.len(), 1, "{spec} {annotations:?}: {w:?}");
            assert!(w[0].contains(field), "{spec}: {w:?}");
            assert_eq!(a, ModelAdmission::default(), "{spec}");
        }
        // A number written as a string is still a number, and seconds may be a bare number.
        let (a, w) = read(
            json!({"maxConcurrency": "4", "queue": {"timeout": 30}}),
            &[],
        );
        assert_eq!((a.max_concurrency, w.len()), (Some(4), 0));
        assert_eq!(a.queue_timeout, Some(Duration::from_secs(30)));
    }
}
