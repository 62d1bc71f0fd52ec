//! The request path, as named phases over one per-request context ([`context::RequestCtx`]):
//!
//! 1. resolve the model from the head ([`resolve`]): `X-Model-ID`, then `/model/<name>/`;
//! 2. read the body, only if routing needs it ([`read_body`]); the body's `model` or the only
//!    model complete phase 1;
//! 3. admit ([`queue`]): wait while the model's pods are all full (priority, tenant turns);
//!    then decide ([`crate::router`]): key, candidates, reservations;
//! 4. prepare the upstream request ([`prepare`]): the client's head moved, not copied;
//! 5. forward ([`forward`]): connect to the candidates in order, send on the first that answers;
//! 6. stream back ([`stream`]): frames pass through as they arrive;
//! 7. record ([`record`]): the trace's spans ([`request_span`]), metrics and the spec's log
//!    line, once, when the context ends.
//!
//! Routing problems never fail a request (a malformed key falls through, an empty ring goes to
//! the Service); only a request that names no model, an unknown model, an oversized body or an
//! unreachable upstream gets an OpenAI-shaped error.

pub mod admit;
pub mod context;
pub mod errors;
pub mod forward;
pub mod h1;
pub mod headers;
pub mod model_list;
pub mod prepare;
pub mod queue;
pub mod read_body;
pub mod record;
pub mod relayed;
pub mod request_body;
pub mod request_span;
pub mod resolve;
pub mod retry_budget;
pub mod retry_on;
pub mod server;
pub mod shared;
pub mod stream;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};

use crate::body::{BodyError, BodyFields};
use crate::keys::RequestParts;
use crate::metrics::handles::PrefillWait;
use crate::router::decision::PrefillInProgress;
use crate::router::other_prefill;
use crate::router::teaching::WaitEnd;
use crate::table::Route;
use crate::telemetry::Trace;
use context::RequestCtx;
use errors::ApiError;
use read_body::ClientBody;
pub use request_body::RequestBody;
use resolve::Resolved;
use server::Peer;
pub use shared::{RequestLimits, Shared};
use stream::ObservedBody;

/// What the proxy answers with: a streamed upstream body, or a small body of its own.
///
/// The streamed body is boxed because hyper keeps a slot the size of the response body for
/// each connection's life: unboxed (about 500 bytes, most of it the request's context) every
/// idle keep-alive connection would hold that much; boxed, only a response in progress does.
pub type ProxyBody = Either<Box<ObservedBody>, Full<Bytes>>;

/// A request's future. Not an `async fn`: one keeps each argument twice in its future (as
/// passed, and moved into the body), and this future is boxed per request. Here the head, the
/// body and the context are set up first and the future holds each once; the phases borrow the
/// head, and [`prepare::head`] turns it into the upstream head in place.
pub fn handle(
    shared: Arc<Shared>,
    req: Request<RequestBody>,
    peer: Arc<Peer>,
) -> impl std::future::Future<Output = Response<ProxyBody>> + Send {
    let start = Instant::now();
    let mut ctx = RequestCtx::new(Arc::clone(&shared), start);
    let (mut parts, body) = req.into_parts();
    ctx.trace = Trace::start(
        shared.tracer.as_ref(),
        &parts.headers,
        &parts.method,
        parts.uri.path(),
        start,
    );
    // Taken by the phase that reads or forwards it; still here if the request failed first.
    let mut body = Some(body);
    // The request's end, from the clock read that started it (none read again for it).
    let total = shared.limits.request_timeout;
    let end = (!total.is_zero()).then(|| tokio::time::Instant::from_std(start + total));
    async move {
        let answered = run(&shared, &mut parts, &mut body, peer, &mut ctx, end).await;
        if let (Err(_), Some(body)) = (&answered, body.take()) {
            // Let a client that sends its whole body before reading get the error (see linger).
            read_body::linger(body).await;
        }
        respond(&shared, answered, ctx, end)
    }
}

