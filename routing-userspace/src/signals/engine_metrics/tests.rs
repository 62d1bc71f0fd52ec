use proptest::prelude::*;

use super::*;
use crate::signals::report::MAX_COUNT;

/// A vLLM v1 page with two engine cores (data parallel), trimmed.
const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 40.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 81234.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
"#;

/// An older vLLM: the KV-cache gauge had the GPU name.
const VLLM_OLD: &str = "vllm:num_requests_running{model_name=\"m\"} 4.0\n\
vllm:num_requests_swapped{model_name=\"m\"} 0.0\n\
vllm:num_requests_waiting{model_name=\"m\"} 2.0\n\
vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n\
vllm:cpu_cache_usage_perc{model_name=\"m\"} 0.0\n";

const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 2.0
sglang:num_running_reqs_offline_batch{model_name="qwen"} 9.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.28
sglang:cache_hit_rate{model_name="qwen"} 0.0075
"#;

/// llama.cpp's server with `--metrics` (unlabelled gauges).
const LLAMACPP: &str = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
# TYPE llamacpp:prompt_tokens_total counter\n\
llamacpp:prompt_tokens_total 900\n\
llamacpp:predicted_tokens_seconds 0\n\
# HELP llamacpp:requests_processing Number of requests processing.\n\
# TYPE llamacpp:requests_processing gauge\n\
llamacpp:requests_processing 2\n\
# HELP llamacpp:requests_deferred Number of requests deferred.\n\
# TYPE llamacpp:requests_deferred gauge\n\
llamacpp:requests_deferred 1\n";

fn report(running: Option<u64>, waiting: Option<u64>, kv: Option<f64>) -> EngineReport {
    EngineReport {
        running,
        waiting,
        kv_usage: kv,
    }
}

fn ok(kind: EngineKind, r: EngineReport) -> Result<PageReport, PageError> {
    Ok(PageReport { kind, report: r })
}

#[test]
fn reads_each_engine_and_detects_it() {
    use EngineKind::{Auto, LlamaCpp, Sglang, Vllm};
    let vllm = report(Some(5), Some(1), Some(0.5));
    let sglang = report(Some(6), Some(2), Some(0.28));
    let llama = report(Some(2), Some(1), None);
    for (page, kind, want) in [
        (VLLM, Auto, ok(Vllm, vllm)),
        (VLLM, Vllm, ok(Vllm, vllm)),
        (
            VLLM_OLD,
            Auto,
            ok(Vllm, report(Some(4), Some(2), Some(0.75))),
        ),
        (SGLANG, Auto, ok(Sglang, sglang)),
        (SGLANG, Sglang, ok(Sglang, sglang)),
        (LLAMACPP, Auto, ok(LlamaCpp, llama)),
        (LLAMACPP, LlamaCpp, ok(LlamaCpp, llama)),
        // The wrong kind finds nothing.
        (VLLM, Sglang, Err(PageError::NoGauges("sglang"))),
        (LLAMACPP, Vllm, Err(PageError::NoGauges("vllm"))),
        ("", Auto, Err(PageError::NoGauges("auto"))),
        (
            "# just comments\nup 1\n",
            Auto,
            Err(PageError::NoGauges("auto")),
        ),
        (VLLM, EngineKind::None, Err(PageError::Disabled)),
    ] {
        assert_eq!(parse_page(page.as_bytes(), kind), want, "{kind}:\n{page}");
    }
}

#[test]
fn auto_prefers_vllm_then_sglang_when_a_page_serves_several() {
    let page = format!("{LLAMACPP}{SGLANG}");
    assert_eq!(
        parse_page(page.as_bytes(), EngineKind::Auto).unwrap().kind,
        EngineKind::Sglang
    );
    let page = format!("{SGLANG}{VLLM}");
    let got = parse_page(page.as_bytes(), EngineKind::Auto).unwrap();
    assert_eq!(got.kind, EngineKind::Vllm);
    // A concrete kind reads its own family from a mixed page.
    let got = parse_page(page.as_bytes(), EngineKind::Sglang).unwrap();
    assert_eq!(got.report.running, Some(6));
}

#[test]
fn a_family_of_nonsense_is_an_error() {
    for page in [
        "vllm:num_requests_running junk\nvllm:kv_cache_usage_perc 7\n".to_owned(),
        // Summing sane samples past the cap is nonsense too.
        "vllm:num_requests_waiting 1000000\n".repeat(3),
    ] {
        assert_eq!(
            parse_page(page.as_bytes(), EngineKind::Auto),
            Err(PageError::Nonsense("vllm")),
            "{page}"
        );
    }
}

