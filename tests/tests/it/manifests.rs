//! Every manifest a user applies, validated offline as an API server would take it:
//!
//! - every chart render the chart tests use (`flexinfer_tests::chart::variants`), the Model CRD
//!   and the built-in kinds of the example manifests, with `kubernetes-validate --strict`
//!   (unknown fields are errors) against the oldest and the newest Kubernetes the chart supports;
//! - every Model in the docs and examples against the CRD's own openAPIV3Schema, and the
//!   InferencePool example against the GIE v1 fields and the proxy's own reading of it;
//! - the chart's values (defaults and every variant) against values.schema.json with a real
//!   JSON-schema implementation (python jsonschema, draft 7 as Helm uses), and mistyped values
//!   rejected by it.
//!
//! kubernetes-validate and jsonschema come from PyPI (`cargo xtask test` installs them). Without
//! them these tests skip, unless CI is set: then they fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use flexinfer_tests::chart::{chart_dir, default_values, documents, merge, render, variants};
use flexinfer_tests::schema::{crd_version_schema, validate_custom_resource};
use flexinfer_tests::TempDir;
use serde_json::{json, Value};

/// The oldest Kubernetes the chart supports (Chart.yaml kubeVersion; the proxy's client is built
/// against this API version) and the newest kubernetes-validate has schemas for.
const OLDEST: &str = "1.33.0";
const NEWEST: &str = "1.37.0";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The interpreter with kubernetes_validate and jsonschema: FLEXINFER_PYTHON, else the venv
/// `cargo xtask test` falls back to, else python3. `None` (a recorded skip) only outside CI.
fn python() -> Option<PathBuf> {
    let venv = xtask::paths::target_dir().join("tools/python/bin/python3");
    let candidates: Vec<PathBuf> = std::env::var_os("FLEXINFER_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv, PathBuf::from("python3")])
        .collect();
    for p in &candidates {
        let ok = Command::new(p)
            .args(["-c", "import kubernetes_validate, jsonschema"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(p.clone());
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{}: kubernetes-validate is not installed (pip install kubernetes-validate) and CI is set",
            flexinfer_tests::running_test()
        );
    }
    flexinfer_tests::skip(
        "kubernetes-validate is not installed (pip install kubernetes-validate; set CI to fail instead)",
    );
    None
}

/// `kubernetes-validate --strict -k VERSION FILES...`: success and its report.
fn kubernetes_validate(python: &Path, version: &str, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(python)
        .args(["-m", "kubernetes_validate", "--strict", "-k", version])
        .args(files)
        .output()
        .expect("run kubernetes-validate");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A manifest file as `kubectl apply` or Helm would send it (never re-serialized: YAML 1.1
/// readers and serde_yaml_ng disagree on scalars like `yes`), and the `kind/name` of each of
/// its documents.
struct Manifest {
    label: String,
    path: PathBuf,
    resources: Vec<String>,
}

fn manifest(label: String, path: PathBuf) -> Manifest {
    let resources = documents(&std::fs::read_to_string(&path).unwrap())
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap().to_lowercase(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    Manifest {
        label,
        path,
        resources,
    }
}

/// Every chart variant rendered to a file, the CRD and the example manifests.
fn manifests(dir: &TempDir) -> Vec<Manifest> {
    let mut out = Vec::new();
    for (i, overrides) in variants().into_iter().enumerate() {
        let text = render(
            &chart_dir(),
            "flexinfer-proxy",
            "flexinfer-system",
            overrides.clone(),
        )
        .unwrap();
        let path = dir.path().join(format!("variant-{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        out.push(manifest(format!("variant {i} {overrides}"), path));
    }
    out.push(manifest(
        "the Model CRD".into(),
        chart_dir().join("crds/models.inference.flexinfer.ai.yaml"),
    ));
    out.push(manifest(
        "docs/examples/sim-backend.yaml".into(),
        workspace().join("docs/examples/sim-backend.yaml"),
    ));
    let example = "docs/examples/inference-pool.yaml";
    let path = dir.path().join("inference-pool-builtin.yaml");
    std::fs::write(&path, builtin_documents(&workspace().join(example))).unwrap();
    out.push(manifest(format!("{example} (built-in kinds)"), path));
    out
}

/// API groups of custom resources: kubernetes-validate has no schema for them (the Model is
/// checked against its CRD, the InferencePool against the GIE v1 fields, below).
const CUSTOM_GROUPS: &[&str] = &["inference.flexinfer.ai/", "inference.networking.k8s.io/"];

/// The documents of a manifest file that are not custom resources, as the file spells them
/// (split on `---` lines, never re-serialized).
fn builtin_documents(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for doc in text.split("\n---\n") {
        let custom = doc.lines().any(|l| {
            l.strip_prefix("apiVersion: ")
                .is_some_and(|v| CUSTOM_GROUPS.iter().any(|g| v.starts_with(g)))
        });
        if !custom {
            out.push_str("---\n");
            out.push_str(doc.trim_end());
            out.push('\n');
        }
    }
    out
}

#[test]
fn every_manifest_validates_strictly_on_the_oldest_and_newest_supported_kubernetes() {
    let Some(python) = python() else { return };
    let dir = TempDir::new("manifests");
    let files = manifests(&dir);
    let documents: usize = files.iter().map(|m| m.resources.len()).sum();
    assert!(documents > 100, "{documents} documents");
    let paths: Vec<PathBuf> = files.iter().map(|m| m.path.clone()).collect();
    for version in [OLDEST, NEWEST] {
        let (ok, report) = kubernetes_validate(&python, version, &paths);
        assert!(ok, "Kubernetes {version}:\n{report}");
        // Each document was checked against a schema; none passed for want of one.
        let short = version.rsplit_once('.').unwrap().0;
        for m in &files {
            for r in &m.resources {
                let want = format!(
                    "INFO {} passed for resource {r} against version {short}",
                    m.path.display()
                );
                assert!(
                    report.lines().any(|l| l == want),
                    "{}: no {want:?} in\n{report}",
                    m.label
                );
            }
        }
        assert_eq!(report.lines().count(), documents, "{report}");
    }
}

#[test]
fn the_validator_rejects_unknown_fields_and_wrong_types() {
    let Some(python) = python() else { return };
    let dir = TempDir::new("manifests-bad");
    let text = render(
        &chart_dir(),
        "flexinfer-proxy",
        "flexinfer-system",
        json!({}),
    )
    .unwrap();
    let ds = documents(&text)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    for (name, breakage) in [
        (
            "typo",
            json!({"spec": {"template": {"spec": {"terminationGracePeriodSecond": 60}}}}),
        ),
        (
            "type",
            json!({"spec": {"template": {"spec": {"hostNetwork": "sometimes"}}}}),
        ),
    ] {
        let mut bad = ds.clone();
        merge(&mut bad, breakage);
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, serde_yaml_ng::to_string(&bad).unwrap()).unwrap();
        let (ok, report) = kubernetes_validate(&python, OLDEST, &[path]);
        assert!(!ok, "{name} passed:\n{report}");
    }
}

#[test]
fn the_supported_versions_are_stated_where_they_apply() {
    let chart: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["kubeVersion"], format!(">={OLDEST}-0"));
    let minor = OLDEST.rsplit_once('.').unwrap().0.replace('.', "_");
    let cargo = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!(
            "k8s-openapi = {{ version = \"0.29\", features = [\"v{minor}\"] }}"
        )),
        "the Kubernetes client is built for another API version than Chart.yaml's oldest"
    );
    let docs = std::fs::read_to_string(workspace().join("docs/kubernetes.md")).unwrap();
    let (oldest, newest) = (
        OLDEST.rsplit_once('.').unwrap().0,
        NEWEST.rsplit_once('.').unwrap().0,
    );
    assert!(
        docs.contains(&format!("Kubernetes {oldest} to {newest}")),
        "docs/kubernetes.md does not state the supported range"
    );
}

/// Every Model a user is shown: the example file and each YAML block of the docs with
/// `kind: Model`.
fn documented_models() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for example in [
        "docs/examples/model.yaml",
        "docs/examples/inference-pool.yaml",
    ] {
        let text = std::fs::read_to_string(workspace().join(example)).unwrap();
        for doc in documents(&text).unwrap() {
            if doc["kind"] == "Model" {
                out.push((example.to_owned(), doc));
            }
        }
    }
    let mut sources = vec![workspace().join("README.md")];
    for e in std::fs::read_dir(workspace().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            sources.push(p);
        }
    }
    sources.sort();
    for md in sources {
        let text = std::fs::read_to_string(&md).unwrap();
        for (i, block) in text.split("```yaml\n").skip(1).enumerate() {
            let block = block.split("```").next().unwrap();
            if block.lines().any(|l| l.trim() == "kind: Model") {
                let name = format!(
                    "{} block {}",
                    md.file_name().unwrap().to_string_lossy(),
                    i + 1
                );
                for doc in documents(block).unwrap_or_else(|e| panic!("{name}: {e}")) {
                    if doc["kind"] == "Model" {
                        out.push((name.clone(), doc));
                    }
                }
            }
        }
    }
    out
}

fn crd() -> Value {
    serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("crds/models.inference.flexinfer.ai.yaml"))
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn every_documented_model_validates_against_the_crd_schema() {
    let crd = crd();
    let group = crd["spec"]["group"].as_str().unwrap();
    let models = documented_models();
    for source in [
        "docs/examples/model.yaml",
        "docs/examples/inference-pool.yaml",
        "kubernetes.md block",
    ] {
        assert!(
            models.iter().any(|(s, _)| s.starts_with(source)),
            "no Model from {source}"
        );
    }
    for (source, model) in &models {
        let api = model["apiVersion"].as_str().unwrap();
        let (g, version) = api.split_once('/').unwrap();
        assert_eq!(g, group, "{source}");
        let schema = crd_version_schema(&crd, version)
            .unwrap_or_else(|| panic!("{source}: the CRD does not serve {api}"));
        assert_eq!(model["kind"], crd["spec"]["names"]["kind"], "{source}");
        let errors = validate_custom_resource(schema, model);
        assert!(errors.is_empty(), "{source}: {errors:#?}");
    }
}

#[test]
fn the_crd_schema_rejects_a_broken_model() {
    let crd = crd();
    let schema = crd_version_schema(&crd, "v1alpha2").unwrap();
    let good: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(workspace().join("docs/examples/model.yaml")).unwrap(),
    )
    .unwrap();
    for (breakage, want) in [
        (
            json!({"spec": {"servedModelName": 7}}),
            "spec.servedModelName: expected string",
        ),
        (
            json!({"spec": {"source": null}}),
            "spec.source: null is not allowed",
        ),
        (
            json!({"status": {"conditions": [{"status": "True"}]}}),
            "status.conditions[0]: required field \"type\" is missing",
        ),
        (json!({"specs": {}}), "specs: unknown field"),
        (
            json!({"spec": {"maxConcurrency": 0}}),
            "spec.maxConcurrency: 0 is less than the minimum 1",
        ),
        (
            json!({"spec": {"queue": {"timeout": "soon"}}}),
            "spec.queue.timeout: \"soon\" does not match",
        ),
        (
            json!({"spec": {"queue": {"maxSize": "10"}}}),
            "spec.queue.maxSize: expected integer, got string",
        ),
        (
            json!({"spec": {"queue": {"maxsize": 10}}}),
            "spec.queue.maxsize: unknown field",
        ),
        (
            json!({"spec": {"queue": {"tenantWeights": {"tenant-b": 101}}}}),
            "spec.queue.tenantWeights.tenant-b: 101 is more than the maximum 100",
        ),
        (
            json!({"spec": {"queue": {"tenantWeights": (0..65).map(|i| (format!("t{i}"), json!(1))).collect::<serde_json::Map<_, _>>()}}}),
            "spec.queue.tenantWeights: 65 properties, more than the maxProperties 64",
        ),
    ] {
        let mut bad = good.clone();
        merge(&mut bad, breakage.clone());
        let errors = validate_custom_resource(schema, &bad);
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{breakage}: {errors:#?}"
        );
    }
    let mut no_spec = good.clone();
    no_spec.as_object_mut().unwrap().remove("spec");
    assert_eq!(
        validate_custom_resource(schema, &no_spec),
        ["<root>: required field \"spec\" is missing"]
    );
}

