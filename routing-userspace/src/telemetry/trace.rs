//! A request's trace: its server span and one client span per upstream attempt, carried in
//! the request context from `handle` to `record`.
//!
//! An unsampled request (or any request while tracing is off) holds `Trace(None)`: deciding
//! that reads one header and allocates nothing. A sampled one keeps its ids and times in one
//! box; each of its spans is an [`EndedSpan`], encoded for the export queue the moment it ends
//! (its attributes in lists on the stack, borrowing what the request holds). The SDK's tracer
//! is not used, so no context or span objects exist for requests nobody will see.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::HeaderMap;
use http::Method;
use opentelemetry::trace::{SpanId, TraceId, TraceState};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::export::SpanSink;
use super::propagation::{self, TraceParent, TRACESTATE};
use super::sampler::Sampler;
use super::span::{AddAttributes, Attributes, EndedSpan, HeldStr, SpanKind};

/// What starts traces: the sampler, and where ended spans go.
#[derive(Debug)]
pub struct Tracer {
    pub sampler: Sampler,
    sink: SpanSink,
}

impl Tracer {
    pub fn new(sampler: Sampler, sink: SpanSink) -> Self {
        Self { sampler, sink }
    }
}

/// The request's trace (`None`: not sampled).
#[derive(Debug, Default)]
pub struct Trace(Option<Box<Sampled>>);

#[derive(Debug)]
struct Sampled {
    tracer: Arc<Tracer>,
    trace_id: TraceId,
    span_id: SpanId,
    /// The client's span, when the request came with a valid `traceparent`.
    parent: Option<SpanId>,
    /// The client's `tracestate`, when it came with a valid `traceparent` and parses.
    trace_state: Option<Arc<str>>,
    start: Instant,
    /// `start` in Unix nanoseconds.
    start_unix_nano: u64,
    /// The span name and `http.request.method`.
    method: &'static str,
    /// `url.path`: one of the OpenAI paths as a static string (no copy, and its encoding is
    /// kept at export), any other path copied.
    path: HeldStr,
    retries: u32,
    attempts: u32,
    /// The attempt whose answer is streaming (it ends with the request).
    open: Option<OpenAttempt>,
}

#[derive(Debug)]
struct OpenAttempt {
    span_id: SpanId,
    start: Instant,
    target: HeldStr,
    number: u32,
    status: Option<u16>,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy)]
pub enum AttemptEnd<'a> {
    /// Its answer is the answer (the span stays open until the response ends).
    Answered(u16),
    /// It failed (`status`: the pod's answer, if it sent one); the request may go on.
    Failed { status: Option<u16>, error: &'a str },
}

impl Trace {
    /// Start the trace of a request that arrived at `start`, if it is sampled.
    pub fn start(
        tracer: Option<&Arc<Tracer>>,
        headers: &HeaderMap,
        method: &Method,
        path: &str,
        start: Instant,
    ) -> Self {
        let Some(tracer) = tracer.filter(|t| !t.sampler.never()) else {
            return Self(None);
        };
        let parent = TraceParent::of(headers);
        if parent.is_none() && !tracer.sampler.roots_may_sample() {
            return Self(None);
        }
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        if !tracer.sampler.should_sample(parent.as_ref(), trace_id) {
            return Self(None);
        }
        // tracestate goes on only with the traceparent it belongs to.
        let trace_state = parent.and_then(|_| incoming_state(headers));
        Self(Some(Box::new(Sampled {
            tracer: Arc::clone(tracer),
            trace_id,
            span_id: new_span_id(),
            parent: parent.map(|p| p.parent_id),
            trace_state,
            start,
            start_unix_nano: unix_nano_at(start),
            method: method_str(method),
            path: path_value(path),
            retries: 0,
            attempts: 0,
            open: None,
        })))
    }

    pub fn is_sampled(&self) -> bool {
        self.0.is_some()
    }

