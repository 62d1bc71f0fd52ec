//! The chart's environment, expanded the way the kubelet does (`fieldRef: status.podIP` and
//! `metadata.namespace`, `$(VAR)` references) and parsed by the proxy's own `serve` argument parser: every value the
//! chart can render is one the proxy accepts and means what the values file says.
//!
//! The environment goes to the parser as a map, not through the process environment (which the
//! other tests of this binary share): see [`parse_serve_env`].

use std::collections::HashMap;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};
use flexinfer_tests::chart::{chart_dir, documents, render};
use routing_userspace::config::settings::admission_defaults;
use routing_userspace::config::ServeArgs;
use serde_json::{json, Value};

/// The release namespace the chart is rendered in (and the pods' `metadata.namespace`).
const NAMESPACE: &str = "flexinfer-system";

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

/// `serve`'s own parser (its flags, value parsers and defaults) reading `env` as the process
/// environment. clap reads an argument's variable when the command is built and feeds its
/// value to the argument exactly as it feeds a default (one raw value through the argument's
/// value parser), so each argument's variable is dropped and the map's value, if any, becomes
/// its default. The process environment is never read: nothing set outside the test leaks in.
fn parse_serve_env(env: &HashMap<String, String>) -> Result<ServeArgs, clap::Error> {
    let cmd = Serve::command().mut_args(|arg| {
        let value = arg
            .get_env()
            .and_then(|name| env.get(name.to_str()?))
            .cloned();
        let arg = arg.env(None::<&'static str>);
        match value {
            // clap keeps defaults as `'static` text; a test parses a handful of them.
            Some(v) => arg.default_value(&*String::leak(v)),
            None => arg,
        }
    });
    let matches = cmd.try_get_matches_from(["serve"])?;
    Serve::from_arg_matches(&matches).map(|s| s.args)
}

/// The proxy container's env as the kubelet hands it to the process.
fn kubelet_env(docs: &[Value], pod_ip: &str) -> Vec<(String, String)> {
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let c = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "proxy")
        .unwrap();
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &seen)
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.podIP") => pod_ip.to_owned(),
                Some("metadata.namespace") => NAMESPACE.to_owned(),
                Some("metadata.name") => "flexinfer-proxy-x7k2p".to_owned(),
                _ => panic!("only the pod IP, namespace and name come from the downward API: {e}"),
            }
        };
        seen.insert(name.clone(), value.clone());
        out.push((name, value));
    }
    out
}

/// `$(NAME)` replaced by an earlier variable, as the kubelet does.
fn expand(v: &str, seen: &HashMap<String, String>) -> String {
    let mut out = v.to_owned();
    for (k, val) in seen {
        out = out.replace(&format!("$({k})"), val);
    }
    assert!(!out.contains("$("), "unresolved reference in {v:?}");
    out
}

fn parse(overrides: Value, pod_ip: &str) -> ServeArgs {
    let text = render(&chart_dir(), "flexinfer-proxy", NAMESPACE, overrides).unwrap();
    let env = kubelet_env(&documents(&text).unwrap(), pod_ip);
    let map: HashMap<String, String> = env.iter().cloned().collect();
    parse_serve_env(&map).unwrap_or_else(|e| panic!("{env:#?}\n{e}"))
}

