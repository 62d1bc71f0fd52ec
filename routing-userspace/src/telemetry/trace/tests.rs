use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue};
use http::Method;
use opentelemetry::trace::TraceId;

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, SpanFlags};

use super::*;
use crate::telemetry::export::SpanQueue;
use crate::telemetry::propagation;

/// The value of the span's attribute `key`.
fn attribute(s: &Span, key: &str) -> Option<Any> {
    let kv = s.attributes.iter().find(|kv| kv.key == key)?;
    kv.value.clone()?.value
}

fn text(s: &str) -> Option<Any> {
    Some(Any::StringValue(s.to_owned()))
}

fn remote_parent(s: &Span) -> bool {
    s.flags & SpanFlags::ContextIsRemoteMask as u32 != 0
}

/// The span's error message, if its status is an error.
fn error(s: &Span) -> Option<String> {
    let st = s.status.as_ref()?;
    (st.code == status::StatusCode::Error as i32).then(|| st.message.clone())
}

fn pod(addr: &'static str) -> impl FnOnce() -> HeldStr {
    move || HeldStr::Static(addr)
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
fn off_or_unsampled_sends_no_traceparent_of_its_own() {
    let h = headers(&[("traceparent", CLIENT), ("tracestate", "a=1")]);
    let mut off = start(None, &h);
    let (t0, _rx) = tracer("traceidratio", Some("0"));
    let mut unsampled = start(Some(&t0), &h);
    for trace in [&mut off, &mut unsampled] {
        assert!(!trace.is_sampled());
        assert_eq!(
            trace.keeps_tracestate(),
            None,
            "the client's headers go on untouched"
        );
        assert_eq!(trace.attempt_started(pod("10.0.0.1:8000")), None);
    }
}

#[test]
fn a_sampled_request_gives_the_pod_its_attempt_as_parent() {
    let (t, rx) = tracer("parentbased_always_on", None);
    let h = headers(&[("traceparent", CLIENT), ("tracestate", "a=1")]);
    let mut trace = start(Some(&t), &h);
    let client = propagation::parse(CLIENT.as_bytes()).unwrap();
    assert_eq!(trace.trace_id(), Some(client.trace_id));
    assert_eq!(
        trace.keeps_tracestate(),
        Some(true),
        "it came with its traceparent"
    );
    let first = trace.attempt_started(pod("10.0.0.1:8000")).unwrap();
    trace.attempt_ended(AttemptEnd::Failed {
        status: Some(503),
        error: "10.0.0.1:8000 answered 503",
    });
    trace.retried();
    let sent = trace.attempt_started(pod("10.0.0.2:8000")).unwrap();
    trace.attempt_ended(AttemptEnd::Answered(200));
    assert_ne!(first, sent, "each attempt is its own span");
    let sent = propagation::parse(&sent).unwrap();
    let retries = trace.retries();
    trace.finish(Instant::now(), Some(200), &|a: &mut Attributes<'_>| {
        a.set("flexinfer.retries", i64::from(retries));
        a.measured("flexinfer.ttft_seconds", 0.25);
    });
    assert!(!trace.is_sampled(), "finished once");
    let spans = rx.take(usize::MAX).decoded();
    assert_eq!(spans.len(), 3);
    let (failed, answered, server) = (&spans[0], &spans[1], &spans[2]);
    assert_eq!(server.kind, span::SpanKind::Server as i32);
    assert_eq!(server.parent_span_id, client.parent_id.to_bytes());
    assert!(remote_parent(server));
    assert_eq!(server.trace_state, "a=1");
    for a in [failed, answered] {
        assert_eq!(a.kind, span::SpanKind::Client as i32);
        assert_eq!(a.parent_span_id, server.span_id);
        assert_eq!(a.trace_id, client.trace_id.to_bytes());
        assert!(!remote_parent(a));
    }
    // The pod's parent is the attempt that reached it.
    assert_eq!(sent.parent_id.to_bytes(), answered.span_id.as_slice());
    assert_eq!(error(failed).as_deref(), Some("10.0.0.1:8000 answered 503"));
    assert_eq!(attribute(failed, "error.type"), text("upstream"));
    assert_eq!(
        attribute(failed, "http.response.status_code"),
        Some(Any::IntValue(503))
    );
    assert_eq!(error(answered), None);
    assert_eq!(attribute(answered, "server.address"), text("10.0.0.2:8000"));
    assert_eq!(
        attribute(answered, "flexinfer.attempt"),
        Some(Any::IntValue(2))
    );
    assert_eq!(
        attribute(server, "flexinfer.retries"),
        Some(Any::IntValue(1))
    );
    assert_eq!(
        attribute(server, "flexinfer.attempts"),
        Some(Any::IntValue(2))
    );
    assert_eq!(
        attribute(server, "flexinfer.ttft_seconds"),
        Some(Any::DoubleValue(0.25))
    );
    assert_eq!(attribute(server, "url.path"), text("/v1/chat/completions"));
    assert_eq!(server.name, "POST");
    for s in &spans {
        assert!(
            s.start_time_unix_nano > 0 && s.start_time_unix_nano <= s.end_time_unix_nano,
            "{s:?}"
        );
    }
    assert!(server.start_time_unix_nano <= failed.start_time_unix_nano);
    assert!(answered.end_time_unix_nano <= server.end_time_unix_nano);
}

#[test]
fn a_new_root_drops_an_orphan_tracestate() {
    let (t, rx) = tracer("always_on", None);
    let h = headers(&[("traceparent", "00-zz"), ("tracestate", "a=1")]);
    let mut trace = start(Some(&t), &h);
    let root = trace.trace_id().unwrap();
    assert_ne!(root, TraceId::INVALID);
    assert_eq!(trace.keeps_tracestate(), Some(false));
    let sent = trace.attempt_started(pod("10.0.0.1:8000")).unwrap();
    assert_eq!(propagation::parse(&sent).unwrap().trace_id, root);
    trace.finish(Instant::now(), None, &|_: &mut Attributes<'_>| {});
    let spans = rx.take(usize::MAX).decoded();
    let server = spans.last().unwrap();
    assert!(server.parent_span_id.is_empty());
    assert_eq!(server.trace_state, "");
    assert!(!remote_parent(server));
    // The client went away: an error.
    assert_eq!(error(server).as_deref(), Some("the client went away"));
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
        trace.finish(Instant::now(), Some(200), &|_: &mut Attributes<'_>| {});
        let span = q.take(16).decoded().pop().unwrap();
        assert_eq!(attribute(&span, "url.path"), text(path));
        let expected = if path == "/v1/embeddings" {
            HeldStr::Static("/v1/embeddings")
        } else {
            HeldStr::Owned(path.into())
        };
        assert_eq!(path_value(path), expected);
    }
}

/// Times before and after the thread's reading of the wall clock come out as far apart as
/// the monotonic clock says, and near the wall clock.
#[test]
fn span_times_follow_the_monotonic_clock_from_one_reading() {
    let now = Instant::now();
    let at = unix_nano_at(now);
    let wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(wall.abs_diff(at) < 100_000_000, "{wall} against {at}");
    let ms = Duration::from_millis;
    let later = unix_nano_at(now + ms(5));
    let earlier = unix_nano_at(now - ms(3));
    assert_eq!(later - at, 5_000_000);
    assert_eq!(at - earlier, 3_000_000);
    // past a second from the reading, the clock is read again, and still agrees
    let far = unix_nano_at(now + ms(1500));
    assert!(far.abs_diff(at + 1_500_000_000) < 100_000_000, "{far}");
}
