use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId};

use super::*;
use crate::telemetry::span::{Attributes, SpanKind};

const NO_ATTRIBUTES: &Attributes<'static> = &Attributes::EMPTY;

fn span(n: u64) -> EndedSpan<'static, 'static> {
    EndedSpan {
        trace_id: TraceId::from(1u128),
        span_id: SpanId::from(n),
        parent: SpanId::INVALID,
        parent_is_remote: false,
        trace_state: None,
        kind: SpanKind::Server,
        name: "POST",
        start_unix_nano: 1,
        end_unix_nano: 2,
        error: None,
        attributes: NO_ATTRIBUTES,
    }
}

/// Records each batch's span ids; `hang` never answers, `export_time` is how long an export
/// takes.
#[derive(Debug, Clone, Default)]
struct Recorder {
    batches: Arc<Mutex<Vec<Vec<u64>>>>,
    hang: bool,
    export_time: Duration,
}

impl Exporter for Recorder {
    async fn export(&mut self, batch: &SpanBatch) -> Result<(), String> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.export_time).await;
        let ids = batch
            .decoded()
            .iter()
            .map(|s| u64::from_be_bytes(s.span_id.as_slice().try_into().unwrap()))
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
        sink.send(&span(n));
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
    sink.send(&span(7));
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
        sink.send(&span(n));
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
        sink.send(&span(n));
    }
    // The third span completed a batch: it goes before the delay; the fourth waits.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(rec.batches.lock().unwrap().clone(), vec![vec![1, 2, 3]]);
    sink.send(&span(5));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        rec.batches.lock().unwrap().len(),
        1,
        "a partial batch waits"
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(rec.batches.lock().unwrap()[1], vec![4, 5]);
    handle.shutdown(Duration::from_secs(1)).await;
    assert_eq!(metrics.exported.get(), 5);
}

/// Under steady load, the spans that arrive while a batch is being sent wait for their own
/// batch to fill: requests to the collector stay full instead of carrying a few spans each.
#[tokio::test(start_paused = true)]
async fn spans_that_arrive_during_an_export_wait_for_a_full_batch() {
    let rec = Recorder {
        export_time: Duration::from_millis(2),
        ..Recorder::default()
    };
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec.clone(), &settings(64, 4), &metrics);
    // One span a millisecond for 30 ms: a batch fills in 4 ms, an export takes 2.
    for n in 1..=30 {
        sink.send(&span(n));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let sizes: Vec<usize> = rec.batches.lock().unwrap().iter().map(Vec::len).collect();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&n| n == 4),
        "{sizes:?}"
    );
    // The rest goes with the flush, after the delay.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all: Vec<u64> = rec.batches.lock().unwrap().concat();
    assert_eq!(all, (1..=30).collect::<Vec<_>>());
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_export_thread_sends_what_is_queued_and_stops_on_shutdown() {
    let rec = Recorder::default();
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(rec.clone(), &settings(16, 2), &metrics);
    for n in 1..=3 {
        sink.send(&span(n));
    }
    handle.shutdown(Duration::from_secs(5)).await;
    let mut ids: Vec<u64> = rec.batches.lock().unwrap().concat();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(metrics.exported.get(), 3);
}

fn ids(batch: &SpanBatch) -> Vec<u64> {
    batch
        .decoded()
        .iter()
        .map(|s| u64::from_be_bytes(s.span_id.as_slice().try_into().unwrap()))
        .collect()
}

/// A queue holding more than a batch gives its oldest spans and keeps the rest in order; a
/// batch given back is reused empty.
#[test]
fn a_queue_longer_than_a_batch_gives_its_oldest_spans_first() {
    let (sink, q) = SpanSink::bounded(8, 3, prometheus::IntCounter::new("q", "q").unwrap());
    for n in 1..=5 {
        sink.send(&span(n));
    }
    assert!(q.take_at_least(6, 8).is_empty(), "fewer than asked for");
    let first = q.take_at_least(1, 3);
    assert_eq!(ids(&first), [1, 2, 3]);
    q.recycle(first);
    sink.send(&span(6));
    let rest = q.take_at_least(1, 3);
    assert_eq!(ids(&rest), [4, 5, 6]);
    assert_eq!(rest.iter().count(), rest.len());
    assert!(q.take_at_least(1, 3).is_empty());
    // twice over a batch, with a spare to take the rest: the oldest first again, each span
    // whole
    q.recycle(rest);
    for n in 7..=13 {
        sink.send(&span(n));
    }
    let (a, b, c) = (q.take(3), q.take(3), q.take(3));
    assert_eq!(
        (ids(&a), ids(&b), ids(&c)),
        (vec![7, 8, 9], vec![10, 11, 12], vec![13])
    );
}

/// With nothing queued, shutdown ends at once; a span queued after it goes nowhere.
#[tokio::test]
async fn an_idle_export_stops_at_once() {
    let idle = Recorder::default();
    let metrics = TraceFamilies::new();
    let (sink, handle) = start(idle.clone(), &settings(16, 2), &metrics);
    let began = std::time::Instant::now();
    handle.shutdown(Duration::from_secs(5)).await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "nothing to wait for"
    );
    sink.send(&span(9));
    tokio::task::yield_now().await;
    assert!(
        idle.batches.lock().unwrap().is_empty(),
        "not after shutdown"
    );
}
