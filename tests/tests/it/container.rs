//! The proxy image, run as the chart's DaemonSet runs it (privileged, host network, the bpffs
//! hostPath with Bidirectional propagation, the cgroup2 hostPath, the chart's env and command):
//! it serves with the eBPF gauge on and routes to sims on loopback; two pods on one node (a
//! rolling update's overlap) share one node-wide gauge; SIGKILL leaves no phantom load; SIGTERM
//! drains and exits within the grace period.
//!
//! Every test has its own node cgroup, pin directory and ports (see
//! `flexinfer_tests::container`). Podman and BPF are required under FLEXINFER_REQUIRE_EBPF as
//! root (CI); elsewhere these tests skip with the reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flexinfer_tests::container::{podman_or_skip, test_image, NodeCgroup, PinDir, Pod, PodSetup};
use flexinfer_tests::ebpf::wait_for;
use flexinfer_tests::*;
use routing_userspace::ebpf::cli::pod_loads;
use routing_userspace::ebpf::pins::PinnedSet;

/// Live connections to `pod` as the kernel counts them, read on the host.
fn kernel_load(pins: &PinDir, pod: SocketAddr) -> u64 {
    let set = PinnedSet::open_existing(&pins.0).expect("pinned set");
    pod_loads(&set)
        .expect("read loads")
        .into_iter()
        .find(|p| p.addr == pod)
        .map_or(0, |p| p.active)
}

/// A pod's own view of a pod's load: `/debug/routing` -> models[].pods[].active.
async fn debug_active(pod: &Pod, model: &str, target: SocketAddr) -> Option<u64> {
    let view = get(pod.admin, "/debug/routing").await.ok()?.json();
    view["models"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == model)?["pods"]
        .as_array()?
        .iter()
        .find(|p| p["address"] == target.to_string())?["active"]
        .as_u64()
}

async fn poll_debug_active(pod: &Pod, model: &str, target: SocketAddr, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = debug_active(pod, model, target).await.unwrap_or(u64::MAX);
        if v == want || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn hold(pod: &Pod, model: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let addr = pod.addr;
            let body = chat_body(model, None, &format!("long {i}"), r#"{"max_tokens":3000}"#);
            tokio::spawn(async move {
                let _ = post(addr, "/v1/chat/completions", &[], &body).await;
            })
        })
        .collect()
}

async fn pods_hit(pod: &Pod, model: &str, n: usize) -> HashMap<String, usize> {
    let mut hits = HashMap::new();
    for i in 0..n {
        let r = post(
            pod.addr,
            "/v1/chat/completions",
            &[],
            &chat_body(model, None, &format!("q{i}"), ""),
        )
        .await
        .expect("request through the pod");
        assert_eq!(r.status, 200, "{}", r.text());
        *hits.entry(r.pod()).or_insert(0) += 1;
    }
    hits
}

