//! Renders the Helm chart without helm (there is no helm binary on these machines).
//!
//! Templates go through `gtmpl`, a Go text/template engine, with the few Helm functions the chart
//! uses supplied here: `quote`, `default`, `toYaml`, `indent`, `nindent`. That is why the chart
//! sticks to that subset (no `include`/`define` helpers, no Sprig beyond those five). Values are
//! `values.yaml` deep-merged with per-test overrides, like `helm template --set`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use gtmpl::{Context, FuncError, Template, Value as G};
use serde_json::{json, Value};

/// The chart directory in this workspace.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/flexinfer-proxy")
}

/// Overrides `base` with `over`, objects merged key by key (Helm's values semantics).
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// The chart's default values.
pub fn default_values(chart: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(chart.join("values.yaml")).context("reading values.yaml")?;
    serde_yaml_ng::from_str(&text).context("parsing values.yaml")
}

fn to_gtmpl(v: &Value) -> G {
    match v {
        Value::Null => G::Nil,
        Value::Bool(b) => G::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => G::from(i),
            (_, Some(u)) => G::from(u),
            _ => G::from(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => G::String(s.clone()),
        Value::Array(a) => G::Array(a.iter().map(to_gtmpl).collect()),
        Value::Object(o) => G::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), to_gtmpl(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn from_gtmpl(v: &G) -> Value {
    match v {
        G::NoValue | G::Nil | G::Function(_) => Value::Null,
        G::Bool(b) => json!(b),
        G::String(s) => json!(s),
        G::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => json!(i),
            (_, Some(u)) => json!(u),
            _ => json!(n.as_f64()),
        },
        G::Array(a) => Value::Array(a.iter().map(from_gtmpl).collect()),
        G::Object(o) | G::Map(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), from_gtmpl(v))).collect())
        }
    }
}

