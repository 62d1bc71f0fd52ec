//! OpenTelemetry traces end to end: a client, the proxy, a pod that records the trace headers
//! it gets, and a local OTLP/HTTP receiver that decodes the spans the proxy exports.

use std::time::Duration;

use flexinfer_tests::header_pod::{header_pod, HeaderPod};
use flexinfer_tests::otlp::{hung_receiver, receiver, tls_receiver, Received, Receiver, TestCa};
use flexinfer_tests::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

fn client_traceparent(flags: &str) -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}")
}

/// A proxy in front of one header-recording pod, exporting to `endpoint` with `env` added.
async fn traced_proxy(
    dir: &TempDir,
    pod: &HeaderPod,
    endpoint: &str,
    env: &[(&str, &str)],
) -> Proxy {
    let cfg = ModelsFile::new().model(ModelEntry::new("m").routing("prefix").endpoint(pod.addr));
    let mut all = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_SERVICE_NAME", "proxy-under-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    all.extend_from_slice(env);
    start_proxy(&cfg, &["--shutdown-delay", "0s"], &all, dir.path()).await
}

async fn chat(proxy: &Proxy, headers: &[(&str, &str)]) {
    let r = post(proxy.addr, "/v1/chat/completions", headers, BODY)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

fn parse_traceparent(v: &str) -> (String, String, String) {
    let parts: Vec<&str> = v.split('-').collect();
    assert_eq!(parts.len(), 4, "{v}");
    assert_eq!(parts[0], "00", "{v}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

fn by_kind(spans: &[Received], kind: i32) -> Vec<&Received> {
    spans.iter().filter(|s| s.span.kind == kind).collect()
}

/// OTLP span kinds.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// The spans dropped for `reason` once `done` holds for them (or after 10 s, whatever they are).
async fn dropped_when(proxy: &Proxy, reason: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = proxy.metrics().await;
        let v = metric_value(
            &m,
            "flexinfer_proxy_trace_spans_dropped_total",
            &[("reason", reason)],
        )
        .unwrap_or(0.0);
        if done(v) || std::time::Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stop the proxy (its export queue is flushed on the way out) and wait for it to exit.
fn stop(proxy: &mut Proxy) {
    let exited = tokio::task::block_in_place(|| proxy.proc.terminate(Duration::from_secs(10)));
    assert!(exited.is_some(), "the proxy did not stop");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trace_goes_from_the_client_through_the_proxy_to_the_pod() {
    let dir = TempDir::new("otel-continuity");
    let (rx, pod) = (receiver().await, header_pod().await);
    let proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &[]).await;
    let tp = client_traceparent("01");
    chat(
        &proxy,
        &[
            ("traceparent", &tp),
            ("tracestate", "vendor=abc"),
            ("x-flexinfer-cache-key", "tenant-secret-key"),
        ],
    )
    .await;
    let spans = rx.wait_spans(2).await;
    let (server, attempt) = (by_kind(&spans, SERVER), by_kind(&spans, CLIENT));
    assert_eq!((server.len(), attempt.len()), (1, 1), "{spans:#?}");
    let (server, attempt) = (server[0], attempt[0]);
    // One trace: the client's.
    assert_eq!(server.trace_id(), CLIENT_TRACE);
    assert_eq!(attempt.trace_id(), CLIENT_TRACE);
    // client span -> proxy server span -> attempt span -> the pod.
    assert_eq!(server.parent_id(), CLIENT_SPAN);
    assert_eq!(attempt.parent_id(), server.span_id());
    let seen = pod.seen();
    let (trace, parent, flags) = parse_traceparent(seen[0].traceparent.as_deref().unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (CLIENT_TRACE, "01"));
    assert_eq!(parent, attempt.span_id());
    assert_eq!(seen[0].tracestate.as_deref(), Some("vendor=abc"));
    // What routing decided and what came of it.
    let a = |k: &str| server.attr(k);
    assert_eq!(server.service, "proxy-under-test");
    assert_eq!(server.span.name, "POST");
    assert_eq!(a("gen_ai.request.model").as_deref(), Some("m"));
    assert_eq!(a("flexinfer.model").as_deref(), Some("m"));
    assert_eq!(a("flexinfer.strategy").as_deref(), Some("prefix"));
    assert_eq!(
        a("flexinfer.key_source").as_deref(),
        Some("explicit-header")
    );
    assert_eq!(a("flexinfer.outcome").as_deref(), Some("pod"));
    assert_eq!(a("flexinfer.spill").as_deref(), Some("false"));
    assert_eq!(a("flexinfer.pod"), Some(pod.addr.to_string()));
    assert_eq!(a("flexinfer.retries").as_deref(), Some("0"));
    assert_eq!(a("flexinfer.queue_wait_seconds").as_deref(), Some("0"));
    assert!(a("flexinfer.ttft_seconds").is_some());
    assert_eq!(a("gen_ai.usage.input_tokens").as_deref(), Some("12"));
    assert_eq!(a("gen_ai.usage.output_tokens").as_deref(), Some("3"));
    assert_eq!(a("http.response.status_code").as_deref(), Some("200"));
    assert_eq!(attempt.attr("server.address"), Some(pod.addr.to_string()));
    assert_eq!(
        attempt.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    // The key itself appears nowhere.
    let text = format!("{spans:?}");
    assert!(!text.contains("tenant-secret-key"));
    assert!(server.span.start_time_unix_nano <= attempt.span.start_time_unix_nano);
    assert!(attempt.span.end_time_unix_nano <= server.span.end_time_unix_nano);
}

/// The request started a trace of its own: the proxy's server span has no parent and is not
/// in the client's trace, the pod got a traceparent of that trace, and no tracestate (a
/// tracestate without its traceparent does not go on).
async fn assert_a_new_root_trace(rx: &Receiver, pod: &HeaderPod) {
    let spans = rx.wait_spans(2).await;
    let server = by_kind(&spans, SERVER)[0];
    assert_ne!(server.trace_id(), CLIENT_TRACE);
    assert_eq!(server.parent_id(), "", "a root span has no parent");
    let seen = pod.seen();
    let (trace, _, _) = parse_traceparent(seen[0].traceparent.as_deref().unwrap());
    assert_eq!(trace, server.trace_id());
    assert_eq!(seen[0].tracestate, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_traceparent_starts_a_new_trace() {
    let dir = TempDir::new("otel-root");
    let (rx, pod) = (receiver().await, header_pod().await);
    let proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &[]).await;
    chat(&proxy, &[("tracestate", "orphan=1")]).await;
    assert_a_new_root_trace(&rx, &pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_traceparent_is_ignored() {
    let dir = TempDir::new("otel-malformed");
    let (rx, pod) = (receiver().await, header_pod().await);
    let proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &[]).await;
    let upper = client_traceparent("01").to_uppercase();
    chat(
        &proxy,
        &[("traceparent", &upper), ("tracestate", "vendor=abc")],
    )
    .await;
    // A new trace, as if there had been no traceparent.
    assert_a_new_root_trace(&rx, &pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_0_exports_nothing_and_passes_the_client_headers_untouched() {
    let dir = TempDir::new("otel-ratio0");
    let (rx, pod) = (receiver().await, header_pod().await);
    let env = [
        ("OTEL_TRACES_SAMPLER", "traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ];
    let mut proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &env).await;
    let tp = client_traceparent("01");
    chat(
        &proxy,
        &[("traceparent", &tp), ("tracestate", "vendor=abc")],
    )
    .await;
    chat(&proxy, &[("traceparent", "garbage"), ("tracestate", "x=1")]).await;
    chat(&proxy, &[]).await;
    let seen = pod.seen();
    assert_eq!(seen[0].traceparent.as_deref(), Some(tp.as_str()));
    assert_eq!(seen[0].tracestate.as_deref(), Some("vendor=abc"));
    assert_eq!(seen[1].traceparent.as_deref(), Some("garbage"));
    assert_eq!(seen[2], Default::default());
    // Shutdown flushes the export queue: whatever was queued has reached the receiver.
    stop(&mut proxy);
    assert_eq!(rx.spans().len(), 0, "{:#?}", rx.spans());
    assert_eq!(rx.requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_collector_drops_counted_spans_and_requests_still_succeed() {
    let dir = TempDir::new("otel-hung");
    let (rx, pod) = (hung_receiver().await, header_pod().await);
    let env = [
        ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "60000"),
    ];
    let proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &env).await;
    for _ in 0..30 {
        chat(&proxy, &[]).await;
    }
    // One export is in flight (hung); the queue holds 4; every other span is dropped.
    let dropped = dropped_when(&proxy, "queue_full", |v| v >= 54.0 && rx.requests() >= 1).await;
    assert!(dropped >= 54.0, "dropped {dropped} of 60 spans");
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(&m, "flexinfer_proxy_trace_spans_exported_total", &[]),
        Some(0.0)
    );
    assert_eq!(rx.requests(), 1, "one export request at a time");
    assert_eq!(pod.seen().len(), 30);
}

/// Start `serve` with `env` set and a models file in `dir`; it must exit with an error, whose
/// standard error is returned.
fn serve_refuses(dir: &TempDir, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let cfg = ModelsFile::new().model(ModelEntry::new("m").endpoint(loopback(free_port())));
    let config = dir.path().join("models.yaml");
    cfg.write_to(&config).unwrap();
    let out = std::process::Command::new(proxy_bin())
        .args(["serve", "--gauge", "userspace", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_endpoint_stops_serve_with_a_clear_error() {
    let dir = TempDir::new("otel-bad");
    let endpoint = (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "ftp://collector:4318".as_ref(),
    );
    let err = serve_refuses(&dir, &[endpoint]);
    assert!(err.contains("expected an http:// or https:// URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ca_file_that_holds_no_certificate_stops_serve_with_a_clear_error() {
    let dir = TempDir::new("otel-bad-ca");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "this is not a certificate\n").unwrap();
    let err = serve_refuses(
        &dir,
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "https://127.0.0.1:4318".as_ref(),
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_os_str()),
        ],
    );
    assert!(err.contains(&ca.display().to_string()), "{err}");
    assert!(err.contains("no PEM certificate"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_that_do_not_parse_stop_serve_with_a_clear_error() {
    let dir = TempDir::new("otel-bad-headers");
    let err = serve_refuses(
        &dir,
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:4318".as_ref(),
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%2".as_ref(),
            ),
        ],
    );
    assert!(err.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{err}");
    assert!(
        err.contains("\"authorization\" is not percent-encoded"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_collector_gets_the_spans_over_tls_with_the_configured_headers() {
    let dir = TempDir::new("otel-tls");
    let ca = TestCa::new(dir.path());
    let (rx, pod) = (tls_receiver(&ca).await, header_pod().await);
    let ca_path = ca.ca.display().to_string();
    let env = [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca_path.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0ken"),
    ];
    let mut proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &env).await;
    chat(&proxy, &[]).await;
    let spans = rx.wait_spans(2).await;
    assert_eq!(by_kind(&spans, SERVER).len(), 1, "{spans:#?}");
    assert_eq!(by_kind(&spans, CLIENT).len(), 1, "{spans:#?}");
    assert_eq!(rx.authorization().as_deref(), Some("Bearer t0ken"));
    stop(&mut proxy);
}

#[tokio::test(flavor = "multi_thread")]
async fn gzip_compression_reaches_the_collector_as_gzip_and_decodes_to_the_spans() {
    let dir = TempDir::new("otel-gzip");
    let (rx, pod) = (receiver().await, header_pod().await);
    let env = [("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")];
    let mut proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &env).await;
    chat(&proxy, &[]).await;
    let spans = rx.wait_spans(2).await;
    assert_eq!(rx.encoding().as_deref(), Some("gzip"));
    assert_eq!(by_kind(&spans, SERVER).len(), 1, "{spans:#?}");
    assert_eq!(by_kind(&spans, CLIENT).len(), 1, "{spans:#?}");
    assert_eq!(by_kind(&spans, SERVER)[0].service, "proxy-under-test");
    stop(&mut proxy);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_compression_is_ignored_with_a_warning_and_spans_go_uncompressed() {
    let dir = TempDir::new("otel-zstd");
    let (rx, pod) = (receiver().await, header_pod().await);
    let env = [("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")];
    let mut proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &env).await;
    chat(&proxy, &[]).await;
    rx.wait_spans(2).await;
    assert_eq!(rx.encoding(), None);
    let log = proxy.proc.log_text();
    stop(&mut proxy);
    assert!(
        log.contains("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION") && log.contains("zstd"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_collector_with_an_untrusted_certificate_gets_nothing_and_drops_are_counted() {
    let dir = TempDir::new("otel-tls-untrusted");
    let ca = TestCa::new(dir.path());
    let (rx, pod) = (tls_receiver(&ca).await, header_pod().await);
    // No CA file: the platform's roots do not know the test CA.
    let proxy = traced_proxy(&dir, &pod, &rx.endpoint(), &[]).await;
    chat(&proxy, &[]).await;
    let failed = dropped_when(&proxy, "export_failed", |v| v >= 2.0).await;
    assert_eq!(failed, 2.0, "both spans of the request fail to export");
    // (chat asserted the request's 200: export trouble costs requests nothing.)
    assert_eq!(rx.requests(), 0, "no export request got through TLS");
}
