//! The request path: resolve the model, read the body (bounded), decide, forward, stream back.
//!
//! One direction, no back and forth: every step takes what the previous produced. Routing
//! problems never fail a request (a malformed key falls through, an empty ring goes to the
//! Service); only a request that names no model, an unknown model, an oversized body or an
//! unreachable upstream gets an OpenAI-shaped error.

pub mod errors;
pub mod headers;
pub mod observed;
pub mod resolve;
pub mod server;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{rewrite_model, BodyFields};
use crate::decide::{self, Context, Decision, GroupOutcome, LabelGroupMode, Target};
use crate::discovery::Strategy;
use crate::keys::RequestParts;
use crate::state::Shared;
use crate::table::Route;
use errors::ApiError;
use observed::{ObservedBody, Watch};
use resolve::{header_model, split_model_path};
use upstream::SendError;

/// What the proxy answers with: a streamed upstream body, or a small body of its own.
pub type ProxyBody = Either<ObservedBody, Full<Bytes>>;

/// Label used for requests that never resolved to a configured model (keeps client-chosen
/// names out of metric labels).
const UNKNOWN_MODEL: &str = "unknown";

pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let start = Instant::now();
    match route_request(&shared, req, peer, start).await {
        Ok(resp) => resp,
        Err(Failure { model, error }) => {
            shared
                .metrics
                .requests_total
                .with_label_values(&[&model, error.status.as_str()])
                .inc();
            error.into_response().map(Either::Right)
        }
    }
}

struct Failure {
    model: String,
    error: ApiError,
}

impl Failure {
    fn unknown(error: ApiError) -> Self {
        Self {
            model: UNKNOWN_MODEL.into(),
            error,
        }
    }
}

async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(e) => Err(ApiError::bad_body(e)),
    }
}

async fn route_request(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    peer: SocketAddr,
    start: Instant,
) -> Result<Response<ProxyBody>, Failure> {
    let (mut parts, body) = req.into_parts();
    let declared_len = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|n| n > shared.limits.max_body_bytes as u64) {
        return Err(Failure::unknown(ApiError::body_too_large(
            shared.limits.max_body_bytes,
        )));
    }

    // Model from the header or the path prefix; the prefix is stripped either way.
    let mut named = header_model(&parts.headers);
    let path = parts.uri.path().to_owned();
    let forward_path = match split_model_path(&path) {
        Some((name, rest)) => {
            named = named.or(Some(name));
            rest.to_owned()
        }
        None => path.clone(),
    };
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("{forward_path}?{q}"),
        None => forward_path,
    };

    let bytes = read_body(body, shared.limits.max_body_bytes)
        .await
        .map_err(Failure::unknown)?;
    let fields = BodyFields::parse(&bytes);
    let table = shared.table.load_full();

    let route = match named.or_else(|| fields.as_ref().and_then(BodyFields::model)) {
        Some(name) => table
            .lookup(&name)
            .ok_or_else(|| Failure::unknown(ApiError::model_not_found(&name)))?,
        None => match table.only_model() {
            Some(r) => r,
            None if parts.method == Method::GET && path_and_query.starts_with("/v1/models") => {
                return Ok(model_list(&table));
            }
            None => return Err(Failure::unknown(ApiError::model_required())),
        },
    };

    let requested = match &route {
        Route::Model(m) => m.name.to_string(),
        Route::Group(g) => g.label.to_string(),
    };
    let cx = Context {
        parts: RequestParts {
            headers: &parts.headers,
            body: fields.as_ref(),
            model: Some(&requested),
        },
        limits: &shared.knobs.limits,
        gauge: shared.pick_gauge.as_ref(),
        pod_ledger: &shared.pod_ledger,
        group_ledger: &shared.group_ledger,
        group_mode: shared.knobs.label_group_mode,
        max_pod_attempts: shared.limits.max_pod_attempts,
        now: Instant::now(),
        draw: rand::random(),
    };
    let decision = decide::decide(&route, &cx);
    record_decision(shared, &decision);

    // Rewrite the body's model for the backend when the model says so.
    let body_bytes = match (&decision.model.spec.served_model_name, &fields) {
        (Some(served), Some(f)) => rewrite_model(&bytes, f, served)
            .map(Bytes::from)
            .unwrap_or_else(|| bytes.clone()),
        _ => bytes.clone(),
    };

    let original_host = parts.headers.get(header::HOST).cloned();
    headers::strip_hop_by_hop(&mut parts.headers);
    headers::add_forwarding(&mut parts.headers, peer.ip(), original_host);
    parts.headers.remove(header::HOST);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body_bytes.len()));
    if body_bytes.is_empty()
        && matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
        )
    {
        parts.headers.remove(header::CONTENT_LENGTH);
    }

    forward(
        shared,
        &decision,
        &parts,
        &path_and_query,
        body_bytes,
        start,
    )
    .await
}

