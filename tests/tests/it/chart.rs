//! The Helm chart, rendered with its default values and with each knob changed: it lints, it is
//! privileged with a Bidirectional bpffs mount, its RBAC is read-only on exactly the resources
//! discovery watches (three, plus InferencePools and Pods with `proxy.inferencePools`; the
//! fleet's own Pods in the release namespace only, through a Role, unless `proxy.fleetSize`
//! fixes the fleet), and every knob reaches its environment variable.

use flexinfer_tests::chart::{assert_listed, chart_dir, documents, render, yamllint};
use serde_json::{json, Value};

fn rendered(overrides: Value) -> Vec<Value> {
    assert_listed(&overrides);
    let text = render(
        &chart_dir(),
        "flexinfer-proxy",
        "flexinfer-system",
        overrides,
    )
    .expect("render");
    documents(&text).expect("parse")
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

fn proxy_container(docs: &[Value]) -> &Value {
    let ds = find(docs, "DaemonSet");
    ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "proxy")
        .expect("proxy container")
}

fn env(docs: &[Value]) -> Vec<(String, String)> {
    proxy_container(docs)["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let secret = &e["valueFrom"]["secretKeyRef"];
            let v = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some(field) => format!("<{field}>"),
                None if secret.is_object() => format!(
                    "<secret {}/{}>",
                    secret["name"].as_str().unwrap(),
                    secret["key"].as_str().unwrap()
                ),
                None => e["value"]
                    .as_str()
                    .unwrap_or_else(|| panic!("env values are strings: {e}"))
                    .to_owned(),
            };
            (e["name"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

fn env_var(docs: &[Value], name: &str) -> Option<String> {
    env(docs)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

#[test]
fn default_render_lints_clean() {
    for overrides in [
        json!({}),
        json!({"proxy": {"ebpf": {"enabled": false}}, "hostNetwork": true}),
    ] {
        assert_listed(&overrides);
        let text = render(
            &chart_dir(),
            "flexinfer-proxy",
            "flexinfer-system",
            overrides,
        )
        .unwrap();
        match yamllint(&text).unwrap() {
            Some(report) => assert!(
                report.trim().is_empty(),
                "yamllint warnings:\n{report}\n{text}"
            ),
            None => {
                flexinfer_tests::skip("yamllint not installed (set CI to make this an error)");
                return;
            }
        }
    }
    let crd = std::fs::read_to_string(chart_dir().join("crds/models.inference.flexinfer.ai.yaml"))
        .unwrap();
    if let Some(report) = yamllint(&crd).unwrap() {
        assert!(report.trim().is_empty(), "{report}");
    }
}

#[test]
fn renders_the_expected_objects() {
    let docs = rendered(json!({}));
    let mut kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    let crd: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("crds/models.inference.flexinfer.ai.yaml"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["metadata"]["name"], "models.inference.flexinfer.ai");
}

#[test]
fn daemonset_is_privileged_with_bidirectional_bpffs_and_cgroup2() {
    let docs = rendered(json!({}));
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let c = proxy_container(&docs);
    assert_eq!(c["securityContext"]["privileged"], true);
    assert_eq!(c["command"], json!(["flexinfer-proxy", "serve"]));
    let mounts = c["volumeMounts"].as_array().unwrap();
    let bpffs = mounts
        .iter()
        .find(|m| m["name"] == "bpffs")
        .expect("bpffs mount");
    assert_eq!(
        (
            bpffs["mountPath"].as_str(),
            bpffs["mountPropagation"].as_str()
        ),
        (Some("/sys/fs/bpf"), Some("Bidirectional"))
    );
    let cg = mounts
        .iter()
        .find(|m| m["name"] == "cgroup2")
        .expect("cgroup2 mount");
    assert_eq!(
        env_var(&docs, "FLEXINFER_PROXY_CGROUP_PATH").as_deref(),
        cg["mountPath"].as_str()
    );
    let volumes = pod["volumes"].as_array().unwrap();
    let host = |n: &str| {
        volumes.iter().find(|v| v["name"] == n).unwrap()["hostPath"]["path"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(host("bpffs"), "/sys/fs/bpf");
    assert_eq!(host("cgroup2"), "/sys/fs/cgroup");
    // The cgroup2 host path is a knob (hybrid hosts mount it at /sys/fs/cgroup/unified).
    let docs2 = rendered(json!({"proxy": {"ebpf": {"cgroup2HostPath": "/sys/fs/cgroup/unified"}}}));
    let vols = find(&docs2, "DaemonSet")["spec"]["template"]["spec"]["volumes"].clone();
    assert!(vols
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["hostPath"]["path"] == "/sys/fs/cgroup/unified"));
    // The init container mounts bpffs if missing, through the same Bidirectional mount.
    let init = &pod["initContainers"][0];
    assert_eq!(init["securityContext"]["privileged"], true);
    assert!(init["command"]
        .to_string()
        .contains("mount -t bpf bpf /sys/fs/bpf"));
    assert_eq!(init["volumeMounts"][0]["mountPropagation"], "Bidirectional");
    // Probes on the admin port.
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "admin"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    let admin = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .unwrap();
    assert_eq!(admin["containerPort"], 9090);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(
        pod.get("hostNetwork").is_none(),
        "no hostNetwork by default"
    );
}

#[test]
fn ebpf_off_means_userspace_gauge_and_no_privilege() {
    let docs = rendered(json!({"proxy": {"ebpf": {"enabled": false, "require": true}}}));
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let c = proxy_container(&docs);
    assert_eq!(c["securityContext"]["privileged"], Value::Null);
    assert!(
        pod["volumes"].is_null() && pod["initContainers"].is_null() && c["volumeMounts"].is_null()
    );
    assert_eq!(
        env_var(&docs, "FLEXINFER_PROXY_GAUGE").as_deref(),
        Some("userspace")
    );
    assert_eq!(
        env_var(&docs, "FLEXINFER_PROXY_REQUIRE_EBPF").as_deref(),
        Some("false")
    );
    assert_eq!(env_var(&docs, "FLEXINFER_PROXY_CGROUP_PATH"), None);
}

/// Every `(group, resource, verb)` the ClusterRole grants, sorted.
fn grants(docs: &[Value]) -> Vec<(String, String, String)> {
    rules_of(find(docs, "ClusterRole"))
}

/// Every `(group, resource, verb)` of a role's rules, sorted.
fn rules_of(role: &Value) -> Vec<(String, String, String)> {
    let mut grants: Vec<(String, String, String)> = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    grants.push((
                        g.as_str().unwrap().into(),
                        r.as_str().unwrap().into(),
                        v.as_str().unwrap().into(),
                    ));
                }
            }
        }
        assert!(rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none());
    }
    grants.sort();
    grants
}

/// get, list and watch on each `(group, resource)`, sorted.
fn read_only(resources: &[(&str, &str)]) -> Vec<(String, String, String)> {
    let mut want = Vec::new();
    for (g, r) in resources {
        for v in ["get", "list", "watch"] {
            want.push((g.to_string(), r.to_string(), v.to_owned()));
        }
    }
    want.sort();
    want
}

#[test]
fn rbac_is_get_list_watch_on_exactly_what_discovery_watches() {
    let docs = rendered(json!({}));
    assert_eq!(
        grants(&docs),
        read_only(&[
            ("inference.flexinfer.ai", "models"),
            ("discovery.k8s.io", "endpointslices"),
            ("", "services"),
            ("inference.networking.k8s.io", "inferencepools"),
            ("", "pods"),
        ])
    );
    // Without InferencePool discovery: neither pools nor pods.
    let off = rendered(json!({"proxy": {"inferencePools": false}}));
    assert_eq!(
        grants(&off),
        read_only(&[
            ("inference.flexinfer.ai", "models"),
            ("discovery.k8s.io", "endpointslices"),
            ("", "services"),
        ])
    );
    let role = find(&docs, "ClusterRole");
    let binding = find(&docs, "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let sa = find(&docs, "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], "flexinfer-system");
    let ds = find(&docs, "DaemonSet");
    assert_eq!(
        ds["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
}

#[test]
fn the_fleet_role_lists_and_watches_pods_in_the_release_namespace_only() {
    let docs = rendered(json!({}));
    let role = find(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "flexinfer-system");
    let mut want = vec![
        ("".to_owned(), "pods".to_owned(), "list".to_owned()),
        ("".to_owned(), "pods".to_owned(), "watch".to_owned()),
    ];
    want.sort();
    assert_eq!(rules_of(role), want);
    let binding = find(&docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "flexinfer-system");
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]})
    );
    let sa = find(&docs, "ServiceAccount");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "flexinfer-system"}])
    );
    // The proxy counts exactly the DaemonSet's pods, in the namespace the Role covers.
    let selector: Vec<String> = find(&docs, "DaemonSet")["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    let fleet = env_var(&docs, "FLEXINFER_PROXY_FLEET_SELECTOR").unwrap();
    let mut terms: Vec<&str> = fleet.split(',').collect();
    terms.sort();
    assert_eq!(terms, selector);
    assert_eq!(
        env_var(&docs, "FLEXINFER_PROXY_FLEET_NAMESPACE").as_deref(),
        Some("<metadata.namespace>")
    );
    // A fixed fleet size needs no pod access.
    let fixed = rendered(json!({"proxy": {"fleetSize": 10}}));
    assert!(!fixed
        .iter()
        .any(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding"));
}

#[test]
fn service_keeps_traffic_on_the_node() {
    let docs = rendered(json!({}));
    let svc = find(&docs, "Service");
    assert_eq!(svc["spec"]["internalTrafficPolicy"], "Local");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    let ds = find(&docs, "DaemonSet");
    assert_eq!(
        svc["spec"]["selector"],
        ds["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        ds["spec"]["template"]["metadata"]["labels"],
        ds["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn defaults_reach_their_env_vars() {
    let docs = rendered(json!({}));
    for (name, want) in [
        ("PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH", "128"),
        ("PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH", "512"),
        ("PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH", "256"),
        ("FLEXINFER_PROXY_LABEL_GROUP_ROUTING", "round-robin"),
        ("PROXY_LEAST_LOADED_RESERVATION_TTL", "10s"),
        ("FLEXINFER_PROXY_HASH_BALANCE_FACTOR", "1.15"),
        ("FLEXINFER_PROXY_HASH_BALANCE_FLOOR", "4"),
        ("FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR", "1.6"),
        ("FLEXINFER_PROXY_SESSION_BALANCE_FACTOR", "1.5"),
        ("FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET", "16MiB"),
        ("FLEXINFER_PROXY_ROUTE_HEADER", "false"),
        ("FLEXINFER_PROXY_GAUGE", "auto"),
        ("FLEXINFER_PROXY_REQUIRE_EBPF", "false"),
        ("FLEXINFER_PROXY_DISCOVERY", "kubernetes"),
        ("FLEXINFER_PROXY_NAMESPACE", ""),
        ("FLEXINFER_PROXY_SERVICE_LABEL_KEY", "flexinfer.ai/service"),
        ("FLEXINFER_PROXY_INFERENCE_POOLS", "true"),
        ("FLEXINFER_PROXY_FLEET_SIZE", "0"),
        (
            "FLEXINFER_PROXY_FLEET_SELECTOR",
            "app.kubernetes.io/name=flexinfer-proxy,app.kubernetes.io/instance=flexinfer-proxy",
        ),
        ("FLEXINFER_PROXY_FLEET_NAMESPACE", "<metadata.namespace>"),
        ("FLEXINFER_PROXY_LISTEN", "0.0.0.0:8080"),
        ("POD_IP", "<status.podIP>"),
        ("FLEXINFER_PROXY_ADMIN_LISTEN", "$(POD_IP):9090"),
        ("FLEXINFER_PROXY_FIRST_BYTE_TIMEOUT", "300s"),
        ("FLEXINFER_PROXY_STREAM_IDLE_TIMEOUT", "60s"),
        ("FLEXINFER_PROXY_HEADER_READ_TIMEOUT", "30s"),
        ("FLEXINFER_PROXY_REQUEST_TIMEOUT", "0"),
        ("FLEXINFER_PROXY_MAX_HEADER_BYTES", "65536"),
        ("FLEXINFER_PROXY_MAX_CLIENT_CONNECTIONS", "16384"),
        ("FLEXINFER_PROXY_RETRY_BUDGET", "0.2"),
        ("FLEXINFER_PROXY_EJECT_AFTER_FAILURES", "5"),
        ("FLEXINFER_PROXY_MAX_EJECTED_SHARE", "0.5"),
        ("FLEXINFER_PROXY_SHUTDOWN_DELAY", "5s"),
        ("FLEXINFER_PROXY_DRAIN_TIMEOUT", "30s"),
        ("FLEXINFER_PROXY_CGROUP_PATH", "/run/flexinfer/cgroup2"),
        ("FLEXINFER_PROXY_QUEUE_MAX_SIZE", "1000"),
        ("FLEXINFER_PROXY_QUEUE_TIMEOUT", "30s"),
        ("FLEXINFER_PROXY_QUEUE_SHEDDABLE_TIMEOUT", "5s"),
        ("FLEXINFER_PROXY_FULL_WHEN_WAITING_ABOVE", "0"),
        ("FLEXINFER_PROXY_FULL_WHEN_KV_USAGE_ABOVE", "0.95"),
        ("FLEXINFER_PROXY_TENANT_METRIC_CAP", "100"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
        ("OTEL_SERVICE_NAME", "flexinfer-proxy"),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        ("OTEL_TRACES_SAMPLER_ARG", ""),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
        ("OTEL_BSP_SCHEDULE_DELAY", "5000"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "10000"),
        ("RUST_LOG", "info"),
    ] {
        assert_eq!(env_var(&docs, name).as_deref(), Some(want), "{name}");
    }
}

#[test]
fn every_knob_changes_its_env_var() {
    for (overrides, name, want) in [
        (
            json!({"proxy": {"routing": {"explicitKeyMaxLength": 64}}}),
            "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
            "64",
        ),
        (
            json!({"proxy": {"serviceLabelKey": "example.com/group"}}),
            "FLEXINFER_PROXY_SERVICE_LABEL_KEY",
            "example.com/group",
        ),
        (
            json!({"proxy": {"routing": {"systemSegmentMaxLength": 1024}}}),
            "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
            "1024",
        ),
        (
            json!({"proxy": {"routing": {"documentSegmentMaxLength": 77}}}),
            "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
            "77",
        ),
        (
            json!({"proxy": {"routing": {"labelGroupMode": "least-loaded"}}}),
            "FLEXINFER_PROXY_LABEL_GROUP_ROUTING",
            "least-loaded",
        ),
        (
            json!({"proxy": {"routing": {"leastLoadedReservationTTL": "0"}}}),
            "PROXY_LEAST_LOADED_RESERVATION_TTL",
            "0",
        ),
        (
            json!({"proxy": {"routing": {"leastLoadedReservationTTL": "2500ms"}}}),
            "PROXY_LEAST_LOADED_RESERVATION_TTL",
            "2500ms",
        ),
        (
            json!({"proxy": {"routing": {"hashBalanceFactor": 1.5}}}),
            "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
            "1.5",
        ),
        (
            json!({"proxy": {"routing": {"hashBalanceFactor": 0}}}),
            "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
            "0",
        ),
        (
            json!({"proxy": {"routing": {"hashBalanceFloor": 8}}}),
            "FLEXINFER_PROXY_HASH_BALANCE_FLOOR",
            "8",
        ),
        (
            json!({"proxy": {"routing": {"cacheAwareBalanceFactor": 2}}}),
            "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
            "2",
        ),
        (
            json!({"proxy": {"routing": {"cacheAwareIndexBudget": "64MiB"}}}),
            "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET",
            "64MiB",
        ),
        (
            json!({"proxy": {"routing": {"routeHeader": true}}}),
            "FLEXINFER_PROXY_ROUTE_HEADER",
            "true",
        ),
        (
            json!({"proxy": {"ebpf": {"gauge": "ebpf"}}}),
            "FLEXINFER_PROXY_GAUGE",
            "ebpf",
        ),
        (
            json!({"proxy": {"ebpf": {"enabled": false}}}),
            "FLEXINFER_PROXY_GAUGE",
            "userspace",
        ),
        (
            json!({"proxy": {"ebpf": {"require": true}}}),
            "FLEXINFER_PROXY_REQUIRE_EBPF",
            "true",
        ),
        (
            json!({"proxy": {"ebpf": {"cgroupMountPath": "/cg"}}}),
            "FLEXINFER_PROXY_CGROUP_PATH",
            "/cg",
        ),
        (
            json!({"proxy": {"discovery": "file"}}),
            "FLEXINFER_PROXY_DISCOVERY",
            "file",
        ),
        (
            json!({"proxy": {"watchNamespace": "models"}}),
            "FLEXINFER_PROXY_NAMESPACE",
            "models",
        ),
        (
            json!({"proxy": {"inferencePools": false}}),
            "FLEXINFER_PROXY_INFERENCE_POOLS",
            "false",
        ),
        (
            json!({"proxy": {"fleetSize": 10}}),
            "FLEXINFER_PROXY_FLEET_SIZE",
            "10",
        ),
        (
            json!({"proxy": {"ports": {"http": 18080}}}),
            "FLEXINFER_PROXY_LISTEN",
            "0.0.0.0:18080",
        ),
        (
            json!({"proxy": {"bindAddress": "[::]"}}),
            "FLEXINFER_PROXY_LISTEN",
            "[::]:8080",
        ),
        (
            json!({"proxy": {"ports": {"admin": 19090}}}),
            "FLEXINFER_PROXY_ADMIN_LISTEN",
            "$(POD_IP):19090",
        ),
        (
            json!({"proxy": {"adminBindAddress": "0.0.0.0"}}),
            "FLEXINFER_PROXY_ADMIN_LISTEN",
            "0.0.0.0:9090",
        ),
        (
            json!({"proxy": {"logLevel": "info,flexinfer=debug"}}),
            "RUST_LOG",
            "info,flexinfer=debug",
        ),
        (
            json!({"proxy": {"admission": {"queueMaxSize": 0}}}),
            "FLEXINFER_PROXY_QUEUE_MAX_SIZE",
            "0",
        ),
        (
            json!({"proxy": {"admission": {"queueTimeout": "2m"}}}),
            "FLEXINFER_PROXY_QUEUE_TIMEOUT",
            "2m",
        ),
        (
            json!({"proxy": {"admission": {"queueSheddableTimeout": "500ms"}}}),
            "FLEXINFER_PROXY_QUEUE_SHEDDABLE_TIMEOUT",
            "500ms",
        ),
        (
            json!({"proxy": {"admission": {"fullWhenWaitingAbove": "off"}}}),
            "FLEXINFER_PROXY_FULL_WHEN_WAITING_ABOVE",
            "off",
        ),
        (
            json!({"proxy": {"admission": {"fullWhenKvUsageAbove": 0.8}}}),
            "FLEXINFER_PROXY_FULL_WHEN_KV_USAGE_ABOVE",
            "0.8",
        ),
        (
            json!({"proxy": {"admission": {"tenantMetricCap": 10}}}),
            "FLEXINFER_PROXY_TENANT_METRIC_CAP",
            "10",
        ),
        (
            json!({"proxy": {"tracing": {"endpoint": "http://otel-collector:4318"}}}),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector:4318",
        ),
        (
            json!({"proxy": {"tracing": {"tracesEndpoint": "http://c:4318/v1/traces"}}}),
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        ),
        (
            json!({"proxy": {"tracing": {"serviceName": "edge-proxy"}}}),
            "OTEL_SERVICE_NAME",
            "edge-proxy",
        ),
        (
            json!({"proxy": {"tracing": {"sampler": "parentbased_traceidratio"}}}),
            "OTEL_TRACES_SAMPLER",
            "parentbased_traceidratio",
        ),
        (
            json!({"proxy": {"tracing": {"samplerArg": "0.05"}}}),
            "OTEL_TRACES_SAMPLER_ARG",
            "0.05",
        ),
        (
            json!({"proxy": {"tracing": {"queueSize": 8192}}}),
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "8192",
        ),
        (
            json!({"proxy": {"tracing": {"batchSize": 128}}}),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "128",
        ),
        (
            json!({"proxy": {"tracing": {"scheduleDelayMillis": 250}}}),
            "OTEL_BSP_SCHEDULE_DELAY",
            "250",
        ),
        (
            json!({"proxy": {"tracing": {"exportTimeoutMillis": 3000}}}),
            "OTEL_BSP_EXPORT_TIMEOUT",
            "3000",
        ),
        (
            json!({"proxy": {"tracing": {"compression": "gzip"}}}),
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "gzip",
        ),
    ] {
        let docs = rendered(overrides.clone());
        assert_eq!(
            env_var(&docs, name).as_deref(),
            Some(want),
            "{overrides} -> {name}"
        );
    }
    // Ports follow too.
    let docs = rendered(json!({"proxy": {"ports": {"http": 18080, "admin": 19090}}}));
    let ports = proxy_container(&docs)["ports"].clone();
    assert_eq!(ports[0]["containerPort"], 18080);
    assert_eq!(ports[1]["containerPort"], 19090);
    // extraEnv is appended.
    let docs = rendered(json!({"proxy": {"extraEnv": [{"name": "EXTRA", "value": "1"}]}}));
    assert_eq!(env_var(&docs, "EXTRA").as_deref(), Some("1"));
}

#[test]
fn an_https_collector_gets_its_ca_from_a_configmap_and_its_headers_from_a_secret() {
    let docs = rendered(json!({"proxy": {"tracing": {
        "endpoint": "https://otel.example.com",
        "caConfigMap": "otel-ca",
        "headersSecret": {"name": "otel-auth"},
    }}}));
    let want_ca = "/etc/flexinfer-proxy/otlp-ca/ca.crt";
    assert_eq!(
        env_var(&docs, "OTEL_EXPORTER_OTLP_CERTIFICATE").as_deref(),
        Some(want_ca)
    );
    assert_eq!(
        env_var(&docs, "OTEL_EXPORTER_OTLP_HEADERS").as_deref(),
        Some("<secret otel-auth/headers>")
    );
    let mounts = proxy_container(&docs)["volumeMounts"]
        .as_array()
        .unwrap()
        .clone();
    let ca = mounts
        .iter()
        .find(|m| m["name"] == "otlp-ca")
        .expect("CA mount");
    assert_eq!(ca["mountPath"], "/etc/flexinfer-proxy/otlp-ca");
    assert_eq!(ca["readOnly"], true);
    assert!(
        mounts.iter().any(|m| m["name"] == "bpffs"),
        "eBPF mounts stay"
    );
    let ds = find(&docs, "DaemonSet");
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let v = volumes
        .iter()
        .find(|v| v["name"] == "otlp-ca")
        .expect("CA volume");
    assert_eq!(v["configMap"]["name"], "otel-ca");
    // Without eBPF the CA mount is the only one; without a CA there is no header or mount.
    let docs = rendered(
        json!({"proxy": {"ebpf": {"enabled": false}, "tracing": {"caConfigMap": "otel-ca", "caKey": "bundle.pem"}}}),
    );
    let mounts = proxy_container(&docs)["volumeMounts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(
        env_var(&docs, "OTEL_EXPORTER_OTLP_CERTIFICATE").as_deref(),
        Some("/etc/flexinfer-proxy/otlp-ca/bundle.pem")
    );
    let docs = rendered(json!({}));
    assert_eq!(env_var(&docs, "OTEL_EXPORTER_OTLP_CERTIFICATE"), None);
    assert_eq!(env_var(&docs, "OTEL_EXPORTER_OTLP_HEADERS"), None);
    assert!(!proxy_container(&docs)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "otlp-ca"));
}

#[test]
fn host_network_is_a_knob() {
    let docs = rendered(json!({"hostNetwork": true}));
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
}
