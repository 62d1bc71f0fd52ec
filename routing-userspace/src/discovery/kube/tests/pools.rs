//! InferencePool discovery end to end: kube-rs against the in-process API server, through
//! translation to `ModelSpec` updates and, for the fallback, the routing decision.

use std::io::Write;
use std::sync::{Arc, Mutex};

use super::routing::{first_target, pod, table, First};
use super::*;

fn pool(name: &str, match_labels: Value, ports: &[u16], app_protocol: Option<&str>) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    let mut spec = json!({
        "selector": {"matchLabels": match_labels},
        "targetPorts": ports,
        "endpointPickerRef": {"name": format!("{name}-epp"), "port": {"number": 9002}}
    });
    if let Some(p) = app_protocol {
        spec["appProtocol"] = json!(p);
    }
    json!({"kind": "InferencePool", "metadata": {"name": name, "namespace": "ns"}, "spec": spec})
}

/// A Running pod; `ready` is its Ready condition.
fn pod_obj(name: &str, labels: Value, ip: &str, ready: bool) -> Value {
    json!({
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

fn pool_model(name: &str, pool_ref: Value) -> Value {
    let mut m = model(
        name,
        true,
        json!({"flexinfer.ai/routing": "prefix"}),
        json!({}),
    );
    m["spec"]["inferencePoolRef"] = pool_ref;
    m
}

/// Model `m` names pool `p` (app=vllm, port 8000); its Service `m` also has an EndpointSlice,
/// which a pool-Model ignores. Pods: a (member, ready), b (member, not ready), c (app=sglang),
/// and a member-labelled pod in another namespace.
async fn pool_fleet(ports: &[u16], app_protocol: Option<&str>) -> TestApiServer {
    let server = TestApiServer::start().await;
    server.apply(pool_model("m", json!({"name": "p"})));
    server.apply(service("m", 80));
    server.apply(slice(
        "m",
        "m-1",
        "IPv4",
        &[("10.0.9.9", Some(true), false)],
    ));
    server.apply(pool("p", json!({"app": "vllm"}), ports, app_protocol));
    server.apply(pod_obj("a", json!({"app": "vllm"}), "10.1.0.1", true));
    server.apply(pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", false));
    server.apply(pod_obj("c", json!({"app": "sglang"}), "10.1.0.3", true));
    let mut elsewhere = pod_obj("d", json!({"app": "vllm"}), "10.2.0.1", true);
    elsewhere["metadata"]["namespace"] = json!("other");
    server.apply(elsewhere);
    server
}

fn endpoints_of(s: &ModelSet, name: &str) -> Option<Vec<SocketAddr>> {
    s.models()
        .find(|m| m.name == name)
        .map(|m| m.endpoints.clone())
}

/// Waits until model `name` has exactly `want`.
async fn until_endpoints(h: &mut Harness, name: &str, want: &[&str]) {
    let want = addrs(want);
    h.until(&format!("{name} at {want:?}"), |s| {
        endpoints_of(s, name).as_ref() == Some(&want)
    })
    .await;
}

/// Log lines, captured from the discovery task (a current-thread runtime: same thread).
/// Tests run in parallel threads, so the subscriber is per thread (`set_default`).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        // With exactly one registered dispatcher, tracing-core takes the calling thread's
        // default as the only one: a callsite another test thread hits first would cache
        // "never" for good. A second, never-dropped dispatcher keeps it asking every one.
        static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Waits until a line contains every one of `parts`.
    async fn wait_for(&self, parts: &[&str]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !self
            .text()
            .lines()
            .any(|l| parts.iter().all(|p| l.contains(p)))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {parts:?} in\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn pool_selector_changes_move_pods_in_and_out() {
    // All namespaces: the member-labelled pod of namespace "other" is still not a member.
    let mut h = Harness::start(pool_fleet(&[8000], None).await, None).await;
    let Update::Reset(_) = h.next().await else {
        panic!("the first update is a Reset: {:?}", h.seen)
    };
    assert_eq!(endpoints_of(&h.set, "m"), Some(addrs(&["10.1.0.1:8000"])));
    assert_eq!(
        h.get("m").service.as_deref(),
        Some("http://m.ns.svc.cluster.local:80"),
        "the Service stays the fallback"
    );

    // The pool selects other pods.
    h.server
        .apply(pool("p", json!({"app": "sglang"}), &[8000], None));
    until_endpoints(&mut h, "m", &["10.1.0.3:8000"]).await;
    // A pod relabelled into the pool joins, one relabelled out leaves.
    h.server
        .apply(pod_obj("a", json!({"app": "sglang"}), "10.1.0.1", true));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000", "10.1.0.3:8000"]).await;
    h.server
        .apply(pod_obj("c", json!({"app": "gone"}), "10.1.0.3", true));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;
    // A selector of two labels needs both.
    h.server.apply(pool(
        "p",
        json!({"app": "sglang", "tier": "gpu"}),
        &[8000],
        None,
    ));
    until_endpoints(&mut h, "m", &[]).await;
    h.server.apply(pod_obj(
        "a",
        json!({"app": "sglang", "tier": "gpu"}),
        "10.1.0.1",
        true,
    ));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;

    // Pods are watched Running only, with the same scope as the other watches.
    let pod_requests: Vec<String> = h
        .server
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("/api/v1/pods?"))
        .collect();
    assert!(!pod_requests.is_empty(), "{:#?}", h.server.requests());
    assert!(
        pod_requests
            .iter()
            .all(|r| r.contains("fieldSelector=status.phase%3DRunning")),
        "{pod_requests:#?}"
    );
}

#[tokio::test]
async fn pods_that_are_unready_terminating_finished_or_deleted_leave() {
    let mut h = Harness::start(pool_fleet(&[8000], None).await, Some("ns")).await;
    h.until("the pool's pods", |s| {
        endpoints_of(s, "m") == Some(addrs(&["10.1.0.1:8000"]))
    })
    .await;
    h.server
        .apply(pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", true));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000", "10.1.0.2:8000"]).await;
    h.server
        .apply(pod_obj("a", json!({"app": "vllm"}), "10.1.0.1", false));
    until_endpoints(&mut h, "m", &["10.1.0.2:8000"]).await;
    h.server
        .apply(pod_obj("a", json!({"app": "vllm"}), "10.1.0.1", true));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000", "10.1.0.2:8000"]).await;
    // Shutting down: deletionTimestamp set, still Ready.
    let mut terminating = pod_obj("a", json!({"app": "vllm"}), "10.1.0.1", true);
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    h.server.apply(terminating);
    until_endpoints(&mut h, "m", &["10.1.0.2:8000"]).await;
    h.server.delete(Kind::Pod, "ns", "a");
    // Finished: the Running-only watch sees the pod DELETED (even with a stale Ready).
    let mut done = pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", true);
    done["status"]["phase"] = json!("Succeeded");
    h.server.apply(done);
    until_endpoints(&mut h, "m", &[]).await;
    assert_eq!(
        h.get("m").service.as_deref(),
        Some("http://m.ns.svc.cluster.local:80")
    );
    // Running again: the watch sees it ADDED.
    h.server
        .apply(pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", true));
    until_endpoints(&mut h, "m", &["10.1.0.2:8000"]).await;
}

#[tokio::test]
async fn every_target_port_is_its_own_endpoint() {
    let mut h = Harness::start(pool_fleet(&[8001, 8000, 8002], None).await, Some("ns")).await;
    h.until("three ports", |s| {
        endpoints_of(s, "m").is_some_and(|e| e.len() == 3)
    })
    .await;
    assert_eq!(
        endpoints_of(&h.set, "m"),
        Some(addrs(&["10.1.0.1:8000", "10.1.0.1:8001", "10.1.0.1:8002"]))
    );
    // The routing table treats each port as a pod: keys spread over all three.
    let t = table(&h.set);
    let picked: std::collections::BTreeSet<SocketAddr> = (0..60)
        .map(|i| pod(&first_target(&t, "m", &format!("tenant/{i}")).unwrap().0))
        .collect();
    assert_eq!(picked.len(), 3, "{picked:?}");
    // A second member brings its three ports; dropping a port drops it on every member.
    h.server
        .apply(pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", true));
    h.until("six endpoints", |s| {
        endpoints_of(s, "m").is_some_and(|e| e.len() == 6)
    })
    .await;
    h.server
        .apply(pool("p", json!({"app": "vllm"}), &[8000, 8002], None));
    until_endpoints(
        &mut h,
        "m",
        &[
            "10.1.0.1:8000",
            "10.1.0.1:8002",
            "10.1.0.2:8000",
            "10.1.0.2:8002",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_pool_deleted_under_traffic_sends_requests_to_the_service() {
    let mut h = Harness::start(pool_fleet(&[8000], None).await, Some("ns")).await;
    h.server
        .apply(pod_obj("b", json!({"app": "vllm"}), "10.1.0.2", true));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000", "10.1.0.2:8000"]).await;
    let members = addrs(&["10.1.0.1:8000", "10.1.0.2:8000"]);
    let service = First::Service("http://m.ns.svc.cluster.local:80".into());
    let keys: Vec<String> = (0..20).map(|i| format!("session/{i}")).collect();
    // Requests keep being decided on each table while the pool goes away: each goes to a
    // member or to the Service, never nowhere (the Model stays known).
    let decide_all = |set: &ModelSet| -> Vec<First> {
        let t = table(set);
        keys.iter()
            .map(|k| first_target(&t, "m", k).expect("m is still routed").0)
            .collect()
    };
    assert!(decide_all(&h.set)
        .iter()
        .all(|f| matches!(f, First::Pod(a) if members.contains(a))));
    h.server.delete(Kind::InferencePool, "ns", "p");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while endpoints_of(&h.set, "m") != Some(Vec::new()) {
        assert!(tokio::time::Instant::now() < deadline, "{:#?}", h.seen);
        for f in decide_all(&h.set) {
            assert!(
                f == service || matches!(&f, First::Pod(a) if members.contains(a)),
                "{f:?}"
            );
        }
        h.next().await;
    }
    assert!(decide_all(&h.set).iter().all(|f| *f == service));
    assert!(
        h.seen.iter().all(|u| !matches!(u, Update::Remove(_))),
        "the Model is never removed: {:#?}",
        h.seen
    );
    // The pool comes back: so do its pods.
    h.server
        .apply(pool("p", json!({"app": "vllm"}), &[8000], None));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000", "10.1.0.2:8000"]).await;
}

#[tokio::test]
async fn without_the_inferencepool_crd_there_are_no_pools_and_readiness_is_not_held() {
    let (logs, _guard) = Logs::capture();
    let server = pool_fleet(&[8000], None).await;
    server.fail(Kind::InferencePool, Some(404));
    let mut h = Harness::start(server, Some("ns")).await;
    let Update::Reset(list) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(list.len(), 1);
    assert!(h.get("m").endpoints.is_empty(), "no pools, no pods");
    logs.wait_for(&["WARN", "model=m", "does not serve InferencePools"])
        .await;
    // The CRD gets installed: the retried list finds the pool.
    h.server.fail(Kind::InferencePool, None);
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;
}

#[tokio::test]
async fn an_h2c_pool_and_a_foreign_group_are_refused_with_a_warning() {
    let (logs, _guard) = Logs::capture();
    let server = pool_fleet(&[8000], Some("kubernetes.io/h2c")).await;
    server.apply(pool_model(
        "alpha",
        json!({"name": "p", "group": "inference.networking.x-k8s.io"}),
    ));
    server.apply(service("alpha", 80));
    let mut h = Harness::start(server, Some("ns")).await;
    let Update::Reset(_) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert!(h.get("m").endpoints.is_empty());
    assert_eq!(
        h.get("m").service.as_deref(),
        Some("http://m.ns.svc.cluster.local:80")
    );
    assert!(h.get("alpha").endpoints.is_empty());
    logs.wait_for(&[
        "WARN",
        "model=m",
        "InferencePool ns/p is refused",
        "kubernetes.io/h2c",
        "requests go to its Service",
    ])
    .await;
    logs.wait_for(&[
        "WARN",
        "model=alpha",
        "inferencePoolRef.group \"inference.networking.x-k8s.io\" is not supported",
    ])
    .await;
    // Once the pool speaks HTTP/1.1, its pods serve the Model.
    h.server
        .apply(pool("p", json!({"app": "vllm"}), &[8000], Some("http")));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;
    assert_eq!(
        logs.text().matches("is refused").count(),
        1,
        "each problem is logged once:\n{}",
        logs.text()
    );
}

#[tokio::test]
async fn a_model_switches_from_endpointslices_to_a_pool_and_back() {
    let server = pool_fleet(&[8000], None).await;
    // The Model starts without a pool reference: its Service's slices serve it.
    server.apply(model(
        "m",
        true,
        json!({"flexinfer.ai/routing": "prefix"}),
        json!({}),
    ));
    let mut h = Harness::start(server, Some("ns")).await;
    let Update::Reset(_) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(endpoints_of(&h.set, "m"), Some(addrs(&["10.0.9.9:8000"])));
    h.wait_requests(1, |r| r.contains("/inferencepools") && r.contains("watch="))
        .await;
    assert!(
        !h.server.requests().iter().any(|r| r.contains("/pods")),
        "no Pod watch while no Model names a pool: {:#?}",
        h.server.requests()
    );
    h.server.apply(pool_model("m", json!({"name": "p"})));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;
    assert!(h.server.requests().iter().any(|r| r.contains("/pods")));
    h.server.apply(model(
        "m",
        true,
        json!({"flexinfer.ai/routing": "prefix"}),
        json!({}),
    ));
    until_endpoints(&mut h, "m", &["10.0.9.9:8000"]).await;
    // And to the pool again: the Pod watch starts over.
    h.server.apply(pool_model("m", json!({"name": "p"})));
    until_endpoints(&mut h, "m", &["10.1.0.1:8000"]).await;
}

#[tokio::test]
async fn a_refused_inferencepool_list_holds_the_first_table_back() {
    let (logs, _guard) = Logs::capture();
    let server = pool_fleet(&[8000], None).await;
    server.fail(Kind::InferencePool, Some(403));
    let mut h = Harness::start(server, Some("ns")).await;
    h.wait_requests(2, |r| r.contains("/inferencepools")).await;
    logs.wait_for(&["WARN", "watch=inferencepools", "RBAC"])
        .await;
    assert!(
        h.rx.try_recv().is_err(),
        "not synced while pools cannot be listed"
    );
    h.server.fail(Kind::InferencePool, None);
    let Update::Reset(_) = h.next().await else {
        panic!("{:?}", h.seen)
    };
    assert_eq!(endpoints_of(&h.set, "m"), Some(addrs(&["10.1.0.1:8000"])));
}