    /// The trace id, when sampled.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.0.as_ref().map(|s| s.trace_id)
    }

    /// Whether the pod may get the client's `tracestate`: only with the valid `traceparent`
    /// it came with. `None` when the request is not sampled: the client's trace headers then
    /// go on untouched.
    pub fn keeps_tracestate(&self) -> Option<bool> {
        self.0.as_ref().map(|s| s.parent.is_some())
    }

    /// An attempt on `target` begins: the pod's `traceparent` for it (this attempt's span as
    /// the parent), `None` when the request is not sampled. `target` names the pod
    /// (`server.address`); it runs only when the request is sampled.
    pub fn attempt_started(
        &mut self,
        target: impl FnOnce() -> HeldStr,
    ) -> Option<propagation::Encoded> {
        let s = self.0.as_deref_mut()?;
        s.attempts += 1;
        let span_id = new_span_id();
        let traceparent = propagation::format(s.trace_id, span_id, true);
        s.open = Some(OpenAttempt {
            span_id,
            start: Instant::now(),
            target: target(),
            number: s.attempts,
            status: None,
        });
        Some(traceparent)
    }

    /// The attempt begun last ended.
    pub fn attempt_ended(&mut self, end: AttemptEnd<'_>) {
        let Some(s) = self.0.as_deref_mut() else {
            return;
        };
        let Some(mut a) = s.open.take() else { return };
        match end {
            AttemptEnd::Answered(status) => {
                a.status = Some(status);
                s.open = Some(a);
            }
            AttemptEnd::Failed { status, error } => {
                a.status = status;
                s.end_attempt(a, Instant::now(), Some(error));
            }
        }
    }

    /// The request goes to another target after a failed attempt.
    pub fn retried(&mut self) {
        if let Some(s) = self.0.as_deref_mut() {
            s.retries += 1;
        }
    }

    /// Retries so far.
    pub fn retries(&self) -> u32 {
        self.0.as_ref().map_or(0, |s| s.retries)
    }

    /// End the request at `end` with `status` (`None`: the client left); `attributes` adds the
    /// request span's own. The open attempt ends with it; both spans go to export.
    pub fn finish(&mut self, end: Instant, status: Option<u16>, attributes: &impl AddAttributes) {
        let Some(mut s) = self.0.take() else { return };
        if let Some(a) = s.open.take() {
            s.end_attempt(a, end, None);
        }
        let answered;
        let error = match status {
            Some(c) if c >= 500 => {
                answered = format!("answered {c}");
                Some(answered.as_str())
            }
            None => Some("the client went away"),
            _ => None,
        };
        let mut list = Attributes::new();
        attributes.add(&mut list);
        list.set("http.request.method", s.method);
        list.set("url.path", s.path.value());
        list.set("flexinfer.attempts", i64::from(s.attempts));
        if let Some(code) = status {
            list.set("http.response.status_code", i64::from(code));
        }
        let span = s.span(
            s.span_id,
            s.parent.unwrap_or(SpanId::INVALID),
            SpanKind::Server,
            (s.start, end),
            &list,
            error,
        );
        s.tracer.sink.send(&span);
    }
}

impl Sampled {
    /// `t` in Unix nanoseconds (the request's wall-clock start plus monotonic time since).
    fn unix_nano(&self, t: Instant) -> u64 {
        self.start_unix_nano + nanos(t.saturating_duration_since(self.start))
    }

    /// Send the span of attempt `a`, ended at `end`.
    fn end_attempt(&self, a: OpenAttempt, end: Instant, error: Option<&str>) {
        let mut list = Attributes::new();
        list.set("server.address", a.target.value());
        list.set("flexinfer.attempt", i64::from(a.number));
        if let Some(code) = a.status {
            list.set("http.response.status_code", i64::from(code));
        }
        if error.is_some() {
            list.set("error.type", "upstream");
        }
        let span = self.span(
            a.span_id,
            self.span_id,
            SpanKind::Client,
            (a.start, end),
            &list,
            error,
        );
        self.tracer.sink.send(&span);
    }

