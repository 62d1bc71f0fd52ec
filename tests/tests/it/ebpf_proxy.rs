//! The eBPF gauge through real proxy processes: a node-wide view shared by two proxies, no
//! phantom load after SIGKILL, pinned state reused across a restart, and the userspace
//! fallback when BPF is unavailable.
//!
//! Proxies run inside a child cgroup the test creates (sock_ops attaches there), with a pin
//! directory of their own; both are removed afterwards. These tests fail, not skip, when
//! FLEXINFER_REQUIRE_EBPF is set (CI) and BPF is broken.

use std::collections::HashMap;
use std::time::Duration;

use flexinfer_tests::ebpf::{
    bpf_or_skip, ebpf_flags, kernel_load, test_cgroup, wait_for, TestPins,
};
use flexinfer_tests::*;

fn models(slow: &Sim, others: &[&Sim]) -> ModelsFile {
    let all = std::iter::once(slow)
        .chain(others.iter().copied())
        .map(|s| s.addr);
    ModelsFile::new()
        .model(
            ModelEntry::new("chat")
                .routing("least-loaded")
                .endpoints(all),
        )
        .model(
            ModelEntry::new("pin-a")
                .routing("least-loaded")
                .endpoint(slow.addr),
        )
}

/// Start `n` long requests through `proxy`; they run until done or aborted (or the proxy dies).
async fn hold(proxy: &Proxy, model: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let addr = proxy.addr;
            let body = chat_body(model, None, &format!("long {i}"), r#"{"max_tokens":3000}"#);
            tokio::spawn(async move {
                let _ = post(addr, "/v1/chat/completions", &[], &body).await;
            })
        })
        .collect()
}

