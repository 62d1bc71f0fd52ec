//! Kubernetes translation: arbitrary JSON read as a Model, its Service and EndpointSlices (as
//! the watcher receives them from the API server), then `model_settings` and `translate`, and
//! the Service URL through `ServiceTarget::parse` as the routing table does.
//!
//! Input: a JSON object `{"model": ..., "service": ..., "slices": [...], "labelKey": "..."}`;
//! each part that does not deserialize into its type is left out (the watcher skips such
//! objects), and a document that is itself a Model, Service or EndpointSlice is tried as that
//! too. Checked: the annotations read as the parsing rules say, the endpoints are sorted,
//! unique, of IP slices only, with a non-zero port, each the first address of a ready,
//! non-terminating endpoint, and a Service URL exists exactly when the Service has a TCP port.
#![no_main]

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use libfuzzer_sys::fuzz_target;
use routing_userspace::discovery::kube::translate::{
    model_settings, parse_priority, parse_routing, service_port, service_url, slice_endpoints,
    translate, DEFAULT_SERVICE_LABEL_KEY, ROUTE_PRIORITY_ANNOTATION, ROUTING_ANNOTATION,
};
use routing_userspace::discovery::kube::Model;
use routing_userspace::table::ServiceTarget;
use serde_json::Value;

fn part<T: serde::de::DeserializeOwned>(v: Option<&Value>) -> Option<T> {
    serde_json::from_value(v?.clone()).ok()
}

/// Where an endpoint may come from: the first address of each usable endpoint of an IP slice.
fn allowed(slices: &[EndpointSlice]) -> HashSet<IpAddr> {
    slices
        .iter()
        .filter(|s| s.address_type == "IPv4" || s.address_type == "IPv6")
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| {
            let c = e.conditions.as_ref();
            c.and_then(|c| c.ready) != Some(false) && c.and_then(|c| c.terminating) != Some(true)
        })
        .filter_map(|e| e.addresses.first()?.parse().ok())
        .collect()
}

fn run(model: &Model, service: Option<&Service>, slices: &[EndpointSlice], label_key: &str) {
    let (settings, warnings) = model_settings(model, label_key);
    let annotations = model.annotations();
    let routing = parse_routing(annotations.get(ROUTING_ANNOTATION).map(String::as_str));
    let priority = parse_priority(
        annotations
            .get(ROUTE_PRIORITY_ANNOTATION)
            .map(String::as_str),
    );
    assert_eq!(settings.routing, routing.0);
    assert_eq!(settings.route_priority, priority.0);
    assert_eq!(
        warnings.len(),
        usize::from(routing.1.is_some()) + usize::from(priority.1.is_some())
    );
    assert_eq!(settings.ready, model.is_ready());
    for s in [&settings.service_label, &settings.served_model_name]
        .into_iter()
        .flatten()
    {
        assert!(!s.is_empty() && s.trim() == s, "{s:?}");
    }

    let spec = translate(model, &settings, service, slices);
    assert_eq!(spec.name, model.name_any());
    assert!(
        spec.endpoints.windows(2).all(|w| w[0] < w[1]),
        "sorted, unique"
    );
    let from = allowed(slices);
    let svc_port = service.and_then(service_port);
    let mut each: Vec<SocketAddr> = slices
        .iter()
        .flat_map(|s| slice_endpoints(s, svc_port))
        .collect();
    each.sort();
    each.dedup();
    assert_eq!(spec.endpoints, each);
    for e in &spec.endpoints {
        assert_ne!(e.port(), 0, "{e}");
        assert!(
            from.contains(&e.ip()),
            "{e} is not a usable endpoint address"
        );
    }
    assert_eq!(spec.service.is_some(), svc_port.is_some());
    assert_eq!(spec.service, service.and_then(service_url));
    if let Some(url) = &spec.service {
        assert!(url.starts_with("http://"), "{url}");
        if let Ok(t) = ServiceTarget::parse(url) {
            assert!(t.authority.rsplit_once(':').is_some(), "{t:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(m) = serde_json::from_value::<Model>(v.clone()) {
        run(&m, None, &[], DEFAULT_SERVICE_LABEL_KEY);
    }
    if let Ok(s) = serde_json::from_value::<Service>(v.clone()) {
        let _ = service_url(&s);
    }
    if let Ok(s) = serde_json::from_value::<EndpointSlice>(v.clone()) {
        let _ = slice_endpoints(&s, None);
    }
    let Some(model) = part::<Model>(v.get("model")) else {
        return;
    };
    let service = part::<Service>(v.get("service"));
    let slices: Vec<EndpointSlice> = v
        .get("slices")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| part(Some(s))).collect())
        .unwrap_or_default();
    let label_key = v
        .get("labelKey")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_SERVICE_LABEL_KEY);
    run(&model, service.as_ref(), &slices, label_key);
    run(&model, None, &slices, label_key);
});