/// The pipeline, within the request timeout.
async fn run(
    shared: &Shared,
    parts: &mut http::request::Parts,
    body: &mut Option<RequestBody>,
    peer: Arc<Peer>,
    ctx: &mut RequestCtx,
    end: Option<tokio::time::Instant>,
) -> Result<Answer, ApiError> {
    let run = pipeline(shared, parts, body, peer, ctx);
    match end {
        None => run.await,
        Some(end) => tokio::time::timeout_at(end, run)
            .await
            .unwrap_or_else(|_| Err(ApiError::request_timeout(shared.limits.request_timeout))),
    }
}

/// The response to the client: the pod's, streamed, or the proxy's own. Not async (what it
/// waits for, a failed request's body, is waited for before): as a future it took its
/// arguments, the request's context among them, into a state of its own, a copy a request.
fn respond(
    shared: &Shared,
    answered: Result<Answer, ApiError>,
    mut ctx: RequestCtx,
    end: Option<tokio::time::Instant>,
) -> Response<ProxyBody> {
    match answered {
        Ok(Answer::Forwarded(f)) => {
            let deadlines = stream::Deadlines {
                idle: shared.limits.stream_idle_timeout,
                end,
                drain: Some(Arc::clone(&shared.drain_cut)),
            };
            let route_header = shared.router.knobs().route_header;
            stream::respond(f, ctx, deadlines, route_header).map(Either::Left)
        }
        Ok(Answer::Local(r)) => {
            ctx.local = true;
            r.map(Either::Right)
        }
        Err(error) => {
            ctx.status = Some(error.status.as_u16());
            error.into_response().map(Either::Right)
        }
    }
}

/// How a request was answered.
enum Answer {
    Forwarded(forward::Forwarded),
    /// An answer of the proxy's own (the model list).
    Local(Response<Full<Bytes>>),
}

async fn pipeline(
    shared: &Shared,
    parts: &mut http::request::Parts,
    body: &mut Option<RequestBody>,
    peer: Arc<Peer>,
    ctx: &mut RequestCtx,
) -> Result<Answer, ApiError> {
    // 0. What the head alone refuses.
    let relayed = body
        .as_mut()
        .map(RequestBody::take_relayed)
        .unwrap_or_default();
    admit::head(parts, &relayed, &shared.limits)?;
    let knobs = shared.router.knobs();
    let table = shared.table.load_full();

    // 1. The model named by the head.
    let named = resolve::named(&parts.headers, &parts.uri);
    let from_head = resolve::lookup(&table, named.model.as_deref())?;
    let uri = prepare::origin_uri(&parts.uri, named.forward_path);

    // 2. The body, if routing needs it.
    let need = from_head.as_ref().is_none_or(|r| {
        read_body::route_needs_body(r, &parts.headers, &knobs.limits, knobs.label_group_mode)
    });
    let limit = shared.limits.max_body_bytes;
    let body = body.take().expect("the body is taken once");
    let client_body = read_body::read(body, need, limit).await?;

    // 3. Resolution completed from the body, then the decision (the body view lives only as
    //    long as this block).
    let up_body = {
        let read = match &client_body {
            ClientBody::Read(b) => Some(b.clone()),
            ClientBody::Streamed(_) => None,
        };
        let view = BodyView::of(read.as_deref(), shared.limits.max_json_depth)?;
        let req = resolve::Request {
            method: &parts.method,
            path: uri.path(),
            fields: view.fields.as_ref(),
            unreadable: view.unreadable,
        };
        let route = match resolve::complete(&table, from_head, &req)? {
            Resolved::Route(r) => r,
            Resolved::Local(answer) => return Ok(Answer::Local(answer)),
        };
        let mut permit = queue::admit(shared, &route, &parts.headers, read.as_deref()).await?;
        ctx.queue_wait = permit.waited();
        // Boxed where it is made: moved by value out of this block and then boxed, the
        // decision was copied twice more per request (about 280 instructions).
        let decision = ctx.decision.insert(Box::new(decide(
            shared,
            &route,
            &parts.headers,
            view.fields.as_ref(),
            ctx.start,
        )));
        let served = decision.model().spec.served_model_name.as_deref();
        let up_body = prepare::body(client_body, view.fields.as_ref(), served, limit);
        // The decision's reservation or pending pick (a model with a maxConcurrency always
        // holds one until its request starts upstream) now counts in the load the room rule
        // reads.
        permit.started();
        ctx.permit = Some(permit);
        up_body
    };
    wait_for_prefill(shared, knobs.cache_aware_prefill_wait, ctx).await;

    // 4. The upstream request's head.
    let added = prepare::head(parts, relayed, uri, &peer.ip_header, up_body.read_len());

    // 5. Forward.
    let forwarded = forward::forward(shared, ctx, parts, added, up_body).await?;
    Ok(Answer::Forwarded(forwarded))
}

