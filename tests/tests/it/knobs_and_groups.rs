//! Knobs reach the proxy through the spec's environment variables (invalid ones fall back to
//! the defaults), the spec's debug log lines, and shared service-label groups over real sockets.

use flexinfer_tests::*;

fn prefix_model(sims: &[&Sim]) -> ModelsFile {
    ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            .endpoints(sims.iter().map(|s| s.addr)),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn knob_environment_variables_reach_key_extraction() {
    let dir = TempDir::new("knobs");
    let mut sims = Vec::new();
    for i in 0..4 {
        sims.push(start_sim(&format!("pod-{i}"), &[], dir.path()).await);
    }
    let refs: Vec<&Sim> = sims.iter().collect();
    let body = chat_body("chat", None, "hi", "");
    // An 8-character limit: a 12-character key is malformed and ignored; with no system prompt
    // the request falls through to the session chain (its implicit session).
    let strict = start_proxy(
        &prefix_model(&refs),
        &[],
        &[("PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH", "8")],
        dir.path(),
    )
    .await;
    post(
        strict.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", "twelve-chars")],
        &body,
    )
    .await
    .unwrap();
    post(
        strict.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", "eight-ch")],
        &body,
    )
    .await
    .unwrap();
    let m = strict.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "explicit-header")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "implicit-session")]
        ),
        Some(1.0)
    );
    let view = get(strict.admin, "/debug/routing").await.unwrap().json();
    assert_eq!(view["knobs"]["explicit_key_max_length"], 8);

    // Non-positive and garbage values fall back to the defaults (and say so in the log).
    let lenient = start_proxy(
        &prefix_model(&refs),
        &[],
        &[
            ("PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH", "0"),
            ("PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH", "-3"),
            ("PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH", "lots"),
            ("PROXY_LEAST_LOADED_RESERVATION_TTL", "0"),
            ("FLEXINFER_PROXY_LABEL_GROUP_ROUTING", "least-loaded"),
        ],
        dir.path(),
    )
    .await;
    let view = get(lenient.admin, "/debug/routing").await.unwrap().json();
    assert_eq!(view["knobs"]["explicit_key_max_length"], 128);
    assert_eq!(view["knobs"]["system_segment_max_length"], 512);
    assert_eq!(view["knobs"]["document_segment_max_length"], 256);
    assert_eq!(
        view["knobs"]["least_loaded_reservation_ttl_ms"], 0,
        "0 disables reservations"
    );
    assert_eq!(view["knobs"]["label_group_mode"], "least-loaded");
    let key = "k".repeat(100);
    post(
        lenient.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", &key)],
        &body,
    )
    .await
    .unwrap();
    let m = lenient.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("key_source", "explicit-header")]
        ),
        Some(1.0)
    );
    let log = lenient.proc.log_text();
    assert!(
        log.contains("invalid routing knob")
            && log.contains("PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_spec_debug_lines_are_logged() {
    let dir = TempDir::new("logs");
    let sim = start_sim("only", &[], dir.path()).await;
    let svc = start_sim("svc", &[], dir.path()).await;
    let cfg = ModelsFile::new().model(
        ModelEntry::new("my-model")
            .routing("prefix")
            .service_at(svc.addr)
            .endpoint(sim.addr),
    );
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    post(
        proxy.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", "tenant-a/doc-42")],
        &chat_body("my-model", None, "hi", ""),
    )
    .await
    .unwrap();
    post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        r#"{"model":"my-model"}"#,
    )
    .await
    .unwrap();
    let pod_line = format!(
        "routing to pod model=my-model strategy=prefix target={} key_source=explicit-header",
        sim.addr
    );
    // The lines are written as the requests are routed, but reach the log file through the
    // proxy's writer: wait until the second one is there (or 5 s passed) before reading.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !proxy
        .proc
        .log_text()
        .contains("routing fallback to service")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let log = proxy.proc.log_text();
    assert!(log.contains(&pod_line), "missing {pod_line:?} in\n{log}");
    assert!(
        log.contains("routing fallback to service model=my-model strategy=prefix key_source=none"),
        "{log}"
    );
}