fn write_models(dir: &TempDir, yaml: &str) {
    std::fs::write(dir.path().join("models.yaml"), yaml).expect("models file");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_serves_with_ebpf_on_and_routes_as_the_daemonset_runs_it() {
    let Some(engine) = podman_or_skip() else {
        return;
    };
    let image = test_image(&engine);
    let node = NodeCgroup::new();
    let pins = PinDir::new();
    let dir = TempDir::new("ctest-serve");
    let a = start_sim("a", &[], dir.path()).await;
    let b = start_sim("b", &[], dir.path()).await;
    write_models(
        &dir,
        &format!(
            "models:\n  - name: chat\n    routing: prefix\n    endpoints: [{}, {}]\n",
            a.addr, b.addr
        ),
    );

    // The image's own entrypoint runs the binary on its base (no shell involved).
    let version = engine
        .run(&["run", "--rm", "--network", "none", &image, "--version"])
        .unwrap();
    assert_eq!(
        version.trim(),
        format!(
            "flexinfer-proxy {}",
            xtask::paths::chart_app_version().unwrap()
        )
    );

    let pod = Pod::start(&PodSetup {
        engine: &engine,
        image: &image,
        node: &node,
        pins: &pins,
        config_dir: dir.path(),
    })
    .await;
    // The pod ran with the chart's settings: privileged, host network, Bidirectional bpffs.
    assert!(pod.template.privileged && pod.template.host_network);
    assert!(pod
        .template
        .mounts
        .iter()
        .any(|m| m.container == "/sys/fs/bpf" && m.volume_arg().ends_with(":rshared")));
    assert_eq!(pod.template.env_var("FLEXINFER_PROXY_GAUGE"), Some("auto"));
    assert_eq!(
        pod.template.env_var("FLEXINFER_PROXY_REQUIRE_EBPF"),
        Some("false")
    );
    // And it runs beneath the node cgroup, where sock_ops is attached once.
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", pod.host_pid())).unwrap();
    assert!(
        cgroup
            .lines()
            .any(|l| l.starts_with(&format!("0::/{}/", node.name))),
        "{cgroup}"
    );

    let metrics = get(pod.admin, "/metrics").await.unwrap().text();
    assert_eq!(
        metric_value(&metrics, "flexinfer_proxy_ebpf_enabled", &[]),
        Some(1.0),
        "{}",
        pod.logs()
    );
    assert_eq!(get(pod.admin, "/healthz").await.unwrap().status, 200);
    assert_eq!(node.sock_ops_attached(), 1);

    // Prefix routing through the container: one key, one pod, every time.
    let mut served = Vec::new();
    for i in 0..6 {
        let r = post(
            pod.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", "tenant-a/doc-1")],
            &chat_body("chat", None, &format!("q{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        served.push(r.pod());
    }
    served.dedup();
    assert_eq!(served.len(), 1, "one key, one pod: {served:?}");
    assert!(["a", "b"].contains(&served[0].as_str()));
    let metrics = get(pod.admin, "/metrics").await.unwrap().text();
    assert_eq!(
        metric_value(
            &metrics,
            "flexinfer_proxy_routing_decisions_total",
            &[
                ("model", "chat"),
                ("strategy", "prefix"),
                ("key_source", "explicit-header"),
                ("outcome", "pod")
            ]
        ),
        Some(6.0)
    );
    let logs = pod.logs();
    assert!(
        logs.contains("routing to pod model=chat strategy=prefix target=")
            && logs.contains("key_source=explicit-header"),
        "{logs}"
    );

    // The pins the container made are the host's (the bpffs hostPath).
    assert!(
        pins.0
            .join(routing_common::LAYOUT)
            .join(routing_common::maps::PODS)
            .exists(),
        "no pinned PODS map on the host"
    );
    let status = pod.exec(&["flexinfer-proxy", "ebpf", "status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(text.contains(&pins.0.display().to_string()), "{text}");
    for s in [&a, &b] {
        assert!(
            text.lines().any(|l| l.ends_with(&s.addr.to_string())),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_pods_on_one_node_share_the_load_and_a_sigkilled_pod_leaves_none() {
    let Some(engine) = podman_or_skip() else {
        return;
    };
    let image = test_image(&engine);
    let node = NodeCgroup::new();
    let pins = PinDir::new();
    let dir = TempDir::new("ctest-two");
    // Pod A's sim streams a token per 10 ms: held requests ask for 3000 tokens (30 s).
    let a = start_sim(
        "a",
        &["--inter-token-ms", "10", "--max-concurrency", "16"],
        dir.path(),
    )
    .await;
    let b = start_sim("b", &[], dir.path()).await;
    let c = start_sim("c", &[], dir.path()).await;
    write_models(
        &dir,
        &format!(
            "models:\n  - name: chat\n    routing: least-loaded\n    endpoints: [{}, {}, {}]\n  - name: pin-a\n    routing: least-loaded\n    endpoints: [{}]\n",
            a.addr, b.addr, c.addr, a.addr
        ),
    );
    let setup = PodSetup {
        engine: &engine,
        image: &image,
        node: &node,
        pins: &pins,
        config_dir: dir.path(),
    };
    // A rolling update overlaps the old and the new pod on a node.
    let old = Pod::start(&setup).await;
    let new = Pod::start(&setup).await;
    // The new pod re-opened the pinned set instead of attaching a second program.
    assert_eq!(node.sock_ops_attached(), 1, "{}", new.logs());

    let held = hold(&old, "pin-a", 4).await;
    assert_eq!(
        wait_for(4, Duration::from_secs(10), || kernel_load(&pins, a.addr)),
        4
    );
    // The new pod has sent nothing to A, yet it sees A's four connections...
    assert_eq!(poll_debug_active(&new, "chat", a.addr, 4).await, 4);
    let status = new.exec(&["flexinfer-proxy", "ebpf", "status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    let line = text
        .lines()
        .find(|l| l.ends_with(&a.addr.to_string()))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(line.split_whitespace().nth(1), Some("4"), "{text}");
    // ...and its least-loaded picks avoid A.
    let hits = pods_hit(&new, "chat", 8).await;
    assert_eq!(
        hits.get("a"),
        None,
        "the new pod ignored the old one's load: {hits:?}"
    );

    // SIGKILL the old pod mid-request: its sockets close and the counts with them.
    old.sigkill();
    assert_eq!(
        wait_for(0, Duration::from_secs(10), || kernel_load(&pins, a.addr)),
        0,
        "phantom load after SIGKILL"
    );
    assert_eq!(poll_debug_active(&new, "chat", a.addr, 0).await, 0);
    assert_eq!(old.exit_code(), Some(137));
    // A is free again: with every pod idle, least-loaded round-robins onto it.
    let hits = pods_hit(&new, "chat", 6).await;
    assert!(hits.get("a").copied().unwrap_or(0) >= 1, "{hits:?}");
    for h in held {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_the_request_in_flight_and_exits_within_the_grace_period() {
    let Some(engine) = podman_or_skip() else {
        return;
    };
    let image = test_image(&engine);
    let node = NodeCgroup::new();
    let pins = PinDir::new();
    let dir = TempDir::new("ctest-term");
    let sim = start_sim("a", &["--inter-token-ms", "100"], dir.path()).await;
    write_models(
        &dir,
        &format!(
            "models:\n  - name: solo\n    routing: least-loaded\n    endpoints: [{}]\n",
            sim.addr
        ),
    );
    let pod = Pod::start(&PodSetup {
        engine: &engine,
        image: &image,
        node: &node,
        pins: &pins,
        config_dir: dir.path(),
    })
    .await;
    assert_eq!(
        pod.template.grace,
        Duration::from_secs(45),
        "the chart's default"
    );
    assert_eq!(
        get(pod.admin, "/readyz").await.unwrap().status,
        200,
        "ready before SIGTERM"
    );

    // About two seconds of generation, in flight when the pod is deleted.
    let addr = pod.addr;
    let body = chat_body("solo", None, "long answer", r#"{"max_tokens":20}"#);
    let in_flight =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &body).await });
    assert_eq!(
        wait_for(1, Duration::from_secs(5), || kernel_load(&pins, sim.addr)),
        1
    );
    let admin = pod.admin;
    let stopping = tokio::task::spawn_blocking(move || (pod.stop(), pod));
    // During the shutdown delay the pod reports not ready (so endpoints drop it) and still
    // serves what reaches it.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = get(admin, "/readyz").await.expect("admin still up");
        if r.status == 503 {
            assert!(r.text().contains("shutting down"), "{}", r.text());
            break;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {}", r.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = post(
        addr,
        "/v1/chat/completions",
        &[],
        &chat_body("solo", None, "late", r#"{"max_tokens":2}"#),
    )
    .await
    .expect("served during the shutdown delay");
    assert_eq!(late.status, 200, "{}", late.text());
    let (took, pod) = stopping.await.unwrap();
    let reply = in_flight
        .await
        .unwrap()
        .expect("the request in flight completes");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["usage"]["completion_tokens"], 20);
    assert!(
        took < pod.template.grace,
        "took {took:?}, past the grace period"
    );
    assert_eq!(pod.exit_code(), Some(0), "{}", pod.logs());
    assert!(pod.logs().contains("SIGTERM: draining"));
    assert_eq!(kernel_load(&pins, sim.addr), 0);
}
