//! Pure translation: one Model, its Service and its EndpointSlices (or the endpoints of the
//! InferencePool it names, see [`super::pool`]) -> one [`ModelSpec`].
//!
//! No I/O and no clock, so every rule of the contract (annotations, priority parsing, port choice,
//! endpoint conditions, pool references) is a table test. Problems with a Model's annotations come back as warning
//! strings; the watcher logs them once per Model change instead of once per recompute.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::admission::admission_settings;
use super::crd::{Model, ModelResourceSpec};
use super::pool::POOL_GROUP;
use crate::balance::bounded::{parse_factor, parse_floor};
use crate::discovery::{BalanceOverride, EngineKind, ModelAdmission, ModelSpec, Strategy};

/// `flexinfer.ai/routing`: session-affinity | prefix | least-loaded | cache-aware; absent = default.
pub const ROUTING_ANNOTATION: &str = "flexinfer.ai/routing";
/// `flexinfer.ai/route-priority`: integer, higher wins in a label group; absent or invalid = 0.
pub const ROUTE_PRIORITY_ANNOTATION: &str = "flexinfer.ai/route-priority";
/// Overrides the Service a Model is served by (default: the Service named like the Model).
pub const SERVICE_NAME_ANNOTATION: &str = "flexinfer.ai/service-name";
/// `flexinfer.ai/hash-balance-factor`: this Model's bounded-load factor (0 = off).
pub const HASH_BALANCE_FACTOR_ANNOTATION: &str = "flexinfer.ai/hash-balance-factor";
/// `flexinfer.ai/hash-balance-floor`: this Model's least bound (requests in flight).
pub const HASH_BALANCE_FLOOR_ANNOTATION: &str = "flexinfer.ai/hash-balance-floor";
/// `flexinfer.ai/engine`: the model server of this Model's pods (overrides `spec.engine`).
pub const ENGINE_ANNOTATION: &str = "flexinfer.ai/engine";
/// The default metadata label carrying the shared service label.
pub const DEFAULT_SERVICE_LABEL_KEY: &str = "flexinfer.ai/service";
/// The label EndpointSlices carry naming their Service.
pub const SLICE_SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// What a Model's own object says, before its Service and endpoints are looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSettings {
    pub routing: Strategy,
    pub route_priority: i64,
    pub service_label: Option<String>,
    pub served_model_name: Option<String>,
    /// The Service (same namespace) whose endpoints serve this Model.
    pub service_name: String,
    pub ready: bool,
    /// The hash-balance annotations (unset or invalid: the proxy's settings).
    pub hash_balance: BalanceOverride,
    /// Where the pods come from.
    pub pods: PodSource,
    /// The engine kind: the annotation, else `spec.engine`, else `auto` narrowed by
    /// `spec.backend`.
    pub engine: EngineKind,
    /// The admission spec fields and annotations (unset or invalid: the proxy's settings).
    pub admission: ModelAdmission,
}

/// Where a Model's pods come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSource {
    /// The ready endpoints of its Service's EndpointSlices (no `inferencePoolRef`).
    Slices,
    /// The members of the InferencePool of this name in the Model's namespace; its Service's
    /// EndpointSlices are ignored (the Service stays the fallback target).
    Pool(String),
    /// An `inferencePoolRef` the proxy cannot follow: no pods, so requests go to the Service.
    Unusable,
}

/// Reads a Model's annotations, labels, spec and status. Returns warnings for values it had to
/// replace by their default.
pub fn model_settings(model: &Model, service_label_key: &str) -> (ModelSettings, Vec<String>) {
    let mut warnings = Vec::new();
    let annotations = model.annotations();
    let (routing, w) = parse_routing(annotations.get(ROUTING_ANNOTATION).map(String::as_str));
    warnings.extend(w);
    let (route_priority, w) = parse_priority(
        annotations
            .get(ROUTE_PRIORITY_ANNOTATION)
            .map(String::as_str),
    );
    warnings.extend(w);
    let (hash_balance, w) = parse_balance(
        annotations
            .get(HASH_BALANCE_FACTOR_ANNOTATION)
            .map(String::as_str),
        annotations
            .get(HASH_BALANCE_FLOOR_ANNOTATION)
            .map(String::as_str),
    );
    warnings.extend(w);
    let (pods, w) = parse_pool_ref(&model.spec);
    warnings.extend(w);
    let (engine, w) = parse_engine(
        annotations.get(ENGINE_ANNOTATION).map(String::as_str),
        model.spec.engine.as_deref(),
        &model.spec.backend,
    );
    warnings.extend(w);
    let (admission, w) = admission_settings(&model.spec.admission(), annotations);
    warnings.extend(w);
    let service_name =
        non_empty(annotations.get(SERVICE_NAME_ANNOTATION)).unwrap_or_else(|| model.name_any());
    let settings = ModelSettings {
        routing,
        route_priority,
        service_label: non_empty(model.labels().get(service_label_key)),
        served_model_name: non_empty(model.spec.served_model_name.as_ref()),
        service_name,
        ready: model.is_ready(),
        hash_balance,
        pods,
        engine,
        admission,
    };
    (settings, warnings)
}

