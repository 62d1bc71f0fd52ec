//! The request's server span, from its context: what routing decided and what came of it, in
//! the OpenTelemetry HTTP and GenAI attribute names where they exist (`flexinfer.*` for the
//! rest). The routing key itself never goes into a span, only where it came from.

use std::sync::Arc;
use std::time::Instant;

use crate::telemetry::Attribute;

use super::context::RequestCtx;

/// End the request's trace (nothing when it is not sampled). Runs first in record.
pub fn end_request(ctx: &mut RequestCtx) {
    if !ctx.trace.is_sampled() {
        return;
    }
    let end = ctx.end.unwrap_or_else(Instant::now);
    let attributes = attributes(ctx);
    ctx.trace.finish(end, ctx.status, attributes);
}

fn attributes(ctx: &RequestCtx) -> Vec<Attribute> {
    let mut a = Vec::with_capacity(18);
    if let Some(d) = &ctx.decision {
        let model = d.model();
        let requested = d.group().map_or(&model.name, |g| &g.group.label);
        a.push(Attribute::new(
            "gen_ai.request.model",
            Arc::clone(requested),
        ));
        a.push(Attribute::new("flexinfer.model", Arc::clone(&model.name)));
        if let Some(g) = d.group() {
            a.push(Attribute::new(
                "flexinfer.label_group",
                Arc::clone(&g.group.label),
            ));
        }
        a.push(Attribute::new("flexinfer.strategy", d.strategy().as_str()));
        a.push(Attribute::new(
            "flexinfer.key_source",
            d.key_source().as_str(),
        ));
        a.push(Attribute::new("flexinfer.outcome", d.outcome().as_str()));
        a.push(Attribute::new("flexinfer.spill", d.any_spill()));
        if let Some(w) = d.prefill_waited() {
            a.push(Attribute::new(
                "flexinfer.prefill_wait_seconds",
                w.as_secs_f64(),
            ));
        }
        if let Some(served) = ctx.served {
            a.push(Attribute::new(
                "flexinfer.pod",
                d.target(served).label_value(),
            ));
        }
    }
    a.push(Attribute::new(
        "flexinfer.retries",
        i64::from(ctx.trace.retries()),
    ));
    a.push(Attribute::new(
        "flexinfer.queue_wait_seconds",
        ctx.queue_wait.as_secs_f64(),
    ));
    if let Some(t) = ctx.first_byte {
        let ttft = t.saturating_duration_since(ctx.start).as_secs_f64();
        a.push(Attribute::new("flexinfer.ttft_seconds", ttft));
    }
    if let Some(u) = &ctx.usage {
        a.push(Attribute::new(
            "gen_ai.usage.input_tokens",
            u.prompt_tokens as i64,
        ));
        a.push(Attribute::new(
            "gen_ai.usage.output_tokens",
            u.completion_tokens as i64,
        ));
        if let Some(c) = u.cached_tokens {
            a.push(Attribute::new(
                "gen_ai.usage.cache_read.input_tokens",
                c as i64,
            ));
        }
    }
    a
}
