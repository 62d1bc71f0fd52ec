//! Observability over real sockets: the spec's metric families in `/metrics` (names, types and
//! labels, before and after traffic), the key-cardinality tracker past its cap, the hot keys of
//! `/debug/routing`, the fleet size and scrape interval, and the Grafana dashboard against the
//! spec's PromQL.

use std::collections::{BTreeSet, HashMap, HashSet};

use flexinfer_tests::prom::*;
use flexinfer_tests::*;

/// Families beyond the spec's table that the proxy promises.
const EXTRA_FAMILIES: [(&str, &str); 6] = [
    ("flexinfer_proxy_request_duration_seconds", "histogram"),
    ("flexinfer_proxy_time_to_first_byte_seconds", "histogram"),
    ("flexinfer_proxy_ebpf_enabled", "gauge"),
    ("flexinfer_proxy_ready_endpoints", "gauge"),
    ("flexinfer_proxy_fleet_proxies", "gauge"),
    ("flexinfer_proxy_engine_scrape_interval_seconds", "gauge"),
];

fn key_hash_hex(key: &str) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key.as_bytes()))
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS line")
}

async fn debug_routing(proxy: &Proxy) -> (serde_json::Value, String) {
    let r = get(proxy.admin, "/debug/routing").await.expect("debug");
    assert_eq!(r.status, 200);
    (r.json(), r.text())
}

