//! Engine metrics pages: the load gauges of a pod's Prometheus text exposition (`/metrics`),
//! per engine kind.
//!
//! | kind | running | waiting | KV-cache use (0 to 1) |
//! |---|---|---|---|
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`) |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//! | llama.cpp (`--metrics`) | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | `llamacpp:kv_cache_usage_ratio` (older builds only) |
//!
//! vLLM and SGLang label their series (`model_name`, `engine`, `dp_rank`, ...), one series per
//! engine core when a pod runs several; llama.cpp's are unlabelled. The counts of one family
//! are summed over its series and the KV-cache use is their maximum (the fullest engine core
//! decides whether the pod takes more). [`EngineKind::Auto`] takes the first family, in the
//! order above, whose load gauges the page serves.
//!
//! A page is untrusted input: the parser reads at most [`MAX_PAGE_BYTES`], skips lines longer
//! than [`MAX_LINE_BYTES`], looks only at the few names above, and a family with any nonsense
//! sample (NaN, negative, absurd) drops that field instead of guessing.

use memchr::memchr;

use super::report::{count, ratio, EngineReport};
use crate::vocab::EngineKind;

/// Largest page read; the scraper stops reading there too.
pub const MAX_PAGE_BYTES: usize = 1 << 20;
/// Longest line looked at; longer ones (never a load gauge) are skipped.
pub const MAX_LINE_BYTES: usize = 4096;

/// The gauge names of one engine kind.
struct Family {
    kind: EngineKind,
    running: &'static [&'static str],
    waiting: &'static [&'static str],
    /// In order of preference: the first name the page serves is used.
    kv: &'static [&'static str],
}

const FAMILIES: [Family; 3] = [
    Family {
        kind: EngineKind::Vllm,
        running: &["vllm:num_requests_running"],
        waiting: &["vllm:num_requests_waiting"],
        kv: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    },
    Family {
        kind: EngineKind::Sglang,
        running: &["sglang:num_running_reqs"],
        waiting: &["sglang:num_queue_reqs"],
        kv: &["sglang:token_usage"],
    },
    Family {
        kind: EngineKind::LlamaCpp,
        running: &["llamacpp:requests_processing"],
        waiting: &["llamacpp:requests_deferred"],
        kv: &["llamacpp:kv_cache_usage_ratio"],
    },
];

/// A page's load report and the engine kind it was read as.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageReport {
    pub kind: EngineKind,
    pub report: EngineReport,
}

/// Why a page gave no report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the metrics page is larger than {MAX_PAGE_BYTES} bytes")]
    TooLarge,
    #[error("the metrics page serves no {0} load gauge")]
    NoGauges(&'static str),
    #[error("the metrics page's {0} load gauges hold no sane number")]
    Nonsense(&'static str),
    #[error("engine signals are off for this model")]
    Disabled,
}

/// Samples of one gauge name, folded as they are read.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    seen: bool,
    /// A sample was not a sane number: the gauge is not used.
    bad: bool,
    sum: f64,
    max: f64,
}

impl Acc {
    fn add(&mut self, v: Option<f64>) {
        match v {
            Some(v) if v.is_finite() && v >= 0.0 => {
                self.sum += v;
                self.max = if self.seen { self.max.max(v) } else { v };
            }
            _ => self.bad = true,
        }
        self.seen = true;
    }

    fn count(&self) -> Option<u64> {
        (self.seen && !self.bad).then_some(self.sum).and_then(count)
    }

    fn ratio(&self) -> Option<f64> {
        (self.seen && !self.bad).then_some(self.max).and_then(ratio)
    }
}

impl Family {
    /// Its gauge names: running, waiting, then KV-cache names.
    fn names(&self) -> impl Iterator<Item = &'static str> {
        self.running
            .iter()
            .chain(self.waiting)
            .chain(self.kv)
            .copied()
    }
}

/// Gauge names of every family together: one accumulator each.
const NAMES: usize = 10;

fn name_index(name: &[u8]) -> Option<usize> {
    FAMILIES
        .iter()
        .flat_map(Family::names)
        .position(|n| n.as_bytes() == name)
}

/// Parse `page` as an engine of `kind` (`Auto`: detected).
pub fn parse_page(page: &[u8], kind: EngineKind) -> Result<PageReport, PageError> {
    if kind == EngineKind::None {
        return Err(PageError::Disabled);
    }
    if page.len() > MAX_PAGE_BYTES {
        return Err(PageError::TooLarge);
    }
    let mut acc = [Acc::default(); NAMES];
    for line in lines(page) {
        if let Some((i, value)) = sample(line) {
            acc[i].add(value);
        }
    }
    let mut rest = &acc[..];
    for family in &FAMILIES {
        let (mine, others) = rest.split_at(family.names().count());
        rest = others;
        let wanted = kind == EngineKind::Auto || kind == family.kind;
        if wanted && mine.iter().any(|a| a.seen) {
            let report = family_report(family, mine);
            if report.is_empty() {
                return Err(PageError::Nonsense(family.kind.as_str()));
            }
            return Ok(PageReport {
                kind: family.kind,
                report,
            });
        }
    }
    Err(PageError::NoGauges(kind.as_str()))
}

fn family_report(f: &Family, acc: &[Acc]) -> EngineReport {
    let (running, rest) = acc.split_at(f.running.len());
    let (waiting, kv) = rest.split_at(f.waiting.len());
    EngineReport {
        running: running.iter().find(|a| a.seen).and_then(Acc::count),
        waiting: waiting.iter().find(|a| a.seen).and_then(Acc::count),
        kv_usage: kv.iter().find(|a| a.seen).and_then(Acc::ratio),
    }
}

/// The page's lines, without their `\n` (and `\r`), skipping over-long ones.
fn lines(page: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = page;
    std::iter::from_fn(move || loop {
        if rest.is_empty() {
            return None;
        }
        let end = memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or_default();
        if line.len() <= MAX_LINE_BYTES {
            return Some(line.strip_suffix(b"\r").unwrap_or(line));
        }
    })
}

/// A sample line of one of the gauges we read: its name's index and its value (`None`: not a
/// number).
fn sample(line: &[u8]) -> Option<(usize, Option<f64>)> {
    let first = *line.first()?;
    if !matches!(first, b'v' | b's' | b'l') {
        return None;
    }
    let name_end = line
        .iter()
        .position(|&b| b == b'{' || b == b' ' || b == b'\t')?;
    let index = name_index(&line[..name_end])?;
    let mut rest = &line[name_end..];
    if rest.first() == Some(&b'{') {
        rest = &rest[label_set_len(rest)?..];
    }
    let rest = rest.trim_ascii_start();
    let value_end = rest
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    let value = std::str::from_utf8(&rest[..value_end])
        .ok()
        .and_then(|s| s.parse::<f64>().ok());
    Some((index, value))
}

/// Length of the `{...}` label set at the start of `s`, quotes and escapes honoured.
fn label_set_len(s: &[u8]) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in s.iter().enumerate().skip(1) {
        match (in_quotes, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => in_quotes = !in_quotes,
            (false, _, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
