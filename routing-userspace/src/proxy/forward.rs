//! Phase 5, forward: try the decision's targets in order until one answers.
//!
//! One function makes one attempt (`attempt`) and says what happened: answered, moved on
//! (nothing reached the target), retry (something did, and it is worth sending elsewhere), or
//! fail. A short driver ([`forward`]) asks the decision for the next target and the retry
//! budget whether a retry may go, in the shape of tower's `retry::Policy`.
//!
//! Connecting comes before the request exists on the wire, so a target that cannot be reached
//! costs nothing but the attempt: the request moves on to the next candidate untouched. When a
//! connection is in hand the request starts there ([`Decision::start_on`]). A pooled
//! connection its server closed just then hands the request back, and it goes out once more on
//! a fresh connection to the same target. Before any byte reaches the client, a connection that
//! breaks or a pod that answers a status of `--retry-on-status` (500, 502, 503, 504) sends the
//! request on to the next candidate, as long as the body can be sent again and the retry
//! budget has room. A pod that does not answer
//! within the first-byte timeout gets a 504 (the request may be running there; it is not sent
//! twice). Every attempt's outcome feeds passive outlier ejection.

use std::time::{Duration, Instant};

use http::request::Parts;
use http::{Response, Uri};

use super::context::RequestCtx;
use super::errors::ApiError;
use super::headers::{AddedLines, Lines};
use super::Shared;
use crate::load::userspace::InFlight;
use crate::router::health::{Failure, Verdict};
use crate::router::{Attempt, Decision};
use crate::signals::{orca, Source};
use crate::telemetry::AttemptEnd;
use crate::upstream::h1::fields::Fields;
use crate::upstream::{Conn, ConnectError, PoolKey, SendError, Sent, UpBody, UpstreamBody};
use crate::vocab::RetryReason;

/// The response of the target that served (its body reads the rest from the connection).
pub struct Forwarded {
    pub response: Response<UpstreamBody>,
}

/// What one attempt came to.
enum Step {
    /// A target answered, and its answer is the answer.
    Answered(Forwarded),
    /// Nothing reached the target (it could not be connected to): the next one gets the body
    /// untouched, at no cost to the retry budget.
    Moved {
        body: UpBody,
        error: String,
    },
    /// The request reached the target and failed in a way another target may not: it may go
    /// to the next one, within the retry budget. `answer` is what the client gets if it may not
    /// (the retryable answer the pod sent); without one, the request fails.
    Retry {
        reason: RetryReason,
        replay: UpBody,
        error: String,
        answer: Option<Forwarded>,
    },
    Fail(ApiError),
}

impl Step {
    /// How the attempt's span ends.
    fn trace_end(&self) -> AttemptEnd<'_> {
        match self {
            Step::Answered(f) => AttemptEnd::Answered(f.response.status().as_u16()),
            Step::Moved { error, .. } => AttemptEnd::Failed {
                status: None,
                error,
            },
            Step::Retry { error, answer, .. } => AttemptEnd::Failed {
                status: answer.as_ref().map(|f| f.response.status().as_u16()),
                error,
            },
            Step::Fail(e) => AttemptEnd::Failed {
                status: None,
                error: &e.message,
            },
        }
    }
}

/// The request as every attempt sends it: the head (its URI set per target) and the lines
/// written after it (`Host` and a sampled attempt's `traceparent` set per target).
struct Outgoing<'h> {
    head: &'h mut Parts,
    /// What the encoder writes after the head's lines (`Host` per attempt).
    added: AddedLines,
    /// The origin-form URI the client asked for.
    uri: Uri,
}

pub async fn forward(
    shared: &Shared,
    ctx: &mut RequestCtx,
    head: &mut Parts,
    mut added: AddedLines,
    body: UpBody,
) -> Result<Forwarded, ApiError> {
    let RequestCtx {
        decision,
        in_flight,
        served,
        active,
        start,
        trace,
        ..
    } = ctx;
    let d = decision.as_mut().expect("forward runs after the decision");
    let name = d.model().name.clone();
    if !d.has_targets() {
        return Err(ApiError::no_upstream(&name));
    }
    d.model().metrics.active.inc();
    *active = true;
    shared.retry_budget.request(*start);
    if shared.engine_load_reports && d.model().spec.engine.reads_signals() {
        added.ask_load_report(&mut head.headers);
    }
    if let Some(keep_state) = trace.keeps_tracestate() {
        added.traced(&mut head.headers, keep_state);
    }
    let uri = std::mem::take(&mut head.uri);
    let mut out = Outgoing { head, added, uri };
    let mut body = body;
    let mut last_error = String::from("no target left to try");
    let mut next = d.next_attempt();
    while let Some(a) = next {
        let traceparent = trace.attempt_started(|| d.target(a).held_label());
        out.added.set_traceparent(traceparent);
        let step = attempt(shared, d, a, &mut out, body, in_flight).await;
        trace.attempt_ended(step.trace_end());
        match step {
            Step::Answered(f) => {
                *served = Some(a);
                return Ok(f);
            }
            Step::Fail(e) => return Err(e),
            Step::Moved { body: b, error } => {
                (body, last_error) = (b, error);
                next = d.next_attempt();
            }
            Step::Retry {
                reason,
                replay,
                error,
                answer,
            } => {
                next = d.next_attempt();
                if next.is_none() || !shared.retry_budget.try_retry(Instant::now()) {
                    // No target left, or no budget: the pod's answer is the answer, if any.
                    *served = answer.is_some().then_some(a);
                    return answer.ok_or_else(|| ApiError::upstream_failed(&name, error));
                }
                tracing::debug!(model = %name, %error, "retrying on the next target");
                d.model().metrics.retries[reason as usize].inc();
                trace.retried();
                *in_flight = None;
                (body, last_error) = (replay, error);
            }
        }
    }
    Err(ApiError::upstream_unreachable(&name, last_error))
}

