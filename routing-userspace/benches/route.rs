//! The per-request routing cost, without sockets.
//!
//! - `keys/*`: body view + key extraction on chat bodies of 1 KB to 1 MB (target: 2 us at 4 KB);
//! - `ring/*`: a key's pick and two alternates on rings of 8 to 1,000 pods (target: 100 ns);
//! - `least_loaded/*`: a reserved least-loaded pick over 100 pods, its token consumed;
//! - `decide/*`: the whole decision per strategy, as the request path runs it (ring strategies
//!   under the default hash-balance bound, and prefix on the plain ring for comparison;
//!   cache-aware on an index that learns every request, as the proxy's does);
//! - `keys/prompt chain`: the cache-aware chain of a chat body.
//!
//! `cargo xtask bench route` (or `cargo bench -p routing-userspace --bench route`).

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::{HeaderMap, HeaderValue};

use routing_userspace::balance::bounded::HashBalance;
use routing_userspace::body::BodyFields;
use routing_userspace::discovery::ModelSpec;
use routing_userspace::keys::{chain, extract, KeyLimits, RequestParts};
use routing_userspace::load::userspace::UserspaceGauge;
use routing_userspace::metrics::Metrics;
use routing_userspace::router::{Decision, Router, RoutingKnobs};
use routing_userspace::table::{Route, RoutingTable};
use routing_userspace::vocab::{LabelGroupMode, Strategy};

fn table(strategy: Strategy, pods: u16) -> RoutingTable {
    let mut m = ModelSpec::new("m");
    m.routing = strategy;
    m.service = Some("http://m.svc:80".into());
    m.endpoints = (0..pods)
        .map(|p| SocketAddr::from(([10, 0, (p / 250) as u8, (p % 250) as u8 + 1], 8000)))
        .collect();
    let (table, _) =
        RoutingTable::of_models(vec![m], &Metrics::new(10_000), LabelGroupMode::RoundRobin);
    table
}

/// A chat body of about `bytes` bytes: half system prompt, half the user's question, plus a
/// document context, as RAG clients send.
fn chat_body(bytes: usize) -> String {
    let words = |n: usize, tag: &str| -> String {
        let mut s = String::with_capacity(n + 16);
        let mut i = 0;
        while s.len() < n {
            s.push_str(&format!("{tag}{i} "));
            i += 1;
        }
        s
    };
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": words(bytes / 2, "rule")},
            {"role": "user", "content": words(bytes / 2, "ask")}
        ],
        "document_context": "FlexInfer routing guide section A",
        "max_tokens": 120,
        "stream": true
    })
    .to_string()
}

/// `f` of the request a body parses into (the parse is part of what a row measures).
fn with_parts<R>(body: &str, headers: &HeaderMap, f: impl FnOnce(&RequestParts<'_, '_>) -> R) -> R {
    let fields = BodyFields::parse(body.as_bytes());
    f(&RequestParts {
        headers,
        body: fields.as_ref(),
        model: Some("m"),
    })
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    let limits = KeyLimits::default();
    let headers = HeaderMap::new();
    for size in [1 << 10, 4 << 10, 64 << 10, 1 << 20] {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        for (name, strategy) in [
            ("prefix canonical", Strategy::Prefix),
            ("session implicit", Strategy::SessionAffinity),
        ] {
            g.bench_with_input(BenchmarkId::new(name, size), &body, |b, body| {
                b.iter(|| {
                    with_parts(black_box(body), &headers, |parts| {
                        black_box(extract(strategy, parts, &limits).key)
                    })
                })
            });
        }
        // With content anchors: what a request costs when its model's llama.cpp pods show
        // their slots' prompts.
        type Chain = fn(&RequestParts<'_, '_>) -> Option<chain::PromptChain>;
        let chains: [(&str, Chain); 2] = [
            ("prompt chain", chain::chain),
            ("prompt chain with anchors", chain::chain_with_anchors),
        ];
        for (name, build) in chains {
            g.bench_with_input(BenchmarkId::new(name, size), &body, |b, body| {
                b.iter(|| {
                    with_parts(black_box(body), &headers, |parts| {
                        black_box(build(parts).map(|c| c.links().len()))
                    })
                })
            });
        }
    }
    g.finish();
}

fn model(t: &RoutingTable) -> Arc<routing_userspace::table::ModelRoute> {
    match t.lookup("m") {
        Some(Route::Model(m)) => m,
        _ => unreachable!("one model"),
    }
}

fn ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    for pods in [8, 100, 1000] {
        let t = table(Strategy::Prefix, pods);
        let m = model(&t);
        g.bench_function(BenchmarkId::new("pick and 2 alternates", pods), |b| {
            let mut h = 0u64;
            b.iter(|| {
                h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut walk = m.ring.walk(black_box(h));
                black_box((walk.next(), walk.next(), walk.next()))
            })
        });
    }
    g.finish();
}