#[test]
fn the_newer_kv_name_wins_when_both_are_served() {
    let page = "vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n";
    let got = parse_page(page.as_bytes(), EngineKind::Vllm).unwrap();
    assert_eq!(got.report, report(None, None, Some(0.1)));
}

#[test]
fn hostile_lines_drop_only_their_field() {
    for (page, want) in [
        // Nonsense values.
        (
            "vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\n",
            report(None, Some(2), None),
        ),
        (
            "vllm:num_requests_running{a=\"1\"} 3\nvllm:num_requests_running{a=\"2\"} -1\nvllm:kv_cache_usage_perc 0.5\n",
            report(None, None, Some(0.5)),
        ),
        (
            "vllm:num_requests_running 1e300\nvllm:kv_cache_usage_perc +Inf\nvllm:num_requests_waiting 0\n",
            report(None, Some(0), None),
        ),
        (
            "vllm:num_requests_running 4\nvllm:num_requests_waiting 1000000\nvllm:num_requests_waiting 1000000\n",
            report(Some(4), None, None),
        ),
        // Labels with quotes, escapes and braces inside values; a timestamp after the value.
        (
            "vllm:num_requests_running{model_name=\"a}b\\\"c\",x=\"{\"} 4 1700000000000\n",
            report(Some(4), None, None),
        ),
        // An unterminated label set, a name prefix, CRLF line ends, no final newline.
        (
            "vllm:num_requests_running{model_name=\"x 5\nvllm:num_requests_running_total 9\r\nvllm:num_requests_waiting 3\r\nvllm:num_requests_running 1",
            report(Some(1), Some(3), None),
        ),
    ] {
        let got = parse_page(page.as_bytes(), EngineKind::Vllm).map(|p| p.report);
        assert_eq!(got, Ok(want), "{page}");
    }
}

#[test]
fn caps_hold() {
    let mut page = VLLM.as_bytes().to_vec();
    page.resize(MAX_PAGE_BYTES + 1, b'\n');
    assert_eq!(
        parse_page(&page, EngineKind::Auto),
        Err(PageError::TooLarge)
    );
    // A line past the length cap is skipped, even when it names a gauge.
    let long = format!(
        "vllm:num_requests_running{{pad=\"{}\"}} 9\nvllm:num_requests_waiting 1\n",
        "x".repeat(MAX_LINE_BYTES)
    );
    let got = parse_page(long.as_bytes(), EngineKind::Vllm).unwrap();
    assert_eq!(got.report, report(None, Some(1), None));
}

#[test]
fn names_table_is_complete() {
    assert_eq!(FAMILIES.iter().flat_map(Family::names).count(), NAMES);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_stay_sane(
        bytes in proptest::collection::vec(any::<u8>(), 0..4000),
        kind in proptest::sample::select(EngineKind::ALL.to_vec()),
    ) {
        if let Ok(p) = parse_page(&bytes, kind) {
            prop_assert!(p.kind != EngineKind::Auto && p.kind != EngineKind::None);
            prop_assert!(p.report.running.is_none_or(|n| n <= MAX_COUNT));
            prop_assert!(p.report.waiting.is_none_or(|n| n <= MAX_COUNT));
            prop_assert!(p.report.kv_usage.is_none_or(|k| (0.0..=1.0).contains(&k)));
        }
    }

    #[test]
    fn pages_made_of_gauge_lines_and_noise_never_panic(
        lines in proptest::collection::vec(
            (0usize..12, "[ -~]{0,40}", proptest::option::of(-10.0f64..1e7)), 0..60),
    ) {
        let names: Vec<&str> = FAMILIES.iter().flat_map(Family::names).collect();
        let mut page = String::new();
        for (i, noise, value) in lines {
            let name = names.get(i).copied().unwrap_or("other");
            let value = value.map_or_else(|| noise.clone(), |v| v.to_string());
            page.push_str(&format!("{name}{{l=\"{noise}\"}} {value}\n"));
        }
        let _ = parse_page(page.as_bytes(), EngineKind::Auto);
    }
}

/// A real page: llama.cpp's server (xllamacpp 2026.10.11549, SmolLM2-135M, 2 slots, `--metrics`)
/// with two requests processing and one deferred.
#[test]
fn golden_llamacpp_page() {
    let page = include_bytes!("../testdata/llamacpp-metrics.txt");
    let got = parse_page(page, EngineKind::Auto).unwrap();
    assert_eq!(got.kind, EngineKind::LlamaCpp);
    assert_eq!(got.report, report(Some(2), Some(1), None));
}
