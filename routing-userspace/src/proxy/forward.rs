//! Phase 5, forward: try the decision's targets in order until one answers.
//!
//! Connecting comes before the request exists on the wire, so a target that cannot be reached
//! costs nothing but the attempt: the request moves on to the next candidate untouched. When a
//! connection is in hand the request starts there: it counts in flight on that pod and
//! replaces the reservations its decision made. A pooled connection its server closed just
//! then hands the request back, and it goes out once more on a fresh connection to the same
//! target. Any other failure after the request was sent is a 502: it may have reached the pod.

use http::header::HOST;
use http::request::Parts;
use http::{Response, Uri};

use super::context::RequestCtx;
use super::errors::ApiError;
use crate::router::{Attempt, Decision};
use crate::state::Shared;
use crate::upstream::{PoolKey, SendError, UpBody, UpstreamBody};

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
    // From here the gauge counts the request (or the Service has it): its pick is not pending.
    d.pending_pick = None;
    if let Some(r) = d.member_reservation.take() {
        r.consume();
    }
    ctx.in_flight = None;
    if let Attempt::Pod(i) = a {
        let slot = d.model.pods[i].slot;
        if let Some(r) = d
            .pod_reservation
            .take_if(|r| slot.is_some_and(|s| r.key() == u64::from(s)))
        {
            r.consume();
        }
        ctx.in_flight = slot.map(|s| shared.inflight.enter(s));
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

fn connect_failed(d: &mut Decision, a: Attempt, error: &dyn std::fmt::Display) -> String {
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
    abandon(d, a);
    error.to_string()
}

pub async fn forward(
    shared: &Shared,
    ctx: &mut RequestCtx,
    mut head: Parts,
    mut body: UpBody,
) -> Result<Forwarded, ApiError> {
    let d = ctx.decision.as_mut().expect("decided");
    let name = d.model.name.clone();
    if !d.has_targets() {
        return Err(ApiError::no_upstream(&name));
    }
    d.model.metrics.active.inc();
    ctx.active = true;
    let uri = std::mem::take(&mut head.uri);
    let mut last_error = String::from("no target left to try");
    let upstream = &shared.upstream;
    loop {
        let d = ctx.decision.as_mut().expect("decided");
        let Some(attempt) = d.next_attempt() else {
            return Err(ApiError::upstream_unreachable(&name, last_error));
        };
        let (key, host, target_uri) = target_of(d, attempt, &uri);
        let mut conn = match upstream.acquire(&key).await {
            Ok(c) => c,
            Err(e) => {
                last_error = connect_failed(d, attempt, &e);
                continue;
            }
        };
        start_on(shared, ctx, attempt);
        head.headers.insert(HOST, host);
        head.uri = target_uri;
        loop {
            match conn.send(head, body).await {
                Ok(response) => {
                    ctx.served = Some(attempt);
                    return Ok(Forwarded { response });
                }
                // A pooled connection its server had closed: once more on a fresh one.
                Err(SendError::Stale {
                    request: Some(request),
                    reason,
                }) => {
                    tracing::debug!(model = %name, %reason, "pooled upstream connection was closed; resending on a new one");
                    (head, body) = *request;
                    let d = ctx.decision.as_mut().expect("decided");
                    match upstream.connect(&key).await {
                        Ok(fresh) => conn = fresh,
                        Err(e) => {
                            last_error = connect_failed(d, attempt, &e);
                            break;
                        }
                    }
                }
                Err(SendError::TooLarge(t)) => return Err(ApiError::body_too_large(t.limit)),
                Err(e) => {
                    let d = ctx.decision.as_ref().expect("decided");
                    let detail = crate::upstream::error_chain(&e);
                    tracing::warn!(model = %name, target = %d.target(attempt), error = %detail, "upstream request failed");
                    return Err(ApiError::upstream_failed(&name, detail));
                }
            }
        }
        // The fresh connection failed: the request moves to the next target, out of flight here.
        ctx.in_flight = None;
    }
}
