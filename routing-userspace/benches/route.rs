//! The per-request routing cost, without sockets: body view + key extraction + decision.
//!
//! `cargo xtask bench route` (or `cargo bench -p routing-userspace --bench route`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue};

use routing_userspace::body::BodyFields;
use routing_userspace::decide::{decide, Context, LabelGroupMode};
use routing_userspace::discovery::{ModelSet, ModelSpec, Strategy, Update};
use routing_userspace::keys::{KeyLimits, RequestParts};
use routing_userspace::load::reservations::ReservationLedger;
use routing_userspace::load::slots::SlotAllocator;
use routing_userspace::load::userspace::UserspaceGauge;
use routing_userspace::table::RoutingTable;

fn table(strategy: Strategy, pods: u16) -> RoutingTable {
    let mut m = ModelSpec::new("m");
    m.routing = strategy;
    m.service = Some("http://m.svc:80".into());
    m.endpoints = (0..pods)
        .map(|p| SocketAddr::from(([10, 0, (p / 250) as u8, (p % 250) as u8 + 1], 8000)))
        .collect();
    let mut set = ModelSet::default();
    set.apply(Update::Reset(vec![m]));
    let mut slots = SlotAllocator::default();
    slots.sync(&RoutingTable::pod_addrs(&set));
    RoutingTable::build(&set, &slots)
}

/// A chat body with a long system prompt and a document, as RAG clients send.
fn rag_body(system_words: usize) -> String {
    let system: String = (0..system_words).map(|i| format!("word{i} ")).collect();
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Summarize the document."}
        ],
        "document_context": "FlexInfer routing guide section A ".repeat(40),
        "max_tokens": 120,
        "stream": true
    })
    .to_string()
}

fn bench(c: &mut Criterion) {
    let gauge = Arc::new(UserspaceGauge::default());
    let pods = ReservationLedger::new(Duration::from_secs(10));
    let groups = ReservationLedger::new(Duration::from_secs(10));
    let limits = KeyLimits::default();
    for (name, strategy, headers, body) in [
        (
            "prefix/canonical 4k-word system prompt",
            Strategy::Prefix,
            HeaderMap::new(),
            rag_body(4000),
        ),
        (
            "prefix/explicit header",
            Strategy::Prefix,
            {
                let mut h = HeaderMap::new();
                h.insert(
                    "x-flexinfer-cache-key",
                    HeaderValue::from_static("tenant-a/doc-42"),
                );
                h
            },
            rag_body(200),
        ),
        (
            "session/implicit",
            Strategy::SessionAffinity,
            HeaderMap::new(),
            rag_body(200),
        ),
        (
            "least-loaded",
            Strategy::LeastLoaded,
            HeaderMap::new(),
            rag_body(200),
        ),
    ] {
        let t = table(strategy, 16);
        let route = t.lookup("m").unwrap();
        c.bench_function(&format!("route {name} (16 pods)"), |b| {
            b.iter(|| {
                let fields = BodyFields::parse(body.as_bytes());
                let cx = Context {
                    parts: RequestParts {
                        headers: &headers,
                        body: fields.as_ref(),
                        model: Some("m"),
                    },
                    limits: &limits,
                    gauge: gauge.as_ref(),
                    pod_ledger: &pods,
                    group_ledger: &groups,
                    group_mode: LabelGroupMode::RoundRobin,
                    max_pod_attempts: 3,
                    now: Instant::now(),
                    draw: 7,
                };
                let d = decide(&route, &cx);
                if let Some(addr) = d.targets.first().and_then(|t| t.pod_addr()) {
                    pods.consume(&addr, cx.now);
                }
                black_box(d)
            })
        });
    }
    let t = table(Strategy::Prefix, 256);
    let m = match t.lookup("m").unwrap() {
        routing_userspace::table::Route::Model(m) => m,
        _ => unreachable!(),
    };
    c.bench_function("ring candidates (256 pods, 160 vnodes)", |b| {
        let mut h = 0u64;
        b.iter(|| {
            h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
            black_box(m.ring.candidates(h).len())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
