//! ORCA in-band load reports: the engine's load, carried on the response to a request that
//! asked for it, so every response refreshes the pod's signal at no extra request.
//!
//! The proxy adds `endpoint-load-metrics-format: text` to the requests it forwards, and the
//! engine answers with an `endpoint-load-metrics` response header in ORCA's native-HTTP form:
//! `TEXT key=value, key=value`, map entries spelled `named_metrics.<name>`. What engines put
//! there (read from their sources):
//!
//! - vLLM (its non-streamed chat and completion responses):
//!   `TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0`, the
//!   values of its `vllm:kv_cache_usage_perc` and `vllm:num_requests_waiting` gauges. It does
//!   not report running requests, so a vLLM pod's in-band report is partial and the scraper
//!   still reads its page.
//! - Triton with TensorRT-LLM: `named_metrics.kv_cache_utilization=0.98,
//!   named_metrics.max_token_capacity=1024` (it accepts the format name in lower case only,
//!   which vLLM accepts too: hence `text`).
//!
//! The value is not trusted: the header is read only up to [`MAX_HEADER_BYTES`], every number
//! goes through [`super::report`]'s checks, and a key given twice is dropped (it cannot be told
//! which value is meant). Only the `TEXT` form is read; `JSON` and `BIN` yield no report.

use http::{HeaderName, HeaderValue};

use super::report::{count, ratio, EngineReport};

/// The request header asking the engine for a load report.
pub const REQUEST_HEADER: HeaderName = HeaderName::from_static("endpoint-load-metrics-format");
/// Its value: the native-HTTP (`TEXT`) form.
pub const REQUEST_VALUE: HeaderValue = HeaderValue::from_static("text");
/// The request header and its value as one header line, for the upstream encoder.
pub const REQUEST_LINE: &[u8] = b"endpoint-load-metrics-format: text\r\n";
/// The response header carrying the report.
pub const RESPONSE_HEADER: HeaderName = HeaderName::from_static("endpoint-load-metrics");

/// Longest header value read; a longer one is ignored whole.
pub const MAX_HEADER_BYTES: usize = 4096;

/// Which report field an ORCA key feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Running,
    Waiting,
    Kv,
}

/// The keys engines use for the fields routing reads (others are ignored).
fn field_of(key: &[u8]) -> Option<Field> {
    let name = key.strip_prefix(b"named_metrics.")?;
    match name {
        b"num_requests_running" => Some(Field::Running),
        b"num_requests_waiting" => Some(Field::Waiting),
        b"kv_cache_usage_perc" | b"kv_cache_utilization" | b"gpu_cache_usage_perc" => {
            Some(Field::Kv)
        }
        _ => None,
    }
}

/// Parse one `endpoint-load-metrics` value. `None` when it is too long, not the `TEXT` form, or
/// carries no sane field routing reads.
pub fn parse(value: &[u8]) -> Option<EngineReport> {
    if value.len() > MAX_HEADER_BYTES {
        return None;
    }
    let body = text_body(value.trim_ascii())?;
    // Per field: the value, or `Err(())` once the key was seen twice or with a bad number.
    let mut fields: [Option<Result<f64, ()>>; 3] = [None; 3];
    for entry in body.split(|&b| b == b',') {
        let entry = entry.trim_ascii();
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let Some(field) = field_of(entry[..eq].trim_ascii()) else {
            continue;
        };
        let value = number(entry[eq + 1..].trim_ascii()).ok_or(());
        let slot = &mut fields[field as usize];
        *slot = Some(match slot {
            None => value,
            Some(_) => Err(()),
        });
    }
    let get = |f: Field| fields[f as usize].and_then(Result::ok);
    let report = EngineReport {
        running: get(Field::Running).and_then(count),
        waiting: get(Field::Waiting).and_then(count),
        kv_usage: get(Field::Kv).and_then(ratio),
    };
    (!report.is_empty()).then_some(report)
}

/// What follows the `TEXT` format word (any case), or `None` for another form.
fn text_body(value: &[u8]) -> Option<&[u8]> {
    let (word, rest) = value.split_at(value.iter().position(|b| b.is_ascii_whitespace())?);
    word.eq_ignore_ascii_case(b"TEXT").then_some(rest)
}

