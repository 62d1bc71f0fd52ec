//! The results table of `bench real-llm`: one row per (workload, routing).

use std::fmt::Write as _;

use flexinfer_test_support::harness::stats::{quantile, sorted};

use super::workload::Run;
use super::{RealLlmBench, Workload};

pub(super) struct Row {
    workload: Workload,
    routing: &'static str,
    ok: usize,
    failed: usize,
    p50: f64,
    p95: f64,
    cached: f64,
    per_server: Vec<u64>,
    wall: f64,
}

impl Row {
    pub(super) fn new(
        workload: Workload,
        routing: &'static str,
        run: &Run,
        per_server: Vec<u64>,
    ) -> Self {
        let ttft = sorted(run.samples.iter().map(|s| s.ttft.as_secs_f64()));
        let prompt: u64 = run.samples.iter().map(|s| s.prompt_tokens).sum();
        let cached: u64 = run.samples.iter().map(|s| s.cached_tokens).sum();
        Self {
            workload,
            routing,
            ok: run.samples.len(),
            failed: run.failed,
            p50: quantile(&ttft, 0.5),
            p95: quantile(&ttft, 0.95),
            cached: if prompt == 0 {
                f64::NAN
            } else {
                cached as f64 / prompt as f64
            },
            per_server,
            wall: run.wall.as_secs_f64(),
        }
    }

    fn max_over_mean(&self) -> f64 {
        let total: u64 = self.per_server.iter().sum();
        let mean = total as f64 / self.per_server.len().max(1) as f64;
        let max = self.per_server.iter().copied().max().unwrap_or(0) as f64;
        if mean > 0.0 {
            max / mean
        } else {
            f64::NAN
        }
    }

    pub(super) fn markdown(&self) -> String {
        let per: Vec<String> = self.per_server.iter().map(u64::to_string).collect();
        format!(
            "| {} | {} | {}/{} | {:.2} | {:.2} | {:.1}% | {} | {:.2} | {:.1} |",
            self.workload.name(),
            self.routing,
            self.ok,
            self.ok + self.failed,
            self.p50,
            self.p95,
            self.cached * 100.0,
            per.join(" "),
            self.max_over_mean(),
            self.wall
        )
    }
}

pub(super) fn table(
    rows: &[Row],
    args: &RealLlmBench,
    model: &str,
    cpu_share: Option<f64>,
) -> String {
    let mut t = String::new();
    let cpu = match cpu_share {
        Some(s) => format!("each capped at {s:.2} of a core"),
        None => "sharing the machine's cores freely".to_owned(),
    };
    let floor = match args.floor {
        Some(f) => format!("hashBalanceFloor {f}"),
        None => "the proxy's default floor".to_owned(),
    };
    let _ = writeln!(
        t,
        "{} llama.cpp servers (xllamacpp, {model}, 1 thread, {} slots, prompt cache on, {cpu}); chat-with-doc: {} requests over {} documents (in a shuffled order), {} in flight; hot-prompt: {} requests, one shared system prompt, {} in flight; {} tokens generated each; bounded models with {floor} and the proxy's default factor; `-3-proxies` rows: three proxies in front of the same servers, request i through proxy i mod 3.\n",
        args.servers,
        args.slots,
        args.doc_requests,
        args.documents,
        args.doc_concurrency,
        args.hot_requests,
        args.hot_concurrency,
        args.max_tokens,
    );
    t.push_str("| workload | routing | ok | TTFT p50 (s) | TTFT p95 (s) | cached prompt tokens | requests per server | max/mean | wall (s) |\n");
    t.push_str("|---|---|---:|---:|---:|---:|---|---:|---:|\n");
    for r in rows {
        t.push_str(&r.markdown());
        t.push('\n');
    }
    t
}
