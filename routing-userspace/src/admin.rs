//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process is serving),
//! `/readyz` (discovery has synced at least once) and `/debug/routing` (the live table, key
//! tracking and each model's hottest keys as JSON; key hashes only, never key text).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

use crate::load::LoadGauge;
use crate::proxy::{RequestBody, Shared};
use crate::table::{LabelGroup, ModelRoute, Pod};

pub async fn handle(shared: Arc<Shared>, req: Request<RequestBody>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/metrics" => {
            refresh_engine_gauges(&shared);
            refresh_fleet_gauges(&shared);
            let mut r = text(StatusCode::OK, &shared.metrics.render());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if shared.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" if shared.is_draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down: serving the requests in flight\n",
        ),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "discovery has not synced yet\n",
        ),
        "/debug/routing" => {
            let mut r = text(
                StatusCode::OK,
                &serde_json::to_string_pretty(&routing_view(&shared)).unwrap_or_default(),
            );
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The engine-signal gauges (report ages, running and waiting requests, KV-cache use) from the
/// signal store, for every pod of the current table: computed per scrape, not per request.
fn refresh_engine_gauges(shared: &Shared) {
    let table = shared.table.load();
    let pods = table.models().flat_map(|m| {
        m.pods
            .iter()
            .filter_map(move |p| Some((&*m.name, &*p.label, p.slot?)))
    });
    shared
        .metrics
        .engine
        .refresh(shared.router.signals(), pods, Instant::now());
}

/// The fleet size and the scrape interval it yields, as the scraper reads them now.
fn refresh_fleet_gauges(shared: &Shared) {
    let m = &shared.metrics;
    m.fleet_proxies.set(shared.fleet.proxies() as i64);
    let every = shared.fleet.scrape_interval();
    m.engine_scrape_interval
        .set(every.map_or(0.0, |d| d.as_secs_f64()));
}

/// The fleet size, where it comes from, and the scrape interval it yields (`null`: no
/// scraping).
fn fleet_view(shared: &Shared) -> Value {
    let f = &shared.fleet;
    json!({
        "proxies": f.proxies(),
        "rank": f.rank(),
        "source": f.source().as_str(),
        "alone": shared.router.routes_alone(),
        "engine_scrape_interval_seconds": f.scrape_interval().map(|d| d.as_secs_f64()),
    })
}

/// The live routing table, gauges and reservations.
pub fn routing_view(shared: &Shared) -> Value {
    let table = shared.table.load();
    let now = Instant::now();
    let models: Vec<Value> = table.models().map(|m| model_view(shared, m, now)).collect();
    let groups: Vec<Value> = table.groups().map(|g| group_view(shared, g, now)).collect();
    json!({
        "ready": shared.is_ready(),
        "draining": shared.is_draining(),
        "gauge": shared.router.gauge().name(),
        "upstream_keepalive": shared.upstream.keepalive(),
        "upstream_idle_connections": shared.upstream.idle_connections(),
        "reservations_pending": shared.router.pending_reservations(),
        "knobs": knobs_view(shared),
        "fleet": fleet_view(shared),
        "key_tracking": key_tracking_view(shared),
        "models": models,
        "label_groups": groups,
        "balance": balance_view(shared),
        "admission": shared.admission.view(),
    })
}

/// One model: its settings, its pods and what routing knows of its keys.
fn model_view(shared: &Shared, m: &ModelRoute, now: Instant) -> Value {
    let pods: Vec<Value> = m.pods.iter().map(|p| pod_view(shared, m, p, now)).collect();
    let cardinality: Vec<Value> = shared
        .metrics
        .keys
        .series_report(&m.name, now)
        .iter()
        .map(|r| {
            json!({
                "strategy": r.strategy.as_str(),
                "key_source": r.source.as_str(),
                "estimate": r.estimate,
                "exact_keys": r.exact_keys,
            })
        })
        .collect();
    json!({
        "name": &*m.name,
        "strategy": m.spec.routing.as_str(),
        "ready": m.spec.ready,
        "served_model_name": m.spec.served_model_name,
        "service_label": m.spec.service_label,
        "route_priority": m.spec.route_priority,
        "service": m.service.as_ref().map(|s| &*s.url),
        "ring_points": m.ring.points(),
        "pods": pods,
        "hot_keys": hot_keys(shared, m, now),
        "key_cardinality": cardinality,
    })
}

/// One pod: its load as picks read it, this process's share, reservations, health, and
/// whether it is full (admission holds requests while every pod of its model is).
fn pod_view(shared: &Shared, m: &ModelRoute, p: &Pod, now: Instant) -> Value {
    let ejected = shared.router.health().ejected(p.slot, now).map(|e| {
        json!({
            "for_seconds": e.for_ms as f64 / 1000.0,
            "reason": e.reason,
            "ejections_in_a_row": e.ejections,
        })
    });
    json!({
        "address": &*p.label,
        "slot": p.slot,
        "active": p.slot.map(|_| shared.router.pod_load(p, now)),
        "in_flight_here": p.slot.map(|s| shared.inflight.active(s)),
        "reservations": shared.router.pod_reservations(p, now),
        "ejected": ejected,
        "full": shared.router.is_full(m, p, now),
        "engine": p.slot.and_then(|s| shared.router.signals().snapshot(s, now)),
        "cache_feedback": p.slot.and_then(|s| shared.router.feedback().view(s)),
        "slot_prompts": p.slot.and_then(|s| shared.router.signals().prompts().any(s)).map(|v| v.summary(now)),
    })
}

/// One label group: its mode and members.
fn group_view(shared: &Shared, g: &LabelGroup, now: Instant) -> Value {
    let members: Vec<Value> = g
        .members
        .iter()
        .map(|m| {
            json!({
                "model": &*m.name,
                "ready": m.spec.ready,
                "route_priority": m.spec.route_priority,
                "reservations": shared.router.member_reservations(m, now),
            })
        })
        .collect();
    json!({
        "label": &*g.label,
        "mode": shared.router.knobs().label_group_mode.as_str(),
        "members": members,
    })
}

/// The spec's knobs as the router runs them.
fn knobs_view(shared: &Shared) -> Value {
    let k = shared.router.knobs();
    json!({
        "explicit_key_max_length": k.limits.explicit_key_max_length,
        "system_segment_max_length": k.limits.system_segment_max_length,
        "document_segment_max_length": k.limits.document_segment_max_length,
        "least_loaded_reservation_ttl_ms": k.reservation_ttl.as_millis() as u64,
        "label_group_mode": k.label_group_mode.as_str(),
        "max_pod_attempts": k.max_pod_attempts,
        "retry_on_status": shared.retry_on.to_string(),
    })
}

/// How routing keys are counted.
fn key_tracking_view(shared: &Shared) -> Value {
    let t = shared.metrics.keys.tracking();
    let secs = |d: Option<std::time::Duration>| d.map_or(0.0, |d| d.as_secs_f64());
    json!({
        "cardinality_cap": t.cardinality_cap,
        "cardinality_window_seconds": secs(t.cardinality_window),
        "hot_keys": t.hot_keys,
        "hot_keys_half_life_seconds": secs(t.hot_keys_half_life),
        "memory_bound_bytes": shared.metrics.keys.memory_bound(),
    })
}

/// Hash balance and the cache-aware index: the proxy's bound settings, each model's own, and
/// the index's budget, fill and entries per pod of every cache-aware model.
fn balance_view(shared: &Shared) -> Value {
    let router = &shared.router;
    let ix = router.index();
    let table = shared.table.load();
    let b = router.knobs().hash_balance;
    let models: Vec<Value> = table
        .models()
        .map(|m| {
            let own = router.balance_for(m);
            let pods: Option<Vec<Value>> = (m.spec.routing == crate::vocab::Strategy::CacheAware)
                .then(|| {
                    m.pods
                        .iter()
                        .map(|p| {
                            json!({
                                "address": &*p.label,
                                "index_entries": p.slot.map_or(0, |s| ix.entries_of(s)),
                            })
                        })
                        .collect()
                });
            json!({
                "name": &*m.name,
                "hash_balance_factor": own.factor(),
                "hash_balance_floor": own.floor,
                "cache_index_pods": pods,
            })
        })
        .collect();
    json!({
        "hash_balance_factor": b.factor(),
        "hash_balance_floor": b.floor,
        "cache_aware_balance_factor": f64::from(router.knobs().cache_aware_factor_milli) / 1000.0,
        "session_balance_factor": f64::from(router.knobs().session_factor_milli) / 1000.0,
        "route_header": router.knobs().route_header,
        "cache_index": {
            "budget_bytes": ix.budget_bytes(),
            "capacity_entries": ix.capacity(),
            "entries": ix.len(),
            "memory_bytes": ix.memory_bytes(),
        },
        "models": models,
    })
}

/// The model's hottest keys: hash (hex), share of its recent keyed decisions, and the pod the
/// key maps to on the current ring (`null` when the model has no pods).
fn hot_keys(shared: &Shared, m: &ModelRoute, now: Instant) -> Vec<Value> {
    let (top, total) = shared.metrics.keys.hot_keys(&m.name, now);
    top.iter()
        .map(|h| {
            let share = if total > 0.0 { h.count / total } else { 0.0 };
            json!({
                "key_hash": format!("{:016x}", h.hash),
                "key_source": h.source.as_str(),
                "share": (share * 10_000.0).round() / 10_000.0,
                "count": (h.count * 100.0).round() / 100.0,
                "max_overcount": (h.error * 100.0).round() / 100.0,
                "pod": m.ring.pick(h.hash).map(|i| &*m.pods[i].label),
            })
        })
        .collect()
}
