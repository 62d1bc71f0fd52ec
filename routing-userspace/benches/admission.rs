//! The admission cost a request pays when no queue forms (target: well under 0.5 us):
//!
//! - `admission/fast path`: `ModelGate::admit` with room and nobody waiting, then the
//!   permit's drop (what every request pays once admission is wired in);
//! - `admission/fast path with a token budget`: the same with a token bucket charged;
//! - `admission/classify`: reading `x-flexinfer-priority` and `x-flexinfer-tenant`;
//! - `admission/classify bearer`: the tenant from a hashed bearer token;
//! - `admission/baseline *`: an uncontended mutex lock and unlock, one histogram observation
//!   (which the fast path avoids) and one clock read (the budget path reads the clock once),
//!   to read the numbers above against this machine's floor.
//!
//! `cargo xtask bench admission` (or `cargo bench -p routing-userspace --bench admission`).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use futures::FutureExt;
use http::{HeaderMap, HeaderValue};

use routing_userspace::admission::{
    classify, AdmissionDefaults, AdmissionFamilies, Admitted, Class, ModelAdmission, ModelGate,
    Room,
};
use routing_userspace::keys::KeyLimits;

fn gate(own: &ModelAdmission) -> Arc<ModelGate> {
    let defaults = AdmissionDefaults::default();
    let room: Arc<dyn Room> = Arc::new(|a: Admitted| a.starting < 1_000_000);
    ModelGate::new(
        Arc::from("bench-model"),
        defaults.settings(own),
        room,
        &AdmissionFamilies::new(),
        &defaults,
    )
}

fn fast_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_runtime = rt.enter();
    let mut group = c.benchmark_group("admission");
    let plain = gate(&ModelAdmission::default());
    let class = Class::DEFAULT;
    group.bench_function("fast path", |b| {
        b.iter(|| {
            let permit = plain
                .admit(black_box(&class), 0)
                .now_or_never()
                .expect("admitted at once")
                .expect("room");
            drop(black_box(permit));
        })
    });
    let budgeted = gate(&ModelAdmission {
        tokens_per_minute: Some(u64::MAX / 2),
        ..ModelAdmission::default()
    });
    let mut h = HeaderMap::new();
    h.insert("x-flexinfer-tenant", HeaderValue::from_static("team-a"));
    let tenant_class = classify(&h, &KeyLimits::default()).class;
    group.bench_function("fast path with a token budget", |b| {
        b.iter(|| {
            let permit = budgeted
                .admit(black_box(&tenant_class), 1200)
                .now_or_never()
                .expect("admitted at once")
                .expect("room and budget");
            drop(black_box(permit));
        })
    });
    h.insert("x-flexinfer-priority", HeaderValue::from_static("10"));
    group.bench_function("classify", |b| {
        b.iter(|| black_box(classify(black_box(&h), &KeyLimits::default())))
    });
    let mut bearer = HeaderMap::new();
    bearer.insert(
        "authorization",
        HeaderValue::from_static("Bearer sk-proj-0123456789abcdef0123456789abcdef"),
    );
    group.bench_function("classify bearer", |b| {
        b.iter(|| black_box(classify(black_box(&bearer), &KeyLimits::default())))
    });
    let mutex = std::sync::Mutex::new(0u64);
    group.bench_function("baseline mutex", |b| {
        b.iter(|| *black_box(&mutex).lock().unwrap() += 1)
    });
    let histogram = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new(
        "bench_seconds",
        "a histogram with the default buckets",
    ))
    .unwrap();
    group.bench_function("baseline histogram observe", |b| {
        b.iter(|| histogram.observe(black_box(0.0)))
    });
    group.bench_function("baseline clock", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()))
    });
    group.finish();
}

criterion_group!(benches, fast_path);
criterion_main!(benches);