fn model_view<'v>(debug: &'v serde_json::Value, name: &str) -> &'v serde_json::Value {
    debug["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("model {name} in {debug:#}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_spec_family_is_exposed_with_the_spec_labels_before_and_after_traffic() {
    let spec = spec_text();
    let families = spec_families(&spec);
    let table = spec_table(&spec);
    assert!(
        families.len() >= 11 && table.len() >= 10,
        "spec parsing found too little: {families:?} {table:?}"
    );

    let dir = TempDir::new("families");
    let a = start_sim("pod-a", &[], dir.path()).await;
    let b = start_sim("pod-b", &[], dir.path()).await;
    let yaml = ModelsFile::new()
        .model(
            ModelEntry::new("chat")
                .routing("prefix")
                .service_at(a.addr)
                .endpoints([a.addr, b.addr]),
        )
        .model(
            ModelEntry::new("pool-fast")
                .routing("least-loaded")
                .service_label("pool")
                .route_priority(100)
                .endpoint(a.addr),
        )
        .model(
            ModelEntry::new("pool-slow")
                .routing("least-loaded")
                .service_label("pool")
                .endpoint(b.addr),
        );
    let proxy = start_proxy(
        &yaml,
        &[],
        &[("FLEXINFER_PROXY_LABEL_GROUP_ROUTING", "least-loaded")],
        dir.path(),
    )
    .await;

    let check_types = |text: &str| {
        let types = exposition_types(text);
        for f in &families {
            let ty = types
                .get(f)
                .unwrap_or_else(|| panic!("{f} has no # TYPE line in /metrics:\n{text}"));
            let want = if f.ends_with("_total") {
                "counter"
            } else if f.ends_with("_seconds") {
                "histogram"
            } else {
                "gauge"
            };
            assert_eq!(ty, want, "{f}");
        }
        for (f, ty) in EXTRA_FAMILIES {
            assert_eq!(types.get(f).map(String::as_str), Some(ty), "{f}:\n{text}");
        }
        for f in types.keys() {
            assert_eq!(
                text.matches(&format!("# TYPE {f} ")).count(),
                1,
                "{f} listed twice"
            );
        }
    };
    // Every family is listed before any traffic.
    let before = proxy.metrics().await;
    check_types(&before);

    // Pre-touched series: only label values that can occur, at zero.
    let v = |name: &str, labels: &[(&str, &str)]| metric_value(&before, name, labels);
    for (source, outcome) in [
        ("explicit-header", "pod"),
        ("canonical", "pod"),
        ("none", "service-fallback"),
    ] {
        assert_eq!(
            v(
                "flexinfer_proxy_routing_decisions_total",
                &[
                    ("model", "chat"),
                    ("strategy", "prefix"),
                    ("key_source", source),
                    ("outcome", outcome)
                ]
            ),
            Some(0.0),
            "{source}/{outcome}"
        );
    }
    for target in [a.addr.to_string(), b.addr.to_string(), "service-dns".into()] {
        assert_eq!(
            v(
                "flexinfer_proxy_routing_target_hits_total",
                &[("model", "chat"), ("target", &target)]
            ),
            Some(0.0),
            "{target}"
        );
    }
    assert_eq!(
        v(
            "flexinfer_proxy_routing_key_cardinality_overflow_total",
            &[("model", "chat"), ("key_source", "explicit-header")]
        ),
        Some(0.0)
    );
    assert_eq!(
        v(
            "flexinfer_proxy_routing_key_cardinality",
            &[("model", "chat"), ("key_source", "canonical")]
        ),
        Some(0.0)
    );
    // A keyless prefix request with a Service always goes to the Service.
    assert_eq!(
        v(
            "flexinfer_proxy_routing_decisions_total",
            &[
                ("model", "chat"),
                ("key_source", "none"),
                ("outcome", "pod")
            ]
        ),
        None
    );
    // Nothing keyed is invented for least-loaded models, nor a Service they do not have.
    for s in samples(&before, "flexinfer_proxy_routing_decisions_total") {
        if s.0["model"] != "chat" {
            assert_eq!(s.0["key_source"], "none", "{s:?}");
            assert_eq!(s.0["strategy"], "least-loaded", "{s:?}");
        }
    }
    assert!(samples(&before, "flexinfer_proxy_routing_key_cardinality")
        .iter()
        .all(|s| s.0["model"] == "chat"));
    assert!(
        samples(&before, "flexinfer_proxy_routing_target_hits_total")
            .iter()
            .all(|s| s.0["model"] == "chat" || s.0["target"] != "service-dns")
    );
    assert_eq!(
        samples(
            &before,
            "flexinfer_proxy_routing_key_cardinality_overflow_total"
        )
        .len(),
        8,
        "one overflow series per keyed prefix source"
    );
    for outcome in ["least_loaded", "priority_pick", "cold_start"] {
        assert_eq!(
            v(
                "flexinfer_proxy_label_group_route_decisions_total",
                &[
                    ("label", "pool"),
                    ("strategy", "least-loaded"),
                    ("outcome", outcome)
                ]
            ),
            Some(0.0),
            "{outcome}"
        );
    }
    assert_eq!(
        v("flexinfer_proxy_ready_endpoints", &[("model", "chat")]),
        Some(2.0)
    );
    assert_eq!(v("flexinfer_proxy_ebpf_enabled", &[]), Some(0.0));

    // Traffic: a keyed request, a keyless one, a label-group one.
    let sys = "You answer using provided document context only.";
    for (headers, model) in [
        (vec![("x-flexinfer-cache-key", "tenant-a/doc-1")], "chat"),
        (vec![], "chat"),
        (vec![], "pool"),
    ] {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &headers,
            &chat_body(model, Some(sys), "hi", ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let after = proxy.metrics().await;
    check_types(&after);
    // Every family of the spec's table has series now, labelled exactly as the table says.
    for (family, labels) in &table {
        let want: BTreeSet<&str> = labels.iter().map(String::as_str).collect();
        let rows = samples(&after, family);
        assert!(!rows.is_empty(), "{family} has no series after traffic");
        for (l, _) in rows {
            let got: BTreeSet<&str> = l.keys().map(String::as_str).collect();
            assert_eq!(got, want, "{family}");
        }
    }
    let m = |name: &str, labels: &[(&str, &str)]| metric_value(&after, name, labels);
    assert_eq!(
        m(
            "flexinfer_proxy_label_group_route_decisions_total",
            &[("label", "pool"), ("outcome", "priority_pick")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "flexinfer_proxy_routing_key_cardinality",
            &[("model", "chat"), ("key_source", "explicit-header")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "flexinfer_proxy_request_duration_seconds_count",
            &[("model", "chat")]
        ),
        Some(2.0)
    );
    assert_eq!(
        m(
            "flexinfer_proxy_requests_total",
            &[("model", "pool-fast"), ("status", "200")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_cardinality_cap_overflow_counts_the_estimate_holds_and_memory_stays_bounded() {
    const CAP: usize = 100;
    const KEYS: usize = 2000;
    let dir = TempDir::new("overflow");
    let a = start_sim("pod-a", &[], dir.path()).await;
    let b = start_sim("pod-b", &[], dir.path()).await;
    let yaml = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            .endpoints([a.addr, b.addr]),
    );
    let proxy = start_proxy(
        &yaml,
        &["--key-cardinality-cap", &CAP.to_string()],
        &[],
        dir.path(),
    )
    .await;
    let pid = proxy.proc.pid();

    // `range` of distinct keys, 16 at a time; every request must succeed.
    let send = |range: std::ops::Range<usize>| {
        let addr = proxy.addr;
        async move {
            let keys: Vec<usize> = range.collect();
            for chunk in keys.chunks(16) {
                let mut tasks = Vec::new();
                for &i in chunk {
                    tasks.push(tokio::spawn(async move {
                        let key = format!("tenant-x/key-{i}");
                        post(
                            addr,
                            "/v1/chat/completions",
                            &[("x-flexinfer-cache-key", &key)],
                            &chat_body("chat", None, "hi", ""),
                        )
                        .await
                    }));
                }
                for t in tasks {
                    let r = t.await.unwrap().unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            }
        }
    };

    // Under the cap: exact, no overflow.
    send(0..CAP - 10).await;
    let m = proxy.metrics().await;
    let labels = [("model", "chat"), ("key_source", "explicit-header")];
    assert_eq!(
        metric_value(&m, "flexinfer_proxy_routing_key_cardinality", &labels),
        Some((CAP - 10) as f64)
    );
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_key_cardinality_overflow_total",
            &labels
        ),
        Some(0.0)
    );
    let rss_under_cap = vm_rss_kib(pid);
    let (debug, _) = debug_routing(&proxy).await;
    let bound_under_cap = debug["key_tracking"]["memory_bound_bytes"]
        .as_u64()
        .unwrap();

    // Twenty times the cap.
    send(CAP - 10..KEYS).await;
    let m = proxy.metrics().await;
    // Every distinct key past the cap is one overflow.
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_key_cardinality_overflow_total",
            &labels
        ),
        Some((KEYS - CAP) as f64)
    );
    // The HyperLogLog keeps the estimate near the true count.
    let estimate = metric_value(&m, "flexinfer_proxy_routing_key_cardinality", &labels).unwrap();
    assert!(
        (estimate - KEYS as f64).abs() / (KEYS as f64) < 0.05,
        "estimate {estimate} for {KEYS} keys"
    );

    // Memory: the exact set stopped at the cap, the bound did not move with the traffic.
    let (debug, text) = debug_routing(&proxy).await;
    let chat = model_view(&debug, "chat");
    let series = chat["key_cardinality"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key_source"] == "explicit-header")
        .expect("explicit-header series");
    let exact = series["exact_keys"].as_u64().unwrap();
    assert!(exact <= CAP as u64, "exact set holds {exact} > cap {CAP}");
    assert_eq!(exact, CAP as u64);
    let bound = debug["key_tracking"]["memory_bound_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(bound, bound_under_cap, "the memory bound grew with traffic");
    assert!(bound < 256 * 1024, "bound {bound} bytes for cap {CAP}");
    assert_eq!(debug["key_tracking"]["cardinality_cap"], CAP as u64);
    // A leak guard: 1910 more keys must not cost the process more than a few MiB.
    let rss_after = vm_rss_kib(pid);
    assert!(
        rss_after < rss_under_cap + 16 * 1024,
        "VmRSS grew from {rss_under_cap} KiB to {rss_after} KiB"
    );
    // Hashes only.
    assert!(!text.contains("tenant-x"), "key text in /debug/routing");
    assert!(!m.contains("tenant-x"), "key text in /metrics");
    assert!(
        !proxy.proc.log_text().contains("tenant-x"),
        "key text in the logs"
    );

    // Still healthy and serving.
    assert_eq!(get(proxy.admin, "/healthz").await.unwrap().status, 200);
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", "tenant-x/one-more")],
        &chat_body("chat", None, "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_routing_lists_the_hottest_keys_with_their_share_and_the_pod_that_serves_them() {
    let dir = TempDir::new("hotkeys");
    let mut pods = Vec::new();
    for i in 0..4 {
        pods.push(start_sim(&format!("pod-{i}"), &[], dir.path()).await);
    }
    let name_of: HashMap<String, String> = pods
        .iter()
        .map(|p| (p.addr.to_string(), p.name.clone()))
        .collect();
    let yaml = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            .endpoints(pods.iter().map(|p| p.addr)),
    );
    let proxy = start_proxy(&yaml, &["--hot-keys", "5"], &[], dir.path()).await;

    // 200 requests: half for one key, a fifth for another, the rest over 30 cold keys.
    let hot = "tenant-hot/doc";
    let warm = "tenant-warm/doc";
    let mut served: HashMap<String, HashSet<String>> = HashMap::new();
    for i in 0..200 {
        let key = match i % 10 {
            0..=4 => hot.to_string(),
            5 | 6 => warm.to_string(),
            _ => format!("tenant-cold/doc-{}", i % 30),
        };
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", &key)],
            &chat_body("chat", None, "hi", ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        served.entry(key).or_default().insert(r.pod());
    }

    let (debug, text) = debug_routing(&proxy).await;
    let chat = model_view(&debug, "chat");
    let top = chat["hot_keys"].as_array().expect("hot_keys");
    assert_eq!(top.len(), 5, "k = 5: {top:#?}");
    for (rank, key, share) in [(0, hot, 0.5), (1, warm, 0.2)] {
        let entry = &top[rank];
        assert_eq!(
            entry["key_hash"],
            key_hash_hex(key),
            "rank {rank}: {top:#?}"
        );
        assert_eq!(entry["key_source"], "explicit-header");
        let got = entry["share"].as_f64().unwrap();
        assert!(
            (got - share).abs() < 0.03,
            "{key}: share {got}, sent {share}"
        );
        assert_eq!(entry["max_overcount"].as_f64(), Some(0.0), "{entry}");
        // The pod the ring maps the key to is the sim that answered every one of its requests.
        let pod = entry["pod"].as_str().expect("pod");
        let answered = &served[key];
        assert_eq!(answered.len(), 1, "{key} moved: {answered:?}");
        assert_eq!(
            name_of.get(pod),
            answered.iter().next(),
            "{key}: reported {pod}, served by {answered:?}"
        );
    }
    // Shares describe the listed keys' part of all keyed traffic.
    let sum: f64 = top.iter().map(|e| e["share"].as_f64().unwrap()).sum();
    assert!(sum <= 1.0 + 1e-3, "shares sum to {sum}");
    assert!(!text.contains("tenant-"), "key text in /debug/routing");
}

#[test]
fn the_grafana_dashboard_charts_every_spec_query_with_a_model_variable() {
    let path = workspace_root().join("charts/grafana/flexinfer-proxy-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");

    fn exprs(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_string()));
                }
            }
            exprs(&p["panels"], out);
        }
    }
    let mut targets = Vec::new();
    exprs(&dash["panels"], &mut targets);
    assert!(!targets.is_empty(), "no panel targets");

    let spec = spec_text();
    let queries = spec_queries(&spec);
    assert_eq!(queries.len(), 6, "{queries:#?}");
    for q in &queries {
        let names = metric_names(&q.expr);
        assert!(!names.is_empty(), "{q:?}");
        // Some panel charts this very query (whitespace aside)...
        assert!(
            targets.iter().any(|(_, e)| squash(e) == squash(&q.expr)),
            "no panel charts the spec query {:?}:\n{}",
            q.title,
            q.expr
        );
        // ...and so reads every metric it names.
        for n in &names {
            assert!(
                targets.iter().any(|(_, e)| e.contains(n.as_str())),
                "{n} is in no panel"
            );
        }
    }
    for extra in [
        "flexinfer_proxy_time_to_first_byte_seconds_bucket",
        "flexinfer_proxy_label_group_route_decisions_total",
    ] {
        assert!(
            targets.iter().any(|(_, e)| e.contains(extra)),
            "{extra} is in no panel"
        );
    }
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("templating list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vars.contains(&"MODEL"), "no $MODEL variable: {vars:?}");
    // Panel ids are unique (Grafana keys state by them).
    let mut ids = HashSet::new();
    fn collect_ids(panels: &serde_json::Value, ids: &mut HashSet<u64>) {
        for p in panels.as_array().into_iter().flatten() {
            if let Some(id) = p["id"].as_u64() {
                assert!(ids.insert(id), "panel id {id} used twice");
            }
            collect_ids(&p["panels"], ids);
        }
    }
    collect_ids(&dash["panels"], &mut ids);
}

/// The fleet size the scraper spreads its reads by, and the interval it yields, as `/metrics`
/// and `/debug/routing` show them: fixed by `--fleet-size`, else one proxy with file discovery
/// (alone: cache-aware's ties may read its own index).
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_size_and_its_scrape_interval_are_shown() {
    let dir = TempDir::new("fleet");
    let a = start_sim("pod-a", &[], dir.path()).await;
    let yaml = ModelsFile::new().model(ModelEntry::new("chat").endpoint(a.addr));
    for (extra, proxies, rank, source, every) in [
        (&["--fleet-size", "10"][..], 10, 0, "flag", Some(10.0)),
        (&[][..], 1, 0, "single", Some(1.0)),
        (
            &[
                "--fleet-size",
                "100",
                "--fleet-rank",
                "7",
                "--engine-scrape-budget",
                "0.5",
            ][..],
            100,
            7,
            "flag",
            Some(200.0),
        ),
        (&["--engine-scrape-budget", "0"][..], 1, 0, "single", None),
    ] {
        let proxy = start_proxy(&yaml, extra, &[], dir.path()).await;
        let (view, _) = debug_routing(&proxy).await;
        assert_eq!(
            view["fleet"],
            serde_json::json!({"proxies": proxies, "rank": rank, "source": source,
                               "alone": proxies == 1, "engine_scrape_interval_seconds": every}),
            "{extra:?}"
        );
        let text = proxy.metrics().await;
        let line = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} in:\n{text}"))
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(
            line("flexinfer_proxy_fleet_proxies"),
            proxies as f64,
            "{extra:?}"
        );
        assert_eq!(
            line("flexinfer_proxy_engine_scrape_interval_seconds"),
            every.unwrap_or(0.0),
            "{extra:?}"
        );
    }
}