/// `spec.inferencePoolRef`: absent = the Service's EndpointSlices; a name (and the default
/// group) = that pool; anything else is refused with a warning, and the Model has no pods.
pub fn parse_pool_ref(spec: &ModelResourceSpec) -> (PodSource, Option<String>) {
    const REFUSED: &str = "the Model gets no pods and its requests go to its Service";
    let r = match spec.inference_pool_ref() {
        Ok(None) => return (PodSource::Slices, None),
        Ok(Some(r)) => r,
        Err(e) => return (PodSource::Unusable, Some(format!("{e}; {REFUSED}"))),
    };
    if let Some(group) = r.group.as_deref().filter(|g| g.trim() != POOL_GROUP) {
        let why = format!(
            "inferencePoolRef.group {group:?} is not supported (only {POOL_GROUP}); {REFUSED}"
        );
        return (PodSource::Unusable, Some(why));
    }
    match r.name.trim() {
        "" => (
            PodSource::Unusable,
            Some(format!("inferencePoolRef.name is empty; {REFUSED}")),
        ),
        name => (PodSource::Pool(name.to_owned()), None),
    }
}

fn non_empty(s: Option<&String>) -> Option<String> {
    s.map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The routing annotation; an unknown value means default routing, with a warning.
pub fn parse_routing(value: Option<&str>) -> (Strategy, Option<String>) {
    match value {
        None => (Strategy::Default, None),
        Some(v) => match v.parse() {
            Ok(s) => (s, None),
            Err(e) => (
                Strategy::Default,
                Some(format!("{ROUTING_ANNOTATION}: {e}; using default routing")),
            ),
        },
    }
}

/// The hash-balance annotations; a value that does not parse is ignored (the proxy's setting
/// applies), with a warning.
pub fn parse_balance(factor: Option<&str>, floor: Option<&str>) -> (BalanceOverride, Vec<String>) {
    let mut warnings = Vec::new();
    let factor_milli = factor.and_then(|v| match parse_factor(v) {
        Ok(f) => Some(f),
        Err(e) => {
            warnings.push(format!(
                "{HASH_BALANCE_FACTOR_ANNOTATION}: {e}; using the proxy's factor"
            ));
            None
        }
    });
    let floor = floor.and_then(|v| match parse_floor(v) {
        Ok(f) => Some(f),
        Err(e) => {
            warnings.push(format!(
                "{HASH_BALANCE_FLOOR_ANNOTATION}: {e}; using the proxy's floor"
            ));
            None
        }
    });
    (
        BalanceOverride {
            factor_milli,
            floor,
        },
        warnings,
    )
}

/// The engine kind of a Model: the annotation, else `spec.engine`, else `auto`; `auto` is then
/// narrowed by `spec.backend` ([`EngineKind::or_backend`]). A value that does not parse is
/// skipped, with a warning.
pub fn parse_engine(
    annotation: Option<&str>,
    spec: Option<&str>,
    backend: &str,
) -> (EngineKind, Vec<String>) {
    let mut warnings = Vec::new();
    let mut read = |value: Option<&str>, what: &str| {
        value.and_then(|v| match v.parse::<EngineKind>() {
            Ok(k) => Some(k),
            Err(e) => {
                warnings.push(format!("{what}: {e}; ignored"));
                None
            }
        })
    };
    let kind = read(annotation, ENGINE_ANNOTATION)
        .or_else(|| read(spec, "spec.engine"))
        .unwrap_or_default();
    (kind.or_backend(backend), warnings)
}

/// The route-priority annotation: a (possibly negative) integer; anything else is 0, with a warning.
pub fn parse_priority(value: Option<&str>) -> (i64, Option<String>) {
    match value {
        None => (0, None),
        Some(v) => match v.trim().parse::<i64>() {
            Ok(p) => (p, None),
            Err(_) => (
                0,
                Some(format!(
                    "{ROUTE_PRIORITY_ANNOTATION}: {v:?} is not an integer; using 0"
                )),
            ),
        },
    }
}

fn is_tcp(protocol: Option<&String>) -> bool {
    protocol.is_none_or(|p| p == "TCP")
}

/// The Service port requests go to: the TCP port named `http`, else the first TCP port.
pub fn service_port(svc: &Service) -> Option<&ServicePort> {
    let ports = svc.spec.as_ref()?.ports.as_deref()?;
    let tcp = || ports.iter().filter(|p| is_tcp(p.protocol.as_ref()));
    tcp()
        .find(|p| p.name.as_deref() == Some("http"))
        .or_else(|| tcp().next())
}

/// `http://<svc>.<ns>.svc.cluster.local:<port>`, or None when the Service has no TCP port.
pub fn service_url(svc: &Service) -> Option<String> {
    let port = service_port(svc)?;
    let ns = svc.namespace().unwrap_or_else(|| "default".into());
    Some(format!(
        "http://{}.{ns}.svc.cluster.local:{}",
        svc.name_any(),
        port.port
    ))
}

/// The slice port that carries the chosen Service port: same name (that is how the endpoint
/// controller names slice ports), else the numeric target port, else the first. Without a Service,
/// the port named `http`, else the first.
pub fn slice_port(slice: &EndpointSlice, svc_port: Option<&ServicePort>) -> Option<u16> {
    let ports: Vec<&EndpointPort> = slice
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|p| p.port.is_some() && is_tcp(p.protocol.as_ref()))
        .collect();
    let name = |p: &EndpointPort| p.name.clone().unwrap_or_default();
    let chosen = match svc_port {
        Some(sp) => {
            let want = sp.name.clone().unwrap_or_default();
            ports
                .iter()
                .find(|p| name(p) == want)
                .or_else(|| match &sp.target_port {
                    Some(IntOrString::Int(t)) => ports.iter().find(|p| p.port == Some(*t)),
                    _ => None,
                })
        }
        None => ports.iter().find(|p| name(p) == "http"),
    }
    .or(ports.first())?;
    chosen
        .port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
}

