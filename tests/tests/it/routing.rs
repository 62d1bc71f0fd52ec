//! The core routing behaviour over real sockets: one proxy process in front of several `sim`
//! processes, configured through a models file.

use std::collections::{HashMap, HashSet};

use flexinfer_tests::*;

const SYSTEM: &str = "You are FlexInfer's support assistant. Answer from the product manual only, cite sections, keep it short.";

/// One model `name` with `routing` over `pods`.
fn model(name: &str, routing: &str, pods: &[&Sim]) -> ModelsFile {
    ModelsFile::new().model(
        ModelEntry::new(name)
            .routing(routing)
            .endpoints(pods.iter().map(|p| p.addr)),
    )
}

async fn sims(n: usize, extra: &[&str], dir: &TempDir) -> Vec<Sim> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(start_sim(&format!("pod-{i}"), extra, dir.path()).await);
    }
    v
}

/// Four sims (`pod-0`..`pod-3`, with `sim_flags`) behind one proxy serving model `chat` with
/// `routing`. The directory holds the logs; keep it alive as long as the processes.
async fn fleet(tag: &str, routing: &str, sim_flags: &[&str]) -> (TempDir, Vec<Sim>, Proxy) {
    let dir = TempDir::new(tag);
    let pods = sims(4, sim_flags, &dir).await;
    let refs: Vec<&Sim> = pods.iter().collect();
    let proxy = start_proxy(&model("chat", routing, &refs), &[], &[], dir.path()).await;
    (dir, pods, proxy)
}

#[tokio::test(flavor = "multi_thread")]
async fn prefix_routing_pins_a_system_prompt_and_spreads_distinct_ones() {
    let (_dir, _pods, proxy) = fleet("prefix", "prefix", &[]).await;

    // A fixed system prompt: 100 requests, one pod.
    let mut served = HashSet::new();
    for i in 0..100 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("chat", Some(SYSTEM), &format!("question {i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        served.insert(r.pod());
    }
    assert_eq!(
        served.len(),
        1,
        "one system prompt must stay on one pod: {served:?}"
    );

    // Distinct system prompts spread over every pod.
    let mut hits: HashMap<String, usize> = HashMap::new();
    for i in 0..80 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("chat", Some(&format!("Tenant {i} system prompt")), "hi", ""),
        )
        .await
        .unwrap();
        *hits.entry(r.pod()).or_default() += 1;
    }
    assert_eq!(
        hits.len(),
        4,
        "distinct prompts must reach all pods: {hits:?}"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[
                ("model", "chat"),
                ("key_source", "canonical"),
                ("outcome", "pod")
            ]
        ),
        Some(180.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn session_headers_and_headerless_multi_turn_conversations_stick() {
    let (_dir, _pods, proxy) = fleet("session", "session-affinity", &[]).await;

    for (header, users) in [("x-session-id", 12), ("x-conversation-id", 12)] {
        let mut first: HashMap<String, String> = HashMap::new();
        for round in 0..5 {
            for u in 0..users {
                let id = format!("user-{u}");
                let r = post(
                    proxy.addr,
                    "/v1/chat/completions",
                    &[(header, &id)],
                    &chat_body("chat", None, &format!("turn {round}"), ""),
                )
                .await
                .unwrap();
                assert_eq!(
                    &r.pod(),
                    first.entry(id).or_insert_with(|| r.pod()),
                    "{header} moved"
                );
            }
        }
        let distinct: HashSet<_> = first.values().collect();
        assert!(
            distinct.len() > 1,
            "12 sessions all on one pod is not affinity but luck"
        );
    }

    // Multi-turn conversations with no header at all: each keeps its pod across turns.
    for c in 0..8 {
        let opening = format!("Conversation {c}: help me plan a trip");
        let mut messages = vec![
            serde_json::json!({"role": "system", "content": "You are a travel agent."}),
            serde_json::json!({"role": "user", "content": opening}),
        ];
        let mut pod = None;
        for turn in 0..4 {
            let body = serde_json::json!({"model": "chat", "messages": messages, "max_tokens": 2})
                .to_string();
            let r = post(proxy.addr, "/v1/chat/completions", &[], &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200);
            let p = pod.get_or_insert_with(|| r.pod()).clone();
            assert_eq!(r.pod(), p, "conversation {c} moved at turn {turn}");
            let reply = r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string();
            messages.push(serde_json::json!({"role": "assistant", "content": reply}));
            messages
                .push(serde_json::json!({"role": "user", "content": format!("follow-up {turn}")}));
        }
    }
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "implicit-session")]
        ),
        Some(32.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_key_routes_like_canonical_context_and_never_fails() {
    let (_dir, _pods, proxy) = fleet("malformed", "prefix", &[]).await;
    for doc in ["doc A", "doc B", "doc C", "doc D", "doc E"] {
        let body = chat_body(
            "chat",
            Some("Answer from the document."),
            "Summarize",
            &format!(r#"{{"document_context":"{doc}"}}"#),
        );
        let plain = post(proxy.addr, "/v1/chat/completions", &[], &body)
            .await
            .unwrap();
        for bad in [
            "bad key with spaces 1",
            &"k".repeat(129),
            "semi;colon",
            "ünïcode",
        ] {
            let r = post(
                proxy.addr,
                "/v1/chat/completions",
                &[("x-flexinfer-cache-key", bad)],
                &body,
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "a malformed key must not fail the request");
            assert_eq!(
                r.pod(),
                plain.pod(),
                "malformed key {bad:?} must route like canonical context"
            );
        }
        // A valid explicit key overrides the context.
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", "tenant-a/doc-42")],
            &body,
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
    }
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "canonical")]
        ),
        Some(25.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "explicit-header")]
        ),
        Some(5.0)
    );
    assert!(proxy
        .proc
        .log_text()
        .contains("ignoring malformed routing key"));
}