/// A cache-aware request whose prompt another request is still prefilling on its pod waits,
/// at most `limit`, for that prefill to end (see `crate::router::teaching` for this proxy's
/// requests, `crate::router::other_prefill` for another proxy's).
async fn wait_for_prefill(shared: &Shared, limit: std::time::Duration, ctx: &mut RequestCtx) {
    let Some(d) = ctx.decision.as_mut() else {
        return;
    };
    let Some(prefill) = d.prefill_in_progress() else {
        return;
    };
    let started = Instant::now();
    let (outcome, turn) = match prefill {
        PrefillInProgress::Here(prefill) => {
            match tokio::time::timeout(limit, prefill.done()).await {
                Ok(WaitEnd::Reusable(turn)) => (PrefillWait::Prefilled, turn),
                Ok(WaitEnd::Recompute) => (PrefillWait::Recompute, None),
                Err(_) => (PrefillWait::Timeout, None),
            }
        }
        PrefillInProgress::Elsewhere(slot) => {
            let views = shared.router.signals().prompts();
            let chain = d.prompt().expect("a cache-aware decision has its chain");
            (other_prefill::wait(views, slot, chain, limit).await, None)
        }
    };
    d.waited_for_prefill(started.elapsed(), turn);
    if let Some(m) = &d.model().metrics.cache_aware {
        m.prefill_waits[outcome as usize].inc();
    }
}

/// The body as routing reads it: its fields when it is a JSON object.
struct BodyView<'a> {
    fields: Option<BodyFields<'a>>,
    /// A body is there, but it is not a JSON object.
    unreadable: bool,
}

impl<'a> BodyView<'a> {
    /// The view of a read body (`None`: not read); too deep a body is refused (400).
    fn of(bytes: Option<&'a [u8]>, max_depth: u32) -> Result<Self, ApiError> {
        let parsed = bytes.map(|b| BodyFields::parse_with_depth(b, max_depth));
        let unreadable = matches!(parsed, Some(Err(BodyError::NotObject)))
            && bytes.is_some_and(|b| !b.trim_ascii().is_empty());
        let fields = match parsed {
            Some(Ok(f)) => Some(f),
            Some(Err(BodyError::TooDeep)) => return Err(ApiError::json_too_deep(max_depth)),
            Some(Err(BodyError::NotObject)) | None => None,
        };
        Ok(Self { fields, unreadable })
    }
}

/// The router's decision for `route`, with the name the request asked for (a model or a
/// label) as the routed model identity.
fn decide(
    shared: &Shared,
    route: &Route,
    headers: &http::HeaderMap,
    fields: Option<&BodyFields<'_>>,
    at: Instant,
) -> crate::router::Decision {
    let requested = match route {
        Route::Model(m) => Arc::clone(&m.name),
        Route::Group(g) => Arc::clone(&g.label),
    };
    let request = RequestParts {
        headers,
        body: fields,
        model: Some(&requested),
    };
    shared.router.decide(route, &request, rand::random(), at)
}
