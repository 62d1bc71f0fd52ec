//! The request's server span, from its context: what routing decided and what came of it, in
//! the OpenTelemetry HTTP and GenAI attribute names where they exist (`flexinfer.*` for the
//! rest). The routing key itself never goes into a span, only where it came from.

use std::time::Instant;

use crate::telemetry::span::AddAttributes;
use crate::telemetry::Attributes;

use super::context::RequestCtx;

/// End the request's trace (nothing when it is not sampled). Runs first in record.
pub fn end_request(ctx: &mut RequestCtx) {
    if !ctx.trace.is_sampled() {
        return;
    }
    let end = ctx.end.unwrap_or_else(Instant::now);
    let mut trace = std::mem::take(&mut ctx.trace);
    let retries = trace.retries();
    trace.finish(end, ctx.status, &RequestAttributes { ctx, retries });
}

/// The request span's own attributes, borrowed from its context.
struct RequestAttributes<'c> {
    ctx: &'c RequestCtx,
    retries: u32,
}

impl AddAttributes for RequestAttributes<'_> {
    fn add<'x>(&'x self, a: &mut Attributes<'x>) {
        attributes(a, self.ctx, self.retries);
    }
}

fn attributes<'x>(a: &mut Attributes<'x>, ctx: &'x RequestCtx, retries: u32) {
    if let Some(d) = &ctx.decision {
        let model = d.model();
        let requested = d.group().map_or(&model.name, |g| &g.group.label);
        a.set("gen_ai.request.model", requested);
        a.set("flexinfer.model", &model.name);
        if let Some(g) = d.group() {
            a.set("flexinfer.label_group", &g.group.label);
        }
        a.set("flexinfer.strategy", d.strategy().as_str());
        a.set("flexinfer.key_source", d.key_source().as_str());
        a.set("flexinfer.outcome", d.outcome().as_str());
        a.set("flexinfer.spill", d.any_spill());
        if let Some(w) = d.prefill_waited() {
            a.measured("flexinfer.prefill_wait_seconds", w.as_secs_f64());
        }
        if let Some(served) = ctx.served {
            a.set("flexinfer.pod", d.target(served).label_value());
        }
    }
    a.set("flexinfer.retries", i64::from(retries));
    a.measured("flexinfer.queue_wait_seconds", ctx.queue_wait.as_secs_f64());
    if let Some(t) = ctx.first_byte {
        let ttft = t.saturating_duration_since(ctx.start).as_secs_f64();
        a.measured("flexinfer.ttft_seconds", ttft);
    }
    if let Some(u) = &ctx.usage {
        a.measured("gen_ai.usage.input_tokens", u.prompt_tokens as i64);
        a.measured("gen_ai.usage.output_tokens", u.completion_tokens as i64);
        if let Some(c) = u.cached_tokens {
            a.measured("gen_ai.usage.cache_read.input_tokens", c as i64);
        }
    }
}
