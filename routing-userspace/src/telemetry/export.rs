//! Batched, bounded export: ended spans go into a bounded queue without waiting, and a thread
//! of its own sends them to the collector in batches.
//!
//! The thread (`otlp-export`, with a one-thread runtime) keeps the exporter's work (turning a
//! batch into protobuf takes about a millisecond for 512 spans) off the request workers: run as
//! a task there, it would hold up every request of its worker for that long.
//!
//! The request path never waits for the collector: when the queue is full (the collector is
//! slow, hung or down) a span is dropped and counted, and an export that fails or passes its
//! timeout drops its batch (counted too). The cost is lost spans under collector trouble,
//! never slower requests. Shutdown exports what is queued, within a bound.

use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::{mpsc, oneshot};
#[cfg(test)]
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

/// The export loop, to stop when `serve` ends.
pub struct ExportHandle {
    stop: oneshot::Sender<()>,
    ended: Ended,
}

/// How the end of the export loop is seen.
enum Ended {
    /// Its thread says so (it cannot be aborted; the process exit ends it).
    Thread(oneshot::Receiver<()>),
    /// A task of the caller's runtime (the tests').
    #[cfg(test)]
    Task(JoinHandle<()>),
}

impl ExportHandle {
    /// Export what is queued and stop, within `bound` (past it, what is left is lost).
    pub async fn shutdown(self, bound: Duration) {
        let _ = self.stop.send(());
        let in_time = match self.ended {
            Ended::Thread(done) => tokio::time::timeout(bound, done).await.is_ok(),
            #[cfg(test)]
            Ended::Task(mut task) => {
                let ok = tokio::time::timeout(bound, &mut task).await.is_ok();
                task.abort();
                ok
            }
        };
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

impl Batching {
    fn of(settings: &TraceSettings) -> Self {
        Self {
            batch_size: settings.batch_size.max(1),
            delay: settings.batch_delay,
            timeout: settings.export_timeout,
        }
    }
}

/// Start the export loop with `exporter` on a thread of its own.
pub fn start<E>(
    exporter: E,
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> std::io::Result<(SpanSink, ExportHandle)>
where
    E: SpanExporter + 'static,
{
    let (sink, rx) = SpanSink::bounded(settings.queue_size, metrics.queue_full.clone());
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (batching, metrics) = (Batching::of(settings), metrics.clone());
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || {
            runtime.block_on(run(exporter, rx, stop_rx, batching, metrics));
            let _ = done_tx.send(());
        })?;
    let handle = ExportHandle {
        stop: stop_tx,
        ended: Ended::Thread(done_rx),
    };
    Ok((sink, handle))
}

/// The same loop as a task of the current runtime (the tests drive it on paused time).
#[cfg(test)]
fn start_task<E>(
    exporter: E,
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> (SpanSink, ExportHandle)
where
    E: SpanExporter + 'static,
{
    let (sink, rx) = SpanSink::bounded(settings.queue_size, metrics.queue_full.clone());
    let (stop_tx, stop_rx) = oneshot::channel();
    let batching = Batching::of(settings);
    let task = tokio::spawn(run(exporter, rx, stop_rx, batching, metrics.clone()));
    let handle = ExportHandle {
        stop: stop_tx,
        ended: Ended::Task(task),
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
