//! Validation of a custom resource against its CRD's `openAPIV3Schema`, the way the API server
//! treats a create under strict field validation (kubectl's default): wrong types, missing
//! required fields and unknown fields (where unknown fields are not preserved) are errors.
//!
//! Only the keywords a structural schema of this project uses are implemented, and any other
//! keyword is reported as an error rather than ignored, so a schema that grows a feature this
//! checker lacks fails loudly instead of passing everything.

use serde_json::Value;

/// Keywords that only document.
const ANNOTATIONS: &[&str] = &["description", "title", "example", "default"];

/// Every violation of `schema` by `value`, each as `path: message`. `apiVersion`, `kind` and
/// `metadata` at the root are the API server's, as for every custom resource.
pub fn validate_custom_resource(schema: &Value, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, value, "", true, &mut errors);
    errors
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, root: bool, errors: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        errors.push(format!("{path}: schema is not an object"));
        return;
    };
    let here = if path.is_empty() { "<root>" } else { path };
    for key in s.keys() {
        let known = ANNOTATIONS.contains(&key.as_str())
            || matches!(
                key.as_str(),
                "type"
                    | "properties"
                    | "required"
                    | "items"
                    | "nullable"
                    | "format"
                    | "enum"
                    | "minimum"
                    | "maximum"
                    | "pattern"
                    | "additionalProperties"
                    | "maxProperties"
                    | "x-kubernetes-preserve-unknown-fields"
            );
        if !known {
            errors.push(format!(
                "{here}: schema keyword {key:?} is not supported by this checker"
            ));
        }
    }
    if value.is_null() {
        if s.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(format!("{here}: null is not allowed"));
        }
        return;
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = actual == t || (t == "number" && actual == "integer");
        if !ok {
            errors.push(format!("{here}: expected {t}, got {actual} ({value})"));
            return;
        }
    }
    if let (Some(Value::String(f)), Some(n)) = (s.get("format"), value.as_f64()) {
        let fits = match f.as_str() {
            "int32" => value.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
            "int64" => value.as_i64().is_some(),
            _ => true,
        };
        if !fits {
            errors.push(format!("{here}: {n} does not fit format {f}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), value.as_f64()) {
        if n < min {
            errors.push(format!("{here}: {value} is less than the minimum {min}"));
        }
    }
    if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_f64), value.as_f64()) {
        if n > max {
            errors.push(format!("{here}: {value} is more than the maximum {max}"));
        }
    }
    if let (Some(Value::String(p)), Value::String(text)) = (s.get("pattern"), value) {
        match regex::Regex::new(p) {
            Ok(re) if re.is_match(text) => {}
            Ok(_) => errors.push(format!("{here}: {text:?} does not match {p:?}")),
            Err(e) => errors.push(format!("{here}: schema pattern {p:?} is invalid: {e}")),
        }
    }
    if let Some(Value::Array(allowed)) = s.get("enum") {
        if !allowed.contains(value) {
            errors.push(format!("{here}: {value} is not one of {allowed:?}"));
        }
    }
    if let (Some(max), Value::Object(obj)) = (s.get("maxProperties").and_then(Value::as_u64), value)
    {
        if obj.len() as u64 > max {
            errors.push(format!(
                "{here}: {} properties, more than the maxProperties {max}",
                obj.len()
            ));
        }
    }
    match value {
        Value::Object(obj) => {
            let props = s.get("properties").and_then(Value::as_object);
            if let Some(Value::Array(required)) = s.get("required") {
                for r in required.iter().filter_map(Value::as_str) {
                    if !obj.contains_key(r) {
                        errors.push(format!("{here}: required field {r:?} is missing"));
                    }
                }
            }
            let preserve =
                s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            for (k, v) in obj {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                    (Some(sub), _) => check(sub, v, &child, false, errors),
                    (None, Some(extra)) if extra.is_object() => {
                        check(extra, v, &child, false, errors)
                    }
                    (None, Some(Value::Bool(true))) => {}
                    _ if preserve => {}
                    _ => errors.push(format!("{child}: unknown field")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check(item_schema, v, &format!("{path}[{i}]"), false, errors);
                }
            }
        }
        _ => {}
    }
}

/// The `openAPIV3Schema` of the CRD version `version`.
pub fn crd_version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == version)
        .map(|v| &v["schema"]["openAPIV3Schema"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["a"],
                    "properties": {
                        "a": {"type": "string"},
                        "n": {"type": "integer", "format": "int64", "nullable": true},
                        "small": {"type": "integer", "minimum": 1, "maximum": 9},
                        "d": {"type": "string", "pattern": "^[0-9]+s$"},
                        "weights": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "integer"}},
                        "list": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}}
                    }
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        })
    }

    #[test]
    fn accepts_a_conforming_resource() {
        let v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "m"},
            "spec": {"a": "x", "n": null, "list": [{"k": "v"}], "weights": {"b": 2}}, "status": {"anything": 1}});
        assert_eq!(
            validate_custom_resource(&schema(), &v),
            Vec::<String>::new()
        );
    }

    #[test]
    fn reports_each_kind_of_violation() {
        let v = json!({"spec": {"a": 5, "extra": true, "list": [{"k": 1}], "small": 0, "d": "5m",
            "weights": {"b": 2, "c": "x"}}, "other": 1});
        let errors = validate_custom_resource(&schema(), &v);
        for want in [
            "spec.a: expected string, got integer (5)",
            "spec.extra: unknown field",
            "spec.list[0].k: expected string, got integer (1)",
            "spec.small: 0 is less than the minimum 1",
            "spec.d: \"5m\" does not match \"^[0-9]+s$\"",
            "spec.weights: 2 properties, more than the maxProperties 1",
            "spec.weights.c: expected integer, got string (\"x\")",
            "other: unknown field",
        ] {
            assert!(
                errors.iter().any(|e| e == want),
                "{want:?} not in {errors:#?}"
            );
        }
        let missing = validate_custom_resource(&schema(), &json!({"spec": {}}));
        assert_eq!(missing, ["spec: required field \"a\" is missing"]);
        let unsupported =
            validate_custom_resource(&json!({"type": "object", "oneOf": []}), &json!({}));
        assert_eq!(
            unsupported,
            ["<root>: schema keyword \"oneOf\" is not supported by this checker"]
        );
    }
}
