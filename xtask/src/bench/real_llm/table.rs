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
    /// Each run's wall time, in seconds.
    walls: Vec<f64>,
}

impl Row {
    /// The row of `runs` (each with its requests per server), their requests pooled.
    pub(super) fn new(workload: Workload, routing: &'static str, runs: &[(Run, Vec<u64>)]) -> Self {
        let samples = || runs.iter().flat_map(|(r, _)| &r.samples);
        let ttft = sorted(samples().map(|s| s.ttft.as_secs_f64()));
        let prompt: u64 = samples().map(|s| s.prompt_tokens).sum();
        let cached: u64 = samples().map(|s| s.cached_tokens).sum();
        let servers = runs.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
        let per_server = (0..servers)
            .map(|i| {
                runs.iter()
                    .map(|(_, p)| p.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        Self {
            workload,
            routing,
            ok: samples().count(),
            failed: runs.iter().map(|(r, _)| r.failed).sum(),
            p50: quantile(&ttft, 0.5),
            p95: quantile(&ttft, 0.95),
            cached: if prompt == 0 {
                f64::NAN
            } else {
                cached as f64 / prompt as f64
            },
            per_server,
            walls: runs.iter().map(|(r, _)| r.wall.as_secs_f64()).collect(),
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

    /// The mean wall time, and each run's when there are several.
    fn wall(&self) -> String {
        let mean = self.walls.iter().sum::<f64>() / self.walls.len().max(1) as f64;
        match self.walls.len() {
            0 | 1 => format!("{mean:.1}"),
            _ => {
                let each: Vec<String> = self.walls.iter().map(|w| format!("{w:.1}")).collect();
                format!("{mean:.1} ({})", each.join(" / "))
            }
        }
    }

    pub(super) fn markdown(&self) -> String {
        let per: Vec<String> = self.per_server.iter().map(u64::to_string).collect();
        format!(
            "| {} | {} | {}/{} | {:.2} | {:.2} | {:.1}% | {} | {:.2} | {} |",
            self.workload.name(),
            self.routing,
            self.ok,
            self.ok + self.failed,
            self.p50,
            self.p95,
            self.cached * 100.0,
            per.join(" "),
            self.max_over_mean(),
            self.wall()
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
    let repeat = match args.repeat {
        1 => "one run".to_owned(),
        n => format!(
            "{n} runs, interleaved, each with its own salt: a row's requests pooled, requests per server summed, wall time the mean (each run's in brackets)"
        ),
    };
    let floor = match args.floor {
        Some(f) => format!("hashBalanceFloor {f}"),
        None => "the proxy's default floor".to_owned(),
    };
    let _ = writeln!(
        t,
        "{} llama.cpp servers (xllamacpp, {model}, 1 thread, {} slots, prompt cache on, `LLAMA_SERVER_SLOTS_DEBUG=1` so `/slots` shows each slot's prompt, {cpu}); chat-with-doc: {} requests over {} documents (in a shuffled order), {} in flight; hot-prompt: {} requests, one shared system prompt, {} in flight; {} tokens generated each; bounded models with {floor} and the proxy's default factor; `-3-proxies` rows: three proxies in front of the same servers, request i through proxy i mod 3, `--fleet-size 3` and each its own `--fleet-rank`, reading the servers' slot prompts (`-3-proxies-hash`: not, `--engine-slot-prompts false`); every row of a run sends the same prompts to servers started afresh for it (smg too starts afresh for each of its runs, and the rows of proxies that read the slots start once every proxy has read every restarted server); {repeat}.\n",
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::workload::Sample;
    use super::*;

    fn run(wall_s: u64, cached: &[u64], failed: usize) -> Run {
        let samples = cached
            .iter()
            .enumerate()
            .map(|(i, &c)| Sample {
                index: i,
                ttft: Duration::from_millis(100 * (i as u64 + 1)),
                prompt_tokens: 100,
                cached_tokens: c,
                route: None,
            })
            .collect();
        Run {
            samples,
            failed,
            wall: Duration::from_secs(wall_s),
        }
    }

    #[test]
    fn a_row_pools_its_runs_and_shows_each_wall_time() {
        let runs = vec![
            (run(10, &[0, 100], 0), vec![2, 0, 0]),
            (run(20, &[50, 50], 1), vec![0, 1, 1]),
        ];
        let row = Row::new(Workload::ChatWithDoc, "cache-aware", &runs);
        let md = row.markdown();
        assert_eq!(
            md,
            "| chat-with-doc | cache-aware | 4/5 | 0.10 | 0.20 | 50.0% | 2 1 1 | 1.50 | 15.0 (10.0 / 20.0) |"
        );
        let one = Row::new(Workload::HotPrompt, "smg-cache-aware", &runs[..1]);
        assert!(
            one.markdown().ends_with("| 2 0 0 | 3.00 | 10.0 |"),
            "{}",
            one.markdown()
        );
    }
}
