//! The per-request context that flows through the phases.
//!
//! Each phase adds what it learned (the decision, the target that served, the status, the
//! first byte) and what it holds (the in-flight count, the active gauge). The context ends
//! exactly once: when the response body has been sent to its end, when an error response
//! was produced, or when the client went away (the future or the body is dropped). Its end
//! is the record phase ([`super::record`]), run from `Drop`, so no path can forget it or run
//! it twice.

use std::sync::Arc;
use std::time::Instant;

use crate::load::userspace::InFlight;
use crate::metrics::Metrics;
use crate::router::{Attempt, Decision};

/// Status recorded when the client left before the proxy answered (as nginx logs it).
pub const CLIENT_CLOSED: u16 = 499;

pub struct RequestCtx {
    pub metrics: Arc<Metrics>,
    pub start: Instant,
    pub decision: Option<Decision>,
    /// The attempt whose target answered.
    pub served: Option<Attempt>,
    /// The status sent to the client (`None` while there is none yet).
    pub status: Option<u16>,
    /// When the first response body byte was passed on.
    pub first_byte: Option<Instant>,
    /// When the response body ended, if it was timed already (a one-frame body ends when its
    /// first byte goes out).
    pub end: Option<Instant>,
    /// This request counted in flight on the pod it went to.
    pub in_flight: Option<InFlight>,
    /// Whether the model's active gauge counts this request.
    pub active: bool,
    /// A local answer (the model list) that is not a routed request.
    pub local: bool,
}

impl RequestCtx {
    pub fn new(metrics: Arc<Metrics>, start: Instant) -> Self {
        Self {
            metrics,
            start,
            decision: None,
            served: None,
            status: None,
            first_byte: None,
            end: None,
            in_flight: None,
            active: false,
            local: false,
        }
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        super::record::record(self);
    }
}
