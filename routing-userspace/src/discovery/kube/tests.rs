//! kube-rs against the in-process API server: the contract's discovery cases end to end.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::testserver::{Kind, TestApiServer};

mod fleet;
mod pools;
use super::{client, run, run_with_client, KubeOptions};
use crate::discovery::{ModelSet, ModelSpec, Strategy, Update};

fn model(name: &str, ready: bool, annotations: Value, labels: Value) -> Value {
    json!({
        "kind": "Model",
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations, "labels": labels},
        "spec": {"backend": "vllm", "source": "hf://org/model"},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    })
}

fn service(name: &str, port: i32) -> Value {
    json!({
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}
    })
}

/// `(address, ready, terminating)`; `ready: None` leaves the condition unset.
fn slice(svc: &str, name: &str, address_type: &str, eps: &[(&str, Option<bool>, bool)]) -> Value {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(ip, ready, terminating)| {
            let mut c = json!({"serving": ready.unwrap_or(true), "terminating": terminating});
            if let Some(r) = ready {
                c["ready"] = json!(r);
            }
            json!({"addresses": [ip], "conditions": c, "targetRef": {"kind": "Pod", "name": format!("pod-{ip}")}})
        })
        .collect();
    json!({
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": address_type,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = list.iter().map(|s| s.parse().unwrap()).collect();
    v.sort();
    v
}

struct Harness {
    server: TestApiServer,
    rx: UnboundedReceiver<Update>,
    set: ModelSet,
    seen: Vec<Update>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Harness {
    async fn start(server: TestApiServer, namespace: Option<&str>) -> Self {
        let opts = KubeOptions {
            namespace: namespace.map(str::to_owned),
            ..KubeOptions::default()
        };
        Self::start_with(server, opts, None)
    }

    /// Discovery with `opts`, counting the fleet into `fleet` when given.
    fn start_with(
        server: TestApiServer,
        opts: KubeOptions,
        fleet: Option<crate::signals::fleet::FleetPlace>,
    ) -> Self {
        let (tx, rx) = unbounded_channel();
        let task = tokio::spawn(run_with_client(server.client(), opts, tx, fleet));
        Self {
            server,
            rx,
            set: ModelSet::default(),
            seen: Vec::new(),
            task,
        }
    }

    async fn next(&mut self) -> Update {
        let u = tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
            .await
            .expect("an update within 10s")
            .expect("discovery is running");
        self.set.apply(u.clone());
        self.seen.push(u.clone());
        u
    }

    /// Applies updates until `done` holds for the model set.
    async fn until(&mut self, what: &str, done: impl Fn(&ModelSet) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !done(&self.set) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; seen {:#?}",
                self.seen
            );
            self.next().await;
        }
    }

    fn get(&self, name: &str) -> &ModelSpec {
        self.set
            .models()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no model {name}"))
    }

    /// Waits until the server saw `n` requests matching `pred`.
    async fn wait_requests(&self, n: usize, pred: impl Fn(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let count = self.server.requests().iter().filter(|r| pred(r)).count();
            if count >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "requests: {:#?}",
                self.server.requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A prefix model with a mixed IPv4 slice and an IPv6 slice, plus a cold model with no ready pod.
async fn fleet() -> TestApiServer {
    let server = TestApiServer::start().await;
    server.apply(model(
        "m",
        true,
        json!({"flexinfer.ai/routing": "prefix", "flexinfer.ai/route-priority": "100"}),
        json!({"flexinfer.ai/service": "chat"}),
    ));
    server.apply(service("m", 80));
    server.apply(slice(
        "m",
        "m-v4",
        "IPv4",
        &[
            ("10.0.0.1", Some(true), false),
            ("10.0.0.2", Some(false), false),
            ("10.0.0.3", Some(false), true),
            ("10.0.0.4", None, false),
            ("10.0.0.5", Some(true), true),
        ],
    ));
    server.apply(slice(
        "m",
        "m-v6",
        "IPv6",
        &[
            ("fd00::1", Some(true), false),
            ("fd00::2", Some(false), false),
        ],
    ));
    server.apply(model("cold", true, json!({}), json!({})));
    server.apply(service("cold", 8080));
    server.apply(slice(
        "cold",
        "cold-1",
        "IPv4",
        &[("10.0.1.1", Some(false), false)],
    ));
    // Another namespace, not watched when the proxy is limited to `ns`.
    let mut other = model("elsewhere", true, json!({}), json!({}));
    other["metadata"]["namespace"] = json!("other");
    server.apply(other);
    server
}

#[tokio::test]
async fn first_reset_has_ready_pods_strategy_and_service_fallback() {
    let mut h = Harness::start(fleet().await, Some("ns")).await;
    let Update::Reset(list) = h.next().await else {
        panic!("the first update is a Reset: {:?}", h.seen)
    };
    assert_eq!(list.len(), 2, "{list:#?}");
    let m = h.get("m");
    assert_eq!(m.routing, Strategy::Prefix);
    assert_eq!(m.route_priority, 100);
    assert_eq!(m.service_label.as_deref(), Some("chat"));
    assert!(m.ready);
    assert_eq!(
        m.endpoints,
        addrs(&["10.0.0.1:8000", "10.0.0.4:8000", "[fd00::1]:8000"])
    );
    assert_eq!(
        m.service.as_deref(),
        Some("http://m.ns.svc.cluster.local:80")
    );
    let cold = h.get("cold");
    assert_eq!(cold.routing, Strategy::Default);
    assert!(cold.endpoints.is_empty());
    assert_eq!(
        cold.service.as_deref(),
        Some("http://cold.ns.svc.cluster.local:8080")
    );
    assert!(
        h.server
            .requests()
            .iter()
            .all(|r| r.contains("/namespaces/ns/")),
        "namespaced watches only"
    );
}

#[tokio::test]
async fn all_namespaces_by_default() {
    let mut h = Harness::start(fleet().await, None).await;
    let Update::Reset(list) = h.next().await else {
        panic!()
    };
    assert_eq!(list.len(), 3);
}

#[tokio::test]
async fn pod_readiness_model_readiness_and_deletion_are_per_model_updates() {
    let mut h = Harness::start(fleet().await, Some("ns")).await;
    assert!(matches!(h.next().await, Update::Reset(_)));

    // 10.0.0.1 turns not ready: only that pod leaves.
    h.server.apply(slice(
        "m",
        "m-v4",
        "IPv4",
        &[
            ("10.0.0.1", Some(false), false),
            ("10.0.0.2", Some(false), false),
            ("10.0.0.4", None, false),
        ],
    ));
    let Update::Upsert(m) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(m.name, "m");
    assert_eq!(m.endpoints, addrs(&["10.0.0.4:8000", "[fd00::1]:8000"]));

    // The Model loses Ready.
    h.server.apply(model(
        "m",
        false,
        json!({"flexinfer.ai/routing": "prefix", "flexinfer.ai/route-priority": "100"}),
        json!({"flexinfer.ai/service": "chat"}),
    ));
    let Update::Upsert(m) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert!(!m.ready);
    assert_eq!(m.endpoints.len(), 2, "endpoints unchanged");

    // The Model is deleted.
    h.server.delete(Kind::Model, "ns", "m");
    assert_eq!(h.next().await, Update::Remove("m".into()));
    assert_eq!(h.set.len(), 1);

    // The cold model's pod becomes ready.
    h.server.apply(slice(
        "cold",
        "cold-1",
        "IPv4",
        &[("10.0.1.1", Some(true), false)],
    ));
    let Update::Upsert(cold) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(cold.endpoints, addrs(&["10.0.1.1:8000"]));
}

#[tokio::test]
async fn gone_mid_watch_relists_without_dropping_the_table() {
    let mut h = Harness::start(fleet().await, Some("ns")).await;
    assert!(matches!(h.next().await, Update::Reset(_)));
    let lists = |kind: &'static str| move |r: &str| r.contains(kind) && !r.contains("watch=");
    let watches = |kind: &'static str| move |r: &str| r.contains(kind) && r.contains("watch=");
    h.wait_requests(1, watches("/models")).await;
    h.wait_requests(1, watches("/endpointslices")).await;
    h.server.bookmark();

    // A relist that finds nothing new emits nothing.
    h.server.expire(Kind::Service);
    h.wait_requests(2, lists("/services")).await;
    h.wait_requests(2, watches("/services")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        h.rx.try_recv().is_err(),
        "no update after an unchanged relist"
    );

    // Watches expire while the cluster changes: a new model appears, a pod leaves.
    h.server.expire(Kind::Model);
    h.server.expire(Kind::EndpointSlice);
    h.server.apply(model(
        "late",
        true,
        json!({"flexinfer.ai/routing": "least-loaded"}),
        json!({}),
    ));
    h.server.apply(slice(
        "m",
        "m-v6",
        "IPv6",
        &[("fd00::2", Some(false), false)],
    ));
    h.until("the relisted state", |s| {
        s.models().any(|m| m.name == "late")
            && s.models()
                .any(|m| m.name == "m" && m.endpoints == addrs(&["10.0.0.1:8000", "10.0.0.4:8000"]))
    })
    .await;
    h.wait_requests(2, lists("/models")).await;
    h.wait_requests(2, lists("/endpointslices")).await;
    for u in &h.seen {
        if let Update::Reset(list) = u {
            let names: Vec<&str> = list.iter().map(|m| m.name.as_str()).collect();
            assert!(
                names.contains(&"m") && names.contains(&"cold"),
                "partial Reset {names:?} in {:#?}",
                h.seen
            );
        }
    }
    assert!(
        !h.seen.iter().any(|u| matches!(u, Update::Remove(_))),
        "no model lost: {:#?}",
        h.seen
    );
    assert_eq!(h.set.len(), 3);
    assert_eq!(h.get("late").routing, Strategy::LeastLoaded);

    // Watching resumes after the relist.
    h.server.delete(Kind::Model, "ns", "late");
    h.until("late removed", |s| s.models().all(|m| m.name != "late"))
        .await;
}

#[tokio::test]
async fn run_reads_a_kubeconfig_and_namespace_option() {
    let server = fleet().await;
    let path = std::env::temp_dir().join(format!(
        "flexinfer-kubeconfig-{}-{}",
        std::process::id(),
        server.url().len()
    ));
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server.url()}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {}}]
    });
    std::fs::write(&path, serde_yaml_ng::to_string(&kubeconfig).unwrap()).unwrap();
    let (tx, mut rx) = unbounded_channel();
    let opts = KubeOptions {
        namespace: Some("other".into()),
        kubeconfig: Some(path.clone()),
        ..KubeOptions::default()
    };
    let task = tokio::spawn(run(opts, tx, None));
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a Reset")
        .expect("running");
    task.abort();
    std::fs::remove_file(&path).ok();
    let Update::Reset(list) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        list.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["elsewhere"]
    );
}