fn number(text: &[u8]) -> Option<f64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(running: Option<u64>, waiting: Option<u64>, kv: Option<f64>) -> Option<EngineReport> {
        Some(EngineReport {
            running,
            waiting,
            kv_usage: kv,
        })
    }

    #[test]
    fn table() {
        for (value, want) in [
            // vLLM, as it formats Python floats.
            (
                "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0",
                r(None, Some(3), Some(0.4)),
            ),
            ("TEXT named_metrics.kv_cache_usage_perc=0.0", r(None, None, Some(0.0))),
            // Triton with TensorRT-LLM.
            (
                "TEXT named_metrics.kv_cache_utilization=0.980000, named_metrics.max_token_capacity=1024",
                r(None, None, Some(0.98)),
            ),
            // Every field, no spaces, lower-case format word, standard ORCA fields ignored.
            (
                "text cpu_utilization=0.3,named_metrics.num_requests_running=7,named_metrics.num_requests_waiting=0,named_metrics.kv_cache_usage_perc=1",
                r(Some(7), Some(0), Some(1.0)),
            ),
            ("  TEXT  named_metrics.num_requests_waiting = 2 ", r(None, Some(2), None)),
            // Nonsense numbers drop their field only.
            (
                "TEXT named_metrics.num_requests_waiting=NaN, named_metrics.kv_cache_usage_perc=0.5",
                r(None, None, Some(0.5)),
            ),
            (
                "TEXT named_metrics.num_requests_waiting=-1, named_metrics.num_requests_running=1e300, named_metrics.kv_cache_usage_perc=0.1",
                r(None, None, Some(0.1)),
            ),
            ("TEXT named_metrics.kv_cache_usage_perc=inf", None),
            ("TEXT named_metrics.kv_cache_usage_perc=42", None),
            ("TEXT named_metrics.num_requests_waiting=three", None),
            // A key given twice is ambiguous: dropped, the rest stays.
            (
                "TEXT named_metrics.num_requests_waiting=1, named_metrics.num_requests_waiting=9, named_metrics.kv_cache_usage_perc=0.2",
                r(None, None, Some(0.2)),
            ),
            // Not the TEXT form, or nothing routing reads.
            ("JSON {\"named_metrics\": {\"kv_cache_usage_perc\": 0.4}}", None),
            ("BIN CZqZmZmZmbk/", None),
            ("TEXT", None),
            ("TEXT ", None),
            ("TEXTnamed_metrics.kv_cache_usage_perc=0.4", None),
            ("TEXT cpu_utilization=0.3, eps=1", None),
            ("TEXT kv_cache_usage_perc=0.4", None),
            ("TEXT =, ,,=1, named_metrics.=2", None),
            ("", None),
            ("\u{0}\u{ff}junk", None),
        ] {
            assert_eq!(parse(value.as_bytes()), want, "{value:?}");
        }
    }

    #[test]
    fn long_values_are_ignored_whole() {
        let pad = " ".repeat(MAX_HEADER_BYTES);
        let v = format!("TEXT named_metrics.num_requests_waiting=1,{pad}");
        assert_eq!(parse(v.as_bytes()), None);
        let fits = format!("TEXT named_metrics.num_requests_waiting=1,{}", &pad[..64]);
        assert_eq!(parse(fits.as_bytes()), r(None, Some(1), None));
    }

    #[test]
    fn reads_the_response_header() {
        assert_eq!(REQUEST_HEADER.as_str(), "endpoint-load-metrics-format");
        assert_eq!(REQUEST_VALUE, "text");
        let line = format!(
            "{}: {}\r\n",
            REQUEST_HEADER,
            REQUEST_VALUE.to_str().unwrap()
        );
        assert_eq!(REQUEST_LINE, line.as_bytes());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_stay_sane(bytes in proptest::collection::vec(any::<u8>(), 0..6000)) {
            if let Some(rep) = parse(&bytes) {
                prop_assert!(bytes.len() <= MAX_HEADER_BYTES);
                prop_assert!(!rep.is_empty());
                prop_assert!(rep.running.is_none_or(|n| n <= crate::signals::report::MAX_COUNT));
                prop_assert!(rep.waiting.is_none_or(|n| n <= crate::signals::report::MAX_COUNT));
                prop_assert!(rep.kv_usage.is_none_or(|k| (0.0..=1.0).contains(&k)));
            }
        }

        #[test]
        fn text_entries_in_any_order_parse(w in 0u32..5000, kv in 0.0f64..1.0, swap in any::<bool>()) {
            let a = format!("named_metrics.num_requests_waiting={w}.0");
            let b = format!("named_metrics.kv_cache_usage_perc={kv}");
            let v = if swap { format!("TEXT {b}, {a}") } else { format!("TEXT {a}, {b}") };
            prop_assert_eq!(parse(v.as_bytes()), r(None, Some(u64::from(w)), Some(kv)));
        }
    }
}