/// Label group `tts`: one least-loaded model per member, each served by its sim (also its
/// Service).
fn tts_group(members: &[(&str, i64, bool, &Sim)]) -> ModelsFile {
    members
        .iter()
        .map(|(name, prio, ready, sim)| {
            ModelEntry::new(name)
                .routing("least-loaded")
                .service_label("tts")
                .route_priority(*prio)
                .ready(*ready)
                .service_at(sim.addr)
                .endpoint(sim.addr)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn label_groups_prefer_the_top_tier_degrade_and_cold_start() {
    let dir = TempDir::new("groups");
    let fast = start_sim("gfx1100", &[], dir.path()).await;
    let slow = start_sim("gfx906", &[], dir.path()).await;
    let body = chat_body("tts", None, "speak", "");
    let proxy = start_proxy(
        &tts_group(&[("tts-fast", 100, true, &fast), ("tts-slow", 0, true, &slow)]),
        &[],
        &[],
        dir.path(),
    )
    .await;
    for _ in 0..10 {
        let r = post(proxy.addr, "/v1/chat/completions", &[], &body)
            .await
            .unwrap();
        assert_eq!(
            r.pod(),
            "gfx1100",
            "the primary takes all traffic while Ready"
        );
    }
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_label_group_route_decisions_total",
            &[("label", "tts"), ("outcome", "priority_pick")]
        ),
        Some(10.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_label_group_route_target_hits_total",
            &[("label", "tts"), ("model", "tts-fast")]
        ),
        Some(10.0)
    );

    // The primary leaves Ready: the group degrades to the next tier at once.
    proxy
        .rewrite_config(&tts_group(&[
            ("tts-fast", 100, false, &fast),
            ("tts-slow", 0, true, &slow),
        ]))
        .await;
    for _ in 0..5 {
        assert_eq!(
            post(proxy.addr, "/v1/chat/completions", &[], &body)
                .await
                .unwrap()
                .pod(),
            "gfx906"
        );
    }
    // Nobody Ready: the alphabetically first member of the top tier (cold start).
    proxy
        .rewrite_config(&tts_group(&[
            ("tts-fast", 100, false, &fast),
            ("tts-slow", 0, false, &slow),
            ("tts-alt", 100, false, &slow),
        ]))
        .await;
    let r = post(proxy.addr, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert_eq!(
        r.pod(),
        "gfx906",
        "tts-alt (top tier, alphabetically first) serves through its Service"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_label_group_route_decisions_total",
            &[("label", "tts"), ("outcome", "cold_start")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn label_group_least_loaded_spreads_a_burst_over_members() {
    let dir = TempDir::new("group-ll");
    let mut sims = Vec::new();
    for i in 0..3 {
        sims.push(
            start_sim(
                &format!("m{i}"),
                &["--ttft-base-ms", "2000", "--max-concurrency", "64"],
                dir.path(),
            )
            .await,
        );
    }
    let members: Vec<(&str, i64, bool, &Sim)> = vec![
        ("a", 0, true, &sims[0]),
        ("b", 0, true, &sims[1]),
        ("c", 0, true, &sims[2]),
    ];
    let proxy = start_proxy(
        &tts_group(&members),
        &[],
        &[("FLEXINFER_PROXY_LABEL_GROUP_ROUTING", "least-loaded")],
        dir.path(),
    )
    .await;
    let hits = burst(proxy.addr, "tts", 30).await;
    assert!(
        hits.len() == 3 && hits.values().all(|&n| n <= 11),
        "{hits:?}"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_label_group_route_decisions_total",
            &[
                ("label", "tts"),
                ("strategy", "least-loaded"),
                ("outcome", "least_loaded")
            ]
        ),
        Some(30.0)
    );
}
