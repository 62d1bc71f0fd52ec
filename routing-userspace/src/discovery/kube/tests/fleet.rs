//! The fleet count end to end: kube-rs against the in-process API server, the proxy's own pods
//! counted into the shared fleet size the scraper reads.

use crate::signals::fleet::FleetPlace;

use super::*;
use crate::discovery::kube::FleetOptions;
use crate::signals::Fleet;

const NS: &str = "flexinfer-system";

/// A proxy pod of the chart's DaemonSet: Running, with `ready` as its Ready condition.
fn proxy_pod(name: &str, ns: &str, ready: bool) -> Value {
    json!({
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "app.kubernetes.io/name": "flexinfer-proxy",
            "app.kubernetes.io/instance": "flexinfer-proxy"
        }},
        "spec": {"containers": [{"name": "proxy", "image": "flexinfer-proxy"}]},
        "status": {"phase": "Running", "podIP": "10.9.0.1",
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

/// The chart's selector in `NS` (as the chart sets it).
fn chart_fleet() -> KubeOptions {
    KubeOptions {
        namespace: Some("ns".into()),
        fleet: FleetOptions {
            selector:
                "app.kubernetes.io/name=flexinfer-proxy,app.kubernetes.io/instance=flexinfer-proxy"
                    .into(),
            namespace: Some(NS.into()),
            pod_name: None,
        },
        ..KubeOptions::default()
    }
}

/// A counted fleet, as `serve` makes it without `--fleet-size`.
fn counted() -> (Fleet, FleetPlace) {
    let fleet = Fleet::new(0, 0, true, None);
    let counter = fleet.counter().expect("discovery counts");
    (fleet, counter)
}

/// Waits until the fleet size is `n`.
async fn until_count(h: &Harness, fleet: &Fleet, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while fleet.proxies() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fleet size {} (want {n}); requests {:#?}",
            fleet.proxies(),
            h.server.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_fleet_request(r: &str) -> bool {
    r.starts_with(&format!("/api/v1/namespaces/{NS}/pods?")) && r.contains("labelSelector=")
}

#[tokio::test]
async fn the_count_follows_proxy_pods_added_unready_terminating_and_deleted() {
    let server = fleet().await;
    server.apply(proxy_pod("p1", NS, true));
    server.apply(proxy_pod("p2", NS, true));
    server.apply(proxy_pod("p3", NS, false));
    // Not the fleet: another app in the namespace, a proxy pod elsewhere, a finished one.
    let mut other = proxy_pod("x", NS, true);
    other["metadata"]["labels"] = json!({"app.kubernetes.io/name": "vllm"});
    server.apply(other);
    server.apply(proxy_pod("p-elsewhere", "ns", true));
    let mut done = proxy_pod("p-done", NS, true);
    done["status"]["phase"] = json!("Succeeded");
    server.apply(done);

    let (fleet, counter) = counted();
    let mut h = Harness::start_with(server, chart_fleet(), Some(counter));
    assert!(matches!(h.next().await, Update::Reset(_)));
    until_count(&h, &fleet, 2).await;
    assert!(
        h.server.requests().iter().any(|r| is_fleet_request(r)
            && r.contains("app.kubernetes.io%2Finstance%3Dflexinfer-proxy")
            && r.contains("status.phase%3DRunning")),
        "{:#?}",
        h.server.requests()
    );

    h.server.apply(proxy_pod("p4", NS, true));
    until_count(&h, &fleet, 3).await;
    h.server.apply(proxy_pod("p3", NS, true));
    until_count(&h, &fleet, 4).await;
    h.server.apply(proxy_pod("p1", NS, false));
    until_count(&h, &fleet, 3).await;
    let mut leaving = proxy_pod("p4", NS, true);
    leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    h.server.apply(leaving);
    until_count(&h, &fleet, 2).await;
    h.server.delete(Kind::Pod, NS, "p2");
    h.server.delete(Kind::Pod, NS, "p3");
    // No proxy left Ready: this one still counts.
    until_count(&h, &fleet, 1).await;
    h.server.apply(proxy_pod("p5", NS, true));
    h.server.apply(proxy_pod("p6", NS, true));
    until_count(&h, &fleet, 2).await;
}

#[tokio::test]
async fn a_proxy_ranks_itself_by_its_pod_name_among_the_counted_pods() {
    let server = fleet().await;
    for p in ["p1", "p2", "p3"] {
        server.apply(proxy_pod(p, NS, true));
    }
    let (fleet, counter) = counted();
    let mut opts = chart_fleet();
    opts.fleet.pod_name = Some("p2".into());
    let mut h = Harness::start_with(server, opts, Some(counter));
    assert!(matches!(h.next().await, Update::Reset(_)));
    until_count(&h, &fleet, 3).await;
    assert_eq!(fleet.rank(), 1);
    // The pod before it leaves the count: it moves up.
    h.server.apply(proxy_pod("p1", NS, false));
    until_count(&h, &fleet, 2).await;
    assert_eq!(fleet.rank(), 0);
}

#[tokio::test]
async fn a_failing_fleet_watch_keeps_the_last_count_and_never_holds_readiness() {
    let server = fleet().await;
    server.apply(proxy_pod("p1", NS, true));
    server.apply(proxy_pod("p2", NS, true));
    // No RBAC for pods yet: models still sync, and the fleet is this proxy.
    server.fail(Kind::Pod, Some(403));
    let (fleet, counter) = counted();
    let mut h = Harness::start_with(server, chart_fleet(), Some(counter));
    assert!(matches!(h.next().await, Update::Reset(_)));
    h.wait_requests(2, is_fleet_request).await;
    assert_eq!(fleet.proxies(), 1);

    h.server.fail(Kind::Pod, None);
    until_count(&h, &fleet, 2).await;

    // The watch breaks and every relist fails: the count stays.
    let before = h
        .server
        .requests()
        .iter()
        .filter(|r| is_fleet_request(r))
        .count();
    h.server.fail(Kind::Pod, Some(500));
    h.server.expire(Kind::Pod);
    h.wait_requests(before + 2, is_fleet_request).await;
    assert_eq!(fleet.proxies(), 2, "a failing watch keeps the last count");
    // Model discovery is not disturbed meanwhile.
    h.server.apply(model("late", true, json!({}), json!({})));
    h.until("late", |s| s.models().any(|m| m.name == "late"))
        .await;

    h.server.fail(Kind::Pod, None);
    h.server.apply(proxy_pod("p3", NS, true));
    until_count(&h, &fleet, 3).await;
}

#[tokio::test]
async fn fleet_size_overrides_and_no_proxy_pod_is_watched() {
    let fleet = Fleet::new(10, 0, true, None);
    let server = fleet_server_with_proxies().await;
    let mut h = Harness::start_with(server, chart_fleet(), fleet.counter());
    assert!(matches!(h.next().await, Update::Reset(_)));
    for kind in ["/models", "/services", "/endpointslices"] {
        h.wait_requests(1, |r| r.contains(kind) && r.contains("watch="))
            .await;
    }
    assert_eq!(fleet.proxies(), 10);
    assert!(
        !h.server.requests().iter().any(|r| r.contains("/pods")),
        "{:#?}",
        h.server.requests()
    );
}

#[tokio::test]
async fn without_a_namespace_the_fleet_is_in_the_clients_default_namespace() {
    let server = fleet_server_with_proxies().await;
    server.apply(proxy_pod("d1", "default", true));
    let mut opts = chart_fleet();
    opts.fleet.namespace = None;
    let (fleet, counter) = counted();
    let h = Harness::start_with(server, opts, Some(counter));
    h.wait_requests(1, |r| r.starts_with("/api/v1/namespaces/default/pods?"))
        .await;
    // Counting `NS` would say 3.
    h.server.apply(proxy_pod("d2", "default", true));
    until_count(&h, &fleet, 2).await;
}

/// The model fleet plus three ready proxies in `NS`.
async fn fleet_server_with_proxies() -> TestApiServer {
    let server = fleet().await;
    for p in ["p1", "p2", "p3"] {
        server.apply(proxy_pod(p, NS, true));
    }
    server
}

/// `GET path` on `addr`; the body of a 200 answer.
async fn admin_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Waits until `/debug/routing` on `admin` shows `want` as its `fleet`.
async fn until_fleet<T>(admin: SocketAddr, serving: &tokio::task::JoinHandle<T>, want: Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let body = admin_get(admin, "/debug/routing").await;
        let seen = body.and_then(|b| serde_json::from_str::<Value>(&b).ok());
        let fleet = seen.as_ref().map(|v| &v["fleet"]);
        if fleet == Some(&want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline && !serving.is_finished(),
            "fleet {fleet:?}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `serve` in Kubernetes mode, through its own flags: the fleet it counts reaches the scraper's
/// count and the admin views (the wiring from `app`, not only discovery's part).
#[tokio::test]
async fn serve_counts_the_fleet_it_shows_and_scrapes_by() {
    use clap::{Args, FromArgMatches};
    let server = fleet_server_with_proxies().await;
    let kubeconfig = std::env::temp_dir().join(format!(
        "flexinfer-fleet-kubeconfig-{}-{}",
        std::process::id(),
        free_port()
    ));
    let kc = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server.url()}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {}}]
    });
    std::fs::write(&kubeconfig, serde_yaml_ng::to_string(&kc).unwrap()).unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let argv = [
        "serve",
        "--discovery=kubernetes",
        "--namespace=ns",
        "--gauge=userspace",
        &format!("--kubeconfig={}", kubeconfig.display()),
        &format!("--listen={listen}"),
        &format!("--admin-listen={admin}"),
        &format!("--fleet-namespace={NS}"),
        "--fleet-pod-name=p3",
    ];
    let cmd = crate::config::ServeArgs::augment_args(clap::Command::new("serve"))
        .mut_args(|a| a.env(None));
    let matches = cmd.try_get_matches_from(argv).unwrap();
    let args = crate::config::ServeArgs::from_arg_matches(&matches).unwrap();
    let serving = tokio::spawn(crate::app::serve(args, std::future::pending()));

    let want = |n: usize, rank: usize| json!({"proxies": n, "rank": rank, "source": "discovery", "alone": n == 1, "engine_scrape_interval_seconds": n as f64});
    until_fleet(admin, &serving, want(3, 2)).await;
    // A proxy whose pod's name sorts first: this one (p3) moves down a rank.
    server.apply(proxy_pod("p0", NS, true));
    until_fleet(admin, &serving, want(4, 3)).await;
    let metrics = admin_get(admin, "/metrics").await.unwrap();
    assert!(
        metrics.contains("\nflexinfer_proxy_fleet_proxies 4\n"),
        "{metrics}"
    );
    serving.abort();
    std::fs::remove_file(&kubeconfig).ok();
}
