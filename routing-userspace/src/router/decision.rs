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
use super::pending::PendingPick;
use super::reservation::Reservation;
use crate::balance::bounded::BoundedWalk;
use crate::balance::cache_aware::CacheAwareOrder;
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
    /// The ring walk under the hash-balance bound.
    Bounded(BoundedWalk),
    /// The cache-aware pick, then the rest of its bounded walk.
    CacheAware(CacheAwareOrder),
    Ranked(Ranked),
}

impl Cursor {
    fn next(&mut self, model: &ModelRoute) -> Option<usize> {
        match self {
            Cursor::None => None,
            Cursor::Rotation(r) => r.next(),
            Cursor::Walk(w) => w.next(&model.ring),
            Cursor::Bounded(w) => w.next(&model.ring),
            Cursor::CacheAware(o) => o.next(&model.ring),
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

/// A pick the hash-balance bound moved: the candidate the key preferred (a pod index, or a
/// member index for a label group), its load and the bound it was at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spill {
    pub preferred: usize,
    pub load: u64,
    pub bound: u64,
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
    /// The member the key preferred, when the bound moved the pick off it.
    pub spill: Option<Spill>,
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
    /// A bounded (or cache-aware) pick counts on its pod until the request starts upstream;
    /// the forward phase drops this when it does.
    pub pending_pick: Option<PendingPick>,
    /// The pod the key preferred, when the hash-balance bound moved the pick off it (the
    /// outcome is then [`Outcome::Spill`]).
    pub spill: Option<Spill>,
    /// Cache-aware: leading prompt-chain links the picked pod held (`None` when the index was
    /// not consulted).
    pub match_depth: Option<u32>,
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
            pending_pick: None,
            spill: None,
            match_depth: None,
            health,
            at,
        }
    }

    /// Record that the bound moved the pick: the outcome becomes [`Outcome::Spill`].
    pub(super) fn spilled(&mut self, spill: Spill) {
        if self.picked.is_some() {
            self.spill = Some(spill);
            self.outcome = Outcome::Spill;
        }
    }

    /// Whether the bound moved this request, at the group or the pod level.
    pub fn any_spill(&self) -> bool {
        self.spill.is_some() || self.group.as_ref().is_some_and(|g| g.spill.is_some())
    }

    /// The `x-flexinfer-route` value: strategy, key source, outcome, matched depth (cache-aware
    /// lookups only) and spill. Never key text.
    pub fn route_header(&self) -> http::HeaderValue {
        use std::fmt::Write as _;
        let mut v = format!(
            "strategy={}; key-source={}; outcome={}",
            self.strategy.as_str(),
            self.key_source().as_str(),
            self.outcome.as_str()
        );
        if let Some(d) = self.match_depth {
            let _ = write!(v, "; depth={d}");
        }
        let _ = write!(v, "; spill={}", self.any_spill());
        http::HeaderValue::from_str(&v).expect("labels are header-safe")
    }

    pub fn key_source(&self) -> KeySource {
        self.key.map_or(KeySource::None, |k| k.source)
    }

    /// The index (in the model's pods) of the pod the decision picked.
    pub fn picked_index(&self) -> Option<usize> {
        self.picked
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
