//! The eBPF gauge over pooled upstream connections: requests in flight, not connections, are
//! what it counts, node-wide, and nothing a proxy does (or a SIGKILL stops it doing) leaves
//! phantom load behind.
//!
//! Proxies run inside a child cgroup the test creates (sock_ops attaches there), with a pin
//! directory of their own; both are removed afterwards. These tests fail, not skip, when
//! FLEXINFER_REQUIRE_EBPF is set (CI) and BPF is broken.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flexinfer_tests::ebpf::{
    bpf_or_skip, ebpf_flags, kernel_load, kernel_pods, test_cgroup, wait_for, Cgroup, TestPins,
};
use flexinfer_tests::*;

async fn ebpf_proxy(models: &ModelsFile, pins: &TestPins, cg: &Cgroup, dir: &TempDir) -> Proxy {
    let flags = ebpf_flags(pins);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = start_proxy(models, &flags, &[], dir.path()).await;
    // Before its first request, so every upstream connection it opens is in the cgroup.
    cg.add_pid(proxy.proc.pid())
        .expect("move into the test cgroup");
    proxy
}

/// Pod `pod`'s load as `proxy`'s picks read it (`/debug/routing`, model `chat`).
async fn pod_active(proxy: &Proxy, pod: std::net::SocketAddr) -> Option<u64> {
    let debug = get(proxy.admin, "/debug/routing").await.ok()?.json();
    debug["models"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == "chat")?["pods"]
        .as_array()?
        .iter()
        .find(|p| p["address"] == pod.to_string())?["active"]
        .as_u64()
}

async fn ask(proxy: &Proxy, model: &str, i: usize) -> String {
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body(model, None, &format!("q{i}"), ""),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.pod()
}

#[tokio::test(flavor = "multi_thread")]
async fn sequential_requests_reuse_pooled_connections_and_the_gauge_returns_to_zero() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-pool");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let a = start_sim("a", &[], dir.path()).await;
    let b = start_sim("b", &[], dir.path()).await;
    // No engine-metrics reads: the connections counted are the requests' own.
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("least-loaded")
            .engine("none")
            .endpoint(a.addr)
            .endpoint(b.addr),
    );
    let proxy = ebpf_proxy(&models, &pins, &cg, &dir).await;
    let mut served = HashMap::new();
    for i in 0..40 {
        *served.entry(ask(&proxy, "chat", i).await).or_insert(0) += 1;
    }
    assert_eq!(served.len(), 2, "least-loaded used both pods: {served:?}");
    // A connection counts as unregistered from the kernel's connect until the proxy has
    // registered it: let that moment pass (one that is never registered still fails below).
    wait_for(0, Duration::from_secs(2), || {
        kernel_pods(&pins)
            .iter()
            .map(|p| p.unregistered)
            .sum::<u64>()
    });
    let pods = kernel_pods(&pins);
    let opened: u64 = pods
        .iter()
        .map(|p| p.in_flight + p.registered_idle + p.unregistered)
        .sum();
    assert!(
        opened <= 8,
        "40 requests opened {opened} connections: {pods:?}"
    );
    assert!(
        pods.iter().all(|p| p.unregistered == 0),
        "every connection was registered: {pods:?}"
    );
    // Done: no load anywhere, while the pooled connections stay open.
    for p in &pods {
        assert_eq!((p.active, p.in_flight), (0, 0), "{p:?}");
    }
    let idle: u64 = pods.iter().map(|p| p.registered_idle).sum();
    assert!(idle >= 2, "pooled connections stay open: {pods:?}");
    let view = get(proxy.admin, "/debug/routing").await.unwrap().json();
    assert_eq!(view["upstream_keepalive"], true);
    assert!(view["upstream_idle_connections"].as_u64() >= Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn another_proxys_requests_count_here_while_they_run_and_leave_when_they_end() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-node");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    // 200 tokens at 10 ms: a held request runs for about 2 s.
    let a = start_sim(
        "a",
        &["--inter-token-ms", "10", "--max-concurrency", "16"],
        dir.path(),
    )
    .await;
    let b = start_sim("b", &[], dir.path()).await;
    let models = ModelsFile::new()
        .model(
            ModelEntry::new("chat")
                .routing("least-loaded")
                .endpoint(a.addr)
                .endpoint(b.addr),
        )
        .model(
            ModelEntry::new("pin-a")
                .routing("least-loaded")
                .endpoint(a.addr),
        );
    let first = ebpf_proxy(&models, &pins, &cg, &dir).await;
    let second = ebpf_proxy(&models, &pins, &cg, &dir).await;
    // Warm the second proxy's pool to A, so its held requests go over pooled connections.
    for i in 0..3 {
        assert_eq!(ask(&second, "pin-a", i).await, "a");
    }
    let held: Vec<_> = (0..3)
        .map(|i| {
            let addr = second.addr;
            let body = chat_body("pin-a", None, &format!("long {i}"), r#"{"max_tokens":200}"#);
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &body).await })
        })
        .collect();
    assert_eq!(
        wait_for(3, Duration::from_secs(5), || kernel_load(&pins, a.addr)),
        3,
        "the second proxy's requests are in the node-wide gauge"
    );
    assert_eq!(
        pod_active(&first, a.addr).await,
        Some(3),
        "the first proxy reads them too"
    );
    // The first proxy's picks avoid A while it is loaded.
    for i in 0..4 {
        assert_eq!(
            ask(&first, "chat", i).await,
            "b",
            "pick {i} went to the loaded pod"
        );
    }
    for h in held {
        let r = h.await.unwrap().unwrap();
        assert_eq!(r.status, 200);
    }
    // They finished: they leave the gauge, though their connections stay pooled.
    assert_eq!(
        wait_for(0, Duration::from_secs(2), || kernel_load(&pins, a.addr)),
        0,
        "finished requests left load behind"
    );
    let pods = kernel_pods(&pins);
    let a_pod = pods.iter().find(|p| p.addr == a.addr).unwrap();
    assert!(
        a_pod.registered_idle >= 3,
        "pooled connections to A stay open: {pods:?}"
    );
    // The first proxy also reads A's own reports (scraped while the three ran); once they are
    // replaced or stale (a scrape interval, at most the report's freshness) A is idle there too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pod_active(&first, a.addr).await != Some(0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut spread = HashMap::new();
    for i in 0..4 {
        *spread.entry(ask(&first, "chat", 10 + i).await).or_insert(0) += 1;
    }
    assert_eq!(spread.get("a"), Some(&2), "A is idle again: {spread:?}");
}