#[tokio::test(flavor = "multi_thread")]
async fn least_loaded_spreads_a_burst_of_50_over_4_slow_pods() {
    // Slow pods: each request holds its pod for two seconds, far longer than the burst takes to
    // arrive even on a loaded machine, so no pod frees up mid-burst.
    let (_dir, _pods, proxy) = fleet(
        "burst",
        "least-loaded",
        &["--ttft-base-ms", "2000", "--max-concurrency", "64"],
    )
    .await;
    let hits = burst(proxy.addr, "chat", 50).await;
    assert_eq!(hits.values().sum::<usize>(), 50);
    assert!(
        hits.values().all(|&n| n <= 13),
        "at most 13 per pod: {hits:?}"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_least_loaded_reservations_total",
            &[("model", "chat")]
        ),
        Some(50.0)
    );
    // Every reservation was consumed by its real connection: none is left pending (the TTL is
    // 10 s, so an unconsumed one would still be listed) and none has expired.
    assert_eq!(pending_reservations(proxy.admin).await, 0);
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_least_loaded_reservations_expired_total",
            &[("model", "chat")]
        ),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_pod_moves_only_that_pods_keys() {
    let (_dir, pods, proxy) = fleet("churn", "prefix", &[]).await;
    let body = chat_body("chat", None, "hi", "");
    let mut before = HashMap::new();
    for k in 0..120 {
        let key = format!("tenant/{k}");
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", &key)],
            &body,
        )
        .await
        .unwrap();
        before.insert(key, r.pod());
    }
    let gone = "pod-2".to_string();
    let kept: Vec<&Sim> = pods.iter().filter(|p| p.name != gone).collect();
    proxy.rewrite_config(&model("chat", "prefix", &kept)).await;
    let mut moved = 0;
    for (key, old) in &before {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", key)],
            &body,
        )
        .await
        .unwrap();
        assert_ne!(r.pod(), gone, "the removed pod still gets traffic");
        if old != &gone {
            assert_eq!(&r.pod(), old, "key {key} moved although its pod stayed");
        } else {
            moved += 1;
        }
    }
    assert!(moved > 0, "pod-2 held no keys; the test proves nothing");
    // A broken file is logged and the last good table stays.
    let key0 = [("x-flexinfer-cache-key", "tenant/0")];
    let pod0 = post(proxy.addr, "/v1/chat/completions", &key0, &body)
        .await
        .unwrap()
        .pod();
    proxy
        .rewrite_config_refused(
            &ModelsFile::new().model(ModelEntry::new("chat").routing("fastest")),
        )
        .await;
    let r = post(proxy.addr, "/v1/chat/completions", &key0, &body)
        .await
        .unwrap();
    assert_eq!((r.status.as_u16(), r.pod()), (200, pod0));
    assert!(proxy
        .proc
        .log_text()
        .contains("invalid models file; keeping the last good table"));
    // And back: re-adding the pod returns exactly its keys.
    proxy
        .rewrite_config(&model("chat", "prefix", &pods.iter().collect::<Vec<_>>()))
        .await;
    for (key, old) in &before {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", key)],
            &body,
        )
        .await
        .unwrap();
        assert_eq!(&r.pod(), old);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_endpoints_and_dead_pods_fall_back_to_the_service() {
    let dir = TempDir::new("fallback");
    let service = start_sim("the-service", &[], dir.path()).await;
    let live = start_sim("live", &[], dir.path()).await;
    let dead = format!("127.0.0.1:{}", free_port());
    let cfg = ModelsFile::new()
        .model(
            ModelEntry::new("empty")
                .routing("prefix")
                .service_at(service.addr),
        )
        .model(
            ModelEntry::new("deadpods")
                .routing("session-affinity")
                .service_at(service.addr)
                .endpoint(&dead),
        )
        .model(
            ModelEntry::new("mixed")
                .routing("prefix")
                .endpoints([dead.clone(), live.addr.to_string()]),
        );
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body("empty", Some(SYSTEM), "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!((r.status.as_u16(), r.pod()), (200, "the-service".into()));
    // Every pod refuses connections: retried, then the Service.
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[("x-session-id", "s1")],
        &chat_body("deadpods", None, "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!((r.status.as_u16(), r.pod()), (200, "the-service".into()));
    // One dead pod among live ones: every key is served, by the live pod.
    for k in 0..20 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", &format!("k{k}"))],
            &chat_body("mixed", None, "hi", ""),
        )
        .await
        .unwrap();
        assert_eq!((r.status.as_u16(), r.pod()), (200, "live".into()));
    }
    let m = proxy.metrics().await;
    assert!(
        metric_value(
            &m,
            "flexinfer_proxy_upstream_connect_errors_total",
            &[("model", "mixed")]
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_target_hits_total",
            &[("model", "empty"), ("target", "service-dns")]
        ),
        Some(1.0)
    );
    // Nothing at all to reach: an OpenAI-shaped 502, not a hang or a dropped connection.
    let cfg2 = ModelsFile::new().model(ModelEntry::new("gone").routing("prefix").endpoint(&dead));
    proxy.rewrite_config(&cfg2).await;
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body("gone", Some(SYSTEM), "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["code"], "upstream_unreachable");
}

/// The prompt tokens the sim found cached for a request (`x-sim-cached-tokens`).
fn cached(r: &Reply) -> u64 {
    r.header("x-sim-cached-tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `flexinfer_proxy_cache_aware_prefill_waits_total` of `model` with `outcome`.
fn prefill_waits(metrics: &str, model: &str, outcome: &str) -> Option<f64> {
    metric_value(
        metrics,
        "flexinfer_proxy_cache_aware_prefill_waits_total",
        &[("model", model), ("outcome", outcome)],
    )
}

/// Cache-aware over real sockets: a request whose prompt another request is still prefilling on
/// its pod waits for that prefill (the first one's first streamed token) and then finds the
/// prompt cached, where sent at once it would have computed it all again beside the first (the
/// sim, as vLLM, shares a prompt once it is computed). The route header and the metric say it
/// waited.
#[tokio::test(flavor = "multi_thread")]
async fn cache_aware_waits_for_a_prefill_of_its_prompt_in_progress_and_reuses_it() {
    let dir = TempDir::new("prefill-wait");
    // About 1,000 prompt tokens at 1 ms each: the first request prefills for about a second.
    let pods = sims(2, &["--prefill-us-per-token", "1000"], &dir).await;
    let proxy = start_proxy(
        &model("chat", "cache-aware", &[&pods[0], &pods[1]]),
        &["--route-header"],
        &[],
        dir.path(),
    )
    .await;
    let document = "a page of the tenant's long document ".repeat(110);
    let ask = |q: &str| chat_body("chat", Some(&document), q, r#"{"stream":true}"#);
    let addr = proxy.addr;
    let first_body = ask("first question");
    let first =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &first_body).await });
    // Decided while the first one prefills.
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let second = post(addr, "/v1/chat/completions", &[], &ask("second question"))
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(
        (first.status.as_u16(), second.status.as_u16()),
        (200, 200),
        "{}",
        second.text()
    );
    assert_eq!(second.pod(), first.pod(), "the pod that holds the document");
    let route = second.header("x-flexinfer-route").unwrap_or_default();
    assert!(route.contains("; prefill-wait="), "{route}");
    assert_eq!(cached(&first), 0);
    assert!(
        cached(&second) >= 800,
        "the document was cached when the second request reached the pod: {} tokens",
        cached(&second)
    );
    let metrics = proxy.metrics().await;
    let waits = |outcome: &str| prefill_waits(&metrics, "chat", outcome);
    assert_eq!(waits("prefilled"), Some(1.0), "{metrics}");
    assert_eq!(waits("timeout"), Some(0.0));
}

/// On a llama.cpp pod the prompt stays in the slot that computed it until the answer ends: a
/// proxy holds a second request for it until that end, and a third until the second's end (one
/// waiter per end: released together, they raced for the one slot).
#[tokio::test]
async fn on_llama_cpp_pods_a_prompt_in_progress_is_waited_for_until_its_answer_ends_one_at_a_time()
{
    use std::time::{Duration, Instant};
    let dir = TempDir::new("prefill-wait-llama");
    // About 1,000 prompt tokens at 2 ms each, then 10 tokens 50 ms apart: each answer ends
    // half a second after its first token, well before a waiter would give up (as long again
    // as the prompt took).
    let pods = sims(
        2,
        &["--prefill-us-per-token", "2000", "--inter-token-ms", "50"],
        &dir,
    )
    .await;
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("cache-aware")
            .engine("llamacpp")
            .endpoints(pods.iter().map(|p| p.addr)),
    );
    let proxy = start_proxy(&models, &["--route-header"], &[], dir.path()).await;
    let document = "a page of the tenant's long document ".repeat(110);
    let ask = |q: &str| {
        chat_body(
            "chat",
            Some(&document),
            q,
            r#"{"stream":true,"max_tokens":10}"#,
        )
    };
    let addr = proxy.addr;
    let send = |body: String| {
        tokio::spawn(async move {
            let reply = post(addr, "/v1/chat/completions", &[], &body).await;
            (reply, Instant::now())
        })
    };
    let first = send(ask("first question"));
    // Decided while the first one prefills, the second before the third.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second_sent = Instant::now();
    let second = send(ask("second question"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = send(ask("third question"));
    let (first, first_done) = first.await.unwrap();
    let (first, second, third) = (
        first.unwrap(),
        second.await.unwrap().0.unwrap(),
        third.await.unwrap().0.unwrap(),
    );
    for r in [&first, &second, &third] {
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        assert_eq!(r.pod(), first.pod(), "the pod that holds the document");
    }
    let waited = |r: &Reply| -> u64 {
        let route = r.header("x-flexinfer-route").unwrap_or_default();
        route
            .split("; ")
            .find_map(|f| f.strip_prefix("prefill-wait="))
            .and_then(|ms| ms.strip_suffix("ms"))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no prefill-wait in {route}"))
    };
    // The first answer ended half a second after its first token: the second request waited
    // for the end, not the token.
    let until_first_ended = (first_done - second_sent).as_millis() as u64;
    assert!(
        waited(&second) + 250 >= until_first_ended,
        "the second waited {} ms; the first ended {until_first_ended} ms after it was sent",
        waited(&second)
    );
    // The third waited for the second's end, which came after the first's.
    assert!(
        waited(&third) > waited(&second),
        "one waiter per end: {} ms, then {} ms",
        waited(&second),
        waited(&third)
    );
    assert!(cached(&second) >= 800 && cached(&third) >= 800);
    let metrics = proxy.metrics().await;
    let waits = |outcome: &str| prefill_waits(&metrics, "chat", outcome);
    assert_eq!(waits("prefilled"), Some(2.0), "{metrics}");
    assert_eq!(
        (waits("timeout"), waits("recompute")),
        (Some(0.0), Some(0.0))
    );
}
