//! Counters behind the sim's `/metrics`, rendered as hand-written Prometheus text.
//!
//! A handful of atomics is all a replica needs to show; a registry would add nothing. Every
//! series carries `pod="<name>"` so one Prometheus scraping several sims can tell them apart.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The routes the sim counts; the label is the metric's `endpoint` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Models,
    Health,
    Metrics,
    Slots,
    NotFound,
    MethodNotAllowed,
}

impl Endpoint {
    pub(super) const ALL: [Endpoint; 9] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Models,
        Endpoint::Health,
        Endpoint::Metrics,
        Endpoint::Slots,
        Endpoint::NotFound,
        Endpoint::MethodNotAllowed,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Models => "models",
            Endpoint::Health => "health",
            Endpoint::Metrics => "metrics",
            Endpoint::Slots => "slots",
            Endpoint::NotFound => "not_found",
            Endpoint::MethodNotAllowed => "method_not_allowed",
        }
    }
}

/// Request and token counters plus the queue gauges.
#[derive(Debug, Default)]
pub(super) struct Stats {
    requests: [AtomicU64; Endpoint::ALL.len()],
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    waiting: AtomicU64,
    running: AtomicU64,
    /// KV-cache blocks held by running requests (prompt and output).
    kv_blocks: AtomicU64,
}

/// Cache figures read under the cache lock at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CacheStats {
    pub used: usize,
    pub capacity: usize,
    pub evictions: u64,
}

impl Stats {
    pub(super) fn count_request(&self, endpoint: Endpoint) {
        self.requests[endpoint as usize].fetch_add(1, Relaxed);
    }

    pub(super) fn count_prompt(&self, prompt_tokens: u64, cached_tokens: u64) {
        self.prompt_tokens.fetch_add(prompt_tokens, Relaxed);
        self.cached_tokens.fetch_add(cached_tokens, Relaxed);
    }

    pub(super) fn count_completion_tokens(&self, n: u64) {
        self.completion_tokens.fetch_add(n, Relaxed);
    }

    /// Count a generation request as waiting for a slot until [`Admission::start`] or drop.
    pub(super) fn admit(self: &Arc<Self>) -> Admission {
        self.waiting.fetch_add(1, Relaxed);
        Admission {
            stats: Arc::clone(self),
            running: false,
            kv_blocks: 0,
        }
    }

    /// Requests waiting for or holding a generation slot.
    pub(super) fn in_flight(&self) -> u64 {
        self.waiting.load(Relaxed) + self.running.load(Relaxed)
    }

    /// What the engine gauges say now: running, waiting, KV-cache use (0 to 1) of `capacity`
    /// blocks.
    pub(super) fn engine_load(&self, capacity: usize) -> super::engine::EngineLoad {
        super::engine::EngineLoad {
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            kv_usage: super::engine::kv_usage(self.kv_blocks.load(Relaxed), capacity),
        }
    }

    /// The sim's own gauges and counters past `sim_requests_total`: name, type, help, value.
    fn series(&self, cache: &CacheStats) -> [(&'static str, &'static str, &'static str, u64); 9] {
        [
            (
                "sim_prompt_tokens_total",
                "counter",
                "Prompt tokens of generation requests.",
                self.prompt_tokens.load(Relaxed),
            ),
            (
                "sim_cached_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
                self.cached_tokens.load(Relaxed),
            ),
            (
                "sim_completion_tokens_total",
                "counter",
                "Output tokens generated.",
                self.completion_tokens.load(Relaxed),
            ),
            (
                "sim_requests_in_flight",
                "gauge",
                "Generation requests waiting or running.",
                self.in_flight(),
            ),
            (
                "sim_requests_running",
                "gauge",
                "Generation requests holding a slot.",
                self.running.load(Relaxed),
            ),
            (
                "sim_requests_waiting",
                "gauge",
                "Generation requests queued for a slot.",
                self.waiting.load(Relaxed),
            ),
            (
                "sim_cache_blocks_used",
                "gauge",
                "Prefix cache blocks held.",
                cache.used as u64,
            ),
            (
                "sim_cache_blocks_capacity",
                "gauge",
                "Prefix cache capacity in blocks.",
                cache.capacity as u64,
            ),
            (
                "sim_cache_evictions_total",
                "counter",
                "Prefix cache blocks evicted.",
                cache.evictions,
            ),
        ]
    }

    /// The Prometheus text exposition: the sim's own series, then vLLM's load gauges
    /// (labelled with the served model, as vLLM labels them).
    pub(super) fn render(&self, pod: &str, model: &str, cache: CacheStats) -> String {
        let pod = escape_label(pod);
        let mut out = String::with_capacity(2048);
        family(
            &mut out,
            "sim_requests_total",
            "counter",
            "Requests received, by endpoint.",
        );
        for e in Endpoint::ALL {
            let n = self.requests[e as usize].load(Relaxed);
            let _ = writeln!(
                out,
                "sim_requests_total{{pod=\"{pod}\",endpoint=\"{}\"}} {n}",
                e.label()
            );
        }
        for (name, kind, help, value) in self.series(&cache) {
            family(&mut out, name, kind, help);
            let _ = writeln!(out, "{name}{{pod=\"{pod}\"}} {value}");
        }
        super::engine::render_vllm(
            &mut out,
            &escape_label(model),
            self.engine_load(cache.capacity),
        );
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A generation request holding the waiting or running gauge (and, running, its KV-cache
/// blocks); releases them on drop.
#[derive(Debug)]
pub(super) struct Admission {
    stats: Arc<Stats>,
    running: bool,
    kv_blocks: u64,
}

impl Admission {
    /// The request got a slot: move it from waiting to running, holding `kv_blocks` blocks.
    pub(super) fn start(&mut self, kv_blocks: u64) {
        if !self.running {
            self.running = true;
            self.kv_blocks = kv_blocks;
            self.stats.waiting.fetch_sub(1, Relaxed);
            self.stats.running.fetch_add(1, Relaxed);
            self.stats.kv_blocks.fetch_add(kv_blocks, Relaxed);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let gauge = if self.running {
            &self.stats.running
        } else {
            &self.stats.waiting
        };
        gauge.fetch_sub(1, Relaxed);
        self.stats.kv_blocks.fetch_sub(self.kv_blocks, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_moves_between_gauges_and_releases() {
        let stats = Arc::new(Stats::default());
        let mut a = stats.admit();
        let _b = stats.admit();
        assert_eq!(stats.waiting.load(Relaxed), 2);
        a.start(30);
        assert_eq!(stats.running.load(Relaxed), 1);
        assert_eq!(stats.in_flight(), 2);
        let load = stats.engine_load(120);
        assert_eq!((load.running, load.waiting, load.kv_usage), (1, 1, 0.25));
        drop(a);
        assert_eq!(stats.running.load(Relaxed), 0);
        assert_eq!(stats.in_flight(), 1);
        assert_eq!(stats.engine_load(120).kv_usage, 0.0);
    }

    #[test]
    fn renders_labelled_series() {
        let stats = Stats::default();
        stats.count_request(Endpoint::Chat);
        stats.count_prompt(100, 64);
        let text = stats.render("a\"b", "m", CacheStats::default());
        assert!(
            text.contains("sim_requests_total{pod=\"a\\\"b\",endpoint=\"chat_completions\"} 1\n")
        );
        assert!(text.contains("sim_cached_tokens_total{pod=\"a\\\"b\"} 64\n"));
        assert!(text.contains("# TYPE sim_cache_blocks_used gauge\n"));
        assert!(
            text.contains("vllm:num_requests_running{model_name=\"m\"} 0\n"),
            "{text}"
        );
    }
}
