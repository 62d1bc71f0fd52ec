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

use super::Shared;
use crate::admission::AdmissionPermit;
use crate::load::userspace::InFlight;
use crate::router::{Attempt, Decision};
use crate::signals::Usage;
use crate::telemetry::Trace;

/// Status recorded when the client left before the proxy answered (as nginx logs it).
pub const CLIENT_CLOSED: u16 = 499;

pub struct RequestCtx {
    /// What the record phase reports to: metrics, the router's cache feedback.
    pub shared: Arc<Shared>,
    pub start: Instant,
    /// Boxed: the context travels inside the streamed response body, which is boxed per
    /// response, and with the decision inline that box passed 1 KiB, the size past which
    /// glibc's malloc leaves its per-thread cache for the slow path (sorting and merging free
    /// chunks) on every request.
    pub decision: Option<Box<Decision>>,
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
    /// The token counts the answer reported (`usage`), read as it streamed by.
    pub usage: Option<Usage>,
    /// The request's admission: its slot in the model's gate until the context ends.
    pub permit: Option<AdmissionPermit>,
    /// How long the request waited in its model's queue (zero when it had room at once).
    pub queue_wait: std::time::Duration,
    /// The request's trace (nothing when it is not sampled).
    pub trace: Trace,
}

impl RequestCtx {
    pub fn new(shared: Arc<Shared>, start: Instant) -> Self {
        Self {
            shared,
            start,
            decision: None,
            served: None,
            status: None,
            first_byte: None,
            end: None,
            in_flight: None,
            active: false,
            local: false,
            usage: None,
            permit: None,
            queue_wait: std::time::Duration::ZERO,
            trace: Trace::default(),
        }
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        super::record::record(self);
    }
}
