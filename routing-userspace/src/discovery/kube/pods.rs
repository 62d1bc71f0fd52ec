//! Pods, as far as InferencePool discovery needs them: name, labels, IP, readiness.
//!
//! A Pod object is large (its whole spec and status) and a namespace may hold thousands, so the
//! watcher keeps a [`PodInfo`] per pod instead: what selecting by labels and routing to the pod
//! need, nothing else. Converting right after the watch stream drops the full object at once.
//! Only Running pods are watched ([`RUNNING_PODS`]): Pending, Succeeded and Failed pods are
//! never Ready, and finished Job pods would otherwise fill the cache.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

/// The field selector of the Pod watch. The API server turns a pod that leaves Running into a
/// DELETED event for this watch.
pub const RUNNING_PODS: &str = "status.phase=Running";

/// The part of a Pod that discovery keeps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `status.podIP` (the primary address), when it parses.
    pub ip: Option<IpAddr>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set: the pod is shutting down.
    pub terminating: bool,
}

impl PodInfo {
    /// Keeps what discovery needs of `pod` and drops the rest.
    pub fn from_pod(pod: Pod) -> Self {
        let status = pod.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Self {
            namespace: pod.metadata.namespace.unwrap_or_default(),
            name: pod.metadata.name.unwrap_or_default(),
            labels: pod.metadata.labels.unwrap_or_default(),
            ip: status.pod_ip.and_then(|ip| ip.parse().ok()),
            ready,
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// The address new requests may go to: Ready, not terminating, with an IP.
    pub fn routable_ip(&self) -> Option<IpAddr> {
        self.ip.filter(|_| self.ready && !self.terminating)
    }

    /// True when every `key: value` of `match_labels` is one of this pod's labels.
    pub fn has_labels(&self, match_labels: &BTreeMap<String, String>) -> bool {
        match_labels
            .iter()
            .all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// A Pod watch event with each Pod slimmed to a [`PodInfo`].
pub fn pod_event(event: Event<Pod>) -> Event<PodInfo> {
    match event {
        Event::Apply(p) => Event::Apply(PodInfo::from_pod(p)),
        Event::Delete(p) => Event::Delete(PodInfo::from_pod(p)),
        Event::InitApply(p) => Event::InitApply(PodInfo::from_pod(p)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodInfo {
        PodInfo::from_pod(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn keeps_labels_ip_readiness_and_termination() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"},
                         "annotations": {"big": "dropped"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7",
                       "conditions": [{"type": "PodScheduled", "status": "True"},
                                      {"type": "Ready", "status": "True"}]}
        }));
        assert_eq!(
            p,
            PodInfo {
                namespace: "ns".into(),
                name: "p".into(),
                labels: [("app".to_owned(), "x".to_owned())].into(),
                ip: Some("10.0.0.7".parse().unwrap()),
                ready: true,
                terminating: false,
            }
        );
        assert_eq!(p.routable_ip(), p.ip);
    }

    #[test]
    fn routable_only_when_ready_with_an_ip_and_not_terminating() {
        for (status, deleting, routable) in [
            (
                json!({"podIP": "fd00::1", "conditions": [{"type": "Ready", "status": "True"}]}),
                false,
                true,
            ),
            (
                json!({"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}]}),
                false,
                false,
            ),
            (json!({"podIP": "10.0.0.1"}), false, false),
            (
                json!({"conditions": [{"type": "Ready", "status": "True"}]}),
                false,
                false,
            ),
            (
                json!({"podIP": "not-an-ip", "conditions": [{"type": "Ready", "status": "True"}]}),
                false,
                false,
            ),
            (
                json!({"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}),
                true,
                false,
            ),
        ] {
            let mut meta = json!({"name": "p", "namespace": "ns"});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            let p = pod(json!({"metadata": meta, "status": status}));
            assert_eq!(p.routable_ip().is_some(), routable, "{status} {deleting}");
        }
    }

    #[test]
    fn label_matching_is_a_subset_test() {
        let p = pod(json!({"metadata": {"name": "p", "labels": {"app": "x", "tier": "gpu"}}}));
        let sel = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(p.has_labels(&sel(&[("app", "x")])));
        assert!(p.has_labels(&sel(&[("app", "x"), ("tier", "gpu")])));
        assert!(!p.has_labels(&sel(&[("app", "y")])));
        assert!(!p.has_labels(&sel(&[("app", "x"), ("zone", "a")])));
        assert!(p.has_labels(&sel(&[])), "the empty set is a subset");
    }
}
