//! The per-request cost of engine signals: what the request path would add per response
//! (the load-report header read, the store's report and start marks, the usage observer fed
//! each body frame) and per pick (the store's load read), plus a scraped page's parse (off the
//! request path, for scale).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use routing_userspace::signals::engine_metrics::parse_page;
use routing_userspace::signals::{orca, EngineReport, SignalStore, Source, UsageObserver};
use routing_userspace::vocab::EngineKind;

/// A streamed chat chunk of about 200 bytes, as vLLM sends one per token.
const EVENT: &[u8] = br#"data: {"id":"chatcmpl-8f2c4e9a1b7d","object":"chat.completion.chunk","created":1733000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" token"}}]}

"#;

/// The last chunk with usage, and the end.
const USAGE_EVENT: &[u8] = br#"data: {"id":"chatcmpl-8f2c4e9a1b7d","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":256,"total_tokens":1456,"prompt_tokens_details":{"cached_tokens":1024}}}

data: [DONE]

"#;

/// A whole chat completion (not streamed), as a fast backend answers a short request, and a
/// llama.cpp answer with its `timings`.
const COMPLETION: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":10,"total_tokens":22}}"#;
const LLAMA_COMPLETION: &[u8] = br#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"Jumps: I'm afraid that's"}}],"created":1796599264,"model":"m","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":40,"total_tokens":48,"prompt_tokens_details":{"cached_tokens":32}},"id":"chatcmpl-cquSEhI0x6GkIAf8pDhcJmc9dplQ10Wr","timings":{"cache_n":32,"prompt_n":8,"prompt_ms":237.442,"prompt_per_token_ms":5.93605,"prompt_per_second":168.46219287236462,"predicted_n":8,"predicted_ms":82.538,"predicted_per_token_ms":10.31725,"predicted_per_second":96.92505270299741}}"#;

const HEADER: &[u8] =
    b"TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0";

fn signals(c: &mut Criterion) {
    let mut g = c.benchmark_group("signals");
    g.throughput(Throughput::Bytes(EVENT.len() as u64));
    g.bench_function("usage_observer/200-byte SSE event", |b| {
        let mut o = UsageObserver::new();
        b.iter(|| o.feed(black_box(EVENT)))
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("usage_observer/256-event stream, then usage", |b| {
        b.iter(|| {
            let mut o = UsageObserver::new();
            for _ in 0..256 {
                o.feed(black_box(EVENT));
            }
            o.feed(black_box(USAGE_EVENT));
            black_box(o.usage())
        })
    });
    for (name, body) in [
        ("usage_observer/a chat completion, then usage", COMPLETION),
        (
            "usage_observer/a llama.cpp completion, then usage",
            LLAMA_COMPLETION,
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut o = UsageObserver::new();
                o.feed(black_box(body));
                black_box(o.usage())
            })
        });
    }
    g.bench_function("orca/parse vLLM header", |b| {
        b.iter(|| black_box(orca::parse(black_box(HEADER))))
    });

    let local = std::sync::Arc::new(routing_userspace::load::userspace::UserspaceGauge::default());
    let store = SignalStore::new(Duration::from_secs(3600), std::sync::Arc::clone(&local));
    let t0 = Instant::now();
    let report = EngineReport {
        running: Some(12),
        waiting: Some(3),
        kv_usage: Some(0.4),
    };
    store.report(7, &report, Source::Scrape, t0);
    store.report(7, &report, Source::InBand, t0);
    g.bench_function("store/request in flight (enter and leave)", |b| {
        b.iter(|| drop(black_box(local.enter(black_box(7)))))
    });
    g.bench_function("store/report", |b| {
        b.iter(|| store.report(black_box(7), black_box(&report), Source::InBand, t0))
    });
    g.bench_function("store/load (two fresh reports)", |b| {
        b.iter(|| black_box(store.load(black_box(7), black_box(2), t0)))
    });
    g.bench_function("store/load (two reports, 1 s old)", |b| {
        let later = t0 + Duration::from_secs(1);
        b.iter(|| black_box(store.load(black_box(7), black_box(2), later)))
    });
    g.bench_function("store/load (no report)", |b| {
        b.iter(|| black_box(store.load(black_box(8), black_box(2), t0)))
    });

    let page = vllm_page();
    g.throughput(Throughput::Bytes(page.len() as u64));
    g.bench_function("engine_metrics/parse a vLLM page", |b| {
        b.iter(|| black_box(parse_page(black_box(&page), EngineKind::Auto)))
    });
    g.finish();
}

/// A page shaped like vLLM's: its load gauges among ~40 KB of histograms and counters.
fn vllm_page() -> Vec<u8> {
    let mut p = String::new();
    for family in [
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_prompt_tokens",
    ] {
        p.push_str(&format!(
            "# HELP vllm:{family} A histogram.\n# TYPE vllm:{family} histogram\n"
        ));
        for le in 0..40 {
            p.push_str(&format!(
                "vllm:{family}_bucket{{engine=\"0\",le=\"{le}.0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"}} {}.0\n",
                le * 17
            ));
        }
    }
    p.push_str("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12.0\n");
    p.push_str("vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n");
    p.push_str("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4\n");
    while p.len() < 40_000 {
        p.push_str("vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 812345.0\n");
    }
    p.into_bytes()
}

criterion_group!(benches, signals);
criterion_main!(benches);