async fn pods_of(proxy: &Proxy, n: usize) -> HashMap<String, usize> {
    let mut hits = HashMap::new();
    for i in 0..n {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("chat", None, &format!("q{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        *hits.entry(r.pod()).or_insert(0) += 1;
    }
    hits
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_proxy_sees_the_first_ones_connections() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-two");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    // Every pod streams a token per 10 ms: the held requests ask for 3000 tokens (30 s), the
    // probes for 2.
    let a = start_sim(
        "a",
        &["--inter-token-ms", "10", "--max-concurrency", "16"],
        dir.path(),
    )
    .await;
    let b = start_sim("b", &[], dir.path()).await;
    let c = start_sim("c", &[], dir.path()).await;
    let cfg = models(&a, &[&b, &c]);
    let flags = ebpf_flags(&pins);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let p1 = start_proxy(&cfg, &flags, &[], dir.path()).await;
    let p2 = start_proxy(&cfg, &flags, &[], dir.path()).await;
    cg.add_pid(p1.proc.pid())
        .expect("move into the test cgroup");
    cg.add_pid(p2.proc.pid())
        .expect("move into the test cgroup");
    for p in [&p1, &p2] {
        assert!(metric_value(&p.metrics().await, "flexinfer_proxy_ebpf_enabled", &[]) == Some(1.0));
    }

    // Process 1 holds four requests on pod A.
    let held = hold(&p1, "pin-a", 4).await;
    assert_eq!(
        wait_for(4, Duration::from_secs(5), || kernel_load(&pins, a.addr)),
        4
    );

    // Process 2 has sent nothing to A itself, yet its least-loaded picks avoid A.
    let hits = pods_of(&p2, 8).await;
    assert_eq!(
        hits.get("a"),
        None,
        "process 2 ignored process 1's load on A: {hits:?}"
    );
    // Control: a proxy on its own (userspace) gauge does not know and round-robins onto A.
    let blind = start_proxy(&cfg, &[], &[], dir.path()).await;
    let hits = pods_of(&blind, 6).await;
    assert!(
        hits.get("a").copied().unwrap_or(0) >= 1,
        "the control should hit A: {hits:?}"
    );

    // The operator view agrees. A connection a proxy opens at that moment (an engine scrape)
    // counts busy in the kernel until the proxy registers it, a few ms later, so the view is
    // read until it settles.
    let status = || {
        let out = std::process::Command::new(proxy_bin())
            .args(["ebpf", "status", "--bpf-pin-dir"])
            .arg(&pins.opts.pin_dir)
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let active_on_a = || {
        status()
            .lines()
            .find(|l| l.ends_with(&a.addr.to_string()))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    };
    assert_eq!(
        wait_for(Some(4), Duration::from_secs(5), active_on_a),
        Some(4),
        "{}",
        status()
    );
    for h in held {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_proxy_leaves_no_phantom_load_and_a_restart_counts_from_the_pins() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-kill");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let a = start_sim(
        "a",
        &["--inter-token-ms", "10", "--max-concurrency", "16"],
        dir.path(),
    )
    .await;
    let b = start_sim("b", &[], dir.path()).await;
    let cfg = models(&a, &[&b]);
    let flags = ebpf_flags(&pins);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();

    let mut p1 = start_proxy(&cfg, &flags, &[], dir.path()).await;
    cg.add_pid(p1.proc.pid())
        .expect("move into the test cgroup");
    let _held = hold(&p1, "pin-a", 3).await;
    assert_eq!(
        wait_for(3, Duration::from_secs(5), || kernel_load(&pins, a.addr)),
        3
    );
    // SIGKILL mid-request: the kernel closes its sockets, and the counts follow.
    p1.proc.kill().unwrap();
    assert_eq!(
        wait_for(0, Duration::from_secs(5), || kernel_load(&pins, a.addr)),
        0,
        "phantom load after SIGKILL"
    );

    // A restarted proxy re-opens the pinned set: one attachment, counts start from the truth.
    let p2 = start_proxy(&cfg, &flags, &[], dir.path()).await;
    cg.add_pid(p2.proc.pid())
        .expect("move into the test cgroup");
    assert!(p2.proc.log_text().contains("eBPF gauge loaded"));
    let _held = hold(&p2, "pin-a", 2).await;
    assert_eq!(
        wait_for(2, Duration::from_secs(5), || kernel_load(&pins, a.addr)),
        2,
        "double count after restart"
    );
    let attached =
        routing_userspace::ebpf::sys::sock_ops_attached(&std::fs::File::open(cg.path()).unwrap())
            .unwrap();
    assert_eq!(attached.len(), 1, "the restart attached a second program");
    // Its picks read the pinned gauge: A is busy, so "chat" goes to B.
    let hits = pods_of(&p2, 4).await;
    assert_eq!(hits.get("b"), Some(&4), "{hits:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_bpf_the_proxy_serves_on_the_userspace_gauge() {
    let dir = TempDir::new("ebpf-none");
    let sim = start_sim("a", &[], dir.path()).await;
    let cfg = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("least-loaded")
            .endpoint(sim.addr),
    );
    // A directory that is not bpffs stands for "BPF unavailable".
    let fake = dir.path().join("not-bpffs");
    std::fs::create_dir_all(&fake).unwrap();
    let pin_dir = fake.join("flexinfer");
    let (fake, pin_dir) = (fake.display().to_string(), pin_dir.display().to_string());
    let proxy = start_proxy(
        &cfg,
        &[
            "--gauge",
            "auto",
            "--bpffs",
            &fake,
            "--bpf-pin-dir",
            &pin_dir,
        ],
        &[],
        dir.path(),
    )
    .await;
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body("chat", None, "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!((r.status.as_u16(), r.pod()), (200, "a".into()));
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(&m, "flexinfer_proxy_ebpf_enabled", &[]),
        Some(0.0)
    );
    let log = proxy.proc.log_text();
    assert!(
        log.contains("eBPF gauge unavailable; using the userspace in-flight gauge"),
        "{log}"
    );
    assert_eq!(
        log.matches("eBPF gauge unavailable").count(),
        1,
        "the reason is logged once"
    );
    let view = get(proxy.admin, "/debug/routing").await.unwrap().json();
    assert_eq!(view["gauge"], "userspace");
    assert_eq!(view["upstream_keepalive"], true);

    // --require-ebpf makes the same situation fatal, with the reason.
    let out = std::process::Command::new(proxy_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--require-ebpf",
            "--bpffs",
            &fake,
            "--bpf-pin-dir",
            &pin_dir,
            "--config",
        ])
        .arg(&proxy.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("eBPF gauge required but unavailable"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_ebpf_gauge_reservations_spread_a_burst_and_are_consumed_when_requests_start() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-burst");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let mut sims = Vec::new();
    for i in 0..4 {
        sims.push(
            start_sim(
                &format!("p{i}"),
                &["--ttft-base-ms", "2000", "--max-concurrency", "64"],
                dir.path(),
            )
            .await,
        );
    }
    let cfg = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("least-loaded")
            .endpoints(sims.iter().map(|s| s.addr)),
    );
    let flags = ebpf_flags(&pins);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = start_proxy(&cfg, &flags, &[], dir.path()).await;
    cg.add_pid(proxy.proc.pid())
        .expect("move into the test cgroup");
    let view = get(proxy.admin, "/debug/routing").await.unwrap().json();
    assert_eq!(
        (view["gauge"].as_str(), view["upstream_keepalive"].as_bool()),
        (Some("ebpf"), Some(true)),
        "the eBPF gauge keeps upstream connections pooled"
    );
    let hits = burst(proxy.addr, "chat", 50).await;
    // An even share is 13 at most. A new connection counts in the kernel from its handshake,
    // and its reservation until the request starts on it a moment later: a pick in between
    // sees that pod one higher (the safe side of the hand-over, never neither), so a loaded
    // machine can move one request of the burst elsewhere. The exact spread of a burst is the
    // ledger's unit tests' (router::tests); here, that the burst spreads over the real gauge.
    assert!(
        hits.len() == 4 && hits.values().all(|&n| n <= 14),
        "every pod, at most one over an even share of 13: {hits:?}"
    );
    // Every reservation was replaced by its request (marked busy when it started), none left.
    assert_eq!(pending_reservations(proxy.admin).await, 0);
    for s in &sims {
        assert_eq!(
            wait_for(0, Duration::from_secs(5), || kernel_load(&pins, s.addr)),
            0,
            "connections close with their requests"
        );
    }
}

/// `serve` with the eBPF flags and `extra`, as an operator's shell runs it (with
/// `RUST_BACKTRACE=1`, which must not turn errors into stack dumps).
fn serve_cmd(pins: &TestPins, config: &std::path::Path, listen: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(proxy_bin());
    cmd.arg("serve")
        .args(ebpf_flags(pins))
        .arg("--config")
        .arg(config)
        .args(["--listen", listen, "--admin-listen", "127.0.0.1:0"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "warn");
    cmd
}

#[test]
fn a_proxy_that_cannot_start_leaves_the_node_untouched() {
    if !bpf_or_skip() {
        return;
    }
    let dir = TempDir::new("ebpf-no-start");
    let cg = test_cgroup();
    let pins = TestPins::new(&cg);
    let pinned = || pins.opts.pin_dir.exists();
    let good = dir.path().join("models.yaml");
    ModelsFile::new()
        .model(ModelEntry::new("m").endpoint("127.0.0.1:9"))
        .write_to(&good)
        .unwrap();
    let bad = dir.path().join("typo.yaml");
    std::fs::write(&bad, "models:\n  - name: m\n    routng: prefix\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();

    for (what, config, listen, says) in [
        (
            "a typo in the models file",
            &bad,
            "127.0.0.1:0",
            "unknown field `routng`",
        ),
        (
            "a missing models file",
            &dir.path().join("none.yaml"),
            "127.0.0.1:0",
            "cannot read",
        ),
        (
            "a listen address in use",
            &good,
            taken.as_str(),
            "cannot listen on",
        ),
    ] {
        let out = serve_cmd(&pins, config, listen).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert!(
            stderr.starts_with("Error: ") && stderr.contains(says),
            "{what}: {stderr}"
        );
        assert!(
            !stderr.to_lowercase().contains("backtrace"),
            "{what}: {stderr}"
        );
        assert!(
            !pinned(),
            "{what}: the eBPF data plane was loaded before the error"
        );
    }

    // Control: the same command with a good file and a free port loads and pins it.
    let mut child = serve_cmd(&pins, &good, "127.0.0.1:0").spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !pinned() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(pinned(), "a proxy that starts pins its data plane there");
}