    fn span<'a, 'v>(
        &'a self,
        span_id: SpanId,
        parent: SpanId,
        kind: SpanKind,
        (start, end): (Instant, Instant),
        attributes: &'a Attributes<'v>,
        error: Option<&'a str>,
    ) -> EndedSpan<'a, 'v> {
        EndedSpan {
            trace_id: self.trace_id,
            span_id,
            parent,
            parent_is_remote: kind == SpanKind::Server && self.parent.is_some(),
            trace_state: self.trace_state.as_deref(),
            kind,
            name: self.method,
            start_unix_nano: self.unix_nano(start),
            end_unix_nano: self.unix_nano(end.max(start)),
            error,
            attributes,
        }
    }
}

thread_local! {
    /// This thread's reading of the wall clock against the monotonic one, and when it was
    /// taken (read again after `WALL_CLOCK_READ_AGAIN`, as the wall clock may be stepped or
    /// slewed).
    static WALL_CLOCK: Cell<Option<(Instant, u64)>> = const { Cell::new(None) };
}

/// How long one reading of the wall clock serves a thread: a request's start in Unix time is
/// then one subtraction from it, not two clock reads.
const WALL_CLOCK_READ_AGAIN: Duration = Duration::from_secs(1);

/// `t` (now or a moment ago) in Unix nanoseconds.
fn unix_nano_at(t: Instant) -> u64 {
    WALL_CLOCK.with(|reading| {
        if let Some((at, unix)) = reading.get() {
            // `t` may come a little before the reading (a request that arrived before another
            // one's start took it).
            match t.checked_duration_since(at) {
                Some(after) if after < WALL_CLOCK_READ_AGAIN => return unix + nanos(after),
                None if at - t < WALL_CLOCK_READ_AGAIN => {
                    return unix.saturating_sub(nanos(at - t))
                }
                _ => {}
            }
        }
        let at = Instant::now();
        let unix = unix_nano(SystemTime::now());
        reading.set(Some((at, unix)));
        match t.checked_duration_since(at) {
            Some(after) => unix + nanos(after),
            None => unix.saturating_sub(nanos(at - t)),
        }
    })
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_nano(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, nanos)
}

/// The span name and `http.request.method`: the method, or `_OTHER` for a non-standard one.
fn method_str(m: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
        Method::CONNECT,
        Method::TRACE,
    ];
    const NAMES: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    match KNOWN.iter().position(|k| k == m) {
        Some(i) => NAMES[i],
        None => "_OTHER",
    }
}

/// `path` as an attribute value: the paths of the OpenAI API as static strings.
fn path_value(path: &str) -> HeldStr {
    match crate::vocab::API_PATHS.iter().find(|k| **k == path) {
        Some(known) => HeldStr::Static(known),
        None => HeldStr::Owned(path.into()),
    }
}

/// The client's `tracestate`, if it parses (one header; entries the W3C format allows), in
/// its header form.
fn incoming_state(headers: &HeaderMap) -> Option<Arc<str>> {
    let state: TraceState = headers.get(TRACESTATE)?.to_str().ok()?.parse().ok()?;
    let header = state.header();
    (!header.is_empty()).then(|| header.into())
}

thread_local! {
    /// Ids need to be unique, not unpredictable: a small generator per thread, seeded from the
    /// thread's cryptographic one (as the OpenTelemetry SDK's id generator does).
    static IDS: RefCell<SmallRng> = RefCell::new(SmallRng::from_rng(&mut rand::rng()));
}

fn new_trace_id() -> TraceId {
    TraceId::from(IDS.with_borrow_mut(|r| r.random::<u128>()).max(1))
}

fn new_span_id() -> SpanId {
    SpanId::from(IDS.with_borrow_mut(|r| r.random::<u64>()).max(1))
}

#[cfg(test)]
mod tests;
