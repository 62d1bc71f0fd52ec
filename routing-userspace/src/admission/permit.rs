//! The right of one admitted request to be in flight. It ends when dropped, whoever holds it
//! (the response body, an error path), and the next waiting request may then be admitted; so
//! a request's slot cannot leak or be returned twice.

use std::sync::Arc;
use std::time::Duration;

use super::gate::{ModelGate, TokenCharge};

#[must_use = "dropping the permit ends the admitted request at once"]
#[derive(Debug)]
pub struct AdmissionPermit {
    gate: Arc<ModelGate>,
    tokens: Option<TokenCharge>,
    waited: Duration,
    /// Set by [`Self::started`].
    started: bool,
    /// Set when the request never reached its client: the drop lets nobody in (the
    /// dispatcher that made it goes on by itself).
    abandoned: bool,
}

impl AdmissionPermit {
    pub(super) fn new(gate: Arc<ModelGate>, tokens: Option<TokenCharge>, waited: Duration) -> Self {
        Self {
            gate,
            tokens,
            waited,
            started: false,
            abandoned: false,
        }
    }

    /// The request is counted by the load the room rule reads now (its reservation was made
    /// or it was sent upstream): it no longer counts in [`super::gate::Admitted::starting`].
    /// Once; later calls do nothing.
    pub fn started(&mut self) {
        if !self.started {
            self.started = true;
            self.gate.started();
        }
    }

    /// How long the request waited in the queue (zero on the fast path).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    pub fn model(&self) -> &str {
        self.gate.model()
    }

    /// The tokens charged to the tenant's budget at admission (None: the model has none, or
    /// it was corrected already).
    pub fn charged(&self) -> Option<u64> {
        self.tokens.as_ref().map(|t| t.charge.estimate)
    }

    /// The response's `usage` says the request used `actual` tokens (prompt plus completion):
    /// the tenant's bucket gets the difference to the estimate back, or pays it. Once; later
    /// calls do nothing. A permit dropped without it keeps the estimate charged.
    pub fn correct_tokens(&mut self, actual: u64) {
        if let Some(t) = self.tokens.take() {
            self.gate.correct(t, actual);
        }
    }

    /// Never handed to its request: give the tokens back and end without a dispatch.
    pub(super) fn abandon(mut self) {
        if let Some(t) = self.tokens.take() {
            self.gate.refund(t);
        }
        self.abandoned = true;
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        self.gate
            .release(self.tokens.take(), self.started, !self.abandoned);
    }
}
