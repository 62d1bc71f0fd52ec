//! The request path, as named phases over one per-request context ([`context::RequestCtx`]):
//!
//! 1. resolve the model from the head ([`resolve`]): `X-Model-ID`, then `/model/<name>/`;
//! 2. read the body, only if routing needs it ([`read_body`]); the body's `model` or the only
//!    model complete phase 1;
//! 3. decide ([`crate::router`]): key, candidates, reservations;
//! 4. prepare the upstream request ([`prepare`]): the client's head moved, not copied;
//! 5. forward ([`forward`]): connect to the candidates in order, send on the first that answers;
//! 6. stream back ([`stream`]): frames pass through as they arrive;
//! 7. record ([`record`]): metrics and the spec's log line, once, when the context ends.
//!
//! Routing problems never fail a request (a malformed key falls through, an empty ring goes to
//! the Service); only a request that names no model, an unknown model, an oversized body or an
//! unreachable upstream gets an OpenAI-shaped error.

pub mod context;
pub mod errors;
pub mod forward;
pub mod headers;
pub mod prepare;
pub mod read_body;
pub mod record;
pub mod resolve;
pub mod retry_budget;
pub mod server;
pub mod shared;
pub mod stream;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{BodyError, BodyFields};
use crate::keys::RequestParts;
use crate::table::{Route, RoutingTable};
use context::RequestCtx;
use errors::ApiError;
use read_body::ClientBody;
use server::Peer;
pub use shared::{RequestLimits, Shared};
use stream::ObservedBody;

/// What the proxy answers with: a streamed upstream body, or a small body of its own.
pub type ProxyBody = Either<ObservedBody, Full<Bytes>>;

pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    peer: Arc<Peer>,
) -> Response<ProxyBody> {
    let start = Instant::now();
    let mut ctx = RequestCtx::new(Arc::clone(&shared.metrics), start);
    let total = shared.limits.request_timeout;
    let (parts, body) = req.into_parts();
    // Taken by the phase that reads or forwards it; still here if the request failed first.
    let mut body = Some(body);
    let answered = if total.is_zero() {
        pipeline(&shared, parts, &mut body, peer, &mut ctx).await
    } else {
        tokio::time::timeout(total, pipeline(&shared, parts, &mut body, peer, &mut ctx))
            .await
            .unwrap_or_else(|_| Err(ApiError::request_timeout(total)))
    };
    if let (Err(_), Some(body)) = (&answered, body.take()) {
        // Let a client that sends its whole body before reading get the error (see linger).
        read_body::linger(body).await;
    }
    match answered {
        Ok(Answer::Forwarded(f)) => {
            let deadlines = stream::Deadlines {
                idle: shared.limits.stream_idle_timeout,
                end: (!total.is_zero()).then(|| tokio::time::Instant::from_std(start + total)),
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
    parts: http::request::Parts,
    body: &mut Option<Incoming>,
    peer: Arc<Peer>,
    ctx: &mut RequestCtx,
) -> Result<Answer, ApiError> {
    // Not a forward proxy: no tunnels, no traces, no requests aimed at other hosts.
    if parts.method == Method::CONNECT || parts.method == Method::TRACE {
        return Err(ApiError::method_not_allowed(&parts.method));
    }
    if parts.version < http::Version::HTTP_2 && parts.uri.scheme().is_some() {
        return Err(ApiError::absolute_form());
    }
    let head_bytes = parts.uri.path_and_query().map_or(0, |p| p.as_str().len())
        + parts
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if head_bytes > shared.limits.max_header_bytes {
        return Err(ApiError::header_too_large(shared.limits.max_header_bytes));
    }
    let limit = shared.limits.max_body_bytes;
    let declared_len = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let knobs = shared.router.knobs();
    let table = shared.table.load_full();

    // 1. The model named by the head.
    let named = resolve::named(&parts.headers, &parts.uri);
    let route = match &named.model {
        Some(name) => Some(
            table
                .lookup(name)
                .ok_or_else(|| ApiError::model_not_found(name))?,
        ),
        None => None,
    };
    let uri = prepare::origin_uri(&parts.uri, named.forward_path);

    // 2. The body, if routing needs it.
    let need = route.as_ref().is_none_or(|r| {
        read_body::route_needs_body(r, &parts.headers, &knobs.limits, knobs.label_group_mode)
    });
    let body = body.take().expect("the body is taken once");
    let client_body = read_body::read(body, need, limit).await?;

    // 3. Decide (the body view lives only as long as this block).
    let (decision, up_body, read_len) = {
        let bytes = match &client_body {
            ClientBody::Read(b) => Some(b.clone()),
            ClientBody::Streamed(_) => None,
        };
        let depth = shared.limits.max_json_depth;
        let parsed = bytes
            .as_deref()
            .map(|b| BodyFields::parse_with_depth(b, depth));
        // A body that is there but is not a JSON object: no model can come from it.
        let unreadable = matches!(parsed, Some(Err(BodyError::NotObject)))
            && bytes.as_deref().is_some_and(|b| !b.trim_ascii().is_empty());
        let fields = match parsed {
            Some(Ok(f)) => Some(f),
            Some(Err(BodyError::TooDeep)) => return Err(ApiError::json_too_deep(depth)),
            Some(Err(BodyError::NotObject)) | None => None,
        };
        let route = match route {
            Some(r) => r,
            None => match fields.as_ref().and_then(|f| f.model()) {
                Some(name) => table
                    .lookup(&name)
                    .ok_or_else(|| ApiError::model_not_found(&name))?,
                None => match table.only_model() {
                    Some(r) => r,
                    None if matches!(parts.method, Method::GET | Method::HEAD) => {
                        match models_endpoint(&table, uri.path()) {
                            Some(answer) => return answer.map(Answer::Local),
                            None => return Err(ApiError::model_required()),
                        }
                    }
                    None if unreadable => return Err(ApiError::model_in_unreadable_body()),
                    None => return Err(ApiError::model_required()),
                },
            },
        };
        let requested = match &route {
            Route::Model(m) => Arc::clone(&m.name),
            Route::Group(g) => Arc::clone(&g.label),
        };
        let request = RequestParts {
            headers: &parts.headers,
            body: fields.as_ref(),
            model: Some(&requested),
        };
        let decision = shared
            .router
            .decide(&route, &request, rand::random(), ctx.start);
        let served = decision.model().spec.served_model_name.as_deref();
        let up_body = prepare::body(client_body, fields.as_ref(), served, limit);
        let read_len = match &up_body {
            crate::upstream::UpBody::Bytes(b) => Some(b.as_ref().map_or(0, Bytes::len)),
            crate::upstream::UpBody::Stream { .. } => None,
        };
        (decision, up_body, read_len)
    };
    ctx.decision = Some(decision);

    // 4. The upstream request's head.
    let head = prepare::head(parts, uri, &peer.ip_header, read_len);

    // 5. Forward.
    let forwarded = forward::forward(shared, ctx, head, up_body).await?;
    Ok(Answer::Forwarded(forwarded))
}

/// `GET /v1/models` and `GET /v1/models/<id>` that name no model: every configured model and
/// label, or the one asked for (404 if there is none); `None` for any other path.
fn models_endpoint(
    table: &RoutingTable,
    path: &str,
) -> Option<Result<Response<Full<Bytes>>, ApiError>> {
    let rest = path.strip_prefix("/v1/models")?;
    let mut ids: Vec<String> = table.models().map(|m| m.name.to_string()).collect();
    ids.extend(table.groups().map(|g| g.label.to_string()));
    ids.sort();
    ids.dedup();
    let object =
        |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "flexinfer"});
    let body = match rest {
        "" | "/" => {
            let data: Vec<_> = ids.iter().map(|id| object(id)).collect();
            json!({"object": "list", "data": data})
        }
        _ => {
            let id = rest.strip_prefix('/')?; // not `/v1/modelsfoo`
            match ids.iter().find(|i| *i == id) {
                Some(id) => object(id),
                None => return Some(Err(ApiError::model_not_found(id))),
            }
        }
    };
    Some(Ok(json_response(body)))
}

fn json_response(body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
