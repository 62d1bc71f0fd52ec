use http::HeaderValue;
use proptest::prelude::*;

use super::*;

fn usage(prompt: u64, completion: u64, cached: Option<u64>) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: cached,
    })
}

fn sse(events: &[&str]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// A vLLM chat completion (non-streamed), its `usage` after `choices`.
const VLLM_JSON: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi! The \"usage\": {\"prompt_tokens\": 99} here is text.","tool_calls":[]},"logprobs":null,"finish_reason":"stop"}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1200,"total_tokens":1216,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":1024}},"prompt_logprobs":null,"kv_transfer_params":null}"#;

/// llama.cpp's server, non-streamed: `usage` and `timings`.
const LLAMA_JSON: &str = r#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"ok"}}],"created":1,"model":"m","system_fingerprint":"b1","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":890,"total_tokens":898,"prompt_tokens_details":{"cached_tokens":880}},"id":"chatcmpl-x","timings":{"cache_n":880,"prompt_n":10,"prompt_ms":50.1,"prompt_per_token_ms":5.0,"prompt_per_second":199.6,"predicted_n":8,"predicted_ms":80.0,"predicted_per_token_ms":10.0,"predicted_per_second":100.0}}"#;

fn openai_stream() -> String {
    sse(&[
        r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}"#,
        r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null}"#,
        r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
        r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":16}}}"#,
        "[DONE]",
    ])
}

/// llama.cpp streamed without `include_usage`: only the last chunk's `timings`.
fn llama_stream_timings_only() -> String {
    sse(&[
        r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"object":"chat.completion.chunk"}"#,
        r#"{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk","timings":{"cache_n":64,"prompt_n":6,"prompt_ms":2.0,"predicted_n":3,"predicted_ms":9.0}}"#,
        "[DONE]",
    ])
}

/// llama.cpp streamed with `include_usage`: the usage chunk also carries `timings`.
fn llama_stream_with_usage() -> String {
    sse(&[
        r#"{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk"}"#,
        r#"{"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":70,"total_tokens":73,"prompt_tokens_details":{"cached_tokens":64}},"timings":{"cache_n":64,"prompt_n":6,"predicted_n":3}}"#,
        "[DONE]",
    ])
}

/// vLLM with `continuous_usage_stats`: every chunk has usage, the last is final.
fn vllm_continuous() -> String {
    sse(&[
        r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":50,"completion_tokens":1,"total_tokens":51}}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"prompt_tokens":50,"completion_tokens":2,"total_tokens":52}}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"total_tokens":53}}"#,
        "[DONE]",
    ])
}

fn responses_api() -> String {
    r#"event: response.completed
data: {"type":"response.completed","response":{"id":"r","status":"completed","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":5,"total_tokens":45}}}

"#
    .to_owned()
}

fn observe(frames: &[&[u8]]) -> Option<Usage> {
    let mut o = UsageObserver::new();
    for f in frames {
        o.feed(f);
    }
    o.usage()
}

