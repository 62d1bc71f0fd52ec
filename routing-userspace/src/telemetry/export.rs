//! Batched, bounded export: ended spans go into a bounded queue without waiting, and one task
//! sends them to the collector in batches.
//!
//! The request path never waits for the collector: when the queue is full (the collector is
//! slow, hung or down) a span is dropped and counted, and an export that fails or passes its
//! timeout drops its batch (counted too). The cost is lost spans under collector trouble,
//! never slower requests. Shutdown exports what is queued, within a bound.

use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::metrics::TraceFamilies;
use super::settings::TraceSettings;

/// Where ended spans go: the bounded queue in front of the export task.
#[derive(Debug, Clone)]
pub struct SpanSink {
    tx: mpsc::Sender<SpanData>,
    queue_full: prometheus::IntCounter,
}

impl SpanSink {
    /// A sink in front of a queue of `size` spans, and the queue's reading end.
    pub(crate) fn bounded(
        size: usize,
        queue_full: prometheus::IntCounter,
    ) -> (Self, mpsc::Receiver<SpanData>) {
        let (tx, rx) = mpsc::channel(size.max(1));
        (Self { tx, queue_full }, rx)
    }

    /// Queue a span, or drop (and count) it when the queue is full or export stopped.
    pub fn send(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.queue_full.inc();
        }
    }
}

/// The export task, to stop when `serve` ends.
pub struct ExportHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl ExportHandle {
    /// Export what is queued and stop, within `bound` (past it, what is left is lost).
    pub async fn shutdown(self, bound: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(bound, &mut task).await.is_err() {
            tracing::warn!(
                ?bound,
                "trace export did not finish in time; dropping the rest"
            );
            task.abort();
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

/// Start the export task with `exporter` (needs a Tokio runtime).
pub fn start<E>(
    exporter: E,
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> (SpanSink, ExportHandle)
where
    E: SpanExporter + 'static,
{
    let (sink, rx) = SpanSink::bounded(settings.queue_size, metrics.queue_full.clone());
    let (stop_tx, stop_rx) = oneshot::channel();
    let batching = Batching {
        batch_size: settings.batch_size.max(1),
        delay: settings.batch_delay,
        timeout: settings.export_timeout,
    };
    let task = tokio::spawn(run(exporter, rx, stop_rx, batching, metrics.clone()));
    let handle = ExportHandle {
        stop: stop_tx,
        task,
    };
    (sink, handle)
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
    b: Batching,
    metrics: TraceFamilies,
) {
    let mut batch = Vec::with_capacity(b.batch_size);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, b.batch_size) => if n == 0 { break },
            _ = &mut stop => break,
        }
        // The first span of a batch waits at most `delay` for the rest.
        let deadline = tokio::time::Instant::now() + b.delay;
        while batch.len() < b.batch_size {
            let room = b.batch_size - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                _ = tokio::time::sleep_until(deadline) => break,
                _ = &mut stop => break,
            }
        }
        export(&exporter, &mut batch, b.timeout, &metrics).await;
    }
    // Stopping: what is queued goes out, in batches (the caller bounds how long).
    rx.close();
    while rx.recv_many(&mut batch, b.batch_size).await > 0 {
        export(&exporter, &mut batch, b.timeout, &metrics).await;
    }
    let _ = exporter.shutdown();
}

/// Send one batch (emptying it), bounded by `timeout`; count what came of it.
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
    metrics: &TraceFamilies,
) {
    let n = batch.len() as u64;
    let spans = std::mem::replace(batch, Vec::with_capacity(batch.capacity()));
    match tokio::time::timeout(timeout, exporter.export(spans)).await {
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
