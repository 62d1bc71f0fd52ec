//! Phase 5, forward: try the decision's targets in order until one answers.
//!
//! Connecting comes before the request exists on the wire, so a target that cannot be reached
//! costs nothing but the attempt: the request moves on to the next candidate untouched. When a
//! connection is in hand the request starts there: it counts in flight on that pod and
//! replaces the reservations its decision made. A pooled connection its server closed just
//! then hands the request back, and it goes out once more on a fresh connection to the same
//! target. Before any byte reaches the client, a connection that breaks or a pod that answers
//! 502 or 503 sends the request on to the next candidate, as long as the body can be sent
//! again and the retry budget has room. A pod that does not answer within the first-byte
//! timeout gets a 504 (the request may be running there; it is not sent twice). Every attempt's
//! outcome feeds passive outlier ejection.

use std::time::{Duration, Instant};

use http::header::HOST;
use http::request::Parts;
use http::{Response, Uri};

use super::context::RequestCtx;
use super::errors::ApiError;
use crate::router::health::{Failure, Verdict};
use crate::router::{Attempt, Decision};
use crate::state::Shared;
use crate::upstream::{ConnectError, PoolKey, SendError, Sent, UpBody, UpstreamBody};
use crate::vocab::RetryReason;

/// The response of the target that served (its body reads the rest from the connection).
pub struct Forwarded {
    pub response: Response<UpstreamBody>,
}

