//! Batched, bounded export: ended spans are encoded where they end and go into a bounded queue
//! without waiting, and a task (`run`, on the serving runtime) sends them to the collector in
//! batches.
//!
//! Why encode on the request thread: handing the export task typed spans cost more than
//! encoding them (a span's attributes in a list of their own, shared names counted up on one
//! thread and down on another, two queue entries a request), and a span encoded from a
//! thread's own cache of repeated attributes is a few copies. The queue holds bytes only, so
//! what it holds is exactly what it costs in memory.
//!
//! The request path never waits for the collector: when the queue is full (the collector is
//! slow, hung or down) a span is dropped and counted, and an export that fails or passes its
//! timeout drops its batch (counted too). The cost is lost spans under collector trouble,
//! never slower requests. Shutdown exports what is queued, within a bound.
//!
//! Queueing a span wakes nobody: the export task wakes when a batch is full or its delay has
//! passed. (A channel would wake it for every span: a task switch and a timer set up again per
//! request.) Why a task and not a thread of its own, as before: a batch costs a worker a few
//! microseconds (framing 512 spans takes 7 us, then the HTTP request's writes) once every 256
//! requests, and a second thread, besides two context switches a batch, puts a one-worker
//! proxy on glibc's multi-threaded paths (every system call's cancellation check, malloc's
//! arena locks). On a shared core the two measured the same (sampling 1.0: 0.909 with the
//! thread, 0.908 with the task, against the proxy without tracing), so the simpler one stays:
//! no thread, and no lazy start to spare an untraced proxy that thread.

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

use super::metrics::TraceFamilies;
use super::otlp::SpanEncoder;
use super::settings::TraceSettings;
use super::span::EndedSpan;

/// What sends a batch of spans to the collector: OTLP/HTTP in `serve`
/// ([`super::otlp::OtlpHttpExporter`]), a recorder in tests.
pub trait Exporter: Send + 'static {
    /// Send `batch`; an error says why it was lost (the caller counts and logs it).
    fn export(&mut self, batch: &SpanBatch) -> impl Future<Output = Result<(), String>> + Send;
}

/// Spans encoded as OTLP `Span` messages, one after another.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SpanBatch {
    bytes: Vec<u8>,
    /// Where each span ends in `bytes`.
    ends: Vec<usize>,
}

impl SpanBatch {
    /// How many spans.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Each span's encoding.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.bytes[a..b])
    }

    /// Append an encoded span.
    pub fn push(&mut self, span: &[u8]) {
        self.bytes.extend_from_slice(span);
        self.ends.push(self.bytes.len());
    }

    /// Empty, keeping the room.
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// The spans as a collector decodes them (tests).
    #[cfg(test)]
    pub(crate) fn decoded(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        use prost::Message;
        self.iter()
            .map(|b| {
                opentelemetry_proto::tonic::trace::v1::Span::decode(b).expect("an encoded Span")
            })
            .collect()
    }

    /// Keep the first `n` spans; those after them go into `rest` (appended).
    fn move_after(&mut self, n: usize, rest: &mut SpanBatch) {
        let cut = self.ends[n - 1];
        let base = rest.bytes.len();
        rest.bytes.extend_from_slice(&self.bytes[cut..]);
        rest.ends
            .extend(self.ends[n..].iter().map(|end| end - cut + base));
        self.bytes.truncate(cut);
        self.ends.truncate(n);
    }
}

thread_local! {
    /// Each request thread's span encoder, and the buffer a span is encoded into before it goes
    /// into the queue (the queue's lock is held only for the copy).
    static ENCODER: RefCell<(SpanEncoder, Vec<u8>)> = RefCell::default();
}

/// Where ended spans go: the bounded queue in front of the export task.
#[derive(Debug, Clone)]
pub struct SpanSink {
    queue: Arc<SpanQueue>,
}

/// The spans waiting for export, and the export task's wake-up for a full batch.
pub struct SpanQueue {
    spans: Mutex<Queued>,
    capacity: usize,
    batch_size: usize,
    batch_full: Notify,
    queue_full: prometheus::IntCounter,
}

impl std::fmt::Debug for SpanQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanQueue")
            .field("capacity", &self.capacity)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl SpanSink {
    /// A sink in front of a queue of `size` spans whose reader wants batches of `batch_size`,
    /// and the queue (the reading end).
    pub fn bounded(
        size: usize,
        batch_size: usize,
        queue_full: prometheus::IntCounter,
    ) -> (Self, Arc<SpanQueue>) {
        let queue = Arc::new(SpanQueue {
            spans: Mutex::new(Queued::default()),
            capacity: size.max(1),
            batch_size: batch_size.clamp(1, size.max(1)),
            batch_full: Notify::new(),
            queue_full,
        });
        (
            Self {
                queue: Arc::clone(&queue),
            },
            queue,
        )
    }

    /// Encode and queue a span, or drop (and count) it when the queue is full. Wakes the
    /// export task only when this span completes a batch.
    pub fn send(&self, span: &EndedSpan<'_, '_>) {
        ENCODER.with_borrow_mut(|(encoder, encoded)| {
            encoded.clear();
            encoder.encode(span, encoded);
            self.queue.push(encoded);
        });
    }
}

/// The queued spans, and an emptied batch to take their place when they go.
#[derive(Debug, Default)]
struct Queued {
    batch: SpanBatch,
    spare: Option<SpanBatch>,
}

