//! The engine signals the sim speaks, as vLLM speaks them, so the proxy's in-band reports, its
//! scraper and its tests run against the sim as against a vLLM pod:
//!
//! - `/metrics` carries `vllm:num_requests_running`, `vllm:num_requests_waiting` and
//!   `vllm:kv_cache_usage_perc`, labelled `model_name`;
//! - a chat or text completion that asks with `endpoint-load-metrics-format: text` (any case)
//!   gets `endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=<f>,
//!   named_metrics.num_requests_waiting=<f>` when it is answered whole; as with vLLM, streamed
//!   answers carry none, and there is no running count.
//!
//! KV-cache use is the blocks held by running requests (their prompt and their output, in
//! blocks of `--block-tokens`) over the cache capacity (`--cache-blocks`), at most 1: like
//! vLLM's, blocks that only hold cached prefixes count as free. A sim without a cache reports 0.

use std::fmt::Write;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The request header asking for a load report.
const LOAD_REPORT_FORMAT: HeaderName = HeaderName::from_static("endpoint-load-metrics-format");
/// The response header carrying it.
pub(super) const LOAD_REPORT_HEADER: HeaderName = HeaderName::from_static("endpoint-load-metrics");

/// The engine gauges at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct EngineLoad {
    pub running: u64,
    pub waiting: u64,
    pub kv_usage: f64,
}

/// KV-cache use: `blocks` held of `capacity`, 0 to 1.
pub(super) fn kv_usage(blocks: u64, capacity: usize) -> f64 {
    if capacity == 0 {
        return 0.0;
    }
    (blocks as f64 / capacity as f64).min(1.0)
}

/// Whether the request asked for the `TEXT` load report (vLLM reads the format name in any
/// case; its other form, JSON, is not spoken here).
pub(super) fn wants_load_report(headers: &HeaderMap) -> bool {
    headers
        .get(LOAD_REPORT_FORMAT)
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"text"))
}

/// A float as Python prints it (vLLM's header is Python's `f"{value}"`): `3.0`, `0.25`.
fn py_float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

impl EngineLoad {
    /// The `endpoint-load-metrics` value vLLM sends.
    pub(super) fn orca_header(&self) -> HeaderValue {
        let text = format!(
            "TEXT named_metrics.kv_cache_usage_perc={}, named_metrics.num_requests_waiting={}",
            py_float(self.kv_usage),
            py_float(self.waiting as f64)
        );
        HeaderValue::from_str(&text).expect("digits and ASCII are a header value")
    }
}

/// Append vLLM's load gauges for `model` (already escaped for a label value).
pub(super) fn render_vllm(out: &mut String, model: &str, load: EngineLoad) {
    let gauges: [(&str, &str, String); 3] = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            load.running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            load.waiting.to_string(),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            load.kv_usage.to_string(),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{model_name=\"{model}\"}} {value}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::engine_metrics::parse_page;
    use crate::signals::{orca, EngineReport};
    use crate::vocab::EngineKind;

    fn load() -> EngineLoad {
        EngineLoad {
            running: 3,
            waiting: 2,
            kv_usage: 0.25,
        }
    }

    #[test]
    fn the_header_is_vllms_and_the_proxy_reads_it() {
        let h = load().orca_header();
        assert_eq!(
            h,
            "TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0"
        );
        let idle = EngineLoad {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
        };
        assert!(idle.orca_header().to_str().unwrap().contains("perc=0.0,"));
        assert_eq!(
            orca::parse(h.as_bytes()),
            Some(EngineReport {
                running: None,
                waiting: Some(2),
                kv_usage: Some(0.25),
            })
        );
    }

    #[test]
    fn the_page_is_vllms_and_the_proxy_reads_it() {
        let mut page = String::new();
        render_vllm(&mut page, "sim-model", load());
        assert!(page.contains("vllm:num_requests_waiting{model_name=\"sim-model\"} 2\n"));
        let got = parse_page(page.as_bytes(), EngineKind::Auto).unwrap();
        assert_eq!(got.kind, EngineKind::Vllm);
        assert_eq!(
            got.report,
            EngineReport {
                running: Some(3),
                waiting: Some(2),
                kv_usage: Some(0.25),
            }
        );
    }

    #[test]
    fn asking_and_kv_use() {
        let mut h = HeaderMap::new();
        assert!(!wants_load_report(&h));
        for (v, yes) in [
            ("TEXT", true),
            ("text", true),
            (" Text ", true),
            ("json", false),
        ] {
            h.insert(LOAD_REPORT_FORMAT, HeaderValue::from_static(v));
            assert_eq!(wants_load_report(&h), yes, "{v}");
        }
        assert_eq!(kv_usage(10, 40), 0.25);
        assert_eq!(kv_usage(90, 40), 1.0);
        assert_eq!(kv_usage(5, 0), 0.0);
    }
}