#[tokio::test]
async fn a_tls_client_builds_with_the_pinned_provider() {
    let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
    client(config).expect("TLS client");
}

#[tokio::test]
async fn no_reset_until_every_list_succeeds() {
    let server = fleet().await;
    server.fail(Kind::Model, Some(403));
    let mut h = Harness::start(server, Some("ns")).await;
    h.wait_requests(2, |r| r.contains("/models")).await;
    h.wait_requests(1, |r| r.contains("/endpointslices") && r.contains("watch="))
        .await;
    h.wait_requests(1, |r| r.contains("/services") && r.contains("watch="))
        .await;
    assert!(
        h.rx.try_recv().is_err(),
        "not synced while Models cannot be listed"
    );
    h.server.fail(Kind::Model, None);
    let Update::Reset(list) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(list.len(), 2);
}

/// The contract's cases through the routing table and the decision, not only the updates.
mod routing {
    use std::sync::Arc;
    use std::time::Instant;

    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::keys::RequestParts;
    use crate::load::slots::SlotAllocator;
    use crate::load::userspace::UserspaceGauge;
    use crate::metrics::Metrics;
    use crate::router::RoutingKnobs;
    use crate::router::{Router, Target};
    use crate::table::RoutingTable;
    use crate::vocab::{GroupOutcome, LabelGroupMode};