/// The `spec` of an InferencePool as the API server takes it, transcribed from the fields of
/// the Gateway API Inference Extension's v1 types (`api/v1/inferencepool_types.go`): selector
/// (matchLabels only), targetPorts (objects with a `number`), appProtocol (`http` or
/// `kubernetes.io/h2c`) and endpointPickerRef; other fields are unknown and rejected.
fn inference_pool_v1_schema() -> Value {
    let port = json!({"type": "object", "additionalProperties": false, "required": ["number"],
                      "properties": {"number": {"type": "integer", "format": "int32"}}});
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "additionalProperties": false,
                "required": ["selector", "targetPorts"],
                "properties": {
                    "selector": {
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["matchLabels"],
                        "properties": {"matchLabels": {
                            "type": "object", "additionalProperties": {"type": "string"}
                        }}
                    },
                    "targetPorts": {"type": "array", "items": port},
                    "appProtocol": {"type": "string", "enum": ["http", "kubernetes.io/h2c"]},
                    "endpointPickerRef": {
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["name"],
                        "properties": {
                            "group": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string"},
                            "port": port,
                            "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"]}
                        }
                    }
                }
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    })
}

/// The example's documents by kind.
fn pool_example() -> BTreeMap<String, Value> {
    let path = workspace().join("docs/examples/inference-pool.yaml");
    documents(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .into_iter()
        .map(|d| (d["kind"].as_str().unwrap().to_owned(), d))
        .collect()
}

#[test]
fn the_inference_pool_example_is_a_v1_pool_the_proxy_reads_as_written() {
    let docs = pool_example();
    let pool = &docs["InferencePool"];
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    let schema = inference_pool_v1_schema();
    let errors = validate_custom_resource(&schema, pool);
    assert!(errors.is_empty(), "{errors:#?}");
    // The schema has teeth.
    for (breakage, want) in [
        (
            json!({"spec": {"targetPort": 8000}}),
            "spec.targetPort: unknown field",
        ),
        (
            json!({"spec": {"targetPorts": [{"number": "8000"}]}}),
            "spec.targetPorts[0].number: expected integer",
        ),
        (
            json!({"spec": {"appProtocol": "h2c"}}),
            "spec.appProtocol: ",
        ),
    ] {
        let mut bad = pool.clone();
        merge(&mut bad, breakage.clone());
        let errors = validate_custom_resource(&schema, &bad);
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{breakage}: {errors:#?}"
        );
    }

    // The proxy's reader: the pool's ports, and its selector picks the Deployment's pods.
    use routing_userspace::discovery::kube::pods::PodInfo;
    use routing_userspace::discovery::kube::InferencePool;
    let parsed: InferencePool = serde_json::from_value(pool.clone()).unwrap();
    let template = &docs["Deployment"]["spec"]["template"];
    let container_ports: Vec<u64> = template["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().unwrap().iter())
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    let ports = parsed.ports().unwrap();
    assert!(ports.len() > 1, "the example shows data-parallel ports");
    for p in &ports {
        assert!(
            container_ports.contains(&u64::from(*p)),
            "{p} {container_ports:?}"
        );
    }
    let member = PodInfo {
        namespace: docs["Deployment"]["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .into(),
        name: "chat-dp-0".into(),
        labels: serde_json::from_value(template["metadata"]["labels"].clone()).unwrap(),
        ip: Some("10.0.0.1".parse().unwrap()),
        ready: true,
        terminating: false,
    };
    assert!(parsed.selects(&member));
    assert_eq!(parsed.endpoints([&member]).unwrap().len(), ports.len());
    // The Model names the pool of its namespace; the fallback Service selects the same pods.
    let model = &docs["Model"];
    assert_eq!(
        model["spec"]["inferencePoolRef"]["name"],
        pool["metadata"]["name"]
    );
    assert_eq!(
        model["metadata"]["namespace"],
        pool["metadata"]["namespace"]
    );
    let service = &docs["Service"];
    assert_eq!(service["metadata"]["name"], model["metadata"]["name"]);
    assert_eq!(
        service["spec"]["selector"],
        pool["spec"]["selector"]["matchLabels"]
    );
}

/// `jsonschema` (draft 7, what Helm's validator implements) on each instance: the error
/// messages per instance, empty when valid. The schema itself is checked first.
fn json_schema_errors(python: &Path, schema: &Value, instances: &[Value]) -> Vec<Vec<String>> {
    const SCRIPT: &str = r#"
import json, sys, jsonschema
data = json.load(sys.stdin)
jsonschema.Draft7Validator.check_schema(data["schema"])
v = jsonschema.Draft7Validator(data["schema"])
print(json.dumps([[f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(i)] for i in data["instances"]]))
"#;
    use std::io::Write;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            json!({"schema": schema, "instances": instances})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn values_schema() -> Value {
    serde_json::from_str(&std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap())
        .unwrap()
}

#[test]
fn values_schema_accepts_the_defaults_and_every_variant() {
    let Some(python) = python() else {
        return;
    };
    let instances: Vec<Value> = variants()
        .into_iter()
        .map(|o| {
            let mut v = default_values(&chart_dir()).unwrap();
            merge(&mut v, o);
            v
        })
        .collect();
    let errors = json_schema_errors(&python, &values_schema(), &instances);
    for (i, e) in errors.iter().enumerate() {
        assert!(e.is_empty(), "variant {i} {}: {e:#?}", variants()[i]);
    }
}

#[test]
fn values_schema_rejects_mistyped_values() {
    let Some(python) = python() else {
        return;
    };
    let cases = [
        (
            json!({"proxy": {"ports": {"http": "8080"}}}),
            "proxy/ports/http: '8080' is not of type 'integer'",
        ),
        (
            json!({"proxy": {"routing": {"explicitKeyMaxLength": "128"}}}),
            "proxy/routing/explicitKeyMaxLength: '128' is not of type 'integer'",
        ),
        (
            json!({"terminationGracePeriodSeconds": "60"}),
            "terminationGracePeriodSeconds: '60' is not of type 'integer'",
        ),
        (
            json!({"proxy": {"ebpf": {"enabled": "true"}}}),
            "proxy/ebpf/enabled: 'true' is not of type 'boolean'",
        ),
        (
            json!({"proxy": {"routing": {"labelGroupMode": "fastest"}}}),
            "proxy/routing/labelGroupMode: 'fastest' is not one of",
        ),
        (
            json!({"proxy": {"tracing": {"compression": "zstd"}}}),
            "proxy/tracing/compression: 'zstd' is not one of",
        ),
        (
            json!({"proxy": {"routng": {}}}),
            "proxy: Additional properties are not allowed ('routng' was unexpected)",
        ),
        (
            json!({"proxy": {"routing": {"leastLoadedReservationTTL": "10 seconds"}}}),
            "proxy/routing/leastLoadedReservationTTL:",
        ),
        (
            json!({"proxy": {"ebpf": {"cgroup2HostPath": "sys/fs/cgroup"}}}),
            "proxy/ebpf/cgroup2HostPath: 'sys/fs/cgroup' does not match",
        ),
        (
            json!({"proxy": {"routing": {"hashBalanceFactor": 0.5}}}),
            "proxy/routing/hashBalanceFactor: 0.5 is not valid under any of the given schemas",
        ),
        (
            json!({"proxy": {"routing": {"hashBalanceFloor": -1}}}),
            "proxy/routing/hashBalanceFloor: -1 is less than the minimum of 0",
        ),
        (
            json!({"proxy": {"routing": {"cacheAwareIndexBudget": "lots"}}}),
            "proxy/routing/cacheAwareIndexBudget: 'lots' does not match",
        ),
        (
            json!({"proxy": {"routing": {"routeHeader": "yes"}}}),
            "proxy/routing/routeHeader: 'yes' is not of type 'boolean'",
        ),
        (
            json!({"proxy": {"inferencePools": "yes"}}),
            "proxy/inferencePools: 'yes' is not of type 'boolean'",
        ),
        (
            json!({"proxy": {"admission": {"queueTimeout": "0s"}}}),
            "proxy/admission/queueTimeout:",
        ),
        (
            json!({"proxy": {"admission": {"queueMaxSize": -1}}}),
            "proxy/admission/queueMaxSize: -1 is less than the minimum of 0",
        ),
        (
            json!({"proxy": {"admission": {"fullWhenKvUsageAbove": 1}}}),
            "proxy/admission/fullWhenKvUsageAbove: 1 is not valid under any of the given schemas",
        ),
        (
            json!({"proxy": {"admission": {"fullWhenWaitingAbove": "never"}}}),
            "proxy/admission/fullWhenWaitingAbove: 'never' is not valid under any of the given schemas",
        ),
    ];
    let instances: Vec<Value> = cases
        .iter()
        .map(|(o, _)| {
            let mut v = default_values(&chart_dir()).unwrap();
            merge(&mut v, o.clone());
            v
        })
        .collect();
    let errors = json_schema_errors(&python, &values_schema(), &instances);
    for ((overrides, want), errs) in cases.iter().zip(&errors) {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "{overrides}: want {want:?}, got {errs:#?}"
        );
    }
}

#[test]
fn the_schema_durations_are_the_ones_the_proxy_parses() {
    let Some(python) = python() else {
        return;
    };
    let samples = [
        "10s", "0", "2500ms", "1.5m", "1h", " 5s", "7", "10x", "-1s", "abc", "1e3s", "",
    ];
    let duration = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": values_schema()["definitions"].clone(),
        "$ref": "#/definitions/duration",
    });
    let instances: Vec<Value> = samples.iter().map(|s| json!(s)).collect();
    let errors = json_schema_errors(&python, &duration, &instances);
    for (s, e) in samples.iter().zip(&errors) {
        let proxy = routing_userspace::config::parse_duration(s).is_ok();
        assert_eq!(
            e.is_empty(),
            proxy,
            "{s:?}: schema {e:?}, proxy accepts: {proxy}"
        );
    }
}
