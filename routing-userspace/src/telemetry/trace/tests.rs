use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};
use http::Method;
use opentelemetry::trace::{SpanId, TraceId};

use super::*;
use crate::telemetry::export::SpanQueue;
use crate::telemetry::propagation::{self, TRACEPARENT};
use crate::telemetry::span::Value;

fn pod(addr: &'static str) -> impl FnOnce() -> Value {
    move || Value::Static(addr)
}

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
        trace.attempt_started(pod("10.0.0.1:8000"), &mut out);
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
    trace.attempt_started(pod("10.0.0.1:8000"), &mut out);
    trace.attempt_ended(AttemptEnd::Failed {
        status: Some(503),
        error: "10.0.0.1:8000 answered 503",
    });
    trace.retried();
    trace.attempt_started(pod("10.0.0.2:8000"), &mut out);
    trace.attempt_ended(AttemptEnd::Answered(200));
    let sent = propagation::parse(out[TRACEPARENT].as_bytes()).unwrap();
    assert_eq!(out["tracestate"], "a=1");
    let attrs = vec![Attribute::new(
        "flexinfer.retries",
        i64::from(trace.retries()),
    )];
    trace.finish(Instant::now(), Some(200), attrs);
    assert!(!trace.is_sampled(), "finished once");
    let spans: Vec<EndedSpan> = rx.take(usize::MAX);
    assert_eq!(spans.len(), 3);
    let (failed, answered, server) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(server.kind, SpanKind::Server);
    assert_eq!(server.parent, client.parent_id);
    assert!(server.parent_is_remote);
    assert_eq!(server.trace_state.as_deref(), Some("a=1"));
    for a in [failed, answered] {
        assert_eq!(a.kind, SpanKind::Client);
        assert_eq!(a.parent, server.span_id);
        assert_eq!(a.trace_id, client.trace_id);
        assert!(!a.parent_is_remote);
    }
    // The pod's parent is the attempt that reached it.
    assert_eq!(sent.parent_id, answered.span_id);
    assert_eq!(failed.error.as_deref(), Some("10.0.0.1:8000 answered 503"));
    assert_eq!(
        failed.attribute("error.type"),
        Some(&Value::Static("upstream"))
    );
    assert_eq!(
        failed.attribute("http.response.status_code"),
        Some(&Value::Int(503))
    );
    assert_eq!(answered.error, None);
    assert_eq!(
        answered.attribute("server.address"),
        Some(&Value::Static("10.0.0.2:8000"))
    );
    assert_eq!(
        answered.attribute("flexinfer.attempt"),
        Some(&Value::Int(2))
    );
    assert_eq!(server.attribute("flexinfer.retries"), Some(&Value::Int(1)));
    assert_eq!(server.attribute("flexinfer.attempts"), Some(&Value::Int(2)));
    assert_eq!(
        server.attribute("url.path"),
        Some(&Value::Static("/v1/chat/completions"))
    );
    assert_eq!(server.name, "POST");
    for s in &spans {
        assert!(
            s.start_unix_nano > 0 && s.start_unix_nano <= s.end_unix_nano,
            "{s:?}"
        );
    }
    assert!(server.start_unix_nano <= failed.start_unix_nano);
    assert!(answered.end_unix_nano <= server.end_unix_nano);
}

#[test]
fn a_new_root_drops_an_orphan_tracestate() {
    let (t, rx) = tracer("always_on", None);
    let h = headers(&[("traceparent", "00-zz"), ("tracestate", "a=1")]);
    let mut trace = start(Some(&t), &h);
    let root = trace.trace_id().unwrap();
    assert_ne!(root, TraceId::INVALID);
    let mut out = h.clone();
    trace.attempt_started(pod("10.0.0.1:8000"), &mut out);
    assert!(out.get("tracestate").is_none());
    assert_eq!(
        propagation::parse(out[TRACEPARENT].as_bytes())
            .unwrap()
            .trace_id,
        root
    );
    trace.finish(Instant::now(), None, Vec::new());
    let spans: Vec<EndedSpan> = rx.take(usize::MAX);
    let server = spans.last().unwrap();
    assert_eq!(server.parent, SpanId::INVALID);
    assert_eq!(server.trace_state, None);
    assert!(!server.parent_is_remote);
    // The client went away: an error.
    assert_eq!(server.error.as_deref(), Some("the client went away"));
}

/// The OpenAI paths go into the span as static strings; any other path as the client sent it.
#[test]
fn url_path_is_the_request_path_known_or_not() {
    let (t, q) = tracer("always_on", None);
    let h = HeaderMap::new();
    for path in [
        "/v1/embeddings",
        "/model/llama/v1/chat/completions",
        "/v1/chat/completions/",
    ] {
        let mut trace = Trace::start(Some(&t), &h, &Method::POST, path, Instant::now());
        trace.finish(Instant::now(), Some(200), Vec::new());
        let span = q.take(16).pop().unwrap();
        let expected = if path == "/v1/embeddings" {
            Value::Static("/v1/embeddings")
        } else {
            Value::Owned(path.to_owned())
        };
        assert_eq!(span.attribute("url.path"), Some(&expected));
    }
}