fn scalar_string(v: &G) -> String {
    match v {
        G::NoValue | G::Nil => String::new(),
        G::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn arg_count(name: &str, args: &[G], n: usize) -> Result<(), FuncError> {
    if args.len() == n {
        Ok(())
    } else {
        Err(FuncError::ExactlyXArgs(name.into(), n))
    }
}

fn indent_by(args: &[G], name: &str) -> Result<(usize, String), FuncError> {
    arg_count(name, args, 2)?;
    let n = match &args[0] {
        G::Number(n) => n.as_u64().ok_or(FuncError::UnableToConvertFromValue)? as usize,
        _ => return Err(FuncError::UnableToConvertFromValue),
    };
    let pad = " ".repeat(n);
    let text = scalar_string(&args[1]);
    Ok((
        n,
        text.lines()
            .map(|l| format!("{pad}{l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    ))
}

/// Helm's `quote`: the value's string form in double quotes.
fn quote(args: &[G]) -> Result<G, FuncError> {
    arg_count("quote", args, 1)?;
    Ok(G::String(
        serde_json::to_string(&scalar_string(&args[0])).expect("string"),
    ))
}

/// Helm's `default DEFAULT VALUE`: VALUE unless it is empty (nil, "", false, 0, empty list/map).
fn default(args: &[G]) -> Result<G, FuncError> {
    arg_count("default", args, 2)?;
    let empty = match &args[1] {
        G::NoValue | G::Nil => true,
        G::Bool(b) => !b,
        G::String(s) => s.is_empty(),
        G::Array(a) => a.is_empty(),
        G::Object(o) | G::Map(o) => o.is_empty(),
        G::Number(n) => n.as_f64() == Some(0.0),
        G::Function(_) => false,
    };
    Ok(if empty {
        args[0].clone()
    } else {
        args[1].clone()
    })
}

/// Helm's `toYaml` (keys sorted, no trailing newline).
fn to_yaml(args: &[G]) -> Result<G, FuncError> {
    arg_count("toYaml", args, 1)?;
    let yaml = serde_yaml_ng::to_string(&from_gtmpl(&args[0]))
        .map_err(|e| FuncError::Generic(e.to_string()))?;
    Ok(G::String(yaml.trim_end().to_owned()))
}

fn indent(args: &[G]) -> Result<G, FuncError> {
    Ok(G::String(indent_by(args, "indent")?.1))
}

fn nindent(args: &[G]) -> Result<G, FuncError> {
    Ok(G::String(format!("\n{}", indent_by(args, "nindent")?.1)))
}

/// Renders every `templates/*.yaml` of the chart with `values.yaml` merged with `overrides`, like
/// `helm template <release> <chart> --namespace <ns>`; documents are separated by `---`.
pub fn render(
    chart: &Path,
    release: &str,
    namespace: &str,
    overrides: Value,
) -> anyhow::Result<String> {
    let mut values = default_values(chart)?;
    merge(&mut values, overrides);
    let meta: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    let context = json!({
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": true},
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]},
    });
    let context = Context::from(to_gtmpl(&context));
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart.join("templates"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut out = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let mut t = Template::default();
        t.add_funcs(&[
            ("quote", quote as gtmpl::Func),
            ("default", default as gtmpl::Func),
            ("toYaml", to_yaml as gtmpl::Func),
            ("indent", indent as gtmpl::Func),
            ("nindent", nindent as gtmpl::Func),
        ]);
        t.parse(text)
            .map_err(|e| anyhow::anyhow!("parsing {name}: {e}"))?;
        let rendered = t
            .render(&context)
            .map_err(|e| anyhow::anyhow!("rendering {name}: {e}"))?;
        if rendered.trim().is_empty() {
            continue;
        }
        out.push_str(&format!(
            "---\n# Source: flexinfer-proxy/templates/{name}\n"
        ));
        out.push_str(rendered.trim_start_matches('\n').trim_end());
        out.push('\n');
    }
    Ok(out)
}

/// The rendered documents, parsed (empty documents dropped).
pub fn documents(rendered: &str) -> anyhow::Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(rendered) {
        let v: Value =
            serde::Deserialize::deserialize(doc).context("rendered YAML does not parse")?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// The yamllint configuration the chart is held to.
pub const YAMLLINT_CONFIG: &str = "{extends: default, rules: {line-length: {max: 160}, document-start: disable, comments: {min-spaces-from-content: 1}, indentation: {spaces: 2, indent-sequences: whatever}}}";

/// Runs yamllint on `text`. `Ok(None)` when yamllint is not installed and CI is not set; with
/// CI set a missing yamllint is an error, so CI cannot pass without linting.
pub fn yamllint(text: &str) -> anyhow::Result<Option<String>> {
    use std::io::Write;
    let child = Command::new("yamllint")
        .args(["-f", "parsable", "-d", YAMLLINT_CONFIG, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var_os("CI").is_some() {
                bail!("yamllint is not installed (apt-get install -y yamllint) and CI is set");
            }
            return Ok(None);
        }
        Err(e) => return Err(e).context("running yamllint"),
    };
    child.stdin.take().unwrap().write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("yamllint failed:\n{report}");
    }
    Ok(Some(report))
}

/// Every set of value overrides the chart tests render (`tests/tests/it/chart.rs` asserts that
/// each one it uses is listed here), plus the container tests' shape. The manifest tests
/// validate each against the Kubernetes schemas and `values.schema.json`, so a variant the
/// chart tests cover is one the API server would accept.
pub fn variants() -> Vec<Value> {
    vec![
        json!({}),
        json!({"proxy": {"ebpf": {"enabled": false}}, "hostNetwork": true}),
        json!({"proxy": {"ebpf": {"cgroup2HostPath": "/sys/fs/cgroup/unified"}}}),
        json!({"proxy": {"ebpf": {"enabled": false, "require": true}}}),
        json!({"proxy": {"routing": {"explicitKeyMaxLength": 64}}}),
        json!({"proxy": {"serviceLabelKey": "example.com/group"}}),
        json!({"proxy": {"routing": {"systemSegmentMaxLength": 1024}}}),
        json!({"proxy": {"routing": {"documentSegmentMaxLength": 77}}}),
        json!({"proxy": {"routing": {"labelGroupMode": "least-loaded"}}}),
        json!({"proxy": {"routing": {"leastLoadedReservationTTL": "0"}}}),
        json!({"proxy": {"routing": {"leastLoadedReservationTTL": "2500ms"}}}),
        json!({"proxy": {"routing": {"hashBalanceFactor": 1.5}}}),
        json!({"proxy": {"routing": {"hashBalanceFactor": 0}}}),
        json!({"proxy": {"routing": {"hashBalanceFloor": 8}}}),
        json!({"proxy": {"routing": {"cacheAwareBalanceFactor": 2}}}),
        json!({"proxy": {"routing": {"cacheAwareIndexBudget": "64MiB"}}}),
        json!({"proxy": {"routing": {"routeHeader": true}}}),
        json!({"proxy": {"ebpf": {"gauge": "ebpf"}}}),
        json!({"proxy": {"ebpf": {"enabled": false}}}),
        json!({"proxy": {"ebpf": {"require": true}}}),
        json!({"proxy": {"ebpf": {"cgroupMountPath": "/cg"}}}),
        json!({"proxy": {"discovery": "file"}}),
        json!({"proxy": {"watchNamespace": "models"}}),
        json!({"proxy": {"inferencePools": false}}),
        json!({"proxy": {"fleetSize": 10}}),
        json!({"proxy": {"ports": {"http": 18080}}}),
        json!({"proxy": {"bindAddress": "[::]"}}),
        json!({"proxy": {"ports": {"admin": 19090}}}),
        json!({"proxy": {"logLevel": "info,flexinfer=debug"}}),
        json!({"proxy": {"ports": {"http": 18080, "admin": 19090}}}),
        json!({"proxy": {"extraEnv": [{"name": "EXTRA", "value": "1"}]}}),
        json!({"hostNetwork": true}),
        json!({"proxy": {"adminBindAddress": "0.0.0.0"}}),
        json!({"proxy": {"admission": {"queueMaxSize": 0}}}),
        json!({"proxy": {"admission": {"queueTimeout": "2m"}}}),
        json!({"proxy": {"admission": {"queueSheddableTimeout": "500ms"}}}),
        json!({"proxy": {"admission": {"fullWhenWaitingAbove": "off"}}}),
        json!({"proxy": {"admission": {"fullWhenKvUsageAbove": 0.8}}}),
        json!({"proxy": {"admission": {"tenantMetricCap": 10}}}),
        json!({"proxy": {"tracing": {"endpoint": "http://otel-collector:4318"}}}),
        json!({"proxy": {"tracing": {"tracesEndpoint": "http://c:4318/v1/traces"}}}),
        json!({"proxy": {"tracing": {"serviceName": "edge-proxy"}}}),
        json!({"proxy": {"tracing": {"sampler": "parentbased_traceidratio"}}}),
        json!({"proxy": {"tracing": {"samplerArg": "0.05"}}}),
        json!({"proxy": {"tracing": {"queueSize": 8192}}}),
        json!({"proxy": {"tracing": {"batchSize": 128}}}),
        json!({"proxy": {"tracing": {"scheduleDelayMillis": 250}}}),
        json!({"proxy": {"tracing": {"exportTimeoutMillis": 3000}}}),
        json!({"proxy": {"tracing": {"compression": "gzip"}}}),
        json!({"proxy": {"tracing": {
            "endpoint": "https://otel.example.com",
            "caConfigMap": "otel-ca",
            "headersSecret": {"name": "otel-auth"},
        }}}),
        json!({"proxy": {"ebpf": {"enabled": false}, "tracing": {"caConfigMap": "otel-ca", "caKey": "bundle.pem"}}}),
        json!({"proxy": {
            "adminBindAddress": "0.0.0.0",
            "timeouts": {"connect": "500ms", "firstByte": "2m", "streamIdle": "15s",
                         "headerRead": "5s", "request": "1h", "upstreamIdle": "1s"},
            "limits": {"maxBodyBytes": 1048576, "maxHeaderBytes": 16384,
                       "maxClientConnections": 100, "maxJsonDepth": 32},
            "resilience": {"maxPodAttempts": 2, "retryBudget": 0.1, "retryMinPerSecond": 1,
                           "ejectAfterFailures": 0, "ejectBaseTime": "30s",
                           "maxEjectedShare": 0.25},
            "shutdown": {"delay": "0", "drain": "2m"},
            "admission": {"queueMaxSize": 0, "queueTimeout": "1m", "queueSheddableTimeout": "2s",
                          "fullWhenWaitingAbove": "off", "fullWhenKvUsageAbove": 0.9,
                          "tenantMetricCap": 7},
        }}),
        // What the container tests render (their ports and paths vary per test).
        json!({
            "hostNetwork": true,
            "proxy": {
                "bindAddress": "127.0.0.1",
                "ports": {"http": 40001, "admin": 40002},
                "discovery": "file",
                "logLevel": "info,routing_userspace=debug",
                "ebpf": {"cgroup2HostPath": "/sys/fs/cgroup/unified/flexinfer-ctest-node"},
                "extraEnv": [
                    {"name": "FLEXINFER_PROXY_CONFIG", "value": "/etc/flexinfer/models.yaml"},
                    {"name": "FLEXINFER_PROXY_CONFIG_POLL", "value": "100ms"},
                    {"name": "FLEXINFER_PROXY_BPF_PIN_DIR", "value": "/sys/fs/bpf/flexinfer-ctest-pins"},
                ],
            },
        }),
    ]
}

/// Panics unless `overrides` is one of [`variants`].
pub fn assert_listed(overrides: &Value) {
    assert!(
        variants().contains(overrides),
        "add {overrides} to flexinfer_tests::chart::variants() so the manifest tests validate it"
    );
}
