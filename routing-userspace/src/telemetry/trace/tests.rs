use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};
use http::Method;
use opentelemetry::trace::{SpanKind, TraceId};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SpanData;

use super::*;
use crate::telemetry::export::SpanQueue;
use crate::telemetry::propagation::{self, TRACEPARENT};

const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn tracer(sampler: &str, arg: Option<&str>) -> (Arc<Tracer>, Arc<SpanQueue>) {
    let (sink, rx) = SpanSink::bounded(16, 16, prometheus::IntCounter::new("t", "t").unwrap());
    let sampler = Sampler::parse(sampler, arg).unwrap();
    (Arc::new(Tracer::new(sampler, sink)), rx)
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

fn start(t: Option<&Arc<Tracer>>, h: &HeaderMap) -> Trace {
    Trace::start(t, h, &Method::POST, "/v1/chat/completions", Instant::now())
}

#[test]
fn off_or_unsampled_leaves_the_headers_alone() {
    let h = headers(&[("traceparent", CLIENT), ("tracestate", "a=1")]);
    let mut off = start(None, &h);
    let (t0, _rx) = tracer("traceidratio", Some("0"));
    let mut unsampled = start(Some(&t0), &h);
    for trace in [&mut off, &mut unsampled] {
        assert!(!trace.is_sampled());
        let mut out = h.clone();
        trace.attempt_started("10.0.0.1:8000", &mut out);
        assert_eq!(out, h);
    }
}

#[test]
fn a_sampled_request_gives_the_pod_its_attempt_as_parent() {
    let (t, rx) = tracer("parentbased_always_on", None);
    let h = headers(&[("traceparent", CLIENT), ("tracestate", "a=1")]);
    let mut trace = start(Some(&t), &h);
    let client = propagation::parse(CLIENT.as_bytes()).unwrap();
    assert_eq!(trace.trace_id(), Some(client.trace_id));
    let mut out = h.clone();
    trace.attempt_started("10.0.0.1:8000", &mut out);
    trace.attempt_ended(AttemptEnd::Failed {
        status: Some(503),
        error: "10.0.0.1:8000 answered 503",
    });
    trace.retried();
    trace.attempt_started("10.0.0.2:8000", &mut out);
    trace.attempt_ended(AttemptEnd::Answered(200));
    let sent = propagation::parse(out[TRACEPARENT].as_bytes()).unwrap();
    assert_eq!(out["tracestate"], "a=1");
    let attrs = vec![KeyValue::new(
        "flexinfer.retries",
        i64::from(trace.retries()),
    )];
    trace.finish(Instant::now(), Some(200), attrs);
    assert!(!trace.is_sampled(), "finished once");
    let spans: Vec<SpanData> = rx.take(usize::MAX);
    assert_eq!(spans.len(), 3);
    let (failed, answered, server) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(server.span_kind, SpanKind::Server);
    assert_eq!(server.parent_span_id, client.parent_id);
    assert!(server.parent_span_is_remote);
    for a in [failed, answered] {
        assert_eq!(a.span_kind, SpanKind::Client);
        assert_eq!(a.parent_span_id, server.span_context.span_id());
        assert_eq!(a.span_context.trace_id(), client.trace_id);
    }
    // The pod's parent is the attempt that reached it.
    assert_eq!(sent.parent_id, answered.span_context.span_id());
    assert!(matches!(failed.status, Status::Error { .. }));
    assert_eq!(answered.status, Status::Unset);
    let retries = server
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "flexinfer.retries");
    assert_eq!(retries.map(|kv| kv.value.to_string()).as_deref(), Some("1"));
}

#[test]
fn a_new_root_drops_an_orphan_tracestate() {
    let (t, rx) = tracer("always_on", None);
    let h = headers(&[("traceparent", "00-zz"), ("tracestate", "a=1")]);
    let mut trace = start(Some(&t), &h);
    let root = trace.trace_id().unwrap();
    assert_ne!(root, TraceId::INVALID);
    let mut out = h.clone();
    trace.attempt_started("10.0.0.1:8000", &mut out);
    assert!(out.get("tracestate").is_none());
    assert_eq!(
        propagation::parse(out[TRACEPARENT].as_bytes())
            .unwrap()
            .trace_id,
        root
    );
    trace.finish(Instant::now(), None, Vec::new());
    let spans: Vec<SpanData> = rx.take(usize::MAX);
    let server = spans.last().unwrap();
    assert_eq!(server.parent_span_id, opentelemetry::trace::SpanId::INVALID);
    // The client went away: an error.
    assert!(matches!(server.status, Status::Error { .. }));
}