/// Try the decision's targets in order; only a failed connect moves on to the next one.
async fn forward(
    shared: &Arc<Shared>,
    d: &Decision,
    parts: &http::request::Parts,
    path_and_query: &str,
    body: Bytes,
    start: Instant,
) -> Result<Response<ProxyBody>, Failure> {
    let model = d.model.name.to_string();
    if d.targets.is_empty() {
        return Err(Failure {
            model: model.clone(),
            error: ApiError::no_upstream(&model),
        });
    }
    if let Some(g) = &d.group {
        if g.mode == LabelGroupMode::LeastLoaded && g.outcome != GroupOutcome::ColdStart {
            shared.group_ledger.consume(&d.model.name, Instant::now());
        }
    }
    let mut last_error = String::new();
    for target in &d.targets {
        let uri = match target_uri(target, path_and_query) {
            Ok(u) => u,
            Err(e) => {
                last_error = e;
                continue;
            }
        };
        let mut req = Request::new(Full::new(body.clone()));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = parts.headers.clone();

        // The real connection begins: it replaces this pick's reservation, and counts in flight.
        let inflight = match target {
            Target::Pod(p) => {
                // Unless the connect hook does it when the kernel starts counting.
                if d.strategy == Strategy::LeastLoaded && !shared.upstream.hooked() {
                    shared.pod_ledger.consume(&p.addr, Instant::now());
                }
                p.slot.map(|s| shared.inflight.enter(s))
            }
            Target::Service(_) => None,
        };
        let active = shared
            .metrics
            .active_connections
            .with_label_values(&[&model]);
        active.inc();
        match shared.upstream.send(req).await {
            Ok(resp) => {
                record_hit(shared, d, target);
                let (mut rparts, rbody) = resp.into_parts();
                headers::strip_hop_by_hop(&mut rparts.headers);
                shared
                    .metrics
                    .requests_total
                    .with_label_values(&[&model, rparts.status.as_str()])
                    .inc();
                let watch = Watch {
                    start,
                    ttfb: shared
                        .metrics
                        .time_to_first_byte_seconds
                        .with_label_values(&[&model]),
                    duration: shared
                        .metrics
                        .request_duration_seconds
                        .with_label_values(&[&model]),
                    active,
                    inflight,
                    first_seen: false,
                };
                return Ok(Response::from_parts(
                    rparts,
                    Either::Left(ObservedBody::new(rbody, watch)),
                ));
            }
            Err(SendError::Connect(e)) => {
                active.dec();
                shared
                    .metrics
                    .upstream_connect_errors_total
                    .with_label_values(&[&model, target.label()])
                    .inc();
                tracing::warn!(model = %model, target = %target, error = %e, "upstream connect failed; trying the next target");
                last_error = e;
            }
            Err(SendError::Failed(e)) => {
                active.dec();
                tracing::warn!(model = %model, target = %target, error = %e, "upstream request failed");
                return Err(Failure {
                    model: model.clone(),
                    error: ApiError::upstream_failed(&model, e),
                });
            }
        }
    }
    Err(Failure {
        model: model.clone(),
        error: ApiError::upstream_unreachable(&model, last_error),
    })
}

fn target_uri(target: &Target, path_and_query: &str) -> Result<Uri, String> {
    let s = match target {
        Target::Pod(p) => format!("http://{}{}", p.addr, path_and_query),
        Target::Service(url) => format!("{}{}", url.trim_end_matches('/'), path_and_query),
    };
    s.parse::<Uri>()
        .map_err(|e| format!("bad upstream URI {s:?}: {e}"))
}

/// Metrics and the spec's debug lines for a decision.
fn record_decision(shared: &Shared, d: &Decision) {
    let m = &shared.metrics;
    let model = &*d.model.name;
    let strategy = d.strategy.as_str();
    let key_source = d.key_source.as_str();
    for ignored in &d.ignored {
        tracing::debug!(model = %model, source = %ignored.source, reason = ?ignored.reason, "ignoring malformed routing key");
    }
    m.routing_decisions_total
        .with_label_values(&[model, strategy, key_source, d.outcome.as_str()])
        .inc();
    if let Some(hash) = d.key_hash {
        m.keys.observe(
            &d.model.name,
            d.strategy,
            d.key_source,
            hash,
            Instant::now(),
        );
    }
    if d.strategy == Strategy::LeastLoaded
        && shared.pod_ledger.enabled()
        && d.outcome == decide::Outcome::Pod
    {
        m.least_loaded_reservations_total
            .with_label_values(&[model])
            .inc();
    }
    if let Some(g) = &d.group {
        m.label_group_route_decisions_total
            .with_label_values(&[&g.label, g.mode.as_str(), g.outcome.as_str()])
            .inc();
        m.label_group_route_target_hits_total
            .with_label_values(&[&g.label, g.mode.as_str(), model])
            .inc();
        if g.mode == LabelGroupMode::LeastLoaded
            && g.outcome != GroupOutcome::ColdStart
            && shared.group_ledger.enabled()
        {
            m.least_loaded_reservations_total
                .with_label_values(&[model])
                .inc();
        }
    }
    match d.targets.first() {
        Some(Target::Pod(p)) => {
            tracing::debug!(model = %model, strategy = %strategy, target = %p.label, key_source = %key_source, "routing to pod");
        }
        _ => {
            tracing::debug!(model = %model, strategy = %strategy, key_source = %key_source, "routing fallback to service");
        }
    }
}

/// The target that actually served (after any connect retries).
fn record_hit(shared: &Shared, d: &Decision, target: &Target) {
    shared
        .metrics
        .routing_target_hits_total
        .with_label_values(&[&d.model.name, d.strategy.as_str(), target.label()])
        .inc();
}

/// `GET /v1/models` that names no model: every configured model and label.
fn model_list(table: &crate::table::RoutingTable) -> Response<ProxyBody> {
    let mut ids: Vec<String> = table.models().map(|m| m.name.to_string()).collect();
    ids.extend(table.groups().map(|g| g.label.to_string()));
    ids.sort();
    ids.dedup();
    let data: Vec<_> = ids
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "flexinfer"}))
        .collect();
    let body = json!({"object": "list", "data": data}).to_string();
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