#[test]
fn every_rendered_env_parses_as_the_proxy_reads_it() {
    // Defaults: admin on the pod's address; the deadlines and limits the values file states.
    let a = parse(json!({}), "10.1.2.3");
    assert_eq!(a.admin_listen.to_string(), "10.1.2.3:9090");
    assert_eq!(a.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(a.timeouts.first_byte_timeout.0, Duration::from_secs(300));
    assert_eq!(a.timeouts.stream_idle_timeout.0, Duration::from_secs(60));
    assert_eq!(a.timeouts.header_read_timeout.0, Duration::from_secs(30));
    assert_eq!(a.timeouts.request_timeout.0, Duration::ZERO);
    assert_eq!(a.connect_timeout.0, Duration::from_secs(2));
    assert_eq!(a.upstream_idle_timeout.0, Duration::from_secs(4));
    assert_eq!(a.max_body_bytes, 32 << 20);
    assert_eq!(a.limits.max_header_bytes, 64 << 10);
    assert_eq!(a.limits.max_client_connections, 16_384);
    assert_eq!(a.limits.max_json_depth, 128);
    assert_eq!(a.routing.max_pod_attempts, 3);
    assert_eq!(a.resilience.retry_budget, 0.2);
    assert_eq!(a.resilience.retry_min_per_second, 5);
    assert_eq!(a.resilience.eject_after_failures, 5);
    assert_eq!(a.resilience.eject_base_time.0, Duration::from_secs(10));
    assert_eq!(a.resilience.max_ejected_share, 0.5);
    assert_eq!(a.shutdown_delay.0, Duration::from_secs(5));
    assert_eq!(a.drain_timeout.0, Duration::from_secs(30));
    assert!(a.inference_pools);
    // The fleet: this release's DaemonSet pods in the pod's namespace, counted (no fixed size).
    assert_eq!(a.signals.fleet_size, 0);
    assert_eq!(
        a.signals.fleet_selector,
        "app.kubernetes.io/name=flexinfer-proxy,app.kubernetes.io/instance=flexinfer-proxy"
    );
    assert_eq!(a.signals.fleet_namespace, NAMESPACE);
    // Its own pod's name ranks it among them.
    assert_eq!(a.signals.fleet_pod_name, "flexinfer-proxy-x7k2p");
    let fixed = parse(json!({"proxy": {"fleetSize": 10}}), "10.1.2.3");
    assert_eq!(fixed.signals.fleet_size, 10);
    assert!(!parse(json!({"proxy": {"inferencePools": false}}), "10.1.2.3").inference_pools);
    assert_eq!(
        admission_defaults(&a.admission),
        routing_userspace::admission::AdmissionDefaults::default()
    );

    // The grace period outlasts the shutdown delay plus the drain, or the kubelet's SIGKILL
    // would cut streams that were still draining.
    let values = flexinfer_tests::chart::default_values(&chart_dir()).unwrap();
    let grace = Duration::from_secs(values["terminationGracePeriodSeconds"].as_u64().unwrap());
    assert!(
        grace > a.shutdown_delay.0 + a.drain_timeout.0,
        "grace {grace:?} <= delay {:?} + drain {:?}",
        a.shutdown_delay.0,
        a.drain_timeout.0
    );

    // An IPv6 pod: "$(POD_IP):9090" expands to a bare address before the port.
    let a = parse(json!({}), "fd00::5");
    assert_eq!(a.admin_listen.to_string(), "[fd00::5]:9090");

    // A literal admin host and every knob changed.
    let a = parse(
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
        "10.1.2.3",
    );
    assert_eq!(a.admin_listen.to_string(), "0.0.0.0:9090");
    assert_eq!(a.connect_timeout.0, Duration::from_millis(500));
    assert_eq!(a.timeouts.first_byte_timeout.0, Duration::from_secs(120));
    assert_eq!(a.timeouts.stream_idle_timeout.0, Duration::from_secs(15));
    assert_eq!(a.timeouts.header_read_timeout.0, Duration::from_secs(5));
    assert_eq!(a.timeouts.request_timeout.0, Duration::from_secs(3600));
    assert_eq!(a.upstream_idle_timeout.0, Duration::from_secs(1));
    assert_eq!(a.max_body_bytes, 1 << 20);
    assert_eq!(a.limits.max_header_bytes, 16 << 10);
    assert_eq!(a.limits.max_client_connections, 100);
    assert_eq!(a.limits.max_json_depth, 32);
    assert_eq!(a.routing.max_pod_attempts, 2);
    assert_eq!(a.resilience.retry_budget, 0.1);
    assert_eq!(a.resilience.retry_min_per_second, 1);
    assert_eq!(a.resilience.eject_after_failures, 0);
    assert_eq!(a.resilience.eject_base_time.0, Duration::from_secs(30));
    assert_eq!(a.resilience.max_ejected_share, 0.25);
    assert_eq!(a.shutdown_delay.0, Duration::ZERO);
    assert_eq!(a.drain_timeout.0, Duration::from_secs(120));
    let adm = admission_defaults(&a.admission);
    assert_eq!(adm.queue_max_size, 0);
    assert_eq!(adm.queue_timeout, Duration::from_secs(60));
    assert_eq!(adm.sheddable_timeout, Duration::from_secs(2));
    assert_eq!(adm.full_when.waiting_above.0, None);
    assert_eq!(adm.full_when.kv_usage_above.0, Some(0.9));
    assert_eq!(adm.tenant_label_cap, 7);
}

#[test]
fn the_env_map_reaches_serve_as_its_environment_would() {
    let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let a = parse_serve_env(&env(&[
        ("FLEXINFER_PROXY_LISTEN", "127.0.0.1:18080"),
        ("FLEXINFER_PROXY_REQUIRE_EBPF", "true"),
        ("FLEXINFER_PROXY_CONNECT_TIMEOUT", "750ms"),
    ]))
    .unwrap();
    assert_eq!(a.listen.to_string(), "127.0.0.1:18080");
    assert!(a.ebpf.require_ebpf);
    assert_eq!(a.connect_timeout.0, Duration::from_millis(750));
    // An empty map is the defaults, whatever this process's own environment holds.
    let d = parse_serve_env(&HashMap::new()).unwrap();
    assert_eq!(d.listen.to_string(), "0.0.0.0:8080");
    assert!(!d.ebpf.require_ebpf);
    // A bad value is refused as the proxy refuses it at start.
    let bad = parse_serve_env(&env(&[("FLEXINFER_PROXY_CONNECT_TIMEOUT", "soon")]));
    assert!(bad.is_err(), "{:?}", bad.map(|a| a.connect_timeout));
}
