//! Proxies of a fleet that read what llama.cpp pods show of their slots' prompts (`/slots`,
//! spoken here by the sim's `--slot-prompts`): a new document goes where the pods hold least,
//! and another proxy that never saw it sends its next question there, matched by the pod's own
//! view (its route header's depth), not by its index or the hash.

use std::time::{Duration, Instant};

use flexinfer_tests::*;

/// Document `d`: long enough for several chain links, its own from the first line.
fn document(d: usize) -> String {
    format!(
        "Document {d} of the fleet test. {}",
        format!("Section {d} says that replica {d} keeps its own ledger of prompts. ").repeat(60)
    )
}

fn question(d: usize, q: usize) -> String {
    chat_body(
        "llm",
        Some(&document(d)),
        &format!("Question {q}: what does section {d} say?"),
        "",
    )
}

/// What `proxy`'s `/debug/routing` says the pod `pod` shows of its slots.
async fn view_of(proxy: &Proxy, pod: std::net::SocketAddr) -> serde_json::Value {
    let debug = get(proxy.admin, "/debug/routing")
        .await
        .expect("debug")
        .json();
    debug["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["pods"].as_array().into_iter().flatten())
        .find(|p| p["address"] == pod.to_string())
        .map(|p| p["slot_prompts"].clone())
        .unwrap_or_default()
}

/// Waits until every proxy's view of `pod` shows `slots` prompts.
async fn wait_for_views(proxies: &[&Proxy], pod: std::net::SocketAddr, slots: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for proxy in proxies {
        loop {
            let v = view_of(proxy, pod).await;
            if v["slots"].as_u64() == Some(slots) && v["fresh"] == true {
                break;
            }
            assert!(Instant::now() < deadline, "view of {pod}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Two proxies of a fleet in front of `pods` (a cache-aware llama.cpp model), each reading
/// every pod's slots every 50 ms.
async fn two_proxies(
    pods: impl IntoIterator<Item = std::net::SocketAddr>,
    dir: &std::path::Path,
) -> (Proxy, Proxy) {
    let models = ModelsFile::new().model(
        ModelEntry::new("llm")
            .endpoints(pods)
            .routing("cache-aware")
            .engine("llamacpp"),
    );
    let flags = [
        "--fleet-size",
        "2",
        "--engine-slot-prompts-budget",
        "40",
        "--route-header",
    ];
    let a = start_proxy(&models, &flags, &[], dir).await;
    let b = start_proxy(&models, &flags, &[], dir).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_places_new_documents_where_the_pods_hold_least_and_finds_them_there() {
    let dir = TempDir::new("slot-prompts");
    let slots = ["--slot-prompts", "3"];
    let sims = [
        start_sim("pod-1", &slots, dir.path()).await,
        start_sim("pod-2", &slots, dir.path()).await,
        start_sim("pod-3", &slots, dir.path()).await,
    ];
    let (a, b) = two_proxies(sims.iter().map(|s| s.addr), dir.path()).await;
    // Pods 1 and 2 hold three documents each, sent to them straight.
    for (pod, docs) in [(0, [10, 11, 12]), (1, [20, 21, 22])] {
        for d in docs {
            let r = post(sims[pod].addr, "/v1/chat/completions", &[], &question(d, 0))
                .await
                .expect("straight to the pod");
            assert_eq!(r.status, 200, "{}", r.text());
        }
        wait_for_views(&[&a, &b], sims[pod].addr, 3).await;
    }
    // Two new documents through proxy a: the pod that holds nothing takes them, whatever their
    // hash.
    for (n, d) in [1, 2].into_iter().enumerate() {
        let r = post(a.addr, "/v1/chat/completions", &[], &question(d, 1))
            .await
            .expect("through a");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.pod(), "pod-3", "document {d}");
        wait_for_views(&[&a, &b], sims[2].addr, n as u64 + 1).await;
    }
    // Proxy b never saw them: it finds both on pod 3, by what pod 3 shows.
    for d in [1, 2] {
        let r = post(b.addr, "/v1/chat/completions", &[], &question(d, 2))
            .await
            .expect("through b");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.pod(), "pod-3", "document {d}");
        let route = r.header("x-flexinfer-route").unwrap_or_default().to_owned();
        let depth: u32 = route
            .split("; ")
            .find_map(|p| p.strip_prefix("depth="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a depth in {route:?}"));
        assert!(depth >= 3, "matched by pod 3's view: {route}");
    }
    let metrics = b.metrics().await;
    let ok = metric_value(
        &metrics,
        "flexinfer_proxy_engine_slot_prompt_reads_total",
        &[("target", &sims[2].addr.to_string()), ("result", "ok")],
    );
    assert!(ok.is_some_and(|n| n >= 1.0), "{metrics}");
}

/// A document another proxy's request is still computing: the pod's page shows it in a busy
/// slot, so a question through this proxy waits for that slot to be free (llama.cpp keeps the
/// prompt there) rather than compute the document again beside it, and finds it cached.
#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_waits_for_a_document_another_proxy_is_computing() {
    let dir = TempDir::new("slot-prompts-wait");
    // About 1.5 s of prefill for a document.
    let sim_flags = ["--slot-prompts", "2", "--prefill-us-per-token", "1500"];
    let sim = start_sim("pod-1", &sim_flags, dir.path()).await;
    let (a, b) = two_proxies([sim.addr], dir.path()).await;
    let a_addr = a.addr;
    let first =
        tokio::spawn(
            async move { post(a_addr, "/v1/chat/completions", &[], &question(5, 1)).await },
        );
    // Proxy b reads the pod while it computes the document.
    wait_for_views(&[&b], sim.addr, 1).await;
    let r = post(b.addr, "/v1/chat/completions", &[], &question(5, 2))
        .await
        .expect("through b");
    assert_eq!(r.status, 200, "{}", r.text());
    let route = r.header("x-flexinfer-route").unwrap_or_default().to_owned();
    assert!(route.contains("prefill-wait="), "{route}");
    let cached: u64 = r
        .header("x-sim-cached-tokens")
        .and_then(|v| v.parse().ok())
        .expect("the sim's cached tokens");
    assert!(
        cached > 500,
        "the document was computed once: {cached} cached"
    );
    let first = first.await.expect("joined").expect("through a");
    assert_eq!(first.status, 200, "{}", first.text());
    let metrics = b.metrics().await;
    let prefilled = metric_value(
        &metrics,
        "flexinfer_proxy_cache_aware_prefill_waits_total",
        &[("outcome", "prefilled")],
    );
    assert_eq!(prefilled, Some(1.0), "{metrics}");
}