    pub(super) fn table(set: &ModelSet) -> RoutingTable {
        let mut slots = SlotAllocator::default();
        RoutingTable::rebuild(set, &mut slots, &Metrics::new(100), LabelGroupMode::Prefix).0
    }

    /// Where a request goes first.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum First {
        Pod(SocketAddr),
        Service(String),
    }

    /// Where a request for `name` with explicit key `key` goes first (None: 404).
    pub(super) fn first_target(
        t: &RoutingTable,
        name: &str,
        key: &str,
    ) -> Option<(First, Option<GroupOutcome>, String)> {
        let route = t.lookup(name)?;
        let mut h = HeaderMap::new();
        h.insert("x-flexinfer-cache-key", HeaderValue::from_str(key).unwrap());
        let knobs = RoutingKnobs {
            reservation_ttl: Duration::ZERO,
            label_group_mode: LabelGroupMode::Prefix,
            ..RoutingKnobs::default()
        };
        let router = Router::new(Arc::new(UserspaceGauge::default()), knobs);
        let parts = RequestParts {
            headers: &h,
            body: None,
            model: Some(name),
        };
        let mut d = router.decide(&route, &parts, 0, Instant::now());
        let first = d.next_attempt().map(|a| match d.target(a) {
            Target::Pod(p) => First::Pod(p.addr),
            Target::Service(url) => First::Service(url.to_string()),
        })?;
        Some((
            first,
            d.group().map(|g| g.outcome),
            d.model().name.to_string(),
        ))
    }

    pub(super) fn pod(t: &First) -> SocketAddr {
        match t {
            First::Pod(a) => *a,
            other => panic!("expected a pod, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn kubernetes_updates_drive_routing() {
        let server = fleet().await;
        // A fallback member of the "chat" label group, priority 0, with one ready pod.
        server.apply(model(
            "m-fallback",
            true,
            json!({"flexinfer.ai/routing": "prefix"}),
            json!({"flexinfer.ai/service": "chat"}),
        ));
        server.apply(service("m-fallback", 80));
        server.apply(slice(
            "m-fallback",
            "mf",
            "IPv4",
            &[("10.0.2.1", Some(true), false)],
        ));
        let mut h = Harness::start(server, Some("ns")).await;
        h.until("the fleet", |s| {
            s.len() == 3
                && s.models()
                    .any(|m| m.name == "m-fallback" && !m.endpoints.is_empty())
        })
        .await;

        // A prefix Model routes by key to its EndpointSlice's ready pods only.
        let t = table(&h.set);
        let ready = addrs(&["10.0.0.1:8000", "10.0.0.4:8000", "[fd00::1]:8000"]);
        let keys: Vec<String> = (0..60).map(|i| format!("tenant/{i}")).collect();
        let before: Vec<SocketAddr> = keys
            .iter()
            .map(|k| pod(&first_target(&t, "m", k).unwrap().0))
            .collect();
        assert!(before.iter().all(|p| ready.contains(p)));
        assert_eq!(
            before
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3,
            "keys spread over the ready pods"
        );

        // A pod turns not-ready: it leaves the ring and only its keys move.
        h.server.apply(slice(
            "m",
            "m-v4",
            "IPv4",
            &[("10.0.0.1", Some(false), false), ("10.0.0.4", None, false)],
        ));
        h.until("10.0.0.1 gone", |s| {
            s.models().any(|m| m.name == "m" && m.endpoints.len() == 2)
        })
        .await;
        let t = table(&h.set);
        let gone: SocketAddr = "10.0.0.1:8000".parse().unwrap();
        for (k, old) in keys.iter().zip(&before) {
            let now = pod(&first_target(&t, "m", k).unwrap().0);
            assert_ne!(now, gone);
            if *old != gone {
                assert_eq!(now, *old, "key {k} moved although its pod stayed");
            }
        }

        // The label group prefers m (priority 100) while it is Ready ...
        let (_, outcome, member) = first_target(&t, "chat", "k").unwrap();
        assert_eq!(
            (outcome, member.as_str()),
            (Some(GroupOutcome::PriorityPick), "m")
        );
        // ... and moves to the next tier when m loses Ready.
        h.server.apply(model(
            "m",
            false,
            json!({"flexinfer.ai/routing": "prefix", "flexinfer.ai/route-priority": "100"}),
            json!({"flexinfer.ai/service": "chat"}),
        ));
        h.until("m not ready", |s| {
            s.models().any(|m| m.name == "m" && !m.ready)
        })
        .await;
        let t = table(&h.set);
        let (target, _, member) = first_target(&t, "chat", "k").unwrap();
        assert_eq!(
            (member.as_str(), pod(&target)),
            ("m-fallback", "10.0.2.1:8000".parse().unwrap())
        );

        // No ready endpoints: the Service DNS URL is the target.
        let (target, _, _) = first_target(&t, "cold", "k").unwrap();
        assert_eq!(
            target,
            First::Service("http://cold.ns.svc.cluster.local:8080".into())
        );

        // A deleted Model is unknown (the proxy answers 404).
        h.server.delete(Kind::Model, "ns", "cold");
        h.until("cold deleted", |s| s.models().all(|m| m.name != "cold"))
            .await;
        assert!(first_target(&table(&h.set), "cold", "k").is_none());
    }
}