/// The slice's endpoints that may take new requests: ready (unset counts as ready, as the API
/// says) and not terminating. IPv4 and IPv6 only; FQDN slices give nothing.
pub fn slice_endpoints(slice: &EndpointSlice, svc_port: Option<&ServicePort>) -> Vec<SocketAddr> {
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return Vec::new();
    }
    let Some(port) = slice_port(slice, svc_port) else {
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        .filter(|e| {
            let c = e.conditions.as_ref();
            c.and_then(|c| c.ready) != Some(false) && c.and_then(|c| c.terminating) != Some(true)
        })
        // Addresses of one endpoint are fungible; consumers use the first.
        .filter_map(|e| e.addresses.first()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// The ModelSpec of one Model, given its Service (if it exists) and that Service's slices.
pub fn translate<'a>(
    model: &Model,
    settings: &ModelSettings,
    service: Option<&Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> ModelSpec {
    let svc_port = service.and_then(service_port);
    let endpoints: Vec<SocketAddr> = slices
        .into_iter()
        .flat_map(|s| slice_endpoints(s, svc_port))
        .collect();
    model_spec(model, settings, service, endpoints)
}

/// The ModelSpec of one Model whose endpoints are already known (its pool's, or none), with its
/// Service (if it exists) as the fallback.
pub fn model_spec(
    model: &Model,
    settings: &ModelSettings,
    service: Option<&Service>,
    mut endpoints: Vec<SocketAddr>,
) -> ModelSpec {
    endpoints.sort();
    endpoints.dedup();
    ModelSpec {
        name: model.name_any(),
        routing: settings.routing,
        served_model_name: settings.served_model_name.clone(),
        service_label: settings.service_label.clone(),
        route_priority: settings.route_priority,
        ready: settings.ready,
        service: service.and_then(service_url),
        endpoints,
        hash_balance: settings.hash_balance,
        engine: settings.engine,
        admission: settings.admission.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model(v: serde_json::Value) -> Model {
        let mut base = json!({
            "apiVersion": "inference.flexinfer.ai/v1alpha2", "kind": "Model",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"backend": "ollama", "source": "ollama://llama3:8b"}
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn service(ports: serde_json::Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": "svc", "namespace": "ns"}, "spec": {"ports": ports}}),
        )
        .unwrap()
    }

    fn slice(
        address_type: &str,
        ports: serde_json::Value,
        endpoints: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "svc-abc", "namespace": "ns", "labels": {SLICE_SERVICE_LABEL: "svc"}},
            "addressType": address_type, "ports": ports, "endpoints": endpoints
        }))
        .unwrap()
    }

    #[test]
    fn routing_annotation_table() {
        for (value, want, warns) in [
            (None, Strategy::Default, false),
            (Some("prefix"), Strategy::Prefix, false),
            (Some("session-affinity"), Strategy::SessionAffinity, false),
            (Some("least-loaded"), Strategy::LeastLoaded, false),
            (Some("default"), Strategy::Default, false),
            (Some(" prefix "), Strategy::Prefix, false),
            (Some("round-robin"), Strategy::Default, true),
            (Some("PREFIX"), Strategy::Default, true),
        ] {
            let (s, w) = parse_routing(value);
            assert_eq!((s, w.is_some()), (want, warns), "{value:?}");
        }
    }

    #[test]
    fn priority_annotation_table() {
        for (value, want, warns) in [
            (None, 0, false),
            (Some("100"), 100, false),
            (Some("-5"), -5, false),
            (Some(" 7 "), 7, false),
            (Some("high"), 0, true),
            (Some("1.5"), 0, true),
            (Some(""), 0, true),
            (Some("99999999999999999999"), 0, true),
        ] {
            let (p, w) = parse_priority(value);
            assert_eq!((p, w.is_some()), (want, warns), "{value:?}");
        }
    }

    #[test]
    fn settings_from_annotations_labels_spec_and_status() {
        let m = model(json!({
            "metadata": {
                "labels": {"flexinfer.ai/service": "chat"},
                "annotations": {"flexinfer.ai/routing": "bogus", "flexinfer.ai/route-priority": "100",
                                "flexinfer.ai/service-name": "other-svc"}
            },
            "spec": {"servedModelName": "llama3:8b"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let (s, warnings) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
        assert_eq!(
            s,
            ModelSettings {
                routing: Strategy::Default,
                route_priority: 100,
                service_label: Some("chat".into()),
                served_model_name: Some("llama3:8b".into()),
                service_name: "other-svc".into(),
                ready: true,
                hash_balance: BalanceOverride::default(),
                pods: PodSource::Slices,
                engine: EngineKind::None,
                admission: ModelAdmission::default(),
            }
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // Another label key, the default Service name, no status.
        let m = model(json!({"metadata": {"labels": {"team/svc": "x"}}}));
        let (s, warnings) = model_settings(&m, "team/svc");
        assert_eq!(
            (s.service_label.as_deref(), s.service_name.as_str(), s.ready),
            (Some("x"), "m", false)
        );
        assert!(warnings.is_empty());
    }

    #[test]
    fn hash_balance_annotations_table() {
        for (factor, floor, want, warns) in [
            (None, None, BalanceOverride::default(), 0),
            (
                Some("1.5"),
                Some("4"),
                BalanceOverride {
                    factor_milli: Some(1500),
                    floor: Some(4),
                },
                0,
            ),
            (
                Some("0"),
                None,
                BalanceOverride {
                    factor_milli: Some(0),
                    floor: None,
                },
                0,
            ),
            (Some("0.9"), Some("x"), BalanceOverride::default(), 2),
            (
                Some(" 2 "),
                Some("-1"),
                BalanceOverride {
                    factor_milli: Some(2000),
                    floor: None,
                },
                1,
            ),
        ] {
            let (b, w) = parse_balance(factor, floor);
            assert_eq!((b, w.len()), (want, warns), "{factor:?} {floor:?}: {w:?}");
        }
        let m = model(json!({"metadata": {"annotations": {
            "flexinfer.ai/routing": "cache-aware",
            "flexinfer.ai/hash-balance-factor": "1.1",
            "flexinfer.ai/hash-balance-floor": "lots"
        }}}));
        let (s, warnings) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
        assert_eq!(s.routing, Strategy::CacheAware);
        assert_eq!(s.hash_balance.factor_milli, Some(1100));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("hash-balance-floor"), "{warnings:?}");
        assert_eq!(translate(&m, &s, None, []).hash_balance, s.hash_balance);
    }

    #[test]
    fn engine_table() {
        use EngineKind::{Auto, LlamaCpp, Sglang, Vllm};
        for (annotation, spec, backend, want, warns) in [
            (None, None, "vllm", Vllm, 0),
            (None, None, "llama.cpp", LlamaCpp, 0),
            (None, None, "ollama", EngineKind::None, 0),
            (None, None, "tgi", Auto, 0),
            (None, Some("sglang"), "vllm", Sglang, 0),
            (Some("none"), Some("sglang"), "vllm", EngineKind::None, 0),
            (Some("llamacpp"), None, "", LlamaCpp, 0),
            (Some("auto"), None, "vllm", Vllm, 0),
            (Some("bogus"), Some("sglang"), "vllm", Sglang, 1),
            (Some("bogus"), Some("VLLM"), "vllm", Vllm, 2),
        ] {
            let (k, w) = parse_engine(annotation, spec, backend);
            assert_eq!(
                (k, w.len()),
                (want, warns),
                "{annotation:?} {spec:?} {backend}: {w:?}"
            );
        }
        let m = model(json!({
            "metadata": {"annotations": {"flexinfer.ai/engine": "sglang"}},
            "spec": {"backend": "vllm", "engine": "vllm"}
        }));
        let (s, warnings) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
        assert_eq!((s.engine, warnings.len()), (Sglang, 0));
        assert_eq!(translate(&m, &s, None, []).engine, Sglang);
    }

    #[test]
    fn service_port_prefers_http_then_first_tcp() {
        let svc =
            service(json!([{"name": "metrics", "port": 9100}, {"name": "http", "port": 8000}]));
        assert_eq!(
            service_url(&svc).unwrap(),
            "http://svc.ns.svc.cluster.local:8000"
        );
        let svc = service(
            json!([{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "api", "port": 8080}]),
        );
        assert_eq!(
            service_url(&svc).unwrap(),
            "http://svc.ns.svc.cluster.local:8080"
        );
        let svc = service(json!([]));
        assert_eq!(service_url(&svc), None);
    }

    #[test]
    fn slice_port_matches_the_service_port() {
        let ports = json!([{"name": "metrics", "port": 9100}, {"name": "http", "port": 8001}]);
        let s = slice("IPv4", ports, json!([]));
        let svc = service(json!([{"name": "http", "port": 80, "targetPort": "http"}]));
        assert_eq!(slice_port(&s, service_port(&svc)), Some(8001));
        // Unnamed single port: names are both empty.
        let s = slice("IPv4", json!([{"port": 8002}]), json!([]));
        let svc = service(json!([{"port": 80, "targetPort": 8002}]));
        assert_eq!(slice_port(&s, service_port(&svc)), Some(8002));
        // Names disagree: fall back to the numeric target port, then to the first.
        let s = slice(
            "IPv4",
            json!([{"name": "a", "port": 1}, {"name": "b", "port": 2}]),
            json!([]),
        );
        let svc = service(json!([{"name": "x", "port": 80, "targetPort": 2}]));
        assert_eq!(slice_port(&s, service_port(&svc)), Some(2));
        let svc = service(json!([{"name": "x", "port": 80, "targetPort": "named"}]));
        assert_eq!(slice_port(&s, service_port(&svc)), Some(1));
        // No Service known: the `http` port, else the first.
        let s = slice(
            "IPv4",
            json!([{"name": "a", "port": 1}, {"name": "http", "port": 2}]),
            json!([]),
        );
        assert_eq!(slice_port(&s, None), Some(2));
        let s = slice("IPv4", json!([]), json!([]));
        assert_eq!(slice_port(&s, None), None);
    }

    #[test]
    fn endpoint_conditions() {
        let eps = json!([
            {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
            {"addresses": ["10.0.0.2"]},
            {"addresses": ["10.0.0.3"], "conditions": {}},
            {"addresses": ["10.0.0.4"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.5"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.0.0.6"], "conditions": {"ready": true, "terminating": true}},
            {"addresses": ["10.0.0.7", "10.0.0.70"], "conditions": {"ready": true}},
            {"addresses": ["not-an-ip"]}
        ]);
        let got = slice_endpoints(
            &slice("IPv4", json!([{"name": "http", "port": 8000}]), eps),
            None,
        );
        let want: Vec<SocketAddr> = [
            "10.0.0.1:8000",
            "10.0.0.2:8000",
            "10.0.0.3:8000",
            "10.0.0.7:8000",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ipv6_and_fqdn() {
        let eps = json!([{"addresses": ["fd00::1"], "conditions": {"ready": true}}]);
        let got = slice_endpoints(&slice("IPv6", json!([{"port": 8000}]), eps), None);
        assert_eq!(got, vec!["[fd00::1]:8000".parse().unwrap()]);
        let eps = json!([{"addresses": ["pod.example.com"], "conditions": {"ready": true}}]);
        assert!(slice_endpoints(&slice("FQDN", json!([{"port": 8000}]), eps), None).is_empty());
    }

    #[test]
    fn translate_merges_slices_and_sets_the_fallback_url() {
        let m = model(json!({"metadata": {"annotations": {"flexinfer.ai/routing": "prefix"}}}));
        let (settings, _) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
        let svc = service(json!([{"name": "http", "port": 80, "targetPort": 8000}]));
        let ports = json!([{"name": "http", "port": 8000}]);
        let a = slice(
            "IPv4",
            ports.clone(),
            json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.1"]}]),
        );
        let b = slice(
            "IPv6",
            ports,
            json!([{"addresses": ["fd00::1"]}, {"addresses": ["10.0.0.1"]}]),
        );
        let spec = translate(&m, &settings, Some(&svc), [&a, &b]);
        assert_eq!(spec.name, "m");
        assert_eq!(spec.routing, Strategy::Prefix);
        assert_eq!(
            spec.service.as_deref(),
            Some("http://svc.ns.svc.cluster.local:80")
        );
        let want: Vec<SocketAddr> = ["10.0.0.1:8000", "10.0.0.2:8000", "[fd00::1]:8000"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(spec.endpoints, want);
        // No Service: no fallback URL.
        assert_eq!(translate(&m, &settings, None, []).service, None);
    }

    #[test]
    fn pool_ref_table() {
        for (r, want, warns) in [
            (json!(null), PodSource::Slices, false),
            (
                json!({"name": "pool"}),
                PodSource::Pool("pool".into()),
                false,
            ),
            (
                json!({"name": " pool ", "group": "inference.networking.k8s.io"}),
                PodSource::Pool("pool".into()),
                false,
            ),
            (
                json!({"name": "pool", "group": "inference.networking.x-k8s.io"}),
                PodSource::Unusable,
                true,
            ),
            (
                json!({"name": "pool", "group": ""}),
                PodSource::Unusable,
                true,
            ),
            (json!({"name": ""}), PodSource::Unusable, true),
            (
                json!({"group": "inference.networking.k8s.io"}),
                PodSource::Unusable,
                true,
            ),
            (json!("pool"), PodSource::Unusable, true),
            (json!({"name": 7}), PodSource::Unusable, true),
        ] {
            let m = model(json!({"spec": {"inferencePoolRef": r}}));
            let (s, warnings) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
            assert_eq!(
                (&s.pods, warnings.len()),
                (&want, usize::from(warns)),
                "{r}: {warnings:?}"
            );
            if warns {
                assert!(warnings[0].contains("inferencePoolRef"), "{warnings:?}");
                assert!(warnings[0].contains("its Service"), "{warnings:?}");
            }
        }
        let refused = model(json!({"spec": {"inferencePoolRef": {"name": "p", "group": "x.io"}}}));
        let (_, warnings) = model_settings(&refused, DEFAULT_SERVICE_LABEL_KEY);
        assert!(warnings[0].contains("\"x.io\""), "{warnings:?}");
    }

    #[test]
    fn model_spec_sorts_and_dedups_given_endpoints() {
        let m = model(json!({"spec": {"inferencePoolRef": {"name": "p"}}}));
        let (settings, _) = model_settings(&m, DEFAULT_SERVICE_LABEL_KEY);
        let svc = service(json!([{"name": "http", "port": 80}]));
        let eps: Vec<SocketAddr> = ["10.0.0.2:8001", "10.0.0.1:8000", "10.0.0.2:8001"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let spec = model_spec(&m, &settings, Some(&svc), eps);
        assert_eq!(spec.endpoints.len(), 2);
        assert!(spec.endpoints.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            spec.service.as_deref(),
            Some("http://svc.ns.svc.cluster.local:80")
        );
    }
}