/// One attempt on the target of `a`: connect, start the request there, send it, read the
/// response head; classify what happened.
async fn attempt(
    shared: &Shared,
    d: &mut Decision,
    a: Attempt,
    out: &mut Outgoing<'_>,
    body: UpBody,
    in_flight: &mut Option<InFlight>,
) -> Step {
    let (key, host, uri) = target_of(d, a, &out.uri);
    let conn = match shared.upstream.acquire(&key).await {
        Ok(c) => c,
        Err(e) => {
            let error = connect_failed(shared, d, a, &e);
            return Step::Moved { body, error };
        }
    };
    conn.mark_busy();
    *in_flight = d.start_on(a, &shared.inflight);
    out.head.uri = uri;
    let lines = out.added.lines(&host);
    let first_byte = shared.limits.first_byte_timeout;
    match send_resending(shared, &key, conn, out.head, &lines, body, first_byte).await {
        Err((e, body)) => {
            // The fresh connection for a resend could not be made: the next target, untouched.
            *in_flight = None;
            let error = connect_failed(shared, d, a, &e);
            Step::Moved { body, error }
        }
        Ok(None) => {
            report(shared, d, a, Err(Failure::FirstByteTimeout));
            let target = d.target(a).to_string();
            tracing::warn!(model = %d.model().name, %target, timeout = ?first_byte, "no response head within the first-byte timeout");
            Step::Fail(ApiError::upstream_timeout(
                &d.model().name,
                &target,
                first_byte,
            ))
        }
        Ok(Some(Ok(sent))) => answered(shared, d, a, sent),
        Ok(Some(Err(e))) => send_failed(shared, d, a, e),
    }
}

/// A response head arrived: it is the answer, unless its status is retryable
/// (`--retry-on-status`) and another target may do better with it.
fn answered(shared: &Shared, d: &Decision, a: Attempt, sent: Sent) -> Step {
    let Sent { response, replay } = sent;
    if let Attempt::Pod(i) = a {
        note_load_report(shared, d, i, response.body().fields());
    }
    let status = response.status().as_u16();
    let health = match status {
        500.. => Err(Failure::Status(status)),
        _ => Ok(()),
    };
    report(shared, d, a, health);
    let reason = shared
        .retry_on
        .contains(status)
        .then(|| RetryReason::of_status(status));
    let answer = Forwarded { response };
    match (reason, replay) {
        (Some(reason), Some(replay)) => Step::Retry {
            reason,
            replay,
            error: format!("{} answered {status}", d.target(a)),
            answer: Some(answer),
        },
        _ => Step::Answered(answer),
    }
}

/// The pod's in-band load report, if its answer carries one, goes to the signal store.
fn note_load_report(shared: &Shared, d: &Decision, i: usize, fields: &Fields) {
    let model = d.model();
    let Some(slot) = model.pods[i].slot else {
        return;
    };
    // The first `endpoint-load-metrics` field, if any.
    let Some(value) = fields.get(orca::RESPONSE_HEADER.as_str()) else {
        return;
    };
    let metrics = &model.metrics.pod_signals[i];
    match orca::parse(value) {
        Some(report) => {
            let signals = shared.router.signals();
            signals.report(slot, &report, Source::InBand, Instant::now());
            metrics.inband_reports.inc();
        }
        None => metrics.inband_rejected.inc(),
    }
}

