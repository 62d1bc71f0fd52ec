//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`), as
//! far as the proxy reads it, and the pure rule turning a pool and pods into endpoints.
//!
//! A pool names its model servers by a label selector (`spec.selector.matchLabels`, Pods of the
//! pool's namespace only) and the ports they serve on (`spec.targetPorts`, 1 to 8; each port of
//! each pod is its own endpoint, for data-parallel servers). Its `endpointPickerRef` is for a
//! gateway: the proxy picks pods itself, so it ignores it. The GIE project owns the CRD; the
//! proxy only reads pools, so unknown fields are ignored and missing ones read as empty.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::pods::PodInfo;

/// The API group of InferencePools, and the default of a Model's `inferencePoolRef.group`.
pub const POOL_GROUP: &str = "inference.networking.k8s.io";
/// `spec.appProtocol` of a pool whose servers speak HTTP/1.1 (also what an unset value means).
pub const APP_PROTOCOL_HTTP: &str = "http";

/// The part of an InferencePool's `spec` the proxy reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    plural = "inferencepools",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Which Pods of the pool's namespace are its members.
    #[serde(default)]
    pub selector: PoolSelector,
    /// The ports the members serve on; each is a separate endpoint.
    #[serde(default)]
    pub target_ports: Vec<TargetPort>,
    /// `http` (HTTP/1.1, the default) or `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// GIE's label selector: `matchLabels` only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One of `spec.targetPorts`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetPort {
    #[serde(default)]
    pub number: i64,
}

/// Why a pool gives a Model no pods although it exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolRefusal {
    #[error("its appProtocol {0:?} is not supported yet: the proxy speaks HTTP/1.1 to pods")]
    Protocol(String),
    #[error("its spec.selector.matchLabels is empty; the proxy selects no pods with it")]
    EmptySelector,
    #[error("its spec.targetPorts has no port from 1 to 65535")]
    NoTargetPorts,
}

impl InferencePool {
    /// The pool's ports, or why the proxy cannot route to its pods.
    pub fn ports(&self) -> Result<Vec<u16>, PoolRefusal> {
        let spec = &self.spec;
        match spec.app_protocol.as_deref().map(str::trim) {
            None | Some("") | Some(APP_PROTOCOL_HTTP) => {}
            Some(other) => return Err(PoolRefusal::Protocol(other.to_owned())),
        }
        if spec.selector.match_labels.is_empty() {
            return Err(PoolRefusal::EmptySelector);
        }
        let mut ports: Vec<u16> = spec
            .target_ports
            .iter()
            .filter_map(|p| u16::try_from(p.number).ok())
            .filter(|p| *p != 0)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        if ports.is_empty() {
            return Err(PoolRefusal::NoTargetPorts);
        }
        Ok(ports)
    }

    /// Is `pod` a member: same namespace, every `matchLabels` entry among its labels? An empty
    /// selector selects nothing (selecting every pod of the namespace is never what is meant).
    pub fn selects(&self, pod: &PodInfo) -> bool {
        let labels = &self.spec.selector.match_labels;
        !labels.is_empty()
            && self.metadata.namespace.as_deref().unwrap_or_default() == pod.namespace
            && pod.has_labels(labels)
    }

    /// `podIP:port` for every routable member and every target port, sorted, or why there are
    /// none to be had from this pool.
    pub fn endpoints<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a PodInfo>,
    ) -> Result<Vec<SocketAddr>, PoolRefusal> {
        let ports = self.ports()?;
        let mut out: Vec<SocketAddr> = pods
            .into_iter()
            .filter(|p| self.selects(p))
            .filter_map(PodInfo::routable_ip)
            .flat_map(|ip| ports.iter().map(move |port| SocketAddr::new(ip, *port)))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: serde_json::Value) -> InferencePool {
        serde_json::from_value(json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": spec
        }))
        .unwrap()
    }

    fn pod(name: &str, ns: &str, ip: &str, labels: &[(&str, &str)], ready: bool) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ip: ip.parse().ok(),
            ready,
            terminating: false,
        }
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn reads_the_v1_spec_and_ignores_the_rest() {
        let p = pool(json!({
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
            "appProtocol": "http",
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"}
        }));
        assert_eq!(p.spec.selector.match_labels["app"], "vllm");
        assert_eq!(p.ports(), Ok(vec![8000, 8001]));
        let lenient = pool(json!({}));
        assert_eq!(lenient.spec, InferencePoolSpec::default());
    }

    #[test]
    fn every_target_port_of_every_ready_member_is_an_endpoint() {
        let p = pool(json!({
            "selector": {"matchLabels": {"app": "vllm", "model": "llama"}},
            "targetPorts": [{"number": 8001}, {"number": 8000}]
        }));
        let both = [("app", "vllm"), ("model", "llama"), ("extra", "1")];
        let pods = [
            pod("a", "ns", "10.0.0.2", &both, true),
            pod("b", "ns", "10.0.0.1", &both, true),
            pod("c", "ns", "10.0.0.3", &both, false),
            pod("d", "ns", "10.0.0.4", &[("app", "vllm")], true),
            pod("e", "other", "10.0.0.5", &both, true),
            pod("f", "ns", "", &both, true),
            pod("g", "ns", "fd00::1", &both, true),
        ];
        assert_eq!(
            p.endpoints(&pods),
            Ok(addrs(&[
                "10.0.0.1:8000",
                "10.0.0.1:8001",
                "10.0.0.2:8000",
                "10.0.0.2:8001",
                "[fd00::1]:8000",
                "[fd00::1]:8001",
            ]))
        );
        let mut terminating = pods[0].clone();
        terminating.terminating = true;
        assert_eq!(p.endpoints([&terminating]), Ok(vec![]));
    }

    #[test]
    fn refusals_table() {
        let sel = json!({"matchLabels": {"app": "x"}});
        let port = json!([{"number": 8000}]);
        for (spec, want) in [
            (
                json!({"selector": sel, "targetPorts": port}),
                Ok(vec![8000]),
            ),
            (
                json!({"selector": sel, "targetPorts": port, "appProtocol": "kubernetes.io/h2c"}),
                Err(PoolRefusal::Protocol("kubernetes.io/h2c".into())),
            ),
            (
                json!({"selector": sel, "targetPorts": port, "appProtocol": "grpc"}),
                Err(PoolRefusal::Protocol("grpc".into())),
            ),
            (
                json!({"selector": {"matchLabels": {}}, "targetPorts": port}),
                Err(PoolRefusal::EmptySelector),
            ),
            (
                json!({"targetPorts": port}),
                Err(PoolRefusal::EmptySelector),
            ),
            (json!({"selector": sel}), Err(PoolRefusal::NoTargetPorts)),
            (
                json!({"selector": sel, "targetPorts": [{"number": 0}, {"number": 70000}, {}]}),
                Err(PoolRefusal::NoTargetPorts),
            ),
            (
                json!({"selector": sel, "targetPorts": [{"number": 8000}, {"number": 8000}, {"number": -1}]}),
                Ok(vec![8000]),
            ),
        ] {
            assert_eq!(pool(spec.clone()).ports(), want, "{spec}");
        }
        let h2c =
            pool(json!({"selector": sel, "targetPorts": port, "appProtocol": "kubernetes.io/h2c"}));
        let member = pod("a", "ns", "10.0.0.1", &[("app", "x")], true);
        assert!(h2c.selects(&member));
        assert!(h2c.endpoints([&member]).is_err(), "refused, not empty");
        assert!(h2c
            .ports()
            .unwrap_err()
            .to_string()
            .contains("kubernetes.io/h2c"));
    }
}