/// A small deterministic generator (no dependency, reproducible from the printed seed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_any_moment_leaves_no_phantom_load_over_100_rounds() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-kill-loop");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    // Streams of 20 tokens at 2 ms: requests start and end all the time.
    let sims = [
        start_sim("a", &["--inter-token-ms", "2"], dir.path()).await,
        start_sim("b", &["--inter-token-ms", "2"], dir.path()).await,
    ];
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("least-loaded")
            .endpoints(sims.iter().map(|s| s.addr)),
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill loop seed {seed}");
    let mut rng = Lcg(seed);
    let mut killed_mid_request = 0;
    for round in 0..100 {
        let mut proxy = ebpf_proxy(&models, &pins, &cg, &dir).await;
        let clients: Vec<_> = (0..6)
            .map(|i| {
                let addr = proxy.addr;
                let stream = i % 2 == 0;
                tokio::spawn(async move {
                    for j in 0..1000 {
                        let extra = if stream {
                            r#"{"max_tokens":20,"stream":true}"#
                        } else {
                            r#"{"max_tokens":2}"#
                        };
                        let body = chat_body("chat", None, &format!("r{i}-{j}"), extra);
                        if post(addr, "/v1/chat/completions", &[], &body)
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                })
            })
            .collect();
        // A random moment to SIGKILL at is the point of the loop, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(20 + rng.next(180))).await;
        let busy: u64 = kernel_pods(&pins).iter().map(|p| p.in_flight).sum();
        proxy.proc.kill().expect("SIGKILL the proxy");
        if busy > 0 {
            killed_mid_request += 1;
        }
        let killed = Instant::now();
        // Everything the kernel counts for the pods: load, requests, connections.
        let left = || -> u64 {
            kernel_pods(&pins)
                .iter()
                .map(|p| p.active + p.in_flight + p.registered_idle + p.unregistered)
                .sum()
        };
        let settled = wait_for(0, Duration::from_secs(1), left);
        assert_eq!(
            settled,
            0,
            "round {round} (seed {seed}): {:?} after SIGKILL: {:?}",
            killed.elapsed(),
            kernel_pods(&pins)
        );
        for c in clients {
            c.abort();
        }
    }
    assert!(
        killed_mid_request >= 50,
        "only {killed_mid_request} of 100 kills hit requests in flight"
    );
}

