//! The operator docs against what they talk about. There is no cluster here, so the `kubectl`
//! commands of the runbook and the quickstart cannot be run; instead every name they rely on is
//! checked against the rendered chart (release `flexinfer-proxy` in `flexinfer-system`, as the
//! docs install it) and the proxy's own constants: pod label selectors, `ds/` names, container
//! names, forwarded ports, the Service's DNS name, the Model resource names, the EndpointSlice
//! label, the PodMonitor example, every `flexinfer-proxy` subcommand and flag (run with
//! `--help`), every `--set` value path and every admin path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use flexinfer_tests::chart::{chart_dir, default_values, documents, render};
use flexinfer_tests::proxy_bin;
use serde_json::{json, Value};

const RELEASE: &str = "flexinfer-proxy";
const NAMESPACE: &str = "flexinfer-system";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn doc(name: &str) -> String {
    std::fs::read_to_string(workspace().join("docs").join(name)).unwrap()
}

/// The fenced code blocks of a markdown text (commands and captured output; prose is left out).
fn code(text: &str) -> String {
    text.split("```")
        .skip(1)
        .step_by(2)
        .map(|block| block.split_once('\n').map_or("", |(_, body)| body))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The code of the docs whose commands operators copy.
fn operator_docs() -> Vec<(&'static str, String)> {
    vec![
        ("troubleshooting.md", code(&doc("troubleshooting.md"))),
        ("quickstart.md", code(&doc("quickstart.md"))),
    ]
}

fn rendered() -> Vec<Value> {
    documents(&render(&chart_dir(), RELEASE, NAMESPACE, json!({})).unwrap()).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap()
}

fn pod_labels(docs: &[Value]) -> BTreeMap<String, String> {
    find(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// Every `k=v,k=v` selector in the text that mentions `app.kubernetes.io/` labels.
fn app_selectors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("app.kubernetes.io/") {
        // The selector is the run of selector characters around the match.
        let is_sel = |c: char| c.is_ascii_alphanumeric() || "./-_=,".contains(c);
        let start = text[..i].rfind(|c: char| !is_sel(c)).map_or(0, |j| j + 1);
        let end = text[i..]
            .find(|c: char| !is_sel(c))
            .map_or(text.len(), |j| i + j);
        let s = &text[start..end];
        if s.contains('=') && !out.iter().any(|o| o == s) {
            out.push(s.to_owned());
        }
    }
    out
}

#[test]
fn proxy_pod_selectors_match_the_rendered_daemonset() {
    let docs = rendered();
    let labels = pod_labels(&docs);
    let mut checked = 0;
    let sim: Value = documents(
        &std::fs::read_to_string(workspace().join("docs/examples/sim-backend.yaml")).unwrap(),
    )
    .unwrap()
    .into_iter()
    .find(|d| d["kind"] == "Deployment")
    .unwrap();
    let sim_labels = &sim["spec"]["template"]["metadata"]["labels"];
    for (name, text) in operator_docs() {
        for sel in app_selectors(&text) {
            // The quickstart's model pods (docs/examples/sim-backend.yaml), not the proxy's.
            if sel == "app.kubernetes.io/name=chat-sim" {
                assert_eq!(sim_labels["app.kubernetes.io/name"], "chat-sim");
                continue;
            }
            for pair in sel.split(',') {
                let (k, v) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{name}: {sel}"));
                if !k.starts_with("app.kubernetes.io/") {
                    continue;
                }
                assert_eq!(
                    labels.get(k).map(String::as_str),
                    Some(v),
                    "{name}: selector {sel} does not select the chart's proxy pods {labels:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} selector terms found");
    // The DaemonSet's own selector is what these select on.
    let ds = find(&docs, "DaemonSet");
    for (k, v) in ds["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(labels.get(k).map(String::as_str), v.as_str());
    }
}

#[test]
fn resource_names_ports_and_containers_are_the_charts() {
    let docs = rendered();
    let ds = find(&docs, "DaemonSet");
    let svc = find(&docs, "Service");
    let ds_name = ds["metadata"]["name"].as_str().unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let containers: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let ports: BTreeMap<String, u64> = pod["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    for (name, text) in operator_docs() {
        for forbidden in [
            "deployment/flexinfer-proxy",
            "get endpoints ",
            "describe endpoints ",
            "svc,endpoints",
        ] {
            assert!(!text.contains(forbidden), "{name} uses {forbidden:?}");
        }
        for (i, _) in text.match_indices("ds/") {
            let rest = &text[i + 3..];
            let n: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            assert_eq!(n, ds_name, "{name}: ds/{n}");
        }
        for line in text.lines().filter(|l| l.contains("kubectl ")) {
            for (i, _) in line.match_indices(" -c ") {
                let c: String = line[i + 4..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                assert!(containers.contains(&c.as_str()), "{name}: -c {c}");
            }
        }
        for (i, _) in text.match_indices("port-forward") {
            let line = text[i..].lines().next().unwrap();
            for mapping in line.split_whitespace().filter(|w| w.contains(':')) {
                let remote: u64 = mapping.rsplit(':').next().unwrap().parse().unwrap();
                assert!(
                    ports.values().any(|&p| p == remote),
                    "{name}: port {remote} is not a proxy container port {ports:?}"
                );
            }
        }
    }
    assert_eq!(ports.get("admin"), Some(&9090));
    assert_eq!(ports.get("http"), Some(&8080));
    // The quickstart's in-cluster URL is the chart's Service.
    let url = format!(
        "http://{}.{NAMESPACE}.svc.cluster.local:{}",
        svc["metadata"]["name"].as_str().unwrap(),
        svc["spec"]["ports"][0]["port"]
    );
    assert!(
        doc("quickstart.md").contains(&url),
        "quickstart lacks {url}"
    );
    // The PodMonitor example selects the chart's pods and scrapes a port they have.
    let pm: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(workspace().join("docs/examples/podmonitor.yaml")).unwrap(),
    )
    .unwrap();
    let labels = pod_labels(&docs);
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            labels.get(k).map(String::as_str),
            v.as_str(),
            "PodMonitor {k}"
        );
    }
    assert_eq!(pm["metadata"]["namespace"], NAMESPACE);
    let port = pm["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .unwrap();
    assert!(ports.contains_key(port), "PodMonitor port {port}");
}

#[test]
fn model_and_endpointslice_names_are_the_ones_discovery_uses() {
    let crd: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("crds/models.inference.flexinfer.ai.yaml"))
            .unwrap(),
    )
    .unwrap();
    let names = &crd["spec"]["names"];
    let text = doc("troubleshooting.md");
    assert!(text.contains(&format!(
        "kubectl get {} -n",
        names["singular"].as_str().unwrap()
    )));
    assert!(doc("quickstart.md").contains(&format!(
        "kubectl get {} -n",
        names["plural"].as_str().unwrap()
    )));
    use routing_userspace::discovery::kube::translate::{
        SERVICE_NAME_ANNOTATION, SLICE_SERVICE_LABEL,
    };
    assert!(text.contains(&format!("-l \"{SLICE_SERVICE_LABEL}=$SVC\"")));
    // kubectl's JSONPath escapes the dots of the annotation key.
    let escaped = SERVICE_NAME_ANNOTATION.replace('.', "\\.");
    assert!(
        text.contains(&format!("{{.metadata.annotations.{escaped}}}")),
        "{escaped}"
    );
}

/// `flexinfer-proxy ...` invocations: the subcommand path and the `--flags` on that line.
fn proxy_invocations(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(i) = line.find("flexinfer-proxy ") else {
            continue;
        };
        let words: Vec<&str> = line[i + "flexinfer-proxy ".len()..]
            .split_whitespace()
            .collect();
        let sub: Vec<String> = match words.first().copied() {
            Some(s @ ("serve" | "sim" | "demo")) => vec![s.into()],
            Some(s @ ("ebpf" | "config")) if words.len() > 1 => vec![s.into(), words[1].into()],
            _ => continue,
        };
        let flags = words
            .iter()
            .filter(|w| w.starts_with("--"))
            .map(|w| w.split('=').next().unwrap().to_owned())
            .collect();
        out.push((sub, flags));
    }
    out
}

#[test]
fn every_flexinfer_proxy_command_and_flag_in_the_docs_exists() {
    let mut seen = 0;
    for (name, text) in operator_docs() {
        for (sub, flags) in proxy_invocations(&text) {
            let out = Command::new(proxy_bin())
                .args(&sub)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: flexinfer-proxy {sub:?} does not exist"
            );
            let help = String::from_utf8_lossy(&out.stdout);
            for f in flags {
                assert!(
                    help.contains(&format!("{f} ")) || help.contains(&format!("{f}\n")),
                    "{name}: flexinfer-proxy {} has no {f}",
                    sub.join(" ")
                );
            }
            seen += 1;
        }
    }
    assert!(seen >= 6, "only {seen} invocations found");
}

