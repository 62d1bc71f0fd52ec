//! The router: (table entry, request) -> [`Decision`].
//!
//! The router owns what a decision has consequences on: the load gauge it reads, the
//! reservation ledgers its least-loaded picks write, and the routing knobs. Choosing is a pure
//! function of the table entry, the request's key and the loads ([`crate::rules`] says which
//! rule applies, [`crate::balance`] orders the candidates); the only side effect is the
//! reservation a least-loaded pick records, which the decision then carries as a token. The
//! proxy never works out from strategy and outcome whether something was reserved.

pub mod decision;
pub mod group;
pub mod health;
pub mod reservation;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use crate::balance::least_loaded::rank;
use crate::balance::random::random;
use crate::balance::ring::WalkState;
use crate::balance::round_robin::round_robin;
use crate::config::RoutingKnobs;
use crate::keys::{self, RequestParts};
use crate::load::LoadGauge;
use crate::rules::{pod_choice, PodChoice};
use crate::table::{ModelRoute, Pod, Route};
pub use decision::{Attempt, Cursor, Decision, GroupChoice, Target};
use health::{EjectionPolicy, Health};
use reservation::Ledger;

pub struct Router {
    gauge: Arc<dyn LoadGauge>,
    /// Passive health: pods ejected for failing are skipped.
    health: Arc<Health>,
    /// Reservations of pods, keyed by gauge slot (a pod serving several models is one load).
    pods: Arc<Ledger>,
    /// Reservations of label-group members, keyed by the member's name hash.
    members: Arc<Ledger>,
    knobs: RoutingKnobs,
}

impl Router {
    pub fn new(gauge: Arc<dyn LoadGauge>, knobs: RoutingKnobs) -> Self {
        Self::with_ejection(gauge, knobs, EjectionPolicy::default())
    }

    pub fn with_ejection(
        gauge: Arc<dyn LoadGauge>,
        knobs: RoutingKnobs,
        ejection: EjectionPolicy,
    ) -> Self {
        Self {
            gauge,
            health: Arc::new(Health::new(ejection)),
            pods: Ledger::new(knobs.reservation_ttl),
            members: Ledger::new(knobs.reservation_ttl),
            knobs,
        }
    }

    pub fn knobs(&self) -> &RoutingKnobs {
        &self.knobs
    }

    pub fn gauge(&self) -> &Arc<dyn LoadGauge> {
        &self.gauge
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The pods (and their gauge slots) changed: the gauge and the health records follow.
    pub fn pods_changed(&self, pods: &[(std::net::SocketAddr, crate::load::Slot)]) {
        self.gauge.set_pods(pods);
        self.health.pods_changed(pods);
    }

    /// A pod's load as picks see it (gauge only; reservations are apart).
    pub fn pod_load(&self, pod: &Pod) -> u64 {
        pod.slot.map_or(0, |s| self.gauge.active(s))
    }

    /// Unexpired reservations of a pod.
    pub fn pod_reservations(&self, pod: &Pod, now: Instant) -> u64 {
        pod.slot.map_or(0, |s| self.pods.pending(u64::from(s), now))
    }

    /// Unexpired reservations of a label-group member.
    pub fn member_reservations(&self, member: &ModelRoute, now: Instant) -> u64 {
        self.members.pending(member.name_hash, now)
    }

    /// Reservations pending over every pod and member.
    pub fn pending_reservations(&self) -> usize {
        self.pods.len() + self.members.len()
    }

    /// Expire reservations past their TTL (run every second or so); returns how many.
    pub fn sweep(&self, now: Instant) -> u64 {
        self.pods.sweep(now) + self.members.sweep(now)
    }

    /// Decide where a request for `route` goes. `draw` is a random number (for session
    /// requests without a key).
    pub fn decide(
        &self,
        route: &Route,
        req: &RequestParts<'_, '_>,
        draw: u64,
        now: Instant,
    ) -> Decision {
        match route {
            Route::Model(m) => self.decide_model(m, req, draw, now),
            Route::Group(g) => group::decide(self, g, req, draw, now),
        }
    }

    /// Pick pods of one model by its strategy.
    pub fn decide_model(
        &self,
        m: &Arc<ModelRoute>,
        req: &RequestParts<'_, '_>,
        draw: u64,
        now: Instant,
    ) -> Decision {
        let strategy = m.spec.routing;
        let parts = RequestParts {
            model: Some(&m.name),
            ..*req
        };
        let extraction = keys::extract(strategy, &parts, &self.knobs.limits);
        let key = extraction.key;
        let n = m.pods.len();
        let attempts = self.knobs.max_pod_attempts;
        let mut reservation = None;
        let cursor = if n == 0 {
            Cursor::None
        } else {
            match pod_choice(strategy, key.is_some(), m.service.is_some()) {
                PodChoice::Service => Cursor::None,
                PodChoice::RoundRobin => Cursor::Rotation(round_robin(m.next_ticket(), n)),
                PodChoice::Random => Cursor::Rotation(random(draw, n)),
                PodChoice::Ring => {
                    let hash = key.map_or(0, |k| k.hash);
                    Cursor::Walk(WalkState::new(&m.ring, hash))
                }
                PodChoice::LeastLoaded => {
                    let rr = m.next_ticket();
                    let (order, token) = self.pods.pick(
                        n,
                        |i| m.pods[i].slot.map(u64::from),
                        // An ejected pod ranks last (it is skipped unless nothing else is left).
                        |i| match self.health.is_ejected(m.pods[i].slot, now) {
                            true => u64::MAX / 2,
                            false => self.pod_load(&m.pods[i]),
                        },
                        |loads| rank(loads, rr, attempts),
                        |order| order.clone().next(),
                        |_| Arc::clone(&m.metrics.reservations),
                        now,
                    );
                    reservation = token;
                    Cursor::Ranked(order)
                }
            }
        };
        let mut d = Decision::new(
            Arc::clone(m),
            strategy,
            key,
            extraction.ignored,
            cursor,
            attempts,
            Arc::clone(&self.health),
            now,
        );
        d.pod_reservation = reservation;
        d
    }
}
