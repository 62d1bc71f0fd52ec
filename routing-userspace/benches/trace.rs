//! What a sampled request costs in tracing, in two parts that add up: its spans on the request
//! path (start, one attempt, the server span's attributes, both spans encoded and queued), and
//! the export task's framing of them into an OTLP request (per span, in batches of the default
//! 512); and what gzip (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`) adds to an export, per span.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http::{HeaderMap, Method};
use routing_userspace::telemetry::export::SpanQueue;
use routing_userspace::telemetry::otlp::{Encoder, Gzip};
use routing_userspace::telemetry::span::{AddAttributes, HeldStr};
use routing_userspace::telemetry::{AttemptEnd, Attributes, Sampler, SpanSink, Trace, Tracer};

/// The server span's attributes of a routed request, as the request path adds them (borrowed
/// from the request's context).
struct RequestAttributes<'c> {
    model: &'c Arc<str>,
    pod: &'c Arc<str>,
}

impl AddAttributes for RequestAttributes<'_> {
    fn add<'x>(&'x self, a: &mut Attributes<'x>) {
        request_attributes(a, self.model, self.pod);
    }
}

fn request_attributes<'x>(a: &mut Attributes<'x>, model: &'x Arc<str>, pod: &'x Arc<str>) {
    a.set("gen_ai.request.model", model);
    a.set("flexinfer.model", model);
    a.set("flexinfer.strategy", "session-affinity");
    a.set("flexinfer.key_source", "session-header");
    a.set("flexinfer.outcome", "pod");
    a.set("flexinfer.spill", false);
    a.set("flexinfer.pod", pod);
    a.set("flexinfer.retries", 0i64);
    a.measured("flexinfer.queue_wait_seconds", 0.0);
    a.measured("flexinfer.ttft_seconds", 0.000_412);
    a.measured("gen_ai.usage.input_tokens", 12i64);
    a.measured("gen_ai.usage.output_tokens", 3i64);
}

/// The spans of one sampled request, as the export queue receives them.
fn one_request(tracer: &Arc<Tracer>, model: &Arc<str>, pod: &Arc<str>) {
    let headers = HeaderMap::new();
    let mut trace = Trace::start(
        Some(tracer),
        &headers,
        &Method::POST,
        "/v1/chat/completions",
        Instant::now(),
    );
    let traceparent = trace.attempt_started(|| HeldStr::Shared(Arc::clone(pod)));
    std::hint::black_box(traceparent);
    trace.attempt_ended(AttemptEnd::Answered(200));
    trace.finish(Instant::now(), Some(200), &RequestAttributes { model, pod });
}

/// A tracer that samples every request, and the queue its spans go to.
fn sampling_everything() -> (Arc<Tracer>, Arc<SpanQueue>) {
    let (sink, queue) =
        SpanSink::bounded(4096, 512, prometheus::IntCounter::new("q", "q").unwrap());
    let tracer = Tracer::new(Sampler::parse("always_on", None).unwrap(), sink);
    (Arc::new(tracer), queue)
}

fn trace(c: &mut Criterion) {
    let model: Arc<str> = Arc::from("llama-3.1-8b");
    let pod: Arc<str> = Arc::from("10.42.3.17:8000");
    let mut g = c.benchmark_group("trace");
    // Per request: 64 of them per iteration, the queue emptied (untimed) before each.
    g.throughput(Throughput::Elements(64));
    g.bench_function(
        "request path/start, attempt, finish (2 spans encoded and queued)",
        |b| {
            let (tracer, queue) = sampling_everything();
            b.iter_batched(
                || drop(queue.take_at_least(1, usize::MAX)),
                |()| {
                    for _ in 0..64 {
                        one_request(&tracer, &model, &pod);
                    }
                },
                BatchSize::SmallInput,
            );
        },
    );
    // A batch of the spans those requests queue: server and attempt spans, alternating.
    let (tracer, queue) = sampling_everything();
    for _ in 0..256 {
        one_request(&tracer, &model, &pod);
    }
    let batch = queue.take_at_least(1, usize::MAX);
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("flexinfer-proxy")
        .build();
    let encoder = Encoder::new(&resource);
    g.throughput(Throughput::Elements(batch.len() as u64));
    g.bench_function("export/frame a batch of 512 spans (per span)", |b| {
        b.iter(|| black_box(encoder.encode(black_box(&batch))))
    });
    let body = encoder.encode(&batch);
    let (mut gzip, mut gzipped) = (Gzip::default(), Vec::new());
    gzip.compress(&body, &mut gzipped);
    eprintln!(
        "trace: a body of {} spans is {} bytes, {} gzipped ({:.1}x smaller)",
        batch.len(),
        body.len(),
        gzipped.len(),
        body.len() as f64 / gzipped.len() as f64
    );
    g.bench_function("export/gzip a batch of 512 spans (per span)", |b| {
        b.iter(|| gzip.compress(black_box(&body), &mut gzipped))
    });
    g.finish();
}

criterion_group!(benches, trace);
criterion_main!(benches);
