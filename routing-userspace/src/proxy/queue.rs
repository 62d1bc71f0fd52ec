//! Phase 3b, admission: a request for a model whose pods are all full waits in the model's
//! queue (higher `x-flexinfer-priority` first, tenants taking turns, each tenant's requests in
//! arrival order) until a pod has room, or is answered 429 (`queue_full`, `queue_timeout`,
//! `rate_limited`, with `Retry-After`). A client that leaves while queued leaves the queue at
//! once (the future is dropped). With room and nobody waiting this is a lock and a few atomic
//! operations (see `crate::admission`). The gates themselves are built with each routing table
//! (see [`super::Shared::apply`]).

use std::sync::Arc;

use http::HeaderMap;

use super::errors::ApiError;
use super::Shared;
use crate::admission::budget::estimate;
use crate::admission::{classify, AdmissionPermit, Room};
use crate::body::top_level_count;
use crate::router::Router;
use crate::table::{LabelGroup, ModelRoute, Route, RoutingTable};

/// Wait for room for `route`: the permit to go on, or the answer to give instead. `body` is the
/// request body the proxy read (for a token budget's estimate), if it read one.
pub async fn admit(
    shared: &Shared,
    route: &Route,
    headers: &HeaderMap,
    body: Option<&[u8]>,
) -> Result<AdmissionPermit, ApiError> {
    let name = route_name(route);
    let Some(gate) = shared.admission.get(name) else {
        // A table that has this route always has its gate: built before it was published.
        return Err(ApiError::model_not_found(name));
    };
    let classified = classify(headers, &shared.router.knobs().limits);
    classified.log_ignored(name);
    let tokens = match gate.has_budget() {
        true => tokens_of(body),
        false => 0,
    };
    gate.admit(&classified.class, tokens)
        .await
        .map_err(|rejection| rejection.api_error(name))
}

/// A request's token estimate: prompt characters / 4 (the body's length stands for the
/// prompt's characters) plus `max_tokens` (or `max_completion_tokens`).
fn tokens_of(body: Option<&[u8]>) -> u64 {
    let Some(body) = body else { return 0 };
    let max = top_level_count(body, &["max_completion_tokens", "max_tokens"]);
    estimate(body.len(), max)
}

/// The name a route's gate is kept under: the model's, or the label's for a label group.
fn route_name(route: &Route) -> &str {
    match route {
        Route::Model(m) => &m.name,
        Route::Group(g) => &g.label,
    }
}

/// Build (or update in place) the gate of every model and label group of `table`, with the
/// room rule of its pods as `router` reads them, and drop the gates of routes gone.
pub fn gates_for(shared: &Shared, router: &Arc<Router>, table: &RoutingTable) {
    for m in table.models() {
        let room = model_room(Arc::clone(router), Arc::clone(m));
        shared.admission.gate(&m.name, &m.spec.admission, room);
    }
    for g in table.groups() {
        let room = group_room(Arc::clone(router), Arc::clone(g));
        // A label group takes the proxy's queue settings; its members' limits are in the room.
        shared.admission.gate(&g.label, &Default::default(), room);
    }
    let answered = shared.admission.retain(|name| table.lookup(name).is_some());
    if answered > 0 {
        tracing::info!(
            answered,
            "requests waiting for a model that is gone were answered"
        );
    }
}

fn model_room(router: Arc<Router>, m: Arc<ModelRoute>) -> Arc<dyn Room> {
    Arc::new(move |admitted: crate::admission::Admitted| {
        router.has_room(&m, admitted.starting, std::time::Instant::now())
    })
}

fn group_room(router: Arc<Router>, g: Arc<LabelGroup>) -> Arc<dyn Room> {
    Arc::new(move |admitted: crate::admission::Admitted| {
        let now = std::time::Instant::now();
        let mut ready = g.members.iter().filter(|m| m.spec.ready).peekable();
        // Nobody Ready: the group cold-starts on one member, whose room the gate cannot know.
        ready.peek().is_none() || ready.any(|m| router.has_room(m, admitted.starting, now))
    })
}
