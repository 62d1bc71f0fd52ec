//! Phase 7, record: metrics and the spec's log lines, once per request, from its context.
//!
//! Every handle was resolved when the routing table was built, so this is a handful of
//! counter increments: no label is formatted and no series is looked up.

use std::time::Instant;

use super::context::{RequestCtx, CLIENT_CLOSED};
use crate::router::Attempt;

pub fn record(ctx: &mut RequestCtx) {
    super::request_span::end_request(ctx);
    if ctx.local {
        return;
    }
    let status = ctx.status.unwrap_or(CLIENT_CLOSED);
    let Some(d) = &ctx.decision else {
        ctx.shared.metrics.unknown_model_requests.inc(status);
        return;
    };
    let m = &d.model().metrics;
    let now = ctx.end.unwrap_or_else(Instant::now);
    m.requests.inc(status);
    if ctx.active {
        m.active.dec();
    }
    if ctx.served.is_some() {
        m.duration
            .observe(now.saturating_duration_since(ctx.start).as_secs_f64());
        if let Some(t) = ctx.first_byte {
            m.ttfb
                .observe(t.saturating_duration_since(ctx.start).as_secs_f64());
        }
    }
    let model = &*d.model().name;
    let strategy = d.strategy().as_str();
    let source = d.key_source();
    match m.decision(source, d.outcome()) {
        Some(c) => c.inc(),
        // The rules in `crate::rules` missed a case: count it anyway, and say so.
        None => {
            tracing::warn!(model = %model, strategy = %strategy, key_source = %source, outcome = d.outcome().as_str(), "decision outside the pre-resolved series");
            ctx.shared
                .metrics
                .spec
                .routing_decisions_total
                .with_label_values(&[model, strategy, source.as_str(), d.outcome().as_str()])
                .inc();
        }
    }
    match ctx.served {
        Some(Attempt::Pod(i)) => m.pod_hits[i].inc(),
        Some(Attempt::Service) => {
            if let Some(c) = &m.service_hits {
                c.inc();
            }
        }
        None => {}
    }
    if let Some(k) = d.key() {
        crate::lock::lock(&m.keys).observe(d.strategy(), k.source, k.hash, now);
    }
    if let Some(g) = d.group() {
        g.group.metrics.decision(g.outcome).inc();
        g.group.metrics.member_hits[g.member].inc();
    }
    record_balance(d);
    if let (Some(u), Some(permit)) = (&ctx.usage, ctx.permit.as_mut()) {
        // The tenant's budget pays what the answer used, not the estimate.
        permit.correct_tokens(u.prompt_tokens + u.completion_tokens);
    }
    if let (Some(u), Some(Attempt::Pod(i))) = (&ctx.usage, ctx.served) {
        // What the engine reported: prompt tokens by cache hit, and the index's closed loop.
        m.pod_signals[i].record_usage(u);
        ctx.shared.router.cache_feedback(d, i, u);
    }
    log_decision(d);
}

/// The spec's debug lines of a decision: ignored keys, then where it routed.
fn log_decision(d: &crate::router::Decision) {
    let model = &*d.model().name;
    let (strategy, source) = (d.strategy().as_str(), d.key_source());
    for ignored in d.ignored() {
        tracing::debug!(model = %model, source = %ignored.source, reason = ?ignored.reason, "ignoring malformed routing key");
    }
    match d.picked_pod() {
        Some(p) => {
            tracing::debug!(model = %model, strategy = %strategy, target = %p.label, key_source = %source, "routing to pod");
        }
        None => {
            tracing::debug!(model = %model, strategy = %strategy, key_source = %source, "routing fallback to service");
        }
    }
}

/// The hash-balance and cache-aware part of a decision: spill counters and their debug lines,
/// the matched depth.
fn record_balance(d: &crate::router::Decision) {
    let model = &*d.model().name;
    if let (Some(c), Some(depth)) = (&d.model().metrics.cache_aware, d.match_depth()) {
        c.observe(depth);
    }
    if let Some(s) = d.spill() {
        if let Some(c) = &d.model().metrics.spills {
            c.inc();
        }
        let target = d.picked_pod().map_or("-", |p| &*p.label);
        tracing::debug!(model = %model, strategy = %d.strategy(), preferred = %d.model().pods[s.preferred].label, target = %target, load = s.load, bound = s.bound, "routing spilled past a pod at the load bound");
    }
    if let Some((g, s)) = d.group().and_then(|g| Some((g, g.spill?))) {
        if let Some(c) = &g.group.metrics.spills {
            c.inc();
        }
        tracing::debug!(label = %g.group.label, mode = %g.mode, preferred = %g.group.members[s.preferred].name, member = %d.model().name, load = s.load, bound = s.bound, "label group spilled past a member at the load bound");
    }
}
