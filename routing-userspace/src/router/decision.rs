//! A routing decision: where one request goes, why, and what it holds while it goes there.
//!
//! The decision owns its remaining candidates as a cursor (pods in the strategy's order, up
//! to the attempt limit, then the model's Service), so a failed attempt moves on without
//! re-hashing, and nothing past the candidates actually tried is computed. It also carries the
//! reservations its pick made, as tokens: the proxy consumes a token when the request starts on
//! what it reserved, and a token dropped unconsumed expires (see [`super::reservation`]).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::health::Health;
use super::reservation::Reservation;
use crate::balance::least_loaded::Ranked;
use crate::balance::ring::WalkState;
use crate::balance::round_robin::Rotation;
use crate::keys::{Ignored, RoutingKey};
use crate::table::{LabelGroup, ModelRoute, Pod};
use crate::vocab::{GroupOutcome, KeySource, LabelGroupMode, Outcome, Strategy};

/// The pods still to try, in order.
#[derive(Debug, Clone)]
pub enum Cursor {
    None,
    Rotation(Rotation),
    Walk(WalkState),
    Ranked(Ranked),
}

impl Cursor {
    fn next(&mut self, model: &ModelRoute) -> Option<usize> {
        match self {
            Cursor::None => None,
            Cursor::Rotation(r) => r.next(),
            Cursor::Walk(w) => w.next(&model.ring),
            Cursor::Ranked(r) => r.next(),
        }
    }
}

/// The cursor's next pod that is not ejected. For the first pick (`or_ejected`), when every
/// candidate is ejected, the first of them: a pod that may have recovered beats no answer (the
/// ejection share keeps this to models whose every pod failed, such as a one-pod model).
/// Retries never go to an ejected pod.
fn next_healthy(
    cursor: &mut Cursor,
    model: &ModelRoute,
    health: &Health,
    at: Instant,
    or_ejected: bool,
) -> Option<usize> {
    let mut skipped = None;
    while let Some(i) = cursor.next(model) {
        if !health.is_ejected(model.pods[i].slot, at) {
            return Some(i);
        }
        if or_ejected {
            skipped.get_or_insert(i);
        }
    }
    skipped
}

/// Where an attempt goes: a pod of the decision's model (by index), or its Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Pod(usize),
    Service,
}

/// A target, for logs, labels and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Pod(&'a Pod),
    Service(&'a str),
}

impl Target<'_> {
    /// The `target` metric label: `ip:port`, or `service-dns`.
    pub fn label(&self) -> &str {
        match self {
            Target::Pod(p) => &p.label,
            Target::Service(_) => crate::metrics::handles::SERVICE_TARGET,
        }
    }
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pod(p) => f.write_str(&p.label),
            Target::Service(url) => f.write_str(url),
        }
    }
}

/// The label-group part of a decision.
#[derive(Debug, Clone)]
pub struct GroupChoice {
    pub group: Arc<LabelGroup>,
    /// Index of the chosen member in `group.members`.
    pub member: usize,
    pub mode: LabelGroupMode,
    pub outcome: GroupOutcome,
}

/// A routing decision for one request.
#[derive(Debug)]
pub struct Decision {
    /// The model that serves the request (for a label group, the chosen member).
    pub model: Arc<ModelRoute>,
    pub strategy: Strategy,
    pub key: Option<RoutingKey>,
    pub outcome: Outcome,
    pub group: Option<GroupChoice>,
    /// Malformed explicit keys that were skipped.
    pub ignored: Vec<Ignored>,
    /// The pick's reservation of a pod (least-loaded).
    pub pod_reservation: Option<Reservation>,
    /// The pick's reservation of a label-group member (least-loaded mode).
    pub member_reservation: Option<Reservation>,
    /// The pod the decision picked (the first candidate).
    picked: Option<usize>,
    /// The first candidate until an attempt takes it.
    first: Option<usize>,
    cursor: Cursor,
    /// Pod attempts left (the first included).
    pods_left: usize,
    service_left: bool,
    /// Ejected pods are skipped (as of `at`, the decision's time).
    health: Arc<Health>,
    at: Instant,
}

impl Decision {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        model: Arc<ModelRoute>,
        strategy: Strategy,
        key: Option<RoutingKey>,
        ignored: Vec<Ignored>,
        mut cursor: Cursor,
        max_pod_attempts: usize,
        health: Arc<Health>,
        at: Instant,
    ) -> Self {
        let first = next_healthy(&mut cursor, &model, &health, at, true);
        Self {
            outcome: if first.is_some() {
                Outcome::Pod
            } else {
                Outcome::ServiceFallback
            },
            picked: first,
            first,
            cursor,
            pods_left: max_pod_attempts.max(1),
            service_left: true,
            model,
            strategy,
            key,
            group: None,
            ignored,
            pod_reservation: None,
            member_reservation: None,
            health,
            at,
        }
    }

    pub fn key_source(&self) -> KeySource {
        self.key.map_or(KeySource::None, |k| k.source)
    }

    /// The pod the decision picked, if it picked one.
    pub fn picked_pod(&self) -> Option<&Pod> {
        self.picked.map(|i| &self.model.pods[i])
    }

    /// The next attempt: pods in order, up to the attempt limit, then the Service; `None`
    /// when nothing is left.
    pub fn next_attempt(&mut self) -> Option<Attempt> {
        if self.pods_left > 0 {
            let next = match self.first.take() {
                Some(i) => Some(i),
                None => next_healthy(&mut self.cursor, &self.model, &self.health, self.at, false),
            };
            match next {
                Some(i) => {
                    self.pods_left -= 1;
                    return Some(Attempt::Pod(i));
                }
                None => self.pods_left = 0,
            }
        }
        if std::mem::take(&mut self.service_left) && self.model.service.is_some() {
            return Some(Attempt::Service);
        }
        None
    }

    /// The target an attempt names.
    pub fn target(&self, a: Attempt) -> Target<'_> {
        match a {
            Attempt::Pod(i) => Target::Pod(&self.model.pods[i]),
            Attempt::Service => {
                Target::Service(self.model.service.as_ref().map_or("", |s| &*s.url))
            }
        }
    }

    /// Whether any target is left to try.
    pub fn has_targets(&self) -> bool {
        self.picked.is_some() || self.model.service.is_some()
    }
}