/// What connecting to an attempt's target needs.
fn target_of(d: &Decision, a: Attempt, uri: &Uri) -> (PoolKey, http::HeaderValue, Uri) {
    match a {
        Attempt::Pod(i) => {
            let p = &d.model.pods[i];
            (PoolKey::Addr(p.addr), p.host.clone(), uri.clone())
        }
        Attempt::Service => {
            let s = d
                .model
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

/// The request starts on `a`: count it in flight there and consume the reservations it
/// replaces (a pod reservation only when `a` is the reserved pod).
fn start_on(shared: &Shared, ctx: &mut RequestCtx, a: Attempt) {
    let d = ctx.decision.as_mut().expect("decided");
    // The request is counted in flight first, then what stood for it is released, so a
    // concurrent pick never sees the pod without either.
    let slot = match a {
        Attempt::Pod(i) => d.model.pods[i].slot,
        Attempt::Service => None,
    };
    ctx.in_flight = slot.map(|s| shared.inflight.enter(s));
    // From here the gauge counts the request (or the Service has it): its pick is not pending.
    d.pending_pick = None;
    if let Some(r) = d.member_reservation.take() {
        r.consume();
    }
    if let Some(r) = d
        .pod_reservation
        .take_if(|r| slot.is_some_and(|s| r.key() == u64::from(s)))
    {
        r.consume();
    }
}

/// The attempt on `a` failed before the request started there: its pod reservation (if it was
/// the reserved pod) ends now rather than lingering as load on a pod that is not serving it.
fn abandon(d: &mut Decision, a: Attempt) {
    if let Attempt::Pod(i) = a {
        let slot = d.model.pods[i].slot;
        drop(
            d.pod_reservation
                .take_if(|r| slot.is_some_and(|s| r.key() == u64::from(s))),
        );
    }
}

/// Tell passive health how an attempt on a pod went (the Service is not tracked).
fn report(shared: &Shared, d: &Decision, a: Attempt, outcome: Result<(), Failure>) {
    let Attempt::Pod(i) = a else { return };
    let health = shared.router.health();
    let pod = &d.model.pods[i];
    match outcome {
        Ok(()) => health.success(pod.slot),
        Err(failure) => {
            let peers = d.model.pods.iter().map(|p| p.slot);
            match health.failure(pod.slot, failure, peers, Instant::now()) {
                Verdict::Ejected(cool) => {
                    d.model.metrics.pod_ejections[i].inc();
                    tracing::warn!(model = %d.model.name, target = %pod.label, ?failure, cool_down = ?cool, "ejecting pod from the candidates");
                }
                Verdict::Spared => {
                    tracing::warn!(model = %d.model.name, target = %pod.label, ?failure, "pod keeps failing, but the model has ejected its share of pods already");
                }
                Verdict::Kept => {}
            }
        }
    }
}

fn connect_failed(shared: &Shared, d: &mut Decision, a: Attempt, error: &ConnectError) -> String {
    let m = &d.model.metrics;
    match a {
        Attempt::Pod(i) => m.pod_connect_errors[i].inc(),
        Attempt::Service => {
            if let Some(c) = &m.service_connect_errors {
                c.inc();
            }
        }
    }
    tracing::warn!(model = %d.model.name, target = %d.target(a), error = %error, "upstream connect failed; trying the next target");
    let failure = match error {
        ConnectError::Timeout { .. } => Failure::ConnectTimeout,
        _ => Failure::Connect,
    };
    report(shared, d, a, Err(failure));
    abandon(d, a);
    error.to_string()
}

async fn send_within(
    timeout: Duration,
    conn: crate::upstream::Conn,
    head: &Parts,
    body: UpBody,
) -> Option<Result<Sent, SendError>> {
    if timeout.is_zero() {
        return Some(conn.send(head, body).await);
    }
    tokio::time::timeout(timeout, conn.send(head, body))
        .await
        .ok()
}

pub async fn forward(
    shared: &Shared,
    ctx: &mut RequestCtx,
    mut head: Parts,
    body: UpBody,
) -> Result<Forwarded, ApiError> {
    let d = ctx.decision.as_mut().expect("decided");
    let name = d.model.name.clone();
    if !d.has_targets() {
        return Err(ApiError::no_upstream(&name));
    }
    d.model.metrics.active.inc();
    ctx.active = true;
    let uri = std::mem::take(&mut head.uri);
    let upstream = &shared.upstream;
    let first_byte = shared.limits.first_byte_timeout;
    shared.retry_budget.request(ctx.start);
    let mut last_error = String::from("no target left to try");
    let mut body = Some(body);
    let mut attempt = d.next_attempt();
    loop {
        let d = ctx.decision.as_mut().expect("decided");
        let Some(a) = attempt else {
            return Err(ApiError::upstream_unreachable(&name, last_error));
        };
        let Some(this_body) = body.take() else {
            return Err(ApiError::upstream_failed(&name, last_error));
        };
        let (key, host, target_uri) = target_of(d, a, &uri);
        let mut conn = match upstream.acquire(&key).await {
            Ok(c) => c,
            Err(e) => {
                last_error = connect_failed(shared, d, a, &e);
                body = Some(this_body);
                attempt = d.next_attempt();
                continue;
            }
        };
        conn.mark_busy();
        start_on(shared, ctx, a);
        head.headers.insert(HOST, host);
        head.uri = target_uri;
        let mut sending = this_body;
        // A pooled connection its server had closed: once more on a fresh one (not a retry).
        let result = loop {
            let result = send_within(first_byte, conn, &head, sending).await;
            match result {
                Some(Err(SendError::Broken {
                    reused: true,
                    replay: Some(again),
                    reason,
                })) => {
                    tracing::debug!(model = %name, %reason, "pooled upstream connection was closed; resending on a new one");
                    let d = ctx.decision.as_mut().expect("decided");
                    match upstream.connect(&key).await {
                        Ok(fresh) => {
                            conn = fresh;
                            sending = again;
                        }
                        Err(e) => {
                            last_error = connect_failed(shared, d, a, &e);
                            break Err(Some(again));
                        }
                    }
                }
                other => break Ok(other),
            }
        };
        let d = ctx.decision.as_mut().expect("decided");
        let target = d.target(a).to_string();
        let (reason, replay) = match result {
            // The fresh connection could not be made: the next target, body untouched.
            Err(again) => {
                ctx.in_flight = None;
                body = again;
                attempt = d.next_attempt();
                continue;
            }
            Ok(None) => {
                report(shared, d, a, Err(Failure::FirstByteTimeout));
                tracing::warn!(model = %name, %target, timeout = ?first_byte, "no response head within the first-byte timeout");
                return Err(ApiError::upstream_timeout(&name, &target, first_byte));
            }
            Ok(Some(Ok(Sent { response, replay }))) => {
                let status = response.status().as_u16();
                report(
                    shared,
                    d,
                    a,
                    if status >= 500 {
                        Err(Failure::Status(status))
                    } else {
                        Ok(())
                    },
                );
                let reason = match status {
                    502 => Some(RetryReason::Status502),
                    503 => Some(RetryReason::Status503),
                    _ => None,
                };
                match (reason, replay) {
                    (Some(reason), Some(replay)) => {
                        // Sent on only if a target is left and the budget allows; else the
                        // pod's answer is the answer.
                        let next = d.next_attempt();
                        if next.is_none() || !shared.retry_budget.try_retry(Instant::now()) {
                            ctx.served = Some(a);
                            return Ok(Forwarded { response });
                        }
                        tracing::debug!(model = %name, %target, status, "retrying on the next target");
                        last_error = format!("{target} answered {status}");
                        d.model.metrics.retries[reason as usize].inc();
                        ctx.in_flight = None;
                        body = Some(replay);
                        attempt = next;
                        continue;
                    }
                    _ => {
                        ctx.served = Some(a);
                        return Ok(Forwarded { response });
                    }
                }
            }
            Ok(Some(Err(SendError::TooLarge(t)))) => return Err(ApiError::body_too_large(t.limit)),
            Ok(Some(Err(SendError::ClientBody(e)))) => return Err(ApiError::bad_body(e)),
            Ok(Some(Err(SendError::Head(e)))) => {
                report(shared, d, a, Err(Failure::Reset));
                tracing::warn!(model = %name, %target, error = %e, "upstream sent an invalid response");
                return Err(ApiError::upstream_failed(&name, e));
            }
            Ok(Some(Err(SendError::Broken { reason, replay, .. }))) => {
                report(shared, d, a, Err(Failure::Reset));
                tracing::warn!(model = %name, %target, error = %reason, "upstream connection broke before a response");
                last_error = format!("{target}: {reason}");
                (RetryReason::Reset, replay)
            }
        };
        // The connection broke before a response: send it on, if the body can go out again,
        // a target is left and the budget allows.
        let Some(replay) = replay else {
            return Err(ApiError::upstream_failed(&name, last_error));
        };
        let next = d.next_attempt();
        if next.is_none() || !shared.retry_budget.try_retry(Instant::now()) {
            return Err(ApiError::upstream_failed(&name, last_error));
        }
        d.model.metrics.retries[reason as usize].inc();
        ctx.in_flight = None;
        body = Some(replay);
        attempt = next;
    }
}
