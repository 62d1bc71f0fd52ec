//! Tracing's own metric families: what export did with the spans. Created here, registered by
//! the owner of the registry ([`TraceFamilies::collectors`]); both series exist from the start.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, Opts};

/// Why a span never reached the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The export queue was full (the collector is slow, hung or gone).
    QueueFull,
    /// Its batch's export failed or passed the export timeout.
    ExportFailed,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::ExportFailed => "export_failed",
        }
    }
}

#[derive(Clone)]
pub struct TraceFamilies {
    dropped_total: IntCounterVec,
    pub queue_full: IntCounter,
    pub export_failed: IntCounter,
    pub exported: IntCounter,
}

impl TraceFamilies {
    pub fn new() -> Self {
        let dropped_total = IntCounterVec::new(
            Opts::new(
                "flexinfer_proxy_trace_spans_dropped_total",
                "Spans that never reached the OTLP collector: queue_full (the export queue was full), export_failed (their batch's export failed or timed out)",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let exported = IntCounter::new(
            "flexinfer_proxy_trace_spans_exported_total",
            "Spans the OTLP collector accepted",
        )
        .expect("valid metric");
        let of = |r: DropReason| dropped_total.with_label_values(&[r.as_str()]);
        Self {
            queue_full: of(DropReason::QueueFull),
            export_failed: of(DropReason::ExportFailed),
            dropped_total,
            exported,
        }
    }

    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.dropped_total.clone()),
            Box::new(self.exported.clone()),
        ]
    }
}

impl Default for TraceFamilies {
    fn default() -> Self {
        Self::new()
    }
}