fn router(strategy: Strategy, pods: u16) -> (RoutingTable, Router) {
    router_with(strategy, pods, RoutingKnobs::default().hash_balance)
}

fn router_with(strategy: Strategy, pods: u16, balance: HashBalance) -> (RoutingTable, Router) {
    let knobs = RoutingKnobs {
        reservation_ttl: Duration::from_secs(10),
        hash_balance: balance,
        ..RoutingKnobs::default()
    };
    (
        table(strategy, pods),
        Router::new(Arc::new(UserspaceGauge::default()), knobs),
    )
}

/// The request starts on the decision's first target, as the proxy starts it (its reservation
/// consumed, its pending pick released), and ends at once.
fn start(d: &mut Decision, gauge: &Arc<UserspaceGauge>) {
    if let Some(a) = d.next_attempt() {
        black_box(d.start_on(a, gauge));
    }
}

fn least_loaded(c: &mut Criterion) {
    let gauge = Arc::new(UserspaceGauge::default());
    let (t, r) = router(Strategy::LeastLoaded, 100);
    let route = t.lookup("m").expect("route");
    let headers = HeaderMap::new();
    c.bench_function("least_loaded/reserved pick (100 pods)", |b| {
        b.iter(|| {
            let parts = RequestParts {
                headers: &headers,
                body: None,
                model: Some("m"),
            };
            let mut d = r.decide(&route, &parts, 7, Instant::now());
            start(&mut d, &gauge);
            black_box(d.picked_pod().map(|p| p.addr))
        })
    });
}

fn decide(c: &mut Criterion) {
    let gauge = Arc::new(UserspaceGauge::default());
    let mut g = c.benchmark_group("decide");
    let session_header = {
        let mut h = HeaderMap::new();
        h.insert("x-session-id", HeaderValue::from_static("user-42/conv-7"));
        h
    };
    let small = chat_body(400);
    let bounded = RoutingKnobs::default().hash_balance;
    for (name, strategy, balance, headers, body) in [
        (
            "session header",
            Strategy::SessionAffinity,
            bounded,
            session_header,
            small.clone(),
        ),
        (
            "prefix canonical 4 KB",
            Strategy::Prefix,
            bounded,
            HeaderMap::new(),
            chat_body(4 << 10),
        ),
        (
            "prefix canonical 4 KB, plain ring",
            Strategy::Prefix,
            HashBalance::OFF,
            HeaderMap::new(),
            chat_body(4 << 10),
        ),
        (
            "session implicit",
            Strategy::SessionAffinity,
            bounded,
            HeaderMap::new(),
            small.clone(),
        ),
        (
            "cache-aware 4 KB",
            Strategy::CacheAware,
            bounded,
            HeaderMap::new(),
            chat_body(4 << 10),
        ),
        (
            "least-loaded",
            Strategy::LeastLoaded,
            bounded,
            HeaderMap::new(),
            small,
        ),
    ] {
        let (t, r) = router_with(strategy, 16, balance);
        let route = t.lookup("m").expect("route");
        g.bench_function(BenchmarkId::new(name, "16 pods"), |b| {
            b.iter(|| {
                with_parts(&body, &headers, |parts| {
                    let mut d = r.decide(&route, parts, 7, Instant::now());
                    start(&mut d, &gauge);
                    black_box(d.picked_pod().map(|p| p.addr))
                })
            })
        });
    }
    // Cache-aware with a new conversation on every request (a shared 2 KB system prompt, a
    // 2 KB first question of its own): the index learns new links (and evicts, once full) and
    // the decision teaches them to its pod until it drops, as a busy proxy's decisions do.
    let (t, r) = router_with(Strategy::CacheAware, 16, bounded);
    let route = t.lookup("m").expect("route");
    let base = chat_body(4 << 10);
    let mut next = 0u64;
    g.bench_function(
        BenchmarkId::new("cache-aware 4 KB, a new conversation each", "16 pods"),
        |b| {
            b.iter(|| {
                // The body's copy (about 0.3 us of the row) is part of the row.
                next += 1;
                let body = base.replacen("ask0 ", &format!("conversation{next} "), 1);
                with_parts(&body, &HeaderMap::new(), |parts| {
                    let mut d = r.decide(&route, parts, 7, Instant::now());
                    start(&mut d, &gauge);
                    black_box(d.picked_pod().map(|p| p.addr))
                })
            })
        },
    );
    g.finish();
}

criterion_group!(benches, keys, ring, least_loaded, decide);
criterion_main!(benches);