impl SpanQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        // A panic while holding the lock leaves a queue of whole spans: keep using it.
        crate::lock::lock(&self.spans)
    }

    fn push(&self, span: &[u8]) {
        let mut q = self.lock();
        if q.batch.len() >= self.capacity {
            drop(q);
            self.queue_full.inc();
            return;
        }
        q.batch.push(span);
        let full = q.batch.len() == self.batch_size;
        drop(q);
        if full {
            self.batch_full.notify_one();
        }
    }

    /// Up to `max` of the oldest queued spans, or none while fewer than `min` are queued.
    ///
    /// The queue's buffer goes whole, and the spare takes its place; spans past the `max`th
    /// (those that came while the export task was on its way to a full batch: usually a
    /// request's second span) are copied into the spare. Copying out the batch instead would
    /// allocate and fill a buffer of a batch's size every time, on pages the kernel must
    /// first zero (measured: a page fault every five requests at sampling 1.0).
    pub fn take_at_least(&self, min: usize, max: usize) -> SpanBatch {
        let mut q = self.lock();
        let queued = q.batch.len();
        if queued < min.max(1) {
            return SpanBatch::default();
        }
        let spare = q.spare.take().unwrap_or_default();
        let mut taken = std::mem::replace(&mut q.batch, spare);
        if queued > max {
            taken.move_after(max.max(1), &mut q.batch);
        }
        taken
    }

    /// Keep `batch`'s room for the next time the queue is taken.
    pub fn recycle(&self, mut batch: SpanBatch) {
        batch.clear();
        let mut q = self.lock();
        if q.spare.is_none() {
            q.spare = Some(batch);
        }
    }

    /// Up to `max` of the oldest queued spans.
    #[cfg(test)]
    pub(crate) fn take(&self, max: usize) -> SpanBatch {
        self.take_at_least(1, max)
    }
}

/// The export task, to stop when `serve` ends.
pub struct ExportHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl ExportHandle {
    /// Export what is queued and stop, within `bound` (past it, what is left is lost).
    pub async fn shutdown(mut self, bound: Duration) {
        let _ = self.stop.send(());
        let in_time = tokio::time::timeout(bound, &mut self.task).await.is_ok();
        self.task.abort();
        if !in_time {
            tracing::warn!(
                ?bound,
                "trace export did not finish in time; dropping the rest"
            );
        }
    }
}

/// Batch sizes and timing of the export loop.
#[derive(Debug, Clone, Copy)]
struct Batching {
    batch_size: usize,
    delay: Duration,
    timeout: Duration,
}

/// The queue's two ends and the loop's timing, as `settings` say.
fn queue(
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> (SpanSink, Arc<SpanQueue>, Batching) {
    let (sink, queue) = SpanSink::bounded(
        settings.queue_size,
        settings.batch_size,
        metrics.queue_full.clone(),
    );
    let batching = Batching {
        batch_size: queue.batch_size,
        delay: settings.batch_delay,
        timeout: settings.export_timeout,
    };
    (sink, queue, batching)
}

/// The export loop with `exporter`, as a task of the current runtime.
pub fn start<E: Exporter>(
    exporter: E,
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> (SpanSink, ExportHandle) {
    let (sink, queue, batching) = queue(settings, metrics);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run(exporter, queue, stopped, batching, metrics.clone()));
    (sink, ExportHandle { stop, task })
}

async fn run<E: Exporter>(
    mut exporter: E,
    queue: Arc<SpanQueue>,
    mut stop: oneshot::Receiver<()>,
    b: Batching,
    metrics: TraceFamilies,
) {
    // A full batch goes at once; a partial one waits for the flush, which comes `delay` after
    // the last one. (Sending whatever is queued after every export would, under steady load,
    // send the few spans that came in during the last export: many small requests, each
    // paying a request's cost, instead of full batches.)
    let mut flush_at = tokio::time::Instant::now() + b.delay;
    loop {
        let partial_too = tokio::select! {
            _ = tokio::time::sleep_until(flush_at) => true,
            _ = queue.batch_full.notified() => false,
            _ = &mut stop => break,
        };
        export_queued(&mut exporter, &queue, b, partial_too, &metrics).await;
        if partial_too {
            flush_at = tokio::time::Instant::now() + b.delay;
        }
    }
    // Stopping: what is queued goes out, in batches (the caller bounds how long).
    export_queued(&mut exporter, &queue, b, true, &metrics).await;
}

/// Send what is queued, a batch at a time: full batches, and with `partial_too` the rest.
async fn export_queued<E: Exporter>(
    exporter: &mut E,
    queue: &SpanQueue,
    b: Batching,
    partial_too: bool,
    metrics: &TraceFamilies,
) {
    loop {
        let min = if partial_too { 1 } else { b.batch_size };
        let batch = queue.take_at_least(min, b.batch_size);
        if batch.is_empty() {
            return;
        }
        export(exporter, &batch, b.timeout, metrics).await;
        queue.recycle(batch);
    }
}

/// Send one batch, bounded by `timeout`; count what came of it.
async fn export<E: Exporter>(
    exporter: &mut E,
    batch: &SpanBatch,
    timeout: Duration,
    metrics: &TraceFamilies,
) {
    let n = batch.len() as u64;
    match tokio::time::timeout(timeout, exporter.export(batch)).await {
        Ok(Ok(())) => metrics.exported.inc_by(n),
        Ok(Err(e)) => {
            metrics.export_failed.inc_by(n);
            tracing::warn!(error = %e, spans = n, "trace export failed; spans dropped");
        }
        Err(_) => {
            metrics.export_failed.inc_by(n);
            tracing::warn!(?timeout, spans = n, "trace export timed out; spans dropped");
        }
    }
}

#[cfg(test)]
mod tests;
