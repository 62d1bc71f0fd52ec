use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};

use super::*;

fn span(n: u64) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            TraceId::from(1u128),
            SpanId::from(n),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Server,
        name: "POST".into(),
        start_time: SystemTime::UNIX_EPOCH,
        end_time: SystemTime::UNIX_EPOCH,
        attributes: Vec::new(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: InstrumentationScope::default(),
    }
}

/// Records each batch's span ids; `hang` never answers.
#[derive(Debug, Clone, Default)]
struct Recorder {
    batches: Arc<Mutex<Vec<Vec<u64>>>>,
    hang: bool,
}

impl SpanExporter for Recorder {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if self.hang {
            std::future::pending::<()>().await;
        }
        let ids = batch
            .iter()
            .map(|s| u64::from_be_bytes(s.span_context.span_id().to_bytes()))
            .collect();
        self.batches.lock().unwrap().push(ids);
        Ok(())
    }
}

fn settings(queue_size: usize, batch_size: usize) -> TraceSettings {
    TraceSettings {
        queue_size,
        batch_size,
        batch_delay: Duration::from_millis(100),
        export_timeout: Duration::from_secs(10),
        ..TraceSettings::DEFAULT
    }
}

#[tokio::test(start_paused = true)]
async fn spans_go_out_in_batches_and_shutdown_flushes() {
    let rec = Recorder::default();
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec.clone(), &settings(16, 2), &metrics);
    for n in 1..=5 {
        sink.send(span(n));
    }
    handle.shutdown(Duration::from_secs(1)).await;
    let batches = rec.batches.lock().unwrap().clone();
    assert_eq!(batches, vec![vec![1, 2], vec![3, 4], vec![5]]);
    assert_eq!(metrics.exported.get(), 5);
    assert_eq!(metrics.queue_full.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_partial_batch_goes_out_after_the_delay() {
    let rec = Recorder::default();
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec.clone(), &settings(16, 10), &metrics);
    sink.send(span(7));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(rec.batches.lock().unwrap().clone(), vec![vec![7]]);
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_collector_drops_and_counts_instead_of_waiting() {
    let rec = Recorder {
        hang: true,
        ..Recorder::default()
    };
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec, &settings(3, 1), &metrics);
    // The task has not run yet: the queue takes three, the rest are dropped at once.
    for n in 1..=10 {
        sink.send(span(n));
    }
    assert_eq!(metrics.queue_full.get(), 7);
    // The first batch hangs until the export timeout, then counts as failed.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(metrics.export_failed.get(), 1);
    // Shutdown is bounded even though every export hangs.
    handle.shutdown(Duration::from_secs(1)).await;
    assert_eq!(metrics.exported.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_goes_out_at_once_and_a_partial_one_waits_for_the_delay() {
    let rec = Recorder::default();
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec.clone(), &settings(16, 3), &metrics);
    for n in 1..=4 {
        sink.send(span(n));
    }
    // The third span completed a batch: it goes before the delay, with what came after it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        rec.batches.lock().unwrap().clone(),
        vec![vec![1, 2, 3], vec![4]]
    );
    sink.send(span(5));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        rec.batches.lock().unwrap().len(),
        2,
        "a partial batch waits"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rec.batches.lock().unwrap()[2], vec![5]);
    handle.shutdown(Duration::from_secs(1)).await;
    assert_eq!(metrics.exported.get(), 5);
}