fn cases() -> Vec<(&'static str, String, Option<Usage>)> {
    vec![
        ("vllm json", VLLM_JSON.to_owned(), usage(1200, 16, Some(1024))),
        ("llama.cpp json", LLAMA_JSON.to_owned(), usage(890, 8, Some(880))),
        ("openai sse", openai_stream(), usage(30, 2, Some(16))),
        (
            "llama.cpp sse, timings only",
            llama_stream_timings_only(),
            usage(70, 3, Some(64)),
        ),
        (
            "llama.cpp sse, usage",
            llama_stream_with_usage(),
            usage(70, 3, Some(64)),
        ),
        ("vllm continuous usage", vllm_continuous(), usage(50, 3, None)),
        ("responses api", responses_api(), usage(40, 5, Some(32))),
        (
            "no usage",
            sse(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#, "[DONE]"]),
            None,
        ),
        (
            "embeddings",
            r#"{"object":"list","data":[],"model":"m","usage":{"prompt_tokens":7,"total_tokens":7}}"#
                .to_owned(),
            usage(7, 0, None),
        ),
        ("empty body", String::new(), None),
    ]
}

#[test]
fn finds_usage_in_each_shape() {
    for (name, body, want) in cases() {
        assert_eq!(observe(&[body.as_bytes()]), want, "{name}");
    }
}

#[test]
fn a_split_at_any_byte_gives_the_same_result() {
    for (name, body, want) in cases() {
        let b = body.as_bytes();
        for i in 0..=b.len() {
            assert_eq!(observe(&[&b[..i], &b[i..]]), want, "{name} split at {i}");
        }
        for (i, j) in [(1, 2), (3, 7), (b.len() / 3, b.len() / 2)] {
            let (i, j) = (i.min(b.len()), j.min(b.len()));
            assert_eq!(observe(&[&b[..i], &b[i..j], &b[j..]]), want, "{name}");
        }
    }
}

#[test]
fn byte_by_byte_gives_the_same_result() {
    for (name, body, want) in cases() {
        let frames: Vec<&[u8]> = body.as_bytes().chunks(1).collect();
        assert_eq!(observe(&frames), want, "{name}");
        let frames: Vec<&[u8]> = body.as_bytes().chunks(5).collect();
        assert_eq!(observe(&frames), want, "{name}");
    }
}

#[test]
fn hostile_usage() {
    for (body, want) in [
        // Cached more than the prompt: the cached count is not believed.
        (
            r#"{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":11}}}"#,
            usage(10, 1, None),
        ),
        // Not whole numbers, negative, absurd: those fields are missing.
        (
            r#"{"usage":{"prompt_tokens":10.5,"completion_tokens":-1}}"#,
            None,
        ),
        (
            r#"{"usage":{"prompt_tokens":12,"completion_tokens":-1,"prompt_tokens_details":{"cached_tokens":"8"}}}"#,
            usage(12, 0, None),
        ),
        (r#"{"usage":{"prompt_tokens":1e300}}"#, None),
        (r#"{"usage":{"prompt_tokens":99999999999999999999}}"#, None),
        (r#"{"usage":{"prompt_tokens":2000000000000}}"#, None),
        // Not an object, or broken.
        (r#"{"usage":"lots"}"#, None),
        (r#"{"usage":[1,2]}"#, None),
        (r#"{"usage":{"prompt_tokens":3"#, None),
        (r#"{"usage":{"prompt_tokens":3]]}"#, None),
        (r#"{"usage" 5, "timings": null}"#, None),
        (
            r#"{"object":"usage","usage":{"prompt_tokens":4}}"#,
            usage(4, 0, None),
        ),
        // A later broken report does not erase an earlier good one.
        (
            r#"{"usage":{"prompt_tokens":4}} {"usage":{"prompt_tokens":"#,
            usage(4, 0, None),
        ),
    ] {
        assert_eq!(observe(&[body.as_bytes()]), want, "{body}");
    }
}

#[test]
fn an_oversized_object_is_skipped_and_memory_stays_bounded() {
    let big = format!(
        r#"{{"usage":{{"prompt_tokens":5,"pad":"{}"}}}}"#,
        "x".repeat(MAX_CAPTURE)
    );
    assert_eq!(observe(&[big.as_bytes()]), None);
    let mut o = UsageObserver::new();
    o.feed(br#"{"usage":{"prompt_tokens":6}}"#);
    o.feed(big.as_bytes());
    assert_eq!(o.usage(), usage(6, 0, None));
    assert!(o.scratch.capacity() <= 2 * MAX_CAPTURE + 64);
}

#[test]
fn a_100_mb_body_does_not_grow_the_observer() {
    let event = sse(&[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"}}],"usage":{"prompt_tokens":50,"completion_tokens":2}}"#,
    ]);
    let frame: Vec<u8> = event.as_bytes().repeat((64 << 10) / event.len());
    let mut o = UsageObserver::new();
    let mut fed = 0;
    while fed < 100 << 20 {
        o.feed(&frame);
        fed += frame.len();
    }
    assert_eq!(o.usage(), usage(50, 2, None));
    for buf in [&o.scratch, &o.usage, &o.timings] {
        assert!(buf.capacity() <= 1024, "{}", buf.capacity());
    }
}

#[test]
fn observes_json_and_sse_responses_only() {
    let mut h = HeaderMap::new();
    assert!(UsageObserver::for_response(&h).is_none());
    for (ct, yes) in [
        ("application/json", true),
        ("application/json; charset=utf-8", true),
        ("text/event-stream", true),
        ("Text/Event-Stream;charset=UTF-8", true),
        ("text/plain", false),
        ("audio/mpeg", false),
    ] {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        assert_eq!(UsageObserver::for_response(&h).is_some(), yes, "{ct}");
    }
}

proptest! {
    #[test]
    fn arbitrary_frames_never_panic_and_stay_bounded(
        frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 0..20),
    ) {
        let mut o = UsageObserver::new();
        for f in &frames {
            o.feed(f);
        }
        let _ = o.usage();
        for buf in [&o.scratch, &o.usage, &o.timings] {
            prop_assert!(buf.len() <= MAX_CAPTURE + 1);
        }
    }

    #[test]
    fn keys_and_braces_in_random_places_never_panic(
        parts in proptest::collection::vec(
            proptest::sample::select(vec![
                "\"usage\"", "\"timings\"", ":", "{", "}", "[", "]", "\"", "\\", " ",
                "\"prompt_tokens\":", "12", "null", ",", "data: ", "\n\n",
            ]),
            0..80),
        split in 0usize..400,
    ) {
        let body: String = parts.concat();
        let b = body.as_bytes();
        let split = split.min(b.len());
        let whole = observe(&[b]);
        prop_assert_eq!(observe(&[&b[..split], &b[split..]]), whole);
    }
}

/// Real answers of llama.cpp's server (xllamacpp 2026.10.11549, SmolLM2-135M), the second of
/// two equal prompts: 339 of its 340 prompt tokens came from the cache.
#[test]
fn golden_llamacpp_answers() {
    for (name, body) in [
        (
            "json",
            &include_bytes!("../testdata/llamacpp-chat.json")[..],
        ),
        (
            "sse, timings only",
            &include_bytes!("../testdata/llamacpp-stream-timings.sse")[..],
        ),
        (
            "sse, include_usage",
            &include_bytes!("../testdata/llamacpp-stream-usage.sse")[..],
        ),
    ] {
        let want = usage(340, 8, Some(339));
        assert_eq!(observe(&[body]), want, "{name}");
        for i in 0..=body.len() {
            assert_eq!(
                observe(&[&body[..i], &body[i..]]),
                want,
                "{name} split at {i}"
            );
        }
    }
}

/// The first key starting at or after `from`, by a plain search of every position.
fn plain_next_key(hay: &[u8], from: usize) -> Option<(Key, usize)> {
    (from..hay.len()).find_map(|start| {
        [
            (Key::Usage, &b"\"usage\""[..]),
            (Key::Timings, &b"\"timings\""[..]),
        ]
        .into_iter()
        .find(|(_, text)| hay[start..].starts_with(text))
        .map(|(key, text)| (key, start + text.len()))
    })
}

proptest! {
    /// The scan anchored on `g` finds the key a plain search finds, in text made of the keys,
    /// their pieces and the `g`s and quotes around them.
    #[test]
    fn the_key_scan_finds_what_a_plain_search_finds(
        pieces in proptest::collection::vec(
            prop::sample::select(vec![
                "\"usage\"", "\"timings\"", "g", "\"", "usag", "timin", "gs\"", "\"usa", "e\"",
                "ings\"", "{\"logprobs\":null}", "x", "\"timings\"\"usage\"",
            ]),
            0..24,
        ),
        from in 0usize..120,
    ) {
        let hay: Vec<u8> = pieces.concat().into_bytes();
        prop_assert_eq!(key_from(&hay, from), plain_next_key(&hay, from));
    }
}