/// Sending failed before a response head: a client-side problem fails the request, a broken
/// connection may be retried elsewhere (if the body can go out again).
fn send_failed(shared: &Shared, d: &Decision, a: Attempt, e: SendError) -> Step {
    let name = &d.model().name;
    let target = d.target(a).to_string();
    match e {
        SendError::TooLarge(t) => Step::Fail(ApiError::body_too_large(t.limit)),
        SendError::ClientBody(e) => Step::Fail(ApiError::bad_body(e)),
        SendError::Head(e) => {
            report(shared, d, a, Err(Failure::Reset));
            tracing::warn!(model = %name, %target, error = %e, "upstream sent an invalid response");
            Step::Fail(ApiError::upstream_failed(name, e))
        }
        SendError::Broken { reason, replay, .. } => {
            report(shared, d, a, Err(Failure::Reset));
            tracing::warn!(model = %name, %target, error = %reason, "upstream connection broke before a response");
            let error = format!("{target}: {reason}");
            match replay {
                Some(replay) => Step::Retry {
                    reason: RetryReason::Reset,
                    replay,
                    error,
                    answer: None,
                },
                None => Step::Fail(ApiError::upstream_failed(name, error)),
            }
        }
    }
}

/// Send on `conn`; a pooled connection its server had closed (a broken reused connection that
/// hands the body back) gets the request once more on a fresh connection (not a retry: nothing
/// reached the server). `None` when no head came within `first_byte`; `Err` when the fresh
/// connection could not be made (with the body, untouched).
async fn send_resending(
    shared: &Shared,
    key: &PoolKey,
    mut conn: Conn,
    head: &Parts,
    lines: &Lines<'_>,
    mut body: UpBody,
    first_byte: Duration,
) -> Result<Option<Result<Sent, SendError>>, (ConnectError, UpBody)> {
    loop {
        match send_within(first_byte, conn, head, lines, body).await {
            Some(Err(SendError::Broken {
                reused: true,
                replay: Some(again),
                reason,
            })) => {
                tracing::debug!(%key, %reason, "pooled upstream connection was closed; resending on a new one");
                match shared.upstream.connect(key).await {
                    Ok(fresh) => (conn, body) = (fresh, again),
                    Err(e) => return Err((e, again)),
                }
            }
            other => return Ok(other),
        }
    }
}

/// What connecting to an attempt's target needs.
fn target_of(d: &Decision, a: Attempt, uri: &Uri) -> (PoolKey, http::HeaderValue, Uri) {
    let model = d.model();
    match a {
        Attempt::Pod(i) => {
            let p = &model.pods[i];
            (PoolKey::Addr(p.addr), p.host.clone(), uri.clone())
        }
        Attempt::Service => {
            let s = model
                .service
                .as_ref()
                .expect("a Service attempt has a Service");
            let uri = match &s.base_path {
                None => uri.clone(),
                Some(base) => {
                    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
                    format!("{base}{pq}")
                        .parse()
                        .unwrap_or_else(|_| uri.clone())
                }
            };
            (PoolKey::Host(s.authority.clone()), s.host.clone(), uri)
        }
    }
}

/// Tell passive health how an attempt on a pod went (the Service is not tracked).
fn report(shared: &Shared, d: &Decision, a: Attempt, outcome: Result<(), Failure>) {
    let Attempt::Pod(i) = a else { return };
    let health = shared.router.health();
    let model = d.model();
    let pod = &model.pods[i];
    let failure = match outcome {
        Ok(()) => return health.success(pod.slot),
        Err(failure) => failure,
    };
    let peers = model.pods.iter().map(|p| p.slot);
    match health.failure(pod.slot, failure, peers, Instant::now()) {
        Verdict::Ejected(cool) => {
            model.metrics.pod_ejections[i].inc();
            tracing::warn!(model = %model.name, target = %pod.label, ?failure, cool_down = ?cool, "ejecting pod from the candidates");
        }
        Verdict::Spared => {
            tracing::warn!(model = %model.name, target = %pod.label, ?failure, "pod keeps failing, but the model has ejected its share of pods already");
        }
        Verdict::Kept => {}
    }
}

/// A connection could not be made: counted, reported to health, the attempt abandoned.
fn connect_failed(shared: &Shared, d: &mut Decision, a: Attempt, error: &ConnectError) -> String {
    let m = &d.model().metrics;
    match a {
        Attempt::Pod(i) => m.pod_connect_errors[i].inc(),
        Attempt::Service => {
            if let Some(c) = &m.service_connect_errors {
                c.inc();
            }
        }
    }
    tracing::warn!(model = %d.model().name, target = %d.target(a), error = %error, "upstream connect failed; trying the next target");
    let failure = match error {
        ConnectError::Timeout { .. } => Failure::ConnectTimeout,
        _ => Failure::Connect,
    };
    report(shared, d, a, Err(failure));
    d.abandon(a);
    error.to_string()
}

async fn send_within(
    timeout: Duration,
    conn: Conn,
    head: &Parts,
    lines: &Lines<'_>,
    body: UpBody,
) -> Option<Result<Sent, SendError>> {
    if timeout.is_zero() {
        return Some(conn.send(head, lines, body).await);
    }
    tokio::time::timeout(timeout, conn.send(head, lines, body))
        .await
        .ok()
}
