//! The fleet: the proxy DaemonSet's own Pods, watched and counted, so the engine scraper
//! spreads its page reads over every proxy that reads the same pods (see
//! [`crate::signals::fleet`]), and ranked: this proxy's rank is how many counted pods' names
//! sort before its own (`--fleet-pod-name`, the chart's pod name), so the fleet's proxies have
//! distinct ranks without talking (cache-aware placement reads it for prompts no pod holds).
//!
//! A proxy counts while its pod is Running, Ready and not terminating; the count is at least 1
//! (this proxy). The watch is separate from model discovery: it never holds readiness back, and
//! a failing watch (no RBAC for pods, an API server hiccup) keeps the last count, since a count
//! that is a little off only moves each pod's scrape rate by as much.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::pods::{PodInfo, RUNNING_PODS};
use crate::signals::fleet::FleetPlace;

/// The label selector of the proxy's own pods when `--fleet-selector` is not given: the
/// chart's `app.kubernetes.io/name` (the chart also sets its release's instance label).
pub const DEFAULT_FLEET_SELECTOR: &str = "app.kubernetes.io/name=flexinfer-proxy";

/// Which pods are the fleet's proxies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOptions {
    /// A label selector (`k=v,k2=v2`).
    pub selector: String,
    /// The namespace of the proxy's pods; `None`: the client's default namespace (in a cluster,
    /// the service account's).
    pub namespace: Option<String>,
    /// This proxy's own pod, to rank it among the counted ones; `None`: rank 0.
    pub pod_name: Option<String>,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            selector: DEFAULT_FLEET_SELECTOR.to_owned(),
            namespace: None,
            pod_name: None,
        }
    }
}

/// The proxies seen, by pod name; a relist is buffered aside until it completes.
#[derive(Debug, Default)]
pub struct FleetCount {
    live: BTreeMap<String, bool>,
    relist: Option<BTreeMap<String, bool>>,
    synced: bool,
}

impl FleetCount {
    /// Folds one event in; returns the count when it may have changed (after the first list).
    pub fn apply(&mut self, event: Event<PodInfo>) -> Option<usize> {
        let counts = |p: &PodInfo| p.ready && !p.terminating;
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                return None;
            }
            Event::InitApply(p) => {
                let c = counts(&p);
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(p.name, c);
                return None;
            }
            Event::InitDone => {
                self.live = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(p) => {
                let c = counts(&p);
                self.live.insert(p.name, c);
            }
            Event::Delete(p) => {
                self.live.remove(&p.name);
            }
        }
        self.synced.then(|| self.count())
    }

    /// Running, Ready, not terminating proxies; at least 1.
    pub fn count(&self) -> usize {
        self.live.values().filter(|c| **c).count().max(1)
    }

    /// The rank of the pod named `own` (`None`: 0): how many counted pods' names sort before
    /// it. Every proxy of a settled fleet has its own, from 0 to the count less one.
    pub fn rank(&self, own: Option<&str>) -> usize {
        let Some(own) = own else {
            return 0;
        };
        self.live
            .range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Excluded(own)))
            .filter(|(_, counted)| **counted)
            .count()
    }
}

/// What an operator can do about a failing fleet watch.
fn hint(e: &watcher::Error) -> &'static str {
    let forbidden = matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 403
    ) || matches!(e, watcher::Error::WatchError(s) if s.code == 403);
    if forbidden {
        "RBAC: the proxy needs list/watch on pods in its own namespace (the chart's Role), or set --fleet-size"
    } else {
        ""
    }
}

/// Watches the fleet's pods and stores their count and this proxy's rank into `fleet` until
/// dropped.
pub async fn count(client: Client, opts: FleetOptions, fleet: FleetPlace) {
    let namespace = opts
        .namespace
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default()
        .labels(&opts.selector)
        .fields(RUNNING_PODS);
    debug!(namespace = %namespace, selector = %opts.selector, "counting the fleet's proxies");
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut state = FleetCount::default();
    while let Some(item) = events.next().await {
        match item {
            Ok(e) => {
                let Some(n) = state.apply(super::pods::pod_event(e)) else {
                    continue;
                };
                let rank = state.rank(opts.pod_name.as_deref());
                let was_rank = fleet.rank.swap(rank, Ordering::Relaxed);
                let was = fleet.size.swap(n, Ordering::Relaxed);
                if was != n {
                    info!(proxies = n, was, rank, namespace = %namespace, "fleet size changed; engine scrapes are spread over it");
                } else if was_rank != rank {
                    info!(rank, was = was_rank, proxies = n, namespace = %namespace, "this proxy's rank in the fleet changed; new prompts are placed by it");
                }
            }
            Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                debug!(reason = %s.reason, "fleet watch expired; relisting");
            }
            Err(e) => warn!(
                error = %e, hint = hint(&e), proxies = fleet.size(),
                "fleet watch failed; retrying, the fleet size stays as it is"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool, terminating: bool) -> PodInfo {
        PodInfo {
            namespace: "flexinfer-system".into(),
            name: name.into(),
            ready,
            terminating,
            ..PodInfo::default()
        }
    }

    #[test]
    fn counts_ready_pods_that_are_not_terminating_and_swaps_relists_in_whole() {
        let mut c = FleetCount::default();
        assert_eq!(c.apply(Event::Init), None);
        assert_eq!(c.apply(Event::InitApply(pod("a", true, false))), None);
        assert_eq!(c.apply(Event::InitApply(pod("b", false, false))), None);
        assert_eq!(c.apply(Event::InitDone), Some(1));
        assert_eq!(c.apply(Event::Apply(pod("b", true, false))), Some(2));
        assert_eq!(c.apply(Event::Apply(pod("c", true, true))), Some(2));
        assert_eq!(c.apply(Event::Delete(pod("a", true, false))), Some(1));
        // A relist in progress changes nothing until it completes.
        assert_eq!(c.apply(Event::Init), None);
        for p in ["x", "y", "z"] {
            assert_eq!(c.apply(Event::InitApply(pod(p, true, false))), None);
        }
        assert_eq!(c.count(), 1);
        assert_eq!(c.apply(Event::InitDone), Some(3));
        // None ready: still this proxy.
        for p in ["x", "y", "z"] {
            c.apply(Event::Apply(pod(p, false, false)));
        }
        assert_eq!(c.count(), 1);
    }

    #[test]
    fn a_proxy_ranks_by_the_counted_names_before_its_own() {
        let mut c = FleetCount::default();
        c.apply(Event::Init);
        for (p, ready) in [("proxy-b", true), ("proxy-a", true), ("proxy-c", true)] {
            c.apply(Event::InitApply(pod(p, ready, false)));
        }
        c.apply(Event::InitDone);
        let ranks: Vec<usize> = ["proxy-a", "proxy-b", "proxy-c"]
            .iter()
            .map(|p| c.rank(Some(p)))
            .collect();
        assert_eq!(ranks, [0, 1, 2], "distinct, from 0");
        assert_eq!(c.rank(None), 0, "no own name: rank 0");
        // An unready or terminating pod before this one does not count; a new one does.
        c.apply(Event::Apply(pod("proxy-a", false, false)));
        assert_eq!(c.rank(Some("proxy-c")), 1);
        c.apply(Event::Apply(pod("proxy-0", true, false)));
        assert_eq!(c.rank(Some("proxy-c")), 2);
        // Not counted itself yet (not Ready): the place it would take.
        assert_eq!(c.rank(Some("proxy-bb")), 2);
    }
}