#[test]
fn every_helm_set_path_is_a_chart_value() {
    let values = default_values(&chart_dir()).unwrap();
    let mut seen = 0;
    for (name, text) in operator_docs()
        .into_iter()
        .chain([("kubernetes.md", doc("kubernetes.md"))])
    {
        for (i, _) in text.match_indices("--set") {
            let rest = text[i..]
                .trim_start_matches("--set-string")
                .trim_start_matches("--set");
            let arg = rest.split_whitespace().next().unwrap().trim_matches('\'');
            let path = arg.split('=').next().unwrap();
            // `a.b\.c` keeps the escaped dot inside one key.
            let keys: Vec<String> = path
                .replace("\\.", "\u{0}")
                .split('.')
                .map(|k| k.replace('\u{0}', "."))
                .collect();
            let mut v = &values;
            for (depth, k) in keys.iter().enumerate() {
                match v.get(k) {
                    Some(next) => v = next,
                    // A free-form map (podAnnotations, nodeSelector): any key below it.
                    None if v.is_object() && depth > 0 && v.as_object().unwrap().is_empty() => {
                        break
                    }
                    None => panic!("{name}: --set {path}: no {k:?} in values.yaml"),
                }
            }
            seen += 1;
        }
    }
    assert!(seen >= 5, "only {seen} --set found");
}

#[test]
fn admin_paths_in_the_docs_are_served() {
    let admin =
        std::fs::read_to_string(workspace().join("routing-userspace/src/admin.rs")).unwrap();
    for (name, text) in operator_docs() {
        for (i, _) in text.match_indices(":9090/") {
            let path: String = text[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/_-".contains(*c))
                .collect();
            assert!(
                admin.contains(&format!("\"{path}\"")),
                "{name}: the admin port does not serve {path}"
            );
        }
    }
}