/// Timeouts, retries and ejection with the eBPF gauge: a request that timed out, one retried
/// past a failing pod and one cut off mid-stream each leave the kernel's count at 0.
#[tokio::test(flavor = "multi_thread")]
async fn timeouts_retries_and_ejection_leave_no_phantom_load() {
    if !bpf_or_skip() {
        return;
    }
    use flexinfer_tests::backends::{fixed_status, hanging};
    let dir = TempDir::new("ebpf-failures");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let hang = hanging().await;
    let bad = fixed_status(503).await;
    let good = start_sim("good", &[], dir.path()).await;
    let mut streamer = start_sim("streamer", &["--inter-token-ms", "100"], dir.path()).await;
    let models = ModelsFile::new()
        .model(
            ModelEntry::new("hang")
                .routing("prefix")
                .endpoint(hang.addr),
        )
        .model(
            ModelEntry::new("flaky")
                .routing("least-loaded")
                .endpoint(bad.addr)
                .endpoint(good.addr),
        )
        .model(
            ModelEntry::new("stream")
                .routing("prefix")
                .endpoint(streamer.addr),
        );
    let mut flags = ebpf_flags(&pins);
    flags.extend(["--first-byte-timeout".into(), "1s".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = start_proxy(&models, &flags, &[], dir.path()).await;
    cg.add_pid(proxy.proc.pid())
        .expect("move into the test cgroup");

    // The hanging pod: in flight (1) while the proxy waits, 0 once it answered 504.
    let addr = proxy.addr;
    let waiting = tokio::spawn(async move {
        post(
            addr,
            "/v1/chat/completions",
            &[],
            &chat_body("hang", None, "q", ""),
        )
        .await
    });
    assert_eq!(
        wait_for(1, Duration::from_secs(2), || kernel_load(&pins, hang.addr)),
        1
    );
    assert_eq!(waiting.await.unwrap().unwrap().status, 504);
    assert_eq!(
        wait_for(0, Duration::from_secs(2), || kernel_load(&pins, hang.addr)),
        0,
        "the timed-out request's connection still counts"
    );

    // The 503 pod: retried past, then ejected.
    for i in 0..20 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("flaky", None, &format!("q{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(
            (r.status.as_u16(), r.pod()),
            (200, "good".into()),
            "{}",
            r.text()
        );
    }
    assert!(bad.requests() >= 1, "least-loaded tried the bad pod");

    // A stream whose pod dies mid-way: killed once its first event has arrived (before it,
    // the kill would be a reset before any byte, which the proxy answers with a 502).
    let stream = open_stream(proxy.addr, "stream", 50).await;
    assert_eq!(
        kernel_load(&pins, streamer.addr),
        1,
        "the stream is in flight"
    );
    streamer.proc.kill().unwrap();
    let text = stream.finish().await;
    assert!(text.contains("upstream_stream_broken"), "{text}");

    for (name, pod) in [
        ("hang", hang.addr),
        ("bad", bad.addr),
        ("good", good.addr),
        ("streamer", streamer.addr),
    ] {
        assert_eq!(
            wait_for(0, Duration::from_secs(2), || kernel_load(&pins, pod)),
            0,
            "phantom load on {name}: {:?}",
            kernel_pods(&pins)
        );
    }
}

/// The engine scraper reads every pod's metrics page over the proxy's own client, from every
/// node: those reads are no request the pod runs, so they never count in the kernel's load.
/// The pod here hangs, so each read stays open until the scrape timeout (2 s).
#[tokio::test(flavor = "multi_thread")]
async fn engine_scrapes_never_count_as_requests_in_flight() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-scrape");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let hang = flexinfer_tests::backends::hanging().await;
    // engine auto: the scraper reads the pod's page; no client request goes to it.
    let models = ModelsFile::new().model(
        ModelEntry::new("quiet")
            .routing("prefix")
            .endpoint(hang.addr),
    );
    let proxy = ebpf_proxy(&models, &pins, &cg, &dir).await;
    // The first read may have started before the proxy joined the test cgroup; the second
    // (after the first timed out) surely runs inside it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while hang.requests() < 2 {
        assert!(
            Instant::now() < deadline,
            "no second scrape of the pod within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The read hangs now, on a connection the kernel sees; the pod's load stays 0.
    for _ in 0..20 {
        assert_eq!(kernel_load(&pins, hang.addr), 0, "a scrape counted as load");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        kernel_pods(&pins).iter().any(|p| p.addr == hang.addr),
        "the pod is tracked"
    );
    drop(proxy);
}
